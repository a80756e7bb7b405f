"""Loading one quantised linear layer from safetensors checkpoints.

:func:`load_linear` looks at the tensors under a layer's prefix (e.g.
``model.layers.0.mlp.down_proj``), recognises the format by their names,
shapes and dtypes, and builds the :class:`~ferrum_ffi.weights.MarlinLinearWeight`:

============================  ============================================================
format                        tensors (``<prefix>.<name>``)
============================  ============================================================
GPTQ (AutoGPTQ)               ``qweight [K*bits/32, N]``, ``qzeros``, ``scales [G, N]``,
                              optional ``g_idx [K]``
AWQ (AutoAWQ GEMM)            ``qweight [K, N/8]``, ``qzeros [G, N/8]``, ``scales [G, N]``
compressed-tensors            ``weight_packed``, ``weight_scale``, optional
(pack-quantized)              ``weight_zero_point``, ``weight_shape``
FP8-E4M3                      ``weight`` (F8_E4M3), ``weight_scale`` (per-tensor or
                              per-channel) or ``weight_scale_inv`` (128x128 blocks)
============================  ============================================================

GPTQ and AWQ share tensor names; the shapes tell them apart (GPTQ packs
``qweight`` along K, so its width is the scales' N; AWQ packs along N, so its
width is N/8). GPTQ's ``bits`` come from ``qzeros`` (or ``g_idx``) and its
symmetry from the zero points (all equal to ``2**(bits-1)``: symmetric).

Files are read with the ``safetensors`` package's NumPy backend, only the
tensors of the prefix. NumPy has no FP8 type the backend knows, so F8_E4M3
tensors are read as their raw bytes from the file's own header.
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence, Union

import numpy as np

from ._devices import ToDevice
from .formats.gptq import gptq_zero_points
from .status import ArgumentError, ArgumentTypeError
from .weights import MarlinLinearWeight

__all__ = ["load_linear", "read_tensors"]

ENTRY = "load_linear"
Source = Union[str, os.PathLike, Mapping[str, Any], Sequence[Union[str, os.PathLike]]]

# safetensors dtypes the NumPy backend cannot return: read as raw bytes.
_RAW_DTYPES = {"F8_E4M3": np.uint8}


# ---- reading ------------------------------------------------------------------------


def _safetensors_files(source: str | os.PathLike) -> list[Path]:
    path = Path(source)
    if path.is_dir():
        index = path / "model.safetensors.index.json"
        if index.is_file():
            names = sorted(set(json.loads(index.read_text()).get("weight_map", {}).values()))
            return [path / name for name in names]
        files = sorted(path.glob("*.safetensors"))
        if not files:
            raise ArgumentError(f"{ENTRY}: {path} holds no *.safetensors file")
        return files
    if not path.is_file():
        raise ArgumentError(f"{ENTRY}: {path} does not exist")
    return [path]


def _raw_tensor(path: Path, name: str, dtype: np.dtype) -> np.ndarray:
    """A tensor's bytes straight from the file: 8-byte little-endian header
    length, the JSON header, then the data its offsets point into."""
    with open(path, "rb") as f:
        (header_len,) = struct.unpack("<Q", f.read(8))
        info = json.loads(f.read(header_len))[name]
        start, end = info["data_offsets"]
        f.seek(8 + header_len + start)
        data = f.read(end - start)
    return np.frombuffer(data, dtype=dtype).reshape(info["shape"])


def read_tensors(source: Source, prefix: str) -> dict[str, np.ndarray]:
    """The tensors named ``<prefix>.<suffix>``, as ``{suffix: ndarray}``, from
    a safetensors file, a list of files, a checkpoint directory (its
    ``model.safetensors.index.json``, else every ``*.safetensors``) or a dict
    of arrays."""
    head = prefix + "." if prefix else ""
    if isinstance(source, Mapping):
        return {name[len(head):]: value for name, value in source.items() if name.startswith(head)}
    try:
        from safetensors import safe_open
    except ImportError as exc:  # pragma: no cover - depends on the machine
        raise ArgumentError(f"{ENTRY}: reading files needs the safetensors package (pip install safetensors)") from exc
    if isinstance(source, (str, os.PathLike)):
        files = _safetensors_files(source)
    elif isinstance(source, Sequence):
        files = [Path(item) for item in source]
    else:
        raise ArgumentTypeError(
            f"{ENTRY}: source must be a path, a list of paths or a dict of arrays, got {type(source).__name__}"
        )
    tensors: dict[str, np.ndarray] = {}
    for path in files:
        with safe_open(str(path), framework="numpy") as f:
            for name in f.keys():
                if not name.startswith(head):
                    continue
                raw = _RAW_DTYPES.get(f.get_slice(name).get_dtype())
                tensors[name[len(head):]] = _raw_tensor(path, name, raw) if raw else f.get_tensor(name)
    return tensors


# ---- recognising ----------------------------------------------------------------------


def _require(tensors: Mapping[str, Any], names: Iterable[str], what: str, prefix: str) -> None:
    missing = [name for name in names if name not in tensors]
    if missing:
        raise ArgumentError(
            f"{ENTRY}: {prefix!r} looks like {what} but lacks {', '.join(missing)} "
            f"(found: {', '.join(sorted(tensors))})"
        )


def _gptq_bits(t: Mapping[str, np.ndarray], n: int, bits: int | None) -> int:
    if bits is not None:
        return bits
    if "qzeros" in t and n and (t["qzeros"].shape[1] * 32) % n == 0:
        return t["qzeros"].shape[1] * 32 // n
    if "g_idx" in t:
        k = t["g_idx"].shape[0]
        if (32 * t["qweight"].shape[0]) % k == 0:
            return 32 * t["qweight"].shape[0] // k
    raise ArgumentError(f"{ENTRY}: cannot tell the GPTQ bit width without qzeros or g_idx; pass bits=")


def _is_fp8(array: np.ndarray) -> bool:
    return array.dtype.itemsize == 1 and (array.dtype == np.uint8 or array.dtype.name == "float8_e4m3fn")


def _dtype_name(array: Any) -> str:
    return str(getattr(array, "dtype", type(array).__name__))


def load_linear(
    source: Source,
    prefix: str,
    dtype: Any = np.float16,
    *,
    bits: int | None = None,
    sym: bool | None = None,
    to_device: ToDevice | None = None,
    keep_reference: bool = False,
) -> MarlinLinearWeight:
    """The layer under ``prefix`` as a :class:`MarlinLinearWeight` for
    activations of ``dtype`` (float16 or ml_dtypes bfloat16).

    ``source``: a ``.safetensors`` file, a list of them, a checkpoint
    directory, or a dict ``{full tensor name: numpy array}``. ``bits``
    overrides the inferred width (GPTQ: from ``qzeros``/``g_idx``;
    compressed-tensors: from ``weight_shape``), ``sym`` GPTQ's inferred
    symmetry (from the zero points; compressed-tensors is symmetric exactly
    when ``weight_zero_point`` is absent). ``keep_reference=True``
    keeps the host tensors for :meth:`MarlinLinearWeight.reference_dequant`.
    """
    if not isinstance(prefix, str):
        raise ArgumentTypeError(f"{ENTRY}: prefix must be a str, got {type(prefix).__name__}")
    t = read_tensors(source, prefix)
    if not t:
        raise ArgumentError(f"{ENTRY}: no tensor named {prefix}.* in the checkpoint")
    common = dict(dtype=dtype, keep_reference=keep_reference, to_device=to_device)
    if "weight_packed" in t:
        return _compressed_tensors(t, prefix, bits, common)
    if "qweight" in t:
        _require(t, ("qweight", "qzeros", "scales") if "g_idx" not in t else ("qweight", "scales"),
                 "GPTQ/AWQ (qweight)", prefix)
        qweight, scales = t["qweight"], t["scales"]
        if qweight.ndim == 2 and scales.ndim == 2 and qweight.shape[1] == scales.shape[1]:
            n = scales.shape[1]
            gbits = _gptq_bits(t, n, bits)
            qzeros = t.get("qzeros")
            gsym = sym
            if gsym is None:
                gsym = qzeros is None or bool((gptq_zero_points(qzeros, gbits) == 1 << (gbits - 1)).all())
            return MarlinLinearWeight.from_gptq(
                qweight, scales, qzeros, t.get("g_idx"), bits=gbits, sym=gsym, **common
            )
        if qweight.ndim == 2 and scales.ndim == 2 and 8 * qweight.shape[1] == scales.shape[1]:
            _require(t, ("qzeros",), "AWQ", prefix)
            if bits not in (None, 4):
                raise ArgumentError(f"{ENTRY}: AWQ layers are 4-bit, got bits={bits}")
            return MarlinLinearWeight.from_awq(qweight, scales, t["qzeros"], **common)
        raise ArgumentError(
            f"{ENTRY}: {prefix!r}: qweight {qweight.shape} and scales {scales.shape} match neither GPTQ "
            "(qweight [K*bits/32, N], scales [G, N]) nor AWQ (qweight [K, N/8], scales [G, N])"
        )
    if "weight" in t:
        weight = t["weight"]
        if not _is_fp8(weight):
            raise ArgumentError(
                f"{ENTRY}: {prefix!r} holds an unquantised weight (dtype {_dtype_name(weight)}); "
                "quantise it with MarlinLinearWeight.from_float"
            )
        if "weight_scale_inv" in t:
            return MarlinLinearWeight.from_fp8(weight, t["weight_scale_inv"], block=(128, 128), **common)
        _require(t, ("weight_scale",), "FP8 (weight float8_e4m3fn)", prefix)
        return MarlinLinearWeight.from_fp8(weight, t["weight_scale"], block=None, **common)
    raise ArgumentError(
        f"{ENTRY}: {prefix!r} is no known quantised layer (GPTQ, AWQ, compressed-tensors, FP8); "
        f"found: {', '.join(sorted(t))}"
    )


def _compressed_tensors(t: Mapping[str, np.ndarray], prefix: str, bits: int | None, common: dict) -> MarlinLinearWeight:
    _require(t, ("weight_packed", "weight_scale"), "compressed-tensors (weight_packed)", prefix)
    if "weight_g_idx" in t:
        raise ArgumentError(f"{ENTRY}: {prefix!r}: compressed-tensors act-order (weight_g_idx) is not supported")
    shape = t.get("weight_shape")
    if bits is None:
        if shape is None:
            raise ArgumentError(f"{ENTRY}: {prefix!r}: without weight_shape the bit width is unknown; pass bits=")
        k_in = int(np.asarray(shape).reshape(-1)[1])
        words = t["weight_packed"].shape[1]
        bits = 32 * words // k_in if k_in and (32 * words) % k_in == 0 else -1
        if bits not in (4, 8):
            raise ArgumentError(
                f"{ENTRY}: {prefix!r}: weight_packed has {words} words per row for K_in={k_in}: "
                "neither 4 nor 8 bits; pass bits="
            )
    return MarlinLinearWeight.from_compressed_tensors(
        t["weight_packed"], t["weight_scale"], t.get("weight_zero_point"), bits=bits, weight_shape=shape, **common
    )
