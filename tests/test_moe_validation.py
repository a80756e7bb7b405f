"""Every rule of the MoE launches (ferrum_ffi.moe_validation), each rejected with
its message next to a valid neighbour that passes: the original engine's
contract for the fused launches (its cases and messages), this library's own
kernel rules, the spans, and the bucketed marlin_cuda_moe (CPU only)."""

from __future__ import annotations

import re
from dataclasses import replace

import pytest

from ferrum_ffi._abi import FERRUM_MOE_C_TMP_FLOATS_PER_SM_PER_ROW, FERRUM_MOE_WORKSPACE_INTS_PER_SM
from ferrum_ffi.moe_validation import (
    MarlinMoeF16Launch,
    MarlinMoeMxfp4Bf16Launch,
    MoeBucketProblem,
    MoeF16WeightType,
    check_moe_capacities,
    moe_bucket_spans,
    moe_bytes,
    moe_c_tmp_floats,
    moe_workspace_ints,
    validate_moe_bucket,
    validate_moe_bucket_pointers,
)
from ferrum_ffi.status import ArgumentError, ArgumentTypeError
from ferrum_ffi.validation import I32_MAX

U4B8, E4M3 = MoeF16WeightType.U4B8, MoeF16WeightType.E4M3
U64_MAX = 2**64 - 1
PREFIX = "invalid vLLM Marlin-MoE launch: "

# The original engine's valid fixtures (valid_marlin_moe_raw_args / _mxfp4_bf16_args).
F16 = MarlinMoeF16Launch(
    weight_type=U4B8, a=0x1000, b=0x2000, c=0x3000, scales=0x4000, workspace=0x5000, sorted_token_ids=0x6000,
    expert_ids=0x7000, num_tokens_past_padded=0x8000, moe_block_size=16, top_k=8, prob_m=4, prob_n=1024,
    prob_k=2048, group_size=128,
)
FP32_REDUCE = dict(c_tmp=0x9000, use_atomic_add=False, use_fp32_reduce=True)
MXFP4 = MarlinMoeMxfp4Bf16Launch(
    expert_count=4, a=0x1000, b=0x2000, c=0x3000, bias=0x4000, scales=0x5000, workspace=0x6000,
    sorted_token_ids=0x7000, expert_ids=0x8000, num_tokens_past_padded=0x9000, moe_block_size=16, top_k=2,
    prob_m=4, prob_n=512, prob_k=256, group_size=32,
)


def rejects(launch, message: str, exc: type[Exception] = ArgumentError, sms: int | None = None) -> None:
    """The whole message, prefix included, exactly."""
    with pytest.raises(exc) as info:
        launch.validate(sms)
    assert str(info.value) == PREFIX + message


# ---- INT4 / FP8 x FP16: the supported modes -----------------------------------------------


def test_the_supported_modes_pass():
    F16.validate()
    replace(F16, zero_points=0xA000, has_zero_points=True, topk_weights=0xB000, mul_topk_weights=True,
            **FP32_REDUCE).validate()
    replace(F16, group_size=-1).validate()
    replace(F16, weight_type=E4M3, group_size=-1).validate()
    replace(F16, weight_type=E4M3, group_size=128).validate()
    replace(F16, is_ep=True).validate()


def test_entry_point_follows_the_weight_type():
    assert F16.entry_point == "ferrum_vllm_marlin_moe_f16"
    assert replace(F16, weight_type=E4M3).entry_point == "ferrum_vllm_marlin_moe_fp8_f16"
    assert MXFP4.entry_point == "ferrum_vllm_marlin_moe_mxfp4_bf16"


def test_shape_names_the_problem():
    assert F16.shape == {"m": 4, "n": 1024, "k": 2048, "top_k": 8, "moe_block_size": 16, "group_size": 128,
                         "weight_type": "U4B8"}
    assert replace(F16, zero_points=0xA000, has_zero_points=True).shape["weight_type"] == "U4"
    assert replace(F16, weight_type=E4M3).shape["weight_type"] == "E4M3"
    assert MXFP4.shape["expert_count"] == 4


# ---- pointers ----------------------------------------------------------------------------

F16_REQUIRED = ["a", "b", "c", "scales", "workspace", "sorted_token_ids", "expert_ids", "num_tokens_past_padded"]


@pytest.mark.parametrize("name", F16_REQUIRED)
def test_each_null_pointer_is_named(name):
    rejects(replace(F16, **{name: 0}), f"{name} pointer must be non-null")


def test_an_explicit_null_optional_pointer_is_not_absent():
    rejects(replace(F16, **{**FP32_REDUCE, "c_tmp": 0}), "c_tmp pointer must be non-null")
    rejects(replace(F16, topk_weights=0), "topk_weights pointer must be non-null")


@pytest.mark.parametrize(
    "name, pointer, alignment",
    [("a", 0x1008, 16), ("b", 0x2004, 16), ("c", 0x3002, 16), ("scales", 0x4002, 16),
     ("workspace", 0x5002, 4), ("sorted_token_ids", 0x6001, 4), ("expert_ids", 0x7002, 4),
     ("num_tokens_past_padded", 0x8002, 4), ("topk_weights", 0xB002, 4)],
)
def test_each_misaligned_pointer_is_named(name, pointer, alignment):
    rejects(replace(F16, **{name: pointer}), f"{name} pointer {pointer:#x} must be aligned to {alignment} bytes")


def test_four_byte_arrays_need_only_four_bytes():
    replace(F16, workspace=0x5004, sorted_token_ids=0x6004, expert_ids=0x7004, num_tokens_past_padded=0x8004,
            topk_weights=0xB004).validate()


def test_c_tmp_and_zero_points_need_16_bytes():
    rejects(replace(F16, **{**FP32_REDUCE, "c_tmp": 0x9008}), "c_tmp pointer 0x9008 must be aligned to 16 bytes")
    rejects(replace(F16, zero_points=0xA004, has_zero_points=True),
            "zero_points pointer 0xa004 must be aligned to 16 bytes")


def test_pointer_range_overflow():
    rejects(replace(F16, a=2**64 - 16), "a pointer range overflows the u64 device domain")
    # The last byte of a 16384-byte span may sit at the very top of the domain.
    replace(F16, a=2**64 - 16384).validate()


# ---- shape and configuration (the original contract) --------------------------------------


@pytest.mark.parametrize("name", ["prob_m", "prob_n", "prob_k"])
def test_sizes_must_be_positive(name):
    values = {"prob_m": 4, "prob_n": 1024, "prob_k": 2048, name: 0}
    rejects(replace(F16, **{name: 0}), "prob_m, prob_n, and prob_k must be positive, got "
            f"[{values['prob_m']}, {values['prob_n']}, {values['prob_k']}]")


@pytest.mark.parametrize("block", [0, 24, 128, -16])
def test_unsupported_moe_block_sizes(block):
    rejects(replace(F16, moe_block_size=block),
            f"unsupported moe_block_size {block}; expected one of 8, 16, 32, 48, 64")


@pytest.mark.parametrize("block", [8, 16, 32, 48, 64])
def test_supported_moe_block_sizes(block):
    replace(F16, moe_block_size=block).validate()


def test_top_k_must_be_positive():
    rejects(replace(F16, top_k=0), "top_k must be positive, got 0")
    replace(F16, top_k=1).validate()


def test_output_rows_must_fit_int32():
    rejects(replace(F16, prob_m=I32_MAX), "prob_m * top_k overflows the kernel's i32 output-row domain")
    replace(F16, prob_m=I32_MAX // 8).validate()  # 8 * 268435455 rows still fit


def test_prob_n_must_be_a_multiple_of_64():
    rejects(replace(F16, prob_n=96), "prob_n 96 must be divisible by the Marlin minimum thread width 64")
    replace(F16, prob_n=64, prob_k=2048).validate()


def test_prob_k_must_be_a_multiple_of_64():
    rejects(replace(F16, prob_k=96, group_size=-1), "prob_k 96 must be divisible by the Marlin minimum thread width 64")
    replace(F16, prob_k=128, group_size=-1).validate()


@pytest.mark.parametrize("group_size", [0, -2, 8, 24])
def test_int4_group_size_must_be_channelwise_or_a_multiple_of_16(group_size):
    rejects(replace(F16, group_size=group_size),
            f"group_size must be -1 or a positive multiple of 16, got {group_size}")


def test_int4_group_size_must_divide_prob_k():
    rejects(replace(F16, group_size=96), "prob_k 2048 must be divisible by group_size 96")


def test_device_ordinal_must_not_be_negative():
    rejects(replace(F16, device_ordinal=-1), "device_ordinal must be non-negative, got -1")
    replace(F16, device_ordinal=3).validate()


@pytest.mark.parametrize("group_size", [0, 16, 64, 256])
def test_e4m3_group_size_is_channelwise_or_128(group_size):
    rejects(replace(F16, weight_type=E4M3, group_size=group_size),
            f"E4M3 group_size must be -1 or 128, got {group_size}")


def test_e4m3_group_128_must_divide_prob_k():
    rejects(replace(F16, weight_type=E4M3, prob_k=192), "E4M3 prob_k 192 must be divisible by group_size 128")
    replace(F16, weight_type=E4M3, prob_k=192, group_size=-1, prob_n=1024).validate()


# ---- optional pointers and their modes ----------------------------------------------------


def test_has_zero_points_must_match_the_pointer_both_ways():
    rejects(replace(F16, has_zero_points=True), "has_zero_points must exactly match the zero_points pointer")
    rejects(replace(F16, zero_points=0xA000), "has_zero_points must exactly match the zero_points pointer")
    replace(F16, zero_points=0xA000, has_zero_points=True).validate()


def test_e4m3_forbids_zero_points():
    rejects(replace(F16, weight_type=E4M3, group_size=-1, zero_points=0xA000, has_zero_points=True),
            "E4M3 forbids zero points")
    rejects(replace(F16, weight_type=E4M3, group_size=-1, has_zero_points=True),
            "has_zero_points must exactly match the zero_points pointer")


def test_mul_topk_weights_needs_the_pointer():
    rejects(replace(F16, mul_topk_weights=True), "mul_topk_weights requires a non-null topk_weights pointer")
    replace(F16, mul_topk_weights=True, topk_weights=0xB000).validate()
    replace(F16, topk_weights=0xB000).validate()  # weights passed but not applied


@pytest.mark.parametrize("atomic, fp32", [(True, True), (False, False)])
def test_exactly_one_reduction_mode(atomic, fp32):
    launch = replace(F16, use_atomic_add=atomic, use_fp32_reduce=fp32, c_tmp=0x9000 if fp32 else None)
    rejects(launch, "exactly one of use_atomic_add and use_fp32_reduce must be enabled")


def test_c_tmp_exactly_with_fp32_reduce():
    rejects(replace(F16, c_tmp=0x9000), "use_fp32_reduce must exactly match the c_tmp pointer")
    rejects(replace(F16, use_atomic_add=False, use_fp32_reduce=True),
            "use_fp32_reduce must exactly match the c_tmp pointer")
    replace(F16, **FP32_REDUCE).validate()


# ---- this library's own rules (after the original contract's) -----------------------------


@pytest.mark.parametrize("group_size, prob_k", [(16, 2048), (48, 3072), (192, 3072), (384, 3072)])
def test_int4_group_sizes_are_those_the_kernels_are_built_for(group_size, prob_k):
    # Each passes the original contract (a multiple of 16 dividing prob_k).
    rejects(replace(F16, group_size=group_size, prob_k=prob_k), "INT4 group_size must be -1, 32, 64 or a power of "
            f"two >= 128 (the group sizes the kernels are built for), got {group_size}")


@pytest.mark.parametrize("group_size", [-1, 32, 64, 128, 256, 1024])
def test_built_int4_group_sizes_pass(group_size):
    replace(F16, group_size=group_size).validate()
    replace(F16, group_size=group_size, zero_points=0xA000, has_zero_points=True).validate()


def test_the_original_rule_reports_first():
    # 96 breaks both the original divisibility rule and this library's group sizes.
    rejects(replace(F16, group_size=96), "prob_k 2048 must be divisible by group_size 96")


# No tile has to divide (n, k): the kernels run a partial last tile. Multiples of
# 64 that no tile divides pass, as do the GPT-OSS shapes without K padding.
PARTIAL_TILE_SHAPES = [(64, 64), (192, 192), (64, 320), (192, 320), (320, 192), (2880, 2880), (5760, 2880),
                       (2880, 2944)]


@pytest.mark.parametrize("n, k", PARTIAL_TILE_SHAPES)
def test_partial_tiles_pass(n, k):
    replace(F16, prob_n=n, prob_k=k, group_size=-1).validate()
    replace(F16, weight_type=E4M3, prob_n=n, prob_k=k, group_size=-1).validate()
    replace(MXFP4, prob_n=n, prob_k=k).validate()


@pytest.mark.parametrize("n, k", [(128, 128), (64, 128), (256, 64), (128, 64), (192, 384), (384, 192)])
def test_tile_multiples_pass(n, k):
    replace(F16, prob_n=n, prob_k=k, group_size=-1).validate()


def test_expert_count_must_be_positive_when_given():
    rejects(replace(F16, expert_count=0), "expert_count must be positive, got 0")
    replace(F16, expert_count=1).validate()  # sizing only: no routing rule ties it to top_k


# ---- spans -------------------------------------------------------------------------------


def test_int4_spans_by_hand():
    # E=8, M=4, N=1024, K=2048, top_k=8, group 128 (16 groups).
    launch = replace(F16, expert_count=8, zero_points=0xA000, has_zero_points=True, topk_weights=0xB000,
                     **FP32_REDUCE)
    assert launch.validate() == {
        "a": 4 * 2048 * 2,
        "b": 8 * 2048 * 1024 // 2,  # [E, K/16, 2N] int32
        "c": 32 * 1024 * 2,
        "scales": 8 * 16 * 1024 * 2,
        "zero_points": 8 * 16 * (1024 // 8) * 4,
        "c_tmp": 32 * 1024 * 4,
        "topk_weights": 32 * 4,
    }


def test_fp8_spans_by_hand():
    spans = replace(F16, weight_type=E4M3, group_size=-1, expert_count=8).validate()
    assert spans["b"] == 8 * 2048 * 1024  # [E, K/16, 4N] int32: one byte per weight
    assert spans["scales"] == 8 * 1 * 1024 * 2


def test_without_expert_count_only_the_row_spans_are_known():
    assert F16.validate() == {"a": 4 * 2048 * 2, "c": 32 * 1024 * 2}


def test_int4_weight_byte_size_overflow():
    # (n and k at FERRUM_MAX_DIM, this library's own limit; the expert count overflows)
    huge = replace(F16, expert_count=I32_MAX, prob_m=1, top_k=1, prob_n=2**28, prob_k=2**28, group_size=-1)
    rejects(huge, "INT4 packed weight [E,K/16,2N] int32 byte size overflows the u64 device domain")


@pytest.mark.parametrize("launch", ["F16", "MXFP4"])
def test_dimensions_past_the_stride_limit_are_rejected(launch):
    base = {"F16": F16, "MXFP4": MXFP4}[launch]
    rejects(replace(base, prob_n=2**28 + 64), f"prob_n {2**28 + 64} and prob_k {base.prob_k} must be at most "
            "FERRUM_MAX_DIM=268435456")


def test_scratch_spans_need_the_multiprocessor_count():
    sms = 132
    spans = replace(F16, **FP32_REDUCE).validate(sms)
    assert spans["workspace"] == FERRUM_MOE_WORKSPACE_INTS_PER_SM * sms * 4 == moe_workspace_ints(sms) * 4
    # The kernel's per-SM tiles outgrow the [M*top_k, N] rows here; the larger is required.
    kernel = FERRUM_MOE_C_TMP_FLOATS_PER_SM_PER_ROW * 16 * sms * 4
    assert spans["c_tmp"] == kernel == moe_c_tmp_floats(16, sms) * 4 > 32 * 1024 * 4
    rows = replace(F16, prob_m=4096, **FP32_REDUCE).validate(1)
    assert rows["c_tmp"] == 4096 * 8 * 1024 * 4  # and the rows when they are larger


def test_with_raw_pointers_only_the_scratch_ranges_can_be_checked():
    near_top = replace(F16, **{**FP32_REDUCE, "c_tmp": 2**64 - 2**20})
    near_top.validate()  # the rows' 128 KiB fit below the top
    rejects(near_top, "c_tmp pointer range overflows the u64 device domain", sms=132)
    rejects(replace(F16, workspace=2**64 - 1024), "workspace pointer range overflows the u64 device domain", sms=132)


@pytest.mark.parametrize("sms", [0, -1])
def test_sms_must_be_positive(sms):
    rejects(F16, f"sms must be positive, got {sms}", sms=sms)


def test_capacities_against_the_spans():
    required = replace(F16, expert_count=8).validate(4)
    check_moe_capacities(required, required)
    with pytest.raises(ArgumentError, match=re.escape(f"{PREFIX}b holds 10 bytes, needs {required['b']}")):
        check_moe_capacities(required, {"b": 10})
    with pytest.raises(ArgumentError, match="spans names 'bias', whose size this launch does not determine"):
        check_moe_capacities(required, {"bias": 1 << 20})


def test_moe_bytes():
    assert moe_bytes("x", 2, 3, 4) == 24
    assert moe_bytes("x", 2**32, 2**32 - 1) == U64_MAX - 2**32 + 1
    with pytest.raises(ArgumentError, match=re.escape(f"{PREFIX}x byte size overflows the u64 device domain")):
        moe_bytes("x", 2**32, 2**32)


# ---- types -------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["prob_m", "prob_n", "prob_k", "top_k", "moe_block_size", "group_size",
                                  "device_ordinal", "expert_count"])
@pytest.mark.parametrize("value", [1.0, True, "1"])
def test_scalars_must_be_integers(name, value):
    rejects(replace(F16, **{name: value}), f"{name} must be an integer, got {type(value).__name__}",
            ArgumentTypeError)


def test_scalars_must_fit_in_int32():
    rejects(replace(F16, prob_n=2**31), "prob_n=2147483648 does not fit in int32")


@pytest.mark.parametrize("name", ["mul_topk_weights", "is_ep", "has_zero_points", "use_atomic_add",
                                  "use_fp32_reduce"])
def test_flags_must_be_bools(name):
    rejects(replace(F16, **{name: 1}), f"{name} must be a bool, got int", ArgumentTypeError)


@pytest.mark.parametrize("value", [-1, 2**64, 1.5, "0x1000", True])
def test_pointers_must_be_addresses(value):
    with pytest.raises(ArgumentTypeError, match=r"a must be a device pointer \(an int in 0\.\.2\*\*64-1\)"):
        replace(F16, a=value).validate()
    with pytest.raises(ArgumentTypeError, match=r"topk_weights must be a device pointer .*, or None"):
        replace(F16, topk_weights=value).validate()


def test_weight_type_must_be_the_enum():
    rejects(replace(F16, weight_type="U4B8"), "weight_type must be a MoeF16WeightType, got 'U4B8'",
            ArgumentTypeError)


def test_records_are_frozen():
    with pytest.raises(AttributeError):
        F16.prob_m = 8  # type: ignore[misc]


# ---- MXFP4 x BF16 ------------------------------------------------------------------------


def test_mxfp4_required_buffer_shapes():
    assert MXFP4.validate() == {"a": 2048, "b": 262144, "c": 8192, "bias": 4096, "scales": 16384}
    spans = replace(MXFP4, topk_weights=0xB000, mul_topk_weights=True, **{**FP32_REDUCE, "c_tmp": 0xA000}).validate()
    assert (spans["c_tmp"], spans["topk_weights"]) == (16384, 32)


def test_mxfp4_scratch_spans():
    spans = replace(MXFP4, **FP32_REDUCE).validate(132)
    assert spans["workspace"] == 4 * 132 * 4
    assert spans["c_tmp"] == 1024 * 16 * 132 * 4


def test_mxfp4_pointers():
    rejects(replace(MXFP4, bias=0), "bias pointer must be non-null")
    rejects(replace(MXFP4, scales=0x5002), "scales pointer 0x5002 must be aligned to 16 bytes")
    rejects(replace(MXFP4, b=U64_MAX - 15), "b pointer range overflows the u64 device domain")
    rejects(replace(MXFP4, topk_weights=0xB002), "topk_weights pointer 0xb002 must be aligned to 4 bytes")


def test_mxfp4_expert_count_must_be_positive():
    rejects(replace(MXFP4, expert_count=0), "MXFP4 expert_count must be positive, got 0")


def test_mxfp4_sizes_must_be_positive():
    rejects(replace(MXFP4, prob_m=0), "MXFP4 BF16 prob_m, prob_n, and prob_k must be positive, got [0, 512, 256]")


def test_mxfp4_top_k_at_most_expert_count():
    rejects(replace(MXFP4, top_k=5), "MXFP4 top_k must be in 1..=expert_count, got top_k=5 expert_count=4")
    rejects(replace(MXFP4, top_k=0), "MXFP4 top_k must be in 1..=expert_count, got top_k=0 expert_count=4")
    replace(MXFP4, top_k=4).validate()


def test_mxfp4_rows_overflow():
    rejects(replace(MXFP4, prob_m=I32_MAX), "MXFP4 prob_m * top_k overflows the kernel's i32 output-row domain")


def test_mxfp4_prob_n():
    rejects(replace(MXFP4, prob_n=96), "MXFP4 prob_n 96 must be divisible by the Marlin minimum thread width 64")


@pytest.mark.parametrize("group_size", [31, 33, 128, -1, 16])
def test_mxfp4_group_size_is_exactly_32(group_size):
    rejects(replace(MXFP4, group_size=group_size),
            f"MXFP4 E2M1/E8M0 group_size must be exactly 32, got {group_size}")


def test_mxfp4_prob_k_must_hold_whole_groups():
    rejects(replace(MXFP4, prob_k=240), "MXFP4 prob_k 240 must be divisible by group_size 32")


def test_mxfp4_packed_weight_overflow():
    huge = replace(MXFP4, expert_count=I32_MAX, top_k=1, prob_m=1, prob_n=2**28, prob_k=2**28)
    rejects(huge, "MXFP4 E2M1 packed weight [E,N,K/2] byte size overflows the u64 device domain")


def test_mxfp4_shared_rules():
    rejects(replace(MXFP4, moe_block_size=24), "unsupported moe_block_size 24; expected one of 8, 16, 32, 48, 64")
    rejects(replace(MXFP4, device_ordinal=-1), "device_ordinal must be non-negative, got -1")
    rejects(replace(MXFP4, mul_topk_weights=True), "mul_topk_weights requires a non-null topk_weights pointer")
    rejects(replace(MXFP4, use_atomic_add=False), "exactly one of use_atomic_add and use_fp32_reduce must be enabled")
    rejects(replace(MXFP4, c_tmp=0xA000), "use_fp32_reduce must exactly match the c_tmp pointer")
    with pytest.raises(ArgumentTypeError, match="expert_count must be an integer"):
        replace(MXFP4, expert_count=None).validate()


def test_mxfp4_adds_k_multiple_of_64():
    # The original contract asks only k % 32 (the group); the kernels need k % 64.
    rejects(replace(MXFP4, prob_n=64, prob_k=96), "MXFP4 prob_k 96 must be divisible by the Marlin minimum thread "
            "width 64")
    rejects(replace(MXFP4, prob_n=128, prob_k=2880 + 32), "MXFP4 prob_k 2912 must be divisible by the Marlin "
            "minimum thread width 64")
    replace(MXFP4, prob_n=64, prob_k=128).validate()
    replace(MXFP4, prob_n=64, prob_k=64).validate()
    replace(MXFP4, prob_n=2880, prob_k=2880).validate()


# ---- bucketed marlin_cuda_moe ------------------------------------------------------------

BUCKET = MoeBucketProblem.stacked(m=16, n=256, k=256, group_size=128, expert_count=4)


def bucket_rejects(problem: MoeBucketProblem, match: str, exc: type[Exception] = ArgumentError) -> None:
    with pytest.raises(exc, match=match):
        validate_moe_bucket(problem)


def test_stacked_strides_follow_the_per_expert_layout():
    assert (BUCKET.b_int4_per_expert, BUCKET.s_int4_per_expert, BUCKET.locks_i32_per_expert) == (2048, 64, 32)
    channelwise = MoeBucketProblem.stacked(m=64, n=64, k=128, group_size=-1, expert_count=1, max_par=1)
    assert (channelwise.b_int4_per_expert, channelwise.s_int4_per_expert, channelwise.locks_i32_per_expert) == (
        256, 8, 1)
    validate_moe_bucket(BUCKET)
    validate_moe_bucket(channelwise)


@pytest.mark.parametrize("m", [0, 8, 17, 80, -16])
def test_bucket_prob_m_is_a_bucket_height(m):
    bucket_rejects(replace(BUCKET, m=m), re.escape(f"marlin_cuda_moe: prob_m must be in {{16, 32, 48, 64}}, got {m}"))


@pytest.mark.parametrize("m", [16, 32, 48, 64])
def test_bucket_heights_pass(m):
    validate_moe_bucket(replace(BUCKET, m=m))


@pytest.mark.parametrize(
    "changes, match",
    [(dict(n=96), r"marlin_cuda_moe: n=96 must be divisible by 64"),
     (dict(k=192), r"k=192 must be divisible by 128"),
     (dict(group_size=64), r"group_size=64 must be -1 \(channelwise\) or 128"),
     (dict(n_full=128), r"n_full=128 must be -1 or a multiple of 64 that is >= n=256"),
     (dict(thread_k=64, thread_n=64), r"\(thread_k, thread_n\)=\(64, 64\) must be one of"),
     (dict(thread_k=256, thread_n=128), r"\(thread_k, thread_n\)=\(256, 128\) must be one of"),
     (dict(m=32, thread_k=128, thread_n=256),
      r"tile \(thread_k=128, thread_n=256\) serves prob_m <= 16, got prob_m=32"),
     (dict(m=64, thread_k=128, thread_n=256),
      r"tile \(thread_k=128, thread_n=256\) serves prob_m <= 16, got prob_m=64"),
     (dict(k=96), r"k=96 must be divisible by 64"),
     (dict(k=2**28 + 128), r"k=268435584 must be at most FERRUM_MAX_DIM=268435456"),
     (dict(n_full=2**28 + 64), r"n_full=268435520 must be at most FERRUM_MAX_DIM=268435456"),
     (dict(sms=0), r"sms=0 must be -1 \(all\) or >= 1"),
     (dict(expert_count=-1), r"expert_count=-1 must be >= 0"),
     (dict(b_int4_per_expert=2047), r"b_int4_per_expert=2047 is below one expert's weight \(2048 16-byte units\)"),
     (dict(s_int4_per_expert=63), r"s_int4_per_expert=63 is below one expert's scales \(64 16-byte units\)"),
     (dict(n_full=512), r"b_int4_per_expert=2048 is below one expert's weight \(4096 16-byte units\)"),
     (dict(locks_i32_per_expert=3), r"locks_i32_per_expert=3 must be >= prob_n/64 = 4")],
)
def test_bucket_rules(changes, match):
    bucket_rejects(replace(BUCKET, **changes), match)


def test_bucket_valid_neighbours():
    wide = dict(n_full=512, b_int4_per_expert=4096, s_int4_per_expert=128)
    for changes in (wide, dict(thread_k=128, thread_n=64), dict(thread_k=64, thread_n=128),
                    dict(thread_k=128, thread_n=256), dict(m=32, thread_k=64, thread_n=256),
                    dict(k=192, group_size=-1, b_int4_per_expert=1536), dict(expert_count=0), dict(locks_i32_per_expert=4),
                    dict(group_size=-1), dict(sms=8), dict(b_int4_per_expert=4096)):
        validate_moe_bucket(replace(BUCKET, **changes))


@pytest.mark.parametrize("n, k", [(192, 192), (192, 320), (320, 64), (64, 64), (2880, 2880)])
@pytest.mark.parametrize("tile", [(-1, -1), (128, 128), (128, 64), (64, 256), (64, 128), (128, 256)])
def test_bucket_tiles_need_not_divide_the_problem(n, k, tile):
    # A tile that does not divide (n, k) runs a partial last tile.
    problem = MoeBucketProblem.stacked(m=16, n=n, k=k, group_size=-1, expert_count=2)
    validate_moe_bucket(replace(problem, thread_k=tile[0], thread_n=tile[1]))


def test_bucket_scalars_must_be_integers():
    bucket_rejects(replace(BUCKET, expert_count=1.0), "expert_count must be an integer", ArgumentTypeError)


def test_bucket_spans_by_hand():
    # Per-expert contiguous: 4 experts of k*n/2 bytes, (k/128)*n fp16 scales, and the
    # last expert's n/64 locks after three strides of 32.
    assert moe_bucket_spans(BUCKET, 4) == {"B": 4 * 256 * 256 // 2, "s": 4 * 2 * 256 * 2, "workspace": (3 * 32 + 4) * 4}
    assert moe_bucket_spans(BUCKET, 1) == {"B": 256 * 256 // 2, "s": 2 * 256 * 2, "workspace": 4 * 4}
    with pytest.raises(ArgumentError, match="experts=0 must be >= 1"):
        moe_bucket_spans(BUCKET, 0)


def test_bucket_spans_of_wider_expert_blocks():
    # Each expert's block is n_full = 512 columns wide, of which n = 256 are used:
    # the last expert reads its first n columns of every row.
    wide = replace(BUCKET, n_full=512, b_int4_per_expert=4096, s_int4_per_expert=128)
    validate_moe_bucket(wide)
    spans = moe_bucket_spans(wide, 4)
    assert spans["B"] == 3 * 4096 * 16 + (256 // 16 - 1) * 2 * 512 * 4 + 2 * 256 * 4
    assert spans["s"] == 3 * 128 * 16 + 512 * 2 + 256 * 2


def test_bucket_pointers():
    validate_moe_bucket_pointers(0x1000, 0x2000, 0x3000, 0x4000, 0x5004, 0x6004, 0x7004, None)
    validate_moe_bucket_pointers(0x1000, 0x2000, 0x3000, 0x4000, 0x5004, 0x6004, 0x7004, 0x8004)
    with pytest.raises(ArgumentError, match="marlin_cuda_moe: A pointer must not be null"):
        validate_moe_bucket_pointers(0, 0x2000, 0x3000, 0x4000, 0x5004, 0x6004, 0x7004, None)
    with pytest.raises(ArgumentError, match="a_row_offsets pointer 0x6002 must be 4-byte aligned"):
        validate_moe_bucket_pointers(0x1000, 0x2000, 0x3000, 0x4000, 0x5004, 0x6002, 0x7004, None)
    with pytest.raises(ArgumentError, match="tokens_per_expert pointer must not be null"):
        validate_moe_bucket_pointers(0x1000, 0x2000, 0x3000, 0x4000, 0x5004, 0x6004, 0, None)
    with pytest.raises(ArgumentError, match="active_expert_ids pointer 0x8002 must be 4-byte aligned"):
        validate_moe_bucket_pointers(0x1000, 0x2000, 0x3000, 0x4000, 0x5004, 0x6004, 0x7004, 0x8002)


# ---- the layer variants (the _ex entry points): add_rows_div and clear --------------------------------


@pytest.mark.parametrize("base", [F16, MXFP4], ids=["f16", "mxfp4"])
def test_the_layer_arguments_select_the_ex_entry_point(base):
    assert not base.entry_point.endswith("_ex")
    assert replace(base, add_rows_div=1).entry_point == base.entry_point + "_ex"
    assert replace(base, clear=0xA0000, clear_bytes=64).entry_point == base.entry_point + "_ex"
    assert replace(F16, weight_type=E4M3, group_size=-1, add_rows_div=8).entry_point == (
        "ferrum_vllm_marlin_moe_fp8_f16_ex")


@pytest.mark.parametrize("base", [F16, MXFP4], ids=["f16", "mxfp4"])
def test_add_rows_div_rules_and_neighbours(base):
    rows = base.prob_m * base.top_k
    rejects(replace(base, add_rows_div=-1), "add_rows_div must be >= 0, got -1")
    rejects(replace(base, add_rows_div=1, **FP32_REDUCE),
            "add_rows_div > 0 adds into a zeroed C and needs use_atomic_add")
    rejects(replace(base, add_rows_div=3), f"add_rows_div 3 must divide prob_m * top_k = {rows}")
    for div in (1, base.top_k, rows):
        replace(base, add_rows_div=div).validate()


@pytest.mark.parametrize("base", [F16, MXFP4], ids=["f16", "mxfp4"])
def test_add_rows_div_sizes_c_by_the_summed_rows(base):
    full = base.validate()["c"]
    assert full == base.prob_m * base.top_k * base.prob_n * 2
    assert replace(base, add_rows_div=base.top_k).validate()["c"] == full // base.top_k


@pytest.mark.parametrize("base", [F16, MXFP4], ids=["f16", "mxfp4"])
def test_clear_rules_and_neighbours(base):
    rejects(replace(base, clear=0xA0000), "clear_bytes must be positive exactly when clear is given")
    rejects(replace(base, clear_bytes=16), "clear_bytes must be positive exactly when clear is given")
    rejects(replace(base, clear=0xA0000, clear_bytes=-16), "clear_bytes must be >= 0, got -16")
    rejects(replace(base, clear=0xA0000, clear_bytes=24), "clear_bytes 24 must be a multiple of 16")
    rejects(replace(base, clear=0xA0008, clear_bytes=16), "clear pointer 0xa0008 must be aligned to 16 bytes")
    rejects(replace(base, clear=0, clear_bytes=16), "clear pointer must be non-null")
    with pytest.raises(ArgumentTypeError, match="clear must be a device pointer"):
        replace(base, clear=1.5, clear_bytes=16).validate()
    spans = replace(base, clear=0xA0000, clear_bytes=4096).validate()
    assert spans["clear"] == 4096


def test_clear_must_not_meet_a_buffer_of_the_launch():
    a_bytes = F16.prob_m * F16.prob_k * 2
    rejects(replace(F16, clear=0x1000 + a_bytes - 16, clear_bytes=32),
            f"clear [{0x1000 + a_bytes - 16:#x}, +32) overlaps a [0x1000, +{a_bytes})")
    # Just past a: a neighbour that passes (c starts far beyond it).
    replace(F16, a=0x100000, c=0x900000, clear=0x100000 + a_bytes, clear_bytes=32).validate()
    c_bytes = F16.prob_m * F16.top_k * F16.prob_n * 2
    rejects(replace(F16, a=0x100000, c=0x900000, clear=0x900000 + c_bytes - 16, clear_bytes=64),
            f"clear [{0x900000 + c_bytes - 16:#x}, +64) overlaps c [0x900000, +{c_bytes})")


@pytest.mark.parametrize("name", ["workspace", "sorted_token_ids", "expert_ids", "num_tokens_past_padded", "b",
                                  "scales"])
def test_clear_must_not_meet_the_routing_scratch_or_unsized_buffers(name):
    # Far-apart buffers; clear starts at one whose size the launch may not know (b, scales without
    # expert_count) or sizes only with the device (workspace): its first byte is enough to refuse.
    far = {n: (i + 1) << 30 for i, n in enumerate(["a", "b", "c", "scales", "workspace", "sorted_token_ids",
                                                    "expert_ids", "num_tokens_past_padded"])}
    launch = replace(F16, **far, clear=far[name], clear_bytes=64)
    with pytest.raises(ArgumentError, match=f"clear \\[{far[name]:#x}, \\+64\\) overlaps {name} "):
        launch.validate(sms=132)
    replace(F16, **far, clear=far[name] - 64, clear_bytes=64).validate(sms=132)  # just before it: a neighbour


def test_clear_must_not_meet_the_kernels_c_tmp():
    far = {n: (i + 1) << 30 for i, n in enumerate(["a", "b", "c", "scales", "workspace", "sorted_token_ids",
                                                    "expert_ids", "num_tokens_past_padded"])}
    launch = replace(F16, **far, **{**FP32_REDUCE, "c_tmp": 9 << 30})
    rows_span = F16.prob_m * F16.top_k * F16.prob_n * 4
    kernel_span = launch.validate(sms=132)["c_tmp"]
    assert kernel_span > rows_span  # the kernel's minimum is the larger
    with pytest.raises(ArgumentError, match="overlaps c_tmp"):
        replace(launch, clear=(9 << 30) + rows_span, clear_bytes=16).validate(sms=132)



@pytest.mark.parametrize("base", [F16, MXFP4], ids=["f16", "mxfp4"])
def test_routing_settled_selects_the_ex_entry_and_clears_only_when_direct(base):
    settled = replace(base, routing_settled=True)
    assert settled.entry_point == base.entry_point + "_ex"
    settled.validate()
    replace(settled, add_rows_div=base.top_k).validate()
    rejects(replace(settled, clear=0xA0000, clear_bytes=64), "a settled launch clears only with direct routing")
    direct = replace(settled, direct_routing=True, sorted_token_ids=None, num_tokens_past_padded=None,
                     moe_block_size=8)
    assert replace(direct, clear=0xA0000, clear_bytes=64).validate()["clear"] == 64
    with pytest.raises(ArgumentTypeError, match="routing_settled must be a bool"):
        replace(base, routing_settled=1).validate()


@pytest.mark.parametrize("base", [F16, MXFP4], ids=["f16", "mxfp4"])
def test_direct_routing_takes_expert_ids_per_row_and_no_align_arrays(base):
    direct = replace(base, direct_routing=True, sorted_token_ids=None, num_tokens_past_padded=None,
                     moe_block_size=8)
    assert direct.entry_point == base.entry_point + "_ex"
    spans = direct.validate()
    assert spans["expert_ids"] == base.prob_m * base.top_k * 4  # one expert id per routed row
    assert "expert_ids" not in base.validate()  # aligned routing: sized by the align step, not the launch
    replace(direct, routing_settled=True, add_rows_div=base.top_k, clear=0xA0000, clear_bytes=64).validate()
    rejects(replace(direct, sorted_token_ids=0x6000),
            "direct_routing takes no sorted_token_ids (routed row t is slab t, expert expert_ids[t])")
    rejects(replace(direct, sorted_token_ids=0x6000, num_tokens_past_padded=0x6100),
            "direct_routing takes no sorted_token_ids or num_tokens_past_padded "
            "(routed row t is slab t, expert expert_ids[t])")
    rejects(replace(direct, moe_block_size=16),
            "direct_routing puts one row in each slab and needs moe_block_size 8, got 16")
    rejects(replace(direct, expert_ids=0), "expert_ids pointer must be non-null")
    with pytest.raises(ArgumentTypeError, match="direct_routing must be a bool"):
        replace(direct, direct_routing=1).validate()
    # Aligned routing still needs both arrays.
    with pytest.raises(ArgumentTypeError, match="sorted_token_ids must be a device pointer"):
        replace(base, sorted_token_ids=None).validate()
    # The expert ids' span is checked against the address space like every other.
    rejects(replace(direct, expert_ids=2**64 - 16),
            "expert_ids pointer range overflows the u64 device domain")


