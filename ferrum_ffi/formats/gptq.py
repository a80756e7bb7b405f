"""GPTQ on-disk weights (AutoGPTQ format) and their conversion to the Marlin
layouts.

On-disk tensors of one linear layer (``K`` input features, ``N`` outputs,
``bits`` in {4, 8}, ``G = K / group_size`` or 1 for ``group_size == -1``):

* ``qweight`` int32 ``[K*bits/32, N]``: packed along K. Word ``r`` of column
  ``n`` holds ``q[r*32/bits + i, n]`` at bits ``i*bits .. i*bits+bits-1``.
* ``qzeros`` int32 ``[G, N*bits/32]``: packed along N, value ``i`` of word
  ``w`` (column ``w*32/bits + i``) at bits ``i*bits``. AutoGPTQ writes the
  zero point **minus one** (``zeros -= 1`` before packing) and its kernels add
  the 1 back, so :func:`gptq_unpack_zeros` returns the stored values and
  :func:`gptq_zero_points` the zero points.
* ``scales`` fp16 ``[G, N]``; ``g_idx`` int32 ``[K]`` (row -> group; with
  ``desc_act`` it is not ``k // group_size``).

Dequantisation: ``w[k, n] = (q[k, n] - zero[g, n]) * scales[g, n]`` with
``g = g_idx[k]`` (or ``k // group_size``); symmetric checkpoints use the
fixed zero ``2**(bits-1)`` (8 or 128: Marlin's U4B8 / U8B128).

Checkpoints come in this layout, the kernel wants Marlin's (see
:mod:`.marlin`), so the loader converts once at load time. The conversions
work a few tile-rows at a time so that a 8192 x 28672 projection never needs a
full uint8 copy of the codes on top of input and output.
"""

from __future__ import annotations

import numpy as np

from ferrum_ffi.status import ArgumentError, ArgumentTypeError

from ._common import (
    check_bits,
    check_codes,
    check_group_size,
    check_int_group_size,
    check_integer_dtype,
    check_ndarray,
    check_ndim,
    check_scale_values,
    check_scales,
    check_shape,
    check_size,
    little_endian_bytes,
    unpack_last_axis,
    words_from_bytes,
)
from .marlin import (
    CHUNK_COLUMNS,
    TILE,
    _STEP_VALUES,
    check_marlin_packed,
    marlin_pack_rows,
    pack_tile_rows,
    unpack_tile_rows,
    marlin_permute_scales,
)

__all__ = [
    "gptq_unpack_int4",
    "gptq_pack_int4",
    "gptq_unpack",
    "gptq_pack",
    "gptq_unpack_zeros",
    "gptq_zero_points",
    "gptq_reference_dequant",
    "repack_gptq_to_marlin",
    "repack_gptq_to_marlin_bits",
    "repack_marlin_to_gptq",
    "repack_scales_to_marlin",
    "permute_gptq_qweight_rows",
]

_PER_WORD = 8
"""INT4 values per 32-bit word."""


def _word_rows_per_step(n: int, bits: int = 4) -> int:
    """Word rows per step, a multiple of one Marlin tile-row (16 K rows = 2
    word rows at 4 bits, 4 at 8 bits) so that a step is whole tile-rows."""
    per_tile = TILE * bits // 32
    return max(per_tile, (_STEP_VALUES // ((32 // bits) * n)) // per_tile * per_tile)


def _unpack_word_rows(qweight: np.ndarray) -> np.ndarray:
    """int32 [R, N] -> uint8 codes [8R, N]."""
    r, n = qweight.shape
    pairs = little_endian_bytes(qweight).reshape(r, n, _PER_WORD // 2)
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
    return words_from_bytes(pairs).reshape(k // _PER_WORD, n)


def _unpack_word_rows_int8(qweight: np.ndarray) -> np.ndarray:
    """int32 [R, N] -> uint8 codes [4R, N]: byte i of word r is row 4r + i."""
    r, n = qweight.shape
    b = little_endian_bytes(qweight).reshape(r, n, 4)
    return np.ascontiguousarray(b.transpose(0, 2, 1)).reshape(4 * r, n)


def _pack_word_rows_int8(codes: np.ndarray) -> np.ndarray:
    """uint8 codes [4R, N] -> int32 [R, N]."""
    k, n = codes.shape
    b = np.ascontiguousarray(codes.reshape(k // 4, 4, n).transpose(0, 2, 1), dtype=np.uint8)
    return words_from_bytes(b).reshape(k // 4, n)


_UNPACK_WORD_ROWS = {4: _unpack_word_rows, 8: _unpack_word_rows_int8}
_PACK_WORD_ROWS = {4: _pack_word_rows, 8: _pack_word_rows_int8}


def _check_qweight(fn: str, qweight: object) -> np.ndarray:
    qweight = check_ndarray(fn, "qweight", qweight)
    check_integer_dtype(fn, "qweight", qweight, itemsize=4)
    check_ndim(fn, "qweight", qweight, 2)
    check_size(fn, "qweight.shape[0]", qweight.shape[0])
    check_size(fn, "qweight.shape[1]", qweight.shape[1])
    return qweight


def _gptq_unpack(fn: str, qweight: object, bits: int) -> np.ndarray:
    qweight = _check_qweight(fn, qweight)
    r, n = qweight.shape
    per_word = 32 // bits
    unpack = _UNPACK_WORD_ROWS[bits]
    codes = np.empty((r * per_word, n), dtype=np.uint8)
    step = _word_rows_per_step(n, bits)
    for r0 in range(0, r, step):
        r1 = min(r, r0 + step)
        codes[r0 * per_word : r1 * per_word] = unpack(qweight[r0:r1])
    return codes


def _gptq_pack(fn: str, codes: object, bits: int) -> np.ndarray:
    codes = check_codes(fn, "codes", codes, max_value=(1 << bits) - 1)
    k, n = codes.shape
    per_word = 32 // bits
    check_size(fn, "codes.shape[0]", k, per_word)
    check_size(fn, "codes.shape[1]", n)
    pack = _PACK_WORD_ROWS[bits]
    qweight = np.empty((k // per_word, n), dtype=np.int32)
    step = _word_rows_per_step(n, bits)
    for r0 in range(0, k // per_word, step):
        r1 = min(k // per_word, r0 + step)
        rows = codes[r0 * per_word : r1 * per_word].astype(np.uint8, copy=False)
        qweight[r0:r1] = pack(rows)
    return qweight


def gptq_unpack_int4(qweight: np.ndarray) -> np.ndarray:
    """GPTQ ``qweight`` int32 ``[K/8, N]`` -> uint8 codes ``[K, N]`` (0..15)."""
    return _gptq_unpack("gptq_unpack_int4", qweight, 4)


def gptq_pack_int4(codes: np.ndarray) -> np.ndarray:
    """Codes ``[K, N]`` (integers 0..15, K a multiple of 8) -> GPTQ int32
    ``[K/8, N]``. Mostly for tests and tools that write checkpoints."""
    return _gptq_pack("gptq_pack_int4", codes, 4)


def gptq_unpack(qweight: np.ndarray, bits: int) -> np.ndarray:
    """GPTQ ``qweight`` int32 ``[K*bits/32, N]`` -> uint8 codes ``[K, N]``
    (0..2**bits-1); word ``r`` of column ``n`` holds rows ``r*32/bits + i`` at
    bits ``i*bits``. ``bits`` is 4 or 8."""
    fn = "gptq_unpack"
    return _gptq_unpack(fn, qweight, check_bits(fn, bits))


def gptq_pack(codes: np.ndarray, bits: int) -> np.ndarray:
    """Inverse of :func:`gptq_unpack`: codes ``[K, N]`` (0..2**bits-1, K a
    multiple of 32/bits) -> int32 ``[K*bits/32, N]``."""
    fn = "gptq_pack"
    return _gptq_pack(fn, codes, check_bits(fn, bits))


def _check_qzeros(fn: str, qzeros: object, bits: int) -> np.ndarray:
    qzeros = check_ndarray(fn, "qzeros", qzeros)
    check_integer_dtype(fn, "qzeros", qzeros, itemsize=4)
    check_ndim(fn, "qzeros", qzeros, 2)
    check_size(fn, "qzeros.shape[0]", qzeros.shape[0])
    check_size(fn, "qzeros.shape[1]", qzeros.shape[1])
    return qzeros


def gptq_unpack_zeros(qzeros: np.ndarray, bits: int) -> np.ndarray:
    """GPTQ ``qzeros`` int32 ``[G, N*bits/32]`` -> the **stored** values,
    uint8 ``[G, N]`` (value ``i`` of word ``w`` is column ``w*32/bits + i``).

    AutoGPTQ stores ``zero - 1``; use :func:`gptq_zero_points` for the zero
    points themselves."""
    fn = "gptq_unpack_zeros"
    bits = check_bits(fn, bits)
    return unpack_last_axis(_check_qzeros(fn, qzeros, bits), bits)


def gptq_zero_points(qzeros: np.ndarray, bits: int) -> np.ndarray:
    """The zero points of a GPTQ ``qzeros``: ``(stored + 1) & (2**bits - 1)``,
    uint8 ``[G, N]``.

    AutoGPTQ packs ``zero - 1`` and adds the 1 back when it dequantises. Its
    PyTorch fallback does not mask after adding, so a stored ``2**bits - 1``
    would mean a zero of ``2**bits`` there; that value is what AutoGPTQ
    writes for a true zero of 0 (whose ``-1`` also spills ones into the
    higher values of the word, so such a checkpoint is damaged either way).
    Masking keeps the result a valid code and maps that case back to 0."""
    fn = "gptq_zero_points"
    bits = check_bits(fn, bits)
    stored = unpack_last_axis(_check_qzeros(fn, qzeros, bits), bits)
    return ((stored.astype(np.uint16) + 1) & ((1 << bits) - 1)).astype(np.uint8)


def _check_g_idx(fn: str, g_idx: object, k: int, groups: int, group_size: int, k_full: bool = True) -> np.ndarray:
    """An act-order ``g_idx``: one group per row, every group exactly
    ``group_size`` rows (a permutation of the plain ``k // group_size``); of
    a K shard (``k_full=False``), at most ``group_size`` rows per group."""
    g_idx = check_ndarray(fn, "g_idx", g_idx)
    check_integer_dtype(fn, "g_idx", g_idx)
    check_ndim(fn, "g_idx", g_idx, 1)
    check_shape(fn, "g_idx", g_idx, (k,), "one group index per row of K")
    low, high = int(g_idx.min()), int(g_idx.max())
    if low < 0 or high >= groups:
        raise ArgumentError(
            f"{fn}: g_idx values must be in 0..{groups - 1}, got range {low}..{high}"
        )
    counts = np.bincount(g_idx.astype(np.intp), minlength=groups)
    wrong = counts > group_size if not k_full else counts != group_size
    if wrong.any():
        bad = int(np.flatnonzero(wrong)[0])
        rule = (f"at most group_size={group_size} rows (a K shard)" if not k_full else
                f"exactly group_size={group_size} rows (a permutation of k // group_size)")
        raise ArgumentError(f"{fn}: g_idx must give every group {rule}; group {bad} has {int(counts[bad])}")
    return g_idx.astype(np.intp)


def gptq_reference_dequant(
    qweight: np.ndarray,
    scales: np.ndarray,
    qzeros: np.ndarray | None = None,
    g_idx: np.ndarray | None = None,
    bits: int = 4,
    sym: bool = True,
    group_size: int = 128,
    k_full: bool = True,
) -> np.ndarray:
    """float64 ``W[K, N]`` of a GPTQ layer with AutoGPTQ's semantics.

    ``w[k, n] = (q[k, n] - zero[g, n]) * scales[g, n]`` where ``g = g_idx[k]``
    when ``g_idx`` is given, else ``k // group_size`` (all of K for -1);
    ``zero = 2**(bits-1)`` when ``sym`` (``qzeros``, if given, must hold that
    zero point), else :func:`gptq_zero_points` of ``qzeros`` (required).
    ``k_full=False``: the rows are a K shard of an act-order layer (``g_idx``
    required, ``scales`` / ``qzeros`` of every group of the whole layer).
    Exact for fp16/bf16/fp32 scales: the reference the GPU results and the
    Marlin converters are compared with."""
    fn = "gptq_reference_dequant"
    bits = check_bits(fn, bits)
    if not isinstance(sym, (bool, np.bool_)):
        raise ArgumentTypeError(f"{fn}: sym must be a bool, got {type(sym).__name__}")
    if not isinstance(k_full, (bool, np.bool_)):
        raise ArgumentTypeError(f"{fn}: k_full must be a bool, got {type(k_full).__name__}")
    codes = _gptq_unpack(fn, qweight, bits)
    k, n = codes.shape
    s = check_scale_values(fn, "scales", scales)
    check_ndim(fn, "scales", s, 2)
    if k_full:
        rows_per_group = check_int_group_size(fn, group_size, k, "k")
        groups = k // rows_per_group
        check_shape(fn, "scales", s, (groups, n), "[k/group_size, n], [1, n] if group_size=-1")
    else:
        if g_idx is None:
            raise ArgumentError(f"{fn}: k_full=False (a K shard of an act-order layer) needs g_idx")
        rows_per_group = check_int_group_size(fn, group_size)
        if rows_per_group == -1:
            raise ArgumentError(f"{fn}: k_full=False needs a group_size > 0, got -1")
        groups = s.shape[0]
        check_shape(fn, "scales", s, (groups, n), "[groups of the whole layer, n]")
    group_of_row = (
        np.arange(k) // rows_per_group
        if g_idx is None
        else _check_g_idx(fn, g_idx, k, groups, rows_per_group, bool(k_full))
    )
    if qzeros is not None:
        qzeros = _check_qzeros(fn, qzeros, bits)
        check_shape(fn, "qzeros", qzeros, (groups, n * bits // 32), f"[k/group_size, n*{bits}/32]")
        zeros = gptq_zero_points(qzeros, bits).astype(np.float64)
        if sym and (zeros != (1 << (bits - 1))).any():
            raise ArgumentError(
                f"{fn}: qzeros must hold the zero point {1 << (bits - 1)} "
                f"(stored {(1 << (bits - 1)) - 1}) when sym=True"
            )
    elif sym:
        zeros = np.full((groups, n), float(1 << (bits - 1)))
    else:
        raise ArgumentError(f"{fn}: qzeros is required when sym=False")
    return (codes - zeros[group_of_row]) * s.astype(np.float64)[group_of_row]


def repack_gptq_to_marlin(qweight: np.ndarray, k: int, n: int) -> np.ndarray:
    """GPTQ ``qweight`` int32 ``[k/8, n]`` -> Marlin int32 ``[k/16, 2n]``.

    ``k``/``n`` are the logical weight shape, passed explicitly so a transposed
    or truncated tensor is rejected rather than repacked into garbage."""
    fn = "repack_gptq_to_marlin"
    k = check_size(fn, "k", k, TILE)
    n = check_size(fn, "n", n, CHUNK_COLUMNS)
    qweight = _check_qweight(fn, qweight)
    check_shape(fn, "qweight", qweight, (k // _PER_WORD, n), "[k/8, n]")
    packed = np.empty((k // TILE, 2 * n), dtype=np.int32)
    step = _word_rows_per_step(n)
    for r0 in range(0, k // _PER_WORD, step):
        r1 = min(k // _PER_WORD, r0 + step)
        codes = _unpack_word_rows(qweight[r0:r1])
        packed[r0 // 2 : r1 // 2] = pack_tile_rows(codes)
    return packed


def repack_gptq_to_marlin_bits(qweight: np.ndarray, k: int, n: int, bits: int) -> np.ndarray:
    """GPTQ ``qweight`` int32 ``[k*bits/32, n]`` -> the Marlin buffer of its
    codes: the 4-bit layout int32 ``[k/16, 2n]`` for ``bits=4`` (as
    :func:`repack_gptq_to_marlin`), the 8-bit layout int32 ``[k/16, 4n]``
    for ``bits=8`` (U8B128 codes, see :mod:`.marlin`)."""
    fn = "repack_gptq_to_marlin_bits"
    bits = check_bits(fn, bits)
    k = check_size(fn, "k", k, TILE)
    n = check_size(fn, "n", n, CHUNK_COLUMNS)
    qweight = _check_qweight(fn, qweight)
    per_word = 32 // bits
    check_shape(fn, "qweight", qweight, (k // per_word, n), f"[k*{bits}/32, n]")
    unpack = _UNPACK_WORD_ROWS[bits]
    return marlin_pack_rows(
        lambda r0, r1: unpack(qweight[r0 // per_word : r1 // per_word]), k, n, bits
    )


def repack_marlin_to_gptq(packed: np.ndarray, k: int, n: int) -> np.ndarray:
    """Inverse of :func:`repack_gptq_to_marlin`: Marlin int32 ``[k/16, 2n]``
    -> GPTQ int32 ``[k/8, n]`` (tests, and tools that export checkpoints)."""
    packed, k, n = check_marlin_packed("repack_marlin_to_gptq", packed, k, n)
    qweight = np.empty((k // _PER_WORD, n), dtype=np.int32)
    step = _word_rows_per_step(n)
    for r0 in range(0, k // _PER_WORD, step):
        r1 = min(k // _PER_WORD, r0 + step)
        codes = unpack_tile_rows(packed[r0 // 2 : r1 // 2])
        qweight[r0:r1] = _pack_word_rows(codes)
    return qweight


def repack_scales_to_marlin(scales: np.ndarray, k: int, n: int, group_size: int) -> np.ndarray:
    """GPTQ scales ``[k/group_size, n]`` (``[1, n]`` for ``group_size == -1``)
    -> fp16 in Marlin order, same shape. The shape is checked against the
    weight's ``k``/``n`` so scales of another layer cannot slip through."""
    fn = "repack_scales_to_marlin"
    k = check_size(fn, "k", k, TILE)
    n = check_size(fn, "n", n, CHUNK_COLUMNS)
    group_size = check_group_size(fn, group_size)
    if group_size != -1 and k % group_size:
        raise ArgumentError(f"{fn}: k={k} must be a multiple of group_size={group_size}")
    scales = check_scales(fn, "scales", scales)
    rows = 1 if group_size == -1 else k // group_size
    check_shape(fn, "scales", scales, (rows, n), "[k/group_size, n], [1, n] if group_size=-1")
    return marlin_permute_scales(scales, group_size)


def _check_permutation(fn: str, perm: object, k: int, why: str = "K = 8 * qweight.shape[0]") -> np.ndarray:
    """A gather by anything but a permutation would duplicate or drop input
    features, which no later check could detect."""
    perm = check_ndarray(fn, "perm", perm)
    check_integer_dtype(fn, "perm", perm)
    check_ndim(fn, "perm", perm, 1)
    check_shape(fn, "perm", perm, (k,), why)
    low, high = int(perm.min()), int(perm.max())
    if low < 0 or high >= k:
        raise ArgumentError(f"{fn}: perm values must be in 0..{k - 1}, got range {low}..{high}")
    seen = np.zeros(k, dtype=bool)
    seen[perm] = True
    if not seen.all():
        raise ArgumentError(f"{fn}: perm must be a permutation of range({k}) (repeated entries)")
    return perm.astype(np.intp, copy=False)


def permute_gptq_qweight_rows(qweight: np.ndarray, perm: np.ndarray, bits: int = 4) -> np.ndarray:
    """Reorder the K rows of a GPTQ ``qweight``: ``q_new[i] = q[perm[i]]``.

    For act-order checkpoints: with ``perm = argsort(g_idx)`` the rows of each
    quantisation group become contiguous, which is what a grouped Marlin
    weight needs (the activations are gathered with the same ``perm``).
    ``bits`` (4 or 8) is the code width of ``qweight``."""
    fn = "permute_gptq_qweight_rows"
    bits = check_bits(fn, bits)
    qweight = _check_qweight(fn, qweight)
    r, n = qweight.shape
    per_word = 32 // bits
    perm = _check_permutation(fn, perm, r * per_word, f"K = {per_word} * qweight.shape[0]")
    out = np.empty_like(qweight, dtype=np.int32)
    pack = _PACK_WORD_ROWS[bits]
    step = _word_rows_per_step(n, bits)
    for r0 in range(0, r, step):
        r1 = min(r, r0 + step)
        source = perm[r0 * per_word : r1 * per_word]
        # Read each new row's code straight from its source word: no full
        # unpacked copy of the matrix is needed for an arbitrary row gather.
        shifts = (bits * (source % per_word)).astype(np.int32)[:, None]
        words = qweight[source // per_word].astype(np.int32, copy=False)
        codes = ((words >> shifts) & ((1 << bits) - 1)).astype(np.uint8)
        out[r0:r1] = pack(codes)
    return out
