"""AutoAWQ "GEMM" on-disk INT4 weights and their conversion to the Marlin
layout with zero points.

On-disk tensors of one linear layer (``K`` input features, ``N`` outputs,
4 bits only, ``G = K / group_size``, or 1 for ``group_size == -1``):

* ``qweight`` int32 ``[K, N/8]``: packed along **N**. The 8 nibbles of word
  ``w`` of row ``k`` hold the 8 columns ``8w .. 8w+7`` in the AWQ order:
  nibble ``i`` (bits ``4i .. 4i+3``) holds column ``8w + AWQ_ORDER[i]`` with
  ``AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]``. Read the other way round, column
  ``8w + j`` is in nibble ``AWQ_REVERSE_ORDER[j]`` with
  ``AWQ_REVERSE_ORDER = [0, 4, 1, 5, 2, 6, 3, 7]``. Example: the word
  ``0x76543210`` (nibble ``i`` holds the value ``i``) decodes to columns
  ``8w .. 8w+7`` = ``[0, 4, 1, 5, 2, 6, 3, 7]``.
* ``qzeros`` int32 ``[G, N/8]``: the zero points, packed the same way.
  They are used **as stored** (no ``-1`` / ``+1`` as in AutoGPTQ).
* ``scales`` fp16 ``[G, N]``.

Dequantisation: ``w[k, n] = (q[k, n] - z[k // group_size, n]) *
s[k // group_size, n]``.

These facts were checked against AutoAWQ's ``WQLinear_GEMM.from_linear``
(packs column ``col*8 + order_map[i]`` at bits ``4i`` with ``order_map =
[0, 2, 4, 6, 1, 3, 5, 7]``, same for ``qzeros``; buffer shapes ``[in, out/8]``,
``[in/group, out/8]``, ``[in/group, out]`` fp16) and ``dequantize_gemm``
(``(iweight - izeros) * scales``, ``repeat_interleave(group_size)`` along K).

For Marlin the codes go to the 4-bit layout unchanged (weight type U4 with
zero points), the scales to Marlin's scale order and the zero points to
Marlin's zero-point order (:func:`.marlin.marlin_pack_zero_points`).
"""

from __future__ import annotations

import numpy as np

from ._common import (
    check_codes,
    check_int_group_size,
    check_integer_dtype,
    check_ndarray,
    check_ndim,
    check_scale_values,
    check_shape,
    check_size,
    to_float16_finite,
    pack_last_axis,
    unpack_last_axis,
)
from .marlin import (
    CHUNK_COLUMNS,
    TILE,
    _STEP_VALUES,
    marlin_pack_rows,
    marlin_pack_zero_points,
    marlin_permute_scales,
)

__all__ = [
    "AWQ_ORDER",
    "AWQ_REVERSE_ORDER",
    "awq_unpack",
    "awq_unpack_zeros",
    "awq_pack",
    "awq_reference_dequant",
    "awq_to_marlin",
]

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
"""Nibble ``i`` of a word holds column ``8w + AWQ_ORDER[i]``."""
AWQ_REVERSE_ORDER = (0, 4, 1, 5, 2, 6, 3, 7)
"""Column ``8w + j`` is held by nibble ``AWQ_REVERSE_ORDER[j]``."""

_ORDER = np.array(AWQ_ORDER, dtype=np.intp)
_REVERSE = np.array(AWQ_REVERSE_ORDER, dtype=np.intp)
assert (_ORDER[_REVERSE] == np.arange(8)).all()


def _decode_rows(words: np.ndarray) -> np.ndarray:
    """int32 [R, W] -> uint8 [R, 8W] in column order."""
    r, w = words.shape
    nibbles = unpack_last_axis(words, 4).reshape(r, w, 8)
    return np.ascontiguousarray(nibbles[:, :, _REVERSE]).reshape(r, 8 * w)


def _check_packed(fn: str, name: str, words: object) -> np.ndarray:
    words = check_ndarray(fn, name, words)
    check_integer_dtype(fn, name, words, itemsize=4)
    check_ndim(fn, name, words, 2)
    check_size(fn, f"{name}.shape[0]", words.shape[0])
    check_size(fn, f"{name}.shape[1]", words.shape[1])
    return words


def _rows_per_step(n: int) -> int:
    return max(1, _STEP_VALUES // n)


def awq_unpack(qweight: np.ndarray) -> np.ndarray:
    """AWQ ``qweight`` int32 ``[K, N/8]`` -> uint8 codes ``[K, N]`` (0..15)."""
    qweight = _check_packed("awq_unpack", "qweight", qweight)
    k, w = qweight.shape
    codes = np.empty((k, 8 * w), dtype=np.uint8)
    step = _rows_per_step(8 * w)
    for r0 in range(0, k, step):
        codes[r0 : r0 + step] = _decode_rows(qweight[r0 : r0 + step])
    return codes


def awq_unpack_zeros(qzeros: np.ndarray) -> np.ndarray:
    """AWQ ``qzeros`` int32 ``[G, N/8]`` -> uint8 zero points ``[G, N]``,
    as stored (AWQ uses them without an offset)."""
    return _decode_rows(_check_packed("awq_unpack_zeros", "qzeros", qzeros))


def awq_pack(codes: np.ndarray) -> np.ndarray:
    """Inverse of :func:`awq_unpack` (also packs zero points): codes
    ``[R, N]`` (0..15, N a multiple of 8) -> int32 ``[R, N/8]``. For tests and
    tools that write checkpoints."""
    fn = "awq_pack"
    codes = check_codes(fn, "codes", codes)
    r, n = codes.shape
    check_size(fn, "codes.shape[0]", r)
    check_size(fn, "codes.shape[1]", n, 8)
    nibbles = codes.astype(np.uint8, copy=False).reshape(r, n // 8, 8)[:, :, _ORDER]
    return pack_last_axis(nibbles.reshape(r, n), 4)


def _check_layer(fn: str, qweight, scales, qzeros, group_size):
    """Validate a whole AWQ layer; returns (qweight, scales values, qzeros,
    k, n, rows per group)."""
    qweight = _check_packed(fn, "qweight", qweight)
    k, n = qweight.shape[0], 8 * qweight.shape[1]
    rows = check_int_group_size(fn, group_size, k, "k = qweight.shape[0]")
    groups = k // rows
    scales = check_scale_values(fn, "scales", scales)
    check_ndim(fn, "scales", scales, 2)
    check_shape(fn, "scales", scales, (groups, n), "[k/group_size, n], [1, n] if group_size=-1")
    qzeros = _check_packed(fn, "qzeros", qzeros)
    check_shape(fn, "qzeros", qzeros, (groups, n // 8), "[k/group_size, n/8]")
    return qweight, scales, qzeros, k, n, rows


def awq_reference_dequant(
    qweight: np.ndarray, scales: np.ndarray, qzeros: np.ndarray, group_size: int
) -> np.ndarray:
    """float64 ``W[K, N] = (q - z[k // group_size]) * s[k // group_size]``
    (all of K one group for ``group_size == -1``), straight from the
    on-disk tensors; exact for fp16/bf16/fp32 scales."""
    fn = "awq_reference_dequant"
    qweight, scales, qzeros, k, n, rows = _check_layer(fn, qweight, scales, qzeros, group_size)
    codes = awq_unpack(qweight).astype(np.float64)
    zeros = awq_unpack_zeros(qzeros).astype(np.float64)
    group_of_row = np.arange(k) // rows
    return (codes - zeros[group_of_row]) * scales.astype(np.float64)[group_of_row]


def awq_to_marlin(
    qweight: np.ndarray, scales: np.ndarray, qzeros: np.ndarray, group_size: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """An AWQ layer -> the Marlin buffers of weight type U4 with zero points:

    * the codes in the 4-bit Marlin layout, int32 ``[K/16, 2N]``;
    * the scales, fp16 ``[G, N]`` in Marlin order (grouped permutation, or the
      channelwise one for ``group_size == -1``);
    * the zero points, int32 ``[G, N/8]`` in Marlin's zero-point order.

    K must be a multiple of 16 and N of 64 (the layout's tiles)."""
    fn = "awq_to_marlin"
    qweight, scale_values, qzeros, k, n, _ = _check_layer(fn, qweight, scales, qzeros, group_size)
    check_size(fn, "k = qweight.shape[0]", k, TILE)
    check_size(fn, "n = 8 * qweight.shape[1]", n, CHUNK_COLUMNS)
    marlin_scales = marlin_permute_scales(to_float16_finite(fn, "scales", scale_values), group_size)
    packed = marlin_pack_rows(lambda r0, r1: _decode_rows(qweight[r0:r1]), k, n, 4)
    zero_points = marlin_pack_zero_points(awq_unpack_zeros(qzeros), 4)
    return packed, marlin_scales, zero_points
