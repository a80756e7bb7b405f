"""The MoE Marlin GEMMs: the fused vLLM-convention launches, the bucketed W4A16
launch and the MoE profile sink.

The path of one fused call: read the buffers -- integer device pointers, or
device arrays of any library (``_interop``) -- check every rule
(``moe_validation``; with arrays also dtype, layout, device and size), resolve
the stream, one ctypes call, and a failure status becomes a
:class:`~ferrum_ffi.status.NativeError` naming the entry point and the shape.
:func:`marlin_moe_call` and :func:`marlin_moe_mxfp4_bf16_call` do all of it
but the call, which they return (``fused_moe`` checks every step of a layer
before its first native call and keeps the validated calls).
Nothing here allocates, zeroes or synchronises: the caller owns the workspace
(zero on entry, left zero by the kernel), so calls can be graph-captured.
"""

from __future__ import annotations

import json
import os
from dataclasses import replace
from typing import Any, Mapping

import numpy as np

from ._abi import FERRUM_MOE_ROUTING_DIRECT as ROUTING_DIRECT
from ._abi import FERRUM_MOE_ROUTING_SETTLED as ROUTING_SETTLED
from ._devices import bfloat16_dtype, device_of, prepare_stream
from ._interop import DeviceArray, as_device_array, resolve_stream
from ._native import NativeCall, library
from .mm import device_sm_count
from .moe_validation import (
    BUCKET_ENTRY,
    MarlinMoeF16Launch,
    MarlinMoeMxfp4Bf16Launch,
    MoeBucketProblem,
    MoeF16WeightType,
    check_moe_capacities,
    moe_bucket_spans,
    validate_moe_bucket,
    validate_moe_bucket_pointers,
)
from .status import ArgumentError, ArgumentTypeError, ProfileSinkError
from .validation import I32_MAX, check_array, check_int, check_non_negative, check_span, fail

__all__ = [
    "configure_moe_profile_sink",
    "launch_marlin_cuda_moe",
    "launch_marlin_moe",
    "launch_marlin_moe_mxfp4_bf16",
]

# Buffers the kernels write; an array of them must not be read-only.
_WRITTEN = ("c", "c_tmp", "workspace", "clear")
_ROUTING_DTYPES = {
    "sorted_token_ids": np.int32,
    "expert_ids": np.int32,
    "num_tokens_past_padded": np.int32,
    "topk_weights": np.float32,
    "workspace": np.int32,
    "c_tmp": np.float32,
}


def _is_pointer(value: Any) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


class _Buffers:
    """The buffers of one call, read once: their pointers (None = absent) and,
    when they were given as arrays, their views and objects."""

    def __init__(self, entry: str, given: Mapping[str, Any]) -> None:
        present = {name: obj for name, obj in given.items() if obj is not None}
        pointers = sorted(name for name, obj in present.items() if _is_pointer(obj))
        arrays = sorted(name for name in present if name not in pointers)
        if pointers and arrays:
            # One mode per call: the device and every size then come from one place.
            fail(f"{entry}: pass every buffer as an integer device pointer or every buffer as a device "
                 f"array, not a mix (pointers: {', '.join(pointers)}; arrays: {', '.join(arrays)})")
        self.objects = present
        self.views: dict[str, DeviceArray] = {name: as_device_array(obj, name) for name, obj in present.items()
                                              if name in arrays}
        self.pointers: dict[str, int | None] = {name: None for name in given}
        for name, obj in present.items():
            self.pointers[name] = self.views[name].ptr if name in self.views else int(obj)

    @property
    def are_arrays(self) -> bool:
        return bool(self.views)

    def check_arrays(self, entry: str, dtypes: Mapping[str, Any]) -> None:
        """dtype and C-contiguity of every array (alignment and nulls are the
        launch rules' business), writability of outputs, a readable count."""
        for name, view in self.views.items():
            # ``clear`` is bytes to zero: any dtype.
            check_array(entry, name, view, dtypes.get(name, view.dtype), alignment=1)
            if name in _WRITTEN and view.readonly:
                fail(f"{entry}: {name} is read-only")
        if "num_tokens_past_padded" in self.views and self.views["num_tokens_past_padded"].size < 1:
            fail(f"{entry}: num_tokens_past_padded must hold one int32 (the kernel reads it)")

    def device(self, entry: str, requested: int | None) -> int:
        """The arrays' common device (``a`` decides), or ``requested`` (default 0)
        for raw pointers; ``requested`` has passed the launch rules."""
        if not self.are_arrays:
            return 0 if requested is None else int(requested)
        device = device_of(self.objects["a"], self.views["a"])
        for name, view in self.views.items():
            other = device_of(self.objects[name], view) if view.size else device
            if other != device:
                fail(f"{entry}: {name} is on device {other}, a on device {device}")
        if requested is not None and requested != device:
            fail(f"{entry}: device={requested}, but the arrays are on device {device}")
        return device

    def check_sizes(self, entry: str, required: Mapping[str, int], spans: Mapping[str, int] | None) -> None:
        """Array sizes, or the raw caller's declared ``spans``, against the
        launch's required spans."""
        if self.are_arrays:
            if spans is not None:
                fail(f"{entry}: spans declares the sizes of raw pointers; arrays carry their own")
            check_moe_capacities(required, {name: self.views[name].nbytes
                                            for name in required if name in self.views})
        elif spans is not None:
            check_moe_capacities(required, spans)

    def stream(self, stream: Any) -> int:
        if self.are_arrays:
            return prepare_stream(stream, list(self.views.values()))
        return resolve_stream(stream)


def _clear_bytes(entry: str, buffers: _Buffers, clear_bytes: int | None) -> int:
    """Bytes the launch zeroes: ``clear_bytes``, or all of a ``clear`` array."""
    if clear_bytes is not None:
        check_int(entry, "clear_bytes", clear_bytes)
        return int(clear_bytes)
    if buffers.pointers["clear"] is None:
        return 0
    if "clear" not in buffers.views:
        fail(f"{entry}: clear given as a pointer needs clear_bytes")
    return buffers.views["clear"].nbytes


def _layer_args(launch: MarlinMoeF16Launch | MarlinMoeMxfp4Bf16Launch) -> tuple:
    """The ``_ex`` entry points' last arguments (none for the plain ones)."""
    if launch.entry_point.endswith("_ex"):
        flags = (ROUTING_SETTLED if launch.routing_settled else 0) | (ROUTING_DIRECT if launch.direct_routing else 0)
        return (launch.add_rows_div, launch.clear, launch.clear_bytes, flags)
    return ()


def _weight_bytes_per_expert(bits: int, n: int, k: int) -> int:
    """One expert's Marlin tile: [k/16, bits/2 * n] int32 words."""
    return k * n * bits // 8


def _infer_expert_count(entry: str, buffers: _Buffers, per_expert: int) -> int:
    nbytes = buffers.views["b"].nbytes
    if nbytes < per_expert:
        fail(f"{entry}: b holds {nbytes} bytes, less than one expert's weight ({per_expert} bytes)")
    return nbytes // per_expert


def launch_marlin_moe(
    *,
    a: Any,
    b: Any,
    c: Any,
    scales: Any,
    workspace: Any,
    sorted_token_ids: Any,
    expert_ids: Any,
    num_tokens_past_padded: Any,
    prob_m: int,
    prob_n: int,
    prob_k: int,
    top_k: int,
    moe_block_size: int,
    group_size: int,
    weight_type: MoeF16WeightType = MoeF16WeightType.U4B8,
    zero_points: Any = None,
    c_tmp: Any = None,
    topk_weights: Any = None,
    mul_topk_weights: bool = False,
    is_ep: bool = False,
    use_fp32_reduce: bool = False,
    expert_count: int | None = None,
    device: int | None = None,
    stream: Any = None,
    spans: Mapping[str, int] | None = None,
    add_rows_div: int = 0,
    clear: Any = None,
    clear_bytes: int | None = None,
    routing_settled: bool = False,
    direct_routing: bool = False,
) -> None:
    """The fused FP16 MoE GEMM (vLLM ``marlin_moe_wna16`` convention): INT4
    (``weight_type=U4B8``; with ``zero_points`` the asymmetric U4 form) or FP8
    E4M3 weights, every rule checked before the native call.

    Buffers are all integer device pointers (``device`` defaults to 0;
    ``spans`` may declare the bytes each holds, keyed as
    :meth:`MarlinMoeF16Launch.validate` returns them) or all device arrays
    (CuPy, ``__cuda_array_interface__``, DLPack): ``a``/``c`` float16,
    ``b``/``zero_points``/``workspace`` and the routing arrays int32,
    ``scales`` float16, ``c_tmp``/``topk_weights`` float32, C-contiguous, on one
    device, each at least its required span. ``expert_count`` sizes ``b``,
    ``scales`` and ``zero_points``; with arrays it defaults to the experts
    ``b`` holds. ``use_fp32_reduce`` selects the deterministic fp32 reduction
    through ``c_tmp`` instead of atomics. ``stream``: as everywhere (None: the
    arrays' current stream, or 0 for pointers).

    A MoE layer's calls (the ``_ex`` entry points, ferrum_marlin.h):
    ``add_rows_div`` r >= 1 adds every partial of output row t, with atomics,
    into row t / r of a ``c`` that is zero on entry (``[M*top_k/r, N]``; r =
    the layer's top_k sums each token's rows), atomic mode only; ``clear`` (a
    buffer, 16-byte aligned, disjoint from the others; ``clear_bytes`` of it,
    all of an array by default) is zeroed by this launch for the next one;
    ``routing_settled``: the routing arrays and ``topk_weights`` were written
    before the stream's previous kernel, only ``a`` by it -- the launch reads
    them while that kernel finishes (a ``clear`` then needs ``direct_routing``);
    ``direct_routing``: no align step -- ``sorted_token_ids`` and
    ``num_tokens_past_padded`` are None, ``expert_ids`` holds the expert of
    each of the ``prob_m * top_k`` routed rows (``topk_ids`` as the router
    wrote them) and each row is a slab of its own (``moe_block_size`` 8); every
    row streams its expert's weights, so it pays when the rows name distinct
    experts (a decode step's single token).
    """
    marlin_moe_call(
        a=a, b=b, c=c, scales=scales, workspace=workspace, sorted_token_ids=sorted_token_ids, expert_ids=expert_ids,
        num_tokens_past_padded=num_tokens_past_padded, prob_m=prob_m, prob_n=prob_n, prob_k=prob_k, top_k=top_k,
        moe_block_size=moe_block_size, group_size=group_size, weight_type=weight_type, zero_points=zero_points,
        c_tmp=c_tmp, topk_weights=topk_weights, mul_topk_weights=mul_topk_weights, is_ep=is_ep,
        use_fp32_reduce=use_fp32_reduce, expert_count=expert_count, device=device, stream=stream, spans=spans,
        add_rows_div=add_rows_div, clear=clear, clear_bytes=clear_bytes, routing_settled=routing_settled,
        direct_routing=direct_routing,
    ).run(library())


def marlin_moe_call(
    *,
    a: Any,
    b: Any,
    c: Any,
    scales: Any,
    workspace: Any,
    sorted_token_ids: Any,
    expert_ids: Any,
    num_tokens_past_padded: Any,
    prob_m: int,
    prob_n: int,
    prob_k: int,
    top_k: int,
    moe_block_size: int,
    group_size: int,
    weight_type: MoeF16WeightType,
    zero_points: Any,
    c_tmp: Any,
    topk_weights: Any,
    mul_topk_weights: bool,
    is_ep: bool,
    use_fp32_reduce: bool,
    expert_count: int | None,
    device: int | None,
    stream: Any,
    spans: Mapping[str, int] | None,
    add_rows_div: int = 0,
    clear: Any = None,
    clear_bytes: int | None = None,
    routing_settled: bool = False,
    direct_routing: bool = False,
) -> NativeCall:
    """:func:`launch_marlin_moe` up to its native call, which it returns
    (arguments ``a``, ``c`` and ``topk_weights`` first, third and eleventh)."""
    entry = "launch_marlin_moe"
    buffers = _Buffers(entry, dict(
        a=a, b=b, c=c, scales=scales, workspace=workspace, sorted_token_ids=sorted_token_ids,
        expert_ids=expert_ids, num_tokens_past_padded=num_tokens_past_padded, zero_points=zero_points,
        c_tmp=c_tmp, topk_weights=topk_weights, clear=clear,
    ))
    buffers.check_arrays(entry, {**_ROUTING_DTYPES, "a": np.float16, "c": np.float16, "scales": np.float16,
                                 "b": np.int32, "zero_points": np.int32})
    p = buffers.pointers
    launch = MarlinMoeF16Launch(
        weight_type=weight_type, a=p["a"], b=p["b"], c=p["c"], scales=p["scales"], workspace=p["workspace"],
        sorted_token_ids=p["sorted_token_ids"], expert_ids=p["expert_ids"],
        num_tokens_past_padded=p["num_tokens_past_padded"], moe_block_size=moe_block_size, top_k=top_k,
        prob_m=prob_m, prob_n=prob_n, prob_k=prob_k, group_size=group_size, c_tmp=p["c_tmp"],
        zero_points=p["zero_points"], topk_weights=p["topk_weights"], mul_topk_weights=mul_topk_weights,
        is_ep=is_ep, has_zero_points=zero_points is not None, device_ordinal=0 if device is None else device,
        use_atomic_add=not use_fp32_reduce, use_fp32_reduce=use_fp32_reduce, expert_count=expert_count,
        add_rows_div=add_rows_div, clear=p["clear"], clear_bytes=_clear_bytes(entry, buffers, clear_bytes),
        routing_settled=routing_settled, direct_routing=direct_routing,
    )
    launch.validate()  # every rule that needs no device query
    launch = replace(launch, device_ordinal=buffers.device(entry, device))
    if buffers.are_arrays and expert_count is None:
        bits = 8 if weight_type is MoeF16WeightType.E4M3 else 4
        launch = replace(launch, expert_count=_infer_expert_count(
            entry, buffers, _weight_bytes_per_expert(bits, prob_n, prob_k)))
    required = launch.validate(device_sm_count(launch.device_ordinal))
    buffers.check_sizes(entry, required, spans)
    handle = buffers.stream(stream)
    # Absent optional pointers are None, which ctypes passes as NULL.
    return NativeCall(launch.entry_point, (
        launch.a, launch.b, launch.c, launch.c_tmp, launch.scales, launch.zero_points,
        launch.workspace, launch.sorted_token_ids, launch.expert_ids, launch.num_tokens_past_padded,
        launch.topk_weights, launch.moe_block_size, launch.top_k, int(launch.mul_topk_weights),
        int(launch.is_ep), launch.prob_m, launch.prob_n, launch.prob_k, launch.group_size,
        int(launch.has_zero_points), launch.device_ordinal, handle, int(launch.use_atomic_add),
        int(launch.use_fp32_reduce), *_layer_args(launch),
    ), launch.shape)


def launch_marlin_moe_mxfp4_bf16(
    *,
    a: Any,
    b: Any,
    c: Any,
    bias: Any,
    scales: Any,
    workspace: Any,
    sorted_token_ids: Any,
    expert_ids: Any,
    num_tokens_past_padded: Any,
    expert_count: int,
    prob_m: int,
    prob_n: int,
    prob_k: int,
    top_k: int,
    moe_block_size: int,
    group_size: int = 32,
    c_tmp: Any = None,
    topk_weights: Any = None,
    mul_topk_weights: bool = False,
    is_ep: bool = False,
    use_fp32_reduce: bool = False,
    device: int | None = None,
    stream: Any = None,
    spans: Mapping[str, int] | None = None,
    add_rows_div: int = 0,
    clear: Any = None,
    clear_bytes: int | None = None,
    routing_settled: bool = False,
    direct_routing: bool = False,
) -> None:
    """The fused BF16 x MXFP4 MoE GEMM (GPT-OSS experts), every rule checked
    before the native call. As :func:`launch_marlin_moe`, except: ``a``, ``c``
    and ``bias`` ([E, N], P32 order) are bfloat16, ``scales`` are E8M0 bytes
    (uint8) and ``expert_count`` (E) is always given; with ``add_rows_div``
    the bias is added once per row t."""
    marlin_moe_mxfp4_bf16_call(
        a=a, b=b, c=c, bias=bias, scales=scales, workspace=workspace, sorted_token_ids=sorted_token_ids,
        expert_ids=expert_ids, num_tokens_past_padded=num_tokens_past_padded, expert_count=expert_count,
        prob_m=prob_m, prob_n=prob_n, prob_k=prob_k, top_k=top_k, moe_block_size=moe_block_size,
        group_size=group_size, c_tmp=c_tmp, topk_weights=topk_weights, mul_topk_weights=mul_topk_weights,
        is_ep=is_ep, use_fp32_reduce=use_fp32_reduce, device=device, stream=stream, spans=spans,
        add_rows_div=add_rows_div, clear=clear, clear_bytes=clear_bytes, routing_settled=routing_settled,
        direct_routing=direct_routing,
    ).run(library())


def marlin_moe_mxfp4_bf16_call(
    *,
    a: Any,
    b: Any,
    c: Any,
    bias: Any,
    scales: Any,
    workspace: Any,
    sorted_token_ids: Any,
    expert_ids: Any,
    num_tokens_past_padded: Any,
    expert_count: int,
    prob_m: int,
    prob_n: int,
    prob_k: int,
    top_k: int,
    moe_block_size: int,
    group_size: int,
    c_tmp: Any,
    topk_weights: Any,
    mul_topk_weights: bool,
    is_ep: bool,
    use_fp32_reduce: bool,
    device: int | None,
    stream: Any,
    spans: Mapping[str, int] | None,
    add_rows_div: int = 0,
    clear: Any = None,
    clear_bytes: int | None = None,
    routing_settled: bool = False,
    direct_routing: bool = False,
) -> NativeCall:
    """:func:`launch_marlin_moe_mxfp4_bf16` up to its native call, which it
    returns (arguments as :func:`marlin_moe_call`'s)."""
    entry = "launch_marlin_moe_mxfp4_bf16"
    buffers = _Buffers(entry, dict(
        a=a, b=b, c=c, bias=bias, scales=scales, workspace=workspace, sorted_token_ids=sorted_token_ids,
        expert_ids=expert_ids, num_tokens_past_padded=num_tokens_past_padded, c_tmp=c_tmp,
        topk_weights=topk_weights, clear=clear,
    ))
    if buffers.are_arrays:  # bfloat16 needs ml_dtypes: look it up only for arrays
        bf16 = bfloat16_dtype()
        buffers.check_arrays(entry, {**_ROUTING_DTYPES, "a": bf16, "c": bf16, "bias": bf16, "b": np.int32,
                                     "scales": np.uint8})
    p = buffers.pointers
    launch = MarlinMoeMxfp4Bf16Launch(
        expert_count=expert_count, a=p["a"], b=p["b"], c=p["c"], bias=p["bias"], scales=p["scales"],
        workspace=p["workspace"], sorted_token_ids=p["sorted_token_ids"], expert_ids=p["expert_ids"],
        num_tokens_past_padded=p["num_tokens_past_padded"], moe_block_size=moe_block_size, top_k=top_k,
        prob_m=prob_m, prob_n=prob_n, prob_k=prob_k, group_size=group_size, c_tmp=p["c_tmp"],
        topk_weights=p["topk_weights"], mul_topk_weights=mul_topk_weights, is_ep=is_ep,
        device_ordinal=0 if device is None else device, use_atomic_add=not use_fp32_reduce,
        use_fp32_reduce=use_fp32_reduce, add_rows_div=add_rows_div, clear=p["clear"],
        clear_bytes=_clear_bytes(entry, buffers, clear_bytes), routing_settled=routing_settled,
        direct_routing=direct_routing,
    )
    launch.validate()  # every rule that needs no device query
    launch = replace(launch, device_ordinal=buffers.device(entry, device))
    required = launch.validate(device_sm_count(launch.device_ordinal))
    buffers.check_sizes(entry, required, spans)
    handle = buffers.stream(stream)
    return NativeCall(launch.entry_point, (
        launch.a, launch.b, launch.c, launch.c_tmp, launch.bias, launch.scales, launch.workspace,
        launch.sorted_token_ids, launch.expert_ids, launch.num_tokens_past_padded,
        launch.topk_weights, launch.moe_block_size, launch.top_k, int(launch.mul_topk_weights),
        int(launch.is_ep), launch.prob_m, launch.prob_n, launch.prob_k, launch.group_size,
        launch.device_ordinal, handle, int(launch.use_atomic_add), int(launch.use_fp32_reduce),
        *_layer_args(launch),
    ), launch.shape)


def launch_marlin_cuda_moe(
    a: int,
    b: int,
    c: int,
    s: int,
    problem: MoeBucketProblem,
    workspace: int,
    a_row_offsets: int,
    tokens_per_expert: int,
    active_expert_ids: int | None = None,
    dev: int = 0,
    stream: Any = 0,
    spans: Mapping[str, int] | None = None,
    num_experts: int | None = None,
) -> None:
    """Raw-pointer ``marlin_cuda_moe``: one launch over a bucket of experts,
    every rule checked first (``expert_count == 0`` returns at once).

    ``spans`` (optional) gives the bytes ``B``, ``s`` and ``workspace`` hold,
    checked for expert blocks ``0 .. num_experts-1``; ``num_experts`` defaults
    to ``problem.expert_count`` and must be given with ``active_expert_ids``
    (the ids it names are device data).
    """
    validate_moe_bucket(problem)
    check_int(BUCKET_ENTRY, "dev", dev)
    check_non_negative(BUCKET_ENTRY, "dev", dev)
    if problem.expert_count == 0:
        return
    validate_moe_bucket_pointers(a, b, c, s, workspace, a_row_offsets, tokens_per_expert, active_expert_ids)
    if spans is not None:
        if num_experts is None and active_expert_ids:
            fail(f"{BUCKET_ENTRY}: checking spans with active_expert_ids needs num_experts "
                 "(the number of experts stacked in B, s and workspace)")
        required = moe_bucket_spans(problem, problem.expert_count if num_experts is None else num_experts)
        for name, available in spans.items():
            if name not in required:
                fail(f"{BUCKET_ENTRY}: spans names {name!r}; it sizes {', '.join(required)}")
            check_span(BUCKET_ENTRY, name, available, required[name])
    handle = resolve_stream(stream)
    p = problem
    lib = library()
    code = lib.marlin_cuda_moe(
        a, b, c, s, p.m, p.n, p.k, workspace, a_row_offsets, tokens_per_expert, active_expert_ids or None,
        p.expert_count, p.b_int4_per_expert, p.s_int4_per_expert, p.locks_i32_per_expert, p.group_size, dev,
        handle, p.thread_k, p.thread_n, p.sms, p.n_full,
    )
    lib.check(BUCKET_ENTRY, code, p.shape)


# ---- the profile sink ----------------------------------------------------------------

PROFILE_ENTRY = "configure_moe_profile_sink"


def _c_string(field: str, value: Any) -> bytes:
    if not isinstance(value, str):
        raise ArgumentTypeError(f"{PROFILE_ENTRY}: {field} must be a str, got {type(value).__name__}")
    encoded = value.encode()
    if b"\0" in encoded:
        raise ArgumentError(f"{PROFILE_ENTRY}: {field} contains a NUL byte (C strings end there)")
    return encoded


def configure_moe_profile_sink(
    path: str | os.PathLike | None = None,
    *,
    commit_sha: str = "",
    env_hash: str = "",
    model: str = "",
    concurrency: int = 0,
    runtime_flags: Mapping[str, Any] | None = None,
) -> None:
    """Append one JSON line per fused-MoE launch to ``path`` (opened for
    appending now), tagged with the given metadata; ``path=None`` switches the
    sink off. ``runtime_flags`` is written as a JSON object. Raises
    ProfileSinkError, with the library's reason, when the sink stays off."""
    if path is None:
        library().ferrum_vllm_marlin_moe_clear_profile_config()
        return
    if not isinstance(path, (str, os.PathLike)):
        raise ArgumentTypeError(f"{PROFILE_ENTRY}: path must be a str or os.PathLike, got {type(path).__name__}")
    path_bytes = os.fsencode(path)
    if b"\0" in path_bytes:
        raise ArgumentError(f"{PROFILE_ENTRY}: path contains a NUL byte (C strings end there)")
    strings = [_c_string(field, value) for field, value in
               (("commit_sha", commit_sha), ("env_hash", env_hash), ("model", model))]
    if isinstance(concurrency, (bool, np.bool_)) or not isinstance(concurrency, (int, np.integer)):
        raise ArgumentTypeError(f"{PROFILE_ENTRY}: concurrency must be an integer, got {type(concurrency).__name__}")
    check_non_negative(PROFILE_ENTRY, "concurrency", int(concurrency))
    if runtime_flags is not None and not isinstance(runtime_flags, Mapping):
        raise ArgumentTypeError(f"{PROFILE_ENTRY}: runtime_flags must be a mapping (written as a JSON object), "
                                f"got {type(runtime_flags).__name__}")
    try:
        # JSON escapes control characters, so the text never holds a NUL byte.
        flags_json = json.dumps(dict(runtime_flags or {}), sort_keys=True)
    except (TypeError, ValueError) as exc:
        raise ArgumentTypeError(f"{PROFILE_ENTRY}: runtime_flags must be JSON-serialisable: {exc}") from exc
    lib = library()
    # The sink stores an int; larger counts are recorded as INT32_MAX, as the original engine did.
    lib.ferrum_vllm_marlin_moe_set_profile_config(path_bytes, *strings, min(int(concurrency), I32_MAX),
                                                  flags_json.encode())
    reason = lib.last_error()  # read before any other call can replace it
    if not lib.ferrum_vllm_marlin_moe_profile_enabled():
        raise ProfileSinkError(f"{PROFILE_ENTRY}: the MoE profile sink at {os.fsdecode(path_bytes)!r} stayed "
                               f"off: {reason or 'no reason given'}")
