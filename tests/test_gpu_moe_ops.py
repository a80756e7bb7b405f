"""The MoE routing and small ops on the GPU against the NumPy references of
tests/moe_reference.py.

Routing is compared exactly (the align kernel is deterministic; the router
ranks the same fp32 logits as the reference, so even tied logits give the
same ids); activations and sums to within two units in the last place of the
output type (fp32 math, one rounding, against float64). Both the 16-byte
vector path (widths % 8 == 0, aligned) and the element path (odd widths, or
arrays starting 2 bytes into an allocation) run.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import ferrum_ffi as ff
from ferrum_ffi import moe_ops
from ferrum_ffi._interop import as_device_array

from . import moe_reference as ref

pytestmark = pytest.mark.gpu

BF16 = np.dtype(pytest.importorskip("ml_dtypes").bfloat16)
F16 = np.dtype(np.float16)
DTYPES = {"f16": F16, "bf16": BF16}
# Two units in the last place: 11 significant bits for fp16, 8 for bf16.
RTOL = {F16: 2.0**-9, BF16: 2.0**-6}
ATOL = 1e-6  # fp16 subnormals


# ---- arrays ------------------------------------------------------------------------------------


def to_device(cp, host: np.ndarray, offset: int = 0):
    """A C-contiguous device copy of ``host``, starting ``offset`` elements into
    its allocation (offset 1 breaks 16-byte alignment); bfloat16 as uint16 bits
    behind ``ff.bfloat16_view``, which every CuPy version can hold."""
    bits = host.dtype == BF16
    flat = np.ascontiguousarray(host).reshape(-1)
    storage = cp.empty(flat.size + offset, dtype=np.uint16 if bits else host.dtype)
    view = storage[offset:].reshape(host.shape)
    view[...] = cp.asarray(flat.view(np.uint16) if bits else flat).reshape(host.shape)
    return ff.bfloat16_view(view) if bits else view


def to_host(array) -> np.ndarray:
    if isinstance(array, ff.Bfloat16Array):
        return array.base.get().view(BF16)
    return array.get()


def random(rng, shape, dtype, scale=1.0) -> np.ndarray:
    return (rng.standard_normal(shape) * scale).astype(np.float32).astype(dtype)


def assert_close(out, expected: np.ndarray, dtype: np.dtype, what: str) -> None:
    got = to_host(out).astype(np.float64)
    np.testing.assert_allclose(got, expected, rtol=RTOL[dtype], atol=ATOL, err_msg=what)


# ---- moe_align_block_size -----------------------------------------------------------------------


def routed_ids(rng, m: int, top_k: int, num_experts: int) -> np.ndarray:
    """A router's output: top_k distinct experts per token (repeats once top_k > E)."""
    if top_k <= num_experts:
        return rng.random((m, num_experts)).argsort(axis=1)[:, :top_k].astype(np.int32)
    return rng.integers(0, num_experts, size=(m, top_k), dtype=np.int32)


def expert_parallel_map(rng, num_experts: int) -> np.ndarray:
    """Global -> local ids of a rank that owns half the experts; -1 elsewhere."""
    mapping = np.full(num_experts, -1, dtype=np.int32)
    owned = rng.choice(num_experts, max(1, num_experts // 2), replace=False)
    mapping[owned] = np.arange(owned.size, dtype=np.int32)
    return mapping


def check_align(cp, topk_ids: np.ndarray, num_experts: int, block_size: int, expert_map=None, out=None):
    device_map = None if expert_map is None else cp.asarray(expert_map)
    got = moe_ops.moe_align_block_size(cp.asarray(topk_ids), num_experts, block_size, device_map, out=out)
    capacities = {} if out is None else dict(sorted_capacity=out[0].size, expert_ids_capacity=out[1].size)
    expected = ref.moe_align_block_size(topk_ids, num_experts, block_size, expert_map, **capacities)
    what = f"M={topk_ids.shape[0]} top_k={topk_ids.shape[1]} E={num_experts} block={block_size} " \
           f"map={expert_map is not None}"
    for name, g, e in zip(("sorted_token_ids", "expert_ids", "num_tokens_post_padded"), got, expected):
        np.testing.assert_array_equal(g.get(), e, err_msg=f"{name}: {what}")


@pytest.mark.parametrize("num_experts, block_size", list(itertools.product((8, 64, 128), (8, 16, 32, 48, 64))))
def test_align_grid(cp, num_experts, block_size):
    rng = np.random.default_rng(num_experts * 100 + block_size)
    for m, top_k, mapped in itertools.product((1, 4, 16, 64, 512), (1, 2, 8), (False, True)):
        expert_map = expert_parallel_map(rng, num_experts) if mapped else None
        check_align(cp, routed_ids(rng, m, top_k, num_experts), num_experts, block_size, expert_map)


@pytest.mark.parametrize("m, top_k, num_experts, block_size", [
    (4096, 8, 1024, 64),  # the widest expert set: 8 segments of 4096 ids
    (3000, 6, 512, 16),
    (2048, 8, 256, 32),
    (777, 3, 160, 24),  # block sizes need not be powers of two
    (50, 4, 1, 1),
    (1, 1, 1, 64),
])
def test_align_large_and_odd_shapes(cp, m, top_k, num_experts, block_size):
    rng = np.random.default_rng(m)
    check_align(cp, routed_ids(rng, m, top_k, num_experts), num_experts, block_size)
    check_align(cp, routed_ids(rng, m, top_k, num_experts), num_experts, block_size,
                expert_parallel_map(rng, num_experts))


def test_align_drops_out_of_range_ids_and_keeps_repeats(cp):
    rng = np.random.default_rng(7)
    topk_ids = rng.integers(-3, 20, size=(300, 4), dtype=np.int32)  # E = 16: ids -3..-1 and 16..19 dropped
    topk_ids[0] = [-(2**31), 2**31 - 1, 5, 5]
    check_align(cp, topk_ids, 16, 16)


def test_align_writes_every_entry_of_larger_outputs(cp):
    rng = np.random.default_rng(8)
    topk_ids = routed_ids(rng, 33, 8, 64)
    capacity, blocks = moe_ops.align_capacity(33, 8, 64, 16)
    out = tuple(cp.full(n, 12345, dtype=cp.int32) for n in (capacity + 100, blocks + 17, 1))
    check_align(cp, topk_ids, 64, 16, out=out)


@pytest.mark.parametrize("clear_bytes", [16, 48_000, 3 * 1024 * 1024 + 16])
def test_align_clears_a_buffer_beside_the_routing(cp, clear_bytes):
    # One extra block per 256 KB (at most 128, each then looping): tiny, one-pass and looped sizes.
    rng = np.random.default_rng(9)
    topk_ids = routed_ids(rng, 37, 4, 16)
    clear = cp.full(clear_bytes // 2, -5, dtype=cp.int16)
    out, call = moe_ops.align_call(cp.asarray(topk_ids), 16, 16, None, None, None,
                                   clear=as_device_array(clear, "clear"))
    assert call.entry == "ferrum_moe_align_block_size_ex"
    call.run(ff._native.library())
    assert int(cp.count_nonzero(clear)) == 0
    expected = ref.moe_align_block_size(topk_ids, 16, 16, None)
    for g, e in zip(out, expected):
        np.testing.assert_array_equal(g.get(), e)


# ---- topk_softmax -------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [F16, BF16, np.dtype(np.float32)], ids=["f16", "bf16", "f32"])
def test_topk_softmax(cp, dtype):
    rng = np.random.default_rng(1)
    for m, num_experts, top_k in [(1, 8, 2), (37, 8, 8), (37, 60, 4), (64, 128, 8), (5, 256, 8),
                                  (9, 257, 1), (3, 1000, 16), (4, 1024, 32), (130, 32, 6)]:
        logits = random(rng, (m, num_experts), dtype, scale=3.0)
        for renormalize in (True, False):
            weights, ids = moe_ops.topk_softmax(to_device(cp, logits), top_k, renormalize)
            expected_weights, expected_ids = ref.topk_softmax(logits, top_k, renormalize)
            what = f"M={m} E={num_experts} top_k={top_k} renormalize={renormalize}"
            np.testing.assert_array_equal(ids.get(), expected_ids, err_msg=what)
            np.testing.assert_allclose(weights.get(), expected_weights, rtol=1e-5, atol=1e-7, err_msg=what)


def test_topk_softmax_ties_infinities_and_nan(cp):
    logits = np.array([
        [0.5] * 16,  # all tied: ids 0.. in order
        [1.0, -np.inf, 1.0, 3.0] + [-np.inf] * 12,  # -inf still ranks, after every finite logit
        [np.nan, 2.0, np.nan, 2.0] + [0.0] * 12,  # NaN ranks and weighs as -inf
    ], dtype=np.float32)
    weights, ids = moe_ops.topk_softmax(to_device(cp, logits), 6, renormalize=False)
    expected_weights, expected_ids = ref.topk_softmax(logits, 6, renormalize=False)
    assert ids.get().tolist() == expected_ids.tolist()
    assert expected_ids.tolist()[:2] == [[0, 1, 2, 3, 4, 5], [3, 0, 2, 1, 4, 5]]
    np.testing.assert_allclose(weights.get(), expected_weights, rtol=1e-6, atol=0)


# ---- silu_and_mul, gpt_oss_swiglu, moe_sum ------------------------------------------------------

WIDTHS = (1, 7, 8, 13, 64, 768)  # odd, % 8 == 0 (vector path), and a model's width
OFFSETS = (0, 1)  # aligned, and 2 bytes off: the element path for every width


@pytest.mark.parametrize("dtype_name", DTYPES)
def test_silu_and_mul(cp, dtype_name):
    dtype = DTYPES[dtype_name]
    rng = np.random.default_rng(2)
    for d, rows, offset in itertools.product(WIDTHS, (1, 5, 130), OFFSETS):
        x = random(rng, (rows, 2 * d), dtype, scale=3.0)
        out = moe_ops.silu_and_mul(to_device(cp, x, offset))
        assert_close(out, ref.silu_and_mul(x), dtype, f"d={d} rows={rows} offset={offset}")
    x = random(rng, (2, 3, 32), dtype)  # leading dimensions are rows
    assert_close(moe_ops.silu_and_mul(to_device(cp, x)), ref.silu_and_mul(x), dtype, "3-D")


@pytest.mark.parametrize("dtype_name", DTYPES)
def test_gpt_oss_swiglu(cp, dtype_name):
    dtype = DTYPES[dtype_name]
    rng = np.random.default_rng(3)
    for logical_d, pad, rows, offset in itertools.product((1, 5, 8, 64, 360), (0, 3, 8), (1, 9), OFFSETS):
        x = random(rng, (rows, 2 * logical_d), dtype, scale=6.0)  # reaches the clamps at 7
        physical_d = logical_d + pad
        out = moe_ops.gpt_oss_swiglu(to_device(cp, x, offset), physical_d)
        assert_close(out, ref.gpt_oss_swiglu(x, physical_d), dtype,
                     f"logical_d={logical_d} physical_d={physical_d} rows={rows} offset={offset}")
    x = random(rng, (4, 48), dtype, scale=6.0)
    out = moe_ops.gpt_oss_swiglu(to_device(cp, x), 32, alpha=1.0, limit=2.5)
    assert_close(out, ref.gpt_oss_swiglu(x, 32, alpha=1.0, limit=2.5), dtype, "alpha=1 limit=2.5")


@pytest.mark.parametrize("dtype_name", DTYPES)
def test_moe_sum(cp, dtype_name):
    dtype = DTYPES[dtype_name]
    rng = np.random.default_rng(4)
    for d, top_k, tokens, offset in itertools.product((1, 7, 8, 96, 2880), (1, 2, 8), (1, 3, 65), OFFSETS):
        x = random(rng, (tokens * top_k, d), dtype)
        out = moe_ops.moe_sum(to_device(cp, x, offset), top_k)
        assert_close(out, ref.moe_sum(x, top_k), dtype, f"d={d} top_k={top_k} tokens={tokens} offset={offset}")
    x = random(rng, (5, 4, 24), dtype)
    out = moe_ops.moe_sum(to_device(cp, x), 4)
    assert_close(out, ref.moe_sum(x.reshape(20, 24), 4), dtype, "[tokens, top_k, d]")


# ---- streams and graphs -------------------------------------------------------------------------


def test_the_routing_and_ops_replay_from_a_graph(cp):
    """Every op into preallocated outputs on a non-default stream, captured once
    and replayed: nothing allocates or synchronises."""
    rng = np.random.default_rng(5)
    m, num_experts, top_k, block_size, d = 16, 64, 8, 16, 64
    logits = random(rng, (m, num_experts), F16)
    act_in = random(rng, (m * top_k, 2 * d), F16)
    capacity, blocks = moe_ops.align_capacity(m, top_k, num_experts, block_size)
    x_logits, x_act = to_device(cp, logits), to_device(cp, act_in)
    routing = (cp.empty((m, top_k), cp.float32), cp.empty((m, top_k), cp.int32))
    aligned = (cp.empty(capacity, cp.int32), cp.empty(blocks, cp.int32), cp.empty(1, cp.int32))
    act, summed = cp.empty((m * top_k, d), cp.float16), cp.empty((m, d), cp.float16)
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        stream.begin_capture()
        moe_ops.topk_softmax(x_logits, top_k, out=routing, stream=stream)
        moe_ops.moe_align_block_size(routing[1], num_experts, block_size, out=aligned, stream=stream)
        moe_ops.silu_and_mul(x_act, act, stream=stream)
        moe_ops.moe_sum(act, top_k, summed, stream=stream)
        graph = stream.end_capture()
        graph.launch(stream)
    stream.synchronize()
    _, expected_ids = ref.topk_softmax(logits, top_k)
    np.testing.assert_array_equal(routing[1].get(), expected_ids)
    for got, expected in zip(aligned, ref.moe_align_block_size(expected_ids, num_experts, block_size)):
        np.testing.assert_array_equal(got.get(), expected)
    expected_act = ref.silu_and_mul(act_in)
    assert_close(act, expected_act, F16, "silu_and_mul")
    assert_close(summed, ref.moe_sum(to_host(act), top_k), F16, "moe_sum")
