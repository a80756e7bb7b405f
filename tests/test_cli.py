"""``python -m ferrum_ffi info`` / ``demo``: as subprocesses against the real
library, plus the demo's host-side pieces (chunked quantisation, reference,
report) run on the CPU with NumPy standing in for CuPy."""

from __future__ import annotations

import os
import subprocess
import sys
import types

import numpy as np
import pytest

import ferrum_ffi
from ferrum_ffi import __main__ as cli
from ferrum_ffi import _native
from ferrum_ffi.formats import (
    dequantize_int4_symmetric,
    marlin_pack_int4,
    marlin_permute_scales,
    marlin_unpack_int4,
    marlin_unpermute_scales,
    quantize_int4_symmetric,
)
from ferrum_ffi.status import LibraryError

# ---- subprocesses ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def lib():
    try:
        return ferrum_ffi.library()
    except LibraryError as exc:
        pytest.skip(f"libferrum_marlin.so not available: {exc}")


def run_cli(*args: str, library_path: str | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    if library_path is not None:
        env[_native.ENV_LIBRARY] = library_path
    return subprocess.run(
        [sys.executable, "-m", "ferrum_ffi", *args], capture_output=True, text=True, env=env, timeout=timeout
    )


def test_info(lib):
    result = run_cli("info", library_path=str(lib.path))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == f"ferrum_ffi {ferrum_ffi.__version__}"
    assert f"library: {lib.path}" in lines
    assert f"ABI version: {ferrum_ffi.ABI_VERSION} (this package needs {ferrum_ffi.ABI_VERSION})" in lines
    assert f"build: {lib.build_info}" in lines
    assert "archs" in lib.build_info
    devices = [line for line in lines if line.startswith("devices: ")]
    assert len(devices) == 1
    count = ferrum_ffi.device_count()
    if count == 0:
        assert devices[0].startswith("devices: no CUDA device visible (")
        assert devices[0].endswith(")")
        assert len(devices[0]) > len("devices: no CUDA device visible ()")
    else:
        assert devices[0] == f"devices: {count}"
        described = [line for line in lines if line.startswith("  [")]
        assert len(described) == count
        assert all("compute capability" in line and "SMs" in line and "GiB" in line for line in described)


def test_demo_exits_0(lib):
    # Small shape so that a machine with a GPU (and CuPy) runs it quickly too.
    result = run_cli("demo", "--k", "256", "--n", "256", "--m", "1", "3", "--repeat", "2", library_path=str(lib.path))
    assert result.returncode == 0, result.stdout + result.stderr
    if ferrum_ffi.device_count() == 0:
        assert "demo: no CUDA GPU visible" in result.stdout
        assert "nothing to run" in result.stdout
        assert "python -m ferrum_ffi info" in result.stdout
    else:
        assert "CuPy is not installed" in result.stdout or result.stdout.count("rel L2 err") == 2


def test_demo_with_default_arguments_exits_0_without_a_gpu(lib):
    if ferrum_ffi.device_count() > 0:
        pytest.skip("a CUDA device is visible: the default demo is a benchmark, not a unit test")
    result = run_cli("demo", library_path=str(lib.path))
    assert result.returncode == 0, result.stderr
    assert "no CUDA GPU visible" in result.stdout


def test_demo_survives_an_ascii_terminal(lib):
    env_args = ("demo", "--k", "256", "--n", "256", "--m", "1", "--repeat", "2")
    env = dict(os.environ, PYTHONIOENCODING="ascii", **{_native.ENV_LIBRARY: str(lib.path)})
    result = subprocess.run([sys.executable, "-m", "ferrum_ffi", *env_args], capture_output=True, text=True, env=env)
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    "args, message",
    [
        (("--k", "100"), "demo: k=100 must be divisible by 128"),
        (("--n", "96"), "demo: n=96 must be divisible by 64"),
        (("--m", "0"), "demo: --m values must be >= 1"),
        (("--repeat", "0"), "demo: --repeat=0 must be >= 1"),
    ],
)
def test_demo_rejects_bad_arguments(args, message):
    result = run_cli("demo", *args)
    assert result.returncode == 2
    assert message in result.stderr


def test_a_command_is_required():
    result = run_cli()
    assert result.returncode == 2
    assert "info" in result.stderr and "demo" in result.stderr


def test_missing_library(tmp_path):
    missing = str(tmp_path / "libferrum_marlin.so")
    info = run_cli("info", library_path=missing)
    assert info.returncode == 1
    assert info.stdout.startswith(f"ferrum_ffi {ferrum_ffi.__version__}\n")
    assert "library: not loaded: " in info.stdout and missing in info.stdout
    demo = run_cli("demo", "--k", "256", "--n", "256", library_path=missing)
    assert demo.returncode == 1
    assert missing in demo.stderr
    assert "Traceback" not in demo.stderr


def test_info_in_process(lib, capsys):
    assert cli.main(["info"]) == 0
    out = capsys.readouterr().out
    assert f"library: {lib.path}" in out
    assert "devices: " in out


# ---- device helpers against the library -------------------------------------------------


def test_visible_devices_agrees_with_device_count(lib):
    count, why = cli.visible_devices(lib)
    assert count == ferrum_ffi.device_count()
    assert bool(why) == (count == 0)


def test_device_info_of_a_missing_device_is_a_message(lib):
    text = cli.device_info(lib, 10_000)
    assert isinstance(text, str)
    assert text.startswith("[10000] unavailable: ")


def test_device_describe():
    device = cli.Device(0, "NVIDIA H200", (9, 0), 132, 150_000_000_000)
    assert device.describe() == "[0] NVIDIA H200: compute capability 9.0, 132 SMs, 139.7 GiB"
    old = cli.Device(1, "Tesla V100", (7, 0), 80, 16 * 2**30)
    assert "compute capability 7.0" in old.describe() and "sm_80" in old.describe()


# ---- the demo's host side ---------------------------------------------------------------


@pytest.mark.parametrize("group_size", [128, -1])
@pytest.mark.parametrize("chunk", [64, 192, 1024])
def test_chunked_quantisation_equals_the_whole_matrix(group_size, chunk):
    rng = np.random.default_rng(3)
    k, n = 256, 320
    w = rng.standard_normal((k, n), dtype=np.float32)
    layer = cli.quantize_in_chunks(lambda c0, c1: w[:, c0:c1], k, n, group_size, chunk)
    codes, scales = quantize_int4_symmetric(w, group_size)
    np.testing.assert_array_equal(layer.codes, codes)
    np.testing.assert_array_equal(layer.scales, scales)
    np.testing.assert_array_equal(layer.packed, marlin_pack_int4(codes))
    np.testing.assert_array_equal(layer.marlin_scales, marlin_permute_scales(scales, group_size))


def test_chunk_columns():
    assert cli.chunk_columns(8192, 28672) == 4096
    assert cli.chunk_columns(8192, 28672) * 8192 * 4 <= 128 << 20
    assert cli.chunk_columns(128, 256) == 256  # never more than n
    assert cli.chunk_columns(1 << 30, 28672) == 64  # never less than 64
    assert cli.chunk_columns(8192, 28672, budget=3 * 8192 * 64 + 5) == 192


def test_random_layer_is_deterministic_and_round_trips():
    a = cli.random_layer(256, 192, 128, seed=5)
    b = cli.random_layer(256, 192, 128, seed=5)
    np.testing.assert_array_equal(a.packed, b.packed)
    np.testing.assert_array_equal(marlin_unpack_int4(a.packed, 256, 192), a.codes)
    np.testing.assert_array_equal(marlin_unpermute_scales(a.marlin_scales, 128), a.scales)
    assert a.codes.max() <= 15 and len(np.unique(a.codes)) > 8


class _FakeCuda:
    """The part of cupy.cuda the demo touches, for a CPU run."""

    class Event:
        def record(self, stream=None) -> None:
            pass

        def synchronize(self) -> None:
            pass

    class Device:
        def __init__(self, index: int = 0) -> None:
            self.id = index

    @staticmethod
    def get_elapsed_time(start, end) -> float:
        return 0.02  # ms


def numpy_as_cupy():
    names = ("asarray", "empty", "zeros", "arange", "matmul", "isfinite", "linalg", "float16", "float32", "float64", "int32")
    fake = types.SimpleNamespace(**{name: getattr(np, name) for name in names})
    fake.cuda = _FakeCuda
    return fake


@pytest.mark.parametrize("group_size", [128, -1])
def test_device_layer_reference_is_the_float64_dequantised_product(monkeypatch, group_size):
    monkeypatch.setattr(cli.DeviceLayer, "ROWS", 128)  # several K blocks
    layer = cli.random_layer(384, 128, group_size, seed=1)
    on_host = cli.DeviceLayer(np, layer, group_size)
    w64 = dequantize_int4_symmetric(layer.codes, layer.scales, group_size)
    np.testing.assert_array_equal(on_host.w16, w64.astype(np.float16))
    a = np.random.default_rng(2).standard_normal((5, 384)).astype(np.float16)
    np.testing.assert_allclose(on_host.reference(a), a.astype(np.float64) @ w64, rtol=1e-12, atol=1e-12)


def test_relative_l2():
    ref = np.array([[3.0, 4.0]])
    assert cli.relative_l2(np, np.array([[3.0, 4.0]], np.float16), ref) == 0.0
    assert cli.relative_l2(np, np.array([[3.0, 3.5]], np.float16), ref) == pytest.approx(0.1)
    assert cli.relative_l2(np, np.array([[np.nan, 4.0]], np.float16), ref) == float("inf")


class _FakeWeight:
    def __init__(self, packed, scales, k, group_size) -> None:
        self.qweight, self.scales, self.k, self.group_size = packed, scales, k, group_size


def _install_fake_gpu(monkeypatch, corrupt: bool = False) -> list[int]:
    """Stand-ins for CuPy and for marlin_gemm (which dequantises the Marlin buffers itself)."""
    calls: list[int] = []

    def from_marlin(packed, scales, k, group_size=128, max_par=16, to_device=None):
        return _FakeWeight(packed, scales, k, group_size)

    def marlin_gemm(a, weight, out=None, stream=None, **kwargs):
        n = weight.scales.shape[1]
        codes = marlin_unpack_int4(weight.qweight, weight.k, n)
        scales = marlin_unpermute_scales(weight.scales, weight.group_size)
        w = dequantize_int4_symmetric(codes, scales, weight.group_size)
        out[...] = (a.astype(np.float64) @ w).astype(np.float16)
        if corrupt:
            out[:, :64] = 0
        calls.append(a.shape[0])
        return out

    monkeypatch.setattr(ferrum_ffi.MarlinWeight, "from_marlin", staticmethod(from_marlin))
    monkeypatch.setattr(ferrum_ffi, "marlin_gemm", marlin_gemm)
    monkeypatch.setattr(cli, "FLUSH_BYTES", 4096)
    monkeypatch.setattr(cli, "library", lambda: types.SimpleNamespace(
        ferrum_marlin_device_info=lambda *args: 0, last_error=lambda: ""))
    return calls


def demo_args(**changes):
    args = cli.build_parser().parse_args(["demo", "--k", "256", "--n", "192", "--m", "1", "5", "--repeat", "3"])
    for name, value in changes.items():
        setattr(args, name, value)
    return args


@pytest.mark.parametrize("group_size", [128, -1])
def test_demo_gpu_path_with_numpy_for_cupy(monkeypatch, capsys, group_size):
    calls = _install_fake_gpu(monkeypatch)
    assert cli._demo_on_gpu(numpy_as_cupy(), demo_args(group_size=group_size)) == 0
    out = capsys.readouterr().out
    assert f"quantising a random 256 x 192 layer to INT4 (group size {group_size})" in out
    results = [line for line in out.splitlines() if line.startswith("m=")]
    assert [line.split()[0] for line in results] == ["m=1", "m=5"]
    for line in results:
        assert "rel L2 err" in line and " ok;" in line
        assert "marlin_gemm" in line and "cuBLAS FP16" in line and "TB/s" in line
        assert "speed-up  1.00x" in line  # both timed at the fake 20 us
    assert calls == [1] * 7 + [5] * 7  # one checked call, 3 warm-up and 3 timed launches per m


def test_demo_gpu_path_reports_a_mismatch(monkeypatch, capsys):
    _install_fake_gpu(monkeypatch, corrupt=True)
    assert cli._demo_on_gpu(numpy_as_cupy(), demo_args()) == 1
    assert "MISMATCH" in capsys.readouterr().out


def test_run_m_numbers(monkeypatch):
    _install_fake_gpu(monkeypatch)
    layer = cli.random_layer(256, 128, 128, seed=0)
    weight = ferrum_ffi.MarlinWeight.from_marlin(layer.packed, layer.marlin_scales, 256, 128)
    on_host = cli.DeviceLayer(np, layer, 128)
    timer = cli.Timer(numpy_as_cupy(), flush_bytes=64)
    result = cli.run_m(numpy_as_cupy(), ferrum_ffi, timer, weight, on_host, 4, repeat=2, seed=0)
    assert result.m == 4
    assert result.marlin_err < 2e-3 and result.cublas_err < 2e-3
    assert result.marlin_us == result.cublas_us == pytest.approx(20.0)
    int4_bytes = layer.packed.nbytes + layer.marlin_scales.nbytes
    assert result.marlin_tb_s == pytest.approx(int4_bytes / 20.0 / 1e6)
    assert result.cublas_tb_s == pytest.approx(256 * 128 * 2 / 20.0 / 1e6)


def test_no_gpu_message_and_cupy_message(lib, monkeypatch, capsys):
    monkeypatch.setattr(cli, "visible_devices", lambda lib: (0, "why not"))
    assert cli.main(["demo", "--k", "256", "--n", "256"]) == 0
    assert capsys.readouterr().out.splitlines() == [cli.NO_GPU, "demo: why not"]
    monkeypatch.setattr(cli, "visible_devices", lambda lib: (1, ""))
    monkeypatch.setattr(cli, "_import_cupy", lambda: None)
    assert cli.main(["demo", "--k", "256", "--n", "256"]) == 0
    assert "CuPy is not installed" in capsys.readouterr().out
