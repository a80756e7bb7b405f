"""``linear()`` on the CPU: every argument rule before the native call, and the
launch struct it fills (a fake library records it), plus how bfloat16 arrays
are recognised."""

from __future__ import annotations

import numpy as np
import pytest

import ferrum_ffi as ff
from ferrum_ffi import WeightType
from ferrum_ffi._abi import (
    FERRUM_MM_C_TMP_FLOATS_PER_SM,
    FERRUM_MM_FLAG_ACT_ORDER,
    FERRUM_MM_FLAG_ATOMIC_ADD,
    FERRUM_MM_FLAG_FP32_REDUCE,
    FERRUM_MM_FLAG_HAS_ZERO_POINTS,
    FERRUM_MM_FLAG_K_FULL,
    FERRUM_MM_WORKSPACE_INTS_PER_SM,
)
from ferrum_ffi._interop import as_device_array
from ferrum_ffi.status import ArgumentError, ArgumentTypeError, NativeError

from . import mm_fakes
from .mm_fakes import FakeCAI, bf16_cai

BF16 = np.dtype(pytest.importorskip("ml_dtypes").bfloat16)
K, N, SMS = 256, 128, 132


@pytest.fixture
def lib(monkeypatch):
    return mm_fakes.install(monkeypatch, mm_fakes.FakeLibrary(sms=SMS))


def weight(b_type=WeightType.U4B8, group_size=128, act_order=False, bf16=False, n=N, in_features=None):
    bits = 4 if b_type in (WeightType.U4, WeightType.U4B8) else 8
    groups = 1 if group_size == -1 else K // group_size
    scales = bf16_cai((groups, n)) if bf16 else FakeCAI((groups, n), "<f2")
    return ff.MarlinLinearWeight(
        b=FakeCAI((K // 16, bits // 2 * n), "<i4"),
        scales=scales,
        k=K, n=n, group_size=group_size, b_type=b_type, dtype=BF16 if bf16 else np.float16,
        zero_points=FakeCAI((groups, n // 8), "<i4") if b_type is WeightType.U4 else None,
        g_idx=FakeCAI((K,), "<i4") if act_order else None,
        perm=FakeCAI((K,), "<i4") if act_order else None,
        in_features=in_features,
    )


def x16(m, k=K, **kwargs):
    return FakeCAI((m, k), "<f2", **kwargs)


# ---- the struct linear() fills -------------------------------------------------------------


def test_plain_call_fills_the_struct(lib):
    w = weight()
    x, out = x16(5), FakeCAI((5, N), "<f2")
    assert ff.linear(x, w, out=out, stream=7) is out
    (f,) = lib.launches
    assert (f["m"], f["n"], f["k"], f["lda"], f["group_size"], f["num_groups"]) == (5, N, K, K, 128, 2)
    assert (f["a_type"], f["b_type"]) == (1, int(WeightType.U4B8))
    assert f["flags"] == FERRUM_MM_FLAG_K_FULL | FERRUM_MM_FLAG_ATOMIC_ADD
    assert f["a"] == x.__cuda_array_interface__["data"][0]
    assert f["c"] == out.__cuda_array_interface__["data"][0]
    assert f["b"] == w.b.__cuda_array_interface__["data"][0]
    assert f["b_scales"] == w.scales.__cuda_array_interface__["data"][0]
    assert f["zero_points"] == f["g_idx"] == f["perm"] == f["a_tmp"] == f["c_tmp"] == f["bias"] == f["a_scales"] == 0
    assert f["workspace_bytes"] >= FERRUM_MM_WORKSPACE_INTS_PER_SM * SMS * 4
    assert (f["stream"], f["device"], f["sms"], f["thread_k"], f["thread_n"]) == (7, 0, -1, -1, -1)
    # the workspace is zeroed on the launch stream when it is allocated, not per call: every kernel leaves it zero
    assert lib.memsets == [(f["workspace"], 0, f["workspace_bytes"], 7)]
    ff.linear(x16(5), w, out=out, stream=7)
    assert len(lib.memsets) == 1


def test_zero_points_act_order_fp32_reduce_and_bias(lib):
    w = weight(WeightType.U4, 64, act_order=True, bf16=True)
    x, bias = bf16_cai((3, K)), bf16_cai((N,))
    out = ff.linear(x, w, bias=bias, fp32_reduce=True)
    assert as_device_array(out, "out").dtype == BF16 and as_device_array(out, "out").shape == (3, N)
    (f,) = lib.launches
    assert f["flags"] == (FERRUM_MM_FLAG_K_FULL | FERRUM_MM_FLAG_HAS_ZERO_POINTS | FERRUM_MM_FLAG_ACT_ORDER
                          | FERRUM_MM_FLAG_FP32_REDUCE)
    assert f["a_type"] == 2 and f["b_type"] == int(WeightType.U4)
    assert f["zero_points"] == w.zero_points.__cuda_array_interface__["data"][0]
    assert f["g_idx"] == w.g_idx.__cuda_array_interface__["data"][0]
    assert f["perm"] == w.perm.__cuda_array_interface__["data"][0]
    assert f["bias"] == bias.__cuda_array_interface__["data"][0]
    assert f["a_tmp"] and f["a_tmp_bytes"] >= 3 * K * 2
    assert f["c_tmp"] and f["c_tmp_bytes"] >= FERRUM_MM_C_TMP_FLOATS_PER_SM * SMS * 4


def test_scratch_is_cached_per_stream_and_grown_on_demand(lib):
    w = weight(act_order=True)
    ff.linear(x16(4), w, stream=5)
    ff.linear(x16(2), w, stream=5)
    ff.linear(x16(4), w, stream=6)
    first, second, other = lib.launches
    assert first["workspace"] == second["workspace"] != other["workspace"]
    assert first["a_tmp"] == second["a_tmp"] != other["a_tmp"]
    ff.linear(x16(64), w, stream=5)  # a bigger gather buffer replaces the small one
    assert lib.launches[-1]["a_tmp"] != first["a_tmp"] and lib.launches[-1]["a_tmp_bytes"] >= 64 * K * 2
    scratch = [stream for _, dtype, stream in lib.allocations if dtype != np.float16]  # not the outputs
    assert scratch and all(stream in (5, 6) for stream in scratch)  # allocated on the launch stream


def test_row_stride_becomes_lda(lib):
    ff.linear(x16(4, strides=(2 * 264, 2)), weight())
    assert lib.launches[-1]["lda"] == 264


def test_a_padded_k_shard_takes_its_own_width(lib):
    # from_gptq(k_full=False): k = 256 padded rows gathered from x's 200 columns.
    w = weight(act_order=True, in_features=200)
    assert w.in_features == 200 and w.k == K
    ff.linear(x16(3, k=200), w)
    f = lib.launches[-1]
    assert (f["m"], f["k"], f["lda"]) == (3, K, 200) and f["flags"] & FERRUM_MM_FLAG_ACT_ORDER
    assert f["a_tmp_bytes"] >= 3 * K * 2
    with pytest.raises(ArgumentError, match=r"x has 256 columns \(last dimension\), the weight takes in_features=200"):
        ff.linear(x16(3), w)
    for bad, kwargs in ((200, {}), (0, dict(act_order=True)), (K + 8, dict(act_order=True))):
        with pytest.raises(ArgumentError, match=rf"in_features={bad} must equal k={K}, or for an act-order weight"):
            weight(in_features=bad, **kwargs)


def k_shard_weight(groups=24, n=N, b_type=WeightType.U4, **kwargs):
    """A K shard in vLLM's layout: the whole layer's groups, K_FULL clear."""
    return ff.MarlinLinearWeight(
        b=FakeCAI((K // 16, 2 * n), "<i4"), scales=FakeCAI((groups, n), "<f2"), k=K, n=n, group_size=128,
        b_type=b_type, zero_points=FakeCAI((groups, n // 8), "<i4") if b_type is WeightType.U4 else None,
        g_idx=FakeCAI((K,), "<i4"), perm=FakeCAI((K,), "<i4"), in_features=200, k_full=False, **kwargs,
    )


def test_a_row_group_k_shard_clears_k_full(lib):
    w = k_shard_weight()
    assert w.num_groups == 24 and not w.k_full
    ff.linear(x16(3, k=200), w)
    f = lib.launches[-1]
    assert not f["flags"] & FERRUM_MM_FLAG_K_FULL and f["flags"] & FERRUM_MM_FLAG_ACT_ORDER
    assert (f["num_groups"], f["k"], f["lda"]) == (24, K, 200)
    with pytest.raises(ArgumentError, match=r"n=64 must be divisible by 128 with K_FULL clear"):
        k_shard_weight(n=64)
    with pytest.raises(ArgumentError, match=r"k_full=False \(a K shard of an act-order layer\) needs g_idx and perm"):
        ff.MarlinLinearWeight(b=FakeCAI((K // 16, 2 * N), "<i4"), scales=FakeCAI((24, N), "<f2"), k=K, n=N,
                              group_size=128, b_type=WeightType.U4B8, k_full=False)
    with pytest.raises(ArgumentTypeError, match=r"k_full must be a bool"):
        ff.MarlinLinearWeight(b=FakeCAI((K // 16, 2 * N), "<i4"), scales=FakeCAI((24, N), "<f2"), k=K, n=N,
                              group_size=128, b_type=WeightType.U4B8, g_idx=FakeCAI((K,), "<i4"),
                              perm=FakeCAI((K,), "<i4"), k_full="no")


def test_leading_dimensions_are_rows(lib):
    x = FakeCAI((2, 3, K), "<f2")
    out = ff.linear(x, weight())
    assert as_device_array(out, "out").shape == (2, 3, N)
    assert lib.launches[-1]["m"] == 6
    out = ff.linear(FakeCAI((K,), "<f2"), weight())
    assert as_device_array(out, "out").shape == (N,) and lib.launches[-1]["m"] == 1


def test_m_zero_returns_an_empty_output_without_the_library(lib):
    out = ff.linear(x16(0), weight())
    assert as_device_array(out, "out").shape == (0, N)
    assert lib.launches == [] and lib.memsets == []


def test_overrides_reach_the_struct(lib):
    ff.linear(x16(16), weight(), thread_k=128, thread_n=64, sms=3)
    f = lib.launches[-1]
    assert (f["thread_k"], f["thread_n"], f["sms"]) == (128, 64, 3)
    assert f["workspace_bytes"] >= FERRUM_MM_WORKSPACE_INTS_PER_SM * 3 * 4


def test_native_failure_names_linear(lib):
    lib.status = (6 << 16) | 719
    lib.detail = "launch failed"
    with pytest.raises(NativeError) as info:
        ff.linear(x16(2), weight())
    assert info.value.entry_point == "linear" and info.value.stage_name == "kernel-launch"
    assert info.value.shape["b_type"] == "U4B8"


@pytest.mark.parametrize("kept", [False, True])
def test_a_failed_launch_zeroes_the_workspace(lib, kept):
    # What a failure left in the locks is unknown: they are zeroed after it, on the stream.
    w = weight()
    if kept:
        ff.linear(x16(2), w, stream=3)
    lib.status = (6 << 16) | 719
    with pytest.raises(NativeError):
        ff.linear(x16(2), w, stream=3)
    f = lib.launches[-1]
    assert lib.memsets[-1] == (f["workspace"], 0, f["workspace_bytes"], 3)
    assert len(lib.memsets) == 2  # when allocated, and after the failure


# ---- rules, before anything native -------------------------------------------------------------


def rejects(match, exc=ArgumentError, **kwargs):
    call = dict(x=x16(4), weight=weight())
    call.update(kwargs)
    with pytest.raises(exc, match=match):
        ff.linear(**call)


def test_weight_must_be_a_linear_weight(lib):
    rejects(r"linear: weight must be a MarlinLinearWeight", ArgumentTypeError, weight=object())


def test_x_dtype_must_be_the_weights(lib):
    rejects(r"linear: x must have dtype float16 .* got bfloat16", ArgumentTypeError, x=bf16_cai((4, K)))
    rejects(r"linear: x must have dtype bfloat16 .* got float16", ArgumentTypeError, weight=weight(bf16=True))
    rejects(r"x must have dtype float16 .* got uint16", ArgumentTypeError, x=FakeCAI((4, K), "<u2"))


def test_x_columns_must_be_k(lib):
    rejects(r"x has 128 columns \(last dimension\), the weight takes in_features=256", x=x16(4, k=128))


def test_x_layout(lib):
    strided_3d = FakeCAI((2, 3, K), "<f2", strides=(4 * K * 2, K * 2 * 2, 2))
    rejects(r"x must be C-contiguous, or 2-D with unit column stride", x=strided_3d)
    rejects(r"x must be C-contiguous, or 2-D with unit column stride", x=x16(4, strides=(K * 2, 4)))
    rejects(r"linear: lda=260 must be divisible by 8", x=x16(4, strides=(260 * 2, 2)))
    rejects(r"x pointer 0x[0-9a-f]+ must be 16-byte aligned", x=x16(4, ptr=0x10008))
    rejects(r"x must have at least one dimension", x=FakeCAI((), "<f2"))


def test_bias_rules(lib):
    rejects(r"bias must have shape \(128,\)", bias=FakeCAI((N + 64,), "<f2"))
    rejects(r"bias must have dtype float16", ArgumentTypeError, bias=FakeCAI((N,), "<f4"))
    rejects(r"bias pointer 0x[0-9a-f]+ must be 16-byte aligned", bias=FakeCAI((N,), "<f2", ptr=0x20004))


def test_out_rules(lib):
    rejects(r"out must have shape \(4, 128\)", out=FakeCAI((4, N + 64), "<f2"))
    rejects(r"out must have dtype float16", ArgumentTypeError, out=FakeCAI((4, N), "<f4"))
    rejects(r"out is read-only", out=FakeCAI((4, N), "<f2", readonly=True))
    rejects(r"out must be C-contiguous", out=FakeCAI((4, N), "<f2", strides=(N * 4, 2)))


def test_call_options(lib):
    rejects(r"fp32_reduce must be a bool", ArgumentTypeError, fp32_reduce=1)
    rejects(r"tile \(thread_k=128, thread_n=256\) serves m <= 16, got m=17",
            x=x16(17), thread_k=128, thread_n=256, weight=weight(n=256))
    rejects(r"\(thread_k, thread_n\)=\(64, 64\) must be one of", thread_k=64, thread_n=64)
    rejects(r"linear: sms=0 must be -1", sms=0)
    assert lib.launches == []


def test_a_kept_plan_still_checks_every_call(lib):
    # The first call of a shape keeps its checked plan on the weight; later
    # calls of that shape still check their arrays and tuning arguments.
    w = weight()
    ff.linear(x16(4), w, sms=1)
    assert list(w._plans) == [(4, K, False, 1, -1, -1)]
    rejects(r"x pointer 0x[0-9a-f]+ must be 16-byte aligned", x=x16(4, ptr=0x10008), weight=w, sms=1)
    rejects(r"linear: sms must be an integer", ArgumentTypeError, weight=w, sms=True)
    rejects(r"linear: sms must be an integer", ArgumentTypeError, weight=w, sms=1.0)
    ff.linear(x16(4), w, sms=np.int64(1))  # checked, not kept: equal to 1 as a key only
    assert list(w._plans) == [(4, K, False, 1, -1, -1)] and len(lib.launches) == 2
    assert lib.launches[0]["sms"] == lib.launches[1]["sms"] == 1


def test_kept_plans_are_bounded(lib):
    w = weight()
    for m in range(1, 100):
        ff.linear(x16(m), w)
    assert 0 < len(w._plans) <= 64
    assert [f["m"] for f in lib.launches] == list(range(1, 100))


# ---- launches kept per plan and stream ---------------------------------------------------------


@pytest.fixture
def full_checks(monkeypatch):
    """Counts the calls that take the full pointer checks (not a kept launch)."""
    from ferrum_ffi import general_gemm

    calls = []
    checked = general_gemm.validate_mm_buffers

    def counting(*args, **kwargs):
        calls.append(1)
        return checked(*args, **kwargs)

    monkeypatch.setattr(general_gemm, "validate_mm_buffers", counting)
    return calls


def pointer(array) -> int:
    return array.__cuda_array_interface__["data"][0]


def test_a_kept_launch_fills_in_only_the_callers_pointers(lib, full_checks):
    w = weight(WeightType.U4, 64, act_order=True, bf16=True)
    calls = [(bf16_cai((3, K)), bf16_cai((N,)), bf16_cai((3, N))) for _ in range(4)]
    for x, bias, out in calls:
        ff.linear(x, w, bias=bias, out=out, fp32_reduce=True, stream=9)
    # the first call allocates the scratch and keeps its launch; the others fill it in
    assert len(full_checks) == 1 and len(lib.launches) == 4
    kept = lib.launches[0]
    for (x, bias, out), f in zip(calls[1:], lib.launches[1:]):
        assert (f["a"], f["c"], f["bias"]) == (pointer(x), pointer(out), pointer(bias))
        assert {k: v for k, v in f.items() if k not in ("a", "c", "bias")} == {
            k: v for k, v in kept.items() if k not in ("a", "c", "bias")}
    assert lib.memsets == [(kept["workspace"], 0, kept["workspace_bytes"], 9)]  # when allocated only
    ff.linear(bf16_cai((3, K)), w, fp32_reduce=True, stream=9)  # no bias: a null bias pointer
    assert lib.launches[-1]["bias"] == 0 and len(full_checks) == 1


def test_kept_launches_are_per_stream_and_mode(lib, full_checks):
    w = weight()
    for _ in range(3):
        for stream in (5, 6):
            for fp32_reduce in (False, True):
                ff.linear(x16(4), w, stream=stream, fp32_reduce=fp32_reduce)
    streams = [(f["stream"], bool(f["flags"] & FERRUM_MM_FLAG_FP32_REDUCE)) for f in lib.launches]
    assert streams == [(5, False), (5, True), (6, False), (6, True)] * 3
    workspaces = {f["stream"]: f["workspace"] for f in lib.launches[:4]}
    assert workspaces[5] != workspaces[6]
    assert all(f["workspace"] == workspaces[f["stream"]] for f in lib.launches)
    assert len(full_checks) < len(lib.launches)


def test_a_kept_launch_goes_with_the_scratch(lib, full_checks):
    w = weight()
    for _ in range(3):
        ff.linear(x16(4), w)
    checked, first = len(full_checks), lib.launches[-1]["workspace"]
    ff.release_scratch()
    ff.linear(x16(4), w)
    assert len(full_checks) == checked + 1 and lib.launches[-1]["workspace"] != first
    # a larger request on the stream replaces the workspace: no launch names the old one
    for _ in range(2):
        ff.linear(x16(4), w)
    ff.linear(x16(4), w, sms=SMS * 4)
    ff.linear(x16(4), w)
    assert lib.launches[-1]["workspace"] == lib.launches[-2]["workspace"] != first


def test_a_kept_launch_still_checks_every_array(lib, full_checks):
    w = weight()
    for _ in range(3):
        ff.linear(x16(4), w, bias=FakeCAI((N,), "<f2"), out=FakeCAI((4, N), "<f2"))
    launched = len(lib.launches)
    rejects(r"x pointer 0x[0-9a-f]+ must be 16-byte aligned", x=x16(4, ptr=0x10008), weight=w)
    rejects(r"x: __cuda_array_interface__ data pointer is NULL", x=x16(4, ptr=0), weight=w)
    rejects(r"out must have shape \(4, 128\)", out=FakeCAI((4, N + 64), "<f2"), weight=w)
    rejects(r"out is read-only", out=FakeCAI((4, N), "<f2", readonly=True), weight=w)
    rejects(r"bias pointer 0x[0-9a-f]+ must be 16-byte aligned", bias=FakeCAI((N,), "<f2", ptr=0x20004), weight=w)
    rejects(r"bias must have dtype float16", ArgumentTypeError, bias=FakeCAI((N,), "<f4"), weight=w)
    assert len(lib.launches) == launched


def test_profiling_options_take_the_full_path(lib, full_checks, monkeypatch):
    from ferrum_ffi import general_gemm, profile

    w = weight()
    for _ in range(3):
        ff.linear(x16(4), w)
    checked = len(full_checks)
    monkeypatch.setattr(general_gemm.profile, "runtime_config",
                        lambda: profile.RuntimeConfig(trace_shapes=True, trace_shapes_max=0))
    ff.linear(x16(4), w)
    assert len(full_checks) == checked + 1
    monkeypatch.setattr(general_gemm.profile, "runtime_config", lambda: profile.RuntimeConfig(profile=False))
    ff.linear(x16(4), w)
    assert len(full_checks) == checked + 1


def test_x_on_another_device_is_rejected(lib, monkeypatch):
    from ferrum_ffi import general_gemm

    monkeypatch.setattr(general_gemm, "device_of", lambda obj, view: 1)
    rejects(r"x is on device 1, the weight on device 0")


# ---- bfloat16 arrays ------------------------------------------------------------------------------


def test_linear_on_a_bfloat16_view_returns_one(lib):
    w = weight(bf16=True)
    out = ff.linear(ff.bfloat16_view(FakeCAI((3, K), "<u2")), w)
    assert as_device_array(out, "out").dtype == BF16
    assert lib.launches[-1]["a_type"] == 2
