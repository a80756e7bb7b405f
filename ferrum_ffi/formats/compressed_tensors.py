"""compressed-tensors "pack-quantized" INT4/INT8 weights and their conversion
to the Marlin layouts.

On-disk tensors of one linear layer (``torch.nn.Linear`` orientation:
``N_out`` rows of ``K_in`` inputs; ``bits`` in {4, 8}; ``pack = 32 / bits``):

* ``weight_packed`` int32 ``[N_out, ceil(K_in / pack)]``: packed along
  **K_in**, value ``i`` of word ``w`` (input ``w*pack + i``) at bits
  ``i*bits``. The quantised values are signed (``-2**(bits-1) ..
  2**(bits-1)-1``) and stored **offset to unsigned**: stored = signed +
  ``2**(bits-1)`` (8 for INT4, 128 for INT8). A K_in that ``pack`` does not
  divide is padded with stored 0 at the end of each row.
* ``weight_scale`` ``[N_out, K_in / group_size]`` (strategy "group") or
  ``[N_out, 1]`` (strategy "channel"), a float tensor (fp16, bf16 and fp32
  are accepted; the dtype is not fixed by the format).
* ``weight_zero_point`` (asymmetric group/channel only) int32
  ``[ceil(N_out / pack), G]``: signed zero points packed along **N_out**
  (value ``i`` of word row ``r`` is output ``r*pack + i``, at bits
  ``i*bits``), with the same ``+2**(bits-1)`` offset. Symmetric schemes have
  no zero point (it is 0).
* ``weight_shape`` int ``[2]`` = ``(N_out, K_in)``, used to drop padding.

Dequantisation (signed values): ``w[n, k] = (q[n, k] - zp[n, g]) *
scale[n, g]`` with ``g = k // group_size`` (column order). The GEMM's weight
is the transpose: ``W[k, n] = w[n, k]``.

Verified against compressed-tensors ``pack_quantized.py`` (``pack_to_int32``:
offset ``1 << (num_bits - 1)``, ``reshaped << arange(pack_factor) * num_bits``
along dim 1; zero points with ``packed_dim=0``; shapes in
``compression_param_info``) and ``lifecycle/forward.py`` (``_dequantize``:
``(x_q - zero_point) * scale``; group index ``k // group_size``). Not covered
here: act-order checkpoints (``weight_g_idx``), the "tensor" strategy (one
scale for the whole matrix) and unpacked (int8) zero-point tensors; those are
rejected by the checks below.

For Marlin the stored unsigned values are already the codes: symmetric ones
are U4B8 / U8B128 (bias 8 / 128), asymmetric ones are U4 / U8 codes whose
zero points are the stored zero points (``zp + 2**(bits-1)``), so
``(code - zero) * s = (q - zp) * s`` exactly.
"""

from __future__ import annotations

import numpy as np

from ferrum_ffi._abi import int_group_size_served
from ferrum_ffi.status import ArgumentError, ArgumentTypeError

from ._common import (
    check_bits,
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
    marlin_pack_rows,
    marlin_pack_zero_points,
    marlin_permute_scales,
)

__all__ = [
    "ct_unpack",
    "ct_pack",
    "ct_unpack_zero_points",
    "ct_pack_zero_points",
    "ct_reference_dequant",
    "ct_to_marlin",
]


def _offset(bits: int) -> int:
    return 1 << (bits - 1)


def _check_packed(fn: str, name: str, words: object) -> np.ndarray:
    words = check_ndarray(fn, name, words)
    check_integer_dtype(fn, name, words, itemsize=4)
    check_ndim(fn, name, words, 2)
    check_size(fn, f"{name}.shape[0]", words.shape[0])
    check_size(fn, f"{name}.shape[1]", words.shape[1])
    return words


def _check_weight_shape(fn: str, weight_shape: object, rows: int, max_k: int, pack: int) -> int:
    """``weight_shape`` (N_out, K_in) against ``weight_packed``; returns K_in."""
    if weight_shape is None:
        return max_k
    if isinstance(weight_shape, np.ndarray):
        check_integer_dtype(fn, "weight_shape", weight_shape)
        values = weight_shape.reshape(-1).tolist()
    elif isinstance(weight_shape, (tuple, list)):
        values = list(weight_shape)
    else:
        raise ArgumentTypeError(
            f"{fn}: weight_shape must be a numpy.ndarray, tuple or list, got {type(weight_shape).__name__}"
        )
    if len(values) != 2:
        raise ArgumentError(f"{fn}: weight_shape must hold 2 values (N_out, K_in), got {len(values)}")
    n_out = check_size(fn, "weight_shape[0]", values[0])
    k_in = check_size(fn, "weight_shape[1]", values[1])
    if n_out != rows:
        raise ArgumentError(
            f"{fn}: weight_shape[0]={n_out} must equal weight_packed.shape[0]={rows}"
        )
    if not max_k - pack < k_in <= max_k:
        raise ArgumentError(
            f"{fn}: weight_shape[1]={k_in} must be in {max_k - pack + 1}..{max_k} "
            f"(weight_packed.shape[1]={max_k // pack} words of {pack})"
        )
    return k_in


def _unpack_stored(words: np.ndarray, bits: int) -> np.ndarray:
    """Stored unsigned values of words packed along the last axis."""
    return unpack_last_axis(words, bits)


def ct_unpack(weight_packed: np.ndarray, bits: int, weight_shape: object = None) -> np.ndarray:
    """``weight_packed`` int32 ``[N_out, ceil(K_in*bits/32)]`` -> the signed
    values int8 ``[N_out, K_in]`` (stored - ``2**(bits-1)``). Without
    ``weight_shape`` K_in is ``32/bits`` times the word count."""
    fn = "ct_unpack"
    bits = check_bits(fn, bits)
    weight_packed = _check_packed(fn, "weight_packed", weight_packed)
    pack = 32 // bits
    rows, words = weight_packed.shape
    k = _check_weight_shape(fn, weight_shape, rows, words * pack, pack)
    stored = _unpack_stored(weight_packed, bits)[:, :k]
    return (stored.astype(np.int16) - _offset(bits)).astype(np.int8)


def _check_signed(fn: str, name: str, values: object, bits: int) -> np.ndarray:
    values = check_ndarray(fn, name, values)
    check_integer_dtype(fn, name, values)
    check_ndim(fn, name, values, 2)
    low, high = -_offset(bits), _offset(bits) - 1
    if values.size and (int(values.min()) < low or int(values.max()) > high):
        raise ArgumentError(
            f"{fn}: {name} values must be in {low}..{high} for bits={bits}, "
            f"got range {int(values.min())}..{int(values.max())}"
        )
    check_size(fn, f"{name}.shape[0]", values.shape[0])
    check_size(fn, f"{name}.shape[1]", values.shape[1])
    return values


def _stored_padded(values: np.ndarray, bits: int) -> np.ndarray:
    """Signed [R, C] -> stored uint8 [R, ceil(C/pack)*pack], padded with 0."""
    pack = 32 // bits
    rows, cols = values.shape
    stored = np.zeros((rows, -(-cols // pack) * pack), dtype=np.uint8)
    stored[:, :cols] = values.astype(np.int16) + _offset(bits)
    return stored


def ct_pack(q: np.ndarray, bits: int) -> np.ndarray:
    """Inverse of :func:`ct_unpack`: signed values ``q`` ``[N_out, K_in]`` ->
    ``weight_packed`` int32 ``[N_out, ceil(K_in*bits/32)]`` (padding stored
    as 0). For tests and tools that write checkpoints."""
    fn = "ct_pack"
    bits = check_bits(fn, bits)
    q = _check_signed(fn, "q", q, bits)
    return pack_last_axis(_stored_padded(q, bits), bits)


def ct_unpack_zero_points(weight_zero_point: np.ndarray, bits: int, n_out: int) -> np.ndarray:
    """``weight_zero_point`` int32 ``[ceil(N_out*bits/32), G]`` (packed along
    N_out) -> signed zero points int8 ``[N_out, G]``."""
    fn = "ct_unpack_zero_points"
    bits = check_bits(fn, bits)
    n_out = check_size(fn, "n_out", n_out)
    zp = _check_packed(fn, "weight_zero_point", weight_zero_point)
    pack = 32 // bits
    check_shape(
        fn, "weight_zero_point", zp, (-(-n_out // pack), zp.shape[1]), f"[ceil(n_out*{bits}/32), G]"
    )
    stored = _unpack_stored(zp.T, bits)[:, :n_out]  # [G, N_out]
    return np.ascontiguousarray((stored.astype(np.int16) - _offset(bits)).astype(np.int8).T)


def ct_pack_zero_points(zero_points: np.ndarray, bits: int) -> np.ndarray:
    """Inverse of :func:`ct_unpack_zero_points`: signed ``[N_out, G]`` ->
    int32 ``[ceil(N_out*bits/32), G]``."""
    fn = "ct_pack_zero_points"
    bits = check_bits(fn, bits)
    zero_points = _check_signed(fn, "zero_points", zero_points, bits)
    return np.ascontiguousarray(pack_last_axis(_stored_padded(zero_points.T, bits), bits).T)


def _check_layer(fn, weight_packed, weight_scale, weight_zero_point, bits, group_size, weight_shape):
    """Validate a whole layer. Returns (weight_packed, scale values [N, G],
    signed zero points [N, G] or None, bits, n, k, group_size (-1 or rows))."""
    bits = check_bits(fn, bits)
    weight_packed = _check_packed(fn, "weight_packed", weight_packed)
    pack = 32 // bits
    n, words = weight_packed.shape
    k = _check_weight_shape(fn, weight_shape, n, words * pack, pack)
    scales = check_scale_values(fn, "weight_scale", weight_scale)
    check_ndim(fn, "weight_scale", scales, 2)
    if scales.shape[0] != n:
        raise ArgumentError(
            f"{fn}: weight_scale must have shape [N_out, G] with N_out={n}, got {scales.shape}"
        )
    groups = check_size(fn, "weight_scale.shape[1]", scales.shape[1])
    if group_size is None:
        if groups == 1:
            group_size = -1
        elif k % groups or not int_group_size_served(k // groups):
            raise ArgumentError(
                f"{fn}: weight_scale.shape[1]={groups} must give a group size of 32, 64 or a power of two "
                f">= 128 for K_in={k} (or be 1 for channelwise)"
            )
        else:
            group_size = k // groups
    rows = check_int_group_size(fn, group_size, k, "K_in")
    check_shape(
        fn, "weight_scale", scales, (n, k // rows), "[N_out, K_in/group_size], [N_out, 1] if group_size=-1"
    )
    zero_points = None
    if weight_zero_point is not None:
        zp = _check_packed(fn, "weight_zero_point", weight_zero_point)
        check_shape(
            fn, "weight_zero_point", zp, (-(-n // pack), k // rows), f"[ceil(N_out*{bits}/32), G]"
        )
        zero_points = ct_unpack_zero_points(zp, bits, n)
    return weight_packed, scales, zero_points, bits, n, k, group_size


def ct_reference_dequant(
    weight_packed: np.ndarray,
    weight_scale: np.ndarray,
    weight_zero_point: np.ndarray | None = None,
    bits: int = 4,
    group_size: int | None = None,
    weight_shape: object = None,
) -> np.ndarray:
    """float64 ``W[K_in, N_out]`` of a pack-quantized layer:
    ``W[k, n] = (q[n, k] - zp[n, k // group_size]) * scale[n, k // group_size]``
    with signed ``q`` and ``zp`` (``zp = 0`` without ``weight_zero_point``).

    ``group_size`` None infers it from ``weight_scale``: one column is
    channelwise (-1), otherwise ``K_in / weight_scale.shape[1]`` (32, 64 or a power of two >= 128)."""
    fn = "ct_reference_dequant"
    weight_packed, scales, zero_points, bits, n, k, group_size = _check_layer(
        fn, weight_packed, weight_scale, weight_zero_point, bits, group_size, weight_shape
    )
    q = ct_unpack(weight_packed, bits, (n, k)).astype(np.float64)
    group_of_col = np.arange(k) // (k if group_size == -1 else group_size)
    zp = 0.0 if zero_points is None else zero_points.astype(np.float64)[:, group_of_col]
    w = (q - zp) * scales.astype(np.float64)[:, group_of_col]
    return np.ascontiguousarray(w.T)


def ct_to_marlin(
    weight_packed: np.ndarray,
    weight_scale: np.ndarray,
    weight_zero_point: np.ndarray | None = None,
    bits: int = 4,
    group_size: int | None = None,
    weight_shape: object = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """A pack-quantized layer -> Marlin buffers ``(packed, scales,
    zero_points)``:

    * codes ``W[k, n]`` as unsigned values (stored values: ``q + 2**(bits-1)``)
      in the 4-bit layout int32 ``[K/16, 2N]`` or the 8-bit layout
      ``[K/16, 4N]``; weight type U4B8/U8B128 when symmetric, U4/U8 with zero
      points when ``weight_zero_point`` is given;
    * scales fp16 ``[G, N]`` (transposed from ``[N, G]``) in Marlin order;
    * zero points ``zp + 2**(bits-1)`` in Marlin's zero-point order, int32
      ``[G, N*bits/32]``, or None when symmetric.

    K_in must be a multiple of 16 and N_out of 64."""
    fn = "ct_to_marlin"
    weight_packed, scales, zero_points, bits, n, k, group_size = _check_layer(
        fn, weight_packed, weight_scale, weight_zero_point, bits, group_size, weight_shape
    )
    check_size(fn, "K_in", k, TILE)
    check_size(fn, "N_out", n, CHUNK_COLUMNS)
    pack = 32 // bits
    scales16 = to_float16_finite(fn, "weight_scale", np.ascontiguousarray(scales.T))
    marlin_scales = marlin_permute_scales(scales16, group_size)
    packed = marlin_pack_rows(
        lambda r0, r1: _unpack_stored(weight_packed[:, r0 // pack : r1 // pack], bits).T, k, n, bits
    )
    marlin_zero_points = None
    if zero_points is not None:
        unsigned = (zero_points.astype(np.int16) + _offset(bits)).astype(np.uint8)
        marlin_zero_points = marlin_pack_zero_points(np.ascontiguousarray(unsigned.T), bits)
    return packed, marlin_scales, marlin_zero_points
