"""Every launch rule, written once, pure and CPU-testable.

The raw-pointer API and the array API both call these before crossing the FFI
boundary; each failure raises :class:`~ferrum_ffi.status.ArgumentError` (or
:class:`~ferrum_ffi.status.ArgumentTypeError`) with a message that names the
argument and the rule. The native side checks the same rules again.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ._interop import DeviceArray
from .status import ArgumentError, ArgumentTypeError

I32_MAX = 2**31 - 1
W4A16_GROUP_SIZES = (-1, 128)
# (thread_k, thread_n) pairs the W4A16 kernel is built for; (-1, -1) is automatic.
W4A16_TILES = ((-1, -1), (128, 128), (128, 256), (64, 256), (128, 64))
# The deep (128, 256) tile is built for activation slabs of at most 16 rows.
W4A16_DEEP_TILE_MAX_M = 16
DEFAULT_MAX_PAR = 16


def fail(message: str) -> None:
    raise ArgumentError(message)


def check_int(entry: str, name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ArgumentTypeError(f"{entry}: {name} must be an integer, got {type(value).__name__}")
    value = int(value)
    if not -(2**31) <= value <= I32_MAX:
        fail(f"{entry}: {name}={value} does not fit in int32")
    return value


def check_positive(entry: str, name: str, value: int) -> None:
    if value <= 0:
        fail(f"{entry}: {name}={value} must be > 0")


def check_non_negative(entry: str, name: str, value: int) -> None:
    if value < 0:
        fail(f"{entry}: {name}={value} must be >= 0")


def check_multiple(entry: str, name: str, value: int, divisor: int) -> None:
    if value % divisor != 0:
        fail(f"{entry}: {name}={value} must be divisible by {divisor}")


def check_pointer(entry: str, name: str, ptr: int, alignment: int) -> None:
    if not ptr:
        fail(f"{entry}: {name} pointer must not be null")
    if ptr % alignment != 0:
        fail(f"{entry}: {name} pointer {ptr:#x} must be {alignment}-byte aligned")


def checked_product(entry: str, name: str, *factors: int) -> int:
    """A buffer span in bytes, refusing products that overflow 63 bits."""
    result = 1
    for factor in factors:
        result *= int(factor)
        if result > 2**63 - 1:
            fail(f"{entry}: {name} size overflows")
    return result


def check_span(entry: str, name: str, available: int, required: int) -> None:
    if available < required:
        fail(f"{entry}: {name} holds {available} bytes, needs {required}")


# ---- arrays ----------------------------------------------------------------------


def check_array(
    entry: str,
    name: str,
    array: DeviceArray,
    dtype: np.dtype | type,
    ndim: int | None = None,
    alignment: int = 16,
) -> None:
    """dtype, rank, C-contiguity and alignment of a device array."""
    if array.dtype != np.dtype(dtype):
        raise ArgumentTypeError(f"{entry}: {name} must have dtype {np.dtype(dtype).name}, got {array.dtype}")
    if ndim is not None and len(array.shape) != ndim:
        fail(f"{entry}: {name} must be {ndim}-D, got shape {array.shape}")
    if not array.is_c_contiguous:
        fail(f"{entry}: {name} must be C-contiguous (strides {array.strides})")
    if array.size and array.ptr % alignment != 0:
        fail(f"{entry}: {name} pointer {array.ptr:#x} must be {alignment}-byte aligned")


def check_shape(entry: str, name: str, array: DeviceArray, shape: tuple[int, ...]) -> None:
    if tuple(array.shape) != tuple(shape):
        fail(f"{entry}: {name} must have shape {tuple(shape)}, got {tuple(array.shape)}")


# ---- W4A16 -----------------------------------------------------------------------


@dataclass(frozen=True)
class W4A16Problem:
    """The shape part of a ``marlin_cuda`` call."""

    m: int
    n: int
    k: int
    group_size: int
    n_full: int = -1
    thread_k: int = -1
    thread_n: int = -1
    sms: int = -1
    max_par: int = DEFAULT_MAX_PAR

    @property
    def stride_n(self) -> int:
        return self.n if self.n_full == -1 else self.n_full

    @property
    def groups(self) -> int:
        return 1 if self.group_size == -1 else self.k // self.group_size


def workspace_ints(n: int, max_par: int = DEFAULT_MAX_PAR) -> int:
    """Minimum lock count of a W4A16 workspace: max(1, n/128) * max_par."""
    return max(1, n // 128) * max_par


def validate_w4a16(problem: W4A16Problem, entry: str = "marlin_cuda") -> None:
    """The shape rules of ``marlin_cuda`` (mirrors native/src/dense/marlin_cuda.cpp)."""
    p = problem
    for name in ("m", "n", "k", "group_size", "n_full", "thread_k", "thread_n", "sms", "max_par"):
        check_int(entry, name, getattr(p, name))
    check_non_negative(entry, "m", p.m)
    check_positive(entry, "n", p.n)
    check_positive(entry, "k", p.k)
    check_multiple(entry, "n", p.n, 64)
    check_multiple(entry, "k", p.k, 128)
    if p.group_size not in W4A16_GROUP_SIZES:
        fail(f"{entry}: group_size={p.group_size} must be -1 (channelwise) or 128")
    if p.n_full != -1 and (p.n_full < p.n or p.n_full % 64 != 0):
        fail(f"{entry}: n_full={p.n_full} must be -1 or a multiple of 64 that is >= n={p.n}")
    if (p.thread_k, p.thread_n) not in W4A16_TILES:
        fail(
            f"{entry}: (thread_k, thread_n)=({p.thread_k}, {p.thread_n}) must be one of "
            f"{', '.join(str(t) for t in W4A16_TILES)}"
        )
    if p.thread_n != -1:
        check_multiple(entry, "n", p.n, p.thread_n)
        check_multiple(entry, "k", p.k, p.thread_k)
    if (p.thread_k, p.thread_n) == (128, 256) and p.m > W4A16_DEEP_TILE_MAX_M:
        fail(f"{entry}: tile (thread_k=128, thread_n=256) serves m <= {W4A16_DEEP_TILE_MAX_M}, got m={p.m}")
    if p.sms != -1 and p.sms < 1:
        fail(f"{entry}: sms={p.sms} must be -1 (all) or >= 1")
    if p.max_par < 1:
        fail(f"{entry}: max_par={p.max_par} must be >= 1")
    # One lock per column tile; the narrowest tile the call can use decides.
    narrowest = p.thread_n if p.thread_n != -1 else (128 if p.n % 128 == 0 else 64)
    if workspace_ints(p.n, p.max_par) < p.n // narrowest:
        fail(
            f"{entry}: max_par={p.max_par} gives max(1, n/128)*max_par={workspace_ints(p.n, p.max_par)} "
            f"locks, fewer than the {p.n // narrowest} column tiles of width {narrowest}; raise max_par"
        )
    checked_product(entry, "C", p.m, p.n, 2)
    checked_product(entry, "A", p.m, p.k, 2)


def w4a16_spans(problem: W4A16Problem) -> dict[str, int]:
    """Bytes each buffer must hold from its pointer on."""
    p = problem
    entry = "marlin_cuda"
    packed_rows = p.k // 16
    return {
        "A": checked_product(entry, "A", p.m, p.k, 2),
        # A column slice reads n columns of every packed row of the full width.
        "B": checked_product(entry, "B", packed_rows - 1, 2 * p.stride_n, 4) + 2 * p.n * 4,
        "C": checked_product(entry, "C", p.m, p.n, 2),
        "s": checked_product(entry, "s", p.groups - 1, p.stride_n, 2) + p.n * 2,
        "workspace": workspace_ints(p.n, p.max_par) * 4,
    }


def validate_w4a16_pointers(a: int, b: int, c: int, s: int, workspace: int, entry: str = "marlin_cuda") -> None:
    check_pointer(entry, "A", a, 16)
    check_pointer(entry, "B", b, 16)
    check_pointer(entry, "C", c, 16)
    check_pointer(entry, "s", s, 16)
    check_pointer(entry, "workspace", workspace, 4)


def validate_expert_slice(
    entry: str, expert_offset: int, expert_n: int, total_n: int, weight_expert_n: int | None = None
) -> int:
    """Column-slice rules of the offset variants; returns the expert index.

    In the per-expert contiguous layout every expert block has the weight's
    own expert width; another ``expert_n`` would address the wrong block with
    the wrong row stride.
    """
    check_int(entry, "expert_offset", expert_offset)
    check_int(entry, "expert_n", expert_n)
    check_positive(entry, "expert_n", expert_n)
    check_multiple(entry, "expert_n", expert_n, 64)
    if weight_expert_n is not None and expert_n != weight_expert_n:
        fail(f"{entry}: expert_n={expert_n} must equal the weight's expert width {weight_expert_n}")
    check_non_negative(entry, "expert_offset", expert_offset)
    if expert_offset % expert_n != 0:
        fail(f"{entry}: expert_offset={expert_offset} must be a multiple of expert_n={expert_n} "
             "(per-expert contiguous layout)")
    if expert_offset + expert_n > total_n:
        fail(f"{entry}: expert_offset={expert_offset} + expert_n={expert_n} exceeds the stacked n={total_n}")
    return expert_offset // expert_n
