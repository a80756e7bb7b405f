"""The MoE launches of ferrum_ffi.moe on the CPU: what reaches the native entry
points (a fake library records the calls), every rule checked before them for
raw pointers and for arrays, NativeError on failure, and the profile sink."""

from __future__ import annotations

import json

import numpy as np
import pytest

import ferrum_ffi as ff
from ferrum_ffi import _devices, moe
from ferrum_ffi.moe_validation import MoeBucketProblem, MoeF16WeightType, moe_bucket_spans
from ferrum_ffi.status import ArgumentError, ArgumentTypeError, NativeError, ProfileSinkError
from ferrum_ffi.validation import I32_MAX

from . import mm_fakes
from .mm_fakes import FakeCAI

SMS = 132


class MoeFakeLibrary(mm_fakes.FakeLibrary):
    """Records every MoE entry-point call; the profile sink opens unless told
    otherwise."""

    def __init__(self, status: int = 0, sink_opens: bool = True, sink_reason: str = "") -> None:
        super().__init__(status=status, sms=SMS)
        self.calls: list[tuple[str, tuple]] = []
        self.sink_opens = sink_opens
        self.sink_reason = sink_reason
        self.sink_enabled = 0
        self.sink_args: tuple | None = None
        self.error = ""

    def _record(self, name: str, args: tuple) -> int:
        self.calls.append((name, args))
        return self.status

    def ferrum_vllm_marlin_moe_f16(self, *args) -> int:
        return self._record("ferrum_vllm_marlin_moe_f16", args)

    def ferrum_vllm_marlin_moe_fp8_f16(self, *args) -> int:
        return self._record("ferrum_vllm_marlin_moe_fp8_f16", args)

    def ferrum_vllm_marlin_moe_mxfp4_bf16(self, *args) -> int:
        return self._record("ferrum_vllm_marlin_moe_mxfp4_bf16", args)

    def marlin_cuda_moe(self, *args) -> int:
        return self._record("marlin_cuda_moe", args)

    def ferrum_vllm_marlin_moe_set_profile_config(self, *args) -> None:
        self.sink_args = args
        self.sink_enabled = int(self.sink_opens)
        self.error = "" if self.sink_opens else self.sink_reason

    def ferrum_vllm_marlin_moe_clear_profile_config(self) -> None:
        self.calls.append(("clear", ()))
        self.sink_enabled = 0

    def ferrum_vllm_marlin_moe_profile_enabled(self) -> int:
        self.error = ""  # as a native success would
        return self.sink_enabled

    def last_error(self) -> str:
        return self.detail if self.status else self.error


@pytest.fixture
def lib(monkeypatch):
    fake = mm_fakes.install_library(monkeypatch, MoeFakeLibrary())
    monkeypatch.setattr(moe, "library", lambda: fake)
    monkeypatch.setattr(_devices, "library", lambda: fake)
    monkeypatch.setattr(moe, "device_of", lambda obj, view: 0)
    return fake


# ---- INT4 / FP8 with raw pointers -------------------------------------------------------

RAW = dict(a=0x1000, b=0x2000, c=0x3000, scales=0x4000, workspace=0x5000, sorted_token_ids=0x6000,
           expert_ids=0x7000, num_tokens_past_padded=0x8000, prob_m=4, prob_n=1024, prob_k=2048, top_k=8,
           moe_block_size=16, group_size=128)


def test_raw_int4_call_reaches_the_f16_entry(lib):
    ff.launch_marlin_moe(**RAW)
    assert lib.calls == [("ferrum_vllm_marlin_moe_f16", (
        0x1000, 0x2000, 0x3000, None, 0x4000, None, 0x5000, 0x6000, 0x7000, 0x8000, None,
        16, 8, 0, 0, 4, 1024, 2048, 128, 0, 0, 0, 1, 0))]
    assert lib.device_queries == 1  # the device's multiprocessors size the workspace


def test_raw_zero_points_fp32_reduce_and_topk_weights(lib):
    ff.launch_marlin_moe(**RAW, zero_points=0xA000, c_tmp=0x9000, topk_weights=0xB000, mul_topk_weights=True,
                         is_ep=True, use_fp32_reduce=True, device=2, stream=77)
    name, args = lib.calls[0]
    assert name == "ferrum_vllm_marlin_moe_f16"
    assert args[3] == 0x9000 and args[5] == 0xA000 and args[10] == 0xB000
    assert args[13:15] == (1, 1)  # mul_topk_weights, is_ep
    assert args[19:] == (1, 2, 77, 0, 1)  # has_zp, dev, stream, use_atomic_add, use_fp32_reduce


def test_raw_fp8_reaches_the_fp8_entry_without_zero_points(lib):
    ff.launch_marlin_moe(**{**RAW, "group_size": -1}, weight_type=MoeF16WeightType.E4M3)
    name, args = lib.calls[0]
    assert name == "ferrum_vllm_marlin_moe_fp8_f16"
    assert args[5] is None and args[19] == 0 and args[18] == -1


def test_a_stream_object_is_resolved(lib):
    class Stream:
        def __cuda_stream__(self):
            return (0, 0xABC0)

    ff.launch_marlin_moe(**RAW, stream=Stream())
    assert lib.calls[0][1][21] == 0xABC0


@pytest.mark.parametrize(
    "changes, message",
    [(dict(prob_n=96), "prob_n 96 must be divisible by the Marlin minimum thread width 64"),
     (dict(a=0), "a pointer must be non-null"),
     (dict(group_size=16), "INT4 group_size must be -1, 32, 64 or a power of two >= 128"),
     (dict(device=-1), "device_ordinal must be non-negative, got -1"),
     (dict(mul_topk_weights=True), "mul_topk_weights requires a non-null topk_weights pointer")],
)
def test_raw_rules_are_checked_before_any_native_call(lib, changes, message):
    with pytest.raises(ArgumentError, match=message):
        ff.launch_marlin_moe(**{**RAW, **changes})
    assert lib.calls == [] and lib.device_queries == 0


@pytest.mark.parametrize("n, k", [(192, 320), (64, 64), (2880, 2880)])
def test_raw_partial_tile_shapes_reach_the_library(lib, n, k):
    # No tile has to divide (n, k): the kernels run a partial last tile.
    ff.launch_marlin_moe(**{**RAW, "prob_n": n, "prob_k": k, "group_size": -1})
    ff.launch_marlin_moe(**{**RAW, "prob_n": n, "prob_k": k, "group_size": -1}, weight_type=MoeF16WeightType.E4M3)
    ff.launch_marlin_moe_mxfp4_bf16(**{**MXFP4_RAW, "prob_n": n, "prob_k": k})
    assert [args[16:18] for _, args in lib.calls] == [(n, k)] * 3


def test_raw_declared_spans_are_checked(lib):
    ff.launch_marlin_moe(**RAW, expert_count=8, spans={"b": 8 * 2048 * 1024 // 2, "workspace": 4 * SMS * 4})
    with pytest.raises(ArgumentError, match=f"workspace holds 16 bytes, needs {4 * SMS * 4}"):
        ff.launch_marlin_moe(**RAW, spans={"workspace": 16})
    with pytest.raises(ArgumentError, match="spans names 'b', whose size this launch does not determine"):
        ff.launch_marlin_moe(**RAW, spans={"b": 1 << 30})  # no expert_count: b is not sized
    assert len(lib.calls) == 1


def test_raw_c_tmp_range_is_checked_with_the_device_sms(lib):
    with pytest.raises(ArgumentError, match="c_tmp pointer range overflows the u64 device domain"):
        ff.launch_marlin_moe(**RAW, c_tmp=2**64 - 2**20, use_fp32_reduce=True)
    assert lib.calls == []


def test_pointers_and_arrays_do_not_mix(lib):
    with pytest.raises(ArgumentError, match=r"not a mix \(pointers: .*; arrays: a\)"):
        ff.launch_marlin_moe(**{**RAW, "a": FakeCAI((4, 2048), "<f2")})


def test_native_failure_raises_native_error_with_the_shape(lib):
    lib.status = (6 << 16) | 701
    with pytest.raises(NativeError) as info:
        ff.launch_marlin_moe(**RAW)
    err = info.value
    assert err.entry_point == "ferrum_vllm_marlin_moe_f16"
    assert (err.stage, err.stage_name, err.cuda_status) == (6, "kernel-launch", 701)
    assert err.shape["m"] == 4 and err.shape["n"] == 1024 and err.shape["k"] == 2048
    assert err.detail == "fake native detail"


# ---- INT4 with arrays -------------------------------------------------------------------

M, N, K, TOP_K, E, BLOCK = 4, 256, 256, 2, 4, 16


def arrays(**changes):
    """A consistent INT4 launch of E experts, group 128, as fake device arrays."""
    buffers = dict(
        a=FakeCAI((M, K), "<f2"),
        b=FakeCAI((E, K // 16, 2 * N), "<i4"),
        c=FakeCAI((M * TOP_K, N), "<f2"),
        scales=FakeCAI((E, K // 128, N), "<f2"),
        workspace=FakeCAI((4 * SMS,), "<i4"),
        sorted_token_ids=FakeCAI((M * TOP_K + E * (BLOCK - 1),), "<i4"),
        expert_ids=FakeCAI((8,), "<i4"),
        num_tokens_past_padded=FakeCAI((1,), "<i4"),
    )
    buffers.update(changes)
    return buffers


SHAPE = dict(prob_m=M, prob_n=N, prob_k=K, top_k=TOP_K, moe_block_size=BLOCK, group_size=128)


def ptr(array) -> int:
    return array.__cuda_array_interface__["data"][0]


def test_arrays_pass_their_pointers(lib):
    buffers = arrays()
    ff.launch_marlin_moe(**buffers, **SHAPE)
    name, args = lib.calls[0]
    assert name == "ferrum_vllm_marlin_moe_f16"
    assert args[:3] == (ptr(buffers["a"]), ptr(buffers["b"]), ptr(buffers["c"]))
    assert args[4] == ptr(buffers["scales"]) and args[6] == ptr(buffers["workspace"])
    assert args[7:10] == tuple(ptr(buffers[n]) for n in ("sorted_token_ids", "expert_ids", "num_tokens_past_padded"))


def test_arrays_with_zero_points_and_fp32_reduce(lib):
    kernel_c_tmp = 1024 * BLOCK * SMS
    buffers = arrays(zero_points=FakeCAI((E, K // 128, N // 8), "<i4"), c_tmp=FakeCAI((kernel_c_tmp,), "<f4"),
                     topk_weights=FakeCAI((M * TOP_K,), "<f4"))
    ff.launch_marlin_moe(**buffers, **SHAPE, use_fp32_reduce=True, mul_topk_weights=True)
    args = lib.calls[0][1]
    assert args[5] == ptr(buffers["zero_points"]) and args[19] == 1 and args[22:] == (0, 1)


def test_the_expert_count_comes_from_b(lib):
    # b holds four experts, so four experts' scales are required.
    with pytest.raises(ArgumentError, match=f"scales holds {3 * 2 * N * 2} bytes, needs {E * 2 * N * 2}"):
        ff.launch_marlin_moe(**arrays(scales=FakeCAI((3, 2, N), "<f2")), **SHAPE)
    with pytest.raises(ArgumentError, match=r"b holds 1024 bytes, less than one expert's weight \(32768 bytes\)"):
        ff.launch_marlin_moe(**arrays(b=FakeCAI((256,), "<i4")), **SHAPE)
    # An explicit expert_count wins: now b is too small.
    with pytest.raises(ArgumentError, match="b holds 131072 bytes, needs 262144"):
        ff.launch_marlin_moe(**arrays(), **SHAPE, expert_count=8)
    assert lib.calls == []


@pytest.mark.parametrize(
    "name, array, exc, message",
    [("a", FakeCAI((M, K), "<f4"), ArgumentTypeError, "a must have dtype float16, got float32"),
     ("b", FakeCAI((E, K // 16, 2 * N), "<u4"), ArgumentTypeError, "b must have dtype int32"),
     ("scales", FakeCAI((E, 2, N), "<f4"), ArgumentTypeError, "scales must have dtype float16"),
     ("sorted_token_ids", FakeCAI((64,), "<i8"), ArgumentTypeError, "sorted_token_ids must have dtype int32"),
     ("a", FakeCAI((M, K), "<f2", strides=(2, 2 * M)), ArgumentError, "a must be C-contiguous"),
     ("c", FakeCAI((M * TOP_K, N), "<f2", readonly=True), ArgumentError, "c is read-only"),
     ("workspace", FakeCAI((4 * SMS,), "<i4", readonly=True), ArgumentError, "workspace is read-only"),
     ("num_tokens_past_padded", FakeCAI((0,), "<i4"), ArgumentError, "num_tokens_past_padded must hold one int32"),
     ("workspace", FakeCAI((4 * SMS - 1,), "<i4"), ArgumentError,
      f"workspace holds {(4 * SMS - 1) * 4} bytes, needs {4 * SMS * 4}"),
     ("c", FakeCAI((M, N), "<f2"), ArgumentError, f"c holds {M * N * 2} bytes, needs {M * TOP_K * N * 2}"),
     ("a", FakeCAI((M, K), "<f2", ptr=0x7000_0008), ArgumentError, "a pointer 0x70000008 must be aligned to 16")],
)
def test_array_rules(lib, name, array, exc, message):
    with pytest.raises(exc, match=message):
        ff.launch_marlin_moe(**arrays(**{name: array}), **SHAPE)
    assert lib.calls == []


def test_c_tmp_array_must_hold_the_kernel_minimum(lib):
    rows_only = M * TOP_K * N
    with pytest.raises(ArgumentError, match=f"c_tmp holds {rows_only * 4} bytes, needs {1024 * BLOCK * SMS * 4}"):
        ff.launch_marlin_moe(**arrays(c_tmp=FakeCAI((rows_only,), "<f4")), **SHAPE, use_fp32_reduce=True)


def test_arrays_must_share_a_device(lib, monkeypatch):
    buffers = arrays()
    monkeypatch.setattr(moe, "device_of", lambda obj, view: 1 if obj is buffers["scales"] else 0)
    with pytest.raises(ArgumentError, match="scales is on device 1, a on device 0"):
        ff.launch_marlin_moe(**buffers, **SHAPE)
    monkeypatch.setattr(moe, "device_of", lambda obj, view: 0)
    with pytest.raises(ArgumentError, match="device=1, but the arrays are on device 0"):
        ff.launch_marlin_moe(**buffers, **SHAPE, device=1)
    with pytest.raises(ArgumentError, match="spans declares the sizes of raw pointers"):
        ff.launch_marlin_moe(**buffers, **SHAPE, spans={"a": 1 << 20})
    assert lib.calls == []


# ---- MXFP4 x BF16 -----------------------------------------------------------------------

MXFP4_RAW = dict(a=0x1000, b=0x2000, c=0x3000, bias=0x4000, scales=0x5000, workspace=0x6000,
                 sorted_token_ids=0x7000, expert_ids=0x8000, num_tokens_past_padded=0x9000, expert_count=4,
                 prob_m=4, prob_n=512, prob_k=256, top_k=2, moe_block_size=16)


def test_raw_mxfp4_call(lib):
    ff.launch_marlin_moe_mxfp4_bf16(**MXFP4_RAW, c_tmp=0xA000, use_fp32_reduce=True, stream=5)
    assert lib.calls == [("ferrum_vllm_marlin_moe_mxfp4_bf16", (
        0x1000, 0x2000, 0x3000, 0xA000, 0x4000, 0x5000, 0x6000, 0x7000, 0x8000, 0x9000, None,
        16, 2, 0, 0, 4, 512, 256, 32, 0, 5, 0, 1))]


def test_raw_mxfp4_rules(lib):
    with pytest.raises(ArgumentError, match="MXFP4 top_k must be in 1..=expert_count, got top_k=5 expert_count=4"):
        ff.launch_marlin_moe_mxfp4_bf16(**{**MXFP4_RAW, "top_k": 5})
    with pytest.raises(ArgumentError, match="MXFP4 prob_k 2912 must be divisible by the Marlin minimum thread "
                                            "width 64"):
        ff.launch_marlin_moe_mxfp4_bf16(**{**MXFP4_RAW, "prob_k": 2912})
    with pytest.raises(ArgumentError, match=f"scales holds 16 bytes, needs {4 * 8 * 512}"):
        ff.launch_marlin_moe_mxfp4_bf16(**MXFP4_RAW, spans={"scales": 16})
    assert lib.calls == []


def mxfp4_arrays(**changes):
    bf16_cai = mm_fakes.bf16_cai
    m, n, k, top_k, experts = 4, 512, 256, 2, 4
    buffers = dict(
        a=bf16_cai((m, k)), b=FakeCAI((experts, k // 16, 2 * n), "<i4"), c=bf16_cai((m * top_k, n)),
        bias=bf16_cai((experts, n)), scales=FakeCAI((experts, k // 32, n), "|u1"),
        workspace=FakeCAI((4 * SMS,), "<i4"), sorted_token_ids=FakeCAI((64,), "<i4"),
        expert_ids=FakeCAI((8,), "<i4"), num_tokens_past_padded=FakeCAI((1,), "<i4"),
    )
    buffers.update(changes)
    return buffers


MXFP4_SHAPE = dict(expert_count=4, prob_m=4, prob_n=512, prob_k=256, top_k=2, moe_block_size=16)


def test_mxfp4_arrays(lib):
    pytest.importorskip("ml_dtypes")
    buffers = mxfp4_arrays()
    ff.launch_marlin_moe_mxfp4_bf16(**buffers, **MXFP4_SHAPE)
    args = lib.calls[0][1]
    assert args[4] == ptr(buffers["bias"]) and args[5] == ptr(buffers["scales"])


@pytest.mark.parametrize(
    "name, array, message",
    [("a", FakeCAI((4, 256), "<f2"), "a must have dtype bfloat16, got float16"),
     ("scales", FakeCAI((4, 8, 512), "<f2"), "scales must have dtype uint8"),
     ("bias", FakeCAI((4, 512), "<f2"), "bias must have dtype bfloat16")],
)
def test_mxfp4_array_dtypes(lib, name, array, message):
    pytest.importorskip("ml_dtypes")
    with pytest.raises(ArgumentTypeError, match=message):
        ff.launch_marlin_moe_mxfp4_bf16(**mxfp4_arrays(**{name: array}), **MXFP4_SHAPE)


def test_mxfp4_bias_must_cover_every_expert(lib):
    pytest.importorskip("ml_dtypes")
    with pytest.raises(ArgumentError, match=f"bias holds {3 * 512 * 2} bytes, needs {4 * 512 * 2}"):
        ff.launch_marlin_moe_mxfp4_bf16(**mxfp4_arrays(bias=mm_fakes.bf16_cai((3, 512))), **MXFP4_SHAPE)


# ---- bucketed marlin_cuda_moe --------------------------------------------------------------

BUCKET = MoeBucketProblem.stacked(m=32, n=256, k=256, group_size=128, expert_count=4)
BUCKET_PTRS = dict(a=0x1000, b=0x2000, c=0x3000, s=0x4000, workspace=0x5000, a_row_offsets=0x6000,
                   tokens_per_expert=0x7000)


def test_bucket_call(lib):
    ff.launch_marlin_cuda_moe(problem=BUCKET, **BUCKET_PTRS, spans=moe_bucket_spans(BUCKET, 4))
    assert lib.calls == [("marlin_cuda_moe", (
        0x1000, 0x2000, 0x3000, 0x4000, 32, 256, 256, 0x5000, 0x6000, 0x7000, None, 4, 2048, 64, 32, 128, 0, 0,
        -1, -1, -1, -1))]


def test_bucket_with_active_experts(lib):
    ff.launch_marlin_cuda_moe(problem=BUCKET, **BUCKET_PTRS, active_expert_ids=0x8000, dev=1, stream=9)
    assert lib.calls[0][1][10] == 0x8000 and lib.calls[0][1][16:18] == (1, 9)
    with pytest.raises(ArgumentError, match="checking spans with active_expert_ids needs num_experts"):
        ff.launch_marlin_cuda_moe(problem=BUCKET, **BUCKET_PTRS, active_expert_ids=0x8000, spans={"B": 1 << 20})
    ff.launch_marlin_cuda_moe(problem=BUCKET, **BUCKET_PTRS, active_expert_ids=0x8000,
                              spans=moe_bucket_spans(BUCKET, 8), num_experts=8)
    assert len(lib.calls) == 2


def test_bucket_rules_before_the_library(lib):
    from dataclasses import replace

    with pytest.raises(ArgumentError, match=r"prob_m must be in \{16, 32, 48, 64\}, got 8"):
        ff.launch_marlin_cuda_moe(problem=replace(BUCKET, m=8), **BUCKET_PTRS)
    with pytest.raises(ArgumentError, match="B holds 16 bytes, needs 131072"):
        ff.launch_marlin_cuda_moe(problem=BUCKET, **BUCKET_PTRS, spans={"B": 16})
    with pytest.raises(ArgumentError, match="spans names 'C'"):
        ff.launch_marlin_cuda_moe(problem=BUCKET, **BUCKET_PTRS, spans={"C": 1 << 20})
    with pytest.raises(ArgumentError, match="tokens_per_expert pointer must not be null"):
        ff.launch_marlin_cuda_moe(problem=BUCKET, **{**BUCKET_PTRS, "tokens_per_expert": 0})
    with pytest.raises(ArgumentError, match=r"\bdev=-1 must be >= 0"):
        ff.launch_marlin_cuda_moe(problem=BUCKET, **BUCKET_PTRS, dev=-1)
    assert lib.calls == []


def test_bucket_tiles(lib):
    from dataclasses import replace

    # Any tile, dividing the problem or not; the deep (128, 256) one for prob_m 16 only.
    partial = MoeBucketProblem.stacked(m=16, n=192, k=320, group_size=-1, expert_count=4)
    for tile in ((-1, -1), (128, 256), (64, 256), (128, 128)):
        ff.launch_marlin_cuda_moe(problem=replace(partial, thread_k=tile[0], thread_n=tile[1]), **BUCKET_PTRS,
                                  spans=moe_bucket_spans(partial, 4))
    assert [args[4:7] + args[-4:-2] for _, args in lib.calls] == [
        (16, 192, 320, -1, -1), (16, 192, 320, 128, 256), (16, 192, 320, 64, 256), (16, 192, 320, 128, 128)]
    with pytest.raises(ArgumentError, match=r"tile \(thread_k=128, thread_n=256\) serves prob_m <= 16, got prob_m=32"):
        ff.launch_marlin_cuda_moe(problem=replace(BUCKET, thread_k=128, thread_n=256), **BUCKET_PTRS)
    assert len(lib.calls) == 4


def test_bucket_without_experts_is_a_no_op(lib):
    from dataclasses import replace

    ff.launch_marlin_cuda_moe(problem=replace(BUCKET, expert_count=0), **{name: 0 for name in BUCKET_PTRS})
    assert lib.calls == []


def test_bucket_native_failure(lib):
    lib.status = (8 << 16) | 1
    with pytest.raises(NativeError) as info:
        ff.launch_marlin_cuda_moe(problem=BUCKET, **BUCKET_PTRS)
    assert info.value.entry_point == "marlin_cuda_moe"
    assert info.value.shape == {"m": 32, "n": 256, "k": 256, "group_size": 128, "expert_count": 4}


# ---- the profile sink -----------------------------------------------------------------------


def test_no_path_clears_the_sink(lib):
    ff.configure_moe_profile_sink(None)
    assert lib.calls == [("clear", ())]


def test_the_sink_gets_every_field(lib, tmp_path):
    path = tmp_path / "moe.jsonl"
    ff.configure_moe_profile_sink(path, commit_sha="abc123", env_hash="e", model="gpt-oss", concurrency=8,
                                  runtime_flags={"z": 1, "a": [True, None]})
    assert lib.sink_args == (str(path).encode(), b"abc123", b"e", b"gpt-oss", 8, b'{"a": [true, null], "z": 1}')


def test_defaults_and_a_clamped_concurrency(lib):
    ff.configure_moe_profile_sink("p.jsonl", concurrency=2**40)
    assert lib.sink_args == (b"p.jsonl", b"", b"", b"", I32_MAX, b"{}")


def test_a_sink_that_stays_off_raises_with_the_native_reason(lib):
    lib.sink_opens, lib.sink_reason = False, "cannot open /nope/moe.jsonl: No such file or directory"
    with pytest.raises(ProfileSinkError, match="stayed off: cannot open /nope/moe.jsonl: No such file") as info:
        ff.configure_moe_profile_sink("/nope/moe.jsonl")
    assert isinstance(info.value, OSError)


@pytest.mark.parametrize("field", ["commit_sha", "env_hash", "model"])
def test_nul_bytes_are_refused_by_field(lib, field):
    with pytest.raises(ArgumentError, match=f"configure_moe_profile_sink: {field} contains a NUL byte"):
        ff.configure_moe_profile_sink("p.jsonl", **{field: "a\0b"})
    assert lib.sink_args is None


def test_nul_in_the_path_is_refused(lib):
    with pytest.raises(ArgumentError, match="path contains a NUL byte"):
        ff.configure_moe_profile_sink("p\0.jsonl")
    assert lib.sink_args is None


def test_nul_inside_runtime_flags_is_escaped_by_json(lib):
    ff.configure_moe_profile_sink("p.jsonl", runtime_flags={"k": "a\0b"})
    assert json.loads(lib.sink_args[5]) == {"k": "a\0b"}


@pytest.mark.parametrize(
    "kwargs, exc, message",
    [(dict(commit_sha=b"abc"), ArgumentTypeError, "commit_sha must be a str"),
     (dict(concurrency=-1), ArgumentError, "concurrency=-1 must be >= 0"),
     (dict(concurrency=True), ArgumentTypeError, "concurrency must be an integer"),
     (dict(runtime_flags=["a"]), ArgumentTypeError, "runtime_flags must be a mapping"),
     (dict(runtime_flags={"a": object()}), ArgumentTypeError, "runtime_flags must be JSON-serialisable")],
)
def test_profile_argument_rules(lib, kwargs, exc, message):
    with pytest.raises(exc, match=message):
        ff.configure_moe_profile_sink("p.jsonl", **kwargs)
    assert lib.sink_args is None


def test_path_type(lib):
    with pytest.raises(ArgumentTypeError, match="path must be a str or os.PathLike"):
        ff.configure_moe_profile_sink(3)
    ff.configure_moe_profile_sink(np.str_("p.jsonl"))  # a str subclass is a str
    assert lib.sink_args[0] == b"p.jsonl"
