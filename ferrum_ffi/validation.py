"""Every launch rule, written once, pure and CPU-testable.

The raw-pointer API and the array API both call these before crossing the FFI
boundary; each failure raises :class:`~ferrum_ffi.status.ArgumentError` (or
:class:`~ferrum_ffi.status.ArgumentTypeError`) with a message that names the
argument and the rule. The native side checks the same rules again.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import numpy as np

from ._abi import (
    FERRUM_DTYPE_BF16,
    FERRUM_DTYPE_F16,
    FERRUM_MAX_DIM,
    FERRUM_MM_C_TMP_FLOATS_PER_SM,
    FERRUM_MM_FLAG_ACT_ORDER,
    FERRUM_MM_FLAG_ATOMIC_ADD,
    FERRUM_MM_FLAG_FP32_REDUCE,
    FERRUM_MM_FLAG_HAS_ZERO_POINTS,
    FERRUM_MM_FLAG_K_FULL,
    FERRUM_MM_WORKSPACE_INTS_PER_SM,
    FERRUM_WEIGHT_FE4M3FN,
    FERRUM_WEIGHT_U4,
    FERRUM_WEIGHT_U4B8,
    FERRUM_WEIGHT_U8B128,
    INT_GROUP_SIZE_RULE,
    MM_FLAGS_KNOWN,
    int_group_size_served,
)
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


def check_dim(entry: str, name: str, value: int) -> None:
    """n, k and row strides: at most FERRUM_MAX_DIM (the kernels' strides are 32-bit products)."""
    if value > FERRUM_MAX_DIM:
        fail(f"{entry}: {name}={value} must be at most FERRUM_MAX_DIM={FERRUM_MAX_DIM}")


def check_sliced_dims(entry: str, n: int, k: int, n_full: int) -> None:
    """k and the weight's row width (n_full, or n when -1) of the W4A16-layout entries."""
    check_dim(entry, "k", k)
    check_dim(entry, "n_full" if n_full != -1 else "n", n if n_full == -1 else n_full)


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


def check_w4a16_shape(
    entry: str, m: int, n: int, k: int, group_size: int, n_full: int, thread_k: int, thread_n: int, sms: int
) -> None:
    """The shape, tile and sms rules of the W4A16 kernel, shared by ``marlin_cuda``
    and the bucketed ``marlin_cuda_moe`` (integers already checked)."""
    check_positive(entry, "n", n)
    check_positive(entry, "k", k)
    check_multiple(entry, "n", n, 64)
    check_multiple(entry, "k", k, 128)
    check_sliced_dims(entry, n, k, n_full)
    if group_size not in W4A16_GROUP_SIZES:
        fail(f"{entry}: group_size={group_size} must be -1 (channelwise) or 128")
    if n_full != -1 and (n_full < n or n_full % 64 != 0):
        fail(f"{entry}: n_full={n_full} must be -1 or a multiple of 64 that is >= n={n}")
    if (thread_k, thread_n) not in W4A16_TILES:
        fail(
            f"{entry}: (thread_k, thread_n)=({thread_k}, {thread_n}) must be one of "
            f"{', '.join(str(t) for t in W4A16_TILES)}"
        )
    if thread_n != -1:
        check_multiple(entry, "n", n, thread_n)
        check_multiple(entry, "k", k, thread_k)
    if (thread_k, thread_n) == (128, 256) and m > W4A16_DEEP_TILE_MAX_M:
        fail(f"{entry}: tile (thread_k=128, thread_n=256) serves m <= {W4A16_DEEP_TILE_MAX_M}, got m={m}")
    if sms != -1 and sms < 1:
        fail(f"{entry}: sms={sms} must be -1 (all) or >= 1")


def validate_w4a16(problem: W4A16Problem, entry: str = "marlin_cuda") -> None:
    """The shape rules of ``marlin_cuda`` (mirrors native/src/dense/marlin_cuda.cpp)."""
    p = problem
    for name in ("m", "n", "k", "group_size", "n_full", "thread_k", "thread_n", "sms", "max_par"):
        check_int(entry, name, getattr(p, name))
    check_non_negative(entry, "m", p.m)
    check_w4a16_shape(entry, p.m, p.n, p.k, p.group_size, p.n_full, p.thread_k, p.thread_n, p.sms)
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


# ---- general Marlin GEMM (ferrum_marlin_mm) ----------------------------------------

MM_ENTRY = "ferrum_marlin_mm"
MM_FP8_GROUP_SIZES = (-1, 128)
# (thread_k, thread_n) tile overrides; (-1, -1) is automatic.
MM_TILES = W4A16_TILES
MM_DEEP_TILE_MAX_M = W4A16_DEEP_TILE_MAX_M
U32_MAX = 2**32 - 1


@dataclass(frozen=True)
class MmProblem:
    """The problem, type and execution part of a ``ferrum_marlin_mm`` launch:
    the struct's scalar fields under their header names (``device`` and the
    stream travel with the call). :meth:`create` derives ``lda``,
    ``num_groups`` and ``flags`` from the usual choices."""

    m: int
    n: int
    k: int
    lda: int
    group_size: int
    num_groups: int
    a_type: int
    b_type: int
    flags: int
    sms: int = -1
    thread_k: int = -1
    thread_n: int = -1

    @classmethod
    def create(
        cls,
        m: int,
        n: int,
        k: int,
        a_type: int,
        b_type: int,
        group_size: int = -1,
        *,
        lda: int | None = None,
        act_order: bool = False,
        k_full: bool = True,
        num_groups: int | None = None,
        fp32_reduce: bool = False,
        sms: int = -1,
        thread_k: int = -1,
        thread_n: int = -1,
    ) -> "MmProblem":
        """A problem with ``lda = k`` (dense rows) unless given, ``num_groups``
        from ``group_size`` unless given (a K shard: the whole layer's), and
        the flags every valid launch of that kind carries: K_FULL unless
        ``k_full=False`` (a K shard of an act-order layer), HAS_ZERO_POINTS for
        U4, ACT_ORDER when asked, and FP32_REDUCE or else ATOMIC_ADD."""
        flags = FERRUM_MM_FLAG_K_FULL if k_full else 0
        if b_type == FERRUM_WEIGHT_U4:
            flags |= FERRUM_MM_FLAG_HAS_ZERO_POINTS
        if act_order:
            flags |= FERRUM_MM_FLAG_ACT_ORDER
        flags |= FERRUM_MM_FLAG_FP32_REDUCE if fp32_reduce else FERRUM_MM_FLAG_ATOMIC_ADD
        # Nonsense values pass through unchanged for validate_mm to name.
        if num_groups is None:
            grouped = isinstance(k, int) and isinstance(group_size, int) and group_size > 0
            num_groups = k // group_size if grouped else 1
        return cls(
            m=m, n=n, k=k, lda=k if lda is None else lda, group_size=group_size, num_groups=num_groups,
            a_type=a_type, b_type=b_type, flags=flags, sms=sms, thread_k=thread_k, thread_n=thread_n,
        )

    def has(self, flag: int) -> bool:
        return bool(self.flags & flag)

    @property
    def k_sharded(self) -> bool:
        """K_FULL clear: a K shard of an act-order layer (groups per row)."""
        return not self.has(FERRUM_MM_FLAG_K_FULL)

    @property
    def weight_bits(self) -> int:
        return 4 if self.b_type in (FERRUM_WEIGHT_U4, FERRUM_WEIGHT_U4B8) else 8

    @property
    def shape(self) -> dict[str, object]:
        """What a NativeError reports about the call."""
        return {
            "m": self.m, "n": self.n, "k": self.k, "group_size": self.group_size,
            "a_type": _A_TYPE_NAMES.get(self.a_type, self.a_type),
            "b_type": _B_TYPE_NAMES.get(self.b_type, self.b_type),
            "flags": f"{self.flags:#x}",
        }


_A_TYPE_NAMES = {FERRUM_DTYPE_F16: "F16", FERRUM_DTYPE_BF16: "BF16"}
_B_TYPE_NAMES = {
    FERRUM_WEIGHT_U4: "U4",
    FERRUM_WEIGHT_U4B8: "U4B8",
    FERRUM_WEIGHT_U8B128: "U8B128",
    FERRUM_WEIGHT_FE4M3FN: "FE4M3FN",
}
_FLAG_NAMES = {
    FERRUM_MM_FLAG_ACT_ORDER: "ACT_ORDER",
    FERRUM_MM_FLAG_K_FULL: "K_FULL",
    FERRUM_MM_FLAG_HAS_ZERO_POINTS: "HAS_ZERO_POINTS",
    FERRUM_MM_FLAG_ATOMIC_ADD: "ATOMIC_ADD",
    FERRUM_MM_FLAG_FP32_REDUCE: "FP32_REDUCE",
}


@dataclass(frozen=True)
class MmBuffers:
    """The device pointers of a launch (0 = NULL) and the capacities, in
    bytes, of the scratch buffers the struct declares."""

    a: int
    b: int
    c: int
    b_scales: int
    workspace: int
    workspace_bytes: int
    zero_points: int = 0
    g_idx: int = 0
    perm: int = 0
    a_tmp: int = 0
    a_tmp_bytes: int = 0
    c_tmp: int = 0
    c_tmp_bytes: int = 0
    bias: int = 0
    a_scales: int = 0


def mm_workspace_ints(sms: int) -> int:
    """Minimum lock count of a general-GEMM workspace for ``sms`` multiprocessors."""
    return FERRUM_MM_WORKSPACE_INTS_PER_SM * sms


def mm_c_tmp_floats(sms: int) -> int:
    """Minimum fp32 count of the FP32_REDUCE scratch for ``sms`` multiprocessors."""
    return FERRUM_MM_C_TMP_FLOATS_PER_SM * sms


def _check_flags(entry: str, p: MmProblem) -> None:
    unknown = p.flags & ~MM_FLAGS_KNOWN
    if unknown:
        fail(f"{entry}: flags={p.flags:#x} has unknown bits {unknown:#x} "
             f"(known: {', '.join(_FLAG_NAMES.values())})")
    if p.k_sharded and not p.has(FERRUM_MM_FLAG_ACT_ORDER):
        fail(f"{entry}: flags may clear K_FULL (a K shard of an act-order layer) only with ACT_ORDER")
    is_u4 = p.b_type == FERRUM_WEIGHT_U4
    if p.has(FERRUM_MM_FLAG_HAS_ZERO_POINTS) != is_u4:
        fail(f"{entry}: flags HAS_ZERO_POINTS must be set exactly when b_type is U4 "
             f"(b_type={_B_TYPE_NAMES[p.b_type]}, HAS_ZERO_POINTS "
             f"{'set' if p.has(FERRUM_MM_FLAG_HAS_ZERO_POINTS) else 'clear'})")
    if p.has(FERRUM_MM_FLAG_ACT_ORDER):
        if p.b_type == FERRUM_WEIGHT_FE4M3FN:
            fail(f"{entry}: flags ACT_ORDER needs an integer weight type, got b_type=FE4M3FN")
        if p.group_size <= 0:
            fail(f"{entry}: flags ACT_ORDER needs group_size > 0, got group_size={p.group_size}")
    if p.has(FERRUM_MM_FLAG_ATOMIC_ADD) and p.has(FERRUM_MM_FLAG_FP32_REDUCE):
        fail(f"{entry}: flags ATOMIC_ADD and FP32_REDUCE exclude each other")


def validate_mm(problem: MmProblem, entry: str = MM_ENTRY) -> None:
    """Every scalar rule of ``ferrum_marlin_mm`` (header section "General
    Marlin GEMM"): types, shape, groups, flags, sms and tile override."""
    p = problem
    for name in ("m", "n", "k", "lda", "group_size", "num_groups", "a_type", "b_type",
                 "sms", "thread_k", "thread_n"):
        check_int(entry, name, getattr(p, name))
    if isinstance(p.flags, bool) or not isinstance(p.flags, (int, np.integer)):
        raise ArgumentTypeError(f"{entry}: flags must be an integer, got {type(p.flags).__name__}")
    if not 0 <= int(p.flags) <= U32_MAX:
        fail(f"{entry}: flags={int(p.flags)} does not fit in unsigned int")
    if p.a_type not in _A_TYPE_NAMES:
        fail(f"{entry}: a_type={p.a_type} must be FERRUM_DTYPE_F16 ({FERRUM_DTYPE_F16}) "
             f"or FERRUM_DTYPE_BF16 ({FERRUM_DTYPE_BF16})")
    if p.b_type not in _B_TYPE_NAMES:
        fail(f"{entry}: b_type={p.b_type} must be one of "
             + ", ".join(f"{name} ({value})" for value, name in _B_TYPE_NAMES.items()))
    check_non_negative(entry, "m", p.m)
    check_positive(entry, "n", p.n)
    check_positive(entry, "k", p.k)
    check_multiple(entry, "n", p.n, 64)
    check_multiple(entry, "k", p.k, 128)
    for name in ("n", "k", "lda"):
        check_dim(entry, name, getattr(p, name))
    if p.has(FERRUM_MM_FLAG_ACT_ORDER):
        check_positive(entry, "lda", p.lda)  # a is read only through perm (columns < min(k, lda))
    elif p.lda < p.k:
        fail(f"{entry}: lda={p.lda} must be >= k={p.k} (less only with ACT_ORDER)")
    check_multiple(entry, "lda", p.lda, 8)  # keeps every row of a 16-byte aligned
    fp8 = p.b_type == FERRUM_WEIGHT_FE4M3FN
    if fp8 and p.group_size not in MM_FP8_GROUP_SIZES:
        fail(f"{entry}: group_size={p.group_size} must be one of {', '.join(map(str, MM_FP8_GROUP_SIZES))} "
             f"for b_type={_B_TYPE_NAMES[p.b_type]}")
    if not fp8 and not int_group_size_served(p.group_size):
        fail(f"{entry}: group_size={p.group_size} must be {INT_GROUP_SIZE_RULE} for b_type={_B_TYPE_NAMES[p.b_type]}")
    _check_flags(entry, p)
    if p.k_sharded:
        # Each row names its group (g_idx); the scales hold the whole layer's.
        check_positive(entry, "num_groups", p.num_groups)
        if p.n % 128:
            fail(f"{entry}: n={p.n} must be divisible by 128 with K_FULL clear (its tile is 128 columns wide)")
        if (p.thread_k, p.thread_n) not in ((-1, -1), (128, 128)):
            fail(f"{entry}: K_FULL clear runs the (128, 128) tile, got (thread_k, thread_n)="
                 f"({p.thread_k}, {p.thread_n})")
    else:
        if p.group_size != -1:
            check_multiple(entry, "k", p.k, p.group_size)
        groups = 1 if p.group_size == -1 else p.k // p.group_size
        if p.num_groups != groups:
            fail(f"{entry}: num_groups={p.num_groups} must be {groups} "
                 f"({'1 for channelwise' if p.group_size == -1 else f'k/group_size = {p.k}/{p.group_size}'})")
    if p.sms != -1 and p.sms < 1:
        fail(f"{entry}: sms={p.sms} must be -1 (all) or >= 1")
    if (p.thread_k, p.thread_n) not in MM_TILES:
        fail(
            f"{entry}: (thread_k, thread_n)=({p.thread_k}, {p.thread_n}) must be one of "
            f"{', '.join(str(t) for t in MM_TILES)}"
        )
    if p.thread_n != -1:
        check_multiple(entry, "n", p.n, p.thread_n)
        check_multiple(entry, "k", p.k, p.thread_k)
    if (p.thread_k, p.thread_n) == (128, 256) and p.m > MM_DEEP_TILE_MAX_M:
        fail(f"{entry}: tile (thread_k=128, thread_n=256) serves m <= {MM_DEEP_TILE_MAX_M}, got m={p.m}")
    mm_spans(p, 1, entry)  # refuses sizes that overflow before anything is allocated


def mm_spans(problem: MmProblem, sms: int, entry: str = MM_ENTRY) -> dict[str, int]:
    """Bytes each buffer must hold from its pointer on, for ``sms``
    multiprocessors (``problem.sms`` resolved); buffers the problem does not
    use are absent."""
    p = problem
    item = 2  # F16 and BF16 alike
    spans = {
        "a": 0 if p.m == 0 else checked_product(entry, "a", (p.m - 1) * p.lda + min(p.k, p.lda), item),
        "b": checked_product(entry, "b", p.k // 16, p.weight_bits // 2 * p.n, 4),
        "c": checked_product(entry, "c", p.m, p.n, item),
        "b_scales": checked_product(entry, "b_scales", p.num_groups, p.n, item),
        "workspace": checked_product(entry, "workspace", mm_workspace_ints(sms), 4),
        "bias": p.n * item,
    }
    if p.has(FERRUM_MM_FLAG_HAS_ZERO_POINTS):
        spans["zero_points"] = checked_product(entry, "zero_points", p.num_groups, p.n // 8, 4)
    if p.has(FERRUM_MM_FLAG_ACT_ORDER):
        spans["g_idx"] = p.k * 4
        spans["perm"] = p.k * 4
        spans["a_tmp"] = checked_product(entry, "a_tmp", p.m, p.k, item)
    if p.has(FERRUM_MM_FLAG_FP32_REDUCE):
        spans["c_tmp"] = checked_product(entry, "c_tmp", mm_c_tmp_floats(sms), 4)
    return spans


# (name, alignment) of every pointer of the struct except a_scales.
_MM_POINTER_ALIGNMENT = (
    ("a", 16), ("b", 16), ("c", 16), ("b_scales", 16), ("zero_points", 16), ("a_tmp", 16),
    ("c_tmp", 16), ("bias", 16), ("g_idx", 4), ("perm", 4), ("workspace", 4),
)


def _present_exactly_when(entry: str, name: str, ptr: int, needed: bool, why: str) -> None:
    if needed and not ptr:
        fail(f"{entry}: {name} pointer must not be null when {why}")
    if not needed and ptr:
        fail(f"{entry}: {name} pointer must be null unless {why}")


def validate_mm_buffers(problem: MmProblem, buffers: MmBuffers, sms: int, entry: str = MM_ENTRY, *,
                        spans: Mapping[str, int] | None = None) -> None:
    """The pointer rules of ``ferrum_marlin_mm`` for a problem that passed
    :func:`validate_mm`: which pointers must be set or null, their alignment,
    and the declared capacities of workspace, c_tmp and a_tmp for ``sms``
    multiprocessors (``problem.sms`` resolved). ``spans``: ``mm_spans(problem,
    sms)`` when the caller has it already."""
    p, bufs = problem, buffers
    for name, _ in _MM_POINTER_ALIGNMENT + (("a_scales", 1),):
        value = getattr(bufs, name)
        if type(value) is int and 0 <= value < 2**64:
            continue  # (the common case, tested first: a third of this function's time)
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not 0 <= value < 2**64:
            raise ArgumentTypeError(f"{entry}: {name} must be a device pointer (an int in 0..2**64-1), got {value!r}")
    for name in ("workspace_bytes", "a_tmp_bytes", "c_tmp_bytes"):
        value = getattr(bufs, name)
        if type(value) is not int and (isinstance(value, bool) or not isinstance(value, (int, np.integer))):
            raise ArgumentTypeError(f"{entry}: {name} must be an integer, got {type(value).__name__}")
        check_non_negative(entry, name, int(value))
    for name in ("a", "b", "c", "b_scales", "workspace"):
        if not getattr(bufs, name):
            fail(f"{entry}: {name} pointer must not be null")
    _present_exactly_when(entry, "zero_points", bufs.zero_points, p.has(FERRUM_MM_FLAG_HAS_ZERO_POINTS),
                          "flags has HAS_ZERO_POINTS (b_type U4)")
    act_order = p.has(FERRUM_MM_FLAG_ACT_ORDER)
    for name in ("g_idx", "perm", "a_tmp"):
        _present_exactly_when(entry, name, getattr(bufs, name), act_order, "flags has ACT_ORDER")
    _present_exactly_when(entry, "c_tmp", bufs.c_tmp, p.has(FERRUM_MM_FLAG_FP32_REDUCE), "flags has FP32_REDUCE")
    if bufs.a_scales:
        fail(f"{entry}: a_scales pointer is reserved and must be null")
    for name, alignment in _MM_POINTER_ALIGNMENT:
        ptr = getattr(bufs, name)
        if ptr and ptr % alignment:
            fail(f"{entry}: {name} pointer {ptr:#x} must be {alignment}-byte aligned")
    check_int(entry, "sms (resolved)", sms)
    check_positive(entry, "sms (resolved)", sms)
    if spans is None:
        spans = mm_spans(p, sms, entry)
    check_span(entry, "workspace (workspace_bytes)", bufs.workspace_bytes, spans["workspace"])
    if act_order:
        check_span(entry, "a_tmp (a_tmp_bytes)", bufs.a_tmp_bytes, spans["a_tmp"])
    if p.has(FERRUM_MM_FLAG_FP32_REDUCE):
        check_span(entry, "c_tmp (c_tmp_bytes)", bufs.c_tmp_bytes, spans["c_tmp"])
