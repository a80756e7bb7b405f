"""Checkpoint tensors -> everything a general-GEMM weight holds, on the host.

Each ``prepare_*`` function reads one on-disk format (its own module documents
it), checks it, and returns a :class:`PreparedLinear`: the Marlin-packed codes,
the scales in Marlin order **in the activation dtype** (fp16, or ml_dtypes
bfloat16 for BF16 activations), the zero points, the act-order ``g_idx`` /
``perm``, the weight type of ``ferrum_marlin_mm``, and (unless
``keep_reference=False``) a function computing the float64 weight ``[K, N]``
in the original row order with the format's own reference decoder -- the
ground truth tests compare against, independent of any Marlin buffer.

Scales are computed here from the format's scale values (not taken from the
converters' fp16 output) so that BF16 scales are rounded once, from the
checkpoint's values, and never pass through fp16.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from typing import Callable

import numpy as np

from ferrum_ffi._abi import FERRUM_FP8_SCALE_FACTOR, WeightType
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
)
from .awq import awq_reference_dequant, awq_to_marlin
from .compressed_tensors import ct_reference_dequant, ct_to_marlin
from .fp8 import FP8_BLOCK, fp8_reference_dequant, prepare_fp8_weight_for_marlin
from .gptq import (
    _check_g_idx,
    gptq_pack,
    gptq_reference_dequant,
    gptq_unpack,
    gptq_zero_points,
    permute_gptq_qweight_rows,
    repack_gptq_to_marlin_bits,
)
from .marlin import marlin_pack_int4, marlin_pack_int8, marlin_pack_zero_points, marlin_permute_scales
from .rtn import check_activation_dtype, dequantize_rtn, quantize_rtn, scales_in_dtype

__all__ = [
    "PreparedLinear",
    "prepare_gptq",
    "prepare_awq",
    "prepare_compressed_tensors",
    "prepare_fp8",
    "prepare_float",
]

GEMM_K_MULTIPLE = 128
GEMM_N_MULTIPLE = 64
# K-shard layouts: group rows padded to whole sub-groups of these sizes (K_FULL
# set), or rows naming their groups (K_FULL clear, whose tile is 128 wide).
SHARD_LAYOUTS = ("padded", "row_groups")
SHARD_SUB_GROUPS = (128, 64, 32)
SHARD_ROW_GROUPS_N_MULTIPLE = 128


@dataclass(frozen=True)
class PreparedLinear:
    """A general-GEMM weight on the host, ready to upload.

    ``b`` int32 ``[k/16, 2n]`` (4-bit types) or ``[k/16, 4n]`` (8-bit);
    ``scales`` ``dtype`` ``[num_groups, n]`` in Marlin order (FE4M3FN: times
    256); ``zero_points`` int32 ``[num_groups, n/8]`` for U4 only; ``g_idx``
    (sorted) and ``perm`` int32 ``[k]`` for act-order only, with ``b`` and
    the scales in the permuted row order. ``k_full=False``: a K shard of an
    act-order layer (see :func:`prepare_gptq`): ``scales`` / ``zero_points``
    hold every group of the whole layer and ``g_idx`` names each row's.
    ``in_features``: the width of x (``k`` unless a K shard's rows were padded
    to a multiple of 128)."""

    b: np.ndarray
    scales: np.ndarray
    k: int
    n: int
    group_size: int
    b_type: WeightType
    dtype: np.dtype
    zero_points: np.ndarray | None = None
    g_idx: np.ndarray | None = None
    perm: np.ndarray | None = None
    reference: Callable[[], np.ndarray] | None = field(default=None, compare=False, repr=False)
    in_features: int | None = None
    k_full: bool = True

    @property
    def num_groups(self) -> int:
        if not self.k_full:
            return self.scales.shape[0]
        return 1 if self.group_size == -1 else self.k // self.group_size

    @property
    def x_features(self) -> int:
        """Columns of the activations: ``in_features``, or ``k``."""
        return self.k if self.in_features is None else self.in_features


# ---- shared pieces -------------------------------------------------------------------


def _gemm_shape(fn: str, k: int, n: int, k_name: str = "k", n_name: str = "n") -> None:
    """The general GEMM's granularity (the layout alone needs only 16 / 64)."""
    if k % GEMM_K_MULTIPLE:
        raise ArgumentError(f"{fn}: {k_name}={k} must be a multiple of {GEMM_K_MULTIPLE} for the general GEMM")
    if n % GEMM_N_MULTIPLE:
        raise ArgumentError(f"{fn}: {n_name}={n} must be a multiple of {GEMM_N_MULTIPLE} for the general GEMM")


def _group_size_from_scales(fn: str, group_size: object, groups: int, k: int, what: str) -> int:
    """``group_size`` as given, or inferred from the number of scale rows."""
    if group_size is None:
        if groups == 1:
            return -1
        if k % groups:
            raise ArgumentError(f"{fn}: {what}={groups} scale groups do not divide k={k}")
        group_size = k // groups
    check_int_group_size(fn, group_size, k)
    expected = 1 if group_size == -1 else k // group_size
    if groups != expected:
        raise ArgumentError(f"{fn}: {what}={groups} must be {expected} for group_size={group_size} and k={k}")
    return int(group_size)


def _marlin_scales(fn: str, values: np.ndarray, group_size: int, dtype: np.dtype, factor: float = 1.0) -> np.ndarray:
    """Scale values ``[G, N]`` -> ``dtype`` (one rounding, times ``factor``)
    in Marlin order."""
    scaled = np.asarray(values, dtype=np.float64) * factor
    name = "scales" if factor == 1.0 else f"scales x {factor:g}"
    return marlin_permute_scales(np.ascontiguousarray(scales_in_dtype(fn, name, scaled, dtype)), group_size)


def _check_bool(fn: str, name: str, value: object, optional: bool = False) -> None:
    if optional and value is None:
        return
    if not isinstance(value, (bool, np.bool_)):
        allowed = "a bool or None" if optional else "a bool"
        raise ArgumentTypeError(f"{fn}: {name} must be {allowed}, got {type(value).__name__}")


def _check_packed_words(fn: str, name: str, words: object) -> np.ndarray:
    words = check_ndarray(fn, name, words)
    check_integer_dtype(fn, name, words, itemsize=4)
    check_ndim(fn, name, words, 2)
    check_size(fn, f"{name}.shape[0]", words.shape[0])
    check_size(fn, f"{name}.shape[1]", words.shape[1])
    return words


# ---- GPTQ -------------------------------------------------------------------------------


def _act_order(fn: str, g_idx: object, desc_act: object, k: int, groups: int, group_size: int) -> np.ndarray | None:
    """The row permutation of an act-order layer (stable argsort of g_idx), or
    None when the layer needs none (no g_idx, or g_idx == k // group_size)."""
    if g_idx is None:
        if desc_act:
            raise ArgumentError(f"{fn}: desc_act=True needs g_idx")
        return None
    g_idx = check_ndarray(fn, "g_idx", g_idx)
    check_integer_dtype(fn, "g_idx", g_idx)
    check_ndim(fn, "g_idx", g_idx, 1)
    check_shape(fn, "g_idx", g_idx, (k,), "one group index per row of K")
    low, high = int(g_idx.min()), int(g_idx.max())
    if low < 0 or high >= groups:
        raise ArgumentError(f"{fn}: g_idx values must be in 0..{groups - 1}, got range {low}..{high}")
    rows = k if group_size == -1 else group_size
    plain = np.arange(k) // rows
    if np.array_equal(g_idx, plain):
        return None  # already in order: no gather needed, whatever desc_act says
    if desc_act is not None and not desc_act:
        raise ArgumentError(f"{fn}: g_idx is not k // group_size (an act-order layer) but desc_act=False")
    perm = np.argsort(g_idx, kind="stable")
    sorted_groups = g_idx[perm]
    if not np.array_equal(sorted_groups, plain):
        counts = np.bincount(g_idx.astype(np.intp), minlength=groups)
        bad = int(np.flatnonzero(counts != rows)[0])
        raise ArgumentError(
            f"{fn}: g_idx must give every group exactly group_size={rows} rows (the kernel reads one "
            f"scale row per {rows} permuted rows: sorted g_idx == arange(k) // group_size); "
            f"group {bad} has {int(counts[bad])} (a K shard of an act-order layer: pass k_full=False "
            f"and the layer's group_size)"
        )
    return perm


def prepare_gptq(
    qweight: np.ndarray,
    scales: np.ndarray,
    qzeros: np.ndarray | None = None,
    g_idx: np.ndarray | None = None,
    *,
    bits: int = 4,
    sym: bool = True,
    desc_act: bool | None = None,
    group_size: int | None = None,
    k_full: bool = True,
    shard_layout: str | None = None,
    dtype: object = np.float16,
    keep_reference: bool = True,
    fn: str = "prepare_gptq",
) -> PreparedLinear:
    """An AutoGPTQ layer (``qweight [K*bits/32, N]``, ``scales [G, N]``,
    ``qzeros [G, N*bits/32]`` storing zero - 1, optional ``g_idx [K]``).

    ``sym=True``: U4B8 / U8B128 (``qzeros``, if given, must hold the zero
    point 8 / 128). ``sym=False``: 4-bit only, U4 with the zero points
    ``stored + 1``. Act-order (``g_idx`` not ``k // group_size``): rows are
    permuted by ``perm = argsort(g_idx)`` (stable) so groups are contiguous;
    every group must then hold exactly ``group_size`` rows. ``desc_act=None``
    infers act-order from ``g_idx``. ``group_size=None`` infers it from the
    scale rows (1 row: channelwise).

    ``k_full=False``: the rows are a K shard (a tensor-parallel row shard) of
    an act-order layer, vLLM's ``is_k_full=False``: ``qweight`` holds the
    shard's rows (any multiple of 32/bits), ``g_idx`` their groups, ``scales``
    / ``qzeros`` every group of the whole layer, and ``group_size`` must be
    given. A shard holds each group only in part; its rows are sorted by
    group and laid out by ``shard_layout`` (None: ``"row_groups"`` when ``n``
    is a multiple of 128, else ``"padded"``):

    * ``"row_groups"``: vLLM's layout -- the scales stay whole and the kernels
      read each row's group from the sorted ``g_idx`` (``K_FULL`` clear,
      dequantising; ``n`` a multiple of 128); no rows added but the K padding
      below;
    * ``"padded"``: each group's rows are padded with zero-valued rows (codes
      equal to the zero point) to whole sub-groups of 128, 64 or 32 rows
      (whichever pads least), so every kernel serves it as a plain act-order
      layer (``K_FULL`` set); it holds more rows (g128: +24 % at TP 2, 2x at
      TP 8).

    H200, Llama-70B/8B down-projection shards (``scripts/bench_kshard.py``):
    row groups take 0.82-1.13x the padded layout's time at m <= 16 (slower
    only at m = 1 on TP 2) and 0.87-1.18x at m >= 64.

    Either way K is padded to a multiple of 128 with zero-valued rows that
    ``perm`` maps to column 0 of x: ``k`` is the padded row count,
    ``in_features`` the shard's."""
    bits = check_bits(fn, bits)
    _check_bool(fn, "sym", sym)
    _check_bool(fn, "desc_act", desc_act, optional=True)
    _check_bool(fn, "k_full", k_full)
    if shard_layout is not None and shard_layout not in SHARD_LAYOUTS:
        raise ArgumentError(f"{fn}: shard_layout={shard_layout!r} must be one of {', '.join(map(repr, SHARD_LAYOUTS))}")
    if k_full and shard_layout is not None:
        raise ArgumentError(f"{fn}: shard_layout={shard_layout!r} applies to a K shard only (k_full=False)")
    dtype = check_activation_dtype(fn, dtype)
    qweight = _check_packed_words(fn, "qweight", qweight)
    k, n = qweight.shape[0] * 32 // bits, qweight.shape[1]
    if shard_layout is None:
        shard_layout = "row_groups" if n % SHARD_ROW_GROUPS_N_MULTIPLE == 0 else "padded"
    n_multiple = SHARD_ROW_GROUPS_N_MULTIPLE if shard_layout == "row_groups" else GEMM_N_MULTIPLE
    if k_full:
        _gemm_shape(fn, k, n, f"k = qweight.shape[0]*{32 // bits}", "n = qweight.shape[1]")
    elif n % n_multiple:
        raise ArgumentError(f"{fn}: n = qweight.shape[1]={n} must be a multiple of {n_multiple} for a K shard "
                            f"in the {shard_layout!r} layout")
    values = check_scale_values(fn, "scales", scales)
    check_ndim(fn, "scales", values, 2)
    if values.shape[1] != n:
        raise ArgumentError(f"{fn}: scales must have shape [G, n] with n={n}, got {values.shape}")
    if k_full:
        group_size = _group_size_from_scales(fn, group_size, values.shape[0], k, "scales.shape[0]")
    else:
        if g_idx is None or group_size is None or desc_act is False:
            raise ArgumentError(
                f"{fn}: k_full=False (a K shard of an act-order layer) needs g_idx and group_size, and "
                f"desc_act True or None (got g_idx {'given' if g_idx is not None else 'None'}, "
                f"group_size={group_size}, desc_act={desc_act})"
            )
        group_size = check_int_group_size(fn, group_size)
        if group_size == -1:
            raise ArgumentError(f"{fn}: k_full=False needs group_size > 0, got -1")
    groups = values.shape[0]
    zero_points = None
    if qzeros is not None:
        qzeros = _check_packed_words(fn, "qzeros", qzeros)
        check_shape(fn, "qzeros", qzeros, (groups, n * bits // 32), f"[G, n*{bits}/32]")
        zeros = gptq_zero_points(qzeros, bits)
    if sym:
        b_type = WeightType.U4B8 if bits == 4 else WeightType.U8B128
        if qzeros is not None and (zeros != 1 << (bits - 1)).any():
            raise ArgumentError(
                f"{fn}: qzeros hold zero points other than {1 << (bits - 1)} (stored {(1 << (bits - 1)) - 1}); "
                "pass sym=False for an asymmetric layer"
            )
    else:
        if bits == 8:
            raise ArgumentError(
                f"{fn}: 8-bit asymmetric GPTQ is not supported (the general GEMM has no 8-bit weight type "
                "with zero points); quantise symmetric (sym=True) instead"
            )
        if qzeros is None:
            raise ArgumentError(f"{fn}: qzeros is required when sym=False")
        b_type = WeightType.U4
        zero_points = marlin_pack_zero_points(zeros, 4)
    if not k_full:
        shard_zeros = zeros if qzeros is not None else np.full((groups, n), 1 << (bits - 1))
        return _prepare_gptq_shard(fn, qweight, scales, values, shard_zeros, qzeros, g_idx, bits, bool(sym),
                                   b_type, group_size, dtype, keep_reference, shard_layout)
    perm = _act_order(fn, g_idx, desc_act, k, groups, group_size)
    codes = qweight if perm is None else permute_gptq_qweight_rows(qweight, perm, bits)
    packed = repack_gptq_to_marlin_bits(codes, k, n, bits)
    reference = None
    if keep_reference:
        reference = partial(gptq_reference_dequant, qweight, scales, qzeros, g_idx, bits, bool(sym), group_size)
    return PreparedLinear(
        b=packed,
        scales=_marlin_scales(fn, values, group_size, dtype),
        k=k, n=n, group_size=group_size, b_type=b_type, dtype=dtype,
        zero_points=zero_points,
        g_idx=None if perm is None else np.ascontiguousarray(g_idx[perm], dtype=np.int32),
        perm=None if perm is None else perm.astype(np.int32),
        reference=reference,
    )


def _prepare_gptq_shard(fn: str, qweight: np.ndarray, scales: np.ndarray, values: np.ndarray, zeros: np.ndarray,
                        qzeros: np.ndarray | None, g_idx: object, bits: int, sym: bool, b_type: WeightType,
                        group_size: int, dtype: np.dtype, keep_reference: bool, layout: str) -> PreparedLinear:
    """prepare_gptq's K-shard path (``k_full=False``, see there): ``values``
    the checked scales, ``zeros`` the zero point of every group and column."""
    rows = qweight.shape[0] * 32 // bits
    group_of_row = _check_g_idx(fn, g_idx, rows, values.shape[0], group_size, k_full=False)
    order = np.argsort(group_of_row, kind="stable")
    reference = None
    if keep_reference:
        reference = partial(gptq_reference_dequant, qweight, scales, qzeros, g_idx, bits, sym, group_size, False)
    if layout == "padded":
        return _prepare_gptq_shard_padded(fn, qweight, values, zeros, group_of_row, order, bits, b_type, dtype,
                                          reference)
    return _prepare_gptq_shard_row_groups(fn, qweight, values, zeros, group_of_row, order, bits, b_type,
                                          group_size, dtype, reference)


def _prepare_gptq_shard_row_groups(fn: str, qweight: np.ndarray, values: np.ndarray, zeros: np.ndarray,
                                   group_of_row: np.ndarray, order: np.ndarray, bits: int, b_type: WeightType,
                                   group_size: int, dtype: np.dtype,
                                   reference: Callable[[], np.ndarray] | None) -> PreparedLinear:
    """The row-group K-shard layout (``shard_layout="row_groups"``): K_FULL clear."""
    rows, n = qweight.shape[0] * 32 // bits, qweight.shape[1]
    sorted_groups = group_of_row[order]
    # K up to the tile depth: zero-valued rows (codes equal to the zero point)
    # of the last group, gathering column 0 of x (they add nothing).
    k = rows + (-rows) % GEMM_K_MULTIPLE
    tail = np.full(k - rows, sorted_groups[-1], dtype=np.intp)
    codes = np.concatenate((gptq_unpack(qweight, bits)[order], zeros[tail]))
    packed = repack_gptq_to_marlin_bits(gptq_pack(codes, bits), k, n, bits)
    return PreparedLinear(
        b=packed,
        scales=_marlin_scales(fn, values, group_size, dtype),
        k=k, n=n, group_size=group_size, b_type=b_type, dtype=dtype,
        zero_points=marlin_pack_zero_points(zeros, 4) if b_type is WeightType.U4 else None,
        g_idx=np.concatenate((sorted_groups, tail)).astype(np.int32),
        perm=np.concatenate((order, np.zeros(k - rows, dtype=np.intp))).astype(np.int32),
        reference=reference,
        in_features=rows,
        k_full=False,
    )


def _shard_rows(counts: np.ndarray, order: np.ndarray, groups_sorted: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    """A K shard's padded row layout: each group's rows (in ``order``, sorted
    by group) padded to whole sub-groups, the total to a multiple of 128.
    Returns the source row of every padded row (-1: padding), the group of
    every sub-group, and the sub-group size (the one that pads least)."""
    def padded_total(sub: int) -> int:
        total = int((-(-counts // sub) * sub).sum())
        return total + (-total) % GEMM_K_MULTIPLE
    sub = min(SHARD_SUB_GROUPS, key=padded_total)  # ties: the larger size (listed first)
    total = padded_total(sub)
    runs = -(-counts // sub) * sub
    run_start = np.concatenate(([0], np.cumsum(runs)[:-1]))
    first_sorted = np.concatenate(([0], np.cumsum(counts)[:-1]))
    position = run_start[groups_sorted] + np.arange(order.size) - first_sorted[groups_sorted]
    source = np.full(total, -1, dtype=np.intp)
    source[position] = order
    group_of_sub = np.repeat(np.arange(counts.size), runs // sub)
    tail = total // sub - group_of_sub.size  # sub-groups of the K padding: any group's scale
    group_of_sub = np.concatenate((group_of_sub, np.zeros(tail, dtype=group_of_sub.dtype)))
    return source, group_of_sub, sub


def _prepare_gptq_shard_padded(fn: str, qweight: np.ndarray, values: np.ndarray, zeros: np.ndarray,
                               group_of_row: np.ndarray, order: np.ndarray, bits: int, b_type: WeightType,
                               dtype: np.dtype, reference: Callable[[], np.ndarray] | None) -> PreparedLinear:
    """The padded K-shard layout (``shard_layout="padded"``): K_FULL set."""
    k, n = qweight.shape[0] * 32 // bits, qweight.shape[1]
    counts = np.bincount(group_of_row, minlength=values.shape[0])
    source, group_of_sub, sub = _shard_rows(counts, order, group_of_row[order])
    total = source.size
    live = source >= 0
    codes = gptq_unpack(qweight, bits)
    rows = np.empty((total, n), dtype=codes.dtype)
    rows[live] = codes[source[live]]
    rows[~live] = zeros[group_of_sub[np.flatnonzero(~live) // sub]]  # zero-valued: the zero point
    packed = repack_gptq_to_marlin_bits(gptq_pack(rows, bits), total, n, bits)
    return PreparedLinear(
        b=packed,
        scales=_marlin_scales(fn, values[group_of_sub], sub, dtype),
        k=total, n=n, group_size=sub, b_type=b_type, dtype=dtype,
        zero_points=marlin_pack_zero_points(zeros[group_of_sub], 4) if b_type is WeightType.U4 else None,
        g_idx=(np.arange(total) // sub).astype(np.int32),
        perm=np.where(live, source, 0).astype(np.int32),
        reference=reference,
        in_features=k,
    )


# ---- AWQ ---------------------------------------------------------------------------------


def prepare_awq(
    qweight: np.ndarray,
    scales: np.ndarray,
    qzeros: np.ndarray,
    *,
    group_size: int | None = None,
    dtype: object = np.float16,
    keep_reference: bool = True,
    fn: str = "prepare_awq",
) -> PreparedLinear:
    """An AutoAWQ GEMM layer (``qweight [K, N/8]``, ``scales [G, N]``,
    ``qzeros [G, N/8]``, zero points as stored) -> U4 with zero points."""
    dtype = check_activation_dtype(fn, dtype)
    qweight = _check_packed_words(fn, "qweight", qweight)
    k, n = qweight.shape[0], 8 * qweight.shape[1]
    _gemm_shape(fn, k, n, "k = qweight.shape[0]", "n = 8*qweight.shape[1]")
    values = check_scale_values(fn, "scales", scales)
    check_ndim(fn, "scales", values, 2)
    group_size = _group_size_from_scales(fn, group_size, values.shape[0], k, "scales.shape[0]")
    packed, _, zero_points = awq_to_marlin(qweight, scales, qzeros, group_size)
    reference = partial(awq_reference_dequant, qweight, scales, qzeros, group_size) if keep_reference else None
    return PreparedLinear(
        b=packed,
        scales=_marlin_scales(fn, values, group_size, dtype),
        k=k, n=n, group_size=group_size, b_type=WeightType.U4, dtype=dtype,
        zero_points=zero_points, reference=reference,
    )


# ---- compressed-tensors ------------------------------------------------------------------


def prepare_compressed_tensors(
    weight_packed: np.ndarray,
    weight_scale: np.ndarray,
    weight_zero_point: np.ndarray | None = None,
    *,
    bits: int = 4,
    group_size: int | None = None,
    weight_shape: object = None,
    dtype: object = np.float16,
    keep_reference: bool = True,
    fn: str = "prepare_compressed_tensors",
) -> PreparedLinear:
    """A pack-quantized layer (``weight_packed [N, K*bits/32]``,
    ``weight_scale [N, G]``, optional ``weight_zero_point``) -> U4B8 / U8B128
    when symmetric, U4 with zero points when asymmetric 4-bit."""
    bits = check_bits(fn, bits)
    dtype = check_activation_dtype(fn, dtype)
    if weight_zero_point is not None and bits == 8:
        raise ArgumentError(
            f"{fn}: asymmetric INT8 (weight_zero_point with bits=8) is not supported (the general GEMM "
            "has no 8-bit weight type with zero points)"
        )
    packed, _, zero_points = ct_to_marlin(
        weight_packed, weight_scale, weight_zero_point, bits, group_size, weight_shape
    )
    k, n = packed.shape[0] * 16, packed.shape[1] * 2 // bits
    _gemm_shape(fn, k, n, "K_in", "N_out")
    values = check_scale_values(fn, "weight_scale", weight_scale).T  # [G, N]
    group_size = _group_size_from_scales(fn, group_size, values.shape[0], k, "weight_scale.shape[1]")
    if zero_points is None:
        b_type = WeightType.U4B8 if bits == 4 else WeightType.U8B128
    else:
        b_type = WeightType.U4
    reference = None
    if keep_reference:
        reference = partial(
            ct_reference_dequant, weight_packed, weight_scale, weight_zero_point, bits, group_size, weight_shape
        )
    return PreparedLinear(
        b=packed,
        scales=_marlin_scales(fn, values, group_size, dtype),
        k=k, n=n, group_size=group_size, b_type=b_type, dtype=dtype,
        zero_points=zero_points, reference=reference,
    )


# ---- FP8 ---------------------------------------------------------------------------------


def _fp8_scale_values(fn: str, scale: object) -> np.ndarray:
    if isinstance(scale, (float, int, np.floating, np.integer)) and not isinstance(scale, (bool, np.bool_)):
        return np.asarray(float(scale), dtype=np.float64)
    return check_scale_values(fn, "scale", scale).astype(np.float64)


def _is_block_scale(values: np.ndarray, n: int, k: int) -> bool:
    """2-D ``[ceil(n/128), ceil(k/128)]`` that is neither one value (per-tensor)
    nor ``[n, 1]`` (per-channel)."""
    blocks = (-(-n // FP8_BLOCK[0]), -(-k // FP8_BLOCK[1]))
    return values.ndim == 2 and values.size > 1 and values.shape == blocks and values.shape != (n, 1)


def prepare_fp8(
    weight: np.ndarray,
    scale: object,
    *,
    block: object = "auto",
    dtype: object = np.float16,
    keep_reference: bool = True,
    fn: str = "prepare_fp8",
) -> PreparedLinear:
    """An FP8-E4M3 layer (``weight [N, K]`` float8_e4m3fn or raw uint8 bytes)
    -> FE4M3FN. ``scale``: one value (per-tensor; becomes channelwise),
    ``[N]`` / ``[N, 1]`` (per-channel; group -1) or ``[ceil(N/128),
    ceil(K/128)]`` 128x128 block scales (group 128). ``block="auto"`` tells
    them apart by shape; None or (128, 128) says which. The scales are
    multiplied by FERRUM_FP8_SCALE_FACTOR (256) for fp16 and bf16 alike."""
    dtype = check_activation_dtype(fn, dtype)
    weight = check_ndarray(fn, "weight", weight)
    check_ndim(fn, "weight", weight, 2)
    n, k = weight.shape
    _gemm_shape(fn, k, n, "k = weight.shape[1]", "n = weight.shape[0]")
    values = _fp8_scale_values(fn, scale)
    if isinstance(block, str):
        if block != "auto":
            raise ArgumentError(f"{fn}: block must be 'auto', None or (128, 128), got {block!r}")
        block = FP8_BLOCK if _is_block_scale(values, n, k) else None
    packed, _ = prepare_fp8_weight_for_marlin(weight, scale, block)  # checks shapes and NaN bytes
    if block is None:
        group_size = -1
        per_channel = np.broadcast_to(values.reshape(-1), (n,)) if values.size == 1 else values.reshape(n)
        grouped = per_channel[None, :]
    else:
        group_size = FP8_BLOCK[1]
        blocks = values.reshape(-(-n // FP8_BLOCK[0]), -(-k // FP8_BLOCK[1]))
        grouped = blocks[np.arange(n) // FP8_BLOCK[0], :].T  # [K/128, N]
    reference = partial(fp8_reference_dequant, weight, scale, block) if keep_reference else None
    return PreparedLinear(
        b=packed,
        scales=_marlin_scales(fn, grouped, group_size, dtype, factor=FERRUM_FP8_SCALE_FACTOR),
        k=k, n=n, group_size=group_size, b_type=WeightType.FE4M3FN, dtype=dtype,
        reference=reference,
    )


# ---- float (round-to-nearest) ------------------------------------------------------------


def prepare_float(
    w: np.ndarray,
    *,
    bits: int = 4,
    group_size: int = 128,
    sym: bool = True,
    dtype: object = np.float16,
    keep_reference: bool = True,
    fn: str = "prepare_float",
) -> PreparedLinear:
    """Float ``w [K, N]`` quantised round-to-nearest (:mod:`.rtn`): 4-bit
    symmetric -> U4B8, 4-bit asymmetric -> U4 with zero points, 8-bit
    symmetric -> U8B128 (8-bit asymmetric has no weight type)."""
    bits = check_bits(fn, bits)
    _check_bool(fn, "sym", sym)
    dtype = check_activation_dtype(fn, dtype)
    if bits == 8 and not sym:
        raise ArgumentError(f"{fn}: 8-bit asymmetric is not supported (no 8-bit weight type with zero points)")
    w = check_ndarray(fn, "w", w)
    check_ndim(fn, "w", w, 2)
    k, n = w.shape
    _gemm_shape(fn, k, n, "k = w.shape[0]", "n = w.shape[1]")
    codes, scales, zeros = quantize_rtn(w, bits, group_size, bool(sym), dtype)
    packed = marlin_pack_int4(codes) if bits == 4 else marlin_pack_int8(codes)
    if sym:
        b_type = WeightType.U4B8 if bits == 4 else WeightType.U8B128
    else:
        b_type = WeightType.U4
    reference = partial(dequantize_rtn, codes, scales, zeros, group_size, bits) if keep_reference else None
    return PreparedLinear(
        b=packed,
        scales=marlin_permute_scales(scales, group_size),
        k=k, n=n, group_size=int(group_size), b_type=b_type, dtype=dtype,
        zero_points=None if zeros is None else marlin_pack_zero_points(zeros, 4),
        reference=reference,
    )

