"""Every launch rule of ferrum_ffi.validation, and proof that the public entry
points apply them before anything native runs (CPU only, no library needed)."""

from __future__ import annotations

import re
from dataclasses import replace

import numpy as np
import pytest

import ferrum_ffi
from ferrum_ffi import dense
from ferrum_ffi._interop import DeviceArray
from ferrum_ffi._abi import FERRUM_MAX_DIM
from ferrum_ffi.status import ArgumentError, ArgumentTypeError
from ferrum_ffi.validation import (
    DEFAULT_MAX_PAR,
    I32_MAX,
    W4A16Problem,
    check_array,
    check_int,
    check_shape,
    check_span,
    checked_product,
    validate_expert_slice,
    validate_w4a16,
    validate_w4a16_pointers,
    w4a16_spans,
    workspace_ints,
)

VALID = W4A16Problem(m=16, n=256, k=256, group_size=128)


def rejects(problem: W4A16Problem, match: str, exc: type[Exception] = ArgumentError) -> None:
    with pytest.raises(exc, match=match):
        validate_w4a16(problem)


# ---- validate_w4a16 --------------------------------------------------------------


def test_valid_problem_is_accepted():
    validate_w4a16(VALID)
    validate_w4a16(replace(VALID, m=0))  # m == 0 is a no-op, not an error
    validate_w4a16(W4A16Problem(m=1, n=64, k=128, group_size=-1))


def test_negative_m_is_rejected():
    rejects(replace(VALID, m=-1), r"\bm=-1 must be >= 0")


@pytest.mark.parametrize("name", ["n", "k"])
@pytest.mark.parametrize("value", [0, -128])
def test_n_and_k_must_be_positive(name, value):
    rejects(replace(VALID, **{name: value}), rf"\b{name}={value} must be > 0")


def test_n_must_be_a_multiple_of_64():
    rejects(replace(VALID, n=96), r"\bn=96 must be divisible by 64")
    validate_w4a16(replace(VALID, n=64))
    validate_w4a16(replace(VALID, n=192))


def test_k_must_be_a_multiple_of_128():
    rejects(replace(VALID, k=192), r"\bk=192 must be divisible by 128")
    validate_w4a16(replace(VALID, k=128))
    validate_w4a16(replace(VALID, k=384))


@pytest.mark.parametrize("group_size", [0, 32, 64, 256, -2, 1024])
def test_unsupported_group_sizes_are_rejected(group_size):
    rejects(replace(VALID, group_size=group_size), rf"group_size={group_size}\b")


@pytest.mark.parametrize("group_size", [-1, 128])
def test_supported_group_sizes_are_accepted(group_size):
    validate_w4a16(replace(VALID, group_size=group_size))


@pytest.mark.parametrize("n_full", [-1, 256, 320, 4096])
def test_valid_n_full(n_full):
    validate_w4a16(replace(VALID, n_full=n_full))


@pytest.mark.parametrize("n_full", [0, 192, 288, -2])
def test_invalid_n_full(n_full):
    # smaller than n, not a multiple of 64, or a negative other than -1
    rejects(replace(VALID, n_full=n_full), rf"n_full={n_full}\b")


@pytest.mark.parametrize("tile", [(128, 128), (128, 256), (64, 256), (128, 64), (-1, -1)])
def test_supported_tiles_are_accepted(tile):
    validate_w4a16(replace(VALID, thread_k=tile[0], thread_n=tile[1]))


@pytest.mark.parametrize("tile", [(64, 64), (256, 128), (256, 256), (-1, 128), (128, -1), (64, 128), (0, 0)])
def test_unsupported_tiles_are_rejected(tile):
    rejects(replace(VALID, thread_k=tile[0], thread_n=tile[1]), re.escape(f"(thread_k, thread_n)={tile}"))


def test_forced_tile_must_divide_n():
    rejects(replace(VALID, n=128, thread_k=64, thread_n=256), r"\bn=128 must be divisible by 256")
    rejects(replace(VALID, n=192, thread_k=128, thread_n=128), r"\bn=192 must be divisible by 128")
    validate_w4a16(replace(VALID, n=192, thread_k=128, thread_n=64))
    validate_w4a16(replace(VALID, n=512, thread_k=64, thread_n=256))


@pytest.mark.parametrize("sms", [0, -2, -100])
def test_invalid_sms(sms):
    rejects(replace(VALID, sms=sms), rf"sms={sms}\b")


@pytest.mark.parametrize("sms", [-1, 1, 132, 10_000])
def test_valid_sms(sms):
    validate_w4a16(replace(VALID, sms=sms))


@pytest.mark.parametrize("max_par", [0, -1])
def test_invalid_max_par(max_par):
    rejects(replace(VALID, max_par=max_par), rf"max_par={max_par}\b")


def test_max_par_one_is_accepted():
    validate_w4a16(replace(VALID, max_par=1))


def test_locks_must_cover_the_narrowest_tile():
    rejects(replace(VALID, n=192, max_par=2), r"max_par=2 .* fewer than the 3 column tiles of width 64")
    validate_w4a16(replace(VALID, n=192, max_par=3))
    rejects(replace(VALID, n=256, max_par=1, thread_k=128, thread_n=64), r"4 column tiles of width 64")
    validate_w4a16(replace(VALID, n=256, max_par=2, thread_k=128, thread_n=64))


def test_deep_tile_serves_small_slabs_only():
    validate_w4a16(replace(VALID, m=16, n=256, thread_k=128, thread_n=256))
    rejects(replace(VALID, m=17, n=256, thread_k=128, thread_n=256), r"serves m <= 16, got m=17")


@pytest.mark.parametrize("name", ["m", "n", "k", "group_size", "n_full", "thread_k", "thread_n", "sms", "max_par"])
@pytest.mark.parametrize("value", [True, 64.0, "64", None])
def test_non_integers_are_type_errors(name, value):
    rejects(replace(VALID, **{name: value}), rf"\b{name} must be an integer", ArgumentTypeError)


def test_numpy_integers_are_accepted():
    validate_w4a16(W4A16Problem(m=np.int64(3), n=np.int32(256), k=np.uint16(256), group_size=np.int8(-1)))


@pytest.mark.parametrize("name, value", [("m", I32_MAX + 1), ("n", 2**31), ("k", 2**40), ("m", -(2**31) - 1)])
def test_int32_overflow_is_rejected(name, value):
    rejects(replace(VALID, **{name: value}), rf"\b{name}={value} does not fit in int32")


def test_largest_values_are_accepted():
    validate_w4a16(W4A16Problem(m=I32_MAX, n=FERRUM_MAX_DIM, k=FERRUM_MAX_DIM, group_size=-1))


@pytest.mark.parametrize("name, value", [("n", FERRUM_MAX_DIM + 64), ("k", FERRUM_MAX_DIM + 128)])
def test_dimensions_past_the_stride_limit_are_rejected(name, value):
    rejects(replace(VALID, **{name: value}), rf"\b{name}={value} must be at most FERRUM_MAX_DIM=268435456")


def test_a_column_slice_of_a_too_wide_weight_is_rejected():
    rejects(replace(VALID, n_full=FERRUM_MAX_DIM + 64), r"\bn_full=268435520 must be at most FERRUM_MAX_DIM")
    validate_w4a16(replace(VALID, n_full=FERRUM_MAX_DIM))


def test_entry_name_prefixes_the_message():
    with pytest.raises(ArgumentError, match=r"^my_entry: n=96"):
        validate_w4a16(replace(VALID, n=96), "my_entry")


def test_problem_properties():
    assert replace(VALID, n_full=-1).stride_n == 256
    assert replace(VALID, n_full=512).stride_n == 512
    assert W4A16Problem(m=1, n=64, k=1024, group_size=128).groups == 8
    assert W4A16Problem(m=1, n=64, k=1024, group_size=-1).groups == 1
    assert VALID.max_par == DEFAULT_MAX_PAR == 16


# ---- spans and workspace ---------------------------------------------------------


def test_spans_of_a_column_slice_by_hand():
    # m=3, n=64 columns out of n_full=192, k=256 (16 packed rows), 2 groups of 128.
    spans = w4a16_spans(W4A16Problem(m=3, n=64, k=256, group_size=128, n_full=192))
    assert spans == {
        "A": 3 * 256 * 2,  # 1536
        "B": 15 * (2 * 192) * 4 + 2 * 64 * 4,  # 15 full rows + the slice of the last: 23552
        "C": 3 * 64 * 2,  # 384
        "s": 1 * 192 * 2 + 64 * 2,  # one full scale row + the slice of the last: 512
        "workspace": 1 * 16 * 4,  # max(1, 64/128) * max_par ints
    }
    assert spans["B"] == 23552 and spans["s"] == 512


def test_spans_of_a_full_channelwise_problem_by_hand():
    spans = w4a16_spans(W4A16Problem(m=2, n=256, k=128, group_size=-1, max_par=4))
    assert spans == {
        "A": 2 * 128 * 2,
        "B": 128 * 256 // 2,  # the whole packed weight: k*n/2 bytes
        "C": 2 * 256 * 2,
        "s": 256 * 2,  # one scale row
        "workspace": 2 * 4 * 4,
    }


def test_spans_with_n_full_equal_n_match_the_dense_sizes():
    p = W4A16Problem(m=5, n=384, k=512, group_size=128)
    spans = w4a16_spans(replace(p, n_full=384))
    assert spans == w4a16_spans(p)
    assert spans["B"] == 512 * 384 // 2
    assert spans["s"] == (512 // 128) * 384 * 2


@pytest.mark.parametrize(
    "n, max_par, expected",
    [(64, DEFAULT_MAX_PAR, DEFAULT_MAX_PAR), (128, 16, 16), (256, 16, 32), (256, 3, 6), (4096, 8, 256), (64, 1, 1)],
)
def test_workspace_ints(n, max_par, expected):
    assert workspace_ints(n, max_par) == expected


def test_workspace_ints_default_max_par():
    assert workspace_ints(64) == DEFAULT_MAX_PAR
    assert workspace_ints(256) == 2 * DEFAULT_MAX_PAR


# ---- pointers ----------------------------------------------------------------------

POINTERS = dict(a=0x1000, b=0x2000, c=0x3000, s=0x4000, workspace=0x5000)
POINTER_NAMES = dict(a="A", b="B", c="C", s="s", workspace="workspace")


def test_aligned_pointers_are_accepted():
    validate_w4a16_pointers(**POINTERS)
    validate_w4a16_pointers(**{**POINTERS, "workspace": 0x5004})  # 4-byte is enough


@pytest.mark.parametrize("arg", sorted(POINTERS))
def test_each_null_pointer_is_named(arg):
    with pytest.raises(ArgumentError, match=rf": {POINTER_NAMES[arg]} pointer must not be null"):
        validate_w4a16_pointers(**{**POINTERS, arg: 0})


@pytest.mark.parametrize("arg", ["a", "b", "c", "s"])
def test_each_misaligned_pointer_is_named(arg):
    with pytest.raises(ArgumentError, match=rf": {POINTER_NAMES[arg]} pointer 0x1008 must be 16-byte aligned"):
        validate_w4a16_pointers(**{**POINTERS, arg: 0x1008})


def test_misaligned_workspace():
    with pytest.raises(ArgumentError, match=r"workspace pointer 0x5002 must be 4-byte aligned"):
        validate_w4a16_pointers(**{**POINTERS, "workspace": 0x5002})


# ---- expert slices -----------------------------------------------------------------


def test_valid_expert_slices_return_the_expert_index():
    assert validate_expert_slice("e", 0, 128, 512) == 0
    assert validate_expert_slice("e", 256, 128, 512) == 2
    assert validate_expert_slice("e", 384, 128, 512) == 3
    assert validate_expert_slice("e", 0, 512, 512) == 0


def test_offset_must_be_a_multiple_of_expert_n():
    with pytest.raises(ArgumentError, match=r"expert_offset=64 must be a multiple of expert_n=128"):
        validate_expert_slice("e", 64, 128, 512)


@pytest.mark.parametrize("offset, expert_n", [(512, 128), (512, 256), (0, 576)])
def test_slice_must_lie_inside_the_stacked_n(offset, expert_n):
    with pytest.raises(ArgumentError, match=rf"expert_offset={offset} \+ expert_n={expert_n} exceeds"):
        validate_expert_slice("e", offset, expert_n, 512)


def test_negative_offset():
    with pytest.raises(ArgumentError, match=r"expert_offset=-128 must be >= 0"):
        validate_expert_slice("e", -128, 128, 512)


@pytest.mark.parametrize("expert_n, rule", [(96, "divisible by 64"), (0, "> 0"), (-64, "> 0")])
def test_expert_n_rules(expert_n, rule):
    with pytest.raises(ArgumentError, match=rf"expert_n={expert_n} must be {re.escape(rule)}"):
        validate_expert_slice("e", 0, expert_n, 512)


@pytest.mark.parametrize("name, args", [("expert_offset", (True, 128, 512)), ("expert_n", (0, 128.0, 512))])
def test_expert_slice_type_errors(name, args):
    with pytest.raises(ArgumentTypeError, match=rf"{name} must be an integer"):
        validate_expert_slice("e", *args)


# ---- small helpers ------------------------------------------------------------------


def test_checked_product():
    assert checked_product("e", "X", 3, 5, 2) == 30
    assert checked_product("e", "X") == 1
    assert checked_product("e", "X", 2**62, 1) == 2**62
    assert checked_product("e", "X", 2**31 - 1, 2**31 - 1, 2) < 2**63


@pytest.mark.parametrize("factors", [(2**62, 2), (2**32, 2**32), (2**31, 2**31, 2), (2**63,)])
def test_checked_product_overflow(factors):
    with pytest.raises(ArgumentError, match=r"e: X size overflows"):
        checked_product("e", "X", *factors)


def test_check_int():
    assert check_int("e", "x", np.int16(7)) == 7
    assert isinstance(check_int("e", "x", np.int64(7)), int)
    with pytest.raises(ArgumentTypeError, match=r"x must be an integer, got bool"):
        check_int("e", "x", True)
    with pytest.raises(ArgumentTypeError, match=r"x must be an integer, got float"):
        check_int("e", "x", 1.0)
    with pytest.raises(ArgumentError, match=r"x=2147483648 does not fit in int32"):
        check_int("e", "x", 2**31)


def test_check_span():
    check_span("e", "B", 100, 100)
    with pytest.raises(ArgumentError, match=r"e: B holds 99 bytes, needs 100"):
        check_span("e", "B", 99, 100)


def device_array(ptr=0x10000, shape=(4, 8), dtype=np.float16, strides=None, readonly=False) -> DeviceArray:
    return DeviceArray(ptr=ptr, shape=shape, dtype=np.dtype(dtype), strides=strides, stream=None,
                       readonly=readonly, library="cai", owner=None)


def test_check_array_accepts_a_valid_array():
    check_array("e", "a", device_array(), np.float16, ndim=2)
    check_array("e", "a", device_array(strides=(16, 2)), np.float16, ndim=2)  # explicit C strides
    check_array("e", "ws", device_array(ptr=0x10004, dtype=np.int32), np.int32, alignment=4)
    check_array("e", "a", device_array(ptr=0x10002, shape=(0, 8)), np.float16)  # empty: any pointer


def test_check_array_wrong_dtype():
    with pytest.raises(ArgumentTypeError, match=r"e: a must have dtype float16, got float32"):
        check_array("e", "a", device_array(dtype=np.float32), np.float16)


def test_check_array_wrong_ndim():
    with pytest.raises(ArgumentError, match=r"e: a must be 2-D, got shape \(32,\)"):
        check_array("e", "a", device_array(shape=(32,)), np.float16, ndim=2)


@pytest.mark.parametrize("strides", [(2, 8), (32, 2), (16, 4)])
def test_check_array_non_contiguous(strides):
    with pytest.raises(ArgumentError, match=r"e: a must be C-contiguous"):
        check_array("e", "a", device_array(strides=strides), np.float16)


def test_check_array_misaligned():
    with pytest.raises(ArgumentError, match=r"e: a pointer 0x10008 must be 16-byte aligned"):
        check_array("e", "a", device_array(ptr=0x10008), np.float16)
    with pytest.raises(ArgumentError, match=r"ws pointer 0x10002 must be 4-byte aligned"):
        check_array("e", "ws", device_array(ptr=0x10002, dtype=np.int32), np.int32, alignment=4)


def test_check_shape():
    check_shape("e", "out", device_array(), (4, 8))
    with pytest.raises(ArgumentError, match=r"e: out must have shape \(4, 16\), got \(4, 8\)"):
        check_shape("e", "out", device_array(), (4, 16))


# ---- the raw-pointer API validates before loading the library ----------------------


@pytest.fixture
def no_native(monkeypatch):
    """Any attempt to reach the native library fails the test loudly."""

    def forbidden():
        raise AssertionError("the native library was reached")

    monkeypatch.setattr(dense, "library", forbidden)


def launch(problem: W4A16Problem, **changes):
    args = dict(a=0x1000, b=0x2000, c=0x3000, s=0x4000, problem=problem, workspace=0x5000)
    args.update(changes)
    ferrum_ffi.launch_marlin_cuda(**args)


def test_launch_rejects_a_bad_shape_before_the_library(no_native):
    with pytest.raises(ArgumentError, match=r"marlin_cuda: n=96 must be divisible by 64"):
        launch(replace(VALID, n=96))
    with pytest.raises(ArgumentError, match=r"group_size=64"):
        launch(replace(VALID, group_size=64))
    with pytest.raises(ArgumentTypeError, match=r"\bm must be an integer"):
        launch(replace(VALID, m=1.0))


def test_launch_rejects_bad_pointers_before_the_library(no_native):
    with pytest.raises(ArgumentError, match=r"A pointer must not be null"):
        launch(VALID, a=0)
    with pytest.raises(ArgumentError, match=r"B pointer 0x2008 must be 16-byte aligned"):
        launch(VALID, b=0x2008)


@pytest.mark.parametrize("dev, exc", [(-1, ArgumentError), (True, ArgumentTypeError), (2**31, ArgumentError)])
def test_launch_rejects_a_bad_device(no_native, dev, exc):
    with pytest.raises(exc, match=r"\bdev\b"):
        launch(VALID, dev=dev)


def test_launch_rejects_short_spans_before_the_library(no_native):
    spans = w4a16_spans(VALID)
    with pytest.raises(ArgumentError, match=rf"B holds {spans['B'] - 1} bytes, needs {spans['B']}"):
        launch(VALID, spans={**spans, "B": spans["B"] - 1})
    with pytest.raises(ArgumentError, match=r"workspace holds 4 bytes"):
        launch(VALID, spans={"workspace": 4})


def test_launch_with_m_zero_returns_without_the_library(no_native):
    launch(replace(VALID, m=0), a=0, b=0, c=0, s=0, workspace=0)


def test_valid_launch_does_reach_the_library(no_native):
    # The positive control: with every rule satisfied the next step is native.
    with pytest.raises(AssertionError, match="native library was reached"):
        launch(VALID, spans=w4a16_spans(VALID))


# ---- the array API validates before native calls ----------------------------------


class FakeCAI:
    """A device array that is nothing but a ``__cuda_array_interface__`` dict."""

    _next_ptr = 0x10000

    def __init__(self, shape, typestr="<f2", ptr=None, readonly=False, strides=None):
        if ptr is None:
            ptr = FakeCAI._next_ptr
            FakeCAI._next_ptr += 1 << 24  # distinct, 16-byte aligned
        self.__cuda_array_interface__ = {
            "version": 3,
            "shape": tuple(shape),
            "typestr": typestr,
            "data": (ptr, readonly),
            "strides": strides,
        }


K, N = 256, 128


def weight_buffers(k=K, n=N, experts=1, max_par=DEFAULT_MAX_PAR, group_size=128):
    n_e = n // experts
    groups = 1 if group_size == -1 else k // group_size
    return dict(
        qweight=FakeCAI((experts * k // 16, 2 * n_e), "<i4"),
        scales=FakeCAI((experts * groups, n_e), "<f2"),
        workspace=FakeCAI((experts * workspace_ints(n_e, max_par),), "<i4"),
    )


@pytest.fixture
def on_device_zero(monkeypatch, no_native):
    monkeypatch.setattr(dense, "device_of", lambda obj, array: 0)


def make_weight(k=K, n=N, experts=1, group_size=128, max_par=DEFAULT_MAX_PAR, **overrides):
    buffers = {**weight_buffers(k, n, experts, max_par, group_size), **overrides}
    return ferrum_ffi.MarlinWeight(**buffers, k=k, n=n, group_size=group_size, num_experts=experts, max_par=max_par)


def test_weight_from_fake_buffers(on_device_zero):
    w = make_weight()
    assert (w.k, w.n, w.expert_n, w.groups, w._device) == (K, N, N, 2, 0)
    stacked = make_weight(n=2 * N, experts=2)
    assert (stacked.n, stacked.expert_n) == (2 * N, N)
    make_weight(group_size=-1)


@pytest.mark.parametrize(
    "name, shape, typestr, needs",
    [
        ("qweight", (K // 16, 2 * N - 4), "<i4", K * N // 2),
        ("scales", (1, N), "<f2", 2 * N * 2),
        ("workspace", (15,), "<i4", 16 * 4),
    ],
)
def test_weight_rejects_undersized_buffers(on_device_zero, name, shape, typestr, needs):
    with pytest.raises(ArgumentError, match=rf"MarlinWeight: {name} holds \d+ bytes, needs {needs}"):
        make_weight(**{name: FakeCAI(shape, typestr)})


def test_weight_rejects_undersized_stacked_buffers(on_device_zero):
    one_expert = weight_buffers(n=N)
    with pytest.raises(ArgumentError, match=r"qweight holds"):
        make_weight(n=2 * N, experts=2, qweight=one_expert["qweight"])


@pytest.mark.parametrize(
    "name, typestr, dtype",
    [("qweight", "<f2", "int32"), ("qweight", "<u4", "int32"), ("scales", "<f4", "float16"), ("workspace", "<i8", "int32")],
)
def test_weight_rejects_wrong_dtypes(on_device_zero, name, typestr, dtype):
    good = weight_buffers()[name].__cuda_array_interface__
    with pytest.raises(ArgumentTypeError, match=rf"MarlinWeight: {name} must have dtype {dtype}"):
        make_weight(**{name: FakeCAI(good["shape"], typestr)})


@pytest.mark.parametrize("n, experts", [(N, 3), (5 * 64, 3), (N, 0), (N, -1)])
def test_weight_rejects_n_not_divisible_by_num_experts(on_device_zero, n, experts):
    buffers = weight_buffers(n=N)
    with pytest.raises(ArgumentError, match=rf"n={n} must split into num_experts={experts}"):
        ferrum_ffi.MarlinWeight(**buffers, k=K, n=n, num_experts=experts)


def test_weight_rejects_bad_shapes_and_alignment(on_device_zero):
    with pytest.raises(ArgumentError, match=r"MarlinWeight: k=192"):
        make_weight(k=192)
    with pytest.raises(ArgumentError, match=r"MarlinWeight: n=96"):
        ferrum_ffi.MarlinWeight(**weight_buffers(), k=K, n=96)
    with pytest.raises(ArgumentError, match=r"MarlinWeight: group_size=64"):
        make_weight(group_size=64)
    with pytest.raises(ArgumentError, match=r"MarlinWeight: qweight pointer 0x\w+ must be 16-byte aligned"):
        make_weight(qweight=FakeCAI((K // 16, 2 * N), "<i4", ptr=0x7000008))
    with pytest.raises(ArgumentTypeError, match=r"MarlinWeight: k must be an integer"):
        ferrum_ffi.MarlinWeight(**weight_buffers(), k=float(K), n=N)


def test_weight_rejects_host_arrays(on_device_zero):
    with pytest.raises(ArgumentTypeError, match=r"qweight: expected a CUDA array"):
        make_weight(qweight=np.zeros((K // 16, 2 * N), np.int32))


@pytest.fixture
def weight(on_device_zero):
    return make_weight()


@pytest.fixture
def stacked(on_device_zero):
    return make_weight(n=4 * N, experts=4)


def test_marlin_gemm_valid_call_reaches_the_library(weight):
    a, out = FakeCAI((4, K)), FakeCAI((4, N))
    with pytest.raises(AssertionError, match="native library was reached"):
        ferrum_ffi.marlin_gemm(a, weight, out=out)


def test_marlin_gemm_with_no_rows_never_reaches_the_library(weight):
    out = FakeCAI((0, N), ptr=0)
    assert ferrum_ffi.marlin_gemm(FakeCAI((0, K), ptr=0), weight, out=out) is out


def test_marlin_gemm_rejects_wrong_k(weight):
    with pytest.raises(ArgumentError, match=rf"marlin_gemm: a has {2 * K} columns, the weight has k={K}"):
        ferrum_ffi.marlin_gemm(FakeCAI((4, 2 * K)), weight, out=FakeCAI((4, N)))


def test_marlin_gemm_rejects_float32_activations(weight):
    with pytest.raises(ArgumentTypeError, match=r"marlin_gemm: a must have dtype float16, got float32"):
        ferrum_ffi.marlin_gemm(FakeCAI((4, K), "<f4"), weight, out=FakeCAI((4, N)))


def test_marlin_gemm_rejects_1d_activations(weight):
    with pytest.raises(ArgumentError, match=r"marlin_gemm: a must be 2-D"):
        ferrum_ffi.marlin_gemm(FakeCAI((K,)), weight, out=FakeCAI((1, N)))


def test_marlin_gemm_rejects_non_contiguous_activations(weight):
    transposed = FakeCAI((4, K), strides=(2, 8))
    with pytest.raises(ArgumentError, match=r"marlin_gemm: a must be C-contiguous"):
        ferrum_ffi.marlin_gemm(transposed, weight, out=FakeCAI((4, N)))


@pytest.mark.parametrize("shape", [(4, 2 * N), (5, N), (4 * N,)])
def test_marlin_gemm_rejects_out_of_wrong_shape(weight, shape):
    with pytest.raises(ArgumentError, match=r"marlin_gemm: out must"):
        ferrum_ffi.marlin_gemm(FakeCAI((4, K)), weight, out=FakeCAI(shape))


def test_marlin_gemm_rejects_out_of_wrong_dtype(weight):
    with pytest.raises(ArgumentTypeError, match=r"marlin_gemm: out must have dtype float16"):
        ferrum_ffi.marlin_gemm(FakeCAI((4, K)), weight, out=FakeCAI((4, N), "<f4"))


def test_marlin_gemm_rejects_read_only_out(weight):
    with pytest.raises(ArgumentError, match=r"marlin_gemm: out is read-only"):
        ferrum_ffi.marlin_gemm(FakeCAI((4, K)), weight, out=FakeCAI((4, N), readonly=True))


def test_marlin_gemm_rejects_a_stacked_weight(stacked):
    with pytest.raises(ArgumentError, match=r"marlin_gemm: weight stacks 4 experts; use marlin_gemm_with_offset"):
        ferrum_ffi.marlin_gemm(FakeCAI((4, K)), stacked, out=FakeCAI((4, 4 * N)))


@pytest.mark.parametrize("kwargs, match", [({"thread_k": 64, "thread_n": 64}, "thread_k"), ({"sms": 0}, "sms=0")])
def test_marlin_gemm_rejects_bad_launch_options(weight, kwargs, match):
    with pytest.raises(ArgumentError, match=match):
        ferrum_ffi.marlin_gemm(FakeCAI((4, K)), weight, out=FakeCAI((4, N)), **kwargs)


def test_marlin_gemm_remembers_only_shapes_that_passed(on_device_zero, monkeypatch):
    from .mm_fakes import FakeLibrary

    class Recording(FakeLibrary):
        def marlin_cuda(self, *args):
            self.launches.append(args)
            return 0

    lib = Recording()
    monkeypatch.setattr(dense, "library", lambda: lib)
    weight = make_weight()
    for _ in range(2):
        ferrum_ffi.marlin_gemm(FakeCAI((4, K)), weight, out=FakeCAI((4, N)), sms=1)
    assert weight._checked == {(4, N, -1, -1, 1)} and len(lib.launches) == 2
    for sms, exc in ((True, ArgumentTypeError), (1.0, ArgumentTypeError), (0, ArgumentError)):
        with pytest.raises(exc, match=r"marlin_gemm: sms"):
            ferrum_ffi.marlin_gemm(FakeCAI((4, K)), weight, out=FakeCAI((4, N)), sms=sms)
    with pytest.raises(ArgumentError, match=r"marlin_gemm: \(thread_k, thread_n\)=\(64, 64\)"):
        ferrum_ffi.marlin_gemm(FakeCAI((4, K)), weight, out=FakeCAI((4, N)), thread_k=64, thread_n=64)
    with pytest.raises(ArgumentError, match=r"marlin_gemm: a pointer 0x[0-9a-f]+ must be 16-byte aligned"):
        ferrum_ffi.marlin_gemm(FakeCAI((4, K), ptr=0x10008), weight, out=FakeCAI((4, N)), sms=1)
    ferrum_ffi.marlin_gemm(FakeCAI((4, K)), weight, out=FakeCAI((4, N)), sms=np.int64(1))  # checked, not kept
    assert weight._checked == {(4, N, -1, -1, 1)} and len(lib.launches) == 3
    assert [args[13] for args in lib.launches] == [1, 1, 1]  # the sms argument of marlin_cuda


def test_marlin_gemm_rejects_activations_on_another_device(monkeypatch, weight):
    monkeypatch.setattr(dense, "device_of", lambda obj, array: 1)
    with pytest.raises(ArgumentError, match=r"marlin_gemm: a is on device 1, the weight on device 0"):
        ferrum_ffi.marlin_gemm(FakeCAI((4, K)), weight, out=FakeCAI((4, N)))


# ---- offset variants --------------------------------------------------------------


def test_with_offset_valid_slice_reaches_the_library(stacked):
    with pytest.raises(AssertionError, match="native library was reached"):
        ferrum_ffi.marlin_gemm_with_offset(FakeCAI((4, K)), stacked, 3 * N, N, out=FakeCAI((4, N)))


@pytest.mark.parametrize(
    "offset, expert_n, match",
    [
        (4 * N, N, r"exceeds the stacked n=512"),
        (4 * N, 2 * N, r"expert_n=256 must equal the weight's expert width 128"),
        (64, N, r"expert_offset=64 must be a multiple of expert_n=128"),
        (-N, N, r"expert_offset=-128 must be >= 0"),
        (0, 96, r"expert_n=96 must be divisible by 64"),
    ],
)
def test_with_offset_rejects_out_of_range_slices(stacked, offset, expert_n, match):
    with pytest.raises(ArgumentError, match=rf"marlin_gemm_with_offset: .*{match}"):
        ferrum_ffi.marlin_gemm_with_offset(FakeCAI((4, K)), stacked, offset, expert_n, out=FakeCAI((4, expert_n)))


def test_with_offset_rejects_a_slice_past_the_buffers(on_device_zero):
    # n says 4 experts, but the buffers hold only 2: the spans catch it.
    short = weight_buffers(n=2 * N, experts=2)
    weight = ferrum_ffi.MarlinWeight(**weight_buffers(n=4 * N, experts=4), k=K, n=4 * N, num_experts=4)
    weight._views = tuple(dense.as_device_array(short[b], b) for b in ("qweight", "scales", "workspace"))
    with pytest.raises(ArgumentError, match=r"qweight holds \d+ bytes"):
        ferrum_ffi.marlin_gemm_with_offset(FakeCAI((4, K)), weight, 3 * N, N, out=FakeCAI((4, N)))


def test_with_offset_checks_a_and_out(stacked):
    with pytest.raises(ArgumentError, match=r"a has 128 columns"):
        ferrum_ffi.marlin_gemm_with_offset(FakeCAI((4, 128)), stacked, 0, N, out=FakeCAI((4, N)))
    with pytest.raises(ArgumentError, match=r"out must have shape \(4, 128\)"):
        ferrum_ffi.marlin_gemm_with_offset(FakeCAI((4, K)), stacked, 0, N, out=FakeCAI((4, 4 * N)))
    with pytest.raises(ArgumentError, match=r"out is read-only"):
        ferrum_ffi.marlin_gemm_with_offset(FakeCAI((4, K)), stacked, 0, N, out=FakeCAI((4, N), readonly=True))


def test_with_offset_rejects_expert_n_other_than_the_weights(stacked):
    with pytest.raises(ArgumentError, match=r"expert_n"):
        ferrum_ffi.marlin_gemm_with_offset(FakeCAI((4, K)), stacked, 0, 64, out=FakeCAI((4, 64)))


def strided(weight, a_rows=8, in_row=0, out_rows=8, out_row=0, m=4, offset=0, expert_n=N, **out_kw):
    return ferrum_ffi.marlin_gemm_with_offset_strided(
        FakeCAI((a_rows, K)), in_row, weight, FakeCAI((out_rows, expert_n), **out_kw), out_row, m, offset, expert_n
    )


def test_strided_valid_call_reaches_the_library(stacked):
    with pytest.raises(AssertionError, match="native library was reached"):
        strided(stacked, in_row=4, out_row=4, m=4, offset=2 * N)


@pytest.mark.parametrize("in_row, m", [(5, 4), (0, 9), (8, 1)])
def test_strided_rejects_rows_past_the_end_of_a(stacked, in_row, m):
    with pytest.raises(ArgumentError, match=rf"marlin_gemm_with_offset_strided: rows \[{in_row}, {in_row + m}\) exceed a's 8 rows"):
        strided(stacked, in_row=in_row, m=m, out_rows=16)


@pytest.mark.parametrize("out_row, m", [(5, 4), (0, 9), (8, 1)])
def test_strided_rejects_rows_past_the_end_of_out(stacked, out_row, m):
    with pytest.raises(ArgumentError, match=rf"out holds {8 * N} values, rows \[{out_row}, {out_row + m}\)"):
        strided(stacked, a_rows=16, out_row=out_row, m=m)


@pytest.mark.parametrize("name, kwargs", [("in_row_offset", {"in_row": -1}), ("out_row_offset", {"out_row": -1}), ("m", {"m": -1})])
def test_strided_rejects_negative_rows(stacked, name, kwargs):
    with pytest.raises(ArgumentError, match=rf"{name}=-1 must be >= 0"):
        strided(stacked, **kwargs)


def test_strided_rejects_out_of_range_slices_and_read_only_out(stacked):
    with pytest.raises(ArgumentError, match=r"exceeds the stacked n"):
        strided(stacked, offset=4 * N)
    with pytest.raises(ArgumentError, match=r"out is read-only"):
        strided(stacked, readonly=True)
    with pytest.raises(ArgumentTypeError, match=r"out must have dtype float16"):
        strided(stacked, typestr="<f4")


def test_strided_with_no_rows_never_reaches_the_library(stacked):
    out = FakeCAI((8, N))
    assert ferrum_ffi.marlin_gemm_with_offset_strided(FakeCAI((8, K)), 8, stacked, out, 8, 0, 0, N) is out
