"""W4A16 dense Marlin GEMM: weight objects and the functions that run them.

The path of one call: :func:`marlin_gemm` reads the arrays and the stream
(``_interop``), checks every rule (``validation``), zeroes the workspace and
launches ``marlin_cuda`` through the prototyped library (``_native``), then
decodes its status (``status``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from . import profile
from ._devices import allocate, device_of, prepare_stream, upload
from ._interop import DeviceArray, as_device_array
from ._native import library
from .formats.gptq import repack_gptq_to_marlin, repack_scales_to_marlin
from .formats.marlin import marlin_pack_int4, marlin_permute_scales
from .formats.quantize import quantize_int4_symmetric
from .status import ArgumentTypeError
from .validation import (
    DEFAULT_MAX_PAR,
    W4A16Problem,
    check_array,
    check_int,
    check_non_negative,
    check_shape,
    check_span,
    fail,
    validate_expert_slice,
    validate_w4a16,
    validate_w4a16_pointers,
    w4a16_spans,
    workspace_ints,
)

ENTRY = "marlin_cuda"
ToDevice = Callable[[np.ndarray], Any]


def _host(array: Any, name: str) -> np.ndarray:
    """A NumPy view of a host or CuPy/torch array (device arrays are copied down)."""
    if isinstance(array, np.ndarray):
        return array
    module = type(array).__module__.split(".")[0]
    if module == "cupy":
        return array.get()
    if module == "torch":
        return array.detach().cpu().numpy()
    try:
        return np.asarray(array)
    except Exception as exc:
        raise ArgumentTypeError(f"{name}: expected an array, got {type(array).__name__}") from exc


@dataclass
class MarlinWeight:
    """A W4A16 weight on the device: Marlin-packed INT4, scales and lock workspace.

    ``num_experts > 1`` holds a stack of experts in the per-expert contiguous
    layout the offset variants read: expert ``e`` owns the packed words
    ``[e*k*n_e/8, (e+1)*k*n_e/8)``, the scales ``[e*(k/g)*n_e, ...)`` and the
    locks ``[e*max(1, n_e/128)*max_par, ...)``; ``n`` is the stacked width.
    """

    qweight: Any
    scales: Any
    workspace: Any
    k: int
    n: int
    group_size: int = 128
    num_experts: int = 1
    max_par: int = DEFAULT_MAX_PAR
    _views: tuple[DeviceArray, DeviceArray, DeviceArray] = field(init=False, repr=False)
    _device: int = field(init=False, repr=False)
    # (m, n, thread_k, thread_n, sms) of calls that passed validate_w4a16 (see _check_problem).
    _checked: set = field(init=False, repr=False, compare=False, default_factory=set)

    def __post_init__(self) -> None:
        entry = "MarlinWeight"
        for name in ("k", "n", "group_size", "num_experts", "max_par"):
            check_int(entry, name, getattr(self, name))
        if self.num_experts < 1 or self.n % self.num_experts:
            fail(f"{entry}: n={self.n} must split into num_experts={self.num_experts} equal experts")
        validate_w4a16(
            W4A16Problem(m=0, n=self.expert_n, k=self.k, group_size=self.group_size, max_par=self.max_par),
            entry,
        )
        q = as_device_array(self.qweight, "qweight")
        s = as_device_array(self.scales, "scales")
        ws = as_device_array(self.workspace, "workspace")
        check_array(entry, "qweight", q, np.int32)
        check_array(entry, "scales", s, np.float16)
        check_array(entry, "workspace", ws, np.int32, alignment=4)
        groups = 1 if self.group_size == -1 else self.k // self.group_size
        check_span(entry, "qweight", q.nbytes, self.num_experts * self.k * self.expert_n // 2)
        check_span(entry, "scales", s.nbytes, self.num_experts * groups * self.expert_n * 2)
        check_span(entry, "workspace", ws.nbytes, self.num_experts * workspace_ints(self.expert_n, self.max_par) * 4)
        self._views = (q, s, ws)
        self._device = device_of(self.qweight, q)

    @property
    def expert_n(self) -> int:
        return self.n // self.num_experts

    @property
    def groups(self) -> int:
        return 1 if self.group_size == -1 else self.k // self.group_size

    # ---- constructors --------------------------------------------------------------

    @classmethod
    def from_marlin(
        cls,
        packed: Sequence[np.ndarray] | np.ndarray,
        scales: Sequence[np.ndarray] | np.ndarray,
        k: int,
        group_size: int = 128,
        max_par: int = DEFAULT_MAX_PAR,
        to_device: ToDevice | None = None,
    ) -> "MarlinWeight":
        """Upload host buffers already in Marlin layout (one per expert, or one)."""
        packed_list = [packed] if isinstance(packed, np.ndarray) else list(packed)
        scales_list = [scales] if isinstance(scales, np.ndarray) else list(scales)
        if len(packed_list) != len(scales_list) or not packed_list:
            fail("MarlinWeight.from_marlin: packed and scales must list the same, non-zero number of experts")
        expert_n = packed_list[0].shape[-1] // 2
        qweight = np.ascontiguousarray(np.stack(packed_list) if len(packed_list) > 1 else packed_list[0], np.int32)
        scale = np.ascontiguousarray(np.stack(scales_list) if len(scales_list) > 1 else scales_list[0], np.float16)
        workspace = np.zeros(len(packed_list) * workspace_ints(expert_n, max_par), np.int32)
        return cls(
            qweight=upload(qweight, to_device),
            scales=upload(scale, to_device),
            workspace=upload(workspace, to_device),
            k=int(k),
            n=expert_n * len(packed_list),
            group_size=group_size,
            num_experts=len(packed_list),
            max_par=max_par,
        )

    @classmethod
    def from_float(
        cls,
        weights: np.ndarray | Sequence[np.ndarray],
        group_size: int = 128,
        max_par: int = DEFAULT_MAX_PAR,
        to_device: ToDevice | None = None,
    ) -> "MarlinWeight":
        """Quantise float ``[K, N]`` weight(s) round-to-nearest, symmetric INT4.

        A sequence of weights builds a stacked expert weight.
        """
        items = [weights] if not isinstance(weights, (list, tuple)) else list(weights)
        packed, scales = [], []
        for index, w in enumerate(items):
            host = _host(w, f"weights[{index}]")
            codes, s = quantize_int4_symmetric(host, group_size)
            packed.append(marlin_pack_int4(codes))
            scales.append(marlin_permute_scales(s, group_size))
        return cls.from_marlin(packed, scales, items[0].shape[0], group_size, max_par, to_device)

    @classmethod
    def from_gptq(
        cls,
        qweight: np.ndarray,
        scales: np.ndarray,
        group_size: int = 128,
        max_par: int = DEFAULT_MAX_PAR,
        to_device: ToDevice | None = None,
    ) -> "MarlinWeight":
        """GPTQ tensors (``qweight [K/8, N]`` int32, ``scales [K/g, N]``; symmetric, desc_act=False)."""
        q = _host(qweight, "qweight")
        s = _host(scales, "scales")
        k, n = q.shape[0] * 8, q.shape[1]
        return cls.from_marlin(
            repack_gptq_to_marlin(q, k, n),
            repack_scales_to_marlin(s, k, n, group_size),
            k,
            group_size,
            max_par,
            to_device,
        )


# ---- launching -------------------------------------------------------------------


def launch_marlin_cuda(
    a: int,
    b: int,
    c: int,
    s: int,
    problem: W4A16Problem,
    workspace: int,
    dev: int = 0,
    stream: int = 0,
    spans: dict[str, int] | None = None,
) -> None:
    """Raw-pointer ``marlin_cuda`` with every rule checked before the call.

    ``spans`` (optional) gives the bytes each buffer holds from its pointer on,
    checked against what the problem reads and writes.
    """
    validate_w4a16(problem)
    check_int(ENTRY, "dev", dev)
    check_non_negative(ENTRY, "dev", dev)
    if problem.m == 0:
        return
    validate_w4a16_pointers(a, b, c, s, workspace)
    if spans is not None:
        required = w4a16_spans(problem)
        for name, available in spans.items():
            check_span(ENTRY, name, available, required[name])
    p = problem
    lib = library()
    code = lib.marlin_cuda(
        a, b, c, s, p.m, p.n, p.k, workspace, p.group_size, dev, stream,
        p.thread_k, p.thread_n, p.sms, p.max_par, p.n_full,
    )
    lib.check(ENTRY, code, {"m": p.m, "n": p.n, "k": p.k, "group_size": p.group_size})


def _run(
    entry: str,
    a_ptr: int,
    weight: MarlinWeight,
    c_ptr: int,
    m: int,
    expert: int,
    n: int,
    stream: int,
    thread_k: int,
    thread_n: int,
    sms: int,
) -> None:
    """Zero the expert's locks, then launch; profiling and tracing as configured."""
    q, s, ws = weight._views
    lib = library()
    config = profile.runtime_config()
    q_ptr = q.ptr + expert * (weight.k * n // 2)
    s_ptr = s.ptr + expert * (weight.groups * n * 2)
    ws_ints = workspace_ints(n, weight.max_par)
    ws_ptr = ws.ptr + expert * ws_ints * 4
    if config.zero_workspace:
        with profile.timed(lib, stream, "ws_zero", config):
            lib.check("ferrum_marlin_memset_async", lib.ferrum_marlin_memset_async(ws_ptr, 0, ws_ints * 4, stream))
    if config.trace_shapes:  # its fields are built only when they are printed
        profile.trace_shape(
            config, entry=entry, m=m, n=n, k=weight.k, gs=weight.group_size,
            qweight_len=q.size, scales_len=s.size, workspace_len=ws.size,
            a_ptr=a_ptr, b_ptr=q_ptr, c_ptr=c_ptr, s_ptr=s_ptr, ws_ptr=ws_ptr,
        )
    with profile.timed(lib, stream, "kernel", config):
        code = lib.marlin_cuda(
            a_ptr, q_ptr, c_ptr, s_ptr, m, n, weight.k, ws_ptr, weight.group_size, weight._device,
            stream, thread_k, thread_n, sms, weight.max_par, -1,
        )
    if code:  # the shape report is built only for a failure
        lib.check(entry, code, {"m": m, "n": n, "k": weight.k, "group_size": weight.group_size, "expert": expert})


_CHECKED_PER_WEIGHT = 64  # distinct call shapes remembered; more (varying prefill lengths) start over


def _check_problem(entry: str, weight: MarlinWeight, m: int, n: int, thread_k: Any = -1, thread_n: Any = -1,
                   sms: Any = -1) -> None:
    """``validate_w4a16`` of a call on ``weight``, once per call shape: its
    scalar rules were a third of a small call's host time. Only plain ``int``
    tuning arguments are remembered (a bool or NumPy integer equals an int as
    a key but not under the rules, so it is checked every time)."""
    plain = type(thread_k) is int and type(thread_n) is int and type(sms) is int
    key = (m, n, thread_k, thread_n, sms)
    if plain and key in weight._checked:
        return
    validate_w4a16(W4A16Problem(m, n, weight.k, weight.group_size, -1, thread_k, thread_n, sms, weight.max_par),
                   entry)
    if plain:
        if len(weight._checked) >= _CHECKED_PER_WEIGHT:
            weight._checked.clear()
        weight._checked.add(key)


def _activations(entry: str, a: Any, weight: MarlinWeight) -> DeviceArray:
    view = as_device_array(a, "a")
    check_array(entry, "a", view, np.float16, ndim=2)
    if view.shape[1] != weight.k:
        fail(f"{entry}: a has {view.shape[1]} columns, the weight has k={weight.k}")
    return view


def _check_device(entry: str, name: str, obj: Any, view: DeviceArray, weight: MarlinWeight) -> None:
    if view.size and device_of(obj, view) != weight._device:
        fail(f"{entry}: {name} is on device {device_of(obj, view)}, the weight on device {weight._device}")


def _output(entry: str, out: Any, a: Any, a_view: DeviceArray, shape: tuple[int, ...], device: int) -> tuple[Any, DeviceArray]:
    if out is None:
        out = allocate(a, a_view, shape, np.dtype(np.float16), device)
        return out, as_device_array(out, "out")
    view = as_device_array(out, "out")
    check_array(entry, "out", view, np.float16, ndim=2)
    check_shape(entry, "out", view, shape)
    if view.readonly:
        fail(f"{entry}: out is read-only")
    return out, view


def marlin_gemm(
    a: Any,
    weight: MarlinWeight,
    out: Any = None,
    stream: Any = None,
    *,
    thread_k: int = -1,
    thread_n: int = -1,
    sms: int = -1,
) -> Any:
    """``out[m, n] = a[m, k] @ dequant(weight)``, fp16, on ``stream``.

    ``a`` is any CUDA array (CuPy, ``__cuda_array_interface__``, DLPack); ``out``
    is allocated in ``a``'s library when omitted. Never synchronises.
    """
    entry = "marlin_gemm"
    if weight.num_experts != 1:
        fail(f"{entry}: weight stacks {weight.num_experts} experts; use marlin_gemm_with_offset")
    a_view = _activations(entry, a, weight)
    m = a_view.shape[0]
    _check_problem(entry, weight, m, weight.n, thread_k, thread_n, sms)
    _check_device(entry, "a", a, a_view, weight)
    out, c_view = _output(entry, out, a, a_view, (m, weight.n), weight._device)
    _check_device(entry, "out", out, c_view, weight)
    if m == 0:
        return out
    handle = prepare_stream(stream, (a_view, c_view))
    _run(entry, a_view.ptr, weight, c_view.ptr, m, 0, weight.n, handle, thread_k, thread_n, sms)
    return out


def marlin_gemm_with_offset(
    a: Any,
    weight: MarlinWeight,
    expert_offset: int,
    expert_n: int,
    out: Any = None,
    stream: Any = None,
) -> Any:
    """The column slice ``[expert_offset, expert_offset + expert_n)`` of a stacked weight."""
    entry = "marlin_gemm_with_offset"
    expert = validate_expert_slice(entry, expert_offset, expert_n, weight.n, weight.expert_n)
    _check_expert_spans(entry, weight, expert, expert_n)
    a_view = _activations(entry, a, weight)
    m = a_view.shape[0]
    _check_problem(entry, weight, m, expert_n)
    _check_device(entry, "a", a, a_view, weight)
    out, c_view = _output(entry, out, a, a_view, (m, expert_n), weight._device)
    _check_device(entry, "out", out, c_view, weight)
    if m == 0:
        return out
    handle = prepare_stream(stream, (a_view, c_view))
    _run(entry, a_view.ptr, weight, c_view.ptr, m, expert, expert_n, handle, -1, -1, -1)
    return out


def marlin_gemm_with_offset_strided(
    a: Any,
    in_row_offset: int,
    weight: MarlinWeight,
    out: Any,
    out_row_offset: int,
    m: int,
    expert_offset: int,
    expert_n: int,
    stream: Any = None,
) -> Any:
    """Like :func:`marlin_gemm_with_offset` on rows ``[in_row_offset, +m)`` of ``a``,
    writing ``m`` rows of ``expert_n`` values at row ``out_row_offset`` of ``out``
    (``out`` viewed as consecutive rows of ``expert_n`` fp16 values)."""
    entry = "marlin_gemm_with_offset_strided"
    expert = validate_expert_slice(entry, expert_offset, expert_n, weight.n, weight.expert_n)
    _check_expert_spans(entry, weight, expert, expert_n)
    for name, value in (("in_row_offset", in_row_offset), ("out_row_offset", out_row_offset), ("m", m)):
        check_int(entry, name, value)
        check_non_negative(entry, name, value)
    a_view = _activations(entry, a, weight)
    if in_row_offset + m > a_view.shape[0]:
        fail(f"{entry}: rows [{in_row_offset}, {in_row_offset + m}) exceed a's {a_view.shape[0]} rows")
    c_view = as_device_array(out, "out")
    check_array(entry, "out", c_view, np.float16)
    if (out_row_offset + m) * expert_n > c_view.size:
        fail(f"{entry}: out holds {c_view.size} values, rows [{out_row_offset}, {out_row_offset + m}) "
             f"of {expert_n} need {(out_row_offset + m) * expert_n}")
    if c_view.readonly:
        fail(f"{entry}: out is read-only")
    _check_problem(entry, weight, m, expert_n)
    _check_device(entry, "a", a, a_view, weight)
    _check_device(entry, "out", out, c_view, weight)
    if m == 0:
        return out
    handle = prepare_stream(stream, (a_view, c_view))
    a_ptr = a_view.ptr + in_row_offset * weight.k * 2
    c_ptr = c_view.ptr + out_row_offset * expert_n * 2
    _run(entry, a_ptr, weight, c_ptr, m, expert, expert_n, handle, -1, -1, -1)
    return out


def _check_expert_spans(entry: str, weight: MarlinWeight, expert: int, expert_n: int) -> None:
    """The per-expert blocks of expert ``expert`` lie inside the weight's buffers."""
    q, s, ws = weight._views
    needs = {
        "qweight": (q.nbytes, (expert + 1) * weight.k * expert_n // 2),
        "scales": (s.nbytes, (expert + 1) * weight.groups * expert_n * 2),
        "workspace": (ws.nbytes, (expert + 1) * workspace_ints(expert_n, weight.max_par) * 4),
    }
    for name, (available, required) in needs.items():
        check_span(entry, name, available, required)
