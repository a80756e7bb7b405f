"""``fused_moe``: a whole MoE layer (routing -> gate/up GEMM -> activation ->
down GEMM -> top-k sum) on device arrays, one stream, no host sync.

The path of one call, all on ``stream``::

    topk_ids --moe_align_block_size--> sorted_token_ids, expert_ids, count
    hidden [M, K] --w13 GEMM (top_k rows a token)--> gate_up [M*top_k, 2I]
    gate_up --silu_and_mul | gpt_oss_swiglu--> activated [M*top_k, w2.k]
    activated --w2 GEMM (x topk_weights[t])--> down [M*top_k, H]
    down --moe_sum--> out [M, H]

The down GEMM reuses the routing of the gate/up GEMM: with ``top_k = 1`` and
``prob_m = M*top_k`` the ids ``t = token*top_k + slot`` name the rows of
``activated`` directly, and the padding id ``M*top_k`` is still past the
last row. The routing count stays on the device (the kernels read it).
In atomic mode (the default) the GEMMs add their partials into zeroed
outputs and the down GEMM sums each token's rows itself (no moe_sum), and a
few tokens (decode) skip the align kernel: both GEMMs read ``topk_ids`` as
the expert of each routed row (direct routing, :func:`direct_routing_pays`).

Every rule of every native call is checked before the first of them. Scratch
(routing arrays, intermediates, the lock workspace and ``c_tmp``) is cached
per (device, stream) in :mod:`._scratch` and grown on demand, so after a
first call of a given size nothing but an omitted ``out`` is allocated and
the call can be captured in a CUDA graph.

Host time (decode: a few tokens, a few tens of microseconds on the GPU): the
first call of a layer signature -- the weight objects, the options, M,
top_k, the expert map's length, the stream -- checks every rule and keeps
the native calls it validated, their arguments included, as a plan (in
:mod:`._scratch`, dropped with the scratch buffers it names). A later call of
the same signature re-reads the caller's arrays, re-checks everything the
native calls require of them (dtype, shape, C order, alignment, pointer
range, device, a writable ``out``) and makes the kept calls with their
pointers; anything else sends it through every rule again, so a bad
argument raises what it always raised.

Weights and activations: INT4 (``u4b8``, ``u4``) and FP8 (``fe4m3fn``)
experts run FP16 activations, MXFP4 experts BF16 (each kind's only entry
point). The MXFP4 kernel adds its bias itself; the INT4/FP8 entry points take
none, so an INT4/FP8 weight carrying a bias is refused rather than silently
dropped.
"""

from __future__ import annotations

import math
import numbers
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import numpy as np

from ._devices import allocate, device_of, prepare_stream
from ._interop import DeviceArray, as_device_array
from ._native import NativeCall, library
from ._scratch import keep_plan, plan_generation, plans_of, scratch_array, scratch_for, shaped
from .mm import device_compute_major, device_sm_count
from .moe import marlin_moe_call, marlin_moe_mxfp4_bf16_call
from .moe_ops import (
    MAX_EXPERTS,
    align_call,
    align_capacity,
    gpt_oss_swiglu_call,
    moe_sum_call,
    silu_and_mul_call,
    topk_softmax,
)
from .moe_validation import (
    MOE_BLOCK_SIZES,
    U64_MAX,
    MoeF16WeightType,
    moe_c_tmp_floats,
    moe_workspace_ints,
)
from .moe_weights import MarlinMoeWeight
from .status import ArgumentTypeError
from .validation import I32_MAX, check_array, check_shape, fail

__all__ = ["ACTIVATIONS", "FusedMoE", "default_block_size", "fused_moe", "route"]

ENTRY = "fused_moe"
ACTIVATIONS = ("silu", "gpt_oss_swiglu")
"""``silu``: planar ``[gate | up]`` halves of the gate/up output;
``gpt_oss_swiglu``: interleaved (gate, up) column pairs, GPT-OSS's clamps."""
_INT32 = np.dtype(np.int32)
_FLOAT32 = np.dtype(np.float32)


def default_block_size(num_tokens: int, top_k: int, num_experts: int, warp_specialised: bool = False) -> int:
    """The routing block size ``fused_moe`` uses, from the rows an expert
    receives on average, ``r = ceil(num_tokens * top_k / num_experts)``: the
    smallest of 8, 16 that holds ``r``; past 16 rows the smallest of 32, 48,
    64 that holds ``r + sqrt(r)``; 64 beyond that. ``warp_specialised`` (the
    layer's blocks of 32, 48 and 64 rows run the Hopper warp-specialised
    kernel, see :func:`tall_blocks_warp_specialised`): 9 to 16 rows take
    blocks of 32 (H200, Qwen3-30B-A3B-like layer, gate_up + down: M = 192
    178 us in blocks of 32 against 196 in 16 and 220 in 8; M = 256 182
    against 252 in 16). Past 16 rows the rule is the same on both kernels
    (H200, warp-specialised, GPT-OSS-like M = 256, r = 32: 170 + 95 us in
    blocks of 48 against 179 + 99 in 64 and 222 + 127 in 32; Qwen-like
    M = 512: 116 + 76 against 132 + 82 in 64).

    Why: each block of rows streams its expert's whole weight, so an expert
    should fit one block; a block larger than that only adds padded rows
    that the tensor cores compute for nothing. Blocks of up to 16 rows run
    the image path, so much cheaper per row that a second block for a busier
    expert costs less than a taller one. Taller blocks are compute-bound, and
    an expert one row over the block pays a whole second block: one standard
    deviation of a uniform router's load (``sqrt(r)``) of headroom keeps most
    experts in one (H200, GPT-OSS-like M=256, r = 32: blocks of 48 take 278
    + 155 us for gate_up + down, blocks of 32 323 + 179). Decode (a few
    tokens over many experts) gets 8, large prefill batches 64."""
    rows = -(-num_tokens * top_k // num_experts)
    if warp_specialised and 8 < rows <= 16:
        return 32
    if rows > 16:
        rows = math.ceil(rows + math.sqrt(rows))
    return next((size for size in MOE_BLOCK_SIZES if size >= rows), MOE_BLOCK_SIZES[-1])


def tall_blocks_warp_specialised(device: int, w13: MarlinMoeWeight, w2: MarlinMoeWeight) -> bool:
    """Whether the layer's routed GEMMs run blocks of 32, 48 and 64 rows on the
    warp-specialised Hopper kernel. The native planner decides
    (``routed_wide_config`` in native/src/moe/routed_launch.cpp); this is its
    rule: a Hopper device, a library with sm_90a code, and both GEMMs' N at
    least 256 (every format: the last 256-column tile may be partial). N and K
    are multiples of 64 in every MoE weight, as the tiles and slots need."""
    if any(w.n < 256 for w in (w13, w2)):
        return False
    return device_compute_major(device) == 9 and "90a" in library().build_info


# ---- rules -------------------------------------------------------------------------------


def _check_weights(entry: str, w13: Any, w2: Any, activation: Any) -> None:
    """The layer's static rules: two device weights of one activation dtype and
    expert count, widths that chain through the activation, no dropped bias."""
    for name, weight in (("w13", w13), ("w2", w2)):
        if not isinstance(weight, MarlinMoeWeight):
            raise ArgumentTypeError(f"{entry}: {name} must be a MarlinMoeWeight, got {type(weight).__name__}")
        if not weight.on_device:
            fail(f"{entry}: {name}'s buffers are host arrays; call {name}.to_device() first")
        if weight.kind != "mxfp4" and weight.bias is not None:
            fail(f"{entry}: {name} (kind {weight.kind!r}) carries a bias, but the INT4/FP8 MoE GEMMs add none; "
                 "only MXFP4 weights have a fused bias")
    if activation not in ACTIVATIONS:
        fail(f"{entry}: activation={activation!r} must be one of {', '.join(ACTIVATIONS)}")
    if w13.activation_dtype != w2.activation_dtype:
        fail(f"{entry}: w13 (kind {w13.kind!r}) runs {w13.activation_dtype.name} activations, w2 (kind "
             f"{w2.kind!r}) {w2.activation_dtype.name}; both GEMMs must share one activation dtype")
    if w13.num_experts != w2.num_experts:
        fail(f"{entry}: w13 has {w13.num_experts} experts, w2 {w2.num_experts}")
    intermediate = w13.n // 2
    if activation == "silu" and w2.k != intermediate:
        hint = "; a padded K needs gpt_oss_swiglu, which writes the zero padding" if w2.k > w2.logical_k else ""
        fail(f"{entry}: w2.k={w2.k} must equal w13.n / 2 = {intermediate} (silu_and_mul's output width{hint})")
    if activation == "gpt_oss_swiglu" and w2.logical_k != intermediate:
        fail(f"{entry}: w2.logical_k={w2.logical_k} must equal w13.n / 2 = {intermediate} "
             "(gpt_oss_swiglu's logical output width)")
    if w2.n != w13.logical_k:
        fail(f"{entry}: w2.n={w2.n} must equal w13.logical_k={w13.logical_k} (the layer maps the hidden "
             "size to itself)")


def _check_real(entry: str, name: str, value: Any) -> float:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise ArgumentTypeError(f"{entry}: {name} must be a real number, got {type(value).__name__}")
    if math.isnan(value):
        fail(f"{entry}: {name} must not be NaN")
    return float(value)


def _check_bool(entry: str, name: str, value: Any) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise ArgumentTypeError(f"{entry}: {name} must be a bool, got {type(value).__name__}")
    return bool(value)


def _check_options(entry: str, block_size: Any, fp32_reduce: Any, alpha: Any, limit: Any) -> None:
    if block_size is not None and (isinstance(block_size, (bool, np.bool_))
                                   or not isinstance(block_size, (int, np.integer))
                                   or block_size not in MOE_BLOCK_SIZES):
        fail(f"{entry}: block_size={block_size!r} must be None (automatic) or one of "
             f"{', '.join(map(str, MOE_BLOCK_SIZES))}")
    _check_bool(entry, "fp32_reduce", fp32_reduce)
    _check_real(entry, "alpha", alpha)
    if _check_real(entry, "limit", limit) < 0:
        fail(f"{entry}: limit={limit} must be >= 0 (inf: no clamp)")


def _check_hidden(entry: str, hidden: Any, w13: MarlinMoeWeight) -> DeviceArray:
    """``hidden [M, w13.k]`` of the weights' activation dtype, C-contiguous, 16-byte aligned."""
    view = as_device_array(hidden, "hidden")
    check_array(entry, "hidden", view, w13.activation_dtype, ndim=2)
    if view.shape[1] != w13.k:
        pad = f" (logical {w13.logical_k}, zero-padded to the kernel's K)" if w13.k != w13.logical_k else ""
        fail(f"{entry}: hidden has {view.shape[1]} columns, w13.k={w13.k}{pad}")
    return view


def _routed_experts(entry: str, w13: MarlinMoeWeight, expert_map: Any) -> tuple[int, DeviceArray | None]:
    """Experts the router chooses among: w13's, or every global expert of an
    ``expert_map`` (int32 [global] -> local id or -1) when this rank holds a share."""
    if expert_map is None:
        experts, view = w13.num_experts, None
    else:
        view = as_device_array(expert_map, "expert_map")
        check_array(entry, "expert_map", view, _INT32, ndim=1, alignment=4)
        experts = view.shape[0]
        if experts < w13.num_experts:
            fail(f"{entry}: expert_map has {experts} (global) experts, fewer than the {w13.num_experts} "
                 "local experts of the weights")
    if experts > MAX_EXPERTS:
        fail(f"{entry}: {experts} experts exceed the {MAX_EXPERTS} the routing kernels hold")
    return experts, view


@dataclass(frozen=True)
class _Call:
    """One validated call: sizes, the device, and the input views."""

    m: int
    top_k: int
    num_experts: int
    block_size: int
    device: int
    hidden: DeviceArray
    topk_weights: DeviceArray
    topk_ids: DeviceArray
    expert_map: DeviceArray | None

    @property
    def rows(self) -> int:
        return self.m * self.top_k


def _on(entry: str, name: str, obj: Any, view: DeviceArray, device: int) -> None:
    if view.size and device_of(obj, view) != device:
        fail(f"{entry}: {name} is on device {device_of(obj, view)}, the weights on device {device}")


def _check_call(hidden: Any, w13: MarlinMoeWeight, w2: MarlinMoeWeight, topk_weights: Any, topk_ids: Any,
                activation: Any, expert_map: Any, block_size: Any, fp32_reduce: Any, alpha: Any,
                limit: Any) -> _Call:
    _check_weights(ENTRY, w13, w2, activation)
    _check_options(ENTRY, block_size, fp32_reduce, alpha, limit)
    hidden_view = _check_hidden(ENTRY, hidden, w13)
    m = hidden_view.shape[0]
    ids_view = as_device_array(topk_ids, "topk_ids")
    check_array(ENTRY, "topk_ids", ids_view, _INT32, ndim=2, alignment=4)
    weights_view = as_device_array(topk_weights, "topk_weights")
    check_array(ENTRY, "topk_weights", weights_view, _FLOAT32, ndim=2, alignment=4)
    top_k = ids_view.shape[1]
    if ids_view.shape[0] != m or top_k < 1:
        fail(f"{ENTRY}: topk_ids must be [M={m}, top_k >= 1], got shape {ids_view.shape}")
    check_shape(ENTRY, "topk_weights", weights_view, ids_view.shape)
    num_experts, map_view = _routed_experts(ENTRY, w13, expert_map)
    if top_k > num_experts:
        fail(f"{ENTRY}: top_k={top_k} must be <= the {num_experts} routed experts")
    if w13.kind == "mxfp4" and top_k > w13.num_experts:
        # The MXFP4 entry point's contract bounds top_k by the experts it holds.
        fail(f"{ENTRY}: MXFP4 needs top_k={top_k} <= the {w13.num_experts} experts of w13")
    defaulted = block_size is None

    def check_capacity(block: int) -> None:
        if align_capacity(m, top_k, num_experts, block)[0] > I32_MAX:
            fail(f"{ENTRY}: M * top_k = {m * top_k} routed rows do not fit the kernels' int32 row ids")

    if defaulted:
        block_size = default_block_size(max(m, 1), top_k, num_experts)
    check_capacity(int(block_size))
    device = device_of(w13.qweight, as_device_array(w13.qweight, "w13.qweight"))
    _on(ENTRY, "w2", w2.qweight, as_device_array(w2.qweight, "w2.qweight"), device)
    _on(ENTRY, "hidden", hidden, hidden_view, device)
    _on(ENTRY, "topk_ids", topk_ids, ids_view, device)
    _on(ENTRY, "topk_weights", topk_weights, weights_view, device)
    if map_view is not None:
        _on(ENTRY, "expert_map", expert_map, map_view, device)
    if defaulted:
        # The device decides last (a device query): Hopper's warp-specialised
        # kernel takes taller blocks.
        block_size = default_block_size(max(m, 1), top_k, num_experts, tall_blocks_warp_specialised(device, w13, w2))
        check_capacity(block_size)
    return _Call(m=m, top_k=top_k, num_experts=num_experts, block_size=int(block_size), device=device,
                 hidden=hidden_view, topk_weights=weights_view, topk_ids=ids_view, expert_map=map_view)


def _output(out: Any, hidden: Any, call: _Call, n: int, dtype: np.dtype) -> tuple[Any, DeviceArray]:
    """``out [M, n]``, checked (16-byte aligned: with top_k = 1 the down GEMM
    writes it), or a new array in ``hidden``'s library."""
    if out is None:
        out = allocate(hidden, call.hidden, (call.m, n), dtype, call.device)
        return out, as_device_array(out, "out")
    view = as_device_array(out, "out")
    check_array(ENTRY, "out", view, dtype, ndim=2)
    check_shape(ENTRY, "out", view, (call.m, n))
    if view.readonly:
        fail(f"{ENTRY}: out is read-only")
    _on(ENTRY, "out", out, view, call.device)
    return out, view


# ---- plans: the validated native calls of a layer, kept ---------------------------------

# Where the caller's values go among the native arguments (prototype order,
# _native.PROTOTYPES; the ``*_call`` builders name these positions) ...
_GEMM_A, _GEMM_C, _GEMM_EXPERT_IDS, _GEMM_TOPK_WEIGHTS = 0, 2, 8, 10  # both fused-MoE GEMM signatures
_GEMM_CLEAR = -3  # the _ex variants: add_rows_div, clear, clear_bytes, routing_flags come last
_ALIGN_TOPK_IDS, _ALIGN_EXPERT_MAP = 0, 5
_SWIGLU_ALPHA, _SWIGLU_LIMIT = 5, 6
_SUM_OUT = 1
_MEMSET_PTR = 0
# ... and the per-call values that fill them, indices into the tuple Plan.run takes.
_HIDDEN, _TOPK_IDS, _TOPK_WEIGHTS, _EXPERT_MAP, _OUT, _ALPHA, _LIMIT = range(7)

# (function, arguments, slots: (argument position, value index), entry point, shape)
_Step = tuple[Callable[..., int], tuple, tuple[tuple[int, int], ...], str, "dict | None"]


@dataclass(frozen=True, eq=False)
class _Plan:
    """The native calls of one layer signature on one stream, built after
    every rule of every call passed: each call's function (looked up once),
    its arguments with the caller's values to fill in per call, and what a
    NativeError reports. ``scratch`` holds the buffers the arguments name, so
    that they live as long as the plan (even when another thread replaces
    them meanwhile)."""

    steps: tuple[_Step, ...]
    scratch: tuple[Any, ...]
    # Direct routing: the memset that restores the zero-kept gate/up output
    # when a step fails (the down GEMM that clears it may not run).
    restore: NativeCall | None = None

    def run(self, lib: Any, values: tuple) -> None:
        for function, args, slots, entry, shape in self.steps:
            if slots:
                args = list(args)
                for position, value in slots:
                    args[position] = values[value]
            code = function(*args)
            if code:
                if self.restore is not None:
                    getattr(lib, self.restore.entry)(*self.restore.args)
                lib.check(entry, code, shape)


@dataclass(frozen=True, eq=False)
class _Signature:
    """A layer signature that passed :func:`_check_call`: kept per ``w13``
    under the key of :func:`_signature_key`, with ``w2`` (held weakly: the
    key has its id only), the library its plans call, what the rules
    resolved (device, block size, activation dtype) and the plans per stream
    handle and mode (``adds_out``: whether ``out`` may be zeroed and added
    into; never changed once kept: a new stream's or mode's plan makes a new
    entry)."""

    w2: weakref.ref
    lib: Any
    device: int
    block_size: int
    dtype: np.dtype
    plans: Mapping[tuple[int, bool], _Plan]  # by (stream handle, adds_out)


def _plain_options(activation: Any, block_size: Any, fp32_reduce: Any, alpha: Any, limit: Any) -> bool:
    """Options of the exact built-in types that pass the activation and option
    rules, the only ones a signature is kept for (the rules accept more, e.g.
    NumPy scalars: those calls are checked in full every time)."""
    return (type(activation) is str and activation in ACTIVATIONS
            and (block_size is None or (type(block_size) is int and block_size in MOE_BLOCK_SIZES))
            and type(fp32_reduce) is bool
            and type(alpha) is float and alpha == alpha  # not NaN
            and type(limit) is float and limit >= 0)


def _signature_key(w2: MarlinMoeWeight, activation: str, block_size: int | None, fp32_reduce: bool, m: int,
                   top_k: int, expert_map: DeviceArray | None) -> tuple:
    """Everything the rules of a call depend on but ``w13`` (the owner of the
    entry) and the caller's arrays (checked every call)."""
    return (id(w2), activation, block_size, fp32_reduce, m, top_k,
            None if expert_map is None else expert_map.shape[0])


def _fits(view: DeviceArray, dtype: np.dtype, shape: tuple[int, ...], alignment: int) -> bool:
    """What every call of a plan requires of a caller's array: its dtype and
    shape, C order, and a non-null pointer, aligned, whose span stays an
    address (the launch rules' u64 range)."""
    ptr = view.ptr
    return (view.dtype == dtype and view.shape == shape and view.is_c_contiguous and 0 < ptr
            and ptr % alignment == 0 and ptr + view.nbytes - 1 <= U64_MAX)


def _known_call(hidden: Any, w13: Any, w2: Any, topk_weights: Any, topk_ids: Any, activation: Any, expert_map: Any,
                block_size: Any, fp32_reduce: Any, alpha: Any, limit: Any) -> tuple[_Call, _Signature] | None:
    """The :class:`_Call` that :func:`_check_call` would return, without its
    work, when the layer signature passed it before (the same weight objects:
    a weight's buffers never change) and the caller's arrays meet everything
    the calls of a plan require of them; else None. Never raises: a call it
    cannot vouch for goes to :func:`_check_call`, which raises in the rules'
    order."""
    if type(w13) is not MarlinMoeWeight or not _plain_options(activation, block_size, fp32_reduce, alpha, limit):
        return None
    signatures = plans_of(w13)
    if signatures is None:
        return None
    # Reading an argument runs the caller's code (properties, DLPack exports):
    # whatever it raises, the validating path raises again in the rules' order.
    try:
        hidden_view = as_device_array(hidden, "hidden")
        ids_view = as_device_array(topk_ids, "topk_ids")
        weights_view = as_device_array(topk_weights, "topk_weights")
        map_view = None if expert_map is None else as_device_array(expert_map, "expert_map")
    except Exception:
        return None
    if len(ids_view.shape) != 2 or (map_view is not None and len(map_view.shape) != 1):
        return None
    m, top_k = ids_view.shape
    signature = signatures.get(_signature_key(w2, activation, block_size, fp32_reduce, m, top_k, map_view))
    if signature is None or signature.w2() is not w2 or signature.lib is not library():
        return None
    if not (_fits(hidden_view, signature.dtype, (m, w13.k), 16) and _fits(ids_view, _INT32, (m, top_k), 4)
            and _fits(weights_view, _FLOAT32, (m, top_k), 4)
            and (map_view is None or _fits(map_view, _INT32, map_view.shape, 4))):
        return None
    device = signature.device
    try:
        if (device_of(hidden, hidden_view) != device or device_of(topk_ids, ids_view) != device
                or device_of(topk_weights, weights_view) != device
                or (map_view is not None and device_of(expert_map, map_view) != device)):
            return None
    except Exception:  # a failed device query: raised again by the validating path
        return None
    experts = w13.num_experts if map_view is None else map_view.shape[0]
    return _Call(m=m, top_k=top_k, num_experts=experts, block_size=signature.block_size, device=device,
                 hidden=hidden_view, topk_weights=weights_view, topk_ids=ids_view, expert_map=map_view), signature


def _adds_out(call: _Call, fp32_reduce: bool, out: DeviceArray) -> bool:
    """Atomic mode: the gate/up GEMM zeroes ``out`` and the down GEMM adds each
    token's rows into it (no moe_sum) -- unless ``out`` shares memory with an
    input, which the zeroing would destroy before it is read."""
    if fp32_reduce:
        return False
    start = out.ptr
    end = start + out.nbytes
    for v in (call.hidden, call.topk_weights, call.topk_ids, call.expert_map):
        if v is not None and v.ptr < end and start < v.ptr + v.nbytes:
            return False
    return True


def _out_fits(out: Any, view: DeviceArray, call: _Call, n: int, dtype: np.dtype, adds_out: bool) -> bool:
    """What the calls of a plan require of ``out`` (given or allocated): the
    down GEMM writes it in 16-byte vectors (with top_k = 1, or adding rows),
    moe_sum in elements."""
    alignment = 16 if call.top_k == 1 or adds_out else dtype.itemsize
    try:
        return (_fits(view, dtype, (call.m, n), alignment) and not view.readonly
                and device_of(out, view) == call.device)
    except Exception:  # a failed device query: raised again by the launchers' checks
        return False


def _step(lib: Any, call: NativeCall, *slots: tuple[int, int]) -> _Step:
    function = getattr(lib, call.entry)
    return function, _declared_args(function, call.args), slots, call.entry, call.shape


def _declared_args(function: Any, args: tuple) -> tuple:
    """``args`` as instances of the function's declared ctypes types, made
    once per plan: ctypes passes its own instances as they are, so a replay
    converts only the values it fills in (a 25-argument launch spent ~1.4 µs
    more converting Python ints). Unchanged where the function declares no
    such types (test stubs) or a value does not convert."""
    argtypes = getattr(function, "argtypes", None)
    if not argtypes or len(argtypes) != len(args):
        return args
    try:
        return tuple(arg if isinstance(arg, kind) else kind(arg) for kind, arg in zip(argtypes, args))
    except (TypeError, ValueError):
        return args


def _plan(hidden: Any, w13: MarlinMoeWeight, w2: MarlinMoeWeight, topk_weights: Any, topk_ids: Any, call: _Call,
          activation: str, expert_map: Any, fp32_reduce: bool, alpha: float, limit: float, out: Any,
          out_view: DeviceArray, handle: int, lib: Any) -> _Plan:
    """Every rule of every call of the layer (the launchers' own checks, on
    this call's arrays and the scratch), then their plan on ``handle``."""
    rows, device, dtype = call.rows, call.device, w13.activation_dtype
    sms = device_sm_count(device)
    # One fp32 c_tmp serves both GEMMs (they run one after the other on the stream).
    c_tmp_floats = max(rows * max(w13.n, w2.n), moe_c_tmp_floats(call.block_size, sms)) if fp32_reduce else 0
    shared = scratch_for(device, handle, hidden, workspace_bytes=4 * moe_workspace_ints(sms),
                         c_tmp_bytes=4 * c_tmp_floats)
    adds_out = _adds_out(call, fp32_reduce, out_view)
    direct = (adds_out and call.expert_map is None and call.block_size == 8
              and direct_routing_pays(call.m, call.top_k, call.num_experts, w13.expert_bytes + w2.expert_bytes))

    def buffer(name: str, shape: tuple[int, ...], kind: np.dtype, zeroed: bool = False) -> Any:
        return shaped(scratch_array(device, handle, hidden, f"fused_moe.{name}", math.prod(shape), kind, zeroed),
                      shape)

    if direct:
        # No align kernel: routed row t is slab t of expert topk_ids[t] (the
        # caller's array, filled in per call). The gate/up output lives in a
        # buffer kept zero between calls: the down GEMM clears it once the
        # activation has read it.
        routing = (None, topk_ids, None)
        gemm_rows = buffer("gate_up_zeroed", (rows * w13.n,), dtype, zeroed=True)
    else:
        sorted_capacity, blocks = align_capacity(call.m, call.top_k, call.num_experts, call.block_size)
        routing = (buffer("sorted_token_ids", (sorted_capacity,), _INT32), buffer("expert_ids", (blocks,), _INT32),
                   buffer("num_tokens_post_padded", (1,), _INT32))
        # The gate/up output is dead once activated, so the down output reuses its storage.
        gemm_rows = scratch_array(device, handle, hidden, "fused_moe.gemm_out", rows * max(w13.n, w2.n), dtype)
    gate_up = shaped(gemm_rows, (rows, w13.n))
    activated = buffer("activated", (rows, w2.k), dtype)
    workspace = shared.workspace.array
    c_tmp = shared.c_tmp.array if fp32_reduce else None
    is_ep = call.expert_map is not None
    # The down GEMM's routing was written two kernels before it (by align, or
    # by the router): it reads it and prefetches its first weights while the
    # activation runs.
    # Atomic mode: align (direct routing: the previous call's down GEMM) zeroes
    # the gate/up output and the gate/up GEMM out, and each GEMM adds its
    # partials (the down GEMM every routed row, times its top-k weight, into its
    # token's row of out): no locks, no moe_sum; rows of other ranks' experts add
    # nothing. fp32 reduce keeps the fixed order: rows through gemm_rows, then
    # moe_sum (with top_k = 1 the down GEMM stores out directly).
    top1 = call.top_k == 1
    down_writes_out = top1 or adds_out
    down = out if down_writes_out else shaped(gemm_rows, (rows, w2.n))
    writes_out = ((_GEMM_C, _OUT),) if down_writes_out else ()
    ids_slot = ((_GEMM_EXPERT_IDS, _TOPK_IDS),) if direct else ()

    gemm_common = dict(routing=routing, workspace=workspace, c_tmp=c_tmp, block_size=call.block_size, is_ep=is_ep,
                       stream=handle, direct_routing=direct)
    steps = [] if direct else [
        _step(lib, align_call(topk_ids, call.num_experts, call.block_size, expert_map, routing, handle,
                              clear=as_device_array(gate_up, "gate_up") if adds_out else None)[1],
              (_ALIGN_TOPK_IDS, _TOPK_IDS), *(((_ALIGN_EXPERT_MAP, _EXPERT_MAP),) if is_ep else ())),
    ]
    steps.append(
        _step(lib, _gemm(w13, a=hidden, c=gate_up, prob_m=call.m, top_k=call.top_k,
                         add_rows_div=1 if adds_out else 0, clear=out if adds_out else None, **gemm_common),
              (_GEMM_A, _HIDDEN), *ids_slot, *(((_GEMM_CLEAR, _OUT),) if adds_out else ())))
    if activation == "silu":
        steps.append(_step(lib, silu_and_mul_call(gate_up, activated, handle)[1]))
    else:
        steps.append(_step(lib, gpt_oss_swiglu_call(gate_up, w2.k, alpha, limit, activated, handle)[1],
                           (_SWIGLU_ALPHA, _ALPHA), (_SWIGLU_LIMIT, _LIMIT)))
    if is_ep and not adds_out:
        # Rows routed to other ranks' experts are skipped by the GEMM and must
        # add zero; zeroed only now, as ``down`` may share gate_up's storage.
        down_view = out_view if top1 else as_device_array(down, "down")
        zero = NativeCall("ferrum_marlin_memset_async", (down_view.ptr, 0, down_view.nbytes, handle))
        steps.append(_step(lib, zero, *(((_MEMSET_PTR, _OUT),) if top1 else ())))
    steps.append(_step(lib, _gemm(w2, a=activated, c=down, prob_m=rows, top_k=1, topk_weights=topk_weights,
                                  add_rows_div=call.top_k if adds_out else 0, routing_settled=True,
                                  clear=gate_up if direct else None, **gemm_common),
                       (_GEMM_TOPK_WEIGHTS, _TOPK_WEIGHTS), *ids_slot, *writes_out))
    if not down_writes_out:
        steps.append(_step(lib, moe_sum_call(down, call.top_k, out, handle)[1], (_SUM_OUT, _OUT)))
    restore = None
    if direct:
        gate_up_view = as_device_array(gate_up, "gate_up")
        restore = NativeCall("ferrum_marlin_memset_async", (gate_up_view.ptr, 0, gate_up_view.nbytes, handle))
    scratch = (workspace, c_tmp, gemm_rows, activated) + (() if direct else routing)
    return _Plan(steps=tuple(steps), scratch=scratch, restore=restore)


# Expected bytes that direct routing may stream twice (experts that several
# tokens share) for the align kernel it saves: about 3 us of the read on the
# H200, what align costs a decode step's chain.
DIRECT_ROUTING_MAX_REPEAT_BYTES = 10 << 20


def direct_routing_pays(m: int, top_k: int, experts: int, expert_bytes: int) -> bool:
    """Whether a layer of ``m`` tokens skips the align kernel (direct routing,
    FERRUM_MOE_ROUTING_DIRECT: every routed row streams its expert's weights,
    ``expert_bytes`` for both projections). One token always: its top_k rows
    name distinct experts. More tokens when a uniform router's expected
    repeats -- ``m * top_k`` rows against ``E * (1 - (1 - top_k / E) ** m)``
    distinct experts -- stream at most DIRECT_ROUTING_MAX_REPEAT_BYTES again.
    H200, fused_moe with and without (µs): Qwen3-30B-A3B-like (E = 128, top-8,
    2.4 MB an expert) M = 1..4 25.5 / 33.1 / 41.5 / 44.5 against 21.3 / 28.7 /
    36.9 / 41.1 (M = 4 with four repeats); GPT-OSS-20B-like (E = 32, top-4,
    13 MB) M = 1, 2 41.8 / 62.9 against 37.7 / 59.8, M = 4 86.6 against 93.8
    (three repeats: 40 MB more)."""
    if m == 1:
        return True
    rows = m * top_k
    distinct = experts * (1.0 - (1.0 - top_k / experts) ** m)
    return (rows - distinct) * expert_bytes <= DIRECT_ROUTING_MAX_REPEAT_BYTES


def _gemm(weight: MarlinMoeWeight, *, a: Any, c: Any, routing: tuple[Any, Any, Any], workspace: Any,
          c_tmp: Any, prob_m: int, top_k: int, block_size: int, is_ep: bool, stream: int,
          topk_weights: Any = None, add_rows_div: int = 0, clear: Any = None,
          routing_settled: bool = False, direct_routing: bool = False) -> NativeCall:
    """The checked call of one fused-MoE GEMM of ``weight``'s kind;
    ``topk_weights`` given: rows scaled by them; ``add_rows_div``, ``clear``,
    ``routing_settled`` and ``direct_routing`` as
    :func:`~ferrum_ffi.moe.launch_marlin_moe` has them."""
    sorted_ids, expert_ids, count = routing
    common = dict(
        a=a, b=weight.qweight, c=c, scales=weight.scales, workspace=workspace, sorted_token_ids=sorted_ids,
        expert_ids=expert_ids, num_tokens_past_padded=count, prob_m=prob_m, prob_n=weight.n, prob_k=weight.k,
        top_k=top_k, moe_block_size=block_size, group_size=weight.group_size, c_tmp=c_tmp,
        topk_weights=topk_weights, mul_topk_weights=topk_weights is not None, is_ep=is_ep,
        use_fp32_reduce=c_tmp is not None, expert_count=weight.num_experts, device=None, stream=stream, spans=None,
        add_rows_div=add_rows_div, clear=clear, routing_settled=routing_settled, direct_routing=direct_routing,
    )
    if weight.kind == "mxfp4":
        return marlin_moe_mxfp4_bf16_call(bias=weight.bias, **common)
    weight_type = MoeF16WeightType.E4M3 if weight.kind == "fe4m3fn" else MoeF16WeightType.U4B8
    return marlin_moe_call(weight_type=weight_type, zero_points=weight.zero_points, **common)


# ---- the layer ---------------------------------------------------------------------------


def fused_moe(
    hidden: Any,
    w13: MarlinMoeWeight,
    w2: MarlinMoeWeight,
    topk_weights: Any,
    topk_ids: Any,
    *,
    activation: str = "silu",
    expert_map: Any = None,
    block_size: int | None = None,
    fp32_reduce: bool = False,
    alpha: float = 1.702,
    limit: float = 7.0,
    out: Any = None,
    stream: Any = None,
) -> Any:
    """One MoE layer: ``out[m] = sum over slots j of topk_weights[m, j] *
    (act(hidden[m] @ W13[e] + b13[e]) @ W2[e] + b2[e])`` with ``e =
    topk_ids[m, j]`` (biases: MXFP4 only).

    ``hidden``: ``[M, w13.k]`` of the weights' activation dtype (float16 for
    ``u4b8``/``u4``/``fe4m3fn``, bfloat16 for ``mxfp4``), C-contiguous,
    16-byte aligned; a K that MXFP4 pads (``w13.k > w13.logical_k``) is
    passed padded, with finite (best: zero) padding. ``w13``: the gate/up
    projection, ``n = 2 * I``; ``w2``: the down projection, ``n = H =
    w13.logical_k``, ``k = I`` (``logical_k = I`` when MXFP4 pads it). Both
    must be on the device (:meth:`MarlinMoeWeight.to_device`).
    ``topk_weights`` float32 / ``topk_ids`` int32, ``[M, top_k]``, as
    :func:`route` gives them; ids must lie in ``[0, experts)`` (an id outside
    leaves its row undefined; the kernels cannot report it).

    ``activation``: ``"silu"`` (gate = first ``I`` columns of the gate/up
    output, up = the rest) or ``"gpt_oss_swiglu"`` (interleaved pairs, ``g =
    min(gate, limit)``, ``u = clamp(up, -limit, limit)``, ``(u + 1) * g *
    sigmoid(alpha * g)``, zero-padded to ``w2.k``). ``expert_map``: int32
    ``[global experts]`` -> local id or -1 (expert parallelism: the weights
    hold this rank's experts, the ids are global; other ranks' experts add
    nothing here). ``block_size``: routing block (8, 16, 32, 48, 64), default
    :func:`default_block_size`. ``fp32_reduce``: split-K partials summed in
    fp32 in a fixed order (bitwise reproducible) instead of atomics.

    The intermediates are rounded to the activation dtype between the
    kernels; ``out`` ``[M, H]`` (allocated in ``hidden``'s library when
    omitted) gets the sum of the weighted rows: added into it by the down
    GEMM with 16-bit atomics in no fixed order (``out`` is zeroed by the
    gate/up GEMM: when it shares memory with ``hidden`` or the routing arrays
    the rows are summed by a separate kernel instead; it must never share
    memory with the weights), or with ``fp32_reduce`` summed in fp32 in a
    fixed order (bitwise reproducible). Never synchronises.

    Repeated calls of one signature cost little host time (module doc) when
    the options have the built-in types (``activation`` a str,
    ``block_size`` None or an int, ``fp32_reduce`` a bool, ``alpha`` and
    ``limit`` floats); a weight's buffers must not be changed in place once
    it ran (make a new weight instead).
    """
    known = _known_call(hidden, w13, w2, topk_weights, topk_ids, activation, expert_map, block_size, fp32_reduce,
                        alpha, limit)
    if known is None:
        call = _check_call(hidden, w13, w2, topk_weights, topk_ids, activation, expert_map, block_size,
                           fp32_reduce, alpha, limit)
        signature = None
    else:
        call, signature = known
    dtype = w13.activation_dtype if signature is None else signature.dtype
    out, out_view = _output(out, hidden, call, w2.n, dtype)
    if call.m == 0:
        return out
    views = [call.hidden, call.topk_weights, call.topk_ids, out_view]
    if call.expert_map is not None:
        views.append(call.expert_map)
    handle = prepare_stream(stream, views)
    adds_out = _adds_out(call, fp32_reduce, out_view)
    plan = None if signature is None else signature.plans.get((handle, adds_out))
    if plan is None or not _out_fits(out, out_view, call, w2.n, dtype, adds_out):
        generation = plan_generation()  # read before the plan fetches any scratch buffer
        lib = library()
        plan = _plan(hidden, w13, w2, topk_weights, topk_ids, call, activation, expert_map, fp32_reduce, alpha,
                     limit, out, out_view, handle, lib)
        if type(w13) is MarlinMoeWeight and _plain_options(activation, block_size, fp32_reduce, alpha, limit):
            key = _signature_key(w2, activation, block_size, fp32_reduce, call.m, call.top_k, call.expert_map)
            kept = (plans_of(w13) or {}).get(key)
            plans = dict(kept.plans) if kept is not None and kept.w2() is w2 and kept.lib is lib else {}
            plans[(handle, adds_out)] = plan
            signature = _Signature(w2=weakref.ref(w2), lib=lib, device=call.device, block_size=call.block_size,
                                   dtype=dtype, plans=plans)
            keep_plan(w13, key, signature, generation)
    else:
        lib = signature.lib
    plan.run(lib, (call.hidden.ptr, call.topk_ids.ptr, call.topk_weights.ptr,
                   None if call.expert_map is None else call.expert_map.ptr, out_view.ptr, float(alpha), float(limit)))
    return out


# ---- routing and the layer object ----------------------------------------------------------


def route(logits: Any, top_k: int, renormalize: bool = True, stream: Any = None, *,
          out: tuple[Any, Any] | None = None) -> tuple[Any, Any]:
    """The router: softmax of ``logits [M, experts]`` (float16, bfloat16 or
    float32) and its ``top_k`` largest entries -> ``(topk_weights float32,
    topk_ids int32)``, ``[M, top_k]``, largest first (ties: lower id);
    ``renormalize`` makes each token's weights sum to 1. See
    :func:`~ferrum_ffi.moe_ops.topk_softmax`; ``out`` may give both arrays."""
    return topk_softmax(logits, top_k, renormalize, out=out, stream=stream)


@dataclass(frozen=True, eq=False)
class FusedMoE:
    """A MoE layer usable from router logits: ``layer(hidden, logits)`` runs
    :func:`route` then :func:`fused_moe` with the fields below (their meaning
    is :func:`fused_moe`'s). ``logits``: ``[M, experts]``, ``experts`` being
    the global count with an ``expert_map``."""

    w13: MarlinMoeWeight
    w2: MarlinMoeWeight
    top_k: int
    activation: str = "silu"
    renormalize: bool = True
    expert_map: Any = None
    block_size: int | None = None
    fp32_reduce: bool = False
    alpha: float = 1.702
    limit: float = 7.0

    def __post_init__(self) -> None:
        entry = "FusedMoE"
        _check_weights(entry, self.w13, self.w2, self.activation)
        _check_options(entry, self.block_size, self.fp32_reduce, self.alpha, self.limit)
        _check_bool(entry, "renormalize", self.renormalize)
        if isinstance(self.top_k, (bool, np.bool_)) or not isinstance(self.top_k, (int, np.integer)):
            raise ArgumentTypeError(f"{entry}: top_k must be an integer, got {type(self.top_k).__name__}")
        experts = _routed_experts(entry, self.w13, self.expert_map)[0]
        if not 1 <= self.top_k <= experts:
            fail(f"{entry}: top_k={self.top_k} must be in 1..{experts} (the routed experts)")

    @property
    def num_experts(self) -> int:
        """The router's expert count (global with an ``expert_map``)."""
        return _routed_experts("FusedMoE", self.w13, self.expert_map)[0]

    def __call__(self, hidden: Any, router_logits: Any, *, out: Any = None, stream: Any = None) -> Any:
        """``[M, H]`` output of ``hidden [M, w13.k]`` routed by ``router_logits [M, experts]``."""
        # hidden and the logits are checked before the router runs; the rest by fused_moe.
        m = _check_hidden("FusedMoE", hidden, self.w13).shape[0]
        logits = as_device_array(router_logits, "router_logits")
        if logits.shape != (m, self.num_experts):
            fail(f"FusedMoE: router_logits must be [M={m}, {self.num_experts}], got shape {logits.shape}")
        topk_weights, topk_ids = route(router_logits, self.top_k, self.renormalize, stream=stream)
        return fused_moe(hidden, self.w13, self.w2, topk_weights, topk_ids, activation=self.activation,
                         expert_map=self.expert_map, block_size=self.block_size, fp32_reduce=self.fp32_reduce,
                         alpha=self.alpha, limit=self.limit, out=out, stream=stream)
