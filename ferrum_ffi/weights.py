"""Weights of the general Marlin GEMM, on the device, built from real checkpoints.

A :class:`MarlinLinearWeight` holds what ``ferrum_marlin_mm`` reads for one
linear layer -- packed codes, scales in the activation dtype, zero points,
act-order ``g_idx`` / ``perm`` -- plus the layer's facts (``k``, ``n``,
``group_size``, weight type, activation dtype). The classmethods convert each
on-disk format on the host (``ferrum_ffi.formats.prepare``) and upload the
result; :func:`ferrum_ffi.linear` runs it.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from ._abi import (
    FERRUM_MM_FLAG_ACT_ORDER,
    FERRUM_MM_FLAG_HAS_ZERO_POINTS,
    FERRUM_MM_FLAG_K_FULL,
    ActivationType,
    WeightType,
)
from ._devices import ToDevice, device_of, host_array, is_bfloat16, upload
from ._interop import DeviceArray, as_device_array
from .formats.prepare import (
    PreparedLinear,
    prepare_awq,
    prepare_compressed_tensors,
    prepare_float,
    prepare_fp8,
    prepare_gptq,
)
from .formats.rtn import check_activation_dtype
from .status import ArgumentError, ArgumentTypeError
from .validation import MmProblem, check_array, check_int, check_shape, fail, validate_mm

__all__ = ["MarlinLinearWeight"]

ENTRY = "MarlinLinearWeight"


def _optional_host(value: Any, name: str) -> np.ndarray | None:
    return None if value is None else host_array(value, name)


@functools.lru_cache(maxsize=None)
def _activation_type(dtype: np.dtype) -> ActivationType:
    return ActivationType.BF16 if is_bfloat16(dtype) else ActivationType.F16


@dataclass
class MarlinLinearWeight:
    """One linear layer for ``ferrum_marlin_mm``: ``y[m, n] = x[m, k] @ W[k, n]``.

    Device arrays (any CUDA array library): ``b`` int32 ``[k/16, 2n]`` (U4,
    U4B8) or ``[k/16, 4n]`` (U8B128, FE4M3FN) in the Marlin layout;
    ``scales`` ``dtype`` ``[num_groups, n]`` in Marlin order; ``zero_points``
    int32 ``[num_groups, n/8]`` for U4 only; ``g_idx`` (sorted) and ``perm``
    int32 ``[k]`` for an act-order layer only. ``dtype`` is the activation
    dtype (float16 or ml_dtypes bfloat16): activations, scales, bias and
    output share it. ``k_full=False``: a K shard of an act-order layer
    (``from_gptq(k_full=False)``): ``scales`` / ``zero_points`` hold all of
    the layer's groups (``num_groups`` is their row count) and the sorted
    ``g_idx`` names each row's group. ``in_features``: the columns of x, ``k``
    unless an act-order weight's rows were padded (a K shard whose rows are
    not a multiple of 128): then ``perm`` maps its ``k`` rows to x's
    ``in_features <= k`` columns.
    """

    b: Any
    scales: Any
    k: int
    n: int
    group_size: int
    b_type: WeightType
    dtype: np.dtype = field(default_factory=lambda: np.dtype(np.float16))
    zero_points: Any = None
    g_idx: Any = None
    perm: Any = None
    reference: Callable[[], np.ndarray] | None = field(default=None, repr=False, compare=False)
    in_features: int | None = None
    k_full: bool = True
    _views: dict[str, DeviceArray] = field(init=False, repr=False, compare=False)
    _device: int = field(init=False, repr=False, compare=False)
    _shard_groups: int = field(init=False, default=0, repr=False, compare=False)
    # linear()'s checked launch plans by call shape (general_gemm._plan).
    _plans: dict = field(init=False, default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        for name in ("k", "n", "group_size"):
            check_int(ENTRY, name, getattr(self, name))
        try:
            self.b_type = WeightType(int(self.b_type))
        except (ValueError, TypeError):
            fail(f"{ENTRY}: b_type={self.b_type!r} is not a weight type ({', '.join(t.name for t in WeightType)})")
        self.dtype = check_activation_dtype(ENTRY, self.dtype)
        if (self.g_idx is None) != (self.perm is None):
            fail(f"{ENTRY}: g_idx and perm come together (act-order) or not at all")
        if not isinstance(self.k_full, (bool, np.bool_)):
            raise ArgumentTypeError(f"{ENTRY}: k_full must be a bool, got {type(self.k_full).__name__}")
        if not self.k_full and self.perm is None:
            fail(f"{ENTRY}: k_full=False (a K shard of an act-order layer) needs g_idx and perm")
        views = {
            "b": as_device_array(self.b, "b"),
            "scales": as_device_array(self.scales, "scales"),
        }
        # A K shard's group count is its scales' (the whole layer's groups).
        self._shard_groups = views["scales"].shape[0] if views["scales"].shape else 0
        if self.in_features is None:
            self.in_features = self.k
        check_int(ENTRY, "in_features", self.in_features)
        if self.in_features != self.k and not (self.perm is not None and 1 <= self.in_features < self.k):
            fail(f"{ENTRY}: in_features={self.in_features} must equal k={self.k}, or for an act-order weight "
                 f"(perm maps its rows to x's columns) be in 1..k")
        validate_mm(self.problem(0), ENTRY)
        check_array(ENTRY, "b", views["b"], np.int32, ndim=2)
        check_shape(ENTRY, "b", views["b"], (self.k // 16, self.b_type.bits // 2 * self.n))
        check_array(ENTRY, "scales", views["scales"], self.dtype, ndim=2)
        check_shape(ENTRY, "scales", views["scales"], (self.num_groups, self.n))
        if (self.zero_points is not None) != (self.b_type is WeightType.U4):
            fail(f"{ENTRY}: zero_points must be given exactly for b_type U4 (b_type={self.b_type.name})")
        if self.zero_points is not None:
            views["zero_points"] = as_device_array(self.zero_points, "zero_points")
            check_array(ENTRY, "zero_points", views["zero_points"], np.int32, ndim=2)
            check_shape(ENTRY, "zero_points", views["zero_points"], (self.num_groups, self.n // 8))
        if self.perm is not None:
            for name in ("g_idx", "perm"):
                views[name] = as_device_array(getattr(self, name), name)
                check_array(ENTRY, name, views[name], np.int32, ndim=1, alignment=4)
                check_shape(ENTRY, name, views[name], (self.k,))
        self._views = views
        devices = {name: device_of(getattr(self, name), view) for name, view in views.items()}
        if len(set(devices.values())) != 1:
            fail(f"{ENTRY}: all buffers must be on one device, got {devices}")
        self._device = devices["b"]

    # ---- facts ------------------------------------------------------------------------

    @property
    def num_groups(self) -> int:
        if not self.k_full:
            return self._shard_groups
        return 1 if self.group_size == -1 else self.k // self.group_size

    @property
    def act_order(self) -> bool:
        """Whether the activations are gathered by ``perm`` before the GEMM."""
        return self.perm is not None

    @property
    def a_type(self) -> ActivationType:
        """The ABI id of ``dtype``."""
        return _activation_type(np.dtype(self.dtype))

    @property
    def flags(self) -> int:
        """The layer's flag bits (the reduction mode is the call's choice)."""
        flags = FERRUM_MM_FLAG_K_FULL if self.k_full else 0
        if self.b_type is WeightType.U4:
            flags |= FERRUM_MM_FLAG_HAS_ZERO_POINTS
        if self.act_order:
            flags |= FERRUM_MM_FLAG_ACT_ORDER
        return flags

    @property
    def device(self) -> int:
        return self._device

    def problem(self, m: int, *, lda: int | None = None, fp32_reduce: bool = False, sms: int = -1,
                thread_k: int = -1, thread_n: int = -1) -> MmProblem:
        """The ``ferrum_marlin_mm`` problem of ``m`` activation rows on this weight."""
        return MmProblem.create(
            m, self.n, self.k, int(self.a_type), int(self.b_type), self.group_size, lda=lda,
            act_order=self.act_order, k_full=bool(self.k_full), num_groups=self.num_groups,
            fp32_reduce=fp32_reduce, sms=sms, thread_k=thread_k, thread_n=thread_n,
        )

    def reference_dequant(self) -> np.ndarray:
        """float64 ``W[k, n]`` in the original row order, computed by the source
        format's own reference decoder (not from the Marlin buffers)."""
        if self.reference is None:
            raise ArgumentError(
                f"{ENTRY}: no reference kept for this weight (built with keep_reference=False or from buffers)"
            )
        return self.reference()

    # ---- constructors -------------------------------------------------------------------

    @classmethod
    def from_prepared(cls, prepared: PreparedLinear, to_device: ToDevice | None = None) -> "MarlinLinearWeight":
        """Upload host buffers prepared by ``ferrum_ffi.formats.prepare_*``."""
        if not isinstance(prepared, PreparedLinear):
            raise ArgumentTypeError(f"{ENTRY}.from_prepared: expected a PreparedLinear, got {type(prepared).__name__}")

        def up(array: np.ndarray | None) -> Any:
            return None if array is None else upload(np.ascontiguousarray(array), to_device)

        return cls(
            b=up(prepared.b),
            scales=up(prepared.scales),
            k=prepared.k,
            n=prepared.n,
            group_size=prepared.group_size,
            b_type=prepared.b_type,
            dtype=prepared.dtype,
            zero_points=up(prepared.zero_points),
            g_idx=up(prepared.g_idx),
            perm=up(prepared.perm),
            reference=prepared.reference,
            in_features=prepared.x_features,
            k_full=prepared.k_full,
        )

    @classmethod
    def from_gptq(
        cls,
        qweight: Any,
        scales: Any,
        qzeros: Any = None,
        g_idx: Any = None,
        bits: int = 4,
        sym: bool = True,
        desc_act: bool | None = None,
        dtype: Any = np.float16,
        *,
        group_size: int | None = None,
        k_full: bool = True,
        shard_layout: str | None = None,
        keep_reference: bool = True,
        to_device: ToDevice | None = None,
    ) -> "MarlinLinearWeight":
        """AutoGPTQ tensors: ``qweight [K*bits/32, N]`` int32, ``scales [G, N]``,
        ``qzeros [G, N*bits/32]`` (storing zero - 1), ``g_idx [K]``. ``sym``:
        U4B8 / U8B128; 4-bit asymmetric: U4 with zero points; act-order
        (desc_act) layers are permuted so that each group's rows are
        contiguous (``desc_act=None``: decided by ``g_idx``). ``k_full=False``:
        the tensors are a K shard of an act-order layer (``scales`` / ``qzeros``
        of the whole layer, ``group_size`` given), laid out by ``shard_layout``
        (vLLM's ``"row_groups"``, the default where n % 128 == 0, or
        ``"padded"``): see ``prepare_gptq``."""
        prepared = prepare_gptq(
            host_array(qweight, "qweight"), host_array(scales, "scales"), _optional_host(qzeros, "qzeros"),
            _optional_host(g_idx, "g_idx"), bits=bits, sym=sym, desc_act=desc_act, group_size=group_size,
            k_full=k_full, shard_layout=shard_layout, dtype=dtype, keep_reference=keep_reference,
            fn=f"{ENTRY}.from_gptq",
        )
        return cls.from_prepared(prepared, to_device)

    @classmethod
    def from_awq(
        cls,
        qweight: Any,
        scales: Any,
        qzeros: Any,
        dtype: Any = np.float16,
        *,
        group_size: int | None = None,
        keep_reference: bool = True,
        to_device: ToDevice | None = None,
    ) -> "MarlinLinearWeight":
        """AutoAWQ GEMM tensors: ``qweight [K, N/8]`` int32 (AWQ nibble
        order), ``scales [G, N]``, ``qzeros [G, N/8]`` -> U4 with zero points."""
        prepared = prepare_awq(
            host_array(qweight, "qweight"), host_array(scales, "scales"), host_array(qzeros, "qzeros"),
            group_size=group_size, dtype=dtype, keep_reference=keep_reference, fn=f"{ENTRY}.from_awq",
        )
        return cls.from_prepared(prepared, to_device)

    @classmethod
    def from_compressed_tensors(
        cls,
        weight_packed: Any,
        weight_scale: Any,
        weight_zero_point: Any = None,
        bits: int = 4,
        weight_shape: Any = None,
        dtype: Any = np.float16,
        *,
        group_size: int | None = None,
        keep_reference: bool = True,
        to_device: ToDevice | None = None,
    ) -> "MarlinLinearWeight":
        """compressed-tensors pack-quantized tensors: ``weight_packed [N, K*bits/32]``
        int32, ``weight_scale [N, G]``, optional ``weight_zero_point`` (asymmetric
        4-bit -> U4), ``weight_shape`` ``(N, K)``; symmetric -> U4B8 / U8B128."""
        prepared = prepare_compressed_tensors(
            host_array(weight_packed, "weight_packed"), host_array(weight_scale, "weight_scale"),
            _optional_host(weight_zero_point, "weight_zero_point"), bits=bits, group_size=group_size,
            weight_shape=weight_shape, dtype=dtype, keep_reference=keep_reference,
            fn=f"{ENTRY}.from_compressed_tensors",
        )
        return cls.from_prepared(prepared, to_device)

    @classmethod
    def from_fp8(
        cls,
        weight_e4m3: Any,
        scale: Any,
        dtype: Any = np.float16,
        *,
        block: Any = "auto",
        keep_reference: bool = True,
        to_device: ToDevice | None = None,
    ) -> "MarlinLinearWeight":
        """FP8-E4M3 ``weight [N, K]`` (float8_e4m3fn or raw uint8) with a
        per-tensor, per-channel (``[N]``/``[N, 1]``) or 128x128 block scale
        (``[ceil(N/128), ceil(K/128)]``) -> FE4M3FN; per-tensor and
        per-channel become channelwise (group -1), block scales group 128."""
        scale_host = scale if isinstance(scale, (int, float, np.number)) else host_array(scale, "scale")
        prepared = prepare_fp8(
            host_array(weight_e4m3, "weight_e4m3"), scale_host, block=block, dtype=dtype,
            keep_reference=keep_reference, fn=f"{ENTRY}.from_fp8",
        )
        return cls.from_prepared(prepared, to_device)

    @classmethod
    def from_float(
        cls,
        w: Any,
        bits: int = 4,
        group_size: int = 128,
        sym: bool = True,
        dtype: Any = np.float16,
        *,
        keep_reference: bool = True,
        to_device: ToDevice | None = None,
    ) -> "MarlinLinearWeight":
        """Float ``w [K, N]`` quantised round-to-nearest: 4-bit symmetric ->
        U4B8, 4-bit asymmetric -> U4 with zero points, 8-bit symmetric ->
        U8B128."""
        prepared = prepare_float(
            host_array(w, "w"), bits=bits, group_size=group_size, sym=sym, dtype=dtype,
            keep_reference=keep_reference, fn=f"{ENTRY}.from_float",
        )
        return cls.from_prepared(prepared, to_device)
