"""Host preparation of general-GEMM weights from every on-disk format.

The check that matters: decoding the Marlin buffers (the formats' unpack
functions and the scale unpermutation, then the weight type's formula, then
undoing the act-order row permutation) reproduces the float64 weight the
format's own reference decoder computes from the on-disk tensors."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ferrum_ffi._abi import FERRUM_FP8_SCALE_FACTOR, WeightType
from ferrum_ffi.formats import (
    e4m3_decode_bits,
    marlin_permute_scales,
    marlin_unpack_int4,
    marlin_unpack_int8,
    marlin_unpack_zero_points,
    marlin_unpermute_scales,
    prepare_awq,
    prepare_compressed_tensors,
    prepare_float,
    prepare_fp8,
    prepare_gptq,
    quantize_int4_symmetric,
    quantize_rtn,
)
from ferrum_ffi.formats import awq_to_marlin, ct_to_marlin, prepare_fp8_weight_for_marlin
from ferrum_ffi.formats._common import bfloat16_bits_to_float32
from ferrum_ffi.status import ArgumentError, ArgumentTypeError

from . import quant_layers as ql

BF16 = ql.bfloat16()
DTYPES = [np.dtype(np.float16), BF16]
K, N = 256, 128


def as_float64(values: np.ndarray) -> np.ndarray:
    if values.dtype == BF16:
        return bfloat16_bits_to_float32(values.view(np.uint16)).astype(np.float64)
    return values.astype(np.float64)


def decode_marlin(p) -> np.ndarray:
    """float64 W[k, n] in the ORIGINAL row order, from the Marlin buffers only."""
    w = decode_marlin_rows(p)
    if p.perm is not None:
        assert np.array_equal(p.g_idx, np.arange(p.k) // p.group_size), "the stored g_idx is the sorted one"
        original = np.empty_like(w)
        original[p.perm] = w  # row i of the packed weight is original row perm[i]
        w = original
    return w


def decode_marlin_rows(p) -> np.ndarray:
    """float64 W[k, n] in the packed (permuted) row order, from the Marlin buffers only."""
    bits = p.b_type.bits
    codes = (marlin_unpack_int4 if bits == 4 else marlin_unpack_int8)(p.b, p.k, p.n)
    scales = as_float64(marlin_unpermute_scales(p.scales, p.group_size))
    group = np.arange(p.k) // (p.k if p.group_size == -1 else p.group_size)
    if not p.k_full:
        group = p.g_idx  # a K shard: each row names its group
    if p.b_type is WeightType.FE4M3FN:
        w = e4m3_decode_bits(codes).astype(np.float64) * scales[group] / FERRUM_FP8_SCALE_FACTOR
    else:
        if p.b_type is WeightType.U4:
            zero = marlin_unpack_zero_points(p.zero_points, p.n, 4).astype(np.float64)[group]
        else:
            zero = {WeightType.U4B8: 8.0, WeightType.U8B128: 128.0}[p.b_type]
        w = (codes.astype(np.float64) - zero) * scales[group]
    return w


def rounding_tolerance(dtype: np.dtype, source_dtype: np.dtype) -> float:
    """Relative error of re-rounding a scale from the checkpoint's dtype into the activation dtype."""
    if np.dtype(source_dtype) == dtype:
        return 0.0
    return 2.0**-8 if dtype == BF16 else 2.0**-11


def assert_decodes_to_reference(p, source_dtype) -> None:
    reference = p.reference()
    got = decode_marlin(p)
    assert got.shape == reference.shape == (p.k, p.n)
    tol = rounding_tolerance(p.dtype, source_dtype)
    if tol == 0.0:
        np.testing.assert_array_equal(got, reference)
    else:
        np.testing.assert_allclose(got, reference, rtol=tol, atol=0)


def check_buffers(p, *, zero_points: bool, act_order: bool = False) -> None:
    bits = p.b_type.bits
    assert p.b.dtype == np.int32 and p.b.shape == (p.k // 16, bits // 2 * p.n)
    assert p.scales.dtype == p.dtype and p.scales.shape == (p.num_groups, p.n)
    assert (p.zero_points is not None) == zero_points
    if zero_points:
        assert p.zero_points.dtype == np.int32 and p.zero_points.shape == (p.num_groups, p.n // 8)
    assert (p.perm is not None) == (p.g_idx is not None) == act_order
    if act_order:
        assert p.perm.dtype == p.g_idx.dtype == np.int32 and p.perm.shape == p.g_idx.shape == (p.k,)
        assert sorted(p.perm.tolist()) == list(range(p.k))


# ---- GPTQ -------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=["f16", "bf16"])
@pytest.mark.parametrize("group_size", [-1, 32, 64, 128])
@pytest.mark.parametrize("bits", [4, 8])
def test_gptq_symmetric(bits, group_size, dtype):
    t = ql.gptq_layer(np.random.default_rng(bits + group_size), K, N, bits=bits, group_size=group_size)
    p = prepare_gptq(t["qweight"], t["scales"], t["qzeros"], t["g_idx"], bits=bits, dtype=dtype)
    assert p.b_type is (WeightType.U4B8 if bits == 4 else WeightType.U8B128)
    assert (p.k, p.n, p.group_size, p.dtype) == (K, N, group_size, dtype)
    check_buffers(p, zero_points=False)
    assert_decodes_to_reference(p, np.float16)


@pytest.mark.parametrize("dtype", DTYPES, ids=["f16", "bf16"])
@pytest.mark.parametrize("group_size", [-1, 32, 128])
def test_gptq_asymmetric_4_bit_is_u4_with_zero_points(group_size, dtype):
    t = ql.gptq_layer(np.random.default_rng(5), K, N, group_size=group_size, sym=False)
    p = prepare_gptq(t["qweight"], t["scales"], t["qzeros"], bits=4, sym=False, dtype=dtype)
    assert p.b_type is WeightType.U4
    check_buffers(p, zero_points=True)
    assert_decodes_to_reference(p, np.float16)


@pytest.mark.parametrize("bits, sym", [(4, True), (8, True), (4, False)])
@pytest.mark.parametrize("group_size", [32, 64, 128])
def test_gptq_act_order_is_permuted_to_contiguous_groups(bits, sym, group_size):
    t = ql.gptq_layer(np.random.default_rng(group_size), K, N, bits=bits, group_size=group_size, sym=sym, act_order=True)
    p = prepare_gptq(t["qweight"], t["scales"], t["qzeros"], t["g_idx"], bits=bits, sym=sym)
    check_buffers(p, zero_points=not sym, act_order=True)
    assert np.array_equal(p.perm, np.argsort(t["g_idx"], kind="stable"))
    assert np.array_equal(p.g_idx, t["g_idx"][p.perm])
    assert np.array_equal(p.g_idx, np.arange(K) // group_size)
    assert_decodes_to_reference(p, np.float16)


def test_gptq_in_order_g_idx_needs_no_gather():
    t = ql.gptq_layer(np.random.default_rng(1), K, N, group_size=64)
    for desc_act in (None, True, False):
        p = prepare_gptq(t["qweight"], t["scales"], t["qzeros"], t["g_idx"], desc_act=desc_act)
        assert p.perm is None and p.g_idx is None


def test_gptq_act_order_groups_of_unequal_size_are_rejected():
    t = ql.gptq_layer(np.random.default_rng(2), K, N, group_size=64, act_order=True)
    g_idx = t["g_idx"].copy()
    g_idx[np.flatnonzero(g_idx == 0)[0]] = 1  # group 0 loses a row to group 1
    with pytest.raises(ArgumentError, match=r"g_idx must give every group exactly group_size=64 rows .* group 0 has 63"):
        prepare_gptq(t["qweight"], t["scales"], t["qzeros"], g_idx)


def gptq_k_shard(rng, *, shards, shard, bits=4, sym=True, group_size=128, k=1536):
    """Rows [shard * k/shards, (shard + 1) * k/shards) of an act-order layer: the
    shard's qweight rows and g_idx, with the whole layer's scales and qzeros."""
    t = ql.gptq_layer(rng, k, N, bits=bits, group_size=group_size, sym=sym, act_order=True)
    rows, per_word = k // shards, 32 // bits
    return dict(qweight=t["qweight"][shard * rows // per_word:(shard + 1) * rows // per_word],
                scales=t["scales"], qzeros=t["qzeros"], g_idx=t["g_idx"][shard * rows:(shard + 1) * rows])


@pytest.mark.parametrize("dtype", DTYPES, ids=["f16", "bf16"])
@pytest.mark.parametrize("bits, sym", [(4, True), (8, True), (4, False)])
@pytest.mark.parametrize("shards, shard, group_size", [(2, 1, 128), (4, 0, 128), (8, 5, 64), (3, 2, 32)])
@pytest.mark.parametrize("layout", ["padded", "row_groups"])
def test_gptq_k_shard_of_an_act_order_layer(bits, sym, shards, shard, group_size, layout, dtype):
    rng = np.random.default_rng(bits * 100 + shards * 10 + shard)
    t = gptq_k_shard(rng, shards=shards, shard=shard, bits=bits, sym=sym, group_size=group_size)
    rows = 1536 // shards
    p = prepare_gptq(t["qweight"], t["scales"], t["qzeros"], t["g_idx"], bits=bits, sym=sym,
                     group_size=group_size, k_full=False, shard_layout=layout, dtype=dtype)
    assert p.in_features == p.x_features == rows
    assert p.g_idx.shape == (p.k,) and np.all(np.diff(p.g_idx) >= 0)  # sorted: the kernel's row order
    if layout == "padded":  # whole sub-groups: K_FULL set, one scale row per sub-group
        assert p.k_full and p.k % 128 == 0 and p.k >= rows and p.group_size in (32, 64, 128)
        assert np.array_equal(p.g_idx, np.arange(p.k) // p.group_size)
    else:  # vLLM's: the whole layer's scales, each row naming its group
        assert not p.k_full and p.k == rows + (-rows) % 128 and p.group_size == group_size
        assert p.num_groups == t["scales"].shape[0] and p.scales.shape == (p.num_groups, N)
    assert p.perm.dtype == np.int32 and p.perm.shape == (p.k,) and 0 <= p.perm.min() and p.perm.max() < rows
    assert np.array_equal(np.unique(p.perm), np.arange(rows))  # every row of x is used
    w = decode_marlin_rows(p)  # packed order, padded rows included
    reference = p.reference()  # the shard's own rows, in their order
    assert reference.shape == (rows, N)
    x = rng.standard_normal((3, rows))
    got, want = x[:, p.perm] @ w, x @ reference
    bound = rounding_tolerance(p.dtype, np.float16) * (np.abs(x) @ np.abs(reference)) + 1e-9
    assert np.all(np.abs(got - want) <= bound)


def test_gptq_k_shard_rules():
    t = gptq_k_shard(np.random.default_rng(5), shards=2, shard=0)
    args = (t["qweight"], t["scales"], t["qzeros"])
    with pytest.raises(ArgumentError, match=r"k_full=False .* needs g_idx and group_size"):
        prepare_gptq(*args, t["g_idx"], k_full=False)
    with pytest.raises(ArgumentError, match=r"k_full=False .* needs g_idx and group_size"):
        prepare_gptq(*args, None, group_size=128, k_full=False)
    with pytest.raises(ArgumentError, match=r"k_full=False .* desc_act True or None"):
        prepare_gptq(*args, t["g_idx"], group_size=128, desc_act=False, k_full=False)
    with pytest.raises(ArgumentError, match=r"k_full=False needs group_size > 0"):
        prepare_gptq(*args, t["g_idx"], group_size=-1, k_full=False)
    crowded = t["g_idx"].copy()
    crowded[:129] = 3  # 129 rows of one group in one shard
    with pytest.raises(ArgumentError, match=r"at most group_size=128 rows \(a K shard\); group 3 has"):
        prepare_gptq(*args, crowded, group_size=128, k_full=False)
    with pytest.raises(ArgumentTypeError, match=r"k_full must be a bool"):
        prepare_gptq(*args, t["g_idx"], group_size=128, k_full=0)
    with pytest.raises(ArgumentError, match=r"shard_layout='padded' applies to a K shard only"):
        prepare_gptq(*args, t["g_idx"], group_size=128, shard_layout="padded")
    assert not prepare_gptq(*args, t["g_idx"], group_size=128, k_full=False).k_full  # n % 128 == 0: row groups
    with pytest.raises(ArgumentError, match=r"shard_layout='rows' must be one of 'padded', 'row_groups'"):
        prepare_gptq(*args, t["g_idx"], group_size=128, k_full=False, shard_layout="rows")
    narrow = gptq_k_shard(np.random.default_rng(6), shards=2, shard=0, k=1536)
    q64 = narrow["qweight"][:, :64]
    with pytest.raises(ArgumentError, match=r"n = qweight.shape\[1\]=64 must be a multiple of 128 .* 'row_groups'"):
        prepare_gptq(q64, narrow["scales"][:, :64], narrow["qzeros"][:, :8], narrow["g_idx"], group_size=128,
                     k_full=False, shard_layout="row_groups")
    assert prepare_gptq(q64, narrow["scales"][:, :64], narrow["qzeros"][:, :8], narrow["g_idx"], group_size=128,
                        k_full=False).k_full  # the default for n % 128 != 0: padded, any n % 64 == 0
    # The shard alone, as if it were a whole layer, has uneven groups: refused.
    with pytest.raises(ArgumentError, match=r"every group exactly .* pass k_full=False"):
        prepare_gptq(*args, t["g_idx"])


def test_gptq_act_order_contradicting_desc_act_is_rejected():
    t = ql.gptq_layer(np.random.default_rng(3), K, N, group_size=64, act_order=True)
    with pytest.raises(ArgumentError, match=r"g_idx is not k // group_size .* but desc_act=False"):
        prepare_gptq(t["qweight"], t["scales"], t["qzeros"], t["g_idx"], desc_act=False)
    with pytest.raises(ArgumentError, match=r"desc_act=True needs g_idx"):
        prepare_gptq(t["qweight"], t["scales"], t["qzeros"], None, desc_act=True)


def test_gptq_g_idx_rules():
    t = ql.gptq_layer(np.random.default_rng(4), K, N, group_size=64)
    with pytest.raises(ArgumentError, match=r"g_idx values must be in 0..3, got range 0..4"):
        prepare_gptq(t["qweight"], t["scales"], None, np.where(t["g_idx"] == 3, 4, t["g_idx"]))
    with pytest.raises(ArgumentError, match=r"g_idx must have shape \(256,\)"):
        prepare_gptq(t["qweight"], t["scales"], None, t["g_idx"][:-1])


def test_gptq_symmetric_with_other_zero_points_is_rejected():
    t = ql.gptq_layer(np.random.default_rng(6), K, N, group_size=64, sym=False)
    with pytest.raises(ArgumentError, match=r"qzeros hold zero points other than 8 .* pass sym=False"):
        prepare_gptq(t["qweight"], t["scales"], t["qzeros"], sym=True)


def test_gptq_8_bit_asymmetric_is_unsupported():
    t = ql.gptq_layer(np.random.default_rng(7), K, N, bits=8, group_size=64, sym=False)
    with pytest.raises(ArgumentError, match=r"8-bit asymmetric GPTQ is not supported"):
        prepare_gptq(t["qweight"], t["scales"], t["qzeros"], bits=8, sym=False)


def test_gptq_asymmetric_needs_qzeros():
    t = ql.gptq_layer(np.random.default_rng(8), K, N, group_size=64)
    with pytest.raises(ArgumentError, match=r"qzeros is required when sym=False"):
        prepare_gptq(t["qweight"], t["scales"], None, sym=False)


def test_gptq_shapes_the_general_gemm_cannot_serve_are_rejected():
    t = ql.gptq_layer(np.random.default_rng(9), 192, N, group_size=64)
    with pytest.raises(ArgumentError, match=r"k = qweight.shape\[0\]\*8=192 must be a multiple of 128"):
        prepare_gptq(t["qweight"], t["scales"], t["qzeros"])
    t = ql.gptq_layer(np.random.default_rng(9), K, 96, group_size=64)
    with pytest.raises(ArgumentError, match=r"n = qweight.shape\[1\]=96 must be a multiple of 64"):
        prepare_gptq(t["qweight"], t["scales"], t["qzeros"])


def test_gptq_group_size_is_inferred_or_checked():
    t = ql.gptq_layer(np.random.default_rng(10), K, N, group_size=32)
    assert prepare_gptq(t["qweight"], t["scales"]).group_size == 32
    assert prepare_gptq(t["qweight"], t["scales"], group_size=32).group_size == 32
    with pytest.raises(ArgumentError, match=r"scales.shape\[0\]=8 must be 2 for group_size=128"):
        prepare_gptq(t["qweight"], t["scales"], group_size=128)
    t = ql.gptq_layer(np.random.default_rng(10), 1024, N, group_size=32)
    with pytest.raises(ArgumentError, match=r"group_size=16 must be -1, 32, 64 or a power of two >= 128"):
        prepare_gptq(t["qweight"], ql.random_scales(np.random.default_rng(1), (64, N)))


def test_gptq_bf16_checkpoint_scales_stay_exact_in_bf16():
    t = ql.gptq_layer(np.random.default_rng(11), K, N, group_size=64, scale_dtype=BF16)
    p = prepare_gptq(t["qweight"], t["scales"], t["qzeros"], dtype=BF16)
    assert_decodes_to_reference(p, BF16)


# ---- AWQ --------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=["f16", "bf16"])
@pytest.mark.parametrize("group_size", [-1, 32, 64, 128])
def test_awq_is_u4_with_zero_points(group_size, dtype):
    t = ql.awq_layer(np.random.default_rng(group_size + 20), K, N, group_size=group_size)
    p = prepare_awq(t["qweight"], t["scales"], t["qzeros"], dtype=dtype)
    assert p.b_type is WeightType.U4 and p.group_size == group_size
    check_buffers(p, zero_points=True)
    assert_decodes_to_reference(p, np.float16)
    if dtype == np.float16:  # same buffers as the format's own converter
        packed, scales, zero_points = awq_to_marlin(t["qweight"], t["scales"], t["qzeros"], group_size)
        assert np.array_equal(p.b, packed) and np.array_equal(p.zero_points, zero_points)
        assert np.array_equal(p.scales, scales)


def test_awq_shape_rules():
    t = ql.awq_layer(np.random.default_rng(21), K, N, group_size=64)
    with pytest.raises(ArgumentError, match=r"scales.shape\[0\]=4 must be 2 for group_size=128"):
        prepare_awq(t["qweight"], t["scales"], t["qzeros"], group_size=128)
    with pytest.raises(ArgumentError, match=r"qzeros must have shape \(4, 16\)"):
        prepare_awq(t["qweight"], t["scales"], t["qzeros"][:, :-1])


# ---- compressed-tensors ------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=["f16", "bf16"])
@pytest.mark.parametrize("group_size", [-1, 32, 128])
@pytest.mark.parametrize("bits, asym", [(4, False), (8, False), (4, True)])
def test_compressed_tensors(bits, asym, group_size, dtype):
    t = ql.ct_layer(np.random.default_rng(bits + group_size), K, N, bits=bits, group_size=group_size, asym=asym,
                    scale_dtype=BF16)
    p = prepare_compressed_tensors(t["weight_packed"], t["weight_scale"], t.get("weight_zero_point"), bits=bits,
                                   weight_shape=t["weight_shape"], dtype=dtype)
    expected = WeightType.U4 if asym else (WeightType.U4B8 if bits == 4 else WeightType.U8B128)
    assert p.b_type is expected and p.group_size == group_size
    check_buffers(p, zero_points=asym)
    assert_decodes_to_reference(p, BF16)
    if dtype == np.float16:
        packed, _, zero_points = ct_to_marlin(t["weight_packed"], t["weight_scale"], t.get("weight_zero_point"), bits)
        assert np.array_equal(p.b, packed)
        assert (zero_points is None and p.zero_points is None) or np.array_equal(p.zero_points, zero_points)


def test_compressed_tensors_int8_asymmetric_is_unsupported():
    t = ql.ct_layer(np.random.default_rng(30), K, N, bits=8, group_size=128, asym=True)
    with pytest.raises(ArgumentError, match=r"asymmetric INT8 .* not supported"):
        prepare_compressed_tensors(t["weight_packed"], t["weight_scale"], t["weight_zero_point"], bits=8)


# ---- FP8 ---------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=["f16", "bf16"])
@pytest.mark.parametrize("kind", ["tensor", "channel", "block"])
def test_fp8(kind, dtype):
    t = ql.fp8_layer(np.random.default_rng(40), K, N, kind=kind)
    scale = t.get("weight_scale", t.get("weight_scale_inv"))
    p = prepare_fp8(t["weight"], scale, dtype=dtype)
    assert p.b_type is WeightType.FE4M3FN
    assert p.group_size == (128 if kind == "block" else -1)
    check_buffers(p, zero_points=False)
    assert_decodes_to_reference(p, np.float32)


@pytest.mark.parametrize("dtype", DTYPES, ids=["f16", "bf16"])
def test_fp8_scales_carry_the_factor_256_for_both_activation_types(dtype):
    t = ql.fp8_layer(np.random.default_rng(41), K, N, kind="channel")
    exact = np.full((N, 1), 0.0078125, dtype=np.float32)  # 2**-7: exact in every dtype, also times 256
    p = prepare_fp8(t["weight"], exact, dtype=dtype)
    assert np.all(as_float64(marlin_unpermute_scales(p.scales, -1)) == 0.0078125 * 256)
    if dtype == np.float16:
        packed, scales = prepare_fp8_weight_for_marlin(t["weight"], exact)
        assert np.array_equal(p.b, packed) and np.array_equal(p.scales, scales)


@pytest.mark.parametrize("dtype", DTYPES, ids=["f16", "bf16"])
def test_fp8_every_finite_code_including_subnormals(dtype):
    weight = ql.every_finite_e4m3(N, K)
    p = prepare_fp8(weight, np.float32(0.5), dtype=dtype)
    assert_decodes_to_reference(p, np.float32)
    assert set(np.unique(marlin_unpack_int8(p.b, K, N))) == set(range(256)) - set(ql.E4M3_NAN_BYTES)


def test_fp8_scale_shapes():
    t = ql.fp8_layer(np.random.default_rng(42), K, N, kind="channel")
    w = t["weight"]
    assert prepare_fp8(w, t["weight_scale"].reshape(N)).group_size == -1
    assert prepare_fp8(w, 0.25).group_size == -1
    blocks = np.full((1, 2), 0.25, dtype=np.float32)
    assert prepare_fp8(w, blocks).group_size == 128
    assert prepare_fp8(w, blocks.reshape(-1), block=(128, 128)).group_size == 128
    with pytest.raises(ArgumentError, match=r"pass block=\(128, 128\) for block scales"):
        prepare_fp8(w, blocks, block=None)
    with pytest.raises(ArgumentError, match=r"block must be 'auto', None or \(128, 128\)"):
        prepare_fp8(w, blocks, block="yes")


def test_fp8_nan_bytes_are_rejected():
    weight = ql.every_finite_e4m3(N, K).view(np.uint8).copy()
    weight[3, 5] = 0x7F
    with pytest.raises(ArgumentError, match=r"must not contain E4M3 NaN .* \[3, 5\]"):
        prepare_fp8(weight, 1.0)


# ---- float (round to nearest) -----------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=["f16", "bf16"])
@pytest.mark.parametrize("group_size", [-1, 32, 64, 128])
@pytest.mark.parametrize("bits, sym, b_type", [(4, True, WeightType.U4B8), (4, False, WeightType.U4), (8, True, WeightType.U8B128)])
def test_float_quantisation(bits, sym, b_type, group_size, dtype):
    w = np.random.default_rng(50).standard_normal((K, N)).astype(np.float32)
    p = prepare_float(w, bits=bits, group_size=group_size, sym=sym, dtype=dtype)
    assert p.b_type is b_type
    check_buffers(p, zero_points=not sym)
    assert_decodes_to_reference(p, dtype)
    # Round to nearest: within half a step of w, plus what the rounding of the
    # stored scale (relative eps) moves the extreme codes (up to qmax steps).
    scales = np.repeat(as_float64(marlin_unpermute_scales(p.scales, group_size)), K if group_size == -1 else group_size, axis=0)
    eps = 2.0**-8 if dtype == BF16 else 2.0**-11
    assert np.all(np.abs(p.reference() - w) <= scales * (0.5 + ((1 << bits) - 1) * eps) + 1e-12)


def test_float_8_bit_asymmetric_is_unsupported():
    with pytest.raises(ArgumentError, match=r"8-bit asymmetric is not supported"):
        prepare_float(np.ones((K, N), np.float32), bits=8, sym=False)


def test_rtn_4_bit_symmetric_fp16_equals_the_int4_quantiser():
    w = np.random.default_rng(51).standard_normal((K, N)).astype(np.float32) * 3
    w[:128, :7] = 0.0  # all-zero groups: scale 1.0
    codes, scales, zeros = quantize_rtn(w, 4, 128, True, np.float16)
    ref_codes, ref_scales = quantize_int4_symmetric(w, 128)
    assert zeros is None
    assert np.array_equal(codes, ref_codes) and np.array_equal(scales, ref_scales)


def test_rtn_asymmetric_keeps_zero_exact():
    w = np.random.default_rng(52).uniform(0.5, 2.0, size=(K, N)).astype(np.float32)
    w[::5] = 0.0
    codes, scales, zeros = quantize_rtn(w, 4, 64, False, np.float16)
    from ferrum_ffi.formats import dequantize_rtn

    assert np.all(dequantize_rtn(codes, scales, zeros, 64, 4)[::5] == 0.0)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**32 - 1),
    fmt=st.sampled_from(["gptq", "gptq8", "gptq_asym", "gptq_act", "awq", "ct4", "ct8", "ct_asym", "fp8"]),
    group_size=st.sampled_from([-1, 32, 64, 128]),
    k_tiles=st.integers(1, 3),
    n_chunks=st.integers(1, 3),
    bf16=st.booleans(),
)
def test_any_format_decodes_to_its_reference(seed, fmt, group_size, k_tiles, n_chunks, bf16):
    rng = np.random.default_rng(seed)
    k, n, dtype = 128 * k_tiles, 64 * n_chunks, BF16 if bf16 else np.dtype(np.float16)
    if fmt.startswith("gptq"):
        act = fmt == "gptq_act" and group_size != -1
        bits = 8 if fmt == "gptq8" else 4
        sym = fmt != "gptq_asym"
        t = ql.gptq_layer(rng, k, n, bits=bits, group_size=group_size, sym=sym, act_order=act)
        p = prepare_gptq(t["qweight"], t["scales"], t["qzeros"], t["g_idx"], bits=bits, sym=sym, dtype=dtype)
    elif fmt == "awq":
        t = ql.awq_layer(rng, k, n, group_size=group_size)
        p = prepare_awq(t["qweight"], t["scales"], t["qzeros"], dtype=dtype)
    elif fmt.startswith("ct"):
        bits = 8 if fmt == "ct8" else 4
        t = ql.ct_layer(rng, k, n, bits=bits, group_size=group_size, asym=fmt == "ct_asym")
        p = prepare_compressed_tensors(t["weight_packed"], t["weight_scale"], t.get("weight_zero_point"),
                                       bits=bits, dtype=dtype)
    else:
        t = ql.fp8_layer(rng, k, n, kind="block" if group_size == 128 else "channel")
        p = prepare_fp8(t["weight"], t.get("weight_scale", t.get("weight_scale_inv")), dtype=dtype)
    assert_decodes_to_reference(p, np.float32 if fmt == "fp8" else np.float16)


# ---- bfloat16 scale permutation ---------------------------------------------------------------


@pytest.mark.parametrize("group_size", [-1, 128])
def test_bfloat16_scales_are_permuted_bit_exactly(group_size):
    rng = np.random.default_rng(60)
    rows = 1 if group_size == -1 else 3
    values = rng.standard_normal((rows, 192)).astype(np.float32).astype(BF16)
    permuted = marlin_permute_scales(values, group_size)
    assert permuted.dtype == BF16
    # Where each value goes: the fp16 permutation of the value indices (exact in fp16).
    expected = marlin_permute_scales(np.arange(rows * 192, dtype=np.float32).reshape(rows, 192), group_size)
    flat = values.reshape(-1)
    assert np.array_equal(permuted.view(np.uint16), flat.view(np.uint16)[expected.astype(np.int64)])
    assert np.array_equal(marlin_unpermute_scales(permuted, group_size).view(np.uint16), values.view(np.uint16))


def test_bfloat16_scales_must_be_finite():
    values = np.full((1, 64), np.inf, dtype=np.float32).astype(BF16)
    with pytest.raises(ArgumentError, match=r"marlin_permute_scales: scales must be finite"):
        marlin_permute_scales(values, -1)
