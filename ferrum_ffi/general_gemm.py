"""``linear()``: the general Marlin GEMM on device arrays.

The path of one call: read the arrays and the stream (``_interop``), check
every rule (``validation``), take the cached per-(device, stream) scratch
(``_scratch``: its lock workspace is zeroed when allocated, and every kernel
leaves it zero), then fill the launch struct and call ``ferrum_marlin_mm``
(``mm``), whose status becomes a NativeError. A call shape's launch that
passed every rule is kept per stream (``_KeptLaunch``): later calls check
their arrays and fill in only their pointers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import profile
from ._devices import allocate, device_of, prepare_stream
from ._interop import DeviceArray, as_device_array
from ._native import FerrumMarlinLaunch, library
from ._scratch import keep_plan, plan_generation, plans_of, release_scratch, scratch_for
from .mm import call_marlin_mm, relaunch_marlin_mm, resolved_sms
from .status import ArgumentTypeError, NativeError
from .validation import (
    MmBuffers,
    MmProblem,
    check_array,
    check_shape,
    fail,
    mm_spans,
    validate_mm,
    validate_mm_buffers,
)
from .weights import MarlinLinearWeight

__all__ = ["linear", "release_scratch"]

ENTRY = "linear"


def _rows(view: DeviceArray, k: int) -> tuple[int, int]:
    """(m, lda) of activations ``[..., k]``: C-contiguous rows, or a 2-D
    array whose rows are ``lda`` elements apart."""
    if view.ndim == 0:
        fail(f"{ENTRY}: x must have at least one dimension [..., k], got a scalar")
    if view.shape[-1] != k:
        fail(f"{ENTRY}: x has {view.shape[-1]} columns (last dimension), the weight takes in_features={k}")
    m = math.prod(view.shape[:-1])  # 1 for a single row [k]
    if view.is_c_contiguous:
        return m, k
    item = view.itemsize
    if view.ndim == 2 and view.strides[1] == item and view.strides[0] > 0 and view.strides[0] % item == 0:
        return m, view.strides[0] // item
    fail(f"{ENTRY}: x must be C-contiguous, or 2-D with unit column stride and rows lda elements apart "
         f"(shape {view.shape}, strides {view.strides})")
    raise AssertionError("unreachable: fail raises")


@dataclass(frozen=True, eq=False)
class _Plan:
    """What a call shape on a weight needs before its arrays are read: the
    checked problem, the multiprocessor count its buffers are sized for and
    the bytes each buffer must hold. Its launches per stream are kept in
    ``_scratch`` (owned by the plan: they go with it, and with the buffers
    they name)."""

    problem: MmProblem
    sm_count: int
    spans: dict[str, int]


@dataclass(frozen=True, eq=False)
class _KeptLaunch:
    """The struct of a launch that passed every rule, on one plan and stream:
    a later call with other activations, output and bias pointers (checked
    by :func:`_replayable`; the rest is the plan's and the stream's) copies
    it and fills in those three. ``scratch`` holds the buffers it names, so
    that they outlive it even when another thread replaces them meanwhile."""

    template: FerrumMarlinLaunch
    scratch: tuple[Any, ...]
    workspace: int
    workspace_bytes: int


def _kept_launch(plan: _Plan, handle: int, config: profile.RuntimeConfig) -> _KeptLaunch | None:
    """The launch kept for ``plan`` on ``handle``, unless a profiling option
    wants the full path (shape trace, event timing)."""
    if config.trace_shapes or config.profile:
        return None
    kept = plans_of(plan)
    return None if kept is None else kept.get(handle)


def _relaunch(lib: Any, kept: _KeptLaunch, a: int, c: int, bias: int, problem: MmProblem, handle: int) -> None:
    try:
        relaunch_marlin_mm(lib, kept.template, a, c, bias, problem, ENTRY)
    except NativeError:
        _zero_workspace(lib, kept.workspace, kept.workspace_bytes, handle)
        raise


def _zero_workspace(lib: Any, workspace: int, nbytes: int, handle: int) -> None:
    """After a failed launch: every kernel leaves the locks zero, so linear()
    zeroes them only when it cannot tell what a failure left (best effort: a
    failure that poisoned the context fails the memset too, and the launch's
    error is what the caller sees)."""
    lib.ferrum_marlin_memset_async(workspace, 0, nbytes, handle)


def _replayable(ptr: int) -> bool:
    """The pointer rules of ``validate_mm_buffers`` for a, c and bias, whose
    alignment the caller checked: a non-null address."""
    return type(ptr) is int and 0 < ptr < 2**64


_PLANS_PER_WEIGHT = 64  # distinct call shapes kept; more (varying prefill lengths) start over


def _plan(weight: MarlinLinearWeight, m: int, lda: int, fp32_reduce: bool, sms: Any, thread_k: Any,
          thread_n: Any) -> _Plan:
    """The plan of one call shape, checked once and then kept on the weight
    (the scalar rules and span sums were most of a call's host time). Only
    plain ``int`` tuning arguments are kept: a bool or NumPy integer is equal
    to an int as a key but not under the rules, so it is checked every time."""
    key = (m, lda, fp32_reduce, sms, thread_k, thread_n)
    cacheable = m > 0 and type(sms) is int and type(thread_k) is int and type(thread_n) is int
    if cacheable:
        plan = weight._plans.get(key)
        if plan is not None:
            return plan
    problem = weight.problem(m, lda=lda, fp32_reduce=fp32_reduce, sms=sms, thread_k=thread_k, thread_n=thread_n)
    validate_mm(problem, ENTRY)
    if m == 0:  # nothing is launched: no device query, no buffers
        return _Plan(problem, 0, {})
    sm_count = resolved_sms(problem.sms, weight.device)
    plan = _Plan(problem, sm_count, mm_spans(problem, sm_count, ENTRY))
    if cacheable:
        if len(weight._plans) >= _PLANS_PER_WEIGHT:
            weight._plans.clear()
        weight._plans[key] = plan
    return plan


def _check_device(name: str, obj: Any, view: DeviceArray, weight: MarlinLinearWeight) -> None:
    if view.size and device_of(obj, view) != weight.device:
        fail(f"{ENTRY}: {name} is on device {device_of(obj, view)}, the weight on device {weight.device}")


def _output(out: Any, x: Any, x_view: DeviceArray, shape: tuple[int, ...], weight: MarlinLinearWeight):
    if out is None:
        out = allocate(x, x_view, shape, weight.dtype, weight.device)
        return out, as_device_array(out, "out")
    view = as_device_array(out, "out")
    check_array(ENTRY, "out", view, weight.dtype)
    check_shape(ENTRY, "out", view, shape)
    if view.readonly:
        fail(f"{ENTRY}: out is read-only")
    _check_device("out", out, view, weight)
    return out, view


def linear(
    x: Any,
    weight: MarlinLinearWeight,
    bias: Any = None,
    out: Any = None,
    stream: Any = None,
    *,
    fp32_reduce: bool = False,
    thread_k: int = -1,
    thread_n: int = -1,
    sms: int = -1,
) -> Any:
    """``out[..., n] = x[..., k] @ W + bias`` on ``stream``, in ``weight.dtype``.

    ``x``: any CUDA array (CuPy, ``__cuda_array_interface__``, DLPack) of
    ``weight.dtype`` (float16, or bfloat16: a torch/JAX bfloat16 tensor, a
    CuPy >= 14 array of ``ml_dtypes.bfloat16``, or
    ``ferrum_ffi.bfloat16_view(uint16_array)``), ``[..., k]`` with
    C-contiguous rows, or 2-D with rows ``lda`` elements apart (``lda % 8 ==
    0``). ``bias``: ``[n]`` of the same dtype, or None. ``out`` is allocated in
    ``x``'s library when omitted. ``fp32_reduce=True`` sums split-K partials
    in fp32 in a fixed order (bitwise reproducible); otherwise they are added
    with atomics. ``thread_k/thread_n`` force a tile; ``sms`` limits the
    multiprocessors. Never synchronises; after a first call of a given size
    nothing is allocated but an omitted ``out``.
    """
    if not isinstance(weight, MarlinLinearWeight):
        raise ArgumentTypeError(f"{ENTRY}: weight must be a MarlinLinearWeight, got {type(weight).__name__}")
    if not isinstance(fp32_reduce, (bool, np.bool_)):
        raise ArgumentTypeError(f"{ENTRY}: fp32_reduce must be a bool, got {type(fp32_reduce).__name__}")
    x_view = as_device_array(x, "x")
    if x_view.dtype != weight.dtype:
        raise ArgumentTypeError(
            f"{ENTRY}: x must have dtype {weight.dtype.name} (the weight's activation dtype), got {x_view.dtype}"
        )
    m, lda = _rows(x_view, weight.in_features)
    out_shape = x_view.shape[:-1] + (weight.n,)
    plan = _plan(weight, m, lda, bool(fp32_reduce), sms, thread_k, thread_n)
    problem = plan.problem
    if m and x_view.ptr % 16:
        fail(f"{ENTRY}: x pointer {x_view.ptr:#x} must be 16-byte aligned")
    _check_device("x", x, x_view, weight)
    views = [x_view]
    bias_view = None
    if bias is not None:
        bias_view = as_device_array(bias, "bias")
        check_array(ENTRY, "bias", bias_view, weight.dtype, ndim=1)
        check_shape(ENTRY, "bias", bias_view, (weight.n,))
        _check_device("bias", bias, bias_view, weight)
        views.append(bias_view)
    out, out_view = _output(out, x, x_view, out_shape, weight)
    views.append(out_view)
    if m == 0:
        return out
    handle = prepare_stream(stream, views)
    config = profile.runtime_config()
    a, c = x_view.ptr, out_view.ptr
    bias_ptr = 0 if bias_view is None else bias_view.ptr
    lib = library()
    kept = _kept_launch(plan, handle, config)
    if kept is not None and _replayable(a) and _replayable(c) and (bias_view is None or _replayable(bias_ptr)):
        _relaunch(lib, kept, a, c, bias_ptr, problem, handle)
        return out
    generation = plan_generation()
    device = weight.device
    sm_count, spans = plan.sm_count, plan.spans
    scratch = scratch_for(
        device, handle, x,
        workspace_bytes=spans["workspace"],
        c_tmp_bytes=spans.get("c_tmp", 0),
        a_tmp_bytes=spans.get("a_tmp", 0),
    )
    w = weight._views
    buffers = MmBuffers(
        a=a,
        b=w["b"].ptr,
        c=c,
        b_scales=w["scales"].ptr,
        workspace=scratch.workspace.ptr,
        workspace_bytes=scratch.workspace.nbytes,
        zero_points=w["zero_points"].ptr if "zero_points" in w else 0,
        g_idx=w["g_idx"].ptr if weight.act_order else 0,
        perm=w["perm"].ptr if weight.act_order else 0,
        a_tmp=scratch.a_tmp.ptr if weight.act_order else 0,
        a_tmp_bytes=scratch.a_tmp.nbytes if weight.act_order else 0,
        c_tmp=scratch.c_tmp.ptr if fp32_reduce else 0,
        c_tmp_bytes=scratch.c_tmp.nbytes if fp32_reduce else 0,
        bias=bias_ptr,
    )
    validate_mm_buffers(problem, buffers, sm_count, ENTRY, spans=spans)
    if config.trace_shapes:  # its fields are built only when they are printed
        profile.trace_shape(
            config, entry=ENTRY, m=m, n=weight.n, k=weight.k, gs=weight.group_size, lda=lda,
            a_type=weight.a_type.name, b_type=weight.b_type.name, flags=f"{problem.flags:#x}",
            a_ptr=buffers.a, b_ptr=buffers.b, c_ptr=buffers.c, s_ptr=buffers.b_scales, ws_ptr=buffers.workspace,
        )
    try:
        with profile.timed(lib, handle, "kernel", config):
            launch = call_marlin_mm(problem, buffers, device, handle, ENTRY)
    except NativeError:
        _zero_workspace(lib, buffers.workspace, buffers.workspace_bytes, handle)
        raise
    arrays = (scratch.workspace.array, scratch.c_tmp.array, scratch.a_tmp.array)
    keep_plan(plan, handle, _KeptLaunch(launch, arrays, buffers.workspace, buffers.workspace_bytes), generation)
    return out
