"""fused_moe end to end on the CPU: the native entry points emulated on host
memory from the header's definitions (tests/moe_host_kernels.py), so that
how the layer chains them -- one routing for both GEMMs, the down GEMM's
top_k = 1 rows, the storage the two GEMM outputs share, the zeroing of other
ranks' rows, scratch reused with stale contents -- is checked against the
float64 layer reference without a GPU."""

from __future__ import annotations

import importlib
import weakref

import ml_dtypes
import numpy as np
import pytest

import ferrum_ffi as ff
from ferrum_ffi import _devices, _scratch, moe, moe_ops
from ferrum_ffi.formats import quantize_mxfp4

from . import mm_fakes, moe_reference
from . import moe_layer_reference as ref
from .mm_fakes import host_cai
from .moe_host_kernels import BF16, HostFlat, HostMoeLibrary

layer = importlib.import_module("ferrum_ffi.moe_layer")
E = 8


@pytest.fixture
def lib(monkeypatch):
    fake = mm_fakes.install_library(monkeypatch, HostMoeLibrary())
    for module in (moe, moe_ops, _scratch, _devices, layer):
        monkeypatch.setattr(module, "library", lambda: fake)
    for module in (moe_ops, _scratch, layer):
        monkeypatch.setattr(module, "allocate", lambda like, view, shape, dtype, device, stream=None:
                            HostFlat.empty(shape, dtype))
    for module in (moe, moe_ops, layer):
        monkeypatch.setattr(module, "device_of", lambda obj, view: 0)
    monkeypatch.setattr(_scratch, "_cache", {})
    monkeypatch.setattr(_scratch, "_arrays", {})
    monkeypatch.setattr(_scratch, "_plans", weakref.WeakKeyDictionary())
    # Several tokens align their rows (a test asks for direct routing by name).
    monkeypatch.setattr(layer, "DIRECT_ROUTING_MAX_REPEAT_BYTES", -1)
    return fake


class Layer:
    """Small device-side (host-backed) weights of one kind, their float64
    values registered with the emulated kernels, and the reference's view."""

    def __init__(self, lib: HostMoeLibrary, kind: str, experts: int = E, seed: int = 0,
                 physical_k: int | None = None):
        rng = np.random.default_rng(seed)
        # MXFP4: H = I = 192 (no tile divides the 192 x 192 down projection) run
        # unpadded (partial tiles) unless ``physical_k`` pads both K on request
        # (the original engine's layout).
        self.hidden, inter = (192, 192) if kind == "mxfp4" else (256, 128)
        w13 = rng.standard_normal((experts, 2 * inter, self.hidden)) * 2 / np.sqrt(self.hidden)
        w2 = rng.standard_normal((experts, self.hidden, inter)) / np.sqrt(inter)
        if kind == "mxfp4":
            self.bias13 = (0.5 * rng.standard_normal((experts, 2 * inter))).astype(BF16).astype(np.float64)
            self.bias2 = (0.1 * rng.standard_normal((experts, self.hidden))).astype(BF16).astype(np.float64)
            q13 = ff.MarlinMoeWeight.from_mxfp4(*quantize_mxfp4(w13), bias=self.bias13, physical_k=physical_k)
            q2 = ff.MarlinMoeWeight.from_mxfp4(*quantize_mxfp4(w2), bias=self.bias2, physical_k=physical_k)
            self.activation = "gpt_oss_swiglu"
        else:
            self.bias13 = self.bias2 = None
            q13, q2 = ff.MarlinMoeWeight.from_float(w13, kind), ff.MarlinMoeWeight.from_float(w2, kind)
            self.activation = "silu"
        self.dtype = q13.activation_dtype
        self.w13, self.w2 = q13.to_device(host_cai), q2.to_device(host_cai)
        self.d13, self.d2 = q13.dequantize(), q2.dequantize()
        lib.register(self.w13, self.d13, self.bias13)
        lib.register(self.w2, self.d2, self.bias2)

    def inputs(self, m: int, top_k: int, experts: int = E, seed: int = 1):
        rng = np.random.default_rng(seed)
        x = rng.standard_normal((m, self.w13.k)).astype(np.float32).astype(self.dtype)
        ids = rng.random((m, experts)).argsort(axis=1)[:, :top_k].astype(np.int32)
        weights = (rng.random((m, top_k)) + 0.1).astype(np.float32)
        return x, (weights / weights.sum(axis=1, keepdims=True)).astype(np.float32), ids

    def run(self, x, weights, ids, **kwargs) -> np.ndarray:
        out = ff.fused_moe(host_cai(x), self.w13, self.w2, host_cai(weights), host_cai(ids),
                           activation=self.activation, **kwargs)
        return out.array.astype(np.float64)

    def reference(self, x, weights, ids, expert_map=None, **kwargs) -> np.ndarray:
        return ref.fused_moe(x, self.d13, self.d2, weights, ids, activation=self.activation, dtype=self.dtype,
                             expert_map=expert_map, bias13=self.bias13, bias2=self.bias2, **kwargs)


def assert_matches(got: np.ndarray, expected: np.ndarray, adds: tuple[np.dtype, int] | None = None) -> None:
    """The same float64 math rounded at the same places: only a rare last-place
    flip may differ. ``adds=(dtype, top_k)``: the down GEMM added each token's
    top_k rows into out in ``dtype`` (atomic mode), one rounding per add where
    the reference sums in fp64 and rounds once: up to ~u * sqrt(top_k)."""
    assert np.isfinite(got).all()
    tolerance = 1e-3
    if adds is not None:
        dtype, top_k = adds
        unit = 2.0 ** -(ml_dtypes.finfo(dtype).nmant + 1)
        tolerance = max(tolerance, 2 * unit * np.sqrt(top_k))
    assert np.linalg.norm(got - expected) <= tolerance * np.linalg.norm(expected)


@pytest.mark.parametrize("kind, m, top_k", [("u4b8", 5, 2), ("u4b8", 3, 1), ("fe4m3fn", 6, 8), ("mxfp4", 5, 2),
                                            ("mxfp4", 40, 3)])
@pytest.mark.parametrize("fp32_reduce", [False, True])
def test_layer_matches_the_reference(lib, kind, m, top_k, fp32_reduce):
    moe_layer = Layer(lib, kind)
    x, weights, ids = moe_layer.inputs(m, top_k)
    assert_matches(moe_layer.run(x, weights, ids, fp32_reduce=fp32_reduce), moe_layer.reference(x, weights, ids),
                   None if fp32_reduce else (moe_layer.dtype, top_k))
    gemm = "gemm_mxfp4" if kind == "mxfp4" else "gemm_f16"
    middle = [moe_layer.activation.replace("silu", "silu_and_mul")]
    # Atomic mode adds the rows into out in the down GEMM; fp32 reduce sums them after it.
    summed = ["moe_sum"] if top_k > 1 and fp32_reduce else []
    assert lib.calls == ["memset", "align", gemm] + middle + [gemm] + summed
    if kind == "mxfp4":  # the default: no K padding
        assert (moe_layer.w13.k, moe_layer.w2.k) == (moe_layer.w13.logical_k, moe_layer.w2.logical_k) == (192, 192)


@pytest.mark.parametrize("kind, m, top_k", [("u4b8", 5, 2), ("u4b8", 1, 8), ("fe4m3fn", 6, 8), ("mxfp4", 3, 4)])
def test_direct_routing_matches_the_reference_with_shared_experts(lib, monkeypatch, kind, m, top_k):
    # Tokens sharing experts (8 experts, top_k up to 8): every routed row is a
    # slab of its own, no align; the gate/up output is left zero for the next call.
    monkeypatch.setattr(layer, "DIRECT_ROUTING_MAX_REPEAT_BYTES", 1 << 62)
    moe_layer = Layer(lib, kind)
    gemm = "gemm_mxfp4" if kind == "mxfp4" else "gemm_f16"
    middle = [moe_layer.activation.replace("silu", "silu_and_mul")]
    for seed in range(2):  # the second call adds into what the first call's down GEMM cleared
        x, weights, ids = moe_layer.inputs(m, top_k, seed=seed)
        lib.calls.clear()
        assert_matches(moe_layer.run(x, weights, ids), moe_layer.reference(x, weights, ids), (moe_layer.dtype, top_k))
        assert lib.calls == (["memset", "memset"] if seed == 0 else []) + [gemm] + middle + [gemm]


@pytest.mark.parametrize("m, top_k", [(5, 2), (40, 3)])
@pytest.mark.parametrize("fp32_reduce", [False, True])
def test_mxfp4_padded_on_request_matches_the_reference(lib, m, top_k, fp32_reduce):
    # Both K padded 192 -> 256: hidden is passed padded, the SwiGLU writes the zero padding.
    moe_layer = Layer(lib, "mxfp4", physical_k=256)
    assert (moe_layer.w13.k, moe_layer.w13.logical_k, moe_layer.w2.k, moe_layer.w2.logical_k) == (256, 192, 256, 192)
    x, weights, ids = moe_layer.inputs(m, top_k)
    assert x.shape == (m, 256)
    assert_matches(moe_layer.run(x, weights, ids, fp32_reduce=fp32_reduce), moe_layer.reference(x, weights, ids),
                   None if fp32_reduce else (moe_layer.dtype, top_k))


@pytest.mark.parametrize("block_size", [8, 16, 64])
def test_block_sizes_split_or_pad_the_experts_rows(lib, block_size):
    moe_layer = Layer(lib, "u4b8")
    x, weights, ids = moe_layer.inputs(48, 4)  # 24 rows an expert: 3 blocks of 8, 1 padded block of 64
    assert_matches(moe_layer.run(x, weights, ids, block_size=block_size), moe_layer.reference(x, weights, ids),
                   (moe_layer.dtype, 4))


@pytest.mark.parametrize("kind, top_k", [("u4b8", 2), ("u4b8", 1), ("mxfp4", 3)])
def test_expert_parallel_after_a_full_call_on_the_same_scratch(lib, kind, top_k):
    global_experts = 2 * E
    moe_layer = Layer(lib, kind)  # this rank's E experts of 2E
    mapping = np.full(global_experts, -1, dtype=np.int32)
    mapping[1::2] = np.arange(E, dtype=np.int32)
    x, weights, ids = moe_layer.inputs(7, top_k)
    moe_layer.run(x, weights, ids)  # leaves its rows in the scratch the next call reuses
    x, weights, ids = moe_layer.inputs(7, top_k, experts=global_experts, seed=2)
    got = moe_layer.run(x, weights, ids, expert_map=host_cai(mapping))
    assert_matches(got, moe_layer.reference(x, weights, ids, expert_map=mapping), (moe_layer.dtype, top_k))
    assert (got[(mapping[ids] < 0).all(axis=1)] == 0).all()


def test_a_smaller_call_reads_no_stale_rows(lib):
    moe_layer = Layer(lib, "fe4m3fn")
    moe_layer.run(*moe_layer.inputs(30, 8))
    x, weights, ids = moe_layer.inputs(2, 8, seed=3)
    assert_matches(moe_layer.run(x, weights, ids), moe_layer.reference(x, weights, ids), (moe_layer.dtype, 8))
    assert lib.calls.count("memset") == 1


def test_the_layer_object_from_logits(lib):
    moe_layer = Layer(lib, "mxfp4")
    logits = np.random.default_rng(4).standard_normal((9, E)).astype(np.float32)
    x = moe_layer.inputs(9, 1)[0]
    obj = ff.FusedMoE(moe_layer.w13, moe_layer.w2, top_k=2, activation="gpt_oss_swiglu", renormalize=False)
    got = obj(host_cai(x), host_cai(logits)).array.astype(np.float64)
    weights, ids = moe_reference.topk_softmax(logits, 2, renormalize=False)
    assert_matches(got, moe_layer.reference(x, weights.astype(np.float32), ids), (moe_layer.dtype, 2))


@pytest.mark.parametrize("kind, top_k, expert_parallel", [("u4b8", 2, False), ("u4b8", 1, True), ("fe4m3fn", 3, True),
                                                          ("mxfp4", 2, False), ("mxfp4", 1, True)])
def test_warm_calls_compute_with_their_own_arrays_and_options(lib, monkeypatch, kind, top_k, expert_parallel):
    # The same signature three times, other data and options each time: the
    # first call keeps its plan, the others run it.
    checks = []
    check_call = layer._check_call
    monkeypatch.setattr(layer, "_check_call", lambda *args: checks.append(args) or check_call(*args))
    moe_layer = Layer(lib, kind)
    experts, mapping = E, None
    if expert_parallel:  # this rank's E experts of 2E
        experts, mapping = 2 * E, np.full(2 * E, -1, dtype=np.int32)
        mapping[1::2] = np.arange(E, dtype=np.int32)
    for seed, (alpha, limit) in enumerate([(1.702, 7.0), (1.0, 3.0), (2.5, float("inf"))]):
        x, weights, ids = moe_layer.inputs(6, top_k, experts=experts, seed=seed)
        out = host_cai(np.full((6, moe_layer.hidden), np.nan, dtype=moe_layer.dtype))
        ff.fused_moe(host_cai(x), moe_layer.w13, moe_layer.w2, host_cai(weights), host_cai(ids),
                     activation=moe_layer.activation, expert_map=None if mapping is None else host_cai(mapping),
                     alpha=alpha, limit=limit, out=out)
        expected = moe_layer.reference(x, weights, ids, expert_map=mapping, alpha=alpha, limit=limit)
        assert_matches(out.array.astype(np.float64), expected, (moe_layer.dtype, top_k))
    assert len(checks) == 1
