"""The MoE routing and small ops on the CPU: the NumPy references against
hand-computed cases, and every argument rule of ferrum_ffi.moe_ops rejected
before the native call next to its valid neighbour (a fake library records
the calls; fake device arrays are only a ``__cuda_array_interface__``)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest

from ferrum_ffi import moe_ops
from ferrum_ffi._abi import FERRUM_DTYPE_BF16, FERRUM_DTYPE_F16, FERRUM_DTYPE_F32
from ferrum_ffi._interop import as_device_array
from ferrum_ffi._native import NativeLibrary
from ferrum_ffi.status import ArgumentError, ArgumentTypeError, NativeError

from . import moe_reference as ref
from .mm_fakes import FakeCAI, bf16_cai

# ---- the references, by hand ------------------------------------------------------------

# t = token * top_k + slot:      t=0  1  2  3  4  5  6   7
HAND_IDS = np.array([[2, 0], [0, 3], [2, 2], [-1, 4]], dtype=np.int32)  # E=4: -1 and 4 are dropped


def test_align_reference_by_hand():
    sorted_ids, expert_ids, used = ref.moe_align_block_size(HAND_IDS, 4, 4)
    pad = 8  # num_tokens * top_k
    assert used.tolist() == [12]
    assert sorted_ids.tolist() == [1, 2, pad, pad,   0, 4, 5, pad,   3, pad, pad, pad] + [pad] * 8
    assert len(sorted_ids) == 8 + 4 * 3  # capacity: every id plus block_size - 1 per expert
    assert expert_ids.tolist() == [0, 2, 3, -1, -1]  # expert 1 has no ids, no block


def test_align_reference_maps_experts():
    _, expert_ids, used = ref.moe_align_block_size(HAND_IDS, 4, 4, expert_map=np.array([-1, 5, 0, -1]))
    assert used.tolist() == [12]
    assert expert_ids.tolist() == [-1, 0, -1, -1, -1]


def test_align_reference_with_block_size_one_is_a_stable_sort():
    sorted_ids, expert_ids, used = ref.moe_align_block_size(HAND_IDS, 4, 1)
    assert used.tolist() == [6]
    assert sorted_ids[:6].tolist() == [1, 2, 0, 4, 5, 3]
    assert expert_ids.tolist() == [0, 0, 2, 2, 2, 3, -1, -1]  # capacity 8: nothing to pad


def test_align_reference_keeps_every_id_once_in_its_experts_blocks():
    rng = np.random.default_rng(0)
    topk = rng.integers(-2, 20, size=(37, 3)).astype(np.int32)
    sorted_ids, expert_ids, used = ref.moe_align_block_size(topk, 18, 8)
    flat, n = topk.reshape(-1), int(used[0])
    real = sorted_ids[:n][sorted_ids[:n] < flat.size]
    assert sorted(real.tolist()) == [t for t in range(flat.size) if 0 <= flat[t] < 18]
    for block in range(n // 8):
        members = sorted_ids[block * 8:(block + 1) * 8]
        members = members[members < flat.size]
        assert (flat[members] == expert_ids[block]).all()
        assert (np.diff(members) > 0).all()
    assert (sorted_ids[n:] == flat.size).all() and (expert_ids[n // 8:] == -1).all()
    assert moe_ops.align_capacity(37, 3, 18, 8) == ref.align_capacity(37, 3, 18, 8) == (37 * 3 + 18 * 7, 30)


def test_topk_softmax_reference_by_hand():
    logits = np.array([[1.0, 3.0, 3.0, 0.0], [0.0, -1.0, 2.0, np.nan]], dtype=np.float32)
    weights, ids = ref.topk_softmax(logits, 2, renormalize=False)
    assert ids.tolist() == [[1, 2], [2, 0]]  # equal logits: the lower id first; NaN ranks last
    e = math.e
    denominator = e + 2 * e**3 + 1
    np.testing.assert_allclose(weights[0], [e**3 / denominator] * 2)
    np.testing.assert_allclose(weights[1], [e**2 / (1 + e**-1 + e**2), 1 / (1 + e**-1 + e**2)])
    renormalised, _ = ref.topk_softmax(logits, 2, renormalize=True)
    np.testing.assert_allclose(renormalised, [[0.5, 0.5], [e**2 / (e**2 + 1), 1 / (e**2 + 1)]])


def test_silu_and_mul_reference_by_hand():
    out = ref.silu_and_mul(np.array([[0.0, 1.0, 2.0, 3.0], [-2.0, 4.0, 0.5, -1.0]]))
    silu = lambda g: g / (1 + math.exp(-g))  # noqa: E731
    np.testing.assert_allclose(out, [[0.0, silu(1.0) * 3.0], [silu(-2.0) * 0.5, silu(4.0) * -1.0]])


def test_gpt_oss_swiglu_reference_by_hand():
    sigmoid = lambda z: 1 / (1 + math.exp(-z))  # noqa: E731
    # pairs (gate, up): (8, 10) clamps both to 7; (-1, 0.5) passes; (2, -9) clamps up to -7.
    out = ref.gpt_oss_swiglu(np.array([[8.0, 10.0, -1.0, 0.5, 2.0, -9.0]]), physical_d=5, alpha=1.0, limit=7.0)
    expected = [8 * 7 * sigmoid(7), 1.5 * -1 * sigmoid(-1), -6 * 2 * sigmoid(2), 0.0, 0.0]
    np.testing.assert_allclose(out, [expected])
    np.testing.assert_allclose(ref.gpt_oss_swiglu(np.array([[3.0, 1.0]]), alpha=2.0, limit=float("inf")),
                               [[2 * 3 * sigmoid(6)]])


def test_moe_sum_reference_by_hand():
    x = np.array([[1, 2], [3, 4], [5, 6], [7, 8], [9, 10], [11, 12]], dtype=np.float16)
    np.testing.assert_array_equal(ref.moe_sum(x, 2), [[4, 6], [12, 14], [20, 22]])
    np.testing.assert_array_equal(ref.moe_sum(x, 3), [[9, 12], [27, 30]])


# ---- a fake library and fake device arrays ------------------------------------------------


class FakeOpsLibrary:
    """Records every ``ferrum_*`` call and answers ``status``."""

    check = NativeLibrary.check

    def __init__(self):
        self.status = 0
        self.calls: list[tuple[str, tuple]] = []
        self.cdll = SimpleNamespace(ferrum_marlin_cuda_error_name=lambda code: b"cudaErrorInvalidValue")

    def __getattr__(self, name):
        if not name.startswith("ferrum_"):
            raise AttributeError(name)

        def call(*args):
            self.calls.append((name, args))
            return self.status

        return call

    def last_error(self) -> str:
        return "fake native detail" if self.status else ""

    @property
    def args(self) -> tuple:
        assert len(self.calls) == 1, self.calls
        return self.calls[0][1]


@pytest.fixture
def lib(monkeypatch):
    fake = FakeOpsLibrary()
    fake.allocations = []

    def allocate(like, view, shape, dtype, device, stream=None):
        dtype = np.dtype(dtype)
        fake.allocations.append((tuple(shape), dtype, device))
        if dtype.name == "bfloat16":
            return bf16_cai(shape)
        return FakeCAI(shape, dtype.str)

    monkeypatch.setattr(moe_ops, "library", lambda: fake)
    monkeypatch.setattr(moe_ops, "allocate", allocate)
    monkeypatch.setattr(moe_ops, "device_of", lambda obj, view: getattr(obj, "device_id", 0))
    return fake


def on_device(array, device):
    array.device_id = device
    return array


def i32(*shape, **kwargs):
    return FakeCAI(shape, "<i4", **kwargs)


def f16(*shape, **kwargs):
    return FakeCAI(shape, "<f2", **kwargs)


def ptr(array) -> int:
    return array.__cuda_array_interface__["data"][0]


# ---- moe_align_block_size ---------------------------------------------------------------


def test_align_allocates_the_capacities_and_passes_them(lib):
    ids = i32(4, 8)
    sorted_ids, expert_ids, used = moe_ops.moe_align_block_size(ids, 128, 16, stream=5)
    capacity = 4 * 8 + 128 * 15
    assert lib.allocations == [((capacity,), np.dtype(np.int32), 0), ((-(-capacity // 16),), np.dtype(np.int32), 0),
                               ((1,), np.dtype(np.int32), 0)]
    assert lib.calls[0][0] == "ferrum_moe_align_block_size"
    assert lib.args == (ptr(ids), 4, 8, 128, 16, None, ptr(sorted_ids), capacity, ptr(expert_ids),
                        -(-capacity // 16), ptr(used), 0, 5)


def test_align_passes_the_expert_map(lib):
    ids, mapping = i32(1, 2), i32(8)
    moe_ops.moe_align_block_size(ids, 8, 8, expert_map=mapping)
    assert lib.args[5] == ptr(mapping)


@pytest.mark.parametrize("expert_map, match, exc", [
    (FakeCAI((8,), "<i8"), "expert_map must have dtype int32", ArgumentTypeError),
    (i32(7), r"expert_map must have shape \(8,\)", ArgumentError),
    (i32(8, 1), "expert_map must be 1-D", ArgumentError),
    (on_device(i32(8), 1), "expert_map is on device 1", ArgumentError),
])
def test_align_rejects_a_bad_expert_map(lib, expert_map, match, exc):
    with pytest.raises(exc, match=match):
        moe_ops.moe_align_block_size(i32(1, 2), 8, 8, expert_map=expert_map)
    assert lib.calls == []


@pytest.mark.parametrize("topk_ids, match, exc", [
    (FakeCAI((2, 2), "<i8"), "topk_ids must have dtype int32", ArgumentTypeError),
    (i32(4), "topk_ids must be 2-D", ArgumentError),
    (i32(2, 2, strides=(4, 8)), "topk_ids must be C-contiguous", ArgumentError),
    (i32(2, 2, ptr=0x1002), "topk_ids pointer 0x1002 must be 4-byte aligned", ArgumentError),
    (i32(0, 8), r"topk_ids must be \[num_tokens >= 1, top_k >= 1\]", ArgumentError),
    (i32(3, 0), r"topk_ids must be \[num_tokens >= 1, top_k >= 1\]", ArgumentError),
    (i32(2**28, 8), "num_tokens \\* top_k=2147483648 does not fit in int32", ArgumentError),
])
def test_align_rejects_bad_topk_ids(lib, topk_ids, match, exc):
    with pytest.raises(exc, match=match):
        moe_ops.moe_align_block_size(topk_ids, 8, 8)
    assert lib.calls == []


def test_align_call_with_a_clear_buffer_takes_the_ex_entry(lib):
    ids, clear = i32(4, 8), f16(8, 64)
    _, call = moe_ops.align_call(ids, 128, 16, None, None, 5, clear=as_device_array(clear, "clear"))
    assert call.entry == "ferrum_moe_align_block_size_ex"
    assert call.args[13:] == (ptr(clear), 8 * 64 * 2) and call.args[12] == 5


@pytest.mark.parametrize("clear, match", [
    (f16(8, 64, ptr=0x10008), "clear must be 16-byte aligned and a positive multiple of 16 bytes"),
    (f16(3, 3), "clear must be 16-byte aligned and a positive multiple of 16 bytes, got 18 bytes"),
    (f16(8, 64, readonly=True), "clear is read-only"),
])
def test_align_call_rejects_a_bad_clear_buffer(lib, clear, match):
    with pytest.raises(ArgumentError, match=match):
        moe_ops.align_call(i32(4, 8), 128, 16, None, None, 0, clear=as_device_array(clear, "clear"))


def test_align_call_rejects_a_clear_buffer_over_the_routing(lib):
    ids = i32(4, 8)
    out = moe_ops.moe_align_block_size(ids, 128, 16)
    with pytest.raises(ArgumentError, match="clear overlaps a routing array"):
        moe_ops.align_call(ids, 128, 16, None, out, 0, clear=as_device_array(out[0], "clear"))


def test_align_takes_an_aligned_topk_ids_view(lib):
    moe_ops.moe_align_block_size(i32(1, 1, ptr=0x1004), 1, 1)
    assert lib.args[1:5] == (1, 1, 1, 1)


@pytest.mark.parametrize("num_experts, block_size, match, exc", [
    (0, 8, "num_experts=0 must be >= 1", ArgumentError),
    (1025, 8, "num_experts=1025 exceeds the 1024 experts", ArgumentError),
    (8.0, 8, "num_experts must be an integer", ArgumentTypeError),
    (True, 8, "num_experts must be an integer", ArgumentTypeError),
    (8, 0, "block_size=0 must be >= 1", ArgumentError),
    (8, -16, "block_size=-16 must be >= 1", ArgumentError),
    (8, None, "block_size must be an integer", ArgumentTypeError),
])
def test_align_rejects_bad_sizes(lib, num_experts, block_size, match, exc):
    with pytest.raises(exc, match=match):
        moe_ops.moe_align_block_size(i32(2, 2), num_experts, block_size)
    assert lib.calls == []


@pytest.mark.parametrize("num_experts, block_size", [(1024, 8), (1, 1), (64, 48), (np.int64(8), np.int32(3))])
def test_align_accepts_the_edges_of_the_sizes(lib, num_experts, block_size):
    moe_ops.moe_align_block_size(i32(2, 2), num_experts, block_size)
    assert lib.args[3:5] == (num_experts, block_size)


def test_align_rejects_a_capacity_beyond_int32(lib):
    # 2^30 ids fit; 1024 experts * 2^20 padding slots more do not.
    with pytest.raises(ArgumentError, match=r"num_tokens \* top_k \+ num_experts \* \(block_size - 1\)=2147483648"):
        moe_ops.moe_align_block_size(i32(2**30, 1), 1024, 2**20 + 1)
    moe_ops.moe_align_block_size(i32(2**30, 1), 1024, 2**20)
    assert lib.args[7] == 2**30 + 1024 * (2**20 - 1)


def align_out(sorted_n, blocks, count=(1,)):
    return i32(sorted_n), i32(blocks), i32(*count)


def test_align_writes_into_given_outputs_of_enough_capacity(lib):
    capacity, blocks = moe_ops.align_capacity(3, 2, 4, 8)
    out = align_out(capacity + 5, blocks + 1)
    assert moe_ops.moe_align_block_size(i32(3, 2), 4, 8, out=out) == out
    assert lib.allocations == []
    assert lib.args[6:11] == (ptr(out[0]), capacity + 5, ptr(out[1]), blocks + 1, ptr(out[2]))


@pytest.mark.parametrize("change, match, exc", [
    (lambda c, b: align_out(c - 1, b), f"sorted_token_ids holds {6 + 28 - 1} entries, needs at least {6 + 28}",
     ArgumentError),
    (lambda c, b: align_out(c, b - 1), "expert_ids holds 4 entries, needs at least 5", ArgumentError),
    (lambda c, b: align_out(c, b, (2,)), r"num_tokens_post_padded must have shape \(1,\)", ArgumentError),
    (lambda c, b: (i32(c, 1), i32(b), i32(1)), "sorted_token_ids must be 1-D", ArgumentError),
    (lambda c, b: (FakeCAI((c,), "<u4"), i32(b), i32(1)), "sorted_token_ids must have dtype int32",
     ArgumentTypeError),
    (lambda c, b: (i32(c), i32(b, readonly=True), i32(1)), "expert_ids is read-only", ArgumentError),
    (lambda c, b: (i32(c), i32(b), on_device(i32(1), 2)), "num_tokens_post_padded is on device 2", ArgumentError),
    (lambda c, b: align_out(c, b)[:2], "out must be a tuple", ArgumentTypeError),
])
def test_align_rejects_bad_outputs(lib, change, match, exc):
    capacity, blocks = moe_ops.align_capacity(3, 2, 4, 8)
    assert (capacity, blocks) == (34, 5)
    with pytest.raises(exc, match=match):
        moe_ops.moe_align_block_size(i32(3, 2), 4, 8, out=change(capacity, blocks))
    assert lib.calls == []


def test_align_turns_a_native_failure_into_a_native_error(lib):
    lib.status = (8 << 16) | 1
    with pytest.raises(NativeError, match="fake native detail") as info:
        moe_ops.moe_align_block_size(i32(2, 2), 8, 8)
    assert info.value.entry_point == "ferrum_moe_align_block_size"
    assert info.value.stage_name == "shape"
    assert info.value.shape == {"num_tokens": 2, "top_k": 2, "num_experts": 8, "block_size": 8}


# ---- topk_softmax -----------------------------------------------------------------------


@pytest.mark.parametrize("make, dtype_id", [
    (lambda: f16(5, 64), FERRUM_DTYPE_F16),
    (lambda: bf16_cai((5, 64)), FERRUM_DTYPE_BF16),
    (lambda: FakeCAI((5, 64), "<f4"), FERRUM_DTYPE_F32),
])
def test_topk_softmax_passes_the_dtype_and_allocates_fp32_weights_and_int32_ids(lib, make, dtype_id):
    logits = make()
    weights, ids = moe_ops.topk_softmax(logits, 8)
    assert lib.allocations == [((5, 8), np.dtype(np.float32), 0), ((5, 8), np.dtype(np.int32), 0)]
    assert lib.args == (ptr(logits), dtype_id, 5, 64, 8, 1, ptr(weights), ptr(ids), 0, 0)


def test_topk_softmax_without_renormalisation_into_given_outputs(lib):
    out = (FakeCAI((3, 2), "<f4"), i32(3, 2))
    assert moe_ops.topk_softmax(f16(3, 4), 2, renormalize=False, out=out) == out
    assert lib.args[5] == 0 and lib.allocations == []


@pytest.mark.parametrize("logits, top_k, match, exc", [
    (i32(2, 8), 2, "logits must have dtype float16, bfloat16 or float32", ArgumentTypeError),
    (FakeCAI((2, 8), "<f8"), 2, "logits must have dtype float16, bfloat16 or float32", ArgumentTypeError),
    (f16(8), 2, r"logits must be 2-D \[num_tokens, num_experts\]", ArgumentError),
    (f16(2, 2, 8), 2, r"logits must be 2-D \[num_tokens, num_experts\]", ArgumentError),
    (f16(0, 8), 2, "logits must not be empty", ArgumentError),
    (f16(2, 8, strides=(2, 4)), 2, "logits must be C-contiguous", ArgumentError),
    (f16(2, 8, ptr=0x1001), 2, "logits pointer 0x1001 must be 2-byte aligned", ArgumentError),
    (FakeCAI((2, 8), "<f4", ptr=0x1002), 2, "logits pointer 0x1002 must be 4-byte aligned", ArgumentError),
    (f16(2, 1025), 2, "logits has 1025 experts", ArgumentError),
    (f16(2, 8), 0, "top_k=0 must be >= 1", ArgumentError),
    (f16(2, 8), 9, "top_k=9 must be <= num_experts=8", ArgumentError),
    (f16(2, 8), 2.0, "top_k must be an integer", ArgumentTypeError),
])
def test_topk_softmax_rejects(lib, logits, top_k, match, exc):
    with pytest.raises(exc, match=match):
        moe_ops.topk_softmax(logits, top_k)
    assert lib.calls == []


@pytest.mark.parametrize("experts, top_k", [(1024, 1024), (1, 1), (8, 8)])
def test_topk_softmax_accepts_the_edges(lib, experts, top_k):
    moe_ops.topk_softmax(f16(2, experts, ptr=0x1002), top_k)
    assert lib.args[3:5] == (experts, top_k)


def test_topk_softmax_rejects_a_non_bool_renormalize(lib):
    with pytest.raises(ArgumentTypeError, match="renormalize must be a bool"):
        moe_ops.topk_softmax(f16(2, 8), 2, renormalize=1)
    moe_ops.topk_softmax(f16(2, 8), 2, renormalize=np.bool_(False))
    assert lib.args[5] == 0


@pytest.mark.parametrize("out, match, exc", [
    ((FakeCAI((2, 3), "<f4"), i32(2, 2)), r"weights must have shape \(2, 2\)", ArgumentError),
    ((f16(2, 2), i32(2, 2)), "weights must have dtype float32", ArgumentTypeError),
    ((FakeCAI((2, 2), "<f4"), FakeCAI((2, 2), "<i8")), "ids must have dtype int32", ArgumentTypeError),
    ((FakeCAI((2, 2), "<f4"), on_device(i32(2, 2), 3)), "ids is on device 3", ArgumentError),
    ((FakeCAI((2, 2), "<f4"),), "out must be a tuple", ArgumentTypeError),
])
def test_topk_softmax_rejects_bad_outputs(lib, out, match, exc):
    with pytest.raises(exc, match=match):
        moe_ops.topk_softmax(f16(2, 8), 2, out=out)
    assert lib.calls == []


# ---- silu_and_mul -------------------------------------------------------------------------


def test_silu_and_mul_counts_rows_over_leading_dimensions(lib):
    x = f16(2, 3, 16)
    out = moe_ops.silu_and_mul(x, stream=9)
    assert lib.allocations == [((2, 3, 8), np.dtype(np.float16), 0)]
    assert lib.args == (ptr(x), ptr(out), 6, 8, FERRUM_DTYPE_F16, 0, 9)


def test_silu_and_mul_bf16_with_an_odd_d_into_a_given_output(lib):
    x, out = bf16_cai((4, 6)), bf16_cai((4, 3))
    assert moe_ops.silu_and_mul(x, out) is out
    assert lib.args[2:5] == (4, 3, FERRUM_DTYPE_BF16)


def test_silu_and_mul_leaves_16_byte_alignment_to_the_native_side(lib):
    moe_ops.silu_and_mul(f16(1, 16, ptr=0x1002))  # the kernel falls back to scalar loads
    assert lib.args[2:4] == (1, 8)


@pytest.mark.parametrize("x, match, exc", [
    (f16(4, 7), r"x's last dimension \(7\) must be even", ArgumentError),
    (FakeCAI((4, 8), "<f4"), "x must have dtype float16 or bfloat16", ArgumentTypeError),
    (f16(0, 8), "x must not be empty", ArgumentError),
    (f16(4, 8, ptr=0x1001), "x pointer 0x1001 must be 2-byte aligned", ArgumentError),
    (f16(4, 8, strides=(2, 8)), "x must be C-contiguous", ArgumentError),
    (f16(2**31, 2), r"rows \(product of x.shape\[:-1\]\)=2147483648 does not fit in int32", ArgumentError),
])
def test_silu_and_mul_rejects(lib, x, match, exc):
    with pytest.raises(exc, match=match):
        moe_ops.silu_and_mul(x)
    assert lib.calls == []


@pytest.mark.parametrize("out, match, exc", [
    (f16(4, 8), r"out must have shape \(4, 4\)", ArgumentError),
    (bf16_cai((4, 4)), "out must have dtype float16", ArgumentTypeError),
    (f16(4, 4, readonly=True), "out is read-only", ArgumentError),
    (on_device(f16(4, 4), 1), "out is on device 1, the input on device 0", ArgumentError),
])
def test_silu_and_mul_rejects_bad_outputs(lib, out, match, exc):
    with pytest.raises(exc, match=match):
        moe_ops.silu_and_mul(f16(4, 8), out)
    assert lib.calls == []


# ---- gpt_oss_swiglu -----------------------------------------------------------------------


def test_gpt_oss_swiglu_defaults(lib):
    x = f16(3, 10)
    out = moe_ops.gpt_oss_swiglu(x)
    assert lib.allocations == [((3, 5), np.dtype(np.float16), 0)]
    assert lib.args == (ptr(x), ptr(out), 3, 5, 5, pytest.approx(1.702), 7.0, FERRUM_DTYPE_F16, 0, 0)


def test_gpt_oss_swiglu_pads_to_physical_d(lib):
    moe_ops.gpt_oss_swiglu(bf16_cai((2, 2, 16)), physical_d=16, alpha=np.float32(2.0), limit=float("inf"))
    assert lib.allocations == [((2, 2, 16), np.dtype("bfloat16"), 0)]
    assert lib.args[2:8] == (4, 8, 16, 2.0, float("inf"), FERRUM_DTYPE_BF16)


@pytest.mark.parametrize("kwargs, match, exc", [
    (dict(physical_d=4), "physical_d=4 must be >= logical_d=5", ArgumentError),
    (dict(physical_d=8.0), "physical_d must be an integer", ArgumentTypeError),
    (dict(alpha=float("nan")), "alpha must not be NaN", ArgumentError),
    (dict(alpha="1.7"), "alpha must be a real number", ArgumentTypeError),
    (dict(limit=-1.0), "limit=-1.0 must be >= 0", ArgumentError),
    (dict(limit=float("nan")), "limit must not be NaN", ArgumentError),
    (dict(out=f16(3, 6)), r"out must have shape \(3, 5\)", ArgumentError),
])
def test_gpt_oss_swiglu_rejects(lib, kwargs, match, exc):
    with pytest.raises(exc, match=match):
        moe_ops.gpt_oss_swiglu(f16(3, 10), **kwargs)
    assert lib.calls == []


def test_gpt_oss_swiglu_rejects_an_odd_width(lib):
    with pytest.raises(ArgumentError, match="must be even: interleaved"):
        moe_ops.gpt_oss_swiglu(f16(3, 9))
    moe_ops.gpt_oss_swiglu(f16(3, 10), physical_d=5, limit=0.0)
    assert lib.args[3:5] == (5, 5)


# ---- moe_sum ---------------------------------------------------------------------------------


def test_moe_sum_of_gemm_rows(lib):
    x = f16(12, 24)
    out = moe_ops.moe_sum(x, 4)
    assert lib.allocations == [((3, 24), np.dtype(np.float16), 0)]
    assert lib.args == (ptr(x), ptr(out), 3, 4, 24, FERRUM_DTYPE_F16, 0, 0)


def test_moe_sum_of_a_token_by_top_k_array(lib):
    out = bf16_cai((3, 7))
    moe_ops.moe_sum(bf16_cai((3, 2, 7)), 2, out)
    assert lib.args[2:6] == (3, 2, 7, FERRUM_DTYPE_BF16)


@pytest.mark.parametrize("x, top_k, match, exc", [
    (f16(10, 8), 4, "x has 10 rows, not a multiple of top_k=4", ArgumentError),
    (f16(3, 2, 8), 4, r"its top_k \(2\) is not top_k=4", ArgumentError),
    (f16(16), 4, r"x must be \[tokens \* top_k, d\] or \[tokens, top_k, d\]", ArgumentError),
    (f16(8, 8), 0, "top_k=0 must be >= 1", ArgumentError),
    (FakeCAI((8, 8), "<f4"), 2, "x must have dtype float16 or bfloat16", ArgumentTypeError),
])
def test_moe_sum_rejects(lib, x, top_k, match, exc):
    with pytest.raises(exc, match=match):
        moe_ops.moe_sum(x, top_k)
    assert lib.calls == []


def test_moe_sum_rejects_a_bad_output(lib):
    with pytest.raises(ArgumentError, match=r"out must have shape \(2, 8\)"):
        moe_ops.moe_sum(f16(8, 8), 4, f16(8, 8))
    moe_ops.moe_sum(f16(8, 8), 4, f16(2, 8))
    assert lib.args[2:5] == (2, 4, 8)
