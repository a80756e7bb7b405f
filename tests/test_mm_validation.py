"""Every rule of the general Marlin GEMM (header section "General Marlin GEMM"),
each rejected before any native call with a message naming the argument and
the rule, next to its valid neighbour; and the launch struct the raw-pointer
launcher fills (CPU only: a fake library records the struct)."""

from __future__ import annotations

import ctypes
from dataclasses import replace

import pytest

from ferrum_ffi import mm
from ferrum_ffi._abi import (
    FERRUM_DTYPE_BF16,
    FERRUM_DTYPE_F16,
    FERRUM_MM_C_TMP_FLOATS_PER_SM,
    FERRUM_MM_FLAG_ACT_ORDER,
    FERRUM_MM_FLAG_ATOMIC_ADD,
    FERRUM_MM_FLAG_FP32_REDUCE,
    FERRUM_MM_FLAG_HAS_ZERO_POINTS,
    FERRUM_MM_FLAG_K_FULL,
    FERRUM_MM_LAUNCH_VERSION,
    FERRUM_MM_WORKSPACE_INTS_PER_SM,
    WeightType,
)
from ferrum_ffi._native import FerrumMarlinLaunch
from ferrum_ffi.mm import launch_marlin_mm
from ferrum_ffi.status import ArgumentError, ArgumentTypeError, NativeError
from ferrum_ffi.validation import (
    MmBuffers,
    MmProblem,
    mm_c_tmp_floats,
    mm_spans,
    mm_workspace_ints,
    validate_mm,
    validate_mm_buffers,
)

from . import mm_fakes

F16, BF16 = FERRUM_DTYPE_F16, FERRUM_DTYPE_BF16
U4, U4B8, U8B128, FP8 = (int(t) for t in WeightType)
SMS = 8

VALID = MmProblem.create(16, 256, 256, F16, U4B8, 128)


def rejects(problem: MmProblem, match: str, exc: type[Exception] = ArgumentError) -> None:
    with pytest.raises(exc, match=match):
        validate_mm(problem)


def with_flags(problem: MmProblem, set_bits: int = 0, clear_bits: int = 0) -> MmProblem:
    return replace(problem, flags=(problem.flags | set_bits) & ~clear_bits)


# ---- MmProblem.create -------------------------------------------------------------------


def test_create_derives_lda_groups_and_flags():
    p = MmProblem.create(3, 128, 512, BF16, U4, 64, act_order=True, fp32_reduce=True)
    assert (p.lda, p.num_groups) == (512, 8)
    assert p.flags == FERRUM_MM_FLAG_K_FULL | FERRUM_MM_FLAG_HAS_ZERO_POINTS | FERRUM_MM_FLAG_ACT_ORDER | FERRUM_MM_FLAG_FP32_REDUCE
    q = MmProblem.create(3, 128, 512, F16, FP8, -1, lda=520)
    assert (q.lda, q.num_groups, q.flags) == (520, 1, FERRUM_MM_FLAG_K_FULL | FERRUM_MM_FLAG_ATOMIC_ADD)
    validate_mm(p)
    validate_mm(q)


# ---- types -----------------------------------------------------------------------------


@pytest.mark.parametrize("a_type", [0, 3, -1])
def test_unknown_a_type_is_rejected(a_type):
    rejects(replace(VALID, a_type=a_type),
            rf"ferrum_marlin_mm: a_type={a_type} must be FERRUM_DTYPE_F16 \(1\) or FERRUM_DTYPE_BF16 \(2\)")


@pytest.mark.parametrize("a_type", [F16, BF16])
def test_known_a_types_pass(a_type):
    validate_mm(replace(VALID, a_type=a_type))


@pytest.mark.parametrize("b_type", [0, 5, 255])
def test_unknown_b_type_is_rejected(b_type):
    rejects(replace(VALID, b_type=b_type), rf"b_type={b_type} must be one of U4 \(1\), U4B8 \(2\), U8B128 \(3\), FE4M3FN \(4\)")


@pytest.mark.parametrize("b_type", [U4, U4B8, U8B128, FP8])
def test_every_weight_type_passes_with_its_flags(b_type):
    validate_mm(MmProblem.create(16, 256, 256, BF16, b_type, 128))


@pytest.mark.parametrize(
    "name", ["m", "n", "k", "lda", "group_size", "num_groups", "a_type", "b_type", "sms", "thread_k", "thread_n", "flags"]
)
@pytest.mark.parametrize("value", [1.0, True, "1", None])
def test_scalars_must_be_integers(name, value):
    rejects(replace(VALID, **{name: value}), rf"\b{name} must be an integer", ArgumentTypeError)


@pytest.mark.parametrize("name", ["m", "n", "k", "lda", "sms"])
def test_scalars_must_fit_in_int32(name):
    rejects(replace(VALID, **{name: 2**31}), rf"\b{name}=2147483648 does not fit in int32")


@pytest.mark.parametrize("flags", [-1, 2**32])
def test_flags_must_fit_in_unsigned_int(flags):
    rejects(replace(VALID, flags=flags), rf"flags={flags} does not fit in unsigned int")


# ---- shape ------------------------------------------------------------------------------


def test_m_must_not_be_negative_and_zero_is_a_no_op():
    rejects(replace(VALID, m=-1), r"\bm=-1 must be >= 0")
    validate_mm(replace(VALID, m=0))
    validate_mm(replace(VALID, m=2**31 - 1))


@pytest.mark.parametrize("value", [0, -64])
def test_n_must_be_positive(value):
    rejects(replace(VALID, n=value), rf"\bn={value} must be > 0")


def test_n_must_be_a_multiple_of_64():
    rejects(replace(VALID, n=96), r"\bn=96 must be divisible by 64")
    validate_mm(replace(VALID, n=64))
    validate_mm(replace(VALID, n=192))


@pytest.mark.parametrize("name, value", [("n", 2**28 + 64), ("k", 2**28 + 128), ("lda", 2**28 + 8)])
def test_dimensions_past_the_stride_limit_are_rejected(name, value):
    rejects(replace(VALID, **{name: value}), rf"\b{name}={value} must be at most FERRUM_MAX_DIM=268435456")
    validate_mm(MmProblem.create(16, 2**28, 2**28, F16, U4B8, 128))


@pytest.mark.parametrize("value", [0, -128])
def test_k_must_be_positive(value):
    rejects(replace(VALID, k=value, lda=256), rf"\bk={value} must be > 0")


def test_k_must_be_a_multiple_of_128():
    rejects(MmProblem.create(16, 256, 192, F16, U4B8, 64), r"\bk=192 must be divisible by 128")
    validate_mm(MmProblem.create(16, 256, 128, F16, U4B8, 64))
    validate_mm(MmProblem.create(16, 256, 384, F16, U4B8, 128))


def test_lda_must_cover_k():
    rejects(replace(VALID, lda=248), r"lda=248 must be >= k=256")
    validate_mm(replace(VALID, lda=256))


def test_lda_below_k_only_with_act_order():
    # A padded K shard: a is read only through perm, so it may be narrower than k.
    gathered = MmProblem.create(4, 256, 512, F16, U4B8, 128, lda=136, act_order=True)
    validate_mm(gathered)
    assert mm_spans(gathered, 1)["a"] == (3 * 136 + 136) * 2
    assert mm_spans(replace(gathered, lda=520), 1)["a"] == (3 * 520 + 512) * 2
    rejects(replace(gathered, lda=0), r"\blda=0 must be > 0")
    rejects(replace(gathered, lda=132), r"\blda=132 must be divisible by 8")
    rejects(replace(gathered, flags=VALID.flags), r"lda=136 must be >= k=512 \(less only with ACT_ORDER\)")


def test_lda_must_keep_rows_16_byte_aligned():
    rejects(replace(VALID, lda=260), r"\blda=260 must be divisible by 8")
    validate_mm(replace(VALID, lda=264))


@pytest.mark.parametrize("b_type", [U4, U4B8, U8B128])
@pytest.mark.parametrize("group_size", [0, 16, 96, 192, -2, 384])
def test_integer_weights_reject_other_group_sizes(b_type, group_size):
    problem = replace(MmProblem.create(16, 256, 768, F16, b_type, 128), group_size=group_size)
    rejects(problem, rf"group_size={group_size} must be -1, 32, 64 or a power of two >= 128")


@pytest.mark.parametrize("b_type", [U4, U4B8, U8B128])
@pytest.mark.parametrize("group_size", [-1, 32, 64, 128, 256, 512, 1024])
def test_integer_weights_take_every_group_size(b_type, group_size):
    validate_mm(MmProblem.create(16, 256, 1024, F16, b_type, group_size))


@pytest.mark.parametrize("group_size", [32, 64, 0])
def test_fp8_weights_take_only_channelwise_or_128(group_size):
    problem = replace(MmProblem.create(16, 256, 512, BF16, FP8, 128), group_size=group_size, num_groups=1)
    rejects(problem, rf"group_size={group_size} must be one of -1, 128 for b_type=FE4M3FN")
    validate_mm(MmProblem.create(16, 256, 512, BF16, FP8, 128))
    validate_mm(MmProblem.create(16, 256, 512, BF16, FP8, -1))


@pytest.mark.parametrize("group_size, good", [(-1, 1), (32, 16), (64, 8), (128, 4)])
def test_num_groups_must_match_the_group_size(group_size, good):
    problem = MmProblem.create(16, 256, 512, F16, U4B8, group_size)
    assert problem.num_groups == good
    validate_mm(problem)
    rejects(replace(problem, num_groups=good + 1), rf"num_groups={good + 1} must be {good}")
    rejects(replace(problem, num_groups=0), rf"num_groups=0 must be {good}")


# ---- flags ------------------------------------------------------------------------------


@pytest.mark.parametrize("bit", [0x20, 0x40, 0x100, 0x80000000])
def test_unknown_flag_bits_are_rejected(bit):
    rejects(with_flags(VALID, bit), rf"flags=0x[0-9a-f]+ has unknown bits {bit:#x}")


def k_shard(**overrides) -> MmProblem:
    """A K shard of an act-order layer: 384 rows of a layer with 24 groups."""
    args = dict(m=16, n=256, k=384, a_type=F16, b_type=U4B8, group_size=128, act_order=True, k_full=False,
                num_groups=24)
    args.update(overrides)
    return MmProblem.create(**args)


def test_k_shard_problem_takes_the_layers_groups():
    p = k_shard()
    assert p.k_sharded and not p.has(FERRUM_MM_FLAG_K_FULL) and p.num_groups == 24
    validate_mm(p)
    validate_mm(k_shard(k=256, num_groups=1, group_size=64, b_type=U4))  # k need not be groups * group_size
    validate_mm(k_shard(thread_k=128, thread_n=128))


def test_k_full_may_be_clear_only_with_act_order():
    rejects(with_flags(VALID, clear_bits=FERRUM_MM_FLAG_K_FULL), r"may clear K_FULL \(a K shard .*\) only with ACT_ORDER")


def test_k_shard_rules():
    rejects(k_shard(num_groups=0), r"num_groups=0 must be > 0")
    rejects(k_shard(n=192), r"n=192 must be divisible by 128 with K_FULL clear")
    rejects(k_shard(thread_k=64, thread_n=256, n=512), r"K_FULL clear runs the \(128, 128\) tile")
    rejects(k_shard(b_type=FP8), r"ACT_ORDER needs an integer weight type")
    rejects(k_shard(group_size=-1), r"ACT_ORDER needs group_size > 0")
    # A shard with K_FULL set must have whole groups.
    rejects(with_flags(k_shard(), FERRUM_MM_FLAG_K_FULL), r"num_groups=24 must be 3")


def test_k_shard_scale_spans_cover_the_whole_layer():
    spans = mm_spans(k_shard(b_type=U4), SMS)
    assert spans["b_scales"] == 24 * 256 * 2 and spans["zero_points"] == 24 * 256 // 8 * 4
    assert spans["g_idx"] == spans["perm"] == 384 * 4


@pytest.mark.parametrize("b_type", [U4B8, U8B128, FP8])
def test_zero_points_flag_only_for_u4(b_type):
    problem = MmProblem.create(16, 256, 256, F16, b_type, 128)
    validate_mm(problem)
    rejects(with_flags(problem, FERRUM_MM_FLAG_HAS_ZERO_POINTS), r"HAS_ZERO_POINTS must be set exactly when b_type is U4")


def test_u4_needs_the_zero_points_flag():
    problem = MmProblem.create(16, 256, 256, F16, U4, 128)
    validate_mm(problem)
    rejects(with_flags(problem, clear_bits=FERRUM_MM_FLAG_HAS_ZERO_POINTS),
            r"HAS_ZERO_POINTS must be set exactly when b_type is U4 \(b_type=U4, HAS_ZERO_POINTS clear\)")


@pytest.mark.parametrize("b_type", [U4, U4B8, U8B128])
@pytest.mark.parametrize("group_size", [32, 64, 128])
def test_act_order_for_grouped_integer_weights(b_type, group_size):
    validate_mm(MmProblem.create(16, 256, 256, F16, b_type, group_size, act_order=True))


def test_act_order_needs_an_integer_weight_type():
    rejects(MmProblem.create(16, 256, 256, F16, FP8, 128, act_order=True),
            r"ACT_ORDER needs an integer weight type, got b_type=FE4M3FN")


def test_act_order_needs_grouped_scales():
    rejects(MmProblem.create(16, 256, 256, F16, U4B8, -1, act_order=True), r"ACT_ORDER needs group_size > 0, got group_size=-1")


def test_atomic_add_and_fp32_reduce_exclude_each_other():
    rejects(with_flags(VALID, FERRUM_MM_FLAG_FP32_REDUCE), r"ATOMIC_ADD and FP32_REDUCE exclude each other")
    validate_mm(with_flags(VALID, FERRUM_MM_FLAG_FP32_REDUCE, FERRUM_MM_FLAG_ATOMIC_ADD))
    validate_mm(with_flags(VALID, clear_bits=FERRUM_MM_FLAG_ATOMIC_ADD))  # neither: atomics by default


# ---- execution ------------------------------------------------------------------------------


@pytest.mark.parametrize("sms", [0, -2, -100])
def test_sms_must_be_all_or_positive(sms):
    rejects(replace(VALID, sms=sms), rf"\bsms={sms} must be -1 \(all\) or >= 1")


@pytest.mark.parametrize("sms", [-1, 1, 7, 1000])
def test_valid_sms(sms):
    validate_mm(replace(VALID, sms=sms))


@pytest.mark.parametrize("tile", [(64, 64), (128, -1), (-1, 128), (256, 128), (64, 128), (32, 256)])
def test_unknown_tiles_are_rejected(tile):
    rejects(replace(VALID, thread_k=tile[0], thread_n=tile[1]), rf"\(thread_k, thread_n\)=\({tile[0]}, {tile[1]}\) must be one of")


@pytest.mark.parametrize("tile", [(128, 128), (64, 256), (128, 64), (128, 256)])
def test_every_legal_tile_passes(tile):
    validate_mm(replace(VALID, thread_k=tile[0], thread_n=tile[1]))


def test_deep_tile_serves_at_most_16_rows():
    deep = replace(VALID, thread_k=128, thread_n=256)
    validate_mm(replace(deep, m=16))
    rejects(replace(deep, m=17), r"tile \(thread_k=128, thread_n=256\) serves m <= 16, got m=17")


def test_a_forced_tile_must_divide_the_problem():
    rejects(replace(VALID, n=192, thread_k=64, thread_n=256), r"\bn=192 must be divisible by 256")
    validate_mm(replace(VALID, n=192, thread_k=128, thread_n=64))


# ---- spans ------------------------------------------------------------------------------


def test_spans_of_a_4_bit_problem():
    p = MmProblem.create(5, 256, 512, F16, U4, 64, lda=520, act_order=True, fp32_reduce=True)
    assert mm_spans(p, SMS) == {
        "a": ((5 - 1) * 520 + 512) * 2,
        "b": 512 // 16 * 2 * 256 * 4,
        "c": 5 * 256 * 2,
        "b_scales": 8 * 256 * 2,
        "workspace": FERRUM_MM_WORKSPACE_INTS_PER_SM * SMS * 4,
        "bias": 256 * 2,
        "zero_points": 8 * 256 // 8 * 4,
        "g_idx": 512 * 4,
        "perm": 512 * 4,
        "a_tmp": 5 * 512 * 2,
        "c_tmp": FERRUM_MM_C_TMP_FLOATS_PER_SM * SMS * 4,
    }


@pytest.mark.parametrize("b_type", [U8B128, FP8])
def test_spans_of_an_8_bit_problem(b_type):
    p = MmProblem.create(3, 128, 256, BF16, b_type, -1)
    spans = mm_spans(p, SMS)
    assert spans["b"] == 256 // 16 * 4 * 128 * 4
    assert spans["b_scales"] == 1 * 128 * 2
    assert not {"zero_points", "g_idx", "perm", "a_tmp", "c_tmp"} & set(spans)


def test_spans_of_the_largest_problem_do_not_overflow():
    p = MmProblem.create(2**31 - 1, 2**28, 2**28, F16, U4B8, 128, lda=2**28)
    validate_mm(p)
    assert mm_spans(p, 1)["c"] == (2**31 - 1) * 2**28 * 2
    assert mm_workspace_ints(132) == 4 * 132 and mm_c_tmp_floats(132) == 65536 * 132


# ---- buffers ------------------------------------------------------------------------------


def buffers_for(problem: MmProblem, sms: int = SMS, **changes) -> MmBuffers:
    act = problem.has(FERRUM_MM_FLAG_ACT_ORDER)
    fp32 = problem.has(FERRUM_MM_FLAG_FP32_REDUCE)
    spans = mm_spans(problem, sms)
    base = dict(
        a=0x10000, b=0x20000, c=0x30000, b_scales=0x40000, workspace=0x50000,
        workspace_bytes=spans["workspace"],
        zero_points=0x60000 if problem.has(FERRUM_MM_FLAG_HAS_ZERO_POINTS) else 0,
        g_idx=0x70000 if act else 0, perm=0x80000 if act else 0,
        a_tmp=0x90000 if act else 0, a_tmp_bytes=spans.get("a_tmp", 0),
        c_tmp=0xA0000 if fp32 else 0, c_tmp_bytes=spans.get("c_tmp", 0),
    )
    return MmBuffers(**{**base, **changes})


FULL = MmProblem.create(16, 256, 256, BF16, U4, 128, act_order=True, fp32_reduce=True)


def rejects_buffers(problem: MmProblem, match: str, exc=ArgumentError, **changes) -> None:
    with pytest.raises(exc, match=match):
        validate_mm_buffers(problem, buffers_for(problem, **changes), SMS)


def test_valid_buffers_pass():
    validate_mm_buffers(VALID, buffers_for(VALID), SMS)
    validate_mm_buffers(FULL, buffers_for(FULL), SMS)
    validate_mm_buffers(FULL, buffers_for(FULL, bias=0xB0000), SMS)


@pytest.mark.parametrize("name", ["a", "b", "c", "b_scales", "workspace"])
def test_required_pointers_must_not_be_null(name):
    rejects_buffers(VALID, rf"ferrum_marlin_mm: {name} pointer must not be null", **{name: 0})


@pytest.mark.parametrize("name", ["a", "b", "c", "b_scales", "zero_points", "a_tmp", "c_tmp", "bias"])
def test_16_byte_pointers(name):
    rejects_buffers(FULL, rf"\b{name} pointer 0x[0-9a-f]+8 must be 16-byte aligned", **{name: 0xC0008})
    validate_mm_buffers(FULL, buffers_for(FULL, **{name: 0xC0010}), SMS)


@pytest.mark.parametrize("name", ["g_idx", "perm", "workspace"])
def test_4_byte_pointers(name):
    rejects_buffers(FULL, rf"\b{name} pointer 0x[0-9a-f]+2 must be 4-byte aligned", **{name: 0xC0002})
    validate_mm_buffers(FULL, buffers_for(FULL, **{name: 0xC0004}), SMS)


def test_zero_points_exactly_for_u4():
    u4 = MmProblem.create(16, 256, 256, F16, U4, 128)
    rejects_buffers(u4, r"zero_points pointer must not be null when flags has HAS_ZERO_POINTS", zero_points=0)
    rejects_buffers(VALID, r"zero_points pointer must be null unless flags has HAS_ZERO_POINTS", zero_points=0x60000)


@pytest.mark.parametrize("name", ["g_idx", "perm", "a_tmp"])
def test_act_order_buffers_exactly_with_act_order(name):
    rejects_buffers(FULL, rf"\b{name} pointer must not be null when flags has ACT_ORDER", **{name: 0})
    rejects_buffers(VALID, rf"\b{name} pointer must be null unless flags has ACT_ORDER", **{name: 0xD0000})


def test_c_tmp_exactly_with_fp32_reduce():
    rejects_buffers(FULL, r"c_tmp pointer must not be null when flags has FP32_REDUCE", c_tmp=0)
    rejects_buffers(VALID, r"c_tmp pointer must be null unless flags has FP32_REDUCE", c_tmp=0xD0000)


def test_a_scales_is_reserved():
    rejects_buffers(VALID, r"a_scales pointer is reserved and must be null", a_scales=0xE0000)


def test_workspace_capacity_covers_every_sm():
    need = FERRUM_MM_WORKSPACE_INTS_PER_SM * SMS * 4
    rejects_buffers(VALID, rf"workspace \(workspace_bytes\) holds {need - 1} bytes, needs {need}", workspace_bytes=need - 1)
    validate_mm_buffers(VALID, buffers_for(VALID, workspace_bytes=need), SMS)


def test_c_tmp_capacity_covers_every_sm():
    need = FERRUM_MM_C_TMP_FLOATS_PER_SM * SMS * 4
    rejects_buffers(FULL, rf"c_tmp \(c_tmp_bytes\) holds {need - 4} bytes, needs {need}", c_tmp_bytes=need - 4)


def test_a_tmp_capacity_covers_m_by_k():
    need = 16 * 256 * 2
    rejects_buffers(FULL, rf"a_tmp \(a_tmp_bytes\) holds {need - 2} bytes, needs {need}", a_tmp_bytes=need - 2)


@pytest.mark.parametrize("value", [-16, 1.5, 2**64])
def test_pointers_must_be_pointer_sized_integers(value):
    rejects_buffers(VALID, r"\bc must be a device pointer", ArgumentTypeError, c=value)


def test_capacities_must_be_non_negative_integers():
    rejects_buffers(VALID, r"workspace_bytes=-1 must be >= 0", workspace_bytes=-1)
    rejects_buffers(VALID, r"c_tmp_bytes must be an integer", ArgumentTypeError, c_tmp_bytes=1.0)


# ---- launch_marlin_mm: the struct it fills ----------------------------------------------------


def launch(problem: MmProblem, sms: int = SMS, **changes) -> None:
    b = buffers_for(problem, sms, **changes)
    launch_marlin_mm(problem, **{name: getattr(b, name) for name in MmBuffers.__dataclass_fields__}, device=0, stream=0x1234)


def test_launch_fills_every_field_of_the_struct(monkeypatch):
    lib = mm_fakes.install_library(monkeypatch)
    problem = replace(FULL, sms=SMS, thread_k=128, thread_n=128, lda=264)
    b = buffers_for(problem, bias=0xB0000)
    launch_marlin_mm(problem, **{name: getattr(b, name) for name in MmBuffers.__dataclass_fields__}, device=0, stream=0x1234)
    (fields,) = lib.launches
    assert fields["abi_version"] == FERRUM_MM_LAUNCH_VERSION
    assert fields["struct_size"] == ctypes.sizeof(FerrumMarlinLaunch)
    for name in MmBuffers.__dataclass_fields__:
        assert fields[name] == getattr(b, name), name
    for name in ("m", "n", "k", "lda", "num_groups", "group_size", "a_type", "b_type", "sms", "thread_k", "thread_n", "flags"):
        assert fields[name] == getattr(problem, name), name
    assert (fields["device"], fields["stream"]) == (0, 0x1234)
    assert lib.device_queries == 0  # sms given: nothing to ask the device


def test_launch_resolves_all_sms_from_the_device(monkeypatch):
    lib = mm_fakes.install_library(monkeypatch, mm_fakes.FakeLibrary(sms=132))
    with pytest.raises(ArgumentError, match=r"workspace \(workspace_bytes\) holds 128 bytes, needs 2112"):
        launch(VALID, sms=SMS)  # sized for 8 SMs, the device has 132
    launch(VALID, sms=132)
    launch(VALID, sms=132)
    assert lib.device_queries == 1  # cached per device
    assert lib.launches[-1]["sms"] == -1  # the struct keeps "all"


def test_launch_rejects_before_the_library(monkeypatch):
    lib = mm_fakes.install_library(monkeypatch)
    with pytest.raises(ArgumentError, match=r"ferrum_marlin_mm: n=96 must be divisible by 64"):
        launch(replace(VALID, n=96, sms=SMS))
    with pytest.raises(ArgumentError, match=r"b pointer must not be null"):
        launch(replace(VALID, sms=SMS), b=0)
    with pytest.raises(ArgumentError, match=r"\bdevice=-1 must be >= 0"):
        launch_marlin_mm(VALID, a=16, b=16, c=16, b_scales=16, workspace=16, workspace_bytes=4096, device=-1)
    with pytest.raises(ArgumentError, match=r"stream must be a non-negative integer handle"):
        launch_marlin_mm(VALID, a=16, b=16, c=16, b_scales=16, workspace=16, workspace_bytes=4096, stream=-3)
    assert lib.launches == []


def test_launch_with_m_zero_returns_without_the_library(monkeypatch):
    lib = mm_fakes.install_library(monkeypatch)
    launch_marlin_mm(replace(VALID, m=0), a=0, b=0, c=0, b_scales=0, workspace=0, workspace_bytes=0)
    assert lib.launches == [] and lib.device_queries == 0


def test_launch_checks_spans(monkeypatch):
    lib = mm_fakes.install_library(monkeypatch)
    problem = replace(VALID, sms=SMS)
    spans = mm_spans(problem, SMS)
    b = buffers_for(problem)
    kwargs = {name: getattr(b, name) for name in MmBuffers.__dataclass_fields__}
    with pytest.raises(ArgumentError, match=rf"\bb holds {spans['b'] - 4} bytes, needs {spans['b']}"):
        launch_marlin_mm(problem, **kwargs, spans={"b": spans["b"] - 4})
    with pytest.raises(ArgumentError, match=r"spans names 'c_tmp', which this problem does not use"):
        launch_marlin_mm(problem, **kwargs, spans={"c_tmp": 10**9})
    launch_marlin_mm(problem, **kwargs, spans={k: v for k, v in spans.items()})
    assert len(lib.launches) == 1


def test_native_failure_is_a_native_error_naming_the_problem(monkeypatch):
    mm_fakes.install_library(monkeypatch, mm_fakes.FakeLibrary(status=(8 << 16) | 1, detail="ferrum_marlin_mm: tile does not fit"))
    problem = replace(MmProblem.create(16, 256, 256, BF16, U4, 64), sms=SMS)
    with pytest.raises(NativeError) as info:
        launch(problem)
    err = info.value
    assert err.entry_point == "ferrum_marlin_mm"
    assert (err.stage, err.stage_name, err.cuda_status) == (8, "shape", 1)
    assert err.shape == {"m": 16, "n": 256, "k": 256, "group_size": 64, "a_type": "BF16", "b_type": "U4", "flags": "0xe"}
    assert "tile does not fit" in str(err)


def test_device_sm_count_asks_the_library_once(monkeypatch):
    lib = mm_fakes.install_library(monkeypatch, mm_fakes.FakeLibrary(sms=78))
    assert mm.device_sm_count(0) == 78
    assert mm.resolved_sms(-1, 0) == 78
    assert mm.resolved_sms(5, 0) == 5
    assert lib.device_queries == 1
