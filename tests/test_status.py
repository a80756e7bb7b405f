"""StagedNativeStatus decoding and the exception hierarchy (CPU only, no library)."""

from __future__ import annotations

import pytest

import ferrum_ffi
from ferrum_ffi.status import (
    STAGES,
    ArgumentError,
    ArgumentTypeError,
    FerrumError,
    LibraryError,
    NativeError,
    ProfileSinkError,
    StagedNativeStatus,
    cuda_error_name,
)

# ---- the seeds' cases (marlin_moe_ffi_status_preserves_failure_stage_and_cuda_status)


@pytest.mark.parametrize(
    "code, stage, stage_name, cuda_status",
    [
        ((1 << 16) | 10, 1, "sm-count", 10),
        ((5 << 16) | 9, 5, "function-attribute", 9),
        ((6 << 16) | 701, 6, "kernel-launch", 701),
        (17, 0, "unknown", 17),
    ],
)
def test_decode_matches_the_seed_cases(code, stage, stage_name, cuda_status):
    status = StagedNativeStatus.decode(code)
    assert status is not None
    assert status.code == code
    assert (status.stage, status.stage_name, status.cuda_status) == (stage, stage_name, cuda_status)


def test_decode_success_is_none():
    assert StagedNativeStatus.decode(0) is None


EXPECTED_STAGE_NAMES = {
    1: "sm-count",
    2: "max-shared-memory",
    3: "act-order-launch",
    4: "blocks-per-sm",
    5: "function-attribute",
    6: "kernel-launch",
    7: "argument",
    8: "shape",
    9: "device",
}


def test_stage_table_is_exactly_stages_1_to_9():
    assert dict(STAGES) == EXPECTED_STAGE_NAMES


@pytest.mark.parametrize("stage", sorted(EXPECTED_STAGE_NAMES))
def test_every_stage_decodes_to_its_name(stage):
    status = StagedNativeStatus.decode((stage << 16) | 1)
    assert status.stage == stage
    assert status.stage_name == EXPECTED_STAGE_NAMES[stage]
    assert status.cuda_status == 1
    assert status.cuda_status_name == "cudaErrorInvalidValue"


def test_stage_with_zero_cuda_status_is_still_a_failure():
    status = StagedNativeStatus.decode(8 << 16)
    assert status is not None
    assert (status.stage, status.stage_name, status.cuda_status) == (8, "shape", 0)


@pytest.mark.parametrize("stage", [0, 10, 11, 17, 0x7FFF, 0xFFFF])
def test_unknown_stages_decode_as_unknown(stage):
    code = (stage << 16) | 3
    if code >= 1 << 31:  # as the native int32 return value would read
        code -= 1 << 32
    status = StagedNativeStatus.decode(code)
    assert status.stage == stage
    assert status.stage_name == "unknown"
    assert status.cuda_status == 3


def test_cuda_status_keeps_only_the_low_16_bits():
    status = StagedNativeStatus.decode((6 << 16) | 0xFFFF)
    assert (status.stage, status.cuda_status) == (6, 0xFFFF)


@pytest.mark.parametrize("code", [-1, -(1 << 31), -17, (1 << 31) - 1, 1 << 40, (1 << 32) | (6 << 16) | 700])
def test_negative_and_large_codes_decode_without_error(code):
    status = StagedNativeStatus.decode(code)
    assert status is not None
    assert status.code == code
    assert 0 <= status.stage <= 0xFFFF
    assert 0 <= status.cuda_status <= 0xFFFF
    assert status.stage_name == STAGES.get(status.stage, "unknown")
    assert str(status)  # always printable


def test_minus_one_is_all_ones():
    status = StagedNativeStatus.decode(-1)
    assert (status.stage, status.stage_name, status.cuda_status) == (0xFFFF, "unknown", 0xFFFF)


def test_negative_int32_with_known_low_stage_bits():
    # int32 view of a status whose top bit is set: only the low 32 bits count.
    code = ((6 << 16) | 701) - (1 << 32)
    status = StagedNativeStatus.decode(code)
    assert (status.stage, status.stage_name, status.cuda_status) == (6, "kernel-launch", 701)


def test_decode_accepts_integer_like_values():
    import numpy as np

    status = StagedNativeStatus.decode(np.int32((7 << 16) | 1))
    assert (status.stage, status.stage_name) == (7, "argument")
    assert isinstance(status.code, int)


def test_str_names_stage_and_cuda_status():
    text = str(StagedNativeStatus.decode((6 << 16) | 701))
    assert "stage 6" in text
    assert "kernel-launch" in text
    assert "701" in text
    assert "cudaErrorLaunchOutOfResources" in text


def test_cuda_error_names():
    assert cuda_error_name(0) == "cudaSuccess"
    assert cuda_error_name(35) == "cudaErrorInsufficientDriver"
    assert cuda_error_name(100) == "cudaErrorNoDevice"
    assert cuda_error_name(701) == "cudaErrorLaunchOutOfResources"
    assert cuda_error_name(12345) == "cudaError12345"
    assert StagedNativeStatus.decode((1 << 16) | 100).cuda_status_name == "cudaErrorNoDevice"


def test_status_is_frozen_and_comparable():
    a = StagedNativeStatus.decode((1 << 16) | 10)
    b = StagedNativeStatus.decode((1 << 16) | 10)
    assert a == b
    with pytest.raises(Exception):
        a.stage = 2  # type: ignore[misc]


# ---- NativeError ---------------------------------------------------------------


def test_native_error_carries_everything():
    status = StagedNativeStatus.decode((6 << 16) | 701)
    shape = {"m": 16, "n": 4096, "k": 4096, "group_size": 128}
    err = NativeError("marlin_cuda", status, shape, "marlin_cuda: launch: too many resources")
    assert err.entry_point == "marlin_cuda"
    assert err.status is status
    assert err.stage == 6
    assert err.stage_name == "kernel-launch"
    assert err.cuda_status == 701
    assert err.cuda_status_name == "cudaErrorLaunchOutOfResources"
    assert err.shape == shape
    assert err.shape is not shape  # copied
    assert err.detail == "marlin_cuda: launch: too many resources"
    message = str(err)
    for piece in (
        "marlin_cuda",
        "stage 6",
        "kernel-launch",
        "701",
        "cudaErrorLaunchOutOfResources",
        "m=16",
        "n=4096",
        "k=4096",
        "group_size=128",
        "too many resources",
    ):
        assert piece in message, (piece, message)


def test_native_error_without_shape_or_detail():
    err = NativeError("ferrum_marlin_device_count", StagedNativeStatus.decode((9 << 16) | 100))
    assert err.shape == {}
    assert err.detail == ""
    message = str(err)
    assert message.startswith("ferrum_marlin_device_count failed at stage 9 (device)")
    assert "[" not in message
    assert not message.endswith(":")


def test_native_error_can_be_raised_and_caught_as_runtime_error():
    status = StagedNativeStatus.decode((1 << 16) | 35)
    with pytest.raises(RuntimeError, match="sm-count"):
        raise NativeError("marlin_cuda", status, {"m": 1}, "no driver")


# ---- hierarchy -------------------------------------------------------------------


@pytest.mark.parametrize(
    "cls, builtin",
    [
        (ArgumentError, ValueError),
        (ArgumentTypeError, TypeError),
        (LibraryError, RuntimeError),
        (NativeError, RuntimeError),
        (ProfileSinkError, OSError),
    ],
)
def test_exceptions_subclass_the_documented_builtins(cls, builtin):
    assert issubclass(cls, FerrumError)
    assert issubclass(cls, builtin)
    assert issubclass(FerrumError, Exception)


def test_argument_errors_are_not_runtime_errors():
    assert not issubclass(ArgumentError, RuntimeError)
    assert not issubclass(ArgumentTypeError, ValueError)
    assert not issubclass(LibraryError, ValueError)


def test_package_reexports_the_same_objects():
    assert ferrum_ffi.StagedNativeStatus is StagedNativeStatus
    assert ferrum_ffi.NativeError is NativeError
    assert ferrum_ffi.ArgumentError is ArgumentError
    assert ferrum_ffi.ArgumentTypeError is ArgumentTypeError
    assert ferrum_ffi.LibraryError is LibraryError
    assert ferrum_ffi.FerrumError is FerrumError
    assert ferrum_ffi.ProfileSinkError is ProfileSinkError
