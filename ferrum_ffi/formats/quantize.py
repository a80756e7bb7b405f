"""Round-to-nearest symmetric INT4 quantisation (GPTQ convention) and the
float64 dequantisation the GPU tests use as ground truth.

Per group of ``group_size`` consecutive K rows (all of K for ``-1``) and per
column::

    absmax = max |w|                      (float32)
    scale  = float16(2 * absmax / 15)     (computed in float32)
    q      = clip(rint(w / float32(scale)) + 8, 0, 15)

The stored fp16 scale -- not the float32 one -- is the divisor, so that the
codes are the best fit for the scale the kernel will actually multiply by.
``rint`` rounds half to even, like ``torch.round`` in GPTQ's reference.

Zero groups: when the fp16 scale would be 0 (``absmax == 0``, or so small that
``2*absmax/15`` underflows float16, i.e. ``absmax`` below ~4.5e-8) the scale is
stored as **1.0**. A zero scale would make ``w / scale`` NaN and is
indistinguishable from a corrupt checkpoint; 1.0 is exact in fp16, keeps the
kernel's ``(q - 8) * s`` finite, and every value of such a group quantises to
code 8, which dequantises to exactly 0 (error ``|w| < 4.5e-8``).

Error bound: ``|dequant - w| <= scale/2`` up to the fp16 rounding of the scale
(the largest value of a group can sit ``7.5 * 2**-11`` scale steps beyond the
top code 15, so the bound is ``scale * (1/2 + 2**-8)`` in the worst case).

The work is done in blocks of whole groups x a column range, in float32, so a
8192 x 28672 matrix needs only the uint8 codes and the scales beyond the input.
"""

from __future__ import annotations

import numpy as np

from ferrum_ffi.status import ArgumentError

from ._common import (
    check_codes,
    check_float_dtype,
    check_group_size,
    check_ndarray,
    check_ndim,
    check_scales,
    check_shape,
    check_size,
)
from .marlin import (
    _STEP_VALUES,
)

__all__ = ["quantize_int4_symmetric", "dequantize_int4_symmetric"]

_ZERO_POINT = 8
_MAX_CODE = 15
_ZERO_GROUP_SCALE = np.float16(1.0)


def _effective_group_size(fn: str, group_size: object, k: int, k_name: str) -> int:
    """Rows per scale row: ``group_size``, or all of K for channelwise."""
    group_size = check_group_size(fn, group_size)
    if group_size == -1:
        return k
    if k % group_size:
        raise ArgumentError(f"{fn}: {k_name}={k} must be a multiple of group_size={group_size}")
    return group_size


def _block_shape(group: int, k: int, n: int) -> tuple[int, int]:
    """(rows, cols) of one work block: whole groups (a group's absmax needs all
    its rows) and as many columns as keep the block near _STEP_VALUES."""
    if group * n <= _STEP_VALUES:
        return group * max(1, _STEP_VALUES // (group * n)), n
    return group, max(1, _STEP_VALUES // group)


def _scales_from_absmax(fn: str, absmax: np.ndarray, row0: int) -> np.ndarray:
    """fp16 scales for float32 absmax values, with the zero-group rule."""
    if not np.isfinite(absmax).all():
        raise ArgumentError(f"{fn}: w must be finite (NaN/inf in the group at row {row0} or later)")
    with np.errstate(over="ignore"):  # overflow is reported below, by name
        scale = ((absmax * np.float32(2)) / np.float32(_MAX_CODE)).astype(np.float16)
    if np.isinf(scale).any():
        raise ArgumentError(
            f"{fn}: w has |w| too large for a float16 scale (needs |w| <= ~491000) "
            f"in the group at row {row0} or later"
        )
    scale[scale == 0] = _ZERO_GROUP_SCALE
    return scale


def _encode_block(x: np.ndarray, scale16: np.ndarray, codes: np.ndarray) -> None:
    """x float32 [g, rows, c] (overwritten) -> codes uint8 [g, rows, c]."""
    np.divide(x, scale16.astype(np.float32)[:, None, :], out=x)
    np.rint(x, out=x)
    np.add(x, np.float32(_ZERO_POINT), out=x)
    np.clip(x, 0, _MAX_CODE, out=x)
    np.copyto(codes, x, casting="unsafe")


def quantize_int4_symmetric(w: np.ndarray, group_size: int = 128) -> tuple[np.ndarray, np.ndarray]:
    """Quantise ``w`` float ``[K, N]`` to (codes uint8 ``[K, N]``, scales
    float16 ``[K/group_size, N]``, or ``[1, N]`` for ``group_size == -1``).

    See the module docstring for the exact rule and the zero-group choice."""
    fn = "quantize_int4_symmetric"
    w = check_ndarray(fn, "w", w)
    check_float_dtype(fn, "w", w)
    check_ndim(fn, "w", w, 2)
    k = check_size(fn, "w.shape[0]", w.shape[0])
    n = check_size(fn, "w.shape[1]", w.shape[1])
    group = _effective_group_size(fn, group_size, k, "w.shape[0]")

    codes = np.empty((k, n), dtype=np.uint8)
    scales = np.empty((k // group, n), dtype=np.float16)
    rows, cols = _block_shape(group, k, n)
    for r0 in range(0, k, rows):
        r1 = min(k, r0 + rows)
        g0, g1 = r0 // group, r1 // group
        for c0 in range(0, n, cols):
            c1 = min(n, c0 + cols)
            x = w[r0:r1, c0:c1].astype(np.float32).reshape(g1 - g0, group, c1 - c0)
            # max/-min instead of abs(): no block-sized temporary.
            absmax = np.maximum(x.max(axis=1), -x.min(axis=1))
            scale16 = _scales_from_absmax(fn, absmax, r0)
            scales[g0:g1, c0:c1] = scale16
            _encode_block(x, scale16, codes[r0:r1, c0:c1].reshape(g1 - g0, group, c1 - c0))
    return codes, scales


def dequantize_int4_symmetric(codes: np.ndarray, scales: np.ndarray, group_size: int) -> np.ndarray:
    """float64 ``(codes - 8) * scales[group(k), n]``, ``[K, N]``: exact for any
    fp16 scale, hence the reference the GPU results are compared with."""
    fn = "dequantize_int4_symmetric"
    codes = check_codes(fn, "codes", codes)
    k = check_size(fn, "codes.shape[0]", codes.shape[0])
    n = check_size(fn, "codes.shape[1]", codes.shape[1])
    group = _effective_group_size(fn, group_size, k, "codes.shape[0]")
    scales = check_scales(fn, "scales", scales)
    check_shape(fn, "scales", scales, (k // group, n), "[K/group_size, N], [1, N] if group_size=-1")
    out = codes.astype(np.float64)
    out -= _ZERO_POINT
    out.reshape(k // group, group, n)[...] *= scales.astype(np.float64)[:, None, :]
    return out
