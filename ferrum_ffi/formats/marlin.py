"""The Marlin INT4 weight layout, produced and undone on the host with NumPy.

What the layout is
==================
The logical weight is ``W[k, n]`` (``k`` = input feature, ``K`` rows; ``n`` =
output feature, ``N`` columns) stored as 4-bit codes ``q[k, n]`` in 0..15 with
the symmetric zero point 8, so ``W = (q - 8) * s[group(k), n]``.

1. **Tiles.** ``q`` is cut into 16x16 tiles. Tile-rows run along K; inside a
   tile-row the tiles run along N; inside a tile the 16 K-rows x 16 N-columns
   are row-major. One tile-row therefore becomes one row of ``16 * N`` values,
   giving ``[K/16, 16*N]``.
2. **Lane fragments.** Each run of 1024 values (four tiles adjacent along N,
   i.e. 64 output columns) is reordered lane by lane for lanes 0..31. Lane
   ``l`` takes column ``c = l // 4`` and rows ``r = 2*(l % 4) + {0, 1, 8, 9}``
   of each tile -- the fragment ownership of ``mma.m16n8k16`` -- as
   ``tile t: [q(r0..r3, c), q(r0..r3, c + 8)]`` for ``t = 0..3``: 32 values.
3. **Nibble interleave.** Every group of 8 values is reordered to
   ``[0, 2, 4, 6, 1, 3, 5, 7]`` (``new[i] = old[interleave[i]]``) and packed
   into one 32-bit word, value ``i`` at bits ``4i .. 4i+3``.

The buffer is int32 ``[K/16, 2*N]``: 64 columns of one tile-row are exactly
128 words, so a column slice starting at a multiple of 64 is a plain pointer
offset of ``2 * col0`` words (``ferrum_marlin.h`` relies on this).

Scales (fp16, ``[K/group_size, N]`` or ``[1, N]`` for channelwise,
``group_size == -1``) are permuted along N per row:

* grouped, per 64 columns: ``new[8i + j] = old[i + 8j]``;
* channelwise, per 32 columns: ``new = old[perm32]`` with
  ``perm32 = [2i + o for i in 0..3 for o in (0, 1, 8, 9, 16, 17, 24, 25)]``.

The 8-bit form (INT8 codes with bias 128, and FP8-E4M3 bytes)
-------------------------------------------------------------
Steps 1 and 2 are the same (same tiles, same lane fragments). Step 3 works on
bytes: every group of 4 values is reordered to ``[0, 2, 1, 3]`` and packed
into one 32-bit word, value ``i`` in byte ``i`` (bits ``8i .. 8i+7``). The
buffer is int32 ``[K/16, 4*N]`` (a 64-column slice is ``4 * col0`` words in).
After the reorder a word holds one column's rows r, r+1 in its even bytes and
r+8, r+9 in its odd bytes, which is what a byte permute into two ``half2``
fragment registers wants.

Zero points (U4/U8 weights with a zero point per group, ``[G, N]`` codes) are
stored like a row of scales that is then packed: per row, the grouped scale
permutation above (always the grouped one, also for ``G == 1``), then inside
every run of ``32 / bits`` values the interleave of step 3 (``[0, 2, 4, 6, 1,
3, 5, 7]`` for 4 bits, ``[0, 2, 1, 3]`` for 8 bits), packed along N with
value ``i`` at bits ``i*bits``: int32 ``[G, N*bits/32]``.

Why the kernel wants it
=======================
The kernel (``native/src/core/dequant.cuh``, ``native/src/dense/``) is
memory-bound at small batch, so the weight must arrive with one wide, fully
coalesced load and turn into tensor-core operands with no shuffling:

* After step 2 a lane's values for one 16-deep K step of a 64-column chunk are
  32 consecutive nibbles = one 16-byte ``int4`` load, and the 32 lanes of a
  warp read 512 contiguous bytes. Each lane holds exactly the values its MMA
  fragments need, so no ``ldmatrix``/shared-memory transpose is required for
  the weight.
* After step 3 word nibbles ``(0, 4)`` are ``q(r, c), q(r+1, c)``, ``(1, 5)``
  are rows ``r+8, r+9``, and after an 8-bit shift ``(2, 6)``/``(3, 7)`` are the
  same rows at column ``c + 8``. A single ``lop3`` with mask ``0x000f000f`` (or
  ``0x00f000f0``) OR the fp16 exponent of 1024 turns a pair into a ``half2``
  ``1024 + q`` (or ``1024 + 16q``) in both halves at once -- one fragment
  register of two consecutive-K values -- and one ``hsub2``/``hfma2`` removes
  the bias and the zero point. Four such registers per word, no byte permutes.
* Grouped scales: lane ``l`` touches columns ``c + 8j`` (j = 0..7) of a
  64-column chunk; after the permutation those 8 scales are contiguous, so a
  lane fetches them with one 16-byte load, pairs ``(c, c+8)`` per tile.
* Channelwise scales are applied to the accumulators at the end. An output
  fragment of lane ``l`` covers columns ``2(l%4) + {0, 1}`` of each 8-column
  tile, so the permutation puts those pairs of a 32-column span side by side
  (column ``8a + e`` lands at ``8*(e//2) + 2a + e%2``) for ``half2`` loads.

Implementation
==============
Steps 2-3 compose to one fixed gather per 1024-value run, precomputed at import
(``_RUN_ORDER`` for 4 bits, ``_RUN_ORDER_INT8`` for 8 bits). Packing lays a few tile-rows out in step-1 order, gathers the
even and odd positions (low and high nibble of each byte), ORs them into bytes
and reinterprets 4 little-endian bytes as a word; unpacking does the reverse
with the inverse gather. Large matrices are processed a few tile-rows at
a time so temporaries stay cache-sized and memory stays ~1x the output.
"""

from __future__ import annotations

import numpy as np

from ..status import ArgumentError
from ._common import (
    bfloat16_bits_to_float32,
    check_bits,
    check_codes,
    check_group_size,
    check_integer_dtype,
    check_ndarray,
    check_ndim,
    check_scales,
    check_shape,
    check_size,
    is_bfloat16,
    little_endian_bytes,
    pack_last_axis,
    to_float16_finite,
    unpack_last_axis,
    words_from_bytes,
)

__all__ = [
    "marlin_pack_int4",
    "marlin_unpack_int4",
    "marlin_pack_int8",
    "marlin_unpack_int8",
    "marlin_permute_scales",
    "marlin_unpermute_scales",
    "marlin_scale_permutation",
    "marlin_pack_zero_points",
    "marlin_unpack_zero_points",
]

TILE = 16
"""Edge of one MMA tile, in K rows and N columns."""
CHUNK_COLUMNS = 64
"""Output columns served by one warp per K step: four tiles along N."""
_RUN_VALUES = TILE * CHUNK_COLUMNS
_NIBBLE_INTERLEAVE = np.array([0, 2, 4, 6, 1, 3, 5, 7], dtype=np.intp)
_BYTE_INTERLEAVE = np.array([0, 2, 1, 3], dtype=np.intp)
# Work on ~2 Mi values per step: big enough to amortise NumPy call overhead,
# small enough that the temporaries of a step stay in the last-level cache.
_STEP_VALUES = 1 << 21


# --------------------------------------------------------------------------
# Permutations, built once at import.
# --------------------------------------------------------------------------
def _build_run_order(interleave: np.ndarray) -> np.ndarray:
    """For each position of a packed 1024-value run, the index of its value in
    the step-1 run (``tile*256 + row*16 + col``), steps 2 and 3 composed;
    ``interleave`` is step 3's reorder of the values that share one word."""
    lane = np.arange(32)[:, None, None, None]
    tile = np.arange(4)[None, :, None, None]
    half = np.arange(2)[None, None, :, None]
    row_offset = np.array([0, 1, 8, 9])[None, None, None, :]
    row = 2 * (lane % 4) + row_offset
    col = lane // 4 + 8 * half
    fragments = (tile * TILE * TILE + row * TILE + col).reshape(-1)  # (lane, tile, half, row)
    return fragments.reshape(-1, interleave.size)[:, interleave].reshape(-1)


def _frozen(a: np.ndarray) -> np.ndarray:
    a = np.ascontiguousarray(a, dtype=np.intp)
    a.setflags(write=False)
    return a


_RUN_ORDER = _frozen(_build_run_order(_NIBBLE_INTERLEAVE))
# Even positions become the low nibble of a byte, odd positions the high one.
_RUN_ORDER_LOW = _frozen(_RUN_ORDER[0::2])
_RUN_ORDER_HIGH = _frozen(_RUN_ORDER[1::2])
_RUN_ORDER_INVERSE = _frozen(np.argsort(_RUN_ORDER))
_RUN_ORDER_INT8 = _frozen(_build_run_order(_BYTE_INTERLEAVE))
_RUN_ORDER_INT8_INVERSE = _frozen(np.argsort(_RUN_ORDER_INT8))

_SCALE_PERM_GROUPED = _frozen(np.arange(64).reshape(8, 8).T.reshape(-1))
_SCALE_PERM_CHANNELWISE = _frozen(
    (2 * np.arange(4)[:, None] + np.array([0, 1, 8, 9, 16, 17, 24, 25])[None, :]).reshape(-1)
)
_SCALE_UNPERM_GROUPED = _frozen(np.argsort(_SCALE_PERM_GROUPED))
_SCALE_UNPERM_CHANNELWISE = _frozen(np.argsort(_SCALE_PERM_CHANNELWISE))
_WORD_INTERLEAVE = {4: _frozen(_NIBBLE_INTERLEAVE), 8: _frozen(_BYTE_INTERLEAVE)}
_WORD_DEINTERLEAVE = {bits: _frozen(np.argsort(p)) for bits, p in _WORD_INTERLEAVE.items()}


# --------------------------------------------------------------------------
# Core transforms on whole tile-rows (no validation: callers have done it).
# --------------------------------------------------------------------------
def _tile_rows_per_step(n: int) -> int:
    return max(1, _STEP_VALUES // (TILE * n))


def _tile_runs(codes: np.ndarray) -> np.ndarray:
    """Step 1 as a view: codes [16*t, N] -> [t, runs, tile, row, col]."""
    rows, n = codes.shape
    return codes.reshape(rows // TILE, TILE, n // CHUNK_COLUMNS, 4, TILE).transpose(0, 2, 3, 1, 4)


def pack_tile_rows(codes: np.ndarray) -> np.ndarray:
    """uint8 codes [16*t, N] (values 0..15) -> int32 words [t, 2N]."""
    rows, n = codes.shape
    t, runs = rows // TILE, n // CHUNK_COLUMNS
    # One contiguous copy in step-1 order makes the gathers below plain
    # last-axis takes, measured ~2x faster than fancy-indexing the strided view.
    runs_flat = np.ascontiguousarray(_tile_runs(codes)).reshape(t, runs, _RUN_VALUES)
    low = np.take(runs_flat, _RUN_ORDER_LOW, axis=2)
    high = np.take(runs_flat, _RUN_ORDER_HIGH, axis=2)
    np.left_shift(high, 4, out=high)
    np.bitwise_or(low, high, out=low)
    return words_from_bytes(low).reshape(t, 2 * n)


def unpack_tile_rows(words: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """int32 words [t, 2N] -> uint8 codes [16*t, N], written into ``out``
    (C-contiguous rows) when given, to skip a copy into the caller's buffer."""
    t, n = words.shape[0], words.shape[1] // 2
    runs = n // CHUNK_COLUMNS
    pairs = little_endian_bytes(words).reshape(t, runs, _RUN_VALUES // 2)
    packed_order = np.empty((t, runs, _RUN_VALUES), dtype=np.uint8)
    np.bitwise_and(pairs, 0x0F, out=packed_order[:, :, 0::2])
    np.right_shift(pairs, 4, out=packed_order[:, :, 1::2])
    runs_flat = np.take(packed_order, _RUN_ORDER_INVERSE, axis=2)
    codes = np.empty((t * TILE, n), dtype=np.uint8) if out is None else out
    _tile_runs(codes)[...] = runs_flat.reshape(t, runs, 4, TILE, TILE)
    return codes


def _pack_tile_rows_int8(codes: np.ndarray) -> np.ndarray:
    """uint8 codes [16*t, N] (values 0..255) -> int32 words [t, 4N]."""
    rows, n = codes.shape
    t, runs = rows // TILE, n // CHUNK_COLUMNS
    runs_flat = np.ascontiguousarray(_tile_runs(codes)).reshape(t, runs, _RUN_VALUES)
    ordered = np.take(runs_flat, _RUN_ORDER_INT8, axis=2)
    return words_from_bytes(ordered).reshape(t, 4 * n)


def _unpack_tile_rows_int8(words: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """int32 words [t, 4N] -> uint8 codes [16*t, N] (into ``out`` if given)."""
    t, n = words.shape[0], words.shape[1] // 4
    runs = n // CHUNK_COLUMNS
    packed_order = little_endian_bytes(words).reshape(t, runs, _RUN_VALUES)
    runs_flat = np.take(packed_order, _RUN_ORDER_INT8_INVERSE, axis=2)
    codes = np.empty((t * TILE, n), dtype=np.uint8) if out is None else out
    _tile_runs(codes)[...] = runs_flat.reshape(t, runs, 4, TILE, TILE)
    return codes


def _words_per_column(bits: int) -> int:
    """Words of one Marlin tile-row per output column: 16 values of ``bits``."""
    return TILE * bits // 32


def marlin_pack_rows(rows_of, k: int, n: int, bits: int) -> np.ndarray:
    """The Marlin buffer int32 ``[k/16, (bits/2)*n]`` of codes ``[k, n]`` that
    ``rows_of(r0, r1)`` hands out a few tile-rows at a time (uint8-castable,
    already validated). Converters pass a function that decodes just those
    rows of their on-disk tensor, so no full uint8 copy of the codes is made."""
    pack = pack_tile_rows if bits == 4 else _pack_tile_rows_int8
    packed = np.empty((k // TILE, _words_per_column(bits) * n), dtype=np.int32)
    step = _tile_rows_per_step(n)
    for t0 in range(0, k // TILE, step):
        t1 = min(k // TILE, t0 + step)
        rows = rows_of(t0 * TILE, t1 * TILE).astype(np.uint8, copy=False)
        packed[t0:t1] = pack(rows)
    return packed


def _marlin_unpack_rows(packed: np.ndarray, k: int, n: int, bits: int) -> np.ndarray:
    unpack = unpack_tile_rows if bits == 4 else _unpack_tile_rows_int8
    codes = np.empty((k, n), dtype=np.uint8)
    step = _tile_rows_per_step(n)
    for t0 in range(0, k // TILE, step):
        t1 = min(k // TILE, t0 + step)
        unpack(packed[t0:t1], out=codes[t0 * TILE : t1 * TILE])
    return codes


def check_marlin_packed(
    fn: str, packed: object, k: object, n: object, bits: int = 4
) -> tuple[np.ndarray, int, int]:
    k = check_size(fn, "k", k, TILE)
    n = check_size(fn, "n", n, CHUNK_COLUMNS)
    packed = check_ndarray(fn, "packed", packed)
    check_integer_dtype(fn, "packed", packed, itemsize=4)
    check_ndim(fn, "packed", packed, 2)
    w = _words_per_column(bits)
    check_shape(fn, "packed", packed, (k // TILE, w * n), f"[k/16, {w}n]")
    return packed, k, n


# --------------------------------------------------------------------------
# Public API
# --------------------------------------------------------------------------
def marlin_pack_int4(codes: np.ndarray) -> np.ndarray:
    """Pack INT4 codes ``[K, N]`` (0..15, zero point 8) into the Marlin buffer
    int32 ``[K/16, 2N]``. K must be a multiple of 16 and N of 64 because the
    layout is made of 16x16 tiles taken four at a time along N."""
    fn = "marlin_pack_int4"
    codes = check_codes(fn, "codes", codes)
    k, n = codes.shape
    check_size(fn, "codes.shape[0]", k, TILE)
    check_size(fn, "codes.shape[1]", n, CHUNK_COLUMNS)
    return marlin_pack_rows(lambda r0, r1: codes[r0:r1], k, n, 4)


def marlin_unpack_int4(packed: np.ndarray, k: int, n: int) -> np.ndarray:
    """Exact inverse of :func:`marlin_pack_int4`: int32 ``[k/16, 2n]`` -> uint8
    codes ``[k, n]``. ``k`` and ``n`` are explicit so a buffer of the wrong
    shape is caught instead of being reinterpreted."""
    packed, k, n = check_marlin_packed("marlin_unpack_int4", packed, k, n)
    return _marlin_unpack_rows(packed, k, n, 4)


def marlin_pack_int8(codes: np.ndarray) -> np.ndarray:
    """Pack 8-bit codes ``[K, N]`` (0..255: INT8 codes with bias 128, or the
    raw bytes of FP8-E4M3 weights) into the 8-bit Marlin buffer int32
    ``[K/16, 4N]`` (module doc: same tiles and lanes as 4 bits, bytes
    ``[0, 2, 1, 3]`` per word). K must be a multiple of 16 and N of 64."""
    fn = "marlin_pack_int8"
    codes = check_codes(fn, "codes", codes, max_value=255)
    k, n = codes.shape
    check_size(fn, "codes.shape[0]", k, TILE)
    check_size(fn, "codes.shape[1]", n, CHUNK_COLUMNS)
    return marlin_pack_rows(lambda r0, r1: codes[r0:r1], k, n, 8)


def marlin_unpack_int8(packed: np.ndarray, k: int, n: int) -> np.ndarray:
    """Exact inverse of :func:`marlin_pack_int8`: int32 ``[k/16, 4n]`` ->
    uint8 codes ``[k, n]``."""
    packed, k, n = check_marlin_packed("marlin_unpack_int8", packed, k, n, bits=8)
    return _marlin_unpack_rows(packed, k, n, 8)


def _scale_permutation(fn: str, scales: object, group_size: object, inverse: bool) -> np.ndarray:
    scales = check_ndarray(fn, "scales", scales)
    if is_bfloat16(scales.dtype):
        # BF16 activations take BF16 scales: permuted as they are (as bit
        # patterns), never through fp16, which would round and clip them.
        check_ndim(fn, "scales", scales, 2)
        bits16 = np.ascontiguousarray(scales).view(np.uint16)
        if not np.isfinite(bfloat16_bits_to_float32(bits16)).all():
            raise ArgumentError(f"{fn}: scales must be finite")
        return _permute_scale_rows(fn, bits16, group_size, inverse).view(scales.dtype)
    scales = check_scales(fn, "scales", scales)
    return _permute_scale_rows(fn, scales, group_size, inverse, to_fp16=True)


def _permute_scale_rows(
    fn: str, scales: np.ndarray, group_size: object, inverse: bool, to_fp16: bool = False
) -> np.ndarray:
    group_size = check_group_size(fn, group_size)
    rows, n = scales.shape
    if group_size == -1:
        check_size(fn, "scales.shape[0]", rows)
        if rows != 1:
            raise ArgumentError(
                f"{fn}: scales.shape[0]={rows} must be 1 for channelwise (group_size=-1)"
            )
        perm = _SCALE_UNPERM_CHANNELWISE if inverse else _SCALE_PERM_CHANNELWISE
    else:
        check_size(fn, "scales.shape[0]", rows)
        perm = _SCALE_UNPERM_GROUPED if inverse else _SCALE_PERM_GROUPED
    check_size(fn, "scales.shape[1]", n, CHUNK_COLUMNS)
    s16 = to_float16_finite(fn, "scales", scales) if to_fp16 else scales
    return s16.reshape(rows, n // perm.size, perm.size)[:, :, perm].reshape(rows, n)


def marlin_permute_scales(scales: np.ndarray, group_size: int) -> np.ndarray:
    """Scales ``[K/group_size, N]`` (or ``[1, N]`` when ``group_size == -1``)
    -> fp16 of the same shape in the order the kernel loads them (module doc).
    ml_dtypes ``bfloat16`` scales (for BF16 activations) stay bfloat16.
    N must be a multiple of 64, the kernel's column granularity."""
    return _scale_permutation("marlin_permute_scales", scales, group_size, inverse=False)


def marlin_unpermute_scales(scales: np.ndarray, group_size: int) -> np.ndarray:
    """Inverse of :func:`marlin_permute_scales` (fp16, or bfloat16 for
    bfloat16 input; same shape)."""
    return _scale_permutation("marlin_unpermute_scales", scales, group_size, inverse=True)


def marlin_scale_permutation(group_size: int) -> np.ndarray:
    """The column order of one row of Marlin scales, as read-only indices:
    64 of them (grouped, any ``group_size`` but -1) or 32 (channelwise, -1);
    each chunk of a row becomes ``chunk[perm]``. For data the kernel reads in
    the scales' order but that are not float scales -- the E8M0 bytes and the
    bias of MXFP4 (:mod:`.mxfp4`) -- so they get exactly the same order."""
    group_size = check_group_size("marlin_scale_permutation", group_size)
    return _SCALE_PERM_CHANNELWISE if group_size == -1 else _SCALE_PERM_GROUPED


def marlin_pack_zero_points(zero_points: np.ndarray, bits: int) -> np.ndarray:
    """Zero points ``[G, N]`` (integers 0..2**bits-1, one row per group) ->
    int32 ``[G, N*bits/32]`` in the order the kernel reads them: per row the
    grouped scale permutation (per 64 columns ``new[8i + j] = old[i + 8j]``),
    then per word the interleave ``[0, 2, 4, 6, 1, 3, 5, 7]`` (4 bits) or
    ``[0, 2, 1, 3]`` (8 bits), packed along N with value ``i`` at bits
    ``i*bits``. N must be a multiple of 64."""
    fn = "marlin_pack_zero_points"
    bits = check_bits(fn, bits)
    zero_points = check_codes(fn, "zero_points", zero_points, max_value=(1 << bits) - 1)
    rows, n = zero_points.shape
    check_size(fn, "zero_points.shape[0]", rows)
    check_size(fn, "zero_points.shape[1]", n, CHUNK_COLUMNS)
    per_word = 32 // bits
    z = zero_points.astype(np.uint8, copy=False)
    z = z.reshape(rows, n // CHUNK_COLUMNS, CHUNK_COLUMNS)[:, :, _SCALE_PERM_GROUPED]
    z = z.reshape(rows, n // per_word, per_word)[:, :, _WORD_INTERLEAVE[bits]]
    return pack_last_axis(z.reshape(rows, n), bits)


def marlin_unpack_zero_points(packed: np.ndarray, n: int, bits: int) -> np.ndarray:
    """Exact inverse of :func:`marlin_pack_zero_points`: int32
    ``[G, n*bits/32]`` -> uint8 ``[G, n]``."""
    fn = "marlin_unpack_zero_points"
    bits = check_bits(fn, bits)
    n = check_size(fn, "n", n, CHUNK_COLUMNS)
    packed = check_ndarray(fn, "packed", packed)
    check_integer_dtype(fn, "packed", packed, itemsize=4)
    check_ndim(fn, "packed", packed, 2)
    rows = check_size(fn, "packed.shape[0]", packed.shape[0])
    check_shape(fn, "packed", packed, (rows, n * bits // 32), f"[G, n*{bits}/32]")
    per_word = 32 // bits
    z = unpack_last_axis(packed, bits)
    z = z.reshape(rows, n // per_word, per_word)[:, :, _WORD_DEINTERLEAVE[bits]]
    z = z.reshape(rows, n // CHUNK_COLUMNS, CHUNK_COLUMNS)[:, :, _SCALE_UNPERM_GROUPED]
    return np.ascontiguousarray(z.reshape(rows, n))
