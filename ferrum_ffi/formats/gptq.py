"""GPTQ on-disk INT4 (AutoGPTQ, ``desc_act=False``, symmetric) and its
conversion to the Marlin layout.

``qweight`` is int32 ``[K/8, N]``: word ``r`` of column ``n`` holds
``q[8r + i, n]`` at bits ``4i .. 4i+3`` (i = 0..7), zero point 8. Checkpoints
come in this layout, the kernel wants Marlin's (see :mod:`.marlin`), so the
loader converts once at load time. The conversions work a few tile-rows at a
time so that a 8192 x 28672 projection never needs a full uint8 copy of the
codes on top of input and output.
"""

from __future__ import annotations

import numpy as np

from ferrum_ffi.status import ArgumentError

from .marlin import (
    CHUNK_COLUMNS,
    TILE,
    _STEP_VALUES,
    _check_codes,
    _check_group_size,
    _check_integer_dtype,
    _check_marlin_packed,
    _check_ndarray,
    _check_ndim,
    _check_scales,
    _check_shape,
    _check_size,
    _little_endian_bytes,
    _pack_tile_rows,
    _unpack_tile_rows,
    _words_from_bytes,
    marlin_permute_scales,
)

__all__ = [
    "gptq_unpack_int4",
    "gptq_pack_int4",
    "repack_gptq_to_marlin",
    "repack_marlin_to_gptq",
    "repack_scales_to_marlin",
    "permute_gptq_qweight_rows",
]

_PER_WORD = 8
"""INT4 values per 32-bit word."""


def _word_rows_per_step(n: int) -> int:
    """Word rows per step, even so that a step is whole Marlin tile-rows
    (one tile-row = 16 K rows = 2 GPTQ word rows)."""
    return max(2, (_STEP_VALUES // (_PER_WORD * n)) // 2 * 2)


def _unpack_word_rows(qweight: np.ndarray) -> np.ndarray:
    """int32 [R, N] -> uint8 codes [8R, N]."""
    r, n = qweight.shape
    pairs = _little_endian_bytes(qweight).reshape(r, n, _PER_WORD // 2)
    codes = np.empty((r * _PER_WORD, n), dtype=np.uint8)
    by_word = codes.reshape(r, _PER_WORD, n)
    # Byte j of a little-endian word holds values 2j (low nibble) and 2j+1.
    by_word[:, 0::2, :] = (pairs & 0x0F).transpose(0, 2, 1)
    by_word[:, 1::2, :] = (pairs >> 4).transpose(0, 2, 1)
    return codes


def _pack_word_rows(codes: np.ndarray) -> np.ndarray:
    """uint8 codes [8R, N] (0..15) -> int32 [R, N]."""
    k, n = codes.shape
    by_word = codes.reshape(k // _PER_WORD, _PER_WORD, n)
    low = by_word[:, 0::2, :].transpose(0, 2, 1)
    high = by_word[:, 1::2, :].transpose(0, 2, 1)
    pairs = np.ascontiguousarray(low | (high << 4))  # [R, N, 4]
    return _words_from_bytes(pairs).reshape(k // _PER_WORD, n)


def _check_qweight(fn: str, qweight: object) -> np.ndarray:
    qweight = _check_ndarray(fn, "qweight", qweight)
    _check_integer_dtype(fn, "qweight", qweight, itemsize=4)
    _check_ndim(fn, "qweight", qweight, 2)
    _check_size(fn, "qweight.shape[0]", qweight.shape[0])
    _check_size(fn, "qweight.shape[1]", qweight.shape[1])
    return qweight


def gptq_unpack_int4(qweight: np.ndarray) -> np.ndarray:
    """GPTQ ``qweight`` int32 ``[K/8, N]`` -> uint8 codes ``[K, N]`` (0..15)."""
    qweight = _check_qweight("gptq_unpack_int4", qweight)
    r, n = qweight.shape
    codes = np.empty((r * _PER_WORD, n), dtype=np.uint8)
    step = _word_rows_per_step(n)
    for r0 in range(0, r, step):
        r1 = min(r, r0 + step)
        codes[r0 * _PER_WORD : r1 * _PER_WORD] = _unpack_word_rows(qweight[r0:r1])
    return codes


def gptq_pack_int4(codes: np.ndarray) -> np.ndarray:
    """Codes ``[K, N]`` (integers 0..15, K a multiple of 8) -> GPTQ int32
    ``[K/8, N]``. Mostly for tests and tools that write checkpoints."""
    fn = "gptq_pack_int4"
    codes = _check_codes(fn, "codes", codes)
    k, n = codes.shape
    _check_size(fn, "codes.shape[0]", k, _PER_WORD)
    _check_size(fn, "codes.shape[1]", n)
    qweight = np.empty((k // _PER_WORD, n), dtype=np.int32)
    step = _word_rows_per_step(n)
    for r0 in range(0, k // _PER_WORD, step):
        r1 = min(k // _PER_WORD, r0 + step)
        rows = codes[r0 * _PER_WORD : r1 * _PER_WORD].astype(np.uint8, copy=False)
        qweight[r0:r1] = _pack_word_rows(rows)
    return qweight


def repack_gptq_to_marlin(qweight: np.ndarray, k: int, n: int) -> np.ndarray:
    """GPTQ ``qweight`` int32 ``[k/8, n]`` -> Marlin int32 ``[k/16, 2n]``.

    ``k``/``n`` are the logical weight shape, passed explicitly so a transposed
    or truncated tensor is rejected rather than repacked into garbage."""
    fn = "repack_gptq_to_marlin"
    k = _check_size(fn, "k", k, TILE)
    n = _check_size(fn, "n", n, CHUNK_COLUMNS)
    qweight = _check_qweight(fn, qweight)
    _check_shape(fn, "qweight", qweight, (k // _PER_WORD, n), "[k/8, n]")
    packed = np.empty((k // TILE, 2 * n), dtype=np.int32)
    step = _word_rows_per_step(n)
    for r0 in range(0, k // _PER_WORD, step):
        r1 = min(k // _PER_WORD, r0 + step)
        codes = _unpack_word_rows(qweight[r0:r1])
        packed[r0 // 2 : r1 // 2] = _pack_tile_rows(codes)
    return packed


def repack_marlin_to_gptq(packed: np.ndarray, k: int, n: int) -> np.ndarray:
    """Inverse of :func:`repack_gptq_to_marlin`: Marlin int32 ``[k/16, 2n]``
    -> GPTQ int32 ``[k/8, n]`` (tests, and tools that export checkpoints)."""
    packed, k, n = _check_marlin_packed("repack_marlin_to_gptq", packed, k, n)
    qweight = np.empty((k // _PER_WORD, n), dtype=np.int32)
    step = _word_rows_per_step(n)
    for r0 in range(0, k // _PER_WORD, step):
        r1 = min(k // _PER_WORD, r0 + step)
        codes = _unpack_tile_rows(packed[r0 // 2 : r1 // 2])
        qweight[r0:r1] = _pack_word_rows(codes)
    return qweight


def repack_scales_to_marlin(scales: np.ndarray, k: int, n: int, group_size: int) -> np.ndarray:
    """GPTQ scales ``[k/group_size, n]`` (``[1, n]`` for ``group_size == -1``)
    -> fp16 in Marlin order, same shape. The shape is checked against the
    weight's ``k``/``n`` so scales of another layer cannot slip through."""
    fn = "repack_scales_to_marlin"
    k = _check_size(fn, "k", k, TILE)
    n = _check_size(fn, "n", n, CHUNK_COLUMNS)
    group_size = _check_group_size(fn, group_size)
    if group_size != -1 and k % group_size:
        raise ArgumentError(f"{fn}: k={k} must be a multiple of group_size={group_size}")
    scales = _check_scales(fn, "scales", scales)
    rows = 1 if group_size == -1 else k // group_size
    _check_shape(fn, "scales", scales, (rows, n), "[k/group_size, n], [1, n] if group_size=-1")
    return marlin_permute_scales(scales, group_size)


def _check_permutation(fn: str, perm: object, k: int) -> np.ndarray:
    """A gather by anything but a permutation would duplicate or drop input
    features, which no later check could detect."""
    perm = _check_ndarray(fn, "perm", perm)
    _check_integer_dtype(fn, "perm", perm)
    _check_ndim(fn, "perm", perm, 1)
    _check_shape(fn, "perm", perm, (k,), "K = 8 * qweight.shape[0]")
    low, high = int(perm.min()), int(perm.max())
    if low < 0 or high >= k:
        raise ArgumentError(f"{fn}: perm values must be in 0..{k - 1}, got range {low}..{high}")
    seen = np.zeros(k, dtype=bool)
    seen[perm] = True
    if not seen.all():
        raise ArgumentError(f"{fn}: perm must be a permutation of range({k}) (repeated entries)")
    return perm.astype(np.intp, copy=False)


def permute_gptq_qweight_rows(qweight: np.ndarray, perm: np.ndarray) -> np.ndarray:
    """Reorder the K rows of a GPTQ ``qweight``: ``q_new[i] = q[perm[i]]``.

    For act-order checkpoints: with ``perm = argsort(g_idx)`` the rows of each
    quantisation group become contiguous, which is what a grouped Marlin
    weight needs (the activations are gathered with the same ``perm``)."""
    fn = "permute_gptq_qweight_rows"
    qweight = _check_qweight(fn, qweight)
    r, n = qweight.shape
    perm = _check_permutation(fn, perm, r * _PER_WORD)
    out = np.empty_like(qweight, dtype=np.int32)
    step = _word_rows_per_step(n)
    for r0 in range(0, r, step):
        r1 = min(r, r0 + step)
        source = perm[r0 * _PER_WORD : r1 * _PER_WORD]
        # Read each new row's nibble straight from its source word: no full
        # unpacked copy of the matrix is needed for an arbitrary row gather.
        shifts = (4 * (source % _PER_WORD)).astype(np.int32)[:, None]
        words = qweight[source // _PER_WORD].astype(np.int32, copy=False)
        codes = ((words >> shifts) & 0x0F).astype(np.uint8)
        out[r0:r1] = _pack_word_rows(codes)
    return out
