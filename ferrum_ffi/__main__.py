"""Command line: ``python -m ferrum_ffi info`` and ``python -m ferrum_ffi demo``.

``info`` says which library was loaded, its ABI and the CUDA architectures it
was built for, and the devices the CUDA runtime inside it sees. ``demo``
quantises a large random layer to INT4, runs ``marlin_gemm`` on it, checks the
result against a float64 reference of the dequantised weight and times it
against cuBLAS FP16. Both exit 0 on a machine without a GPU.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import sys
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from . import __version__
from ._native import ABI_VERSION, NativeLibrary, library
from .status import FerrumError, LibraryError, StagedNativeStatus
from .timing import FLUSH_BYTES, Timer

NO_GPU = "demo: no CUDA GPU visible \N{EM DASH} nothing to run (python -m ferrum_ffi info shows what the library sees)"
TOLERANCE = 2e-3  # relative L2 error of an fp16 GEMM against the float64 reference
CHUNK_VALUES = 32 << 20  # float32 weights generated and quantised per chunk (128 MB)


# ---- info --------------------------------------------------------------------------


@dataclass(frozen=True)
class Device:
    index: int
    name: str
    capability: tuple[int, int]
    sms: int
    total_bytes: int

    def describe(self) -> str:
        major, minor = self.capability
        text = (
            f"[{self.index}] {self.name}: compute capability {major}.{minor}, "
            f"{self.sms} SMs, {self.total_bytes / 2**30:.1f} GiB"
        )
        return text if major >= 8 else text + " (unsupported: W4A16 needs sm_80 or newer)"


def visible_devices(lib: NativeLibrary) -> tuple[int, str]:
    """(device count, why there is none) as the library's CUDA runtime sees it."""
    count = ctypes.c_int(0)
    status = StagedNativeStatus.decode(lib.ferrum_marlin_device_count(ctypes.byref(count)))
    if status is not None:
        return 0, lib.last_error() or str(status)
    if count.value:
        return count.value, ""
    mask = os.environ.get("CUDA_VISIBLE_DEVICES")
    return 0, "the CUDA runtime reports 0 devices" + (f"; CUDA_VISIBLE_DEVICES={mask!r}" if mask is not None else "")


def device_info(lib: NativeLibrary, index: int) -> Device | str:
    """A device's properties, or the native failure message."""
    name = ctypes.create_string_buffer(256)
    major, minor, sms, total = ctypes.c_int(), ctypes.c_int(), ctypes.c_int(), ctypes.c_size_t()
    code = lib.ferrum_marlin_device_info(
        index, name, len(name), ctypes.byref(major), ctypes.byref(minor), ctypes.byref(sms), ctypes.byref(total)
    )
    if code != 0:
        return f"[{index}] unavailable: {lib.last_error() or StagedNativeStatus.decode(code)}"
    return Device(index, name.value.decode(errors="replace"), (major.value, minor.value), sms.value, total.value)


def run_info(args: argparse.Namespace) -> int:
    print(f"ferrum_ffi {__version__}")
    try:
        lib = library()
    except LibraryError as exc:
        print(f"library: not loaded: {exc}")
        return 1
    print(f"library: {lib.path}")
    print(f"ABI version: {lib.abi_version} (this package needs {ABI_VERSION})")
    print(f"build: {lib.build_info}")
    count, why = visible_devices(lib)
    if count == 0:
        print(f"devices: no CUDA device visible ({why})")
        return 0
    print(f"devices: {count}")
    for index in range(count):
        device = device_info(lib, index)
        print(f"  {device.describe() if isinstance(device, Device) else device}")
    return 0


# ---- demo: the layer -----------------------------------------------------------------


@dataclass
class QuantizedLayer:
    """INT4 codes and fp16 scales as quantised, and the same in Marlin layout."""

    codes: np.ndarray  # uint8 [k, n]
    scales: np.ndarray  # float16 [groups, n]
    packed: np.ndarray  # int32 [k/16, 2n]
    marlin_scales: np.ndarray  # float16 [groups, n], kernel order


def chunk_columns(k: int, n: int, budget: int = CHUNK_VALUES) -> int:
    """Columns per chunk: a multiple of 64 (the layout's granularity) within the budget."""
    return min(n, max(64, budget // k // 64 * 64))


def quantize_in_chunks(
    source: Callable[[int, int], np.ndarray], k: int, n: int, group_size: int, chunk: int
) -> QuantizedLayer:
    """Quantise ``source(col0, col1)`` (float32 ``[k, col1-col0]``) column chunk by chunk.

    Quantisation groups run along K, and the Marlin packing and scale order
    both work on 64-column blocks, so column chunks are independent: only one
    chunk of floats is ever in memory.
    """
    from .formats import marlin_pack_int4, marlin_permute_scales, quantize_int4_symmetric

    groups = 1 if group_size == -1 else k // group_size
    layer = QuantizedLayer(
        codes=np.empty((k, n), np.uint8),
        scales=np.empty((groups, n), np.float16),
        packed=np.empty((k // 16, 2 * n), np.int32),
        marlin_scales=np.empty((groups, n), np.float16),
    )
    for col0 in range(0, n, chunk):
        col1 = min(n, col0 + chunk)
        codes, scales = quantize_int4_symmetric(source(col0, col1), group_size)
        layer.codes[:, col0:col1] = codes
        layer.scales[:, col0:col1] = scales
        layer.packed[:, 2 * col0 : 2 * col1] = marlin_pack_int4(codes)
        layer.marlin_scales[:, col0:col1] = marlin_permute_scales(scales, group_size)
    return layer


def random_layer(k: int, n: int, group_size: int, seed: int) -> QuantizedLayer:
    """A random normal float32 layer, generated and quantised in column chunks."""
    rng = np.random.default_rng(seed)

    def source(col0: int, col1: int) -> np.ndarray:
        return rng.standard_normal((k, col1 - col0), dtype=np.float32)

    return quantize_in_chunks(source, k, n, group_size, chunk_columns(k, n))


# ---- demo: the GPU side ---------------------------------------------------------------


class DeviceLayer:
    """The quantised layer on the GPU: codes and scales for the references, fp16 for cuBLAS."""

    ROWS = 1024  # K rows dequantised at a time

    def __init__(self, cp: Any, layer: QuantizedLayer, group_size: int) -> None:
        self.cp = cp
        self.k, self.n = layer.codes.shape
        self.rows_per_group = self.k if group_size == -1 else group_size
        self.codes = cp.asarray(layer.codes)
        self.scales = cp.asarray(layer.scales)
        self.w16 = cp.empty((self.k, self.n), dtype=cp.float16)
        for k0 in range(0, self.k, self.ROWS):
            self.w16[k0 : k0 + self.ROWS] = self.dequantized(k0, min(self.k, k0 + self.ROWS), cp.float32)

    def dequantized(self, k0: int, k1: int, dtype: Any) -> Any:
        """``(codes - 8) * scale`` of rows ``[k0, k1)`` in ``dtype``."""
        rows = self.cp.arange(k0, k1) // self.rows_per_group
        return (self.codes[k0:k1].astype(dtype) - 8) * self.scales[rows].astype(dtype)

    def reference(self, a: Any) -> Any:
        """float64 ``a @ dequant(W)``, accumulated over K row blocks."""
        a64 = a.astype(self.cp.float64)
        out = self.cp.zeros((a.shape[0], self.n), dtype=self.cp.float64)
        for k0 in range(0, self.k, self.ROWS):
            k1 = min(self.k, k0 + self.ROWS)
            out += a64[:, k0:k1] @ self.dequantized(k0, k1, self.cp.float64)
        return out


def relative_l2(cp: Any, out: Any, ref: Any) -> float:
    out64 = out.astype(cp.float64)
    if not bool(cp.isfinite(out64).all()):
        return float("inf")
    return float(cp.linalg.norm(out64 - ref) / max(float(cp.linalg.norm(ref)), 1e-30))


@dataclass(frozen=True)
class Result:
    m: int
    marlin_err: float
    cublas_err: float
    marlin_us: float
    cublas_us: float
    marlin_tb_s: float
    cublas_tb_s: float

    def line(self) -> str:
        ok = "ok" if self.marlin_err <= TOLERANCE else f"MISMATCH (> {TOLERANCE:g})"
        return (
            f"m={self.m:<5} rel L2 err {self.marlin_err:.2e} (cuBLAS {self.cublas_err:.2e}) {ok}; "
            f"marlin_gemm {self.marlin_us:8.1f} us {self.marlin_tb_s:5.2f} TB/s | "
            f"cuBLAS FP16 {self.cublas_us:8.1f} us {self.cublas_tb_s:5.2f} TB/s | "
            f"speed-up {self.cublas_us / self.marlin_us:5.2f}x"
        )


def run_m(cp: Any, ff: Any, timer: Timer, weight: Any, layer: DeviceLayer, m: int, repeat: int, seed: int) -> Result:
    rng = np.random.default_rng(seed + m)
    a = cp.asarray(rng.standard_normal((m, layer.k), dtype=np.float32).astype(np.float16))
    out = cp.empty((m, layer.n), dtype=cp.float16)
    out_cublas = cp.empty((m, layer.n), dtype=cp.float16)
    ff.marlin_gemm(a, weight, out=out)
    cp.matmul(a, layer.w16, out=out_cublas)
    ref = layer.reference(a)
    marlin_err, cublas_err = relative_l2(cp, out, ref), relative_l2(cp, out_cublas, ref)
    del ref
    marlin_us = timer.median_us(lambda: ff.marlin_gemm(a, weight, out=out), repeat)
    cublas_us = timer.median_us(lambda: cp.matmul(a, layer.w16, out=out_cublas), repeat)
    int4_bytes = weight.qweight.nbytes + weight.scales.nbytes
    return Result(
        m, marlin_err, cublas_err, marlin_us, cublas_us,
        marlin_tb_s=int4_bytes / marlin_us / 1e6,
        cublas_tb_s=layer.w16.nbytes / cublas_us / 1e6,
    )


def _import_cupy() -> Any | None:
    try:
        import cupy
    except ImportError:
        return None
    return cupy


def _check_demo_args(args: argparse.Namespace) -> str | None:
    from .validation import W4A16Problem, validate_w4a16

    if args.repeat < 1:
        return f"demo: --repeat={args.repeat} must be >= 1"
    if any(m < 1 for m in args.m):
        return f"demo: --m values must be >= 1, got {args.m}"
    try:
        for m in args.m:
            validate_w4a16(W4A16Problem(m=m, n=args.n, k=args.k, group_size=args.group_size), "demo")
    except FerrumError as exc:
        return str(exc)  # "demo: k=100 must be divisible by 128"
    return None


def run_demo(args: argparse.Namespace) -> int:
    problem = _check_demo_args(args)
    if problem:
        print(problem, file=sys.stderr)
        return 2
    try:
        lib = library()
    except LibraryError as exc:
        print(f"demo: the native library is not available: {exc}", file=sys.stderr)
        return 1
    count, why = visible_devices(lib)
    if count == 0:
        print(NO_GPU)
        print(f"demo: {why}")
        return 0
    cp = _import_cupy()
    if cp is None:
        print("demo: CuPy is not installed \N{EM DASH} nothing to run (pip install 'ferrum_ffi[cupy]')")
        return 0
    return _demo_on_gpu(cp, args)


def _demo_on_gpu(cp: Any, args: argparse.Namespace) -> int:
    import ferrum_ffi as ff

    device = device_info(library(), cp.cuda.Device().id)
    print(f"demo: {device.describe() if isinstance(device, Device) else device}")
    print(f"demo: quantising a random {args.k} x {args.n} layer to INT4 (group size {args.group_size}) ...")
    layer = random_layer(args.k, args.n, args.group_size, args.seed)
    weight = ff.MarlinWeight.from_marlin(layer.packed, layer.marlin_scales, args.k, args.group_size)
    on_gpu = DeviceLayer(cp, layer, args.group_size)
    del layer
    print(
        f"demo: weight {(weight.qweight.nbytes + weight.scales.nbytes) / 2**20:.1f} MiB INT4+scales, "
        f"{on_gpu.w16.nbytes / 2**20:.1f} MiB FP16; median of {args.repeat} launches, "
        f"L2 flushed ({FLUSH_BYTES >> 20} MB fill) before each"
    )
    timer = Timer(cp)
    failed = False
    for m in args.m:
        result = run_m(cp, ff, timer, weight, on_gpu, m, args.repeat, args.seed)
        print(result.line())
        failed |= not result.marlin_err <= TOLERANCE
    return 1 if failed else 0


# ---- entry point ---------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m ferrum_ffi", description="ferrum_ffi: what the native library sees, and a W4A16 demo."
    )
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("info", help="library, ABI, build architectures and visible devices")
    demo = commands.add_parser("demo", help="quantise a large layer, check and time marlin_gemm against cuBLAS")
    demo.add_argument("--k", type=int, default=8192, help="input features (multiple of 128)")
    demo.add_argument("--n", type=int, default=28672, help="output features (multiple of 64)")
    demo.add_argument("--m", type=int, nargs="+", default=[1, 16], help="batch rows to run")
    demo.add_argument("--repeat", type=int, default=50, help="timed launches per measurement")
    demo.add_argument("--group-size", type=int, default=128, choices=(128, -1), help="-1: one scale per column")
    demo.add_argument("--seed", type=int, default=0, help="seed of the random weights and activations")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return run_info(args) if args.command == "info" else run_demo(args)


if __name__ == "__main__":
    if hasattr(sys.stdout, "reconfigure"):  # never fail on a terminal that cannot show a dash
        sys.stdout.reconfigure(errors="backslashreplace")
    sys.exit(main())
