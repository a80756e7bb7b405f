"""The raw-pointer general Marlin GEMM: ``ferrum_marlin_mm`` behind every check.

:func:`launch_marlin_mm` takes integer device pointers (like
:func:`ferrum_ffi.launch_marlin_cuda`), checks every rule of the header's
"General Marlin GEMM" section (``validation.validate_mm`` and
``validate_mm_buffers``), fills one :class:`~ferrum_ffi._native.FerrumMarlinLaunch`
and calls the library; a failure status becomes a
:class:`~ferrum_ffi.status.NativeError` naming the entry point and the problem.
"""

from __future__ import annotations

import ctypes
import functools
import threading
from typing import Any, Mapping

from ._abi import FERRUM_MM_LAUNCH_VERSION
from ._native import FerrumMarlinLaunch, library
from .validation import (
    MM_ENTRY,
    MmBuffers,
    MmProblem,
    check_int,
    check_non_negative,
    check_span,
    fail,
    mm_spans,
    validate_mm,
    validate_mm_buffers,
)

_int_p = ctypes.POINTER(ctypes.c_int)
_device_facts: dict[int, tuple[int, int]] = {}  # device -> (multiprocessors, compute capability major)
_facts_lock = threading.Lock()


def _facts(device: int) -> tuple[int, int]:
    """The device's multiprocessor count and compute capability major, asked
    once per device, then cached."""
    cached = _device_facts.get(device)
    if cached is not None:
        return cached
    lib = library()
    name = ctypes.create_string_buffer(256)
    major, minor, sms, total = ctypes.c_int(), ctypes.c_int(), ctypes.c_int(), ctypes.c_size_t()
    code = lib.ferrum_marlin_device_info(
        device, name, len(name), ctypes.byref(major), ctypes.byref(minor), ctypes.byref(sms), ctypes.byref(total)
    )
    lib.check("ferrum_marlin_device_info", code, {"device": device})
    facts = (sms.value, major.value)
    with _facts_lock:
        _device_facts[device] = facts
    return facts


def device_sm_count(device: int) -> int:
    """Multiprocessors of ``device``: what ``sms = -1`` resolves to when
    sizing the workspace and c_tmp."""
    return _facts(device)[0]


def device_compute_major(device: int) -> int:
    """The compute capability major of ``device`` (9: Hopper)."""
    return _facts(device)[1]


def resolved_sms(sms: int, device: int) -> int:
    """The multiprocessor count buffers must be sized for: the device's for
    -1, else the request as given (the library clamps a larger request to the
    device; sizing for the request itself is never too small)."""
    return device_sm_count(device) if sms == -1 else sms


def _pointer(value: int) -> int | None:
    return int(value) or None


@functools.lru_cache(maxsize=256)
def _problem_struct(problem: MmProblem, device: int) -> FerrumMarlinLaunch:
    """The struct's version, problem and execution fields; a launch copies it
    and adds its pointers and stream. Keyed by value: only validated problems
    (plain integers in every field) reach it."""
    p = problem
    launch = FerrumMarlinLaunch()
    launch.abi_version = FERRUM_MM_LAUNCH_VERSION
    launch.struct_size = ctypes.sizeof(FerrumMarlinLaunch)
    for name in ("m", "n", "k", "lda", "num_groups", "group_size", "a_type", "b_type", "sms",
                 "thread_k", "thread_n"):
        setattr(launch, name, int(getattr(p, name)))
    launch.flags = int(p.flags)
    launch.device = int(device)
    return launch


def build_launch(problem: MmProblem, buffers: MmBuffers, device: int, stream: int) -> FerrumMarlinLaunch:
    """The struct for an already validated launch."""
    b = buffers
    launch = FerrumMarlinLaunch.from_buffer_copy(_problem_struct(problem, int(device)))
    for name in ("a", "b", "c", "c_tmp", "b_scales", "zero_points", "a_tmp", "workspace", "a_scales", "bias"):
        setattr(launch, name, _pointer(getattr(b, name)))
    for name in ("g_idx", "perm"):  # typed const int* in the header
        ptr = int(getattr(b, name))
        setattr(launch, name, ctypes.cast(ctypes.c_void_p(ptr), _int_p) if ptr else None)
    launch.workspace_bytes = int(b.workspace_bytes)
    launch.c_tmp_bytes = int(b.c_tmp_bytes)
    launch.a_tmp_bytes = int(b.a_tmp_bytes)
    launch.stream = _pointer(stream)
    return launch


def call_marlin_mm(problem: MmProblem, buffers: MmBuffers, device: int, stream: int,
                   entry: str = MM_ENTRY) -> FerrumMarlinLaunch:
    """Fill the struct and call the library (no checks: the caller made them);
    a failure raises NativeError under ``entry``, the caller's name. Returns
    the struct (a template for :func:`relaunch_marlin_mm`)."""
    launch = build_launch(problem, buffers, device, stream)
    lib = library()
    code = lib.ferrum_marlin_mm(ctypes.byref(launch))
    if code:  # the shape report is built only for a failure
        lib.check(entry, code, problem.shape)
    return launch


def relaunch_marlin_mm(lib: Any, template: FerrumMarlinLaunch, a: int, c: int, bias: int, problem: MmProblem,
                       entry: str) -> None:
    """``template`` (a launch that passed every rule) again with other a, c
    and bias pointers, which the caller checked. A copy per call: another
    thread may relaunch the same template while the library reads this one."""
    launch = FerrumMarlinLaunch.from_buffer_copy(template)
    launch.a = a
    launch.c = c
    launch.bias = bias or None
    code = lib.ferrum_marlin_mm(ctypes.byref(launch))
    if code:
        lib.check(entry, code, problem.shape)


def launch_marlin_mm(
    problem: MmProblem,
    *,
    a: int,
    b: int,
    c: int,
    b_scales: int,
    workspace: int,
    workspace_bytes: int,
    zero_points: int = 0,
    g_idx: int = 0,
    perm: int = 0,
    a_tmp: int = 0,
    a_tmp_bytes: int = 0,
    c_tmp: int = 0,
    c_tmp_bytes: int = 0,
    bias: int = 0,
    a_scales: int = 0,
    device: int = 0,
    stream: int = 0,
    spans: Mapping[str, int] | None = None,
) -> None:
    """Raw-pointer ``ferrum_marlin_mm`` with every rule checked before the call.

    Pointers are integers (0 = NULL); ``workspace_bytes``, ``a_tmp_bytes`` and
    ``c_tmp_bytes`` are the capacities the struct declares. ``spans``
    (optional) gives the bytes other buffers hold from their pointers on
    (keys as in :func:`ferrum_ffi.validation.mm_spans`), checked against what
    the problem reads and writes. ``problem.sms == -1`` asks the library for
    the device's multiprocessor count to size-check workspace and c_tmp.
    ``m == 0`` returns without calling the library.
    """
    validate_mm(problem)
    check_int(MM_ENTRY, "device", device)
    check_non_negative(MM_ENTRY, "device", device)
    if isinstance(stream, bool) or not isinstance(stream, int) or stream < 0:
        fail(f"{MM_ENTRY}: stream must be a non-negative integer handle, got {stream!r}")
    if problem.m == 0:
        return
    buffers = MmBuffers(
        a=a, b=b, c=c, b_scales=b_scales, workspace=workspace, workspace_bytes=workspace_bytes,
        zero_points=zero_points, g_idx=g_idx, perm=perm, a_tmp=a_tmp, a_tmp_bytes=a_tmp_bytes,
        c_tmp=c_tmp, c_tmp_bytes=c_tmp_bytes, bias=bias, a_scales=a_scales,
    )
    sms = resolved_sms(problem.sms, device)
    validate_mm_buffers(problem, buffers, sms)
    if spans is not None:
        required = mm_spans(problem, sms)
        for name, available in spans.items():
            if name not in required:
                fail(f"{MM_ENTRY}: spans names {name!r}, which this problem does not use "
                     f"(it uses {', '.join(required)})")
            check_span(MM_ENTRY, name, available, required[name])
    call_marlin_mm(problem, buffers, device, stream)
