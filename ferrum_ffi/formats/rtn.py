"""Round-to-nearest quantisation to 4- or 8-bit codes, symmetric or with zero
points, with scales in the activation dtype (fp16, or ml_dtypes bfloat16).

Per group of ``group_size`` consecutive K rows (all of K for ``-1``) and per
column, with ``qmax = 2**bits - 1``:

* symmetric: ``scale = dtype(2 * absmax / qmax)``, zero point ``2**(bits-1)``
  (8 or 128: the kernel's U4B8 / U8B128 bias);
* asymmetric: the range ``[min(w, 0), max(w, 0)]`` (zero is always
  representable), ``scale = dtype((hi - lo) / qmax)``, zero point
  ``clip(rint(-lo / scale), 0, qmax)``;

then ``q = clip(rint(w / scale) + zero, 0, qmax)`` with the **stored** scale as
the divisor (so the codes fit the scale the kernel multiplies by), computed in
float32; ``rint`` rounds half to even. A scale that would be 0 (an all-zero
group) is stored as 1.0, as in :mod:`.quantize`. For 4-bit symmetric fp16 the
result is exactly :func:`.quantize.quantize_int4_symmetric`'s.

The value a code stands for is ``(q - zero) * scale``
(:func:`dequantize_rtn`, float64, exact).
"""

from __future__ import annotations

import numpy as np

from ferrum_ffi.status import ArgumentError, ArgumentTypeError

from ._common import (
    bfloat16_bits_to_float32,
    check_bits,
    check_codes,
    check_float_dtype,
    check_int_group_size,
    check_ndarray,
    check_ndim,
    check_scale_values,
    check_shape,
    check_size,
    is_bfloat16,
)
from .marlin import _STEP_VALUES

__all__ = ["quantize_rtn", "dequantize_rtn", "scales_in_dtype", "check_activation_dtype"]


def scales_in_dtype(fn: str, name: str, values: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """Float scale values -> ``dtype`` (float16 or bfloat16), one rounding,
    refusing what is not finite there (it would poison whole output columns)."""
    values = np.asarray(values)
    with np.errstate(over="ignore", invalid="ignore"):
        out = values.astype(dtype)
    finite = np.isfinite(bfloat16_bits_to_float32(out.view(np.uint16))) if is_bfloat16(out.dtype) else np.isfinite(out)
    if not finite.all():
        limit = "65504" if out.dtype == np.float16 else "3.39e38"
        raise ArgumentError(f"{fn}: {name} must be finite in {out.dtype.name} (|s| <= {limit})")
    return out


def check_activation_dtype(fn: str, dtype: object) -> np.dtype:
    """float16 or ml_dtypes bfloat16: the general GEMM's activation (and scale) types."""
    try:
        dtype = np.dtype(dtype)
    except TypeError:
        raise ArgumentTypeError(f"{fn}: dtype must be float16 or bfloat16, got {dtype!r}") from None
    if dtype != np.float16 and not is_bfloat16(dtype):
        raise ArgumentTypeError(f"{fn}: dtype must be float16 or bfloat16 (ml_dtypes), got {dtype}")
    return dtype


def quantize_rtn(
    w: np.ndarray, bits: int = 4, group_size: int = 128, sym: bool = True, dtype: object = np.float16
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Quantise float ``w [K, N]`` -> ``(codes uint8 [K, N], scales dtype [G, N],
    zero points uint8 [G, N] or None when symmetric)``, ``G = K / group_size``
    (1 for -1). Group sizes -1, 32, 64 or a power of two >= 128 (the general GEMM's)."""
    fn = "quantize_rtn"
    bits = check_bits(fn, bits)
    if not isinstance(sym, (bool, np.bool_)):
        raise ArgumentTypeError(f"{fn}: sym must be a bool, got {type(sym).__name__}")
    dtype = check_activation_dtype(fn, dtype)
    w = check_ndarray(fn, "w", w)
    check_float_dtype(fn, "w", w)
    check_ndim(fn, "w", w, 2)
    k = check_size(fn, "w.shape[0]", w.shape[0])
    n = check_size(fn, "w.shape[1]", w.shape[1])
    rows = check_int_group_size(fn, group_size, k, "w.shape[0]")
    groups = k // rows
    qmax = (1 << bits) - 1
    codes = np.empty((k, n), dtype=np.uint8)
    scales = np.empty((groups, n), dtype=dtype)
    zeros = None if sym else np.empty((groups, n), dtype=np.uint8)
    # Whole columns at a time (a group needs all its rows), ~_STEP_VALUES values per step.
    cols = max(1, _STEP_VALUES // k)
    for c0 in range(0, n, cols):
        c1 = min(n, c0 + cols)
        x = w[:, c0:c1].astype(np.float32).reshape(groups, rows, c1 - c0)
        if not np.isfinite(x).all():
            raise ArgumentError(f"{fn}: w must be finite (NaN/inf in columns {c0}..{c1 - 1})")
        if sym:
            absmax = np.maximum(x.max(axis=1), -x.min(axis=1))
            raw = absmax * np.float32(2) / np.float32(qmax)
        else:
            lo = np.minimum(x.min(axis=1), np.float32(0))
            hi = np.maximum(x.max(axis=1), np.float32(0))
            raw = (hi - lo) / np.float32(qmax)
        s = scales_in_dtype(fn, "w's scales", raw, dtype)
        s[s.astype(np.float32) == 0] = 1.0
        scales[:, c0:c1] = s
        s32 = s.astype(np.float32)
        if sym:
            zero = np.full(s32.shape, np.float32(1 << (bits - 1)))
        else:
            zero = np.clip(np.rint(-lo / s32), 0, qmax)
            zeros[:, c0:c1] = zero
        q = np.rint(x / s32[:, None, :]) + zero[:, None, :]
        np.clip(q, 0, qmax, out=q)
        codes[:, c0:c1] = q.reshape(k, c1 - c0)
    return codes, scales, zeros


def dequantize_rtn(
    codes: np.ndarray,
    scales: np.ndarray,
    zero_points: np.ndarray | None,
    group_size: int,
    bits: int = 4,
) -> np.ndarray:
    """float64 ``(q - zero) * scale`` ``[K, N]``; ``zero = 2**(bits-1)`` when
    ``zero_points`` is None. Exact for fp16/bf16/fp32 scales."""
    fn = "dequantize_rtn"
    bits = check_bits(fn, bits)
    codes = check_codes(fn, "codes", codes, max_value=(1 << bits) - 1)
    k, n = codes.shape
    rows = check_int_group_size(fn, group_size, k, "codes.shape[0]")
    s = check_scale_values(fn, "scales", scales)
    check_shape(fn, "scales", s, (k // rows, n), "[K/group_size, N], [1, N] if group_size=-1")
    if zero_points is None:
        zero = np.float64(1 << (bits - 1))
    else:
        zero_points = check_codes(fn, "zero_points", zero_points, max_value=(1 << bits) - 1)
        check_shape(fn, "zero_points", zero_points, (k // rows, n), "[K/group_size, N]")
        zero = np.repeat(zero_points.astype(np.float64), rows, axis=0)
    return (codes.astype(np.float64) - zero) * np.repeat(s.astype(np.float64), rows, axis=0)
