"""The general Marlin GEMM on the GPU (``linear`` -> ``ferrum_marlin_mm``)
against float64 references of the dequantised weight.

Every weight type x {FP16, BF16} x group size x act-order x reduction mode x
m, then the features one by one: bias, fp32-reduce determinism, tile
overrides, the lock workspace left zero, strided rows, every converter end to
end (the reference computed by the format's own decoder from the on-disk
tensors), every finite FP8 code, a non-default stream, graph capture, m == 0.

BF16 arrays: CuPy >= 14 holds ``ml_dtypes.bfloat16`` itself; otherwise the
tests keep bfloat16 bit patterns in uint16 arrays behind
``ff.bfloat16_view`` -- both are how users pass BF16 from CuPy.
"""

from __future__ import annotations

import numpy as np
import pytest

import ferrum_ffi as ff
from ferrum_ffi import WeightType, _scratch
from ferrum_ffi.formats import (
    awq_reference_dequant,
    ct_reference_dequant,
    fp8_reference_dequant,
    gptq_reference_dequant,
)

from . import quant_layers as ql

pytestmark = pytest.mark.gpu

BF16 = ql.bfloat16()
F16 = np.dtype(np.float16)
DTYPES = {"f16": F16, "bf16": BF16}
# Relative L2 error of the product: fp16 keeps 11 significant bits, bf16 8,
# in the output and in the partial sums the reduction adds.
TOLERANCE = {F16: 2e-3, BF16: 1e-2}
M_VALUES = (1, 16, 17, 40, 64, 255, 1024)
K, N = 1024, 512


# ---- arrays ---------------------------------------------------------------------------------


def to_device(cp, host: np.ndarray):
    """A device copy of a host array; bfloat16 natively when CuPy can hold it."""
    if host.dtype == BF16:
        try:
            return cp.asarray(host)
        except (TypeError, ValueError, NotImplementedError):
            return ff.bfloat16_view(cp.asarray(host.view(np.uint16)))
    return cp.asarray(host)


def to_host(array) -> np.ndarray:
    if isinstance(array, ff.Bfloat16Array):
        return array.base.get().view(np.uint16).view(BF16)
    return array.get()


def activations(m, k, dtype, seed=1) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((m, k)).astype(np.float32).astype(dtype)


def relative_l2(out, reference: np.ndarray) -> float:
    got = to_host(out).astype(np.float64)
    if not np.isfinite(got).all():
        return float("inf")
    return float(np.linalg.norm(got - reference) / max(np.linalg.norm(reference), 1e-30))


def reference_product(cp, x_host: np.ndarray, w: np.ndarray, bias: np.ndarray | None = None) -> np.ndarray:
    """float64 x @ W (+ bias), computed on the GPU by CuPy, independent of the kernel."""
    ref = cp.asarray(x_host.astype(np.float64)) @ cp.asarray(w)
    if bias is not None:
        ref += cp.asarray(bias.astype(np.float64))
    return ref.get()


def run(cp, weight, m, *, seed=1, bias=None, **options) -> tuple[object, np.ndarray]:
    """linear() on random activations; returns (out, float64 reference)."""
    x = activations(m, weight.k, weight.dtype, seed)
    bias_device = None if bias is None else to_device(cp, bias)
    out = ff.linear(to_device(cp, x), weight, bias=bias_device, **options)
    cp.cuda.Device().synchronize()
    return out, reference_product(cp, x, weight.reference_dequant(), bias)


# ---- weights of every type ----------------------------------------------------------------------


INT_TYPES = {"U4": (4, False), "U4B8": (4, True), "U8B128": (8, True)}


def make_weight(b_type: str, dtype: np.dtype, group_size: int, act_order: bool, k=K, n=N, seed=0):
    rng = np.random.default_rng([seed, group_size + 1, int(act_order)])
    if b_type == "FE4M3FN":
        t = ql.fp8_layer(rng, k, n, kind="block" if group_size == 128 else "channel", scale_dtype=np.float32)
        return ff.MarlinLinearWeight.from_fp8(t["weight"], t.get("weight_scale", t.get("weight_scale_inv")), dtype=dtype)
    bits, sym = INT_TYPES[b_type]
    # Scales in the activation dtype, as a checkpoint for it would hold them:
    # the kernel's scales are then exactly the reference's.
    t = ql.gptq_layer(rng, k, n, bits=bits, group_size=group_size, sym=sym, act_order=act_order, scale_dtype=dtype)
    return ff.MarlinLinearWeight.from_gptq(t["qweight"], t["scales"], t["qzeros"], t["g_idx"], bits=bits, sym=sym,
                                           dtype=dtype)


def sweep_cases():
    for b_type in ("U4", "U4B8", "U8B128", "FE4M3FN"):
        groups = (-1, 128) if b_type == "FE4M3FN" else (-1, 32, 64, 128, 256)
        for dtype in DTYPES:
            for group_size in groups:
                acts = (False, True) if b_type != "FE4M3FN" and group_size != -1 else (False,)
                for act_order in acts:
                    yield b_type, dtype, group_size, act_order


_weights: dict = {}


def _memo(reference):
    """The weight's float64 reference, computed once (the sweep reuses each weight)."""
    cache = []

    def memoised() -> np.ndarray:
        if not cache:
            cache.append(reference())
        return cache[0]

    return memoised


def cached_weight(cp, b_type, dtype_name, group_size, act_order):
    key = (b_type, dtype_name, group_size, act_order)
    if key not in _weights:
        weight = make_weight(b_type, DTYPES[dtype_name], group_size, act_order)
        weight.reference = _memo(weight.reference)
        _weights[key] = weight
    return _weights[key]


@pytest.mark.parametrize("m", M_VALUES)
@pytest.mark.parametrize("reduce", ["atomic", "fp32_reduce"])
@pytest.mark.parametrize(
    "b_type, dtype_name, group_size, act_order",
    list(sweep_cases()),
    ids=[f"{t}-{d}-g{g}{'-act' if a else ''}" for t, d, g, a in sweep_cases()],
)
def test_every_type_group_and_mode(cp, b_type, dtype_name, group_size, act_order, reduce, m):
    weight = cached_weight(cp, b_type, dtype_name, group_size, act_order)
    assert weight.b_type is WeightType[b_type] and weight.act_order == act_order
    out, ref = run(cp, weight, m, seed=m, fp32_reduce=reduce == "fp32_reduce")
    assert to_host(out).shape == (m, N)
    assert relative_l2(out, ref) < TOLERANCE[weight.dtype]


@pytest.mark.parametrize("b_type", ["U4", "U8B128"])
@pytest.mark.parametrize("group_size, act_order", [(512, False), (1024, True)])
def test_groups_longer_than_a_tile(cp, b_type, group_size, act_order):
    # Powers of two >= 128: every k tile lies inside one group (K = 2048: 4 / 2 groups).
    for dtype_name in DTYPES:
        weight = make_weight(b_type, DTYPES[dtype_name], group_size, act_order, k=2048, seed=group_size)
        for m in (1, 12, 40, 200):
            out, ref = run(cp, weight, m, seed=m)
            assert relative_l2(out, ref) < TOLERANCE[weight.dtype], (dtype_name, m)


# ---- features ---------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype_name", DTYPES)
@pytest.mark.parametrize("b_type", ["U4", "U4B8", "U8B128", "FE4M3FN"])
@pytest.mark.parametrize("m", [1, 64])
def test_bias(cp, b_type, dtype_name, m):
    weight = cached_weight(cp, b_type, dtype_name, 128, False)
    bias = np.random.default_rng(5).standard_normal(N).astype(np.float32).astype(weight.dtype)
    out, ref = run(cp, weight, m, bias=bias)
    assert relative_l2(out, ref) < TOLERANCE[weight.dtype]
    plain, ref_plain = run(cp, weight, m)
    assert relative_l2(plain, ref_plain) < TOLERANCE[weight.dtype]
    assert not np.array_equal(to_host(out), to_host(plain))


@pytest.mark.parametrize("dtype_name", DTYPES)
@pytest.mark.parametrize("b_type", ["U4", "U8B128", "FE4M3FN"])
@pytest.mark.parametrize("m", [1, 16, 200])
def test_fp32_reduce_is_deterministic(cp, b_type, dtype_name, m):
    # Long K and narrow N: several blocks share each column, so partial sums are reduced.
    weight = make_weight(b_type, DTYPES[dtype_name], 128, False, k=8192, n=256, seed=11)
    x = to_device(cp, activations(m, weight.k, weight.dtype, seed=12))
    first = to_host(ff.linear(x, weight, fp32_reduce=True))
    for _ in range(3):
        again = to_host(ff.linear(x, weight, fp32_reduce=True))
        assert np.array_equal(first.view(np.uint16), again.view(np.uint16))
    ref = reference_product(cp, to_host(x), weight.reference_dequant())
    assert relative_l2(ff.linear(x, weight, fp32_reduce=True), ref) < TOLERANCE[weight.dtype]


@pytest.mark.parametrize("dtype_name", DTYPES)
@pytest.mark.parametrize("b_type", ["U4", "U4B8", "U8B128", "FE4M3FN"])
@pytest.mark.parametrize("m", [40, 100, 130, 300])
def test_tall_slabs_with_many_contributors_per_column(cp, b_type, dtype_name, m):
    # Tall slabs (Hopper: the warp-specialised kernel; 64-, 128- and 256-row
    # slabs, one partial) on a long K: each column is split over ~16 blocks,
    # whose partials are added to the first one's in C.
    weight = make_weight(b_type, DTYPES[dtype_name], 128, False, k=4096, n=1024, seed=13)
    x = to_device(cp, activations(m, weight.k, weight.dtype, seed=14))
    ref = reference_product(cp, to_host(x), weight.reference_dequant())
    assert relative_l2(ff.linear(x, weight), ref) < TOLERANCE[weight.dtype]
    assert relative_l2(ff.linear(x, weight, fp32_reduce=True), ref) < TOLERANCE[weight.dtype]


# Hopper's warp-specialised tiles: 64-, 128- and 256-row slabs (m = 40, 100, 300),
# 32-row slabs (m = 17..32 on k >= 8192) and the 16-row tile's dequantising mode
# (8-bit weights in groups of 32).
BIAS_CASES = [(b, g, m, 4096) for b in ("U4", "U8B128", "FE4M3FN") for g in (-1, 128) for m in (40, 100, 300)] + [
    ("U4", 128, 20, 8192), ("U8B128", -1, 20, 8192), ("U8B128", 32, 13, 4096)]


@pytest.mark.parametrize("dtype_name", DTYPES)
@pytest.mark.parametrize("b_type, group_size, m, k", BIAS_CASES)
def test_tall_slabs_add_the_bias_once_per_shared_column(cp, b_type, dtype_name, group_size, m, k):
    # Each column is split over many blocks: only the one that stores adds the
    # bias (the others add their partials to it), and channelwise scales are
    # applied by every contributor before the 16-bit rounding.
    weight = make_weight(b_type, DTYPES[dtype_name], group_size, False, k=k, n=1024, seed=15)
    bias = np.random.default_rng(16).standard_normal(weight.n).astype(np.float32).astype(weight.dtype)
    x_host = activations(m, weight.k, weight.dtype, seed=17)
    ref = reference_product(cp, x_host, weight.reference_dequant(), bias)
    x = to_device(cp, x_host)
    for fp32_reduce in (False, True):
        out = ff.linear(x, weight, bias=to_device(cp, bias), fp32_reduce=fp32_reduce)
        assert relative_l2(out, ref) < TOLERANCE[weight.dtype], fp32_reduce


# n a multiple of 64 that the 256-column tiles do not divide (Qwen2.5-72B's
# 29568, GPT-OSS's 2880, vocabularies): on Hopper the warp-specialised tiles
# leave their last column tile partial (one, two or three of its 64-column
# chunks: 2880, 640, 192), and so does the 8-warp kernel's deep tile at
# m <= 8 where the columns past n are at most n / 8 (2880, 1472, 960), with
# bias and channelwise scales read for the columns inside n only; k = 2048
# shares every column between blocks.
PARTIAL_TILE_TYPES = [("U4", 128, False), ("U4B8", -1, False), ("U4", 32, False), ("U4B8", 64, True),
                      ("U4", -1, False), ("U8B128", 128, False), ("FE4M3FN", -1, False)]


@pytest.mark.parametrize("dtype_name", DTYPES)
@pytest.mark.parametrize("b_type, group_size, act_order", PARTIAL_TILE_TYPES)
@pytest.mark.parametrize("n", [192, 640, 960, 1472, 2880])
def test_partial_last_column_tile(cp, b_type, group_size, act_order, dtype_name, n):
    weight = make_weight(b_type, DTYPES[dtype_name], group_size, act_order, k=2048, n=n, seed=n)
    bias = np.random.default_rng(n).standard_normal(n).astype(np.float32).astype(weight.dtype)
    w = weight.reference_dequant()
    for m in (1, 5, 12, 20, 40, 64, 100, 300):
        x_host = activations(m, weight.k, weight.dtype, seed=m)
        x = to_device(cp, x_host)
        for fp32_reduce in (False, True):
            use_bias = fp32_reduce == (m % 2 == 0)
            ref = reference_product(cp, x_host, w, bias if use_bias else None)
            # The output sits at the front of a poisoned buffer: a column past n
            # of the last row would land behind it.
            buf = to_device(cp, np.full(m * n + 256, np.nan, dtype=weight.dtype))
            out = buf[: m * n].reshape(m, n)
            ff.linear(x, weight, bias=to_device(cp, bias) if use_bias else None, out=out, fp32_reduce=fp32_reduce)
            assert relative_l2(out, ref) < TOLERANCE[weight.dtype], (m, fp32_reduce)
            assert np.isnan(to_host(buf)[m * n:].astype(np.float32)).all(), (m, fp32_reduce)


@pytest.mark.parametrize("dtype_name", DTYPES)
def test_activations_past_the_l2_rule_take_128_row_slabs(cp, dtype_name):
    # 2100 x 8192 activations (34 MB) are past the planner's L2 rule for
    # 256-row slabs (Hopper): 128-row slabs, the last one partial.
    weight = make_weight("U4B8", DTYPES[dtype_name], 128, False, k=8192, n=256, seed=15)
    x = to_device(cp, activations(2100, weight.k, weight.dtype, seed=16))
    ref = reference_product(cp, to_host(x), weight.reference_dequant())
    assert relative_l2(ff.linear(x, weight), ref) < TOLERANCE[weight.dtype]


@pytest.mark.parametrize("dtype_name", DTYPES)
@pytest.mark.parametrize("b_type, group_size", [("U8B128", -1), ("U8B128", 32), ("U8B128", 128), ("FE4M3FN", -1),
                                                ("FE4M3FN", 128), ("U4", 64), ("U4B8", -1), ("U4B8", 128)])
@pytest.mark.parametrize("m", [9, 13])
def test_short_slabs_with_many_contributors_per_column(cp, b_type, group_size, dtype_name, m):
    # 9..16 rows (Hopper: the wide kernel's 16-row tile — whole slots of exact
    # values, two group windows per slot for 4-bit groups of 64, or
    # dequantisation for INT8 groups of 32) on a long K, with rows past m
    # zero-filled in the slab.
    weight = make_weight(b_type, DTYPES[dtype_name], group_size, False, k=4096, n=1024, seed=15)
    x = to_device(cp, activations(m, weight.k, weight.dtype, seed=16))
    ref = reference_product(cp, to_host(x), weight.reference_dequant())
    assert relative_l2(ff.linear(x, weight), ref) < TOLERANCE[weight.dtype]
    assert relative_l2(ff.linear(x, weight, fp32_reduce=True), ref) < TOLERANCE[weight.dtype]


# (b_type, dtype, k, bound): the fp16 cases on K = 28672 tell the two apart. Folding
# each slot measures 2.6e-4 (U4B8) and 2.7e-4 (U8B128) on the H200; carrying the
# offset through a k run (the first 16-row tile) measured 7.1e-4 and 8.3e-4, while
# K = 8192 could not tell them apart (2.6e-4 / 2.5e-4 either way).
BIASED_CASES = [(b_type, dtype_name, 8192, None) for b_type in ("U8B128", "U4B8", "U4") for dtype_name in DTYPES]
BIASED_CASES += [("U4B8", "f16", 28672, 4e-4), ("U8B128", "f16", 28672, 4e-4)]


@pytest.mark.parametrize("b_type, dtype_name, k, bound", BIASED_CASES)
def test_channelwise_short_slabs_with_biased_activations(cp, b_type, dtype_name, k, bound):
    # Raw images of integer codes carry an offset (~1000 x the activation
    # sums); partial sums that carry it lose fp32 precision by the ratio of
    # that offset to the result, which activations with a mean of 3 over a
    # long K expose. The 16-row tile now folds exact values per slot (128-deep
    # 4-bit slots of raw images measured 5.4e-4 here); this keeps it so.
    weight = make_weight(b_type, DTYPES[dtype_name], -1, False, k=k, n=512, seed=21)
    x_host = (activations(16, weight.k, np.float32, seed=22) + 3.0).astype(weight.dtype)
    ref = reference_product(cp, x_host, weight.reference_dequant())
    x = to_device(cp, x_host)
    limit = TOLERANCE[weight.dtype] / 2 if bound is None else bound
    assert relative_l2(ff.linear(x, weight, fp32_reduce=True), ref) < limit


@pytest.mark.parametrize("magnitude", [3e4, 1e-12])
@pytest.mark.parametrize("m", [1, 8, 16])
@pytest.mark.parametrize("group_size", [-1, 32, 128])
@pytest.mark.parametrize("b_type", ["U4", "U4B8"])
def test_bf16_int4_keeps_large_and_tiny_activations(cp, b_type, group_size, m, magnitude):
    # Short bf16 INT4 slabs multiply bare code images (q 2^-133, q 2^-129)
    # by activations scaled by 2^64 / 2^60 (formats.cuh): outlier-sized
    # activations must not overflow that scaling and tiny ones must keep
    # their products in fp32's normal range.
    weight = make_weight(b_type, BF16, group_size, False, seed=23)
    x_host = (activations(m, weight.k, np.float32, seed=24) * magnitude).astype(BF16)
    ref = reference_product(cp, x_host, weight.reference_dequant())
    assert relative_l2(ff.linear(to_device(cp, x_host), weight), ref) < TOLERANCE[BF16]


@pytest.mark.parametrize("tile", [(128, 128), (64, 256), (128, 64), (128, 256)])
@pytest.mark.parametrize("b_type", ["U4", "U4B8", "U8B128", "FE4M3FN"])
@pytest.mark.parametrize("dtype_name", DTYPES)
@pytest.mark.parametrize("m", [1, 16, 64])
def test_tile_overrides(cp, tile, b_type, dtype_name, m):
    if tile == (128, 256) and m > 16:
        pytest.skip("the deep tile serves m <= 16 (rejected: test_mm_validation)")
    weight = cached_weight(cp, b_type, dtype_name, 128, False)
    out, ref = run(cp, weight, m, thread_k=tile[0], thread_n=tile[1])
    assert relative_l2(out, ref) < TOLERANCE[weight.dtype]


@pytest.mark.parametrize("group_size", [-1, 32, 64, 128])
@pytest.mark.parametrize("b_type", ["U8B128", "FE4M3FN"])
@pytest.mark.parametrize("dtype_name", DTYPES)
@pytest.mark.parametrize("m", [1, 5, 16])
def test_deep_tile_for_8bit_weights(cp, group_size, b_type, dtype_name, m):
    # On Hopper 8-row slabs of 8-bit weights take the deep tile by themselves
    # (not bf16 INT8); forced here so every group mode runs on it on any GPU.
    if b_type == "FE4M3FN" and group_size in (32, 64):
        pytest.skip("FP8 groups are -1 or 128")
    weight = cached_weight(cp, b_type, dtype_name, group_size, False)
    for fp32_reduce in (False, True):
        out, ref = run(cp, weight, m, thread_k=128, thread_n=256, seed=m, fp32_reduce=fp32_reduce)
        assert relative_l2(out, ref) < TOLERANCE[weight.dtype]


@pytest.mark.parametrize("sms", [1, 7, 64])
def test_fewer_sms(cp, sms):
    weight = cached_weight(cp, "U4", "bf16", 64, True)
    out, ref = run(cp, weight, 48, sms=sms, fp32_reduce=sms == 7)
    assert relative_l2(out, ref) < TOLERANCE[BF16]


def _workspace(cp, stream_handle: int):
    scratch = _scratch._cache[(cp.cuda.Device().id, 1 if stream_handle in (0, 1) else stream_handle)]
    return scratch.workspace.array


@pytest.mark.parametrize("fp32_reduce", [False, True])
@pytest.mark.parametrize("b_type, dtype_name, group_size, act_order",
                         [("U4B8", "f16", 128, True), ("U4", "bf16", 64, False), ("U8B128", "f16", -1, False),
                          ("FE4M3FN", "bf16", 128, False)])
def test_the_kernel_leaves_the_workspace_zero(cp, b_type, dtype_name, group_size, act_order, fp32_reduce):
    # linear() zeroes the locks only when it allocates them: every kernel must leave them zero.
    weight = cached_weight(cp, b_type, dtype_name, group_size, act_order)
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        for m in (1, 17, 255, 1024, 3):
            out, ref = run(cp, weight, m, stream=stream, fp32_reduce=fp32_reduce, seed=m)
            assert relative_l2(out, ref) < TOLERANCE[weight.dtype]
    stream.synchronize()
    assert int(cp.count_nonzero(_workspace(cp, stream.ptr))) == 0


@pytest.mark.parametrize("dtype_name", DTYPES)
@pytest.mark.parametrize("act_order", [False, True])
@pytest.mark.parametrize("m", [33, 300])  # Hopper: 64- and 256-row slabs, activations by tensor copy
def test_strided_rows(cp, dtype_name, act_order, m):
    weight = cached_weight(cp, "U4", dtype_name, 64, act_order)
    lda = K + 64
    full = activations(m, lda, weight.dtype, seed=4)
    x = to_device(cp, full)
    view = x[:, :K] if not isinstance(x, ff.Bfloat16Array) else ff.bfloat16_view(x.base[:, :K])
    out = ff.linear(view, weight)
    ref = reference_product(cp, full[:, :K], weight.reference_dequant())
    assert relative_l2(out, ref) < TOLERANCE[weight.dtype]


@pytest.mark.parametrize("strided", [False, True])
@pytest.mark.parametrize("m", [16, 64, 300])
def test_act_order_gather_of_long_rows(cp, m, strided):
    # Rows of 32 KB take the staged gather from m = 16 on: at m = 16 and 64
    # each row's output is split over two blocks, at m = 300 a block takes two
    # or three rows through its ring of two row buffers.
    k = 16384
    key = ("long-act", k)
    if key not in _weights:
        _weights[key] = make_weight("U4B8", F16, 128, True, k=k, n=256)
    weight = _weights[key]
    lda = k + 64 if strided else k
    full = activations(m, lda, F16, seed=m)
    x = to_device(cp, full)
    out = ff.linear(x[:, :k] if strided else x, weight)
    ref = reference_product(cp, full[:, :k], weight.reference_dequant())
    assert relative_l2(out, ref) < TOLERANCE[F16]


def test_leading_dimensions(cp):
    weight = cached_weight(cp, "U8B128", "f16", 64, False)
    x = activations(24, K, F16, seed=9)
    out = ff.linear(to_device(cp, x.reshape(2, 3, 4, K)), weight)
    assert out.shape == (2, 3, 4, N)
    ref = reference_product(cp, x, weight.reference_dequant())
    assert relative_l2(out.reshape(24, N), ref) < TOLERANCE[F16]


def test_m_zero_returns_an_empty_output(cp):
    weight = cached_weight(cp, "U4", "bf16", 128, False)
    out = ff.linear(to_device(cp, activations(0, K, BF16)), weight)
    assert to_host(out).shape == (0, N)


def test_non_default_stream(cp):
    weight = cached_weight(cp, "U4B8", "bf16", 32, True)
    stream = cp.cuda.Stream(non_blocking=True)
    inputs, outputs = [], []
    with stream:
        for i in range(12):
            x = activations(1 + 37 * i % 300, K, BF16, seed=100 + i)
            inputs.append(x)
            outputs.append(ff.linear(to_device(cp, x), weight, stream=stream, fp32_reduce=i % 2 == 1))
    stream.synchronize()
    w = weight.reference_dequant()
    for x, out in zip(inputs, outputs):
        assert relative_l2(out, reference_product(cp, x, w)) < TOLERANCE[BF16]
    assert int(cp.count_nonzero(_workspace(cp, stream.ptr))) == 0


def test_graph_capture_replays(cp):
    weight = cached_weight(cp, "U4", "f16", 128, True)
    x_host = activations(8, K, F16, seed=3)
    x = to_device(cp, x_host)
    out = cp.empty((8, N), dtype=cp.float16)
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        ff.linear(x, weight, out=out, stream=stream, fp32_reduce=True)  # warm-up: scratch allocated
        stream.begin_capture()
        ff.linear(x, weight, out=out, stream=stream, fp32_reduce=True)
        graph = stream.end_capture()
        out.fill(cp.nan)
        graph.launch(stream)
    stream.synchronize()
    assert relative_l2(out, reference_product(cp, x_host, weight.reference_dequant())) < TOLERANCE[F16]


# ---- converters end to end ---------------------------------------------------------------------


def end_to_end(cp, weight, reference: np.ndarray, m_values=(1, 33, 300)):
    """linear() on the converted weight against the format's own decoder."""
    for m in m_values:
        x = activations(m, weight.in_features, weight.dtype, seed=m + 1)
        out = ff.linear(to_device(cp, x), weight)
        assert relative_l2(out, reference_product(cp, x, reference)) < TOLERANCE[weight.dtype], m


CK, CN = 2048, 1024


@pytest.mark.parametrize("dtype_name", DTYPES)
@pytest.mark.parametrize("bits, sym, act_order", [(4, True, False), (4, False, False), (4, True, True), (4, False, True),
                                                  (8, True, False), (8, True, True)])
def test_gptq_end_to_end(cp, dtype_name, bits, sym, act_order):
    t = ql.gptq_layer(np.random.default_rng(bits), CK, CN, bits=bits, group_size=128, sym=sym, act_order=act_order)
    weight = ff.load_linear({f"l.{k}": v for k, v in t.items()}, "l", DTYPES[dtype_name])
    assert weight.act_order == act_order
    end_to_end(cp, weight, gptq_reference_dequant(t["qweight"], t["scales"], t["qzeros"], t["g_idx"], bits, sym, 128))


@pytest.mark.parametrize("dtype_name", DTYPES)
@pytest.mark.parametrize("bits, sym", [(4, True), (4, False), (8, True)])
@pytest.mark.parametrize("first, last, group_size", [(1024, 2048, 128), (768, 1024, 128), (200, 488, 64),
                                                     (1000, 1160, 32)])
@pytest.mark.parametrize("layout", ["padded", "row_groups"])
def test_gptq_k_shard_end_to_end(cp, dtype_name, bits, sym, first, last, group_size, layout):
    # A tensor-parallel row shard of a desc_act layer (vLLM's is_k_full=False):
    # its rows hold each group only in part. "row_groups": the kernel reads
    # every row's group from g_idx (K_FULL clear); "padded": groups padded to
    # whole sub-groups. x holds only the shard's columns.
    t = ql.gptq_layer(np.random.default_rng(first + bits), CK, CN, bits=bits, group_size=group_size, sym=sym,
                      act_order=True)
    per_word = 32 // bits
    q = t["qweight"][first // per_word:last // per_word]
    g_idx = t["g_idx"][first:last]
    weight = ff.MarlinLinearWeight.from_gptq(q, t["scales"], t["qzeros"], g_idx, bits=bits, sym=sym,
                                             dtype=DTYPES[dtype_name], group_size=group_size, k_full=False,
                                             shard_layout=layout)
    assert weight.act_order and weight.in_features == last - first
    assert weight.k_full == (layout == "padded")
    if layout == "row_groups":
        assert weight.num_groups == CK // group_size
    reference = gptq_reference_dequant(q, t["scales"], t["qzeros"], g_idx, bits, sym, group_size, False)
    end_to_end(cp, weight, reference, m_values=(1, 12, 20, 33, 100, 300))
    x = activations(40, weight.in_features, weight.dtype, seed=3)
    want = reference_product(cp, x, reference)
    first_out = ff.linear(to_device(cp, x), weight, fp32_reduce=True)
    assert relative_l2(first_out, want) < TOLERANCE[weight.dtype]
    again = ff.linear(to_device(cp, x), weight, fp32_reduce=True)
    assert np.array_equal(to_host(first_out).view(np.uint16), to_host(again).view(np.uint16))
    forced = ff.linear(to_device(cp, x), weight, thread_k=128, thread_n=128)  # the 8-warp tile at any m
    assert relative_l2(forced, want) < TOLERANCE[weight.dtype]


@pytest.mark.parametrize("bits, sym", [(4, True), (4, False), (8, True)])
def test_k_shard_of_a_width_the_wide_tiles_do_not_divide(cp, bits, sym):
    # n % 256 != 0: every m runs the 8-warp kernel's row-group tile.
    t = ql.gptq_layer(np.random.default_rng(bits + 20), 1024, 384, bits=bits, group_size=64, sym=sym, act_order=True)
    q, g_idx = t["qweight"][:384 // (32 // bits)], t["g_idx"][:384]
    w = ff.MarlinLinearWeight.from_gptq(q, t["scales"], t["qzeros"], g_idx, bits=bits, sym=sym, group_size=64,
                                        k_full=False, shard_layout="row_groups")
    end_to_end(cp, w, gptq_reference_dequant(q, t["scales"], t["qzeros"], g_idx, bits, sym, 64, False),
               m_values=(5, 40, 130))


@pytest.mark.parametrize("bits, sym", [(4, True), (4, False)])
def test_k_shard_group_ids_outside_the_scales_are_clamped(cp, bits, sym):
    # K_FULL clear reads g_idx on the device: ids below 0 or past the scales'
    # rows must read row 0 / the last row (header), never outside them.
    t = ql.gptq_layer(np.random.default_rng(9), CK, CN, bits=bits, group_size=128, sym=sym, act_order=True)
    q, g_idx = t["qweight"][:1024 // (32 // bits)], t["g_idx"][:1024]
    w = ff.MarlinLinearWeight.from_gptq(q, t["scales"], t["qzeros"], g_idx, bits=bits, sym=sym, group_size=128,
                                        k_full=False, shard_layout="row_groups")
    order = cp.asnumpy(w.perm)[:1024]
    bad = cp.asnumpy(w.g_idx).copy()
    bad[:5], bad[-7:] = -3, w.num_groups + 5  # still non-decreasing
    clamped = g_idx.copy()
    clamped[order[:5]], clamped[order[-7:]] = 0, w.num_groups - 1
    odd = ff.MarlinLinearWeight(b=w.b, scales=w.scales, k=w.k, n=w.n, group_size=128, b_type=w.b_type,
                                zero_points=w.zero_points, g_idx=cp.asarray(bad), perm=w.perm,
                                in_features=w.in_features, k_full=False)
    end_to_end(cp, odd, gptq_reference_dequant(q, t["scales"], t["qzeros"], clamped, bits, sym, 128, False),
               m_values=(1, 16, 70))


@pytest.mark.parametrize("dtype_name", DTYPES)
@pytest.mark.parametrize("group_size", [-1, 64, 128])
def test_awq_end_to_end(cp, dtype_name, group_size):
    t = ql.awq_layer(np.random.default_rng(2), CK, CN, group_size=group_size)
    weight = ff.MarlinLinearWeight.from_awq(t["qweight"], t["scales"], t["qzeros"], dtype=DTYPES[dtype_name])
    end_to_end(cp, weight, awq_reference_dequant(t["qweight"], t["scales"], t["qzeros"], group_size))


@pytest.mark.parametrize("dtype_name", DTYPES)
@pytest.mark.parametrize("bits, asym", [(4, False), (8, False), (4, True)])
@pytest.mark.parametrize("group_size", [-1, 128])
def test_compressed_tensors_end_to_end(cp, dtype_name, bits, asym, group_size):
    t = ql.ct_layer(np.random.default_rng(3), CK, CN, bits=bits, group_size=group_size, asym=asym, scale_dtype=BF16)
    weight = ff.MarlinLinearWeight.from_compressed_tensors(
        t["weight_packed"], t["weight_scale"], t.get("weight_zero_point"), bits=bits,
        weight_shape=t["weight_shape"], dtype=DTYPES[dtype_name],
    )
    end_to_end(cp, weight, ct_reference_dequant(t["weight_packed"], t["weight_scale"], t.get("weight_zero_point"), bits))


@pytest.mark.parametrize("dtype_name", DTYPES)
@pytest.mark.parametrize("kind", ["tensor", "channel", "block"])
def test_fp8_end_to_end(cp, dtype_name, kind):
    t = ql.fp8_layer(np.random.default_rng(4), CK, CN, kind=kind, scale_dtype=np.float32)
    weight = ff.load_linear({f"l.{k}": v for k, v in t.items()}, "l", DTYPES[dtype_name])
    scale = t.get("weight_scale", t.get("weight_scale_inv"))
    end_to_end(cp, weight, fp8_reference_dequant(t["weight"], scale, (128, 128) if kind == "block" else None))


@pytest.mark.parametrize("dtype_name", DTYPES)
@pytest.mark.parametrize("group_size", [-1, 128])
def test_fp8_every_finite_code(cp, dtype_name, group_size):
    weight_bytes = ql.every_finite_e4m3(N, K)
    scale = np.full((N // 128 + 0, K // 128), 0.03125, np.float32) if group_size == 128 else np.float32(0.03125)
    weight = ff.MarlinLinearWeight.from_fp8(weight_bytes, scale, dtype=DTYPES[dtype_name])
    end_to_end(cp, weight, fp8_reference_dequant(weight_bytes, scale, (128, 128) if group_size == 128 else None),
               m_values=(1, 64))


def test_from_float_is_close_to_the_float_weight(cp):
    w = np.random.default_rng(8).standard_normal((K, N)).astype(np.float32)
    weight = ff.MarlinLinearWeight.from_float(w, bits=8, group_size=128, dtype=BF16)
    x = activations(16, K, BF16)
    out = ff.linear(to_device(cp, x), weight)
    # 8-bit RTN: ~1% relative error of the product is expected.
    assert relative_l2(out, reference_product(cp, x, w.astype(np.float64))) < 0.03


def test_torch_bfloat16_tensors_if_available(cp):
    torch = pytest.importorskip("torch")
    weight = cached_weight(cp, "U4B8", "bf16", 128, False)
    x = torch.randn(9, K, dtype=torch.bfloat16, device="cuda")
    out = ff.linear(x, weight)
    assert isinstance(out, torch.Tensor) and out.dtype == torch.bfloat16
    torch.cuda.synchronize()
    x_host = x.view(torch.int16).cpu().numpy().view(BF16)
    ref = reference_product(cp, x_host, weight.reference_dequant())
    got = out.float().cpu().numpy().astype(np.float64)
    assert np.linalg.norm(got - ref) / np.linalg.norm(ref) < TOLERANCE[BF16]
