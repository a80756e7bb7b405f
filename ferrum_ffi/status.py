"""Staged native statuses and the exceptions of ferrum_ffi.

Every native entry point returns ``0`` or ``(stage << 16) | (cuda_status & 0xFFFF)``.
This module is the one place that knows the stage table (it mirrors the
``FERRUM_STAGE_*`` defines of ``native/include/ferrum_marlin.h``) and turns a
status into an exception that says where the call failed and why.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

# Stages 1..6 keep the original engine's numbers so its callers decode them
# unchanged; 7..9 are rejections the native side makes before touching the GPU.
STAGES: Mapping[int, str] = {
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

# The CUDA runtime statuses a caller is likely to meet, so that a status can be
# named without the native library; a loaded library names every status.
_CUDA_ERROR_NAMES: Mapping[int, str] = {
    0: "cudaSuccess",
    1: "cudaErrorInvalidValue",
    2: "cudaErrorMemoryAllocation",
    3: "cudaErrorInitializationError",
    9: "cudaErrorInvalidConfiguration",
    12: "cudaErrorInvalidPitchValue",
    35: "cudaErrorInsufficientDriver",
    98: "cudaErrorInvalidDeviceFunction",
    100: "cudaErrorNoDevice",
    101: "cudaErrorInvalidDevice",
    209: "cudaErrorNoKernelImageForDevice",
    400: "cudaErrorInvalidResourceHandle",
    700: "cudaErrorIllegalAddress",
    701: "cudaErrorLaunchOutOfResources",
    702: "cudaErrorLaunchTimeout",
    715: "cudaErrorIllegalInstruction",
    719: "cudaErrorLaunchFailure",
    801: "cudaErrorNotSupported",
    900: "cudaErrorStreamCaptureUnsupported",
}


def cuda_error_name(code: int) -> str:
    """Name of a CUDA runtime status, or ``cudaError<code>`` when unknown here."""
    return _CUDA_ERROR_NAMES.get(code, f"cudaError{code}")


@dataclass(frozen=True)
class StagedNativeStatus:
    """A decoded failure status: which stage failed and with which CUDA status."""

    code: int
    stage: int
    stage_name: str
    cuda_status: int
    cuda_status_name: str

    @classmethod
    def decode(cls, code: int) -> "StagedNativeStatus | None":
        """Decode a native return value; ``None`` for success (0).

        A status without a stage (``code < 1 << 16``) is reported as stage 0,
        ``unknown``, with the whole value as the CUDA status.
        """
        code = int(code)
        if code == 0:
            return None
        unsigned = code & 0xFFFFFFFF
        stage = unsigned >> 16
        cuda_status = unsigned & 0xFFFF
        return cls(
            code=code,
            stage=stage,
            stage_name=STAGES.get(stage, "unknown"),
            cuda_status=cuda_status,
            cuda_status_name=cuda_error_name(cuda_status),
        )

    def __str__(self) -> str:
        return (
            f"stage {self.stage} ({self.stage_name}), CUDA status {self.cuda_status} "
            f"({self.cuda_status_name})"
        )


class FerrumError(Exception):
    """Base class of every error ferrum_ffi raises on purpose."""


class ArgumentError(FerrumError, ValueError):
    """An argument broke a rule; raised before any native call."""


class ArgumentTypeError(FerrumError, TypeError):
    """An argument has the wrong type or dtype; raised before any native call."""


class LibraryError(FerrumError, RuntimeError):
    """The native library is missing, unloadable, or of another ABI version."""


class ProfileSinkError(FerrumError, OSError):
    """The native MoE profile sink could not be switched on (e.g. its file cannot
    be opened); the message carries the library's reason."""


class NativeError(FerrumError, RuntimeError):
    """A native entry point returned a failure status."""

    def __init__(
        self,
        entry_point: str,
        status: StagedNativeStatus,
        shape: Mapping[str, Any] | None = None,
        detail: str = "",
    ) -> None:
        self.entry_point = entry_point
        self.status = status
        self.stage = status.stage
        self.stage_name = status.stage_name
        self.cuda_status = status.cuda_status
        self.cuda_status_name = status.cuda_status_name
        self.shape = dict(shape or {})
        self.detail = detail
        problem = ", ".join(f"{k}={v}" for k, v in self.shape.items())
        message = f"{entry_point} failed at {status}"
        if problem:
            message += f" [{problem}]"
        if detail:
            message += f": {detail}"
        super().__init__(message)
