"""Every launch rule of the MoE Marlin GEMMs, written once, pure and CPU-testable.

Two families (header sections "Fused-MoE Marlin GEMMs" and "Bucketed MoE W4A16"):

* The vLLM-convention fused launches, one frozen record per entry point family:
  :class:`MarlinMoeF16Launch` (``ferrum_vllm_marlin_moe_f16`` for INT4, with or
  without zero points, and ``ferrum_vllm_marlin_moe_fp8_f16`` for FP8 E4M3) and
  :class:`MarlinMoeMxfp4Bf16Launch` (``ferrum_vllm_marlin_moe_mxfp4_bf16``).
  ``validate()`` first applies the original engine's contract, rule by rule and
  with its messages ("invalid vLLM Marlin-MoE launch: ..."), including the byte
  span of every buffer whose size the launch determines; then this library's own
  kernel rules (INT4 group sizes, MXFP4 prob_k a multiple of 64, and, given the
  multiprocessor count, the workspace and c_tmp sizes of the header), under the
  same prefix. It returns the required spans so that callers holding arrays or
  declared capacities can compare.
* The bucketed ``marlin_cuda_moe``: :class:`MoeBucketProblem`, its shape rules
  (n, k multiples of 64, groups -1 or 128, the routed tiles) plus the bucket's
  own (prob_m, strides, locks).

No rule asks a tile to divide (n, k): the routed kernels run a partial last
tile when one does not (nothing outside the problem is read or written), so any
prob_n and prob_k that are multiples of 64 are served and no K needs padding.
A forced tile only has to be one the kernels are built with; the deep
(thread_k=128, thread_n=256) tile serves slabs of at most 16 rows: bucket
prob_m 16 here, moe_block_size <= 16 for the fused launches (whose tile is
forced by FERRUM_VLLM_MOE_THREAD_K / _N, checked by the library alone).

Pointers are plain integers; an optional pointer is ``None`` when absent, so that
an explicit 0 is reported as a null pointer rather than taken for "absent".
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Mapping, NoReturn

import numpy as np

from ._abi import (
    FERRUM_MAX_DIM,
    FERRUM_MOE_C_TMP_FLOATS_PER_SM_PER_ROW,
    FERRUM_MOE_WORKSPACE_INTS_PER_SM,
    INT_GROUP_SIZE_RULE,
    int_group_size_served,
)
from .status import ArgumentError, ArgumentTypeError
from .validation import (
    DEFAULT_MAX_PAR,
    I32_MAX,
    W4A16Problem,
    check_int,
    check_non_negative,
    check_multiple,
    check_pointer,
    check_positive,
    check_sliced_dims,
    check_span,
    checked_product,
    fail,
    validate_w4a16_pointers,
    w4a16_spans,
)

MOE_PREFIX = "invalid vLLM Marlin-MoE launch"
MOE_BLOCK_SIZES = (8, 16, 32, 48, 64)
MOE_FP8_GROUP_SIZES = (-1, 128)
MXFP4_GROUP_SIZE = 32
U64_MAX = 2**64 - 1


class MoeF16WeightType(enum.Enum):
    """Weights of the FP16 fused launch: INT4 codes (bias 8, or with zero points
    when ``has_zero_points``) or FP8 E4M3 bytes."""

    U4B8 = "U4B8"
    E4M3 = "E4M3"


def moe_fail(reason: str) -> NoReturn:
    raise ArgumentError(f"{MOE_PREFIX}: {reason}")


def _check_moe_dims(n: int, k: int) -> None:
    if n > FERRUM_MAX_DIM or k > FERRUM_MAX_DIM:
        moe_fail(f"prob_n {n} and prob_k {k} must be at most FERRUM_MAX_DIM={FERRUM_MAX_DIM}")


# ---- argument types ----------------------------------------------------------------


def _check_types(args: object, ints: tuple[str, ...], flags: tuple[str, ...], pointers: tuple[str, ...],
                 optional_pointers: tuple[str, ...]) -> None:
    """Python types first, so that every later rule compares integers."""
    for name in ints:
        check_int(MOE_PREFIX, name, getattr(args, name))
    for name in flags:
        value = getattr(args, name)
        if not isinstance(value, (bool, np.bool_)):
            raise ArgumentTypeError(f"{MOE_PREFIX}: {name} must be a bool, got {type(value).__name__}")
    for name in pointers + optional_pointers:
        value = getattr(args, name)
        if value is None and name in optional_pointers:
            continue
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) or not 0 <= value <= U64_MAX:
            raise ArgumentTypeError(
                f"{MOE_PREFIX}: {name} must be a device pointer (an int in 0..2**64-1"
                f"{', or None' if name in optional_pointers else ''}), got {value!r}"
            )


# ---- the original contract's helpers -------------------------------------------------


def _check_pointer(name: str, pointer: int, alignment: int) -> None:
    if pointer == 0:
        moe_fail(f"{name} pointer must be non-null")
    if pointer % alignment != 0:
        moe_fail(f"{name} pointer {int(pointer):#x} must be aligned to {alignment} bytes")


def _check_pointers(args: object, required: tuple[tuple[str, int], ...], optional: tuple[tuple[str, int], ...]) -> None:
    for name, alignment in required:
        _check_pointer(name, getattr(args, name), alignment)
    for name, alignment in optional:
        if getattr(args, name) is not None:
            _check_pointer(name, getattr(args, name), alignment)


def moe_bytes(label: str, *factors: int) -> int:
    """A byte size, refusing any partial product beyond the 64-bit device domain."""
    result = 1
    for factor in factors:
        result *= int(factor)
        if result > U64_MAX:
            moe_fail(f"{label} byte size overflows the u64 device domain")
    return result


def _check_range(name: str, pointer: int, nbytes: int) -> None:
    """The last byte of the span must still be an address."""
    if nbytes > 0 and int(pointer) + nbytes - 1 > U64_MAX:
        moe_fail(f"{name} pointer range overflows the u64 device domain")


def _check_ranges(args: object, spans: Mapping[str, int]) -> None:
    for name, nbytes in spans.items():
        _check_range(name, getattr(args, name), nbytes)


def _check_block_size(moe_block_size: int) -> None:
    if moe_block_size not in MOE_BLOCK_SIZES:
        moe_fail(f"unsupported moe_block_size {moe_block_size}; expected one of 8, 16, 32, 48, 64")


def _check_device(device_ordinal: int) -> None:
    if device_ordinal < 0:
        moe_fail(f"device_ordinal must be non-negative, got {device_ordinal}")


def _check_modes(args: "MarlinMoeF16Launch | MarlinMoeMxfp4Bf16Launch") -> None:
    """The optional pointers must agree with the flags that use them."""
    if args.mul_topk_weights and args.topk_weights is None:
        moe_fail("mul_topk_weights requires a non-null topk_weights pointer")
    if bool(args.use_atomic_add) == bool(args.use_fp32_reduce):
        moe_fail("exactly one of use_atomic_add and use_fp32_reduce must be enabled")
    if bool(args.use_fp32_reduce) != (args.c_tmp is not None):
        moe_fail("use_fp32_reduce must exactly match the c_tmp pointer")


# ---- the layer variants (the ``_ex`` entry points) ---------------------------------------

_LAYER_INTS = ("add_rows_div", "clear_bytes")
_LAYER_FLAGS = ("routing_settled", "direct_routing")
_LAYER_OPTIONAL_POINTERS = (("clear", 16),)
# The align step's outputs, which direct routing does without.
_ALIGNED_ONLY = ("sorted_token_ids", "num_tokens_past_padded")


def _routing_pointers(args: "MarlinMoeF16Launch | MarlinMoeMxfp4Bf16Launch",
                      pointers: tuple[tuple[str, int], ...]) -> tuple[tuple[str, int], ...]:
    """The required pointers: with direct routing, not the align step's outputs
    (a non-bool flag is refused by the type checks that come first)."""
    if isinstance(args.direct_routing, (bool, np.bool_)) and args.direct_routing:
        return tuple(p for p in pointers if p[0] not in _ALIGNED_ONLY)
    return pointers


def _check_layer_extras(args: "MarlinMoeF16Launch | MarlinMoeMxfp4Bf16Launch") -> None:
    """``add_rows_div`` (C zero on entry, row t added into row t / div) and
    ``clear`` (zeroed by the launch for the next one): the ``_ex`` rules."""
    div = args.add_rows_div
    if div < 0:
        moe_fail(f"add_rows_div must be >= 0, got {div}")
    if div > 0:
        if not args.use_atomic_add:
            moe_fail("add_rows_div > 0 adds into a zeroed C and needs use_atomic_add")
        if (args.prob_m * args.top_k) % div != 0:
            moe_fail(f"add_rows_div {div} must divide prob_m * top_k = {args.prob_m * args.top_k}")
    if args.clear_bytes < 0:
        moe_fail(f"clear_bytes must be >= 0, got {args.clear_bytes}")
    if (args.clear is None) != (args.clear_bytes == 0):
        moe_fail("clear_bytes must be positive exactly when clear is given")
    if args.clear is not None and args.clear_bytes % 16 != 0:
        moe_fail(f"clear_bytes {args.clear_bytes} must be a multiple of 16")
    if args.routing_settled and args.clear is not None and not args.direct_routing:
        moe_fail("a settled launch clears only with direct routing")
    if args.direct_routing:
        given = [name for name in _ALIGNED_ONLY if getattr(args, name) is not None]
        if given:
            moe_fail(f"direct_routing takes no {' or '.join(given)} (routed row t is slab t, expert expert_ids[t])")
        if args.moe_block_size != 8:
            moe_fail(f"direct_routing puts one row in each slab and needs moe_block_size 8, "
                     f"got {args.moe_block_size}")


def _output_rows(args: "MarlinMoeF16Launch | MarlinMoeMxfp4Bf16Launch") -> int:
    """Rows of C: ``prob_m * top_k``, divided by ``add_rows_div`` when set."""
    rows = args.prob_m * args.top_k
    return rows // args.add_rows_div if args.add_rows_div > 0 else rows


def _add_clear_span(args: "MarlinMoeF16Launch | MarlinMoeMxfp4Bf16Launch", spans: dict[str, int],
                    pointers: tuple[tuple[str, int], ...]) -> None:
    """``clear``'s span, which must not meet any buffer of the launch (its
    blocks would zero what the others read or write): every pointer argument,
    over its span where the launch sizes it, else its first byte."""
    if args.clear is None:
        return
    start, end = int(args.clear), int(args.clear) + args.clear_bytes
    _check_range("clear", start, args.clear_bytes)
    for name, _ in pointers:
        other = getattr(args, name)
        if other is None:
            continue
        nbytes = max(spans.get(name, 1), 1)
        if other < end and start < other + nbytes:
            moe_fail(f"clear [{start:#x}, +{args.clear_bytes}) overlaps {name} [{int(other):#x}, +{nbytes})")
    spans["clear"] = args.clear_bytes


def _is_layer_call(args: "MarlinMoeF16Launch | MarlinMoeMxfp4Bf16Launch") -> bool:
    return (args.add_rows_div != 0 or args.clear is not None or bool(args.routing_settled)
            or bool(args.direct_routing))


# ---- this library's own rules ----------------------------------------------------------


def moe_workspace_ints(sms: int) -> int:
    """Minimum lock count of a fused-MoE workspace for ``sms`` multiprocessors."""
    return FERRUM_MOE_WORKSPACE_INTS_PER_SM * sms


def moe_c_tmp_floats(moe_block_size: int, sms: int) -> int:
    """The kernel's minimum fp32 ``c_tmp`` for ``sms`` multiprocessors (the
    original contract's [M*top_k, N] span is required as well)."""
    return FERRUM_MOE_C_TMP_FLOATS_PER_SM_PER_ROW * moe_block_size * sms


def _scratch_spans(args: "MarlinMoeF16Launch | MarlinMoeMxfp4Bf16Launch", spans: dict[str, int],
                   sms: int) -> dict[str, int]:
    """Workspace and c_tmp as the kernel sizes them on a device of ``sms``
    multiprocessors; c_tmp keeps the larger of that and the row span."""
    check_int(MOE_PREFIX, "sms", sms)
    if sms <= 0:
        moe_fail(f"sms must be positive, got {sms}")
    scratch = {"workspace": moe_bytes("workspace [4*sms] int32", moe_workspace_ints(sms), 4)}
    if args.c_tmp is not None:
        kernel = moe_bytes("FP32 reduction scratch [1024*moe_block_size*sms]",
                           moe_c_tmp_floats(args.moe_block_size, sms), 4)
        scratch["c_tmp"] = max(spans["c_tmp"], kernel)
    _check_ranges(args, scratch)
    return scratch


def check_moe_capacities(required: Mapping[str, int], available: Mapping[str, int]) -> None:
    """Declared buffer sizes (bytes from each pointer on) against the spans
    ``validate`` returned; names the launch does not size are refused."""
    for name, nbytes in available.items():
        if name not in required:
            moe_fail(f"spans names {name!r}, whose size this launch does not determine "
                     f"(it sizes {', '.join(required)})")
        check_span(MOE_PREFIX, name, nbytes, required[name])


# ---- INT4 / FP8 x FP16 -----------------------------------------------------------------

_F16_INTS = ("moe_block_size", "top_k", "prob_m", "prob_n", "prob_k", "group_size", "device_ordinal")
_F16_FLAGS = ("mul_topk_weights", "is_ep", "has_zero_points", "use_atomic_add", "use_fp32_reduce")
_F16_POINTERS = (("a", 16), ("b", 16), ("c", 16), ("scales", 16), ("workspace", 4), ("sorted_token_ids", 4),
                 ("expert_ids", 4), ("num_tokens_past_padded", 4))
_F16_OPTIONAL_POINTERS = (("c_tmp", 16), ("zero_points", 16), ("topk_weights", 4))


@dataclass(frozen=True)
class MarlinMoeF16Launch:
    """The arguments of ``ferrum_vllm_marlin_moe_f16`` (U4B8, INT4 with zero points
    when ``has_zero_points``) or ``ferrum_vllm_marlin_moe_fp8_f16`` (E4M3).

    ``expert_count`` is not an argument of the C call (the library trusts the
    routing arrays); when given, the weight, scale and zero-point spans are
    computed for that many stacked experts.
    """

    weight_type: MoeF16WeightType
    a: int
    b: int
    c: int
    scales: int
    workspace: int
    sorted_token_ids: int
    expert_ids: int
    num_tokens_past_padded: int
    moe_block_size: int
    top_k: int
    prob_m: int
    prob_n: int
    prob_k: int
    group_size: int
    c_tmp: int | None = None
    zero_points: int | None = None
    topk_weights: int | None = None
    mul_topk_weights: bool = False
    is_ep: bool = False
    has_zero_points: bool = False
    device_ordinal: int = 0
    use_atomic_add: bool = True
    use_fp32_reduce: bool = False
    expert_count: int | None = None
    # The layer variant's arguments (``ferrum_vllm_marlin_moe_*_ex``; ferrum_marlin.h).
    add_rows_div: int = 0
    clear: int | None = None
    clear_bytes: int = 0
    routing_settled: bool = False
    direct_routing: bool = False

    @property
    def entry_point(self) -> str:
        base = ("ferrum_vllm_marlin_moe_fp8_f16" if self.weight_type is MoeF16WeightType.E4M3
                else "ferrum_vllm_marlin_moe_f16")
        return base + "_ex" if _is_layer_call(self) else base

    @property
    def shape(self) -> dict[str, object]:
        """What a NativeError reports about the call."""
        return {
            "m": self.prob_m, "n": self.prob_n, "k": self.prob_k, "top_k": self.top_k,
            "moe_block_size": self.moe_block_size, "group_size": self.group_size,
            # With zero points the INT4 codes are the header's U4, not U4B8.
            "weight_type": "U4" if self.has_zero_points else self.weight_type.value,
        }

    def validate(self, sms: int | None = None) -> dict[str, int]:
        """Every rule, or ArgumentError/ArgumentTypeError; returns the bytes each
        sized buffer must hold from its pointer on. ``sms`` (the device's
        multiprocessors) adds the workspace and the kernel's c_tmp minimum."""
        ints = _F16_INTS + _LAYER_INTS + (() if self.expert_count is None else ("expert_count",))
        required = _routing_pointers(self, _F16_POINTERS)
        _check_types(self, ints, _F16_FLAGS + _LAYER_FLAGS, tuple(n for n, _ in required),
                     tuple(n for n, _ in _F16_OPTIONAL_POINTERS + _LAYER_OPTIONAL_POINTERS))
        if not isinstance(self.weight_type, MoeF16WeightType):
            raise ArgumentTypeError(f"{MOE_PREFIX}: weight_type must be a MoeF16WeightType, "
                                    f"got {self.weight_type!r}")
        _check_pointers(self, required, _F16_OPTIONAL_POINTERS + _LAYER_OPTIONAL_POINTERS)
        m, n, k, group_size = self.prob_m, self.prob_n, self.prob_k, self.group_size
        if m <= 0 or n <= 0 or k <= 0:
            moe_fail(f"prob_m, prob_n, and prob_k must be positive, got [{m}, {n}, {k}]")
        _check_block_size(self.moe_block_size)
        if self.top_k <= 0:
            moe_fail(f"top_k must be positive, got {self.top_k}")
        if m * self.top_k > I32_MAX:
            moe_fail("prob_m * top_k overflows the kernel's i32 output-row domain")
        if n % 64 != 0:
            moe_fail(f"prob_n {n} must be divisible by the Marlin minimum thread width 64")
        if k % 64 != 0:
            moe_fail(f"prob_k {k} must be divisible by the Marlin minimum thread width 64")
        _check_moe_dims(n, k)
        if self.weight_type is MoeF16WeightType.U4B8:
            if group_size != -1:
                if group_size <= 0 or group_size % 16 != 0:
                    moe_fail(f"group_size must be -1 or a positive multiple of 16, got {group_size}")
                if k % group_size != 0:
                    moe_fail(f"prob_k {k} must be divisible by group_size {group_size}")
        else:
            if group_size not in MOE_FP8_GROUP_SIZES:
                moe_fail(f"E4M3 group_size must be -1 or 128, got {group_size}")
            if group_size == 128 and k % 128 != 0:
                moe_fail(f"E4M3 prob_k {k} must be divisible by group_size 128")
        _check_device(self.device_ordinal)
        if bool(self.has_zero_points) != (self.zero_points is not None):
            moe_fail("has_zero_points must exactly match the zero_points pointer")
        if self.weight_type is MoeF16WeightType.E4M3 and (self.has_zero_points or self.zero_points is not None):
            moe_fail("E4M3 forbids zero points")
        _check_modes(self)
        _check_layer_extras(self)
        # The C call has no expert count: one given here only sizes buffers.
        if self.expert_count is not None and self.expert_count <= 0:
            moe_fail(f"expert_count must be positive, got {self.expert_count}")
        spans = self._spans()
        # This library's own rules come after the original contract's.
        # The kernels serve these INT4 group sizes (the original contract
        # accepts any multiple of 16).
        if self.weight_type is MoeF16WeightType.U4B8 and not int_group_size_served(group_size):
            moe_fail(f"INT4 group_size must be {INT_GROUP_SIZE_RULE} (the group sizes the kernels are built "
                     f"for), got {group_size}")
        if sms is not None:
            spans.update(_scratch_spans(self, spans, sms))
        _add_clear_span(self, spans, _F16_POINTERS + _F16_OPTIONAL_POINTERS)
        return spans

    def _spans(self) -> dict[str, int]:
        """Bytes of every buffer the shape determines, in the argument order;
        weights, scales and zero points only with ``expert_count``."""
        rows = self.prob_m * self.top_k
        m, n, k = self.prob_m, self.prob_n, self.prob_k
        spans = {"a": moe_bytes("FP16 input [M,K]", m, k, 2)}
        experts = self.expert_count
        if experts is not None:
            # Marlin tiles of int32 words: [K/16, 2N] for 4-bit codes, [K/16, 4N] for bytes.
            if self.weight_type is MoeF16WeightType.U4B8:
                spans["b"] = moe_bytes("INT4 packed weight [E,K/16,2N] int32", experts, k // 16, 2 * n, 4)
            else:
                spans["b"] = moe_bytes("FP8 packed weight [E,K/16,4N] int32", experts, k // 16, 4 * n, 4)
        spans["c"] = (moe_bytes("FP16 output [M*top_k,N]", rows, n, 2) if self.add_rows_div == 0
                      else moe_bytes("FP16 output [M*top_k/add_rows_div,N]", _output_rows(self), n, 2))
        if experts is not None:
            groups = 1 if self.group_size == -1 else k // self.group_size
            spans["scales"] = moe_bytes("FP16 scales [E,groups,N]", experts, groups, n, 2)
            if self.zero_points is not None:
                spans["zero_points"] = moe_bytes("INT4 zero points [E,groups,N/8] int32", experts, groups, n // 8, 4)
        if self.c_tmp is not None:
            spans["c_tmp"] = moe_bytes("FP32 reduction scratch [M*top_k,N]", rows, n, 4)
        if self.topk_weights is not None:
            spans["topk_weights"] = moe_bytes("top-k weights [M,top_k]", rows, 4)
        if self.direct_routing:
            spans["expert_ids"] = moe_bytes("direct routing expert ids [M*top_k]", rows, 4)
        _check_ranges(self, spans)
        return spans


# ---- MXFP4 x BF16 -----------------------------------------------------------------------

_MXFP4_INTS = ("expert_count", "moe_block_size", "top_k", "prob_m", "prob_n", "prob_k", "group_size",
               "device_ordinal")
_MXFP4_FLAGS = ("mul_topk_weights", "is_ep", "use_atomic_add", "use_fp32_reduce")
_MXFP4_POINTERS = (("a", 16), ("b", 16), ("c", 16), ("bias", 16), ("scales", 16), ("workspace", 4),
                   ("sorted_token_ids", 4), ("expert_ids", 4), ("num_tokens_past_padded", 4))
_MXFP4_OPTIONAL_POINTERS = (("c_tmp", 16), ("topk_weights", 4))


@dataclass(frozen=True)
class MarlinMoeMxfp4Bf16Launch:
    """The arguments of ``ferrum_vllm_marlin_moe_mxfp4_bf16``: BF16 activations,
    bias and output; E2M1 codes, two per byte; one E8M0 scale byte per 32 values
    along K. ``expert_count`` sizes the stacked weight, bias and scales."""

    expert_count: int
    a: int
    b: int
    c: int
    bias: int
    scales: int
    workspace: int
    sorted_token_ids: int
    expert_ids: int
    num_tokens_past_padded: int
    moe_block_size: int
    top_k: int
    prob_m: int
    prob_n: int
    prob_k: int
    group_size: int = MXFP4_GROUP_SIZE
    c_tmp: int | None = None
    topk_weights: int | None = None
    mul_topk_weights: bool = False
    is_ep: bool = False
    device_ordinal: int = 0
    use_atomic_add: bool = True
    use_fp32_reduce: bool = False
    add_rows_div: int = 0
    clear: int | None = None
    clear_bytes: int = 0
    routing_settled: bool = False
    direct_routing: bool = False

    @property
    def entry_point(self) -> str:
        return "ferrum_vllm_marlin_moe_mxfp4_bf16" + ("_ex" if _is_layer_call(self) else "")

    @property
    def shape(self) -> dict[str, object]:
        """What a NativeError reports about the call."""
        return {
            "m": self.prob_m, "n": self.prob_n, "k": self.prob_k, "top_k": self.top_k,
            "moe_block_size": self.moe_block_size, "group_size": self.group_size,
            "expert_count": self.expert_count,
        }

    def validate(self, sms: int | None = None) -> dict[str, int]:
        """As :meth:`MarlinMoeF16Launch.validate`."""
        required = _routing_pointers(self, _MXFP4_POINTERS)
        _check_types(self, _MXFP4_INTS + _LAYER_INTS, _MXFP4_FLAGS + _LAYER_FLAGS,
                     tuple(n for n, _ in required),
                     tuple(n for n, _ in _MXFP4_OPTIONAL_POINTERS + _LAYER_OPTIONAL_POINTERS))
        _check_pointers(self, required, _MXFP4_OPTIONAL_POINTERS + _LAYER_OPTIONAL_POINTERS)
        m, n, k = self.prob_m, self.prob_n, self.prob_k
        if self.expert_count <= 0:
            moe_fail(f"MXFP4 expert_count must be positive, got {self.expert_count}")
        if m <= 0 or n <= 0 or k <= 0:
            moe_fail(f"MXFP4 BF16 prob_m, prob_n, and prob_k must be positive, got [{m}, {n}, {k}]")
        _check_block_size(self.moe_block_size)
        if self.top_k <= 0 or self.top_k > self.expert_count:
            moe_fail(f"MXFP4 top_k must be in 1..=expert_count, got top_k={self.top_k} "
                     f"expert_count={self.expert_count}")
        if m * self.top_k > I32_MAX:
            moe_fail("MXFP4 prob_m * top_k overflows the kernel's i32 output-row domain")
        if n % 64 != 0:
            moe_fail(f"MXFP4 prob_n {n} must be divisible by the Marlin minimum thread width 64")
        _check_moe_dims(n, k)
        if self.group_size != MXFP4_GROUP_SIZE:
            moe_fail(f"MXFP4 E2M1/E8M0 group_size must be exactly {MXFP4_GROUP_SIZE}, got {self.group_size}")
        if k % MXFP4_GROUP_SIZE != 0:
            moe_fail(f"MXFP4 prob_k {k} must be divisible by group_size {MXFP4_GROUP_SIZE}")
        _check_device(self.device_ordinal)
        _check_modes(self)
        _check_layer_extras(self)
        spans = self._spans()
        # This library's own rule: the original contract does not ask k % 64.
        if k % 64 != 0:
            moe_fail(f"MXFP4 prob_k {k} must be divisible by the Marlin minimum thread width 64")
        if sms is not None:
            spans.update(_scratch_spans(self, spans, sms))
        _add_clear_span(self, spans, _MXFP4_POINTERS + _MXFP4_OPTIONAL_POINTERS)
        return spans

    def _spans(self) -> dict[str, int]:
        experts, m, n, k = self.expert_count, self.prob_m, self.prob_n, self.prob_k
        rows = m * self.top_k
        spans = {
            "a": moe_bytes("MXFP4 BF16 input [M,K]", m, k, 2),
            "b": moe_bytes("MXFP4 E2M1 packed weight [E,N,K/2]", experts, n, k // 2),
            "c": (moe_bytes("MXFP4 BF16 output [M*top_k,N]", rows, n, 2) if self.add_rows_div == 0
                  else moe_bytes("MXFP4 BF16 output [M*top_k/add_rows_div,N]", _output_rows(self), n, 2)),
            "bias": moe_bytes("MXFP4 BF16 bias [E,N]", experts, n, 2),
            "scales": moe_bytes("MXFP4 E8M0 scales [E,K/32,N]", experts, k // MXFP4_GROUP_SIZE, n),
        }
        if self.c_tmp is not None:
            spans["c_tmp"] = moe_bytes("MXFP4 FP32 reduction scratch [M*top_k,N]", rows, n, 4)
        if self.topk_weights is not None:
            spans["topk_weights"] = moe_bytes("MXFP4 top-k weights [M,top_k]", rows, 4)
        if self.direct_routing:
            spans["expert_ids"] = moe_bytes("MXFP4 direct routing expert ids [M*top_k]", rows, 4)
        _check_ranges(self, spans)
        return spans


# ---- bucketed W4A16 MoE (marlin_cuda_moe) ---------------------------------------------

BUCKET_ENTRY = "marlin_cuda_moe"
BUCKET_PROB_M = (16, 32, 48, 64)


@dataclass(frozen=True)
class MoeBucketProblem:
    """The shape part of a ``marlin_cuda_moe`` call: ``m`` is the bucket's
    largest token count per expert (rows past an expert's own count are
    padding), the strides place expert ``e``'s weight, scales and locks."""

    m: int
    n: int
    k: int
    group_size: int
    expert_count: int
    b_int4_per_expert: int
    s_int4_per_expert: int
    locks_i32_per_expert: int
    n_full: int = -1
    thread_k: int = -1
    thread_n: int = -1
    sms: int = -1

    @classmethod
    def stacked(cls, m: int, n: int, k: int, group_size: int, expert_count: int,
                max_par: int = DEFAULT_MAX_PAR) -> "MoeBucketProblem":
        """Strides of the per-expert contiguous layout (a stacked MarlinWeight):
        expert ``e`` owns ``k*n/8`` int32 words, ``(k/g)*n`` scales and
        ``max(1, n/128)*max_par`` locks."""
        groups = 1 if group_size == -1 else k // group_size
        return cls(m=m, n=n, k=k, group_size=group_size, expert_count=expert_count,
                   b_int4_per_expert=n * k // 32, s_int4_per_expert=groups * n // 8,
                   locks_i32_per_expert=max(1, n // 128) * max_par)

    @property
    def shape(self) -> dict[str, int]:
        return {"m": self.m, "n": self.n, "k": self.k, "group_size": self.group_size,
                "expert_count": self.expert_count}

    def expert_problem(self) -> W4A16Problem:
        """One expert's call as the dense W4A16 kernel sees it."""
        return W4A16Problem(m=self.m, n=self.n, k=self.k, group_size=self.group_size, n_full=self.n_full,
                            thread_k=self.thread_k, thread_n=self.thread_n, sms=self.sms)


# (thread_k, thread_n) of the routed tiles the bucketed kernel is built with;
# (128, 256) only for prob_m 16.
BUCKET_TILES = ((-1, -1), (128, 128), (128, 64), (64, 256), (64, 128), (128, 256))
# The deep (128, 256) tile is built for slabs of at most 16 rows.
BUCKET_DEEP_TILE_MAX_M = 16


def _check_bucket_shape(entry: str, p: "MoeBucketProblem") -> None:
    """The bucketed kernel runs the routed (MoE) tiles: n and k multiples of 64
    (a tile that does not divide them runs a partial last tile), groups -1 or
    128, the deep tile only for prob_m 16 (mirrors marlin_cuda_moe.cpp)."""
    check_positive(entry, "n", p.n)
    check_positive(entry, "k", p.k)
    check_multiple(entry, "n", p.n, 64)
    check_multiple(entry, "k", p.k, 64)
    check_sliced_dims(entry, p.n, p.k, p.n_full)
    if p.group_size not in (-1, 128):
        fail(f"{entry}: group_size={p.group_size} must be -1 (channelwise) or 128")
    if p.group_size == 128:
        check_multiple(entry, "k", p.k, 128)
    if p.n_full != -1 and (p.n_full < p.n or p.n_full % 64 != 0):
        fail(f"{entry}: n_full={p.n_full} must be -1 or a multiple of 64 that is >= n={p.n}")
    if (p.thread_k, p.thread_n) not in BUCKET_TILES:
        fail(f"{entry}: (thread_k, thread_n)=({p.thread_k}, {p.thread_n}) must be one of "
             f"{', '.join(str(t) for t in BUCKET_TILES)}")
    if (p.thread_k, p.thread_n) == (128, 256) and p.m > BUCKET_DEEP_TILE_MAX_M:
        fail(f"{entry}: tile (thread_k=128, thread_n=256) serves prob_m <= {BUCKET_DEEP_TILE_MAX_M}, "
             f"got prob_m={p.m}")
    if p.sms != -1 and p.sms < 1:
        fail(f"{entry}: sms={p.sms} must be -1 (all) or >= 1")


def validate_moe_bucket(problem: MoeBucketProblem, entry: str = BUCKET_ENTRY) -> None:
    """The shape rules of ``marlin_cuda_moe``: the routed tiles for one expert,
    ``m`` one of the bucket heights, and strides that keep the experts'
    weights, scales and locks apart (expert_count 0 is a no-op)."""
    p = problem
    for name in ("m", "n", "k", "group_size", "expert_count", "b_int4_per_expert", "s_int4_per_expert",
                 "locks_i32_per_expert", "n_full", "thread_k", "thread_n", "sms"):
        check_int(entry, name, getattr(p, name))
    if p.m not in BUCKET_PROB_M:
        fail(f"{entry}: prob_m must be in {{16, 32, 48, 64}}, got {p.m}")
    _check_bucket_shape(entry, p)
    check_non_negative(entry, "expert_count", p.expert_count)
    # One expert's block is [k/16, 2*n_full] int32 and [groups, n_full] fp16, in
    # 16-byte units; the library refuses strides that would overlap them.
    one = p.expert_problem()
    weight_int4 = p.k * one.stride_n // 32
    if p.b_int4_per_expert < weight_int4:
        fail(f"{entry}: b_int4_per_expert={p.b_int4_per_expert} is below one expert's weight "
             f"({weight_int4} 16-byte units)")
    scales_int4 = one.groups * one.stride_n // 8
    if p.s_int4_per_expert < scales_int4:
        fail(f"{entry}: s_int4_per_expert={p.s_int4_per_expert} is below one expert's scales "
             f"({scales_int4} 16-byte units)")
    if p.locks_i32_per_expert < p.n // 64:
        fail(f"{entry}: locks_i32_per_expert={p.locks_i32_per_expert} must be >= prob_n/64 = {p.n // 64} "
             "(one lock per 64-column tile of an expert)")


def moe_bucket_spans(problem: MoeBucketProblem, experts: int, entry: str = BUCKET_ENTRY) -> dict[str, int]:
    """Bytes B, s and workspace must hold when the launch may address expert
    blocks ``0 .. experts-1`` of a problem that passed :func:`validate_moe_bucket`
    (A and C rows come from device-side offsets)."""
    check_int(entry, "experts", experts)
    if experts < 1:
        fail(f"{entry}: experts={experts} must be >= 1 to size the stacked buffers")
    one = w4a16_spans(problem.expert_problem())
    before_last = experts - 1
    return {
        "B": checked_product(entry, "B", before_last, problem.b_int4_per_expert, 16) + one["B"],
        "s": checked_product(entry, "s", before_last, problem.s_int4_per_expert, 16) + one["s"],
        "workspace": checked_product(entry, "workspace", before_last * problem.locks_i32_per_expert
                                     + problem.n // 64, 4),
    }


def validate_moe_bucket_pointers(a: int, b: int, c: int, s: int, workspace: int, a_row_offsets: int,
                                 tokens_per_expert: int, active_expert_ids: int | None,
                                 entry: str = BUCKET_ENTRY) -> None:
    """A, B, C, s 16-byte aligned; the int32 arrays 4-byte aligned;
    active_expert_ids may be null (expert y of the launch is expert y)."""
    validate_w4a16_pointers(a, b, c, s, workspace, entry)
    check_pointer(entry, "a_row_offsets", a_row_offsets, 4)
    check_pointer(entry, "tokens_per_expert", tokens_per_expert, 4)
    if active_expert_ids:
        check_pointer(entry, "active_expert_ids", active_expert_ids, 4)
