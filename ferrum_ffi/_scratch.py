"""Scratch buffers of the GEMMs, kept per (device, stream).

``ferrum_marlin_mm`` needs a lock workspace (int32, zero on entry, left zero),
for FP32_REDUCE an fp32 ``c_tmp``, and for act-order an ``a_tmp`` the
activations are gathered into; the fused-MoE GEMMs share the workspace and
``c_tmp`` (every kernel leaves the locks zero) and add named buffers of their
own (routing arrays, intermediate activations: :func:`scratch_array`). Two
launches in flight on different streams must not share them, launches on one
stream may (the stream orders them), so they are cached per ``(device,
stream)`` and grown on demand: after the first call of a given size nothing
is allocated, which keeps ``linear`` and ``fused_moe`` capturable in a CUDA
graph once warmed up.

Plans built over these buffers (``fused_moe`` keeps the validated native
calls of a layer, pointers to the buffers included) are kept here too, so
that they never outlive the buffers they name: replacing a buffer (growth)
or releasing them drops every plan.
"""

from __future__ import annotations

import math
import threading
import weakref
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ._devices import allocate
from ._interop import Bfloat16Array, DeviceArray, as_device_array
from ._native import library

# Every scratch buffer is handed out 16-byte aligned, so sizes round up to 16 bytes.
_ALIGN = 16


@dataclass
class _Buffer:
    array: Any = None
    view: DeviceArray | None = None

    @property
    def nbytes(self) -> int:
        return 0 if self.view is None else self.view.nbytes

    @property
    def ptr(self) -> int:
        return 0 if self.view is None else self.view.ptr


@dataclass
class Scratch:
    workspace: _Buffer = field(default_factory=_Buffer)
    c_tmp: _Buffer = field(default_factory=_Buffer)
    a_tmp: _Buffer = field(default_factory=_Buffer)


_cache: dict[tuple[int, int], Scratch] = {}
# Named buffers of scratch_array, per (device, stream, name, dtype name).
_arrays: dict[tuple[int, int, str, str], _Buffer] = {}
_lock = threading.Lock()
# Plans per owner (held weakly: a dropped weight drops its plans), each a
# key -> plan dict. A plan holds the buffers it names, so one in use while
# another thread replaces them stays valid; the generation counts the
# replacements and releases, so that a plan built across one is not kept.
_plans: weakref.WeakKeyDictionary[Any, dict] = weakref.WeakKeyDictionary()
_generation = 0


def _key(device: int, stream: int) -> tuple[int, int]:
    return int(device), 1 if stream in (0, 1) else int(stream)  # 0 and 1: the legacy default stream


def _forget_plans() -> None:
    """Under ``_lock``: a buffer is replaced or released; no plan may name it."""
    global _generation
    _generation += 1
    _plans.clear()


def _grow(buffer: _Buffer, nbytes: int, dtype: np.dtype, like: Any, device: int, stream: int) -> bool:
    """Make ``buffer`` hold at least ``nbytes``; True when it was (re)allocated."""
    if buffer.nbytes >= nbytes:
        return False
    if buffer.view is not None:
        _forget_plans()
    dtype = np.dtype(dtype)
    count = -(-max(nbytes, _ALIGN) // _ALIGN) * (_ALIGN // dtype.itemsize)
    array = allocate(like, None, (count,), dtype, device, stream)
    buffer.array, buffer.view = array, as_device_array(array, "scratch")
    return True


def scratch_for(
    device: int,
    stream: int,
    like: Any,
    *,
    workspace_bytes: int,
    c_tmp_bytes: int = 0,
    a_tmp_bytes: int = 0,
) -> Scratch:
    """The ``(device, stream)`` scratch, grown to the requested sizes. A new
    workspace is zeroed on ``stream`` (before the kernel that reads it)."""
    key = _key(device, stream)
    if isinstance(like, Bfloat16Array):
        like = like.base  # scratch is int32/fp32: allocate in the storage's library, unwrapped
    with _lock:
        scratch = _cache.setdefault(key, Scratch())
        if _grow(scratch.workspace, workspace_bytes, np.int32, like, device, stream):
            lib = library()
            code = lib.ferrum_marlin_memset_async(scratch.workspace.ptr, 0, scratch.workspace.nbytes, stream)
            lib.check("ferrum_marlin_memset_async", code)
        if c_tmp_bytes:
            _grow(scratch.c_tmp, c_tmp_bytes, np.float32, like, device, stream)
        if a_tmp_bytes:
            _grow(scratch.a_tmp, a_tmp_bytes, np.int32, like, device, stream)
        return scratch


def scratch_array(device: int, stream: int, like: Any, name: str, count: int, dtype: np.dtype | type,
                  zeroed: bool = False) -> Any:
    """The ``(device, stream)`` buffer ``name`` of ``dtype``: a 1-D array of at
    least ``count`` elements, grown on demand in the library of ``like``. Take
    views of it with :func:`shaped`. Contents undefined, or with ``zeroed``
    zero once (re)allocated (on ``stream``, before any kernel that reads it):
    every user of such a buffer leaves it zero again, like the workspace."""
    dtype = np.dtype(dtype)
    if isinstance(like, Bfloat16Array):
        like = like.base  # allocate in the storage's library; allocate() wraps bfloat16 itself
    with _lock:
        buffer = _arrays.setdefault(_key(device, stream) + (name, dtype.name), _Buffer())
        if _grow(buffer, count * dtype.itemsize, dtype, like, device, stream) and zeroed:
            lib = library()
            lib.check("ferrum_marlin_memset_async",
                      lib.ferrum_marlin_memset_async(buffer.ptr, 0, buffer.nbytes, stream))
        return buffer.array


def shaped(array: Any, shape: tuple[int, ...]) -> Any:
    """The first ``prod(shape)`` elements of a 1-D :func:`scratch_array` as a
    C-contiguous view of ``shape`` (no copy, no allocation)."""
    if isinstance(array, Bfloat16Array):
        return Bfloat16Array(shaped(array.base, shape))
    return array[: math.prod(shape)].reshape(shape)


def release_scratch() -> None:
    """Drop every cached scratch buffer, and the plans naming them (call when
    no launch is in flight)."""
    with _lock:
        _cache.clear()
        _arrays.clear()
        _forget_plans()


def plan_generation() -> int:
    """Read before fetching the buffers a plan will name; :func:`keep_plan`
    keeps the plan only if no buffer was replaced or released since."""
    return _generation


def plans_of(owner: Any) -> dict | None:
    """The plans kept for ``owner`` (key -> plan; read only), or None."""
    return _plans.get(owner)


def keep_plan(owner: Any, key: Any, plan: Any, generation: int) -> None:
    """Keep ``plan`` for ``owner`` under ``key``, unless a buffer was replaced
    or released since ``generation`` (:func:`plan_generation`) was read."""
    with _lock:
        if generation == _generation:
            _plans.setdefault(owner, {})[key] = plan
