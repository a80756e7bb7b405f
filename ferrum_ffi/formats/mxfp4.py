"""MXFP4 expert weights (the GPT-OSS checkpoint layout) and their conversion to
the Marlin layout of the MXFP4 x BF16 fused-MoE GEMM.

On-disk tensors of one expert projection (``N`` outputs, ``K`` input features,
``K`` a multiple of 32; a stacked checkpoint adds a leading expert axis):

* ``blocks`` uint8 ``[N, K/2]``: two E2M1 codes per byte, the **low** nibble is
  feature ``2j``, the high nibble feature ``2j + 1``. A code is ``bit 3`` =
  sign, ``bits 2..0`` = index into the magnitudes ``[0, 0.5, 1, 1.5, 2, 3, 4,
  6]``.
* ``scales`` uint8 ``[N, K/32]``: one E8M0 exponent per 32 consecutive
  features, value ``2**(e - 127)``; ``e = 255`` is NaN.

Dequantisation: ``w[n, k] = e2m1(code[n, k]) * 2**(scales[n, k // 32] - 127)``.
The GEMM's weight is the transpose ``W[k, n] = w[n, k]``.

Marlin side
===========
The kernel reads E2M1 codes exactly where it reads INT4 codes, so the codes go
into the 4-bit Marlin layout (:mod:`.marlin`) unchanged, through GPTQ words:
word ``(r, col)`` holds features ``8r .. 8r+7`` of column ``col``, feature
``8r + i`` at bits ``4i``. Those 8 nibbles are bytes ``4r .. 4r+3`` of row
``col`` of ``blocks`` in the same nibble order, so a GPTQ word *is* four
checkpoint bytes read as a little-endian int32: the conversion is a
reinterpretation plus a transpose, no nibble is moved
(:func:`transpose_mxfp4_expert_blocks_to_gptq_words`).

The scales become uint8 ``[K/32, N]`` with the grouped Marlin permutation per 64
columns -- the one fp16 scales of group size 32 get -- applied to the bytes
(:func:`prepare_mxfp4_expert_scales_for_marlin`). The bias, added to the
accumulators like channelwise scales, gets the channelwise permutation per 32
columns ("P32", :func:`permute_mxfp4_marlin_bias_bf16`).

Physical K
==========
The fused-MoE kernels take any ``N`` and ``K`` that are multiples of 64: a tile
that does not divide them runs a partial last tile, reading and writing nothing
outside the problem. So a projection runs with its logical K when that is a
multiple of 64 -- both GPT-OSS projections do (gate/up ``N = 5760, K = 2880``,
down ``N = K = 2880``) -- and a K that is only a multiple of 32 is rounded up to
the next multiple of 64 (:func:`mxfp4_physical_k`). The padded features get
zero codes and zero scale bytes (weights exactly 0), and the activations carry
zeros there (the GPT-OSS SwiGLU writes them: ``ferrum_gpt_oss_swiglu``'s
``physical_d``). Wider padding stays available through :func:`pad_mxfp4_k`
(or ``MarlinMoeWeight.from_mxfp4``'s ``physical_k``) for callers that want the
original engine's layout, whose GPT-OSS down projection ran with K = 2944.
"""

from __future__ import annotations

import numpy as np

from ferrum_ffi.status import ArgumentError, ArgumentTypeError

from ._common import check_ndarray, check_ndim, check_shape, check_size, is_bfloat16
from .marlin import CHUNK_COLUMNS, marlin_scale_permutation

__all__ = [
    "MXFP4_GROUP_SIZE",
    "E2M1_MAGNITUDES",
    "decode_mxfp4",
    "quantize_mxfp4",
    "transpose_mxfp4_expert_blocks_to_gptq_words",
    "prepare_mxfp4_expert_scales_for_marlin",
    "permute_mxfp4_marlin_bias_bf16",
    "unpermute_mxfp4_marlin_bias_bf16",
    "mxfp4_physical_k",
    "pad_mxfp4_k",
]

MXFP4_GROUP_SIZE = 32
"""Features per E8M0 scale."""
E2M1_MAGNITUDES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
"""The value of code bits 2..0; bit 3 is the sign."""
_E8M0_NAN = 0xFF
_E8M0_BIAS = 127
_CODES = np.array(E2M1_MAGNITUDES + tuple(-m for m in E2M1_MAGNITUDES), dtype=np.float64)


# --------------------------------------------------------------------------
# Argument checks
# --------------------------------------------------------------------------
def _as_bytes(fn: str, name: str, values: object, also: str | None = None) -> np.ndarray:
    """A uint8 ndarray (or, for scales, ml_dtypes' ``also`` dtype, read as its bytes)."""
    values = check_ndarray(fn, name, values)
    if also is not None and values.dtype.name == also and values.dtype.itemsize == 1:
        return values.view(np.uint8)
    if values.dtype != np.uint8:
        allowed = "uint8" if also is None else f"uint8 or {also}"
        raise ArgumentTypeError(f"{fn}: {name} must have dtype {allowed}, got {values.dtype}")
    return values


def _check_blocks_and_scales(fn: str, blocks: object, scales: object) -> tuple[np.ndarray, np.ndarray, int]:
    """``blocks [..., N, K/2]`` and ``scales [..., N, K/32]`` of one layout;
    returns them as uint8 and the logical K."""
    blocks = _as_bytes(fn, "blocks", blocks)
    scales = _as_bytes(fn, "scales", scales, also="float8_e8m0fnu")
    if blocks.ndim < 2:
        raise ArgumentError(f"{fn}: blocks must be at least 2-D [..., N, K/2], got shape {blocks.shape}")
    for axis, size in enumerate(blocks.shape):
        check_size(fn, f"blocks.shape[{axis}]", size)
    k = 2 * blocks.shape[-1]
    check_size(fn, "K = 2 * blocks.shape[-1]", k, MXFP4_GROUP_SIZE)
    check_shape(fn, "scales", scales, blocks.shape[:-1] + (k // MXFP4_GROUP_SIZE,), "[..., N, K/32] of blocks")
    return blocks, scales, k


def _reject_nan_scales(fn: str, scales: np.ndarray) -> None:
    """An E8M0 NaN has no value the kernel could use (its bit move would give
    2**128), so refuse it here, where it is traceable."""
    nan = scales == _E8M0_NAN
    if nan.any():
        where = tuple(int(i) for i in np.argwhere(nan)[0])
        raise ArgumentError(f"{fn}: scales must not contain the E8M0 NaN byte 0xFF; found at {list(where)}")


# --------------------------------------------------------------------------
# Reference decoder and quantiser
# --------------------------------------------------------------------------
def decode_mxfp4(blocks: np.ndarray, scales: np.ndarray, dtype: object = np.float64) -> np.ndarray:
    """The checkpoint's weight ``w [..., N, K]`` from ``blocks [..., N, K/2]``
    and ``scales [..., N, K/32]`` (module doc), any leading axes (experts).

    float64 (default) is exact for every code and scale; float32 is exact too
    except for magnitudes of 2**128 and more (large codes under the scale
    bytes 253 and 254), which become inf. A scale byte 0xFF (E8M0 NaN)
    decodes to NaN."""
    fn = "decode_mxfp4"
    blocks, scales, k = _check_blocks_and_scales(fn, blocks, scales)
    dtype = np.dtype(dtype)
    if dtype not in (np.float32, np.float64):
        raise ArgumentTypeError(f"{fn}: dtype must be float32 or float64, got {dtype}")
    codes = np.empty(blocks.shape[:-1] + (k,), dtype=np.uint8)
    np.bitwise_and(blocks, 0x0F, out=codes[..., 0::2])
    np.right_shift(blocks, 4, out=codes[..., 1::2])
    scale = np.ldexp(1.0, scales.astype(np.int32) - _E8M0_BIAS)
    scale[scales == _E8M0_NAN] = np.nan
    w = _CODES[codes].reshape(scales.shape + (MXFP4_GROUP_SIZE,)) * scale[..., None]
    with np.errstate(over="ignore"):  # documented: float32 overflow is inf
        return w.reshape(codes.shape).astype(dtype, copy=False)


def _round_to_e2m1(x: np.ndarray) -> np.ndarray:
    """|x| (float64, any value >= 0) -> the nearest E2M1 magnitude index 0..7,
    ties to the even index (even mantissa), saturating at 6. The magnitudes are
    evenly spaced in three runs (0..2 by 0.5, 2..4 by 1, 4..6 by 2), so each
    run is one ``rint``."""
    low = np.rint(2.0 * x)
    mid = 4.0 + np.rint(x - 2.0)
    high = 6.0 + np.rint((x - 4.0) / 2.0)
    index = np.where(x <= 2.0, low, np.where(x <= 4.0, mid, high))
    return np.minimum(index, 7.0).astype(np.uint8)


def quantize_mxfp4(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Round-to-nearest MXFP4 of float ``w [..., N, K]`` (K a multiple of 32)
    -> ``(blocks uint8 [..., N, K/2], scales uint8 [..., N, K/32])`` in the
    checkpoint layout (for tests and demos, not a calibrated quantiser).

    Per group of 32 features the exponent is the smallest ``s`` with
    ``absmax / 2**s <= 6`` (so nothing saturates), clipped to E8M0's
    ``-127 .. 127``; an all-zero group gets ``s = 0``. Every value is then
    rounded to the nearest E2M1 value of ``w / 2**s``, ties to even."""
    fn = "quantize_mxfp4"
    w = check_ndarray(fn, "w", w)
    if w.dtype.kind != "f":
        raise ArgumentTypeError(f"{fn}: w must have a floating dtype, got {w.dtype}")
    if w.ndim < 2:
        raise ArgumentError(f"{fn}: w must be at least 2-D [..., N, K], got shape {w.shape}")
    for axis, size in enumerate(w.shape):
        check_size(fn, f"w.shape[{axis}]", size, MXFP4_GROUP_SIZE if axis == w.ndim - 1 else 1)
    x = w.astype(np.float64).reshape(w.shape[:-1] + (w.shape[-1] // MXFP4_GROUP_SIZE, MXFP4_GROUP_SIZE))
    if not np.isfinite(x).all():
        raise ArgumentError(f"{fn}: w must be finite")
    absmax = np.abs(x).max(axis=-1)
    # absmax / 6 = m * 2**e with m in [0.5, 1): the smallest s with
    # absmax / 6 <= 2**s is e, or e - 1 when m is exactly 0.5.
    mantissa, exponent = np.frexp(absmax / 6.0)
    shared = np.where(mantissa == 0.5, exponent - 1, exponent)
    shared = np.where(absmax == 0.0, 0, np.clip(shared, -_E8M0_BIAS, _E8M0_BIAS))
    scaled = x / np.ldexp(1.0, shared)[..., None]
    codes = _round_to_e2m1(np.abs(scaled)) | np.where(np.signbit(scaled), 0x08, 0).astype(np.uint8)
    codes = codes.reshape(w.shape)
    blocks = (codes[..., 0::2] | (codes[..., 1::2] << 4)).astype(np.uint8)
    return blocks, (shared + _E8M0_BIAS).astype(np.uint8)


# --------------------------------------------------------------------------
# Marlin preparation of one expert
# --------------------------------------------------------------------------
def transpose_mxfp4_expert_blocks_to_gptq_words(blocks: np.ndarray, n: int, k: int) -> np.ndarray:
    """One expert's ``blocks`` uint8 ``[n, k/2]`` -> GPTQ-style int32 words
    ``[k/8, n]``: word ``(r, col)`` holds the codes of features ``8r .. 8r+7``
    of column ``col``, feature ``8r + i`` at bits ``4i .. 4i+3`` (GPTQ
    ``qweight`` order), ready for ``repack_gptq_to_marlin(words, k, n)``.

    ``n``/``k`` are explicit so a transposed or truncated tensor is rejected
    instead of being reinterpreted; ``k`` must be a multiple of 8 (one word)."""
    fn = "transpose_mxfp4_expert_blocks_to_gptq_words"
    n = check_size(fn, "n", n)
    k = check_size(fn, "k", k, 8)
    blocks = _as_bytes(fn, "blocks", blocks)
    check_ndim(fn, "blocks", blocks, 2)
    check_shape(fn, "blocks", blocks, (n, k // 2), "[n, k/2]")
    # Module doc: bytes 4r..4r+3 of a row, little-endian, are word r already.
    words = np.ascontiguousarray(blocks).view("<i4")  # [n, k/8]
    return np.ascontiguousarray(words.T).astype(np.int32, copy=False)


def prepare_mxfp4_expert_scales_for_marlin(scales: np.ndarray, n: int, k: int) -> np.ndarray:
    """One expert's E8M0 ``scales`` ``[n, k/32]`` -> uint8 ``[k/32, n]`` in the
    Marlin scale order: transposed to one row per group, then per row, per 64
    columns, the grouped permutation ``new[8i + j] = old[i + 8j]`` -- exactly
    what ``repack_scales_to_marlin`` does to fp16 scales of group size 32
    (:func:`.marlin.marlin_scale_permutation`). ``n`` must be a multiple of 64,
    ``k`` of 32; the byte 0xFF (E8M0 NaN) is rejected."""
    fn = "prepare_mxfp4_expert_scales_for_marlin"
    n = check_size(fn, "n", n, CHUNK_COLUMNS)
    k = check_size(fn, "k", k, MXFP4_GROUP_SIZE)
    scales = _as_bytes(fn, "scales", scales, also="float8_e8m0fnu")
    check_ndim(fn, "scales", scales, 2)
    groups = k // MXFP4_GROUP_SIZE
    check_shape(fn, "scales", scales, (n, groups), "[n, k/32]")
    _reject_nan_scales(fn, scales)
    perm = marlin_scale_permutation(MXFP4_GROUP_SIZE)
    by_chunk = scales.T.reshape(groups, n // perm.size, perm.size)
    return np.ascontiguousarray(by_chunk[:, :, perm]).reshape(groups, n)


# --------------------------------------------------------------------------
# Bias (bf16, channelwise order)
# --------------------------------------------------------------------------
def _bias_bits(fn: str, bias: object, expert_count: int, n: int) -> np.ndarray:
    """uint16 bit patterns ``[expert_count, n]`` of a bf16 bias given as a
    uint16 / bfloat16 ndarray ``[E, N]`` or as little-endian bytes."""
    if isinstance(bias, (bytes, bytearray, memoryview)):
        raw = np.frombuffer(bias, dtype=np.uint8)
        if raw.size != 2 * expert_count * n:
            raise ArgumentError(
                f"{fn}: bias given as bytes must hold expert_count*n={expert_count * n} little-endian bf16 "
                f"values ({2 * expert_count * n} bytes), got {raw.size} bytes"
            )
        return raw.view("<u2").astype(np.uint16).reshape(expert_count, n)
    bias = check_ndarray(fn, "bias", bias)
    if bias.dtype != np.uint16 and not is_bfloat16(bias.dtype):
        raise ArgumentTypeError(
            f"{fn}: bias must have dtype bfloat16 or uint16 (bf16 bit patterns), or be bytes; got {bias.dtype}"
        )
    check_ndim(fn, "bias", bias, 2)
    check_shape(fn, "bias", bias, (expert_count, n), "[expert_count, n]")
    return np.ascontiguousarray(bias).view(np.uint16)


def _permute_bias(fn: str, bias: object, expert_count: int, n: int, inverse: bool) -> object:
    expert_count = check_size(fn, "expert_count", expert_count)
    n = check_size(fn, "n", n, CHUNK_COLUMNS)
    bits = _bias_bits(fn, bias, expert_count, n)
    perm = marlin_scale_permutation(-1)
    if inverse:
        perm = np.argsort(perm)
    out = np.ascontiguousarray(bits.reshape(expert_count, n // perm.size, perm.size)[:, :, perm])
    out = out.reshape(expert_count, n)
    if isinstance(bias, (bytes, bytearray, memoryview)):
        return out.astype("<u2").tobytes()
    return out.view(bias.dtype)


def permute_mxfp4_marlin_bias_bf16(bias: object, expert_count: int, n: int) -> object:
    """A bf16 bias ``[expert_count, n]`` -> the same values with each expert's
    row in the channelwise Marlin scale order (per 32 columns ``new =
    old[perm32]``, :func:`.marlin.marlin_scale_permutation` of -1), the order
    in which the MXFP4 kernel adds it to its accumulators.

    ``bias`` is an ndarray of dtype uint16 (bf16 bit patterns) or ml_dtypes
    bfloat16, or bytes of little-endian bf16 (row-major); the result has the
    same type, dtype and shape. Bit-exact (values are moved, never converted).
    ``n`` must be a multiple of 64."""
    return _permute_bias("permute_mxfp4_marlin_bias_bf16", bias, expert_count, n, inverse=False)


def unpermute_mxfp4_marlin_bias_bf16(bias: object, expert_count: int, n: int) -> object:
    """Inverse of :func:`permute_mxfp4_marlin_bias_bf16` (same input forms)."""
    return _permute_bias("unpermute_mxfp4_marlin_bias_bf16", bias, expert_count, n, inverse=True)


# --------------------------------------------------------------------------
# Physical K
# --------------------------------------------------------------------------
def mxfp4_physical_k(n: int, k: int) -> int:
    """The K an MXFP4 projection of ``n`` outputs and logical ``k`` features
    (a multiple of 32) runs with: ``k`` rounded up to a multiple of 64, the
    kernels' minimum thread width. No tile has to divide it -- the kernels run
    a partial last tile (module doc) -- so ``n`` does not change the answer;
    it is still checked (a multiple of 64) and kept in the signature. GPT-OSS:
    ``(2880, 2880) -> 2880``, ``(5760, 2880) -> 2880``. The original engine's
    padded down projection (K = 2944) stays available through
    :func:`pad_mxfp4_k` or an explicit ``physical_k``."""
    fn = "mxfp4_physical_k"
    check_size(fn, "n", n, CHUNK_COLUMNS)
    k = check_size(fn, "k", k, MXFP4_GROUP_SIZE)
    return -(-k // 64) * 64


def pad_mxfp4_k(blocks: np.ndarray, scales: np.ndarray, physical_k: int) -> tuple[np.ndarray, np.ndarray]:
    """Extend ``blocks [..., N, K/2]`` and ``scales [..., N, K/32]`` along K
    to ``physical_k`` (a multiple of 32, at least K) with zero bytes: codes 0
    (+0.0) and scale bytes 0 (``2**-127``), so the padded features weigh
    exactly 0. Returns the inputs themselves when there is nothing to pad."""
    fn = "pad_mxfp4_k"
    blocks, scales, k = _check_blocks_and_scales(fn, blocks, scales)
    physical_k = check_size(fn, "physical_k", physical_k, MXFP4_GROUP_SIZE)
    if physical_k < k:
        raise ArgumentError(f"{fn}: physical_k={physical_k} must be at least K={k} (2 * blocks.shape[-1])")
    if physical_k == k:
        return blocks, scales
    lead = blocks.shape[:-1]
    padded_blocks = np.zeros(lead + (physical_k // 2,), dtype=np.uint8)
    padded_blocks[..., : k // 2] = blocks
    padded_scales = np.zeros(lead + (physical_k // MXFP4_GROUP_SIZE,), dtype=np.uint8)
    padded_scales[..., : k // MXFP4_GROUP_SIZE] = scales
    return padded_blocks, padded_scales
