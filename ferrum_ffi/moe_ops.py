"""The MoE routing and the small ops of a MoE layer, on device arrays.

``topk_softmax`` (router) -> ``moe_align_block_size`` (block-aligned routing
for the MoE GEMMs) -> GEMM -> ``silu_and_mul`` or ``gpt_oss_swiglu`` -> GEMM ->
``moe_sum``. Each function reads its arrays and the stream (``_interop``),
checks every rule of the header section "MoE routing and the small ops of a
MoE layer" before the native call (:class:`~ferrum_ffi.status.ArgumentError`
/ :class:`~ferrum_ffi.status.ArgumentTypeError`), allocates an omitted output
in the input's array library, and makes one native call on the stream, whose
status becomes a :class:`~ferrum_ffi.status.NativeError`. Nothing
synchronises; with every output given nothing is allocated, so the calls can
be captured in CUDA graphs. Inputs and outputs must not overlap.

The ops of a MoE layer also exist as ``*_call`` functions: the same rules,
allocations and stream preparation, returning the
:class:`~ferrum_ffi._native.NativeCall` instead of making it, for
``fused_moe`` to check every step of a layer before the first native call and
keep the validated calls.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

import numpy as np

from ._abi import FERRUM_DTYPE_BF16, FERRUM_DTYPE_F16, FERRUM_DTYPE_F32
from ._devices import allocate, device_of, is_bfloat16, prepare_stream
from ._interop import DeviceArray, as_device_array
from ._native import NativeCall, library
from .status import ArgumentTypeError
from .validation import I32_MAX, check_array, check_int, check_shape, fail

__all__ = [
    "MAX_EXPERTS",
    "align_capacity",
    "gpt_oss_swiglu",
    "moe_align_block_size",
    "moe_sum",
    "silu_and_mul",
    "topk_softmax",
]

# The native routing kernels hold at most 1024 experts (one thread each in the
# align kernel, 32 logits per lane of a router warp).
MAX_EXPERTS = 1024
_INT32 = np.dtype(np.int32)
_FLOAT32 = np.dtype(np.float32)


# ---- shared rules -------------------------------------------------------------------


def _dtype_id(entry: str, name: str, view: DeviceArray, allow_f32: bool = False) -> int:
    if view.dtype == np.float16:
        return FERRUM_DTYPE_F16
    if is_bfloat16(view.dtype):
        return FERRUM_DTYPE_BF16
    if allow_f32 and view.dtype == np.float32:
        return FERRUM_DTYPE_F32
    allowed = "float16, bfloat16 or float32" if allow_f32 else "float16 or bfloat16"
    raise ArgumentTypeError(f"{entry}: {name} must have dtype {allowed}, got {view.dtype}")


def _input(entry: str, name: str, obj: Any, allow_f32: bool = False) -> tuple[DeviceArray, int]:
    """A C-contiguous, element-aligned, non-empty activation array and its dtype id."""
    view = as_device_array(obj, name)
    dtype = _dtype_id(entry, name, view, allow_f32)
    check_array(entry, name, view, view.dtype, alignment=view.itemsize)
    if view.ndim == 0:
        fail(f"{entry}: {name} must have at least one dimension, got a scalar")
    if view.size == 0:
        fail(f"{entry}: {name} must not be empty (shape {view.shape})")
    return view, dtype


def _positive(entry: str, name: str, value: object) -> int:
    value = check_int(entry, name, value)
    if value < 1:
        fail(f"{entry}: {name}={value} must be >= 1")
    return value


def _int32_extent(entry: str, name: str, value: int) -> int:
    if value > I32_MAX:
        fail(f"{entry}: {name}={value} does not fit in int32")
    return value


def _output(entry: str, name: str, out: Any, like: Any, like_view: DeviceArray,
            shape: tuple[int, ...], dtype: np.dtype, device: int) -> tuple[Any, DeviceArray]:
    """``out`` checked against ``shape``/``dtype``/``device``, or a new array in
    ``like``'s library."""
    if out is None:
        array = allocate(like, like_view, shape, dtype, device)
        return array, as_device_array(array, name)
    view = as_device_array(out, name)
    check_array(entry, name, view, dtype, alignment=dtype.itemsize)
    check_shape(entry, name, view, shape)
    _writable_on(entry, name, out, view, device)
    return out, view


def _writable_on(entry: str, name: str, obj: Any, view: DeviceArray, device: int) -> None:
    if view.readonly:
        fail(f"{entry}: {name} is read-only")
    _on_device(entry, name, obj, view, device)


def _on_device(entry: str, name: str, obj: Any, view: DeviceArray, device: int) -> None:
    where = device_of(obj, view)
    if where != device:
        fail(f"{entry}: {name} is on device {where}, the input on device {device}")


def _dtype_name(dtype: int) -> str:
    return {FERRUM_DTYPE_F16: "F16", FERRUM_DTYPE_BF16: "BF16", FERRUM_DTYPE_F32: "F32"}[dtype]


# ---- routing -------------------------------------------------------------------------

_ALIGN_OUTPUTS = ("sorted_token_ids", "expert_ids", "num_tokens_post_padded")


def align_capacity(num_tokens: int, top_k: int, num_experts: int, block_size: int) -> tuple[int, int]:
    """(sorted_token_ids entries, expert_ids entries) the align kernel needs:
    every routed id plus at most ``block_size - 1`` padding slots per expert,
    and one expert id per block of that."""
    sorted_capacity = num_tokens * top_k + num_experts * (block_size - 1)
    return sorted_capacity, -(-sorted_capacity // block_size)


def moe_align_block_size(
    topk_ids: Any,
    num_experts: int,
    block_size: int,
    expert_map: Any = None,
    *,
    out: tuple[Any, Any, Any] | None = None,
    stream: Any = None,
) -> tuple[Any, Any, Any]:
    """Block-aligned routing for the MoE GEMMs (vLLM's ``moe_align_block_size``,
    deterministic): ``(sorted_token_ids, expert_ids, num_tokens_post_padded)``.

    ``topk_ids``: int32 ``[num_tokens, top_k]``. ``sorted_token_ids`` holds, expert
    by expert, the ids ``t = token * top_k + slot`` routed to it in ascending
    order, padded with ``num_tokens * top_k`` to a multiple of ``block_size``;
    ``expert_ids[j]`` is the expert of block ``j`` (``expert_map[e]`` when a
    global -> local int32 ``[num_experts]`` map is given), -1 past the used
    blocks; ``num_tokens_post_padded[0]`` counts the entries in use. Ids outside
    ``[0, num_experts)`` are dropped. Outputs are int32, allocated with
    :func:`align_capacity` entries unless ``out`` gives three 1-D int32 arrays
    of at least those sizes (and ``[1]``); every entry of them is written.
    """
    out, call = align_call(topk_ids, num_experts, block_size, expert_map, out, stream)
    call.run(library())
    return out


def align_call(topk_ids: Any, num_experts: int, block_size: int, expert_map: Any, out: tuple[Any, Any, Any] | None,
               stream: Any, clear: DeviceArray | None = None) -> tuple[tuple[Any, Any, Any], NativeCall]:
    """:func:`moe_align_block_size` up to its native call: the outputs and the
    checked call (``topk_ids`` first, ``expert_map`` sixth among its arguments).
    ``clear``: a buffer the launch also zeroes (``ferrum_moe_align_block_size_ex``,
    its last two arguments): 16-byte aligned, a multiple of 16 bytes, writable,
    disjoint from the routing arrays (the caller keeps it on their device)."""
    entry = "moe_align_block_size"
    ids_view = as_device_array(topk_ids, "topk_ids")
    check_array(entry, "topk_ids", ids_view, _INT32, ndim=2, alignment=4)
    num_tokens, top_k = ids_view.shape
    if num_tokens < 1 or top_k < 1:
        fail(f"{entry}: topk_ids must be [num_tokens >= 1, top_k >= 1], got shape {ids_view.shape}")
    num_experts = _positive(entry, "num_experts", num_experts)
    if num_experts > MAX_EXPERTS:
        fail(f"{entry}: num_experts={num_experts} exceeds the {MAX_EXPERTS} experts the kernel holds")
    block_size = _positive(entry, "block_size", block_size)
    _int32_extent(entry, "num_tokens * top_k", num_tokens * top_k)
    sorted_capacity, blocks = align_capacity(num_tokens, top_k, num_experts, block_size)
    _int32_extent(entry, "num_tokens * top_k + num_experts * (block_size - 1)", sorted_capacity)
    device = device_of(topk_ids, ids_view)
    views = [ids_view]
    map_ptr = None
    if expert_map is not None:
        map_view = as_device_array(expert_map, "expert_map")
        check_array(entry, "expert_map", map_view, _INT32, ndim=1, alignment=4)
        check_shape(entry, "expert_map", map_view, (num_experts,))
        _on_device(entry, "expert_map", expert_map, map_view, device)
        views.append(map_view)
        map_ptr = map_view.ptr
    if out is None:
        out = tuple(allocate(topk_ids, ids_view, (n,), _INT32, device) for n in (sorted_capacity, blocks, 1))
        out_views = [as_device_array(array, name) for array, name in zip(out, _ALIGN_OUTPUTS)]
    else:
        out_views = _align_outputs(entry, out, device, (sorted_capacity, blocks))
    sorted_view, expert_view, count_view = out_views
    views += out_views
    extra: tuple = ()
    if clear is not None:
        _check_clear(entry, clear, views)
        extra = (clear.ptr, clear.nbytes)
    handle = prepare_stream(stream, views)
    return tuple(out), NativeCall("ferrum_moe_align_block_size" + ("_ex" if extra else ""), (
        ids_view.ptr, num_tokens, top_k, num_experts, block_size, map_ptr,
        sorted_view.ptr, sorted_view.size, expert_view.ptr, expert_view.size, count_view.ptr,
        device, handle, *extra,
    ), {"num_tokens": num_tokens, "top_k": top_k, "num_experts": num_experts, "block_size": block_size})


def _check_clear(entry: str, clear: DeviceArray, views: list[DeviceArray]) -> None:
    if clear.ptr % 16 or clear.nbytes % 16 or clear.nbytes == 0:
        fail(f"{entry}: clear must be 16-byte aligned and a positive multiple of 16 bytes, got {clear.nbytes} "
             f"bytes at {clear.ptr:#x}")
    if clear.readonly:
        fail(f"{entry}: clear is read-only")
    for view in views:
        if view.nbytes and clear.ptr < view.ptr + view.nbytes and view.ptr < clear.ptr + clear.nbytes:
            fail(f"{entry}: clear overlaps a routing array")


def _align_outputs(entry: str, out: Any, device: int, minimum: tuple[int, int]) -> list[DeviceArray]:
    if not isinstance(out, (tuple, list)) or len(out) != 3:
        raise ArgumentTypeError(f"{entry}: out must be a tuple ({', '.join(_ALIGN_OUTPUTS)}), got {type(out).__name__}")
    views = []
    for array, name, least in zip(out, _ALIGN_OUTPUTS, minimum + (1,)):
        view = as_device_array(array, name)
        check_array(entry, name, view, _INT32, ndim=1, alignment=4)
        if name == "num_tokens_post_padded":
            check_shape(entry, name, view, (1,))
        elif not least <= view.size <= I32_MAX:
            fail(f"{entry}: {name} holds {view.size} entries, needs at least {least} (and at most {I32_MAX})")
        _writable_on(entry, name, array, view, device)
        views.append(view)
    return views


def topk_softmax(
    logits: Any,
    top_k: int,
    renormalize: bool = True,
    *,
    out: tuple[Any, Any] | None = None,
    stream: Any = None,
) -> tuple[Any, Any]:
    """The router: softmax over ``logits [num_tokens, num_experts]`` (float16,
    bfloat16 or float32; fp32 math) and its ``top_k`` largest entries ->
    ``(weights float32, ids int32)``, both ``[num_tokens, top_k]``, largest first,
    ties to the lower expert id; ``renormalize`` divides the k weights by their
    sum. ``num_experts <= 1024``; NaN logits rank and weigh as -inf.
    """
    entry = "topk_softmax"
    view, dtype = _input(entry, "logits", logits, allow_f32=True)
    if view.ndim != 2:
        fail(f"{entry}: logits must be 2-D [num_tokens, num_experts], got shape {view.shape}")
    num_tokens, num_experts = view.shape
    if num_experts > MAX_EXPERTS:
        fail(f"{entry}: logits has {num_experts} experts (columns), more than the {MAX_EXPERTS} a router warp holds")
    top_k = _positive(entry, "top_k", top_k)
    if top_k > num_experts:
        fail(f"{entry}: top_k={top_k} must be <= num_experts={num_experts}")
    if not isinstance(renormalize, (bool, np.bool_)):
        raise ArgumentTypeError(f"{entry}: renormalize must be a bool, got {type(renormalize).__name__}")
    _int32_extent(entry, "num_tokens", num_tokens)
    device = device_of(logits, view)
    shape = (num_tokens, top_k)
    if out is None:
        out = (None, None)
    elif not isinstance(out, (tuple, list)) or len(out) != 2:
        raise ArgumentTypeError(f"{entry}: out must be a tuple (weights, ids), got {type(out).__name__}")
    weights, w_view = _output(entry, "weights", out[0], logits, view, shape, _FLOAT32, device)
    ids, i_view = _output(entry, "ids", out[1], logits, view, shape, _INT32, device)
    handle = prepare_stream(stream, [view, w_view, i_view])
    lib = library()
    code = lib.ferrum_topk_softmax(view.ptr, dtype, num_tokens, num_experts, top_k, int(bool(renormalize)),
                                   w_view.ptr, i_view.ptr, device, handle)
    lib.check("ferrum_topk_softmax", code, {
        "num_tokens": num_tokens, "num_experts": num_experts, "top_k": top_k, "dtype": _dtype_name(dtype),
    })
    return weights, ids


# ---- activations and the sum ----------------------------------------------------------


def _rows(entry: str, view: DeviceArray) -> int:
    """Rows of ``[..., width]`` (1 for a 1-D array), as the kernels count them."""
    return _int32_extent(entry, "rows (product of x.shape[:-1])", math.prod(view.shape[:-1]))


def silu_and_mul(x: Any, out: Any = None, *, stream: Any = None) -> Any:
    """``out[..., j] = silu(x[..., j]) * x[..., d + j]`` for ``x [..., 2d]``
    (float16 or bfloat16; fp32 math, one rounding) -> ``[..., d]``."""
    out, call = silu_and_mul_call(x, out, stream)
    call.run(library())
    return out


def silu_and_mul_call(x: Any, out: Any, stream: Any) -> tuple[Any, NativeCall]:
    """:func:`silu_and_mul` up to its native call: the output and the checked call."""
    entry = "silu_and_mul"
    view, dtype = _input(entry, "x", x)
    width = view.shape[-1]
    if width % 2:
        fail(f"{entry}: x's last dimension ({width}) must be even: [gate | up], 2 * d")
    d = _int32_extent(entry, "d", width // 2)
    rows = _rows(entry, view)
    device = device_of(x, view)
    out, out_view = _output(entry, "out", out, x, view, view.shape[:-1] + (d,), view.dtype, device)
    handle = prepare_stream(stream, [view, out_view])
    return out, NativeCall("ferrum_silu_and_mul", (view.ptr, out_view.ptr, rows, d, dtype, device, handle),
                           {"rows": rows, "d": d, "dtype": _dtype_name(dtype)})


def _real(entry: str, name: str, value: object) -> float:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise ArgumentTypeError(f"{entry}: {name} must be a real number, got {type(value).__name__}")
    value = float(value)
    if math.isnan(value):
        fail(f"{entry}: {name} must not be NaN")
    return value


def gpt_oss_swiglu(
    x: Any,
    physical_d: int | None = None,
    alpha: float = 1.702,
    limit: float = 7.0,
    out: Any = None,
    *,
    stream: Any = None,
) -> Any:
    """GPT-OSS's clamped SwiGLU on interleaved ``x [..., 2 * logical_d]``
    (gate at even, up at odd columns; float16 or bfloat16):
    ``g = min(gate, limit)``, ``u = clamp(up, -limit, limit)``,
    ``out[..., j] = (u + 1) * g * sigmoid(alpha * g)`` for ``j < logical_d``
    and 0 up to ``physical_d`` (default ``logical_d``), the padded width the
    next GEMM reads. ``limit >= 0`` (``inf`` turns the clamps off)."""
    out, call = gpt_oss_swiglu_call(x, physical_d, alpha, limit, out, stream)
    call.run(library())
    return out


def gpt_oss_swiglu_call(x: Any, physical_d: int | None, alpha: float, limit: float, out: Any,
                        stream: Any) -> tuple[Any, NativeCall]:
    """:func:`gpt_oss_swiglu` up to its native call: the output and the checked
    call (``alpha`` and ``limit``, as floats, sixth and seventh among its arguments)."""
    entry = "gpt_oss_swiglu"
    view, dtype = _input(entry, "x", x)
    width = view.shape[-1]
    if width % 2:
        fail(f"{entry}: x's last dimension ({width}) must be even: interleaved (gate, up) pairs")
    logical_d = _int32_extent(entry, "logical_d", width // 2)
    physical_d = logical_d if physical_d is None else check_int(entry, "physical_d", physical_d)
    if physical_d < logical_d:
        fail(f"{entry}: physical_d={physical_d} must be >= logical_d={logical_d} (x's last dimension / 2)")
    alpha = _real(entry, "alpha", alpha)
    limit = _real(entry, "limit", limit)
    if limit < 0:
        fail(f"{entry}: limit={limit} must be >= 0 (inf: no clamp)")
    rows = _rows(entry, view)
    device = device_of(x, view)
    out, out_view = _output(entry, "out", out, x, view, view.shape[:-1] + (physical_d,), view.dtype, device)
    handle = prepare_stream(stream, [view, out_view])
    return out, NativeCall("ferrum_gpt_oss_swiglu", (
        view.ptr, out_view.ptr, rows, logical_d, physical_d, alpha, limit, dtype, device, handle,
    ), {"rows": rows, "logical_d": logical_d, "physical_d": physical_d, "dtype": _dtype_name(dtype)})


def moe_sum(x: Any, top_k: int, out: Any = None, *, stream: Any = None) -> Any:
    """``out[t, :] = sum over j < top_k of x[t * top_k + j, :]`` (rows added in
    order j = 0, 1, ... in fp32: the same bits every run). ``x``: float16 or
    bfloat16 ``[tokens * top_k, d]`` (the GEMM's output rows) or
    ``[tokens, top_k, d]``; ``out``: ``[tokens, d]``."""
    out, call = moe_sum_call(x, top_k, out, stream)
    call.run(library())
    return out


def moe_sum_call(x: Any, top_k: int, out: Any, stream: Any) -> tuple[Any, NativeCall]:
    """:func:`moe_sum` up to its native call: the output and the checked call
    (``out`` second among its arguments)."""
    entry = "moe_sum"
    view, dtype = _input(entry, "x", x)
    top_k = _positive(entry, "top_k", top_k)
    if view.ndim == 3:
        tokens, k, d = view.shape
        if k != top_k:
            fail(f"{entry}: x is [tokens, top_k, d] = {view.shape}, its top_k ({k}) is not top_k={top_k}")
    elif view.ndim == 2:
        rows, d = view.shape
        if rows % top_k:
            fail(f"{entry}: x has {rows} rows, not a multiple of top_k={top_k} ([tokens * top_k, d])")
        tokens = rows // top_k
    else:
        fail(f"{entry}: x must be [tokens * top_k, d] or [tokens, top_k, d], got shape {view.shape}")
    _int32_extent(entry, "tokens", tokens)
    _int32_extent(entry, "d", d)
    device = device_of(x, view)
    out, out_view = _output(entry, "out", out, x, view, (tokens, d), view.dtype, device)
    handle = prepare_stream(stream, [view, out_view])
    return out, NativeCall("ferrum_moe_sum", (view.ptr, out_view.ptr, tokens, top_k, d, dtype, device, handle),
                           {"tokens": tokens, "top_k": top_k, "d": d, "dtype": _dtype_name(dtype)})
