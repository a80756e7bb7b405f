"""ferrum_ffi.moe_layer on the CPU: the float64 layer reference against hand
computations, the block-size rule, what reaches the native entry points (a
fake library records every call in order; fake device arrays are only a
``__cuda_array_interface__``), scratch reuse, and every argument rule
rejected before any native call next to its valid neighbour."""

from __future__ import annotations

import dataclasses
import gc
import importlib
import math
import weakref

from types import SimpleNamespace

import numpy as np
import pytest

import ferrum_ffi as ff
from ferrum_ffi import _devices, _scratch, moe, moe_ops
from ferrum_ffi._abi import FERRUM_DTYPE_BF16, FERRUM_DTYPE_F16
from ferrum_ffi.moe_validation import moe_c_tmp_floats
from ferrum_ffi.status import ArgumentError, ArgumentTypeError

from . import mm_fakes
from . import moe_layer_reference as ref
from .mm_fakes import FakeCAI, bf16_cai, host_cai

# The package's ``fused_moe`` attribute is the function; the module is this.
layer = importlib.import_module("ferrum_ffi.moe_layer")

BF16 = np.dtype(pytest.importorskip("ml_dtypes").bfloat16)
SMS = 132


def sigmoid(z: float) -> float:
    return 1.0 / (1.0 + math.exp(-z))


# ---- the reference, by hand ------------------------------------------------------------------

# E = 3 experts, K = H = 2, I = 1. w13[e] is [K, 2I] (silu: column 0 the gate, 1 the up).
HAND_X = np.array([[1.0, 2.0], [1.0, -1.0]])
HAND_W13 = np.array([[[1.0, 0.0], [0.0, 1.0]], [[0.0, 1.0], [1.0, 0.0]], [[1.0, 1.0], [1.0, 1.0]]])
HAND_W2 = np.array([[[1.0, 2.0]], [[-1.0, 0.0]], [[0.5, 0.5]]])
HAND_IDS = np.array([[0, 2], [1, 0]], dtype=np.int32)
HAND_WEIGHTS = np.array([[0.75, 0.25], [0.5, 0.5]], dtype=np.float32)


def silu(g: float) -> float:
    return g * sigmoid(g)


def hand_rows():
    """Per token, the weighted down rows of its two experts, computed by hand."""
    t0_e0 = 0.75 * silu(1.0) * 2.0 * np.array([1.0, 2.0])  # gate x0 = 1, up x1 = 2
    t0_e2 = 0.25 * silu(3.0) * 3.0 * np.array([0.5, 0.5])  # gate = up = x0 + x1 = 3
    t1_e1 = 0.5 * silu(-1.0) * 1.0 * np.array([-1.0, 0.0])  # expert 1 swaps: gate x1 = -1, up x0 = 1
    t1_e0 = 0.5 * silu(1.0) * -1.0 * np.array([1.0, 2.0])
    return t0_e0, t0_e2, t1_e1, t1_e0


def test_reference_by_hand_in_float64():
    t0_e0, t0_e2, t1_e1, t1_e0 = hand_rows()
    out = ref.fused_moe(HAND_X, HAND_W13, HAND_W2, HAND_WEIGHTS, HAND_IDS, activation="silu", dtype=np.float64)
    np.testing.assert_allclose(out, [t0_e0 + t0_e2, t1_e1 + t1_e0], rtol=1e-12)


def test_reference_rounds_between_the_kernels():
    out = ref.fused_moe(HAND_X, HAND_W13, HAND_W2, HAND_WEIGHTS, HAND_IDS, activation="silu", dtype=np.float16)
    f16 = lambda v: float(np.float16(v))  # noqa: E731
    # token 0, expert 2: silu(3) * 3 is rounded to fp16, then the weighted row, then the sum.
    activated = f16(silu(3.0) * 3.0)
    row_e2 = f16(0.25 * activated * 0.5)
    row_e0 = f16(0.75 * f16(silu(1.0) * 2.0) * 1.0)
    assert out[0, 0] == f16(row_e0 + row_e2)
    assert out.dtype == np.float64 and (out.astype(np.float16).astype(np.float64) == out).all()


def test_reference_expert_parallel_drops_other_ranks_experts():
    t0_e0, t0_e2, _, t1_e0 = hand_rows()
    # This rank holds global experts 0 and 2 as local 0 and 1; expert 1 lives elsewhere.
    out = ref.fused_moe(HAND_X, HAND_W13[[0, 2]], HAND_W2[[0, 2]], HAND_WEIGHTS, HAND_IDS, activation="silu",
                        dtype=np.float64, expert_map=np.array([0, -1, 1], dtype=np.int32))
    np.testing.assert_allclose(out, [t0_e0 + t0_e2, t1_e0], rtol=1e-12)


def test_reference_gpt_oss_swiglu_with_biases():
    # One expert, K = 2, I = 1: interleaved columns (gate, up); the gate clamps at limit 7.
    w13 = np.array([[[4.0, 1.0], [5.0, -2.0]]])
    bias13 = np.array([[1.0, 0.5]])
    w2 = np.array([[[2.0, -1.0]]])
    bias2 = np.array([[0.25, 0.0]])
    x = np.array([[1.0, 1.0]])
    out = ref.fused_moe(x, w13, w2, np.array([[0.5]], np.float32), np.array([[0]], np.int32),
                        activation="gpt_oss_swiglu", dtype=np.float64, bias13=bias13, bias2=bias2, alpha=1.0)
    gate, up = min(4 + 5 + 1.0, 7.0), -2 + 1 + 0.5  # 10 -> 7; -0.5 stays
    h = (up + 1) * gate * sigmoid(gate)
    np.testing.assert_allclose(out, [[0.5 * (2 * h + 0.25), 0.5 * -h]], rtol=1e-12)


def test_reference_ignores_padded_hidden_features():
    wide = np.concatenate([HAND_X, np.full((2, 2), 99.0)], axis=1)
    a = ref.fused_moe(wide, HAND_W13, HAND_W2, HAND_WEIGHTS, HAND_IDS, activation="silu", dtype=np.float64)
    b = ref.fused_moe(HAND_X, HAND_W13, HAND_W2, HAND_WEIGHTS, HAND_IDS, activation="silu", dtype=np.float64)
    np.testing.assert_array_equal(a, b)


# ---- the block-size rule ---------------------------------------------------------------------


@pytest.mark.parametrize("m, top_k, experts, expected", [
    (1, 1, 8, 8), (1, 8, 128, 8), (64, 8, 128, 8), (16, 8, 8, 16), (17, 8, 8, 32), (64, 2, 8, 16),
    (96, 2, 8, 32), (512, 8, 128, 48), (256, 4, 32, 48), (160, 2, 8, 48), (176, 2, 8, 64), (100, 4, 8, 64), (512, 1, 8, 64),
    (4096, 8, 8, 64),
])
def test_default_block_size_holds_an_average_experts_rows(m, top_k, experts, expected):
    # Up to 16 rows an expert's average load; past it one standard deviation more.
    assert layer.default_block_size(m, top_k, experts) == expected
    rows = math.ceil(m * top_k / experts)
    assert expected >= min(rows if rows <= 16 else rows + math.sqrt(rows), 64)


@pytest.mark.parametrize("m, top_k, experts, expected", [
    (64, 8, 128, 8), (129, 8, 128, 32), (192, 8, 128, 32), (256, 8, 128, 32), (512, 8, 128, 48), (256, 4, 32, 48),
    (160, 2, 8, 48), (176, 2, 8, 64), (96, 2, 8, 32), (4096, 8, 8, 64),
])
def test_warp_specialised_layers_take_32_row_blocks_for_9_to_16_rows(m, top_k, experts, expected):
    assert layer.default_block_size(m, top_k, experts, warp_specialised=True) == expected


def test_tall_blocks_follow_the_native_planners_rule(monkeypatch):
    class Lib:
        build_info = "ferrum_marlin 0.1.0; abi 9; cuda archs 80-real 90a-real 90-virtual"

    major = {"value": 9}
    monkeypatch.setattr(layer, "library", lambda: Lib)
    monkeypatch.setattr(layer, "device_compute_major", lambda device: major["value"])

    def w(kind: str, n: int) -> SimpleNamespace:
        return SimpleNamespace(kind=kind, n=n)

    assert layer.tall_blocks_warp_specialised(0, w("u4b8", 1536), w("u4b8", 2048))
    assert layer.tall_blocks_warp_specialised(0, w("fe4m3fn", 512), w("fe4m3fn", 256))
    # A partial last 256-column tile (GPT-OSS's 2880, 5760), every format
    assert layer.tall_blocks_warp_specialised(0, w("u4b8", 1536), w("u4b8", 2880))
    assert layer.tall_blocks_warp_specialised(0, w("mxfp4", 5760), w("mxfp4", 2880))
    assert layer.tall_blocks_warp_specialised(0, w("fe4m3fn", 384), w("fe4m3fn", 2048))  # a TP-4 shard's gate_up
    assert not layer.tall_blocks_warp_specialised(0, w("mxfp4", 5760), w("mxfp4", 192))  # N < 256
    assert not layer.tall_blocks_warp_specialised(0, w("fe4m3fn", 192), w("fe4m3fn", 512))
    major["value"] = 8
    assert not layer.tall_blocks_warp_specialised(0, w("u4b8", 1536), w("u4b8", 2048))
    major["value"] = 9
    Lib.build_info = "ferrum_marlin 0.1.0; abi 9; cuda archs 80-real 90-virtual"
    assert not layer.tall_blocks_warp_specialised(0, w("u4b8", 1536), w("u4b8", 2048))


# ---- fakes -------------------------------------------------------------------------------------


class FlatFake(FakeCAI):
    """A fake device array that, like CuPy and torch, slices and reshapes into views."""

    def __init__(self, shape, dtype, ptr=None):
        self.fake_dtype = np.dtype(dtype)
        bf16 = self.fake_dtype.name == "bfloat16"
        super().__init__(shape, "<V2" if bf16 else self.fake_dtype.str, ptr=ptr,
                         dtype=self.fake_dtype if bf16 else None)

    @property
    def ptr(self) -> int:
        return self.__cuda_array_interface__["data"][0]

    def __getitem__(self, index: slice) -> "FlatFake":
        assert index.start is None and index.step is None
        return FlatFake((index.stop,), self.fake_dtype, ptr=self.ptr)

    def reshape(self, shape) -> "FlatFake":
        return FlatFake(shape, self.fake_dtype, ptr=self.ptr)


class LayerFakeLibrary(mm_fakes.FakeLibrary):
    """Records every native call of a layer in order: name and arguments."""

    def __init__(self):
        super().__init__(sms=SMS)
        self.calls: list[tuple[str, tuple]] = []

    def ferrum_marlin_memset_async(self, ptr, value, nbytes, stream) -> int:
        self.calls.append(("memset", (int(ptr), int(value), int(nbytes), int(stream))))
        return 0

    def __getattr__(self, name):
        if not name.startswith("ferrum_"):
            raise AttributeError(name)

        def call(*args):
            self.calls.append((name, args))
            return self.status

        return call

    def names(self) -> list[str]:
        return [name for name, _ in self.calls]

    def args(self, name: str, index: int = 0) -> tuple:
        return [args for n, args in self.calls if n == name][index]


@pytest.fixture
def lib(monkeypatch):
    fake = mm_fakes.install_library(monkeypatch, LayerFakeLibrary())
    fake.allocations = []

    def allocate(like, view, shape, dtype, device, stream=None):
        fake.allocations.append((tuple(shape), np.dtype(dtype), stream))
        return FlatFake(shape, dtype)

    for module in (moe, moe_ops, _scratch, _devices, layer):
        monkeypatch.setattr(module, "library", lambda: fake)
    for module in (moe_ops, _scratch, layer):
        monkeypatch.setattr(module, "allocate", allocate)
    for module in (moe, moe_ops, layer):
        monkeypatch.setattr(module, "device_of", lambda obj, view: getattr(obj, "device_id", 0))
    monkeypatch.setattr(_scratch, "_cache", {})
    monkeypatch.setattr(_scratch, "_arrays", {})
    monkeypatch.setattr(_scratch, "_plans", weakref.WeakKeyDictionary())
    # Several tokens align their rows (the tiny test experts would otherwise route directly).
    monkeypatch.setattr(layer, "DIRECT_ROUTING_MAX_REPEAT_BYTES", -1)
    return fake


def ptr(array) -> int:
    return array.__cuda_array_interface__["data"][0]


def on_device(array, device: int):
    array.device_id = device
    return array


H, I, E = 256, 128, 4
_rng = np.random.default_rng(0)


def weight(kind: str, n: int, k: int, experts: int = E) -> ff.MarlinMoeWeight:
    w = _rng.standard_normal((experts, n, k))
    return ff.MarlinMoeWeight.from_float(w, kind, keep_reference=False).to_device(host_cai)


W13 = {kind: weight(kind, 2 * I, H) for kind in ("u4b8", "u4", "fe4m3fn")}
W2 = {kind: weight(kind, H, I) for kind in ("u4b8", "u4", "fe4m3fn")}

def mx_weight(n: int, k: int, physical_k: int) -> ff.MarlinMoeWeight:
    """An MXFP4 weight whose K is padded explicitly (the original engine's layout)."""
    blocks, scales = ff.formats.quantize_mxfp4(_rng.standard_normal((E, n, k)))
    return ff.MarlinMoeWeight.from_mxfp4(blocks, scales, physical_k=physical_k,
                                         keep_reference=False).to_device(host_cai)


# GPT-OSS-like: no tile divides the down projection (N = K = 192); it runs
# unpadded (partial last tiles), as GPT-OSS's 2880 x 2880 does.
MX_H, MX_I = 192, 192
MX13, MX2 = weight("mxfp4", 2 * MX_I, MX_H), weight("mxfp4", MX_H, MX_I)
# The down projection padded 192 -> 256 on request, as the original engine ran 2880 as 2944.
MX2_PADDED = mx_weight(MX_H, MX_I, 256)


def inputs(m: int = 4, top_k: int = 2, kind: str = "u4b8") -> dict:
    mx = kind == "mxfp4"
    return dict(
        hidden=bf16_cai((m, MX_H)) if mx else FakeCAI((m, H), "<f2"),
        w13=MX13 if mx else W13[kind], w2=MX2 if mx else W2[kind],
        topk_weights=FakeCAI((m, top_k), "<f4"), topk_ids=FakeCAI((m, top_k), "<i4"),
        activation="gpt_oss_swiglu" if mx else "silu",
    )


# f16 entry arguments: a b c c_tmp scales zp workspace sorted expert_ids count topk_weights block top_k
# mul is_ep prob_m prob_n prob_k group has_zp dev stream atomic fp32
A, B, C, C_TMP, SCALES, ZP, WS, SORTED, EXPERTS, COUNT, TOPK_W, BLOCK, TOP_K, MUL, IS_EP = range(15)
PROB_M, PROB_N, PROB_K, GROUP, HAS_ZP, DEV, STREAM, ATOMIC, FP32 = range(15, 24)
ADD_ROWS, CLEAR, CLEAR_BYTES, SETTLED = range(24, 28)  # the _ex variant's last arguments
GEMM = "ferrum_vllm_marlin_moe_f16_ex"  # atomic mode (the default): the layer variant
GEMM_FP32 = "ferrum_vllm_marlin_moe_f16"  # fp32 reduce: the plain entry for gate/up, then moe_sum
ALIGN = "ferrum_moe_align_block_size_ex"  # atomic mode: the align launch also zeroes the gate/up output


# ---- what reaches the library ------------------------------------------------------------------


def test_one_layer_is_align_gemm_silu_gemm_on_one_stream(lib):
    args = inputs()
    out = ff.fused_moe(**args, stream=77)
    assert lib.names() == ["memset", ALIGN, GEMM, "ferrum_silu_and_mul", GEMM]
    assert lib.args("ferrum_silu_and_mul")[-1] == lib.args(ALIGN)[12] == 77
    workspace = lib.args("memset")[0]
    assert lib.args("memset") == (workspace, 0, 4 * SMS * 4, 77)  # a new workspace is zeroed once
    align = lib.args(ALIGN)
    block = layer.default_block_size(4, 2, E)
    capacity = 4 * 2 + E * (block - 1)
    assert align[:6] == (ptr(args["topk_ids"]), 4, 2, E, block, None)
    assert align[7] == capacity and align[9] == -(-capacity // block)
    routing = (align[6], align[8], align[10])
    gate_up, down = lib.args(GEMM, 0), lib.args(GEMM, 1)
    w13, w2 = args["w13"], args["w2"]
    assert gate_up[:3] == (ptr(args["hidden"]), ptr(w13.qweight), gate_up[C])
    assert (gate_up[SORTED], gate_up[EXPERTS], gate_up[COUNT]) == routing == (
        down[SORTED], down[EXPERTS], down[COUNT])
    assert (gate_up[TOPK_W], gate_up[MUL], gate_up[TOP_K], gate_up[PROB_M:GROUP]) == (None, 0, 2, (4, 2 * I, H))
    assert gate_up[BLOCK] == down[BLOCK] == block and gate_up[WS] == down[WS] == workspace
    assert (gate_up[ATOMIC], gate_up[FP32], gate_up[C_TMP], gate_up[IS_EP]) == (1, 0, None, 0)
    silu = lib.args("ferrum_silu_and_mul")
    assert silu[:5] == (gate_up[C], silu[1], 8, I, FERRUM_DTYPE_F16)
    # The down GEMM: every routed row is its own token, scaled by its top-k weight.
    assert (down[A], down[B], down[TOPK_W], down[MUL], down[TOP_K]) == (
        silu[1], ptr(w2.qweight), ptr(args["topk_weights"]), 1, 1)
    assert down[PROB_M:GROUP] == (8, H, I) and down[STREAM] == gate_up[STREAM] == 77
    # The align launch zeroes the gate/up output, the gate/up GEMM out; each
    # GEMM adds its partials (the down GEMM row t into out[t // top_k]).
    assert align[13:] == (gate_up[C], 8 * 2 * I * 2)
    assert gate_up[ADD_ROWS:] == (1, ptr(out), 4 * H * 2, 0)
    # The down GEMM's routing was written by align, before the activation: settled.
    assert down[C] == ptr(out) and down[ADD_ROWS:] == (2, None, 0, 1)
    assert out.__cuda_array_interface__["shape"] == (4, H)


ROUTING_SETTLED, ROUTING_DIRECT = 1, 2  # routing_flags bits


@pytest.mark.parametrize("top_k", [1, 2])
def test_one_token_skips_align_and_routes_each_row_directly(lib, top_k):
    args = inputs(m=1, top_k=top_k)
    out = ff.fused_moe(**args, stream=9)
    assert lib.names() == ["memset", "memset", GEMM, "ferrum_silu_and_mul", GEMM]
    gate_up, down = lib.args(GEMM, 0), lib.args(GEMM, 1)
    rows_bytes = top_k * 2 * I * 2
    # The gate/up output: a buffer zeroed once when allocated (on the layer's stream) ...
    assert lib.args("memset", 1)[1:] == (0, max(rows_bytes, 16), 9) and lib.args("memset", 1)[0] == gate_up[C]
    # ... that both GEMMs route by topk_ids, one row per 8-row slab, without align arrays ...
    for gemm in (gate_up, down):
        assert (gemm[SORTED], gemm[EXPERTS], gemm[COUNT], gemm[BLOCK]) == (None, ptr(args["topk_ids"]), None, 8)
    assert gate_up[ADD_ROWS:] == (1, ptr(out), H * 2, ROUTING_DIRECT)
    # ... and the down GEMM clears once the activation has read it, for the next call.
    assert down[ADD_ROWS:] == (top_k, gate_up[C], rows_bytes, ROUTING_DIRECT | ROUTING_SETTLED)
    assert down[PROB_M:GROUP] == (top_k, H, I) and down[C] == ptr(out)
    lib.calls.clear()
    ff.fused_moe(**args, stream=9)  # the kept plan: no allocation, no memset
    assert lib.names() == [GEMM, "ferrum_silu_and_mul", GEMM]


@pytest.mark.parametrize("experts, top_k, expert_mb, direct_up_to", [
    (128, 8, 2.43, 4),  # Qwen3-30B-A3B-like: repeats expected at M = 4: 2.9 rows, 7 MB; at M = 5: 4.7, 11.4 MB
    (32, 4, 13.3, 2),   # GPT-OSS-20B-like: M = 2: 0.5 rows, 6.6 MB; M = 3: 1.4 rows, 19 MB
    (8, 8, 0.04, 32),   # tiny experts (40 KB): align costs more than streaming them again
])
def test_direct_routing_pays_while_the_expected_repeats_are_few(experts, top_k, expert_mb, direct_up_to):
    expert_bytes = int(expert_mb * (1 << 20))
    decided = [layer.direct_routing_pays(m, top_k, experts, expert_bytes) for m in range(1, 41)]
    assert decided == [m <= direct_up_to for m in range(1, 41)]
    assert layer.direct_routing_pays(1, top_k, experts, 1 << 60)  # one token never repeats an expert


def test_a_layer_of_a_few_tokens_routes_directly_when_it_pays(lib, monkeypatch):
    monkeypatch.setattr(layer, "DIRECT_ROUTING_MAX_REPEAT_BYTES", 10 << 20)
    ff.fused_moe(**inputs(m=4, top_k=2))  # tiny experts: repeats cost less than align
    assert ALIGN not in lib.names() and lib.args(GEMM)[ADD_ROWS:][-1] == ROUTING_DIRECT


def test_a_failing_step_restores_the_zero_kept_gate_up_output(lib, monkeypatch):
    monkeypatch.setattr(lib, "ferrum_silu_and_mul", lambda *a: (6 << 16) | 1, raising=False)
    with pytest.raises(ff.NativeError, match="ferrum_silu_and_mul"):
        ff.fused_moe(**inputs(m=1, top_k=2), stream=3)
    # The gate/up GEMM added into the buffer, the down GEMM that clears it never ran.
    assert lib.names() == ["memset", "memset", GEMM, "memset"]
    assert lib.args("memset", 2) == (lib.args(GEMM)[C], 0, 2 * 2 * I * 2, 3)


def test_one_token_keeps_align_with_an_expert_map_fp32_reduce_or_a_forced_block(lib):
    expert_map = FakeCAI((8,), "<i4")
    ff.fused_moe(**inputs(m=1, top_k=2), expert_map=expert_map)
    ff.fused_moe(**inputs(m=1, top_k=2), fp32_reduce=True)
    ff.fused_moe(**inputs(m=1, top_k=2), block_size=16)
    assert lib.names().count(ALIGN) + lib.names().count("ferrum_moe_align_block_size") == 3


def test_fp32_reduce_keeps_the_rows_and_sums_them_in_order(lib):
    args = inputs()
    out = ff.fused_moe(**args, fp32_reduce=True)
    assert lib.names() == ["memset", "ferrum_moe_align_block_size", GEMM_FP32, "ferrum_silu_and_mul", GEMM,
                           "ferrum_moe_sum"]
    gate_up, down = lib.args(GEMM_FP32, 0), lib.args(GEMM, 0)
    assert down[ADD_ROWS:] == (0, None, 0, 1)  # rows stored, routing settled
    assert down[C] == gate_up[C]  # the gate/up output is dead by then: its storage is reused
    assert lib.args("ferrum_moe_sum")[:5] == (down[C], ptr(out), 4, 2, H)


def test_out_sharing_memory_with_hidden_is_summed_after_the_gemms(lib):
    # Zeroing out in the gate/up GEMM would destroy hidden before it is read.
    args = inputs()
    ff.fused_moe(**args, out=args["hidden"])
    assert lib.names()[-3:] == ["ferrum_silu_and_mul", GEMM, "ferrum_moe_sum"]
    assert lib.args("ferrum_moe_sum")[1] == ptr(args["hidden"])
    ff.fused_moe(**args)  # the same signature with a fresh out: the kept plan is not reused
    assert lib.names()[-2:] == ["ferrum_silu_and_mul", GEMM]


SCRATCH = (C, WS, SORTED, EXPERTS, COUNT)


def scratch_pointers(lib) -> list[tuple]:
    """The scratch pointers of the last call's two GEMMs (the down GEMM's C is
    out) and its activation output."""
    gate_up, down = [args for name, args in lib.calls if name == GEMM][-2:]
    return [tuple(gate_up[i] for i in SCRATCH), tuple(down[i] for i in SCRATCH[1:]), down[A]]


def test_scratch_is_reused_and_grown_on_demand(lib):
    ff.fused_moe(**inputs(m=16), stream=5)
    first, allocated = scratch_pointers(lib), len(lib.allocations)
    ff.fused_moe(**inputs(m=16), stream=5)
    assert lib.names().count("memset") == 1  # the kernels leave the workspace zero: zeroed once
    assert len(lib.allocations) == allocated + 1 and scratch_pointers(lib) == first  # only the output is new
    ff.fused_moe(**inputs(m=4), stream=5)
    assert len(lib.allocations) == allocated + 2 and scratch_pointers(lib) == first  # smaller: views of the same
    ff.fused_moe(**inputs(m=64), stream=5)
    assert len(lib.allocations) > allocated + 3  # larger: grown
    ff.fused_moe(**inputs(m=16), stream=6)
    assert lib.names()[-5] == "memset" and scratch_pointers(lib)[0] != first[0]  # another stream, its own


def test_top_k_one_writes_the_down_gemm_into_out(lib):
    out = FakeCAI((4, H), "<f2")
    assert ff.fused_moe(**inputs(top_k=1), out=out) is out
    assert lib.names()[-2:] == ["ferrum_silu_and_mul", GEMM]
    assert lib.args(GEMM, 1)[C] == ptr(out) and lib.args(GEMM, 1)[PROB_M] == 4
    assert lib.args(GEMM, 1)[ADD_ROWS] == 1 and lib.args(GEMM, 0)[CLEAR] == ptr(out)


@pytest.mark.parametrize("top_k", [1, 2])
def test_expert_parallel_adds_nothing_for_other_ranks_rows(lib, top_k):
    # The down GEMM adds into out, which the gate/up GEMM zeroed: a skipped row adds nothing.
    expert_map = FakeCAI((8,), "<i4")
    out = FakeCAI((4, H), "<f2")
    ff.fused_moe(**inputs(top_k=top_k), expert_map=expert_map, out=out)
    assert lib.names()[1:] == [ALIGN, GEMM, "ferrum_silu_and_mul", GEMM]
    align, gate_up, down = lib.args(ALIGN), lib.args(GEMM, 0), lib.args(GEMM, 1)
    assert align[3] == 8 and align[5] == ptr(expert_map)  # routed among the 8 global experts
    assert gate_up[IS_EP] == down[IS_EP] == 1
    assert gate_up[CLEAR:] == (ptr(out), 4 * H * 2, 0) and (down[C], down[ADD_ROWS]) == (ptr(out), top_k)


@pytest.mark.parametrize("top_k", [1, 2])
def test_expert_parallel_with_fp32_reduce_zeroes_the_down_rows_after_the_activation(lib, top_k):
    expert_map = FakeCAI((8,), "<i4")
    out = FakeCAI((4, H), "<f2")
    ff.fused_moe(**inputs(top_k=top_k), expert_map=expert_map, out=out, fp32_reduce=True)
    names = lib.names()
    assert names[names.index("ferrum_silu_and_mul") + 1:][:2] == ["memset", GEMM]
    down = lib.args(GEMM, 0)
    assert lib.args(GEMM_FP32, 0)[IS_EP] == down[IS_EP] == 1
    zeroed = lib.args("memset", 1)  # after the new workspace's
    assert zeroed == (down[C], 0, 4 * top_k * H * 2, 0)
    assert (zeroed[0] == ptr(out)) == (top_k == 1)


def test_fp32_reduce_shares_one_c_tmp(lib):
    ff.fused_moe(**inputs(m=64, top_k=4), fp32_reduce=True)
    gate_up, down = lib.args(GEMM_FP32, 0), lib.args(GEMM, 0)
    assert gate_up[C_TMP] == down[C_TMP] is not None
    assert (gate_up[ATOMIC], gate_up[FP32], down[ATOMIC], down[FP32]) == (0, 1, 0, 1)
    block = gate_up[BLOCK]
    floats = max(64 * 4 * max(2 * I, H), moe_c_tmp_floats(block, SMS))
    assert ((floats,), np.dtype(np.float32), 0) in lib.allocations


@pytest.mark.parametrize("w2, physical_i", [(MX2, MX_I), (MX2_PADDED, 256)], ids=["unpadded", "padded"])
def test_mxfp4_runs_bf16_with_the_swiglu_padded_to_w2_k(lib, w2, physical_i):
    # The SwiGLU writes w2.k columns: the logical I when nothing is padded (the
    # default now that the kernels run partial tiles), zeros up to a padded K.
    args = {**inputs(kind="mxfp4"), "w2": w2}
    ff.fused_moe(**args, alpha=1.5, limit=6.0)
    assert lib.names()[1:] == [ALIGN, "ferrum_vllm_marlin_moe_mxfp4_bf16_ex",
                               "ferrum_gpt_oss_swiglu", "ferrum_vllm_marlin_moe_mxfp4_bf16_ex"]
    gate_up = lib.args("ferrum_vllm_marlin_moe_mxfp4_bf16_ex", 0)
    down = lib.args("ferrum_vllm_marlin_moe_mxfp4_bf16_ex", 1)
    swiglu = lib.args("ferrum_gpt_oss_swiglu")
    assert swiglu[0] == gate_up[2] and swiglu[2:8] == (8, MX_I, physical_i, 1.5, 6.0, FERRUM_DTYPE_BF16)
    assert (gate_up[4], down[4]) == (ptr(MX13.bias), ptr(w2.bias))  # the kernel adds the bias
    # a b c c_tmp bias scales ws sorted experts count topk block top_k mul ep prob_m prob_n prob_k
    assert gate_up[15:18] == (4, 2 * MX_I, MX_H) and down[15:18] == (8, MX_H, physical_i)
    assert down[0] == swiglu[1] and down[10] == ptr(args["topk_weights"]) and down[12:14] == (1, 1)
    # ... add_rows_div clear clear_bytes: each token's rows summed into out, zeroed by the gate/up GEMM.
    assert down[23] == 2 and gate_up[24] == down[2]


@pytest.mark.parametrize("kind, entry, has_zp", [("fe4m3fn", "ferrum_vllm_marlin_moe_fp8_f16_ex", 0), ("u4", GEMM, 1)])
def test_each_kind_reaches_its_entry_point(lib, kind, entry, has_zp):
    ff.fused_moe(**inputs(kind=kind))
    gate_up = lib.args(entry, 0)
    zero_points = W13[kind].zero_points
    assert gate_up[HAS_ZP] == has_zp and gate_up[ZP] == (ptr(zero_points) if has_zp else None)
    assert gate_up[GROUP] == W13[kind].group_size


def test_explicit_block_size(lib):
    ff.fused_moe(**inputs(), block_size=48)
    assert lib.args(ALIGN)[4] == lib.args(GEMM, 1)[BLOCK] == 48


def test_no_tokens_no_calls(lib):
    out = ff.fused_moe(**{**inputs(), "hidden": FakeCAI((0, H), "<f2"), "topk_ids": FakeCAI((0, 2), "<i4"),
                          "topk_weights": FakeCAI((0, 2), "<f4")})
    assert lib.calls == [] and out.__cuda_array_interface__["shape"] == (0, H)


def test_route_is_the_router(lib):
    logits = FakeCAI((4, 8), "<f4")
    weights, ids = ff.route(logits, 2, renormalize=False, stream=9)
    assert lib.names() == ["ferrum_topk_softmax"]
    assert lib.args("ferrum_topk_softmax")[2:6] == (4, 8, 2, 0) and lib.args("ferrum_topk_softmax")[-1] == 9
    assert weights.__cuda_array_interface__["typestr"] == "<f4" and ids.__cuda_array_interface__["typestr"] == "<i4"


def test_the_layer_object_routes_then_runs(lib):
    moe_layer = ff.FusedMoE(W13["u4b8"], W2["u4b8"], top_k=2, renormalize=True)
    assert moe_layer.num_experts == E
    moe_layer(FakeCAI((4, H), "<f2"), FakeCAI((4, E), "<f2"), stream=3)
    assert lib.names()[:3] == ["ferrum_topk_softmax", "memset", ALIGN]
    weights, ids = lib.args("ferrum_topk_softmax")[6:8]
    assert lib.args(ALIGN)[0] == ids and lib.args(GEMM, 1)[TOPK_W] == weights


def test_the_layer_object_with_an_expert_map_routes_global_experts(lib):
    moe_layer = ff.FusedMoE(W13["u4b8"], W2["u4b8"], top_k=2, expert_map=FakeCAI((16,), "<i4"))
    assert moe_layer.num_experts == 16
    with pytest.raises(ArgumentError, match=r"router_logits must be \[M=4, 16\], got shape \(4, 4\)"):
        moe_layer(FakeCAI((4, H), "<f2"), FakeCAI((4, E), "<f2"))
    with pytest.raises(ArgumentError, match=r"router_logits must be \[M=4, 16\], got shape \(3, 16\)"):
        moe_layer(FakeCAI((4, H), "<f2"), FakeCAI((3, 16), "<f2"))
    with pytest.raises(ArgumentError, match="FusedMoE: hidden has 128 columns, w13.k=256"):
        moe_layer(FakeCAI((4, 128), "<f2"), FakeCAI((4, 16), "<f2"))
    with pytest.raises(ArgumentTypeError, match="FusedMoE: hidden must have dtype float16"):
        moe_layer(FakeCAI((4, H), "<f4"), FakeCAI((4, 16), "<f2"))
    assert lib.calls == []
    moe_layer(FakeCAI((4, H), "<f2"), FakeCAI((4, 16), "<f2"))
    assert lib.args(ALIGN)[3] == 16


@pytest.mark.parametrize("changes, exc, message", [
    (dict(top_k=0), ArgumentError, r"top_k=0 must be in 1..4"),
    (dict(top_k=5), ArgumentError, r"top_k=5 must be in 1..4"),
    (dict(top_k=2.0), ArgumentTypeError, "top_k must be an integer"),
    (dict(renormalize=1), ArgumentTypeError, "renormalize must be a bool"),
    (dict(activation="gelu"), ArgumentError, "activation='gelu' must be one of"),
    (dict(block_size=24), ArgumentError, "FusedMoE: block_size=24 must be None"),
    (dict(fp32_reduce="yes"), ArgumentTypeError, "FusedMoE: fp32_reduce must be a bool"),
    (dict(limit=-2.0), ArgumentError, "FusedMoE: limit=-2.0 must be >= 0"),
    (dict(w2=W2["u4b8"].qweight), ArgumentTypeError, "w2 must be a MarlinMoeWeight"),
])
def test_the_layer_object_checks_its_fields(changes, exc, message):
    fields = dict(w13=W13["u4b8"], w2=W2["u4b8"], top_k=2)
    with pytest.raises(exc, match=message):
        ff.FusedMoE(**{**fields, **changes})
    ff.FusedMoE(**{**fields, "top_k": 4, "block_size": 64, "limit": 0.0})  # the valid neighbour


# ---- every rule, before any native call --------------------------------------------------------

_HOST13 = ff.MarlinMoeWeight.from_float(_rng.standard_normal((E, 2 * I, H)), "u4b8", keep_reference=False)
_BIASED13 = dataclasses.replace(W13["u4b8"], bias=host_cai(np.zeros((E, 2 * I), np.float16)))
_WIDE2 = weight("u4b8", H, 2 * I)  # k = 2I: not what silu gives
_NARROW2 = weight("u4b8", 128, I)  # n = 128: not the hidden size
_FEWER2 = weight("u4b8", H, I, experts=2)
_MX_NARROW13 = weight("mxfp4", 192, 192)  # n = 192: I = 96
_MX_PADDED13 = mx_weight(192, 192, 256)  # the same, K 192 padded to 256 on request
_MX_PADDED2 = weight("mxfp4", 192, 96)  # its down projection: I = 96, a multiple of 32 only, runs as 128


def misaligned_f16(shape):
    return FakeCAI(shape, "<f2", ptr=0x7100_0008)


# (changes to inputs(), exception, message); each is refused before the first native call.
RULES = [
    (dict(w13=W13["u4b8"].qweight), ArgumentTypeError, "fused_moe: w13 must be a MarlinMoeWeight, got HostCAI"),
    (dict(w13=_HOST13), ArgumentError, r"w13's buffers are host arrays; call w13.to_device\(\) first"),
    (dict(w13=_BIASED13), ArgumentError, "w13 \\(kind 'u4b8'\\) carries a bias, but the INT4/FP8 MoE GEMMs add none"),
    (dict(activation="relu"), ArgumentError, "activation='relu' must be one of silu, gpt_oss_swiglu"),
    (dict(w2=MX2), ArgumentError, "w13 \\(kind 'u4b8'\\) runs float16 activations, w2 \\(kind 'mxfp4'\\) bfloat16"),
    (dict(w2=_FEWER2), ArgumentError, "w13 has 4 experts, w2 2"),
    (dict(w2=_WIDE2), ArgumentError, r"w2.k=256 must equal w13.n / 2 = 128 \(silu_and_mul's output width\)"),
    (dict(w2=_NARROW2), ArgumentError, "w2.n=128 must equal w13.logical_k=256"),
    (dict(fp32_reduce=1), ArgumentTypeError, "fp32_reduce must be a bool"),
    (dict(alpha="1"), ArgumentTypeError, "alpha must be a real number"),
    (dict(alpha=float("nan")), ArgumentError, "alpha must not be NaN"),
    (dict(limit=-1.0), ArgumentError, r"limit=-1.0 must be >= 0 \(inf: no clamp\)"),
    (dict(hidden=FakeCAI((4, H), "<f4")), ArgumentTypeError, "hidden must have dtype float16, got float32"),
    (dict(hidden=bf16_cai((4, H))), ArgumentTypeError, "hidden must have dtype float16, got bfloat16"),
    (dict(hidden=FakeCAI((4 * H,), "<f2")), ArgumentError, "hidden must be 2-D"),
    (dict(hidden=FakeCAI((4, H), "<f2", strides=(2, 8))), ArgumentError, "hidden must be C-contiguous"),
    (dict(hidden=misaligned_f16((4, H))), ArgumentError, "hidden pointer 0x71000008 must be 16-byte aligned"),
    (dict(hidden=FakeCAI((4, 128), "<f2")), ArgumentError, "hidden has 128 columns, w13.k=256$"),
    (dict(topk_ids=FakeCAI((4, 2), "<i8")), ArgumentTypeError, "topk_ids must have dtype int32"),
    (dict(topk_ids=FakeCAI((8,), "<i4")), ArgumentError, "topk_ids must be 2-D"),
    (dict(topk_ids=FakeCAI((3, 2), "<i4")), ArgumentError, r"topk_ids must be \[M=4, top_k >= 1\], got shape \(3, 2\)"),
    (dict(topk_ids=FakeCAI((4, 0), "<i4"), topk_weights=FakeCAI((4, 0), "<f4")), ArgumentError,
     r"topk_ids must be \[M=4, top_k >= 1\]"),
    (dict(topk_weights=FakeCAI((4, 2), "<f2")), ArgumentTypeError, "topk_weights must have dtype float32"),
    (dict(topk_weights=FakeCAI((4, 1), "<f4")), ArgumentError, r"topk_weights must have shape \(4, 2\)"),
    (dict(topk_ids=FakeCAI((4, 5), "<i4"), topk_weights=FakeCAI((4, 5), "<f4")), ArgumentError,
     "top_k=5 must be <= the 4 routed experts"),
    (dict(expert_map=FakeCAI((8,), "<i8")), ArgumentTypeError, "expert_map must have dtype int32"),
    (dict(expert_map=FakeCAI((8, 1), "<i4")), ArgumentError, "expert_map must be 1-D"),
    (dict(expert_map=FakeCAI((3,), "<i4")), ArgumentError,
     r"expert_map has 3 \(global\) experts, fewer than the 4 local experts"),
    (dict(expert_map=FakeCAI((1025,), "<i4")), ArgumentError, "1025 experts exceed the 1024"),
    (dict(block_size=12), ArgumentError, "block_size=12 must be None \\(automatic\\) or one of 8, 16, 32, 48, 64"),
    (dict(block_size=True), ArgumentError, "block_size=True must be None"),
    (dict(block_size=8.0), ArgumentError, "block_size=8.0 must be None"),
    (dict(hidden=FakeCAI((2**29, H), "<f2"), topk_ids=FakeCAI((2**29, 4), "<i4"),
          topk_weights=FakeCAI((2**29, 4), "<f4")), ArgumentError,
     "M \\* top_k = 2147483648 routed rows do not fit the kernels' int32 row ids"),
    (dict(hidden=on_device(FakeCAI((4, H), "<f2"), 1)), ArgumentError, "hidden is on device 1, the weights on device 0"),
    (dict(topk_ids=on_device(FakeCAI((4, 2), "<i4"), 2)), ArgumentError, "topk_ids is on device 2"),
    (dict(topk_weights=on_device(FakeCAI((4, 2), "<f4"), 1)), ArgumentError, "topk_weights is on device 1"),
    (dict(expert_map=on_device(FakeCAI((8,), "<i4"), 1)), ArgumentError, "expert_map is on device 1"),
    (dict(out=FakeCAI((4, H), "<f4")), ArgumentTypeError, "out must have dtype float16"),
    (dict(out=FakeCAI((8, H), "<f2")), ArgumentError, r"out must have shape \(4, 256\)"),
    (dict(out=misaligned_f16((4, H))), ArgumentError, "out pointer 0x71000008 must be 16-byte aligned"),
    (dict(out=FakeCAI((4, H), "<f2", readonly=True)), ArgumentError, "out is read-only"),
    (dict(out=on_device(FakeCAI((4, H), "<f2"), 1)), ArgumentError, "out is on device 1"),
]


@pytest.mark.parametrize("changes, exc, message", RULES)
def test_rules_are_checked_before_any_native_call(lib, changes, exc, message):
    with pytest.raises(exc, match=message):
        ff.fused_moe(**{**inputs(), **changes})
    assert lib.calls == [] and lib.allocations == []


# The valid neighbours of the rules above: one step back inside each rule.
NEIGHBOURS = [
    dict(),
    dict(block_size=8),
    dict(alpha=2, limit=float("inf")),
    dict(topk_ids=FakeCAI((4, 4), "<i4"), topk_weights=FakeCAI((4, 4), "<f4")),  # top_k == experts
    dict(expert_map=FakeCAI((4,), "<i4")),  # as many global as local experts
    dict(expert_map=FakeCAI((1024,), "<i4")),
    dict(out=FakeCAI((4, H), "<f2")),
    dict(w13=W13["u4"], w2=W2["fe4m3fn"]),  # kinds may differ while the activation dtype agrees
]


@pytest.mark.parametrize("changes", NEIGHBOURS)
def test_valid_neighbours_pass(lib, changes):
    ff.fused_moe(**{**inputs(), **changes})
    assert lib.names()[-1] in (GEMM, "ferrum_vllm_marlin_moe_fp8_f16_ex")


MX_RULES = [
    (dict(activation="silu", w2=MX2_PADDED), r"w2.k=256 must equal w13.n / 2 = 192 \(silu_and_mul's output width; "
     "a padded K needs gpt_oss_swiglu"),
    (dict(w13=_MX_NARROW13), "w2.logical_k=192 must equal w13.n / 2 = 96"),
    (dict(hidden=bf16_cai((4, 128))), "hidden has 128 columns, w13.k=192$"),
    (dict(topk_ids=FakeCAI((4, 5), "<i4"), topk_weights=FakeCAI((4, 5), "<f4"), expert_map=FakeCAI((8,), "<i4")),
     "MXFP4 needs top_k=5 <= the 4 experts of w13"),
]


@pytest.mark.parametrize("changes, message", MX_RULES)
def test_mxfp4_rules(lib, changes, message):
    with pytest.raises(ArgumentError, match=message):
        ff.fused_moe(**{**inputs(kind="mxfp4"), **changes})
    assert lib.calls == []


def test_mxfp4_padded_hidden_is_named_in_the_message(lib):
    with pytest.raises(ArgumentError, match=r"hidden has 192 columns, w13.k=256 \(logical 192, zero-padded"):
        ff.fused_moe(**{**inputs(kind="mxfp4"), "w13": _MX_PADDED13, "w2": _MX_PADDED2})


def test_mxfp4_neighbours(lib):
    # top_k 4 of 8 global experts with 4 local ones: within the MXFP4 bound.
    ff.fused_moe(**{**inputs(kind="mxfp4"), "topk_ids": FakeCAI((4, 4), "<i4"),
                    "topk_weights": FakeCAI((4, 4), "<f4"), "expert_map": FakeCAI((8,), "<i4")})
    # The INT4 GEMMs have no such bound: top_k 5 of 8 global experts with 4 local.
    ff.fused_moe(**{**inputs(), "topk_ids": FakeCAI((4, 5), "<i4"), "topk_weights": FakeCAI((4, 5), "<f4"),
                    "expert_map": FakeCAI((8,), "<i4")})
    # silu over an unpadded MXFP4 down projection (w2.k = I = 192): nothing to pad.
    ff.fused_moe(**{**inputs(kind="mxfp4"), "activation": "silu"})
    # A padded K on both projections: hidden passed padded, the SwiGLU pads I.
    ff.fused_moe(**{**inputs(kind="mxfp4"), "w13": _MX_PADDED13, "w2": _MX_PADDED2, "hidden": bf16_cai((4, 256))})
    assert lib.names().count("ferrum_moe_sum") == 0  # every layer adds its rows in the down GEMM
    assert lib.names()[-1] == "ferrum_vllm_marlin_moe_mxfp4_bf16_ex"


# ---- kept plans: a warm call is the validated call ----------------------------------------------


class Spy:
    """Counts the calls of a function of the layer module (and still makes them)."""

    def __init__(self, monkeypatch, name: str):
        self.count = 0
        function = getattr(layer, name)

        def counted(*args, **kwargs):
            self.count += 1
            return function(*args, **kwargs)

        monkeypatch.setattr(layer, name, counted)


@pytest.fixture
def validations(monkeypatch):
    """How often fused_moe checked its own rules, and every native call's (building a plan)."""
    return SimpleNamespace(layer=Spy(monkeypatch, "_check_call"), plans=Spy(monkeypatch, "_plan"))


WARM_CASES = {
    "u4b8 top_k 2": dict(),
    "top_k 1, expert parallel": dict(top_k=1, expert_map=8),
    "top_k 2, expert parallel, fp32 reduce": dict(expert_map=8, fp32_reduce=True),
    "fe4m3fn, block 16": dict(kind="fe4m3fn", block_size=16),
    "u4 zero points": dict(kind="u4"),
    "mxfp4 swiglu": dict(kind="mxfp4", alpha=1.25, limit=5.0),
    "mxfp4 top_k 1": dict(kind="mxfp4", top_k=1, alpha=1.25, limit=float("inf")),
}


def case_args(kind: str = "u4b8", top_k: int = 2, expert_map: int | None = None, **options) -> dict:
    """A fused_moe call of fresh arrays (new pointers) for a WARM_CASES entry."""
    args = {**inputs(top_k=top_k, kind=kind), **options}
    args["out"] = bf16_cai((4, MX_H)) if kind == "mxfp4" else FakeCAI((4, H), "<f2")
    if expert_map is not None:
        args["expert_map"] = FakeCAI((expert_map,), "<i4")
    return args


@pytest.mark.parametrize("case", WARM_CASES.values(), ids=WARM_CASES.keys())
def test_a_warm_call_makes_the_calls_a_validating_call_makes(lib, validations, case):
    ff.fused_moe(**case_args(**case), stream=3)
    # The warm call: new arrays, and new SwiGLU options (passed per call, not part of the signature).
    args = case_args(**{**case, "alpha": 2.5, "limit": 3.0} if case.get("kind") == "mxfp4" else case)
    lib.calls.clear()
    ff.fused_moe(**args, stream=3)
    warm = list(lib.calls)
    assert (validations.layer.count, validations.plans.count) == (1, 1)
    _scratch._plans.clear()  # the same call again, through every rule (same scratch)
    lib.calls.clear()
    ff.fused_moe(**args, stream=3)
    assert warm == lib.calls and validations.layer.count == 2
    # The caller's pointers reached the calls, not the first call's.
    assert ptr(args["hidden"]) in lib.calls[1][1] and ptr(args["topk_ids"]) == lib.calls[0][1][0]


@pytest.mark.parametrize("changes, exc, message", RULES)
def test_a_bad_argument_on_a_warm_call_raises_as_on_a_cold_one(lib, changes, exc, message):
    ff.fused_moe(**inputs())
    ff.fused_moe(**inputs())  # warm
    lib.calls.clear()
    lib.allocations.clear()
    with pytest.raises(exc, match=message):
        ff.fused_moe(**{**inputs(), **changes})
    assert lib.calls == [] and lib.allocations == []


@pytest.mark.parametrize("changes, message", MX_RULES)
def test_a_bad_mxfp4_argument_on_a_warm_call_raises(lib, changes, message):
    ff.fused_moe(**inputs(kind="mxfp4"))
    lib.calls.clear()
    with pytest.raises(ArgumentError, match=message):
        ff.fused_moe(**{**inputs(kind="mxfp4"), **changes})
    assert lib.calls == []


def test_a_plan_serves_one_signature(lib, validations):
    ff.fused_moe(**inputs(), stream=5)
    ff.fused_moe(**inputs(), stream=5)
    assert (validations.layer.count, validations.plans.count) == (1, 1)
    # Another stream: the layer's rules hold, the calls are checked again on its own scratch.
    ff.fused_moe(**inputs(), stream=6)
    assert (validations.layer.count, validations.plans.count) == (1, 2)
    assert lib.names()[-5] == "memset" and lib.args(GEMM, -1)[STREAM] == 6
    ff.fused_moe(**inputs(), stream=5)
    ff.fused_moe(**inputs(), stream=6)
    assert (validations.layer.count, validations.plans.count) == (1, 2)
    # Any other signature goes through every rule, then is warm in turn (from
    # its third call when the first grew the scratch: that drops every plan).
    for changes in (dict(hidden=FakeCAI((3, H), "<f2"), topk_ids=FakeCAI((3, 2), "<i4"),
                         topk_weights=FakeCAI((3, 2), "<f4")),  # M
                    dict(topk_ids=FakeCAI((4, 3), "<i4"), topk_weights=FakeCAI((4, 3), "<f4")),  # top_k
                    dict(expert_map=FakeCAI((8,), "<i4")), dict(expert_map=FakeCAI((16,), "<i4")),
                    dict(block_size=16), dict(fp32_reduce=True), dict(w13=W13["u4"])):
        before = validations.layer.count
        ff.fused_moe(**{**inputs(), **changes}, stream=5)
        assert validations.layer.count == before + 1, changes
        ff.fused_moe(**{**inputs(), **changes}, stream=5)
        before = validations.layer.count
        ff.fused_moe(**{**inputs(), **changes}, stream=5)
        assert validations.layer.count == before, changes


def test_an_out_over_hidden_and_a_fresh_out_each_keep_their_plan(lib, validations):
    args = inputs()
    for _ in range(3):
        ff.fused_moe(**args, out=args["hidden"], stream=5)  # summed by moe_sum
        ff.fused_moe(**args, stream=5)  # added into out by the down GEMM
    assert (validations.layer.count, validations.plans.count) == (1, 2)
    assert lib.names()[-2:] == ["ferrum_silu_and_mul", GEMM] and lib.names()[-5] == "ferrum_moe_sum"


def test_other_weight_objects_or_option_types_are_not_the_same_signature(lib, validations):
    ff.fused_moe(**inputs())
    copy = dataclasses.replace(W13["u4b8"])  # the same buffers, another weight
    ff.fused_moe(**{**inputs(), "w13": copy})
    ff.fused_moe(**{**inputs(), "w2": dataclasses.replace(W2["u4b8"])})
    assert validations.layer.count == 3
    # Options the rules accept but a signature is not kept for: checked in full every time.
    for options in (dict(alpha=np.float32(1.5)), dict(block_size=np.int64(8)), dict(fp32_reduce=np.True_),
                    dict(limit=7)):
        before = validations.layer.count
        ff.fused_moe(**inputs(), **options)
        ff.fused_moe(**inputs(), **options)
        assert validations.layer.count == before + 2, options


def test_a_w2_that_only_shares_a_key_is_not_the_same_signature(lib, validations, monkeypatch):
    # A key holds w2's id, which a new object may reuse once w2 is gone: every id collides here.
    monkeypatch.setattr(layer, "id", lambda obj: 1, raising=False)
    ff.fused_moe(**inputs())
    other = weight("u4b8", H, I)
    ff.fused_moe(**{**inputs(), "w2": other})
    assert validations.layer.count == 2 and lib.args(GEMM, -1)[B] == ptr(other.qweight)


def test_a_plan_calls_the_library_it_was_built_for(lib, monkeypatch):
    ff.fused_moe(**inputs())
    ff.fused_moe(**inputs())
    other = LayerFakeLibrary()
    for module in (moe, moe_ops, _scratch, _devices, layer):
        monkeypatch.setattr(module, "library", lambda: other)
    ff.fused_moe(**inputs())
    assert other.names()[-4:] == [ALIGN, GEMM, "ferrum_silu_and_mul", GEMM]


def test_growing_or_releasing_the_scratch_drops_the_plans(lib, validations):
    w13 = W13["u4b8"]
    ff.fused_moe(**inputs(m=4), stream=5)
    small = scratch_pointers(lib)
    assert _scratch.plans_of(w13) is not None
    ff.fused_moe(**inputs(m=64), stream=5)  # grows the buffers the m=4 plan names
    assert _scratch.plans_of(w13) is None
    ff.fused_moe(**inputs(m=4), stream=5)
    assert validations.layer.count == 3 and scratch_pointers(lib) != small  # the grown buffers
    grown = scratch_pointers(lib)
    ff.fused_moe(**inputs(m=4), stream=5)
    assert validations.layer.count == 3 and scratch_pointers(lib) == grown
    ff.release_scratch()
    assert _scratch.plans_of(w13) is None
    lib.calls.clear()
    ff.fused_moe(**inputs(m=4), stream=5)
    assert validations.layer.count == 4 and lib.names()[0] == "memset"  # a new workspace, zeroed


def test_a_plan_is_dropped_with_its_weight(lib):
    w13 = weight("u4b8", 2 * I, H)
    ff.fused_moe(**{**inputs(), "w13": w13})
    assert _scratch.plans_of(w13) is not None
    owner = weakref.ref(w13)
    del w13
    gc.collect()
    assert owner() is None and len(_scratch._plans) == 0


def test_a_warm_call_waits_for_the_callers_producer_streams(lib, monkeypatch):
    waits = []
    monkeypatch.setattr(lib, "ferrum_marlin_stream_wait", lambda consumer, producer: waits.append(producer) or 0)
    ff.fused_moe(**inputs(), stream=5)
    args = inputs()
    args["topk_weights"].__cuda_array_interface__["stream"] = 9  # produced on stream 9
    waits.clear()
    ff.fused_moe(**args, stream=5)
    assert waits == [9]


def test_a_warm_call_allocates_an_omitted_out_on_the_device(lib):
    ff.fused_moe(**inputs())
    allocated = len(lib.allocations)
    out = ff.fused_moe(**inputs())
    assert len(lib.allocations) == allocated + 1 and lib.args(GEMM, -1)[C] == ptr(out)


def test_a_warm_call_checks_an_allocated_out_as_the_launchers_do(lib, monkeypatch):
    ff.fused_moe(**inputs())
    ff.fused_moe(**inputs())
    lib.calls.clear()
    monkeypatch.setattr(layer, "allocate", lambda *args, **kwargs: FakeCAI((4, H), "<f2", readonly=True))
    with pytest.raises(ArgumentError, match="launch_marlin_moe: clear is read-only"):
        ff.fused_moe(**inputs())
    assert lib.calls == []


def test_plan_steps_keep_their_arguments_as_the_declared_ctypes_types():
    # A kept plan's constant arguments are converted once (a replay converts
    # only the caller's pointers it fills in); what does not declare types,
    # or does not convert, is kept as given.
    import ctypes

    declared = SimpleNamespace(argtypes=[ctypes.c_void_p, ctypes.c_int, ctypes.c_float, ctypes.c_void_p])
    args = layer._declared_args(declared, (0x7F00_0000_1000, -7, 1.5, None))
    assert [type(a) for a in args] == [ctypes.c_void_p, ctypes.c_int, ctypes.c_float, ctypes.c_void_p]
    assert (args[0].value, args[1].value, args[2].value, args[3].value) == (0x7F00_0000_1000, -7, 1.5, None)
    assert layer._declared_args(SimpleNamespace(), (1, 2)) == (1, 2)
    assert layer._declared_args(declared, (1, 2)) == (1, 2)  # not the declared count
    assert layer._declared_args(declared, (1, "x", 1.5, None)) == (1, "x", 1.5, None)
    libc_abs = ctypes.CDLL(None).abs
    libc_abs.argtypes, libc_abs.restype = [ctypes.c_int], ctypes.c_int
    assert libc_abs(*layer._declared_args(libc_abs, (-5,))) == 5
