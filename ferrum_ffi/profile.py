"""Runtime configuration from the environment, opt-in profiling, shape tracing.

The environment is read once, on first use, exactly as the original engine did:
``FERRUM_MARLIN_PROFILE``, ``FERRUM_MARLIN_SKIP_WS_ZERO`` and
``FERRUM_MARLIN_TRACE_SHAPES`` are on only for the value ``1``;
``FERRUM_MARLIN_TRACE_SHAPES_MAX`` is an unsigned integer (default 256, a bad
value keeps the default).

Profiling times workspace zeroing, act-order gathers and kernels with CUDA
events. Reading an event's time waits for it, so profiling synchronises the
stream after each timed phase — that is its documented cost, and why it is off
unless asked for. Timings are counted globally and per projection bucket; the
bucket comes from a label the caller sets with :func:`profile_label`.
"""

from __future__ import annotations

import ctypes
import os
import sys
import threading
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import Iterator, Mapping

BUCKETS: tuple[str, ...] = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj", "lm_head", "other")
NO_LABEL = "<none>"


@dataclass(frozen=True)
class RuntimeConfig:
    profile: bool = False
    skip_ws_zero: bool = False
    trace_shapes: bool = False
    trace_shapes_max: int = 256

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> "RuntimeConfig":
        env = os.environ if env is None else env
        config = cls(
            profile=env.get("FERRUM_MARLIN_PROFILE") == "1",
            skip_ws_zero=env.get("FERRUM_MARLIN_SKIP_WS_ZERO") == "1",
            trace_shapes=env.get("FERRUM_MARLIN_TRACE_SHAPES") == "1",
        )
        parsed = _parse_u64(env.get("FERRUM_MARLIN_TRACE_SHAPES_MAX"))
        if parsed is not None:
            config = replace(config, trace_shapes_max=parsed)
        return config

    @property
    def zero_workspace(self) -> bool:
        """Workspace locks are zeroed before each launch unless skipping was asked for."""
        return not self.skip_ws_zero


def _parse_u64(raw: str | None) -> int | None:
    """An unsigned 64-bit decimal with an optional '+', as the original engine parsed it."""
    if raw is None:
        return None
    digits = raw[1:] if raw.startswith("+") else raw
    if not (digits.isascii() and digits.isdigit()):
        return None
    value = int(digits)
    return value if value < 2**64 else None


@lru_cache(maxsize=1)
def runtime_config() -> RuntimeConfig:
    """The process's configuration, read from the environment once."""
    return RuntimeConfig.from_env()


def bucket_from_label(label: str) -> str:
    """The projection bucket a label belongs to (first matching name wins)."""
    for bucket in BUCKETS[:-1]:
        if bucket in label:
            return bucket
    return "other"


_label: ContextVar[str] = ContextVar("ferrum_marlin_profile_label", default=NO_LABEL)


@contextmanager
def profile_label(label: str) -> Iterator[None]:
    """Attribute the Marlin calls made inside the block to ``label``'s bucket."""
    token = _label.set(label)
    try:
        yield
    finally:
        _label.reset(token)


def current_label() -> str:
    return _label.get()


@dataclass
class PhaseStats:
    """Microseconds and call counts of each profiled phase."""

    ws_zero_us: float = 0.0
    ws_zero_calls: int = 0
    gather_us: float = 0.0
    gather_calls: int = 0
    kernel_us: float = 0.0
    kernel_calls: int = 0

    def record(self, phase: str, us: float) -> None:
        setattr(self, f"{phase}_us", getattr(self, f"{phase}_us") + us)
        setattr(self, f"{phase}_calls", getattr(self, f"{phase}_calls") + 1)


@dataclass
class ProfileSnapshot:
    total: PhaseStats = field(default_factory=PhaseStats)
    by_projection: dict[str, PhaseStats] = field(
        default_factory=lambda: {bucket: PhaseStats() for bucket in BUCKETS}
    )


PHASES = ("ws_zero", "gather", "kernel")
_stats_lock = threading.Lock()
_stats = ProfileSnapshot()


def record(phase: str, us: float, label: str | None = None) -> None:
    """Count ``us`` microseconds of ``phase`` globally and in the label's bucket."""
    if phase not in PHASES:
        raise ValueError(f"phase={phase!r} must be one of {PHASES}")
    bucket = bucket_from_label(current_label() if label is None else label)
    with _stats_lock:
        _stats.total.record(phase, us)
        _stats.by_projection[bucket].record(phase, us)


def record_gather(us: float) -> None:
    """For callers that gather activations themselves (act-order) and time it."""
    record("gather", us)


def drain_profile() -> ProfileSnapshot:
    """Return the counters gathered so far and reset them."""
    global _stats
    with _stats_lock:
        snapshot, _stats = _stats, ProfileSnapshot()
    return snapshot


class _EventTimer:
    """Times the work enqueued on ``stream`` inside a ``with`` block."""

    def __init__(self, lib, stream: int, phase: str) -> None:
        self._lib = lib
        self._stream = stream
        self._phase = phase
        self._start = ctypes.c_void_p()
        self._end = ctypes.c_void_p()

    def __enter__(self) -> "_EventTimer":
        lib = self._lib
        lib.check("ferrum_marlin_event_create", lib.ferrum_marlin_event_create(ctypes.byref(self._start)))
        lib.check("ferrum_marlin_event_create", lib.ferrum_marlin_event_create(ctypes.byref(self._end)))
        lib.check("ferrum_marlin_event_record", lib.ferrum_marlin_event_record(self._start, self._stream))
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        lib = self._lib
        try:
            if exc_type is None:
                ms = ctypes.c_float()
                lib.check("ferrum_marlin_event_record", lib.ferrum_marlin_event_record(self._end, self._stream))
                lib.check(
                    "ferrum_marlin_event_elapsed_ms",
                    lib.ferrum_marlin_event_elapsed_ms(self._start, self._end, ctypes.byref(ms)),
                )
                record(self._phase, ms.value * 1000.0)
        finally:
            lib.ferrum_marlin_event_destroy(self._start)
            lib.ferrum_marlin_event_destroy(self._end)


class _NoTimer:
    def __enter__(self) -> None:
        return None

    def __exit__(self, exc_type, exc, tb) -> None:
        return None


def timed(lib, stream: int, phase: str, config: RuntimeConfig | None = None):
    """A context manager that times ``phase`` when profiling is on, else does nothing."""
    config = runtime_config() if config is None else config
    return _EventTimer(lib, stream, phase) if config.profile else _NoTimer()


_trace_lock = threading.Lock()
_trace_calls = 0


def trace_shape(config: RuntimeConfig | None = None, **fields: object) -> None:
    """Print one ``[marlin-shape-trace]`` line per call, up to the configured maximum."""
    global _trace_calls
    config = runtime_config() if config is None else config
    if not config.trace_shapes:
        return
    with _trace_lock:
        call = _trace_calls
        _trace_calls += 1
    if call >= config.trace_shapes_max:
        return
    label = current_label()
    parts = [f"call={call}", f"label={label}", f"bucket={bucket_from_label(label)}"]
    parts += [f"{key}={value:#x}" if key.endswith("_ptr") else f"{key}={value}" for key, value in fields.items()]
    print("[marlin-shape-trace] " + " ".join(parts), file=sys.stderr)
