"""Stacked expert weights of the fused-MoE Marlin GEMMs, prepared on the host.

A :class:`MarlinMoeWeight` holds one projection (gate/up or down) of all
experts in the buffers ``ferrum_vllm_marlin_moe_*`` read (``ferrum_marlin.h``,
"Fused-MoE Marlin GEMMs"), expert after expert:

====================  ==========================  ===========================  ================
kind (entry point)    qweight int32               scales                       zero_points int32
====================  ==========================  ===========================  ================
``u4b8`` (f16)        ``[E, K/16, 2N]``           fp16 ``[E, G, N]``           --
``u4`` (f16, has_zp)  ``[E, K/16, 2N]``           fp16 ``[E, G, N]``           ``[E, G, N/8]``
``fe4m3fn`` (fp8)     ``[E, K/16, 4N]``           fp16 ``[E, K/128, N]`` x256  --
``mxfp4`` (mxfp4)     ``[E, K/16, 2N]`` (E2M1)    uint8 E8M0 ``[E, K/32, N]``  --
====================  ==========================  ===========================  ================

Each expert's slice is exactly the dense Marlin buffer of that expert (built
by the dense converters of :mod:`ferrum_ffi.formats`), scales and zero points
in Marlin order; ``G = K / group_size`` (1 for channelwise, -1). ``k`` is the
physical K the kernel runs with; it differs from ``logical_k`` only for MXFP4
projections whose K is a multiple of 32 but not of 64 (rounded up to 64,
:func:`~ferrum_ffi.formats.mxfp4_physical_k`), or whose ``physical_k`` was
given explicitly (e.g. the original engine's 2944 for GPT-OSS's 2880).

Shape rule of every kind: ``n`` and ``k`` multiples of 64. No tile has to
divide them: the kernels run a partial last tile.

Bias: for ``mxfp4`` always present, bf16 ``[E, N]`` in the channelwise (P32)
order the kernel adds it in (zeros when the checkpoint has none). The INT4
and FP8 entry points take no bias, so for those kinds ``bias`` is the
checkpoint's optional fp16 ``[E, N]`` in **logical** order, for the layer to
add itself.

INT4 and FP8 experts go through the dense preparation, which wants K a
multiple of 128 and N of 64.
Act-order (GPTQ ``desc_act``) is refused: the MoE kernels gather no
activations. Arrays stay on the host until :meth:`MarlinMoeWeight.to_device`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Callable, Sequence

import numpy as np

from ._abi import INT_GROUP_SIZE_RULE, WeightType, int_group_size_served
from ._devices import ToDevice, bfloat16_dtype, host_array, upload
from ._interop import as_device_array
from .formats._common import check_ndarray, check_scale_values, check_shape, check_size, to_float16_finite
from .formats.fp8 import FP8_BLOCK, quantize_fp8_blocks
from .formats.gptq import repack_gptq_to_marlin
from .formats.marlin import CHUNK_COLUMNS
from .formats.mxfp4 import (
    MXFP4_GROUP_SIZE,
    decode_mxfp4,
    mxfp4_physical_k,
    pad_mxfp4_k,
    permute_mxfp4_marlin_bias_bf16,
    prepare_mxfp4_expert_scales_for_marlin,
    quantize_mxfp4,
    transpose_mxfp4_expert_blocks_to_gptq_words,
)
from .formats.prepare import (
    PreparedLinear,
    prepare_awq,
    prepare_compressed_tensors,
    prepare_float,
    prepare_fp8,
    prepare_gptq,
)
from .status import ArgumentError, ArgumentTypeError
from .validation import check_array, fail
from .validation import check_shape as check_device_shape

__all__ = ["MarlinMoeWeight", "MOE_KINDS"]

ENTRY = "MarlinMoeWeight"
MOE_KINDS = ("u4b8", "u4", "fe4m3fn", "mxfp4")
"""Weight kinds of the fused-MoE GEMMs."""
_KIND_OF = {WeightType.U4B8: "u4b8", WeightType.U4: "u4", WeightType.FE4M3FN: "fe4m3fn"}
_GROUP_SIZES = {"fe4m3fn": ((-1, 128), "-1 or 128"), "mxfp4": ((32,), "32")}  # integer kinds: _abi's rule


@dataclass(frozen=True, eq=False)
class MarlinMoeWeight:
    """One projection of ``num_experts`` experts for the fused-MoE GEMMs:
    ``y = x[:, :k] @ W_e`` with ``W_e [k, n]`` (module doc for the buffers).

    The arrays are host NumPy arrays, or device arrays after
    :meth:`to_device`; every one is C-contiguous. ``reference`` (when kept)
    computes the float64 weights ``[E, logical_k, n]`` with the source
    format's own decoder (see :meth:`dequantize`)."""

    kind: str
    num_experts: int
    n: int
    k: int
    logical_k: int
    group_size: int
    qweight: Any
    scales: Any
    zero_points: Any = None
    bias: Any = None
    reference: Callable[[], np.ndarray] | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.kind not in MOE_KINDS:
            fail(f"{ENTRY}: kind={self.kind!r} must be one of {', '.join(MOE_KINDS)}")
        for name in ("num_experts", "n", "k", "logical_k"):
            check_size(ENTRY, name, getattr(self, name))
        _check_shape(ENTRY, self.n, self.k)
        if self.kind == "mxfp4":
            check_size(ENTRY, "logical_k", self.logical_k, MXFP4_GROUP_SIZE)
            if self.logical_k > self.k:
                fail(f"{ENTRY}: logical_k={self.logical_k} must not exceed k={self.k}")
        elif self.logical_k != self.k:
            fail(f"{ENTRY}: logical_k={self.logical_k} must equal k={self.k} for kind {self.kind!r} "
                 "(only MXFP4 pads K)")
        allowed, rule = _GROUP_SIZES.get(self.kind, (None, INT_GROUP_SIZE_RULE))
        served = int_group_size_served(self.group_size) if allowed is None else self.group_size in allowed
        if not served or (self.group_size != -1 and self.k % self.group_size):
            fail(f"{ENTRY}: group_size={self.group_size} must be {rule} for kind {self.kind!r} and divide k={self.k}")
        if (self.zero_points is not None) != (self.kind == "u4"):
            fail(f"{ENTRY}: zero_points must be given exactly for kind 'u4' (kind={self.kind!r})")
        if self.kind == "mxfp4" and self.bias is None:
            fail(f"{ENTRY}: bias is required for kind 'mxfp4' (the kernel reads it; zeros for none)")
        e, n, g = self.num_experts, self.n, self.num_groups
        words = 4 * n if self.kind == "fe4m3fn" else 2 * n
        places = {
            _check_buffer("qweight", self.qweight, np.int32, (e, self.k // 16, words)),
            _check_buffer("scales", self.scales, np.uint8 if self.kind == "mxfp4" else np.float16, (e, g, n)),
        }
        if self.zero_points is not None:
            places.add(_check_buffer("zero_points", self.zero_points, np.int32, (e, g, n // 8)))
        if self.bias is not None:
            bias_dtype = bfloat16_dtype() if self.kind == "mxfp4" else np.dtype(np.float16)
            places.add(_check_buffer("bias", self.bias, bias_dtype, (e, n)))
        if len(places) != 1:
            fail(f"{ENTRY}: the buffers must be all host (numpy) arrays or all device arrays")

    # ---- facts ------------------------------------------------------------------------

    @property
    def num_groups(self) -> int:
        return 1 if self.group_size == -1 else self.k // self.group_size

    @property
    def expert_bytes(self) -> int:
        """What one expert's slab streams: its codes, scales, zero points and bias."""
        n, groups = self.n, self.num_groups
        codes = self.k * n * (8 if self.kind == "fe4m3fn" else 4) // 8
        scales = groups * n * (1 if self.kind == "mxfp4" else 2)
        zeros = groups * n // 2 if self.zero_points is not None else 0
        bias = 2 * n if self.bias is not None else 0
        return codes + scales + zeros + bias

    @property
    def on_device(self) -> bool:
        return not isinstance(self.qweight, np.ndarray)

    @property
    def activation_dtype(self) -> np.dtype:
        """bf16 for MXFP4 (the only MXFP4 entry point), fp16 for the others."""
        return bfloat16_dtype() if self.kind == "mxfp4" else np.dtype(np.float16)

    def dequantize(self) -> np.ndarray:
        """float64 ``W [E, logical_k, n]`` (``y = x @ W[e]``) from the source
        tensors with their format's own reference decoder -- independent of
        the Marlin buffers, hence the ground truth of the GPU tests."""
        if self.reference is None:
            raise ArgumentError(f"{ENTRY}: no reference kept for this weight (built with keep_reference=False)")
        return self.reference()

    def to_device(self, to_device: ToDevice | None = None) -> "MarlinMoeWeight":
        """The same weight with its buffers uploaded: through ``to_device(host)``
        when given (e.g. a torch upload function), else CuPy. The reference
        is kept; the host arrays are not referenced by the result."""
        if self.on_device:
            fail(f"{ENTRY}.to_device: the buffers are already on a device")

        def up(array: np.ndarray | None) -> Any:
            return None if array is None else upload(array, to_device)

        return dataclasses.replace(
            self, qweight=up(self.qweight), scales=up(self.scales),
            zero_points=up(self.zero_points), bias=up(self.bias),
        )

    # ---- constructors: integer checkpoints ----------------------------------------------

    @classmethod
    def from_gptq(
        cls, qweight: Any, scales: Any, qzeros: Any = None, g_idx: Any = None, bits: int = 4, sym: bool = True,
        *, group_size: int | None = None, bias: Any = None, keep_reference: bool = True,
    ) -> "MarlinMoeWeight":
        """Stacked AutoGPTQ tensors: ``qweight [E, K/8, N]`` int32, ``scales
        [E, G, N]``, ``qzeros [E, G, N/8]`` (storing zero - 1), ``g_idx [E, K]``
        (must be ``k // group_size``: no act-order). ``sym``: ``u4b8``, else
        ``u4`` with zero points. 4-bit only."""
        fn = f"{ENTRY}.from_gptq"
        if bits != 4:
            fail(f"{fn}: bits={bits!r} must be 4 (the MoE kernels read 4-bit integer codes)")
        stacked = _stacked(fn, qweight=(qweight, 3), scales=(scales, 3), qzeros=(qzeros, 3), g_idx=(g_idx, 2))
        return cls._from_experts(fn, stacked, bias, keep_reference, lambda e, name: prepare_gptq(
            *_expert(stacked, e, "qweight", "scales", "qzeros", "g_idx"), bits=4, sym=sym, group_size=group_size,
            keep_reference=keep_reference, fn=name,
        ))

    @classmethod
    def from_awq(
        cls, qweight: Any, scales: Any, qzeros: Any,
        *, group_size: int | None = None, bias: Any = None, keep_reference: bool = True,
    ) -> "MarlinMoeWeight":
        """Stacked AutoAWQ GEMM tensors: ``qweight [E, K, N/8]`` int32 (AWQ
        nibble order), ``scales [E, G, N]``, ``qzeros [E, G, N/8]`` -> ``u4``."""
        fn = f"{ENTRY}.from_awq"
        stacked = _stacked(fn, qweight=(qweight, 3), scales=(scales, 3), qzeros=(qzeros, 3))
        return cls._from_experts(fn, stacked, bias, keep_reference, lambda e, name: prepare_awq(
            *_expert(stacked, e, "qweight", "scales", "qzeros"), group_size=group_size,
            keep_reference=keep_reference, fn=name,
        ))

    @classmethod
    def from_compressed_tensors(
        cls, weight_packed: Any, weight_scale: Any, weight_zero_point: Any = None, weight_shape: Any = None,
        *, group_size: int | None = None, bias: Any = None, keep_reference: bool = True,
    ) -> "MarlinMoeWeight":
        """Stacked compressed-tensors INT4 pack-quantized tensors:
        ``weight_packed [E, N, K/8]`` int32, ``weight_scale [E, N, G]``,
        optional ``weight_zero_point [E, N/8, G]`` (asymmetric -> ``u4``, else
        ``u4b8``), ``weight_shape`` ``(N, K)`` for every expert or ``[E, 2]``."""
        fn = f"{ENTRY}.from_compressed_tensors"
        stacked = _stacked(fn, weight_packed=(weight_packed, 3), weight_scale=(weight_scale, 3),
                           weight_zero_point=(weight_zero_point, 3))
        shapes = _per_expert_weight_shape(fn, weight_shape, stacked["weight_packed"].shape[0])
        return cls._from_experts(fn, stacked, bias, keep_reference, lambda e, name: prepare_compressed_tensors(
            *_expert(stacked, e, "weight_packed", "weight_scale", "weight_zero_point"), bits=4,
            group_size=group_size, weight_shape=shapes[e], keep_reference=keep_reference, fn=name,
        ))

    @classmethod
    def from_fp8_blocks(
        cls, weight_e4m3: Any, scale_inv: Any, *, bias: Any = None, keep_reference: bool = True,
    ) -> "MarlinMoeWeight":
        """Stacked block-FP8 tensors: ``weight_e4m3 [E, N, K]`` (uint8 bytes or
        float8_e4m3fn), ``scale_inv [E, ceil(N/128), ceil(K/128)]`` (float or
        bf16; they multiply) -> ``fe4m3fn``, group size 128 along K: expert
        ``e``'s scales ``s[g, col] = scale_inv[e, col // 128, g] * 256`` in fp16,
        Marlin order (what ``prepare_block_fp8_weight_for_fp8_marlin`` gives)."""
        fn = f"{ENTRY}.from_fp8_blocks"
        stacked = _stacked(fn, weight_e4m3=(weight_e4m3, 3), scale_inv=(scale_inv, 3))
        return cls._from_experts(fn, stacked, bias, keep_reference, lambda e, name: prepare_fp8(
            *_expert(stacked, e, "weight_e4m3", "scale_inv"), block=FP8_BLOCK, keep_reference=keep_reference,
            fn=name,
        ))

    @classmethod
    def _from_experts(
        cls, fn: str, stacked: dict[str, np.ndarray | None], bias: Any, keep_reference: bool,
        prepare: Callable[[int, str], PreparedLinear],
    ) -> "MarlinMoeWeight":
        """Prepare every expert with its dense converter (``prepare(e, name)``,
        ``name`` for its messages) and stack the buffers."""
        experts = next(iter(stacked.values())).shape[0]
        first = prepare(0, f"{fn} (expert 0)")
        qweight = np.empty((experts,) + first.b.shape, dtype=np.int32)
        scales = np.empty((experts,) + first.scales.shape, dtype=first.scales.dtype)
        zero_points = None if first.zero_points is None else np.empty((experts,) + first.zero_points.shape, np.int32)
        references = []
        for e in range(experts):
            prepared = first if e == 0 else prepare(e, f"{fn} (expert {e})")
            if prepared.perm is not None:
                fail(f"{fn} (expert {e}): g_idx is an act-order (desc_act) order; MoE weights do not support "
                     "act-order (the MoE kernels gather no activations)")
            qweight[e] = prepared.b
            scales[e] = prepared.scales
            if zero_points is not None:
                zero_points[e] = prepared.zero_points
            references.append(prepared.reference)
        return cls(
            kind=_KIND_OF[first.b_type], num_experts=experts, n=first.n, k=first.k, logical_k=first.k,
            group_size=first.group_size, qweight=qweight, scales=scales, zero_points=zero_points,
            bias=None if bias is None else _fp16_bias(fn, bias, experts, first.n),
            reference=partial(_stack_references, tuple(references)) if keep_reference else None,
        )

    # ---- constructors: MXFP4 and float --------------------------------------------------

    @classmethod
    def from_mxfp4(
        cls, blocks: Any, scales: Any, bias: Any = None, physical_k: int | None = None,
        *, keep_reference: bool = True,
    ) -> "MarlinMoeWeight":
        """Stacked GPT-OSS MXFP4 tensors: ``blocks [E, N, K/2]`` uint8 (two
        E2M1 codes a byte, low nibble first), ``scales [E, N, K/32]`` uint8
        E8M0, optional ``bias [E, N]`` (bf16 as ml_dtypes bfloat16 or uint16
        bits, or float, rounded once to bf16). ``physical_k`` defaults to
        :func:`~ferrum_ffi.formats.mxfp4_physical_k` (the logical K rounded
        up to 64: no padding for GPT-OSS's 2880); an explicit one (a multiple
        of 64, at least the logical K, e.g. 2944 for the original engine's
        layout) is honoured. Padded features get zero codes and scale bytes."""
        fn = f"{ENTRY}.from_mxfp4"
        stacked = _stacked(fn, blocks=(blocks, 3), scales=(scales, 3))
        blocks, scales = stacked["blocks"], stacked["scales"]
        experts, n, logical_k = blocks.shape[0], blocks.shape[1], 2 * blocks.shape[2]
        check_size(fn, "n = blocks.shape[1]", n, CHUNK_COLUMNS)
        if physical_k is None:
            physical_k = mxfp4_physical_k(n, logical_k)
        # The kernels' minimum thread width (n was checked above).
        physical_k = check_size(fn, "physical_k", physical_k, 64)
        if physical_k < logical_k:
            fail(f"{fn}: physical_k={physical_k} must be at least the logical K={logical_k} (2 * blocks.shape[2])")
        padded_blocks, padded_scales = pad_mxfp4_k(blocks, scales, physical_k)
        qweight = np.empty((experts, physical_k // 16, 2 * n), dtype=np.int32)
        marlin_scales = np.empty((experts, physical_k // MXFP4_GROUP_SIZE, n), dtype=np.uint8)
        for e in range(experts):
            words = transpose_mxfp4_expert_blocks_to_gptq_words(padded_blocks[e], n, physical_k)
            qweight[e] = repack_gptq_to_marlin(words, physical_k, n)
            marlin_scales[e] = prepare_mxfp4_expert_scales_for_marlin(padded_scales[e], n, physical_k)
        bf16 = bfloat16_dtype()
        bias_bits = np.zeros((experts, n), dtype=np.uint16) if bias is None else _bf16_bias_bits(fn, bias, experts, n)
        return cls(
            kind="mxfp4", num_experts=experts, n=n, k=physical_k, logical_k=logical_k,
            group_size=MXFP4_GROUP_SIZE, qweight=qweight, scales=marlin_scales,
            bias=permute_mxfp4_marlin_bias_bf16(bias_bits, experts, n).view(bf16),
            reference=partial(_mxfp4_reference, blocks, scales) if keep_reference else None,
        )

    @classmethod
    def from_float(
        cls, w: Any, kind: str, group_size: int | None = None, *, keep_reference: bool = True,
    ) -> "MarlinMoeWeight":
        """Float ``w [E, N, K]`` (torch Linear orientation, like the FP8 and
        MXFP4 checkpoints) quantised round-to-nearest, for tests and demos:
        ``u4b8`` / ``u4`` per :func:`~ferrum_ffi.formats.quantize_rtn` (group
        size -1, 32, 64 or a power of two >= 128, default 128), ``fe4m3fn`` per
        :func:`~ferrum_ffi.formats.quantize_fp8_blocks` (group 128),
        ``mxfp4`` per :func:`~ferrum_ffi.formats.quantize_mxfp4` (group 32).
        :meth:`dequantize` then gives the quantised weights ``[E, K, N]``."""
        fn = f"{ENTRY}.from_float"
        if kind not in MOE_KINDS:
            fail(f"{fn}: kind={kind!r} must be one of {', '.join(MOE_KINDS)}")
        natural = {"u4b8": 128, "u4": 128, "fe4m3fn": 128, "mxfp4": MXFP4_GROUP_SIZE}[kind]
        group_size = natural if group_size is None else group_size
        if kind in ("fe4m3fn", "mxfp4") and group_size != natural:
            fail(f"{fn}: group_size={group_size!r} must be {natural} for kind {kind!r}")
        w = _stacked(fn, w=(w, 3))["w"]
        if kind == "mxfp4":
            blocks, scales = quantize_mxfp4(w)
            return cls.from_mxfp4(blocks, scales, keep_reference=keep_reference)
        if kind == "fe4m3fn":
            quantised = [quantize_fp8_blocks(w[e]) for e in range(w.shape[0])]
            return cls.from_fp8_blocks(np.stack([q for q, _ in quantised]), np.stack([s for _, s in quantised]),
                                       keep_reference=keep_reference)
        stacked = {"w": w}
        return cls._from_experts(fn, stacked, None, keep_reference, lambda e, name: prepare_float(
            w[e].T, bits=4, group_size=group_size, sym=kind == "u4b8", keep_reference=keep_reference, fn=name,
        ))


# ---- helpers ---------------------------------------------------------------------------------


def _check_shape(fn: str, n: int, k: int) -> None:
    """N and K multiples of 64, the kernels' shape rule (a tile that does not
    divide them runs a partial last tile)."""
    check_size(fn, "n", n, CHUNK_COLUMNS)
    check_size(fn, "k", k, 64)


def _check_buffer(name: str, value: Any, dtype: np.dtype | type, shape: tuple[int, ...]) -> bool:
    """dtype, shape and C order of a host or device buffer; True for host."""
    if isinstance(value, np.ndarray):
        if value.dtype != np.dtype(dtype):
            raise ArgumentTypeError(f"{ENTRY}: {name} must have dtype {np.dtype(dtype).name}, got {value.dtype}")
        if value.shape != shape:
            fail(f"{ENTRY}: {name} must have shape {shape}, got {value.shape}")
        if not value.flags.c_contiguous:
            fail(f"{ENTRY}: {name} must be C-contiguous")
        return True
    view = as_device_array(value, name)
    check_array(ENTRY, name, view, dtype, ndim=len(shape))
    check_device_shape(ENTRY, name, view, shape)
    return False


def _stacked(fn: str, **arrays: tuple[Any, int]) -> dict[str, np.ndarray | None]:
    """Host views of the stacked checkpoint tensors ``name=(array, ndim)``
    (None stays None), every one with the same number of experts first."""
    out: dict[str, np.ndarray | None] = {}
    experts: tuple[str, int] | None = None
    for name, (value, ndim) in arrays.items():
        if value is None:
            out[name] = None
            continue
        array = check_ndarray(fn, name, host_array(value, name))
        if array.ndim != ndim:
            fail(f"{fn}: {name} must be {ndim}-D with the experts first, got shape {array.shape}")
        check_size(fn, f"{name}.shape[0] (experts)", array.shape[0])
        if experts is None:
            experts = (name, array.shape[0])
        elif array.shape[0] != experts[1]:
            fail(f"{fn}: {name}.shape[0]={array.shape[0]} must equal {experts[0]}.shape[0]={experts[1]} (experts)")
        out[name] = array
    return out


def _expert(stacked: dict[str, np.ndarray | None], e: int, *names: str) -> list[np.ndarray | None]:
    return [None if stacked[name] is None else stacked[name][e] for name in names]


def _per_expert_weight_shape(fn: str, weight_shape: Any, experts: int) -> Sequence[Any]:
    """compressed-tensors ``weight_shape``: one ``(N, K)`` for all experts or ``[E, 2]``."""
    if isinstance(weight_shape, np.ndarray) and weight_shape.ndim == 2:
        check_shape(fn, "weight_shape", weight_shape, (experts, 2), "[E, 2] or one (N, K)")
        return list(weight_shape)
    return [weight_shape] * experts


def _stack_references(references: tuple[Callable[[], np.ndarray], ...]) -> np.ndarray:
    return np.stack([reference() for reference in references])


def _mxfp4_reference(blocks: np.ndarray, scales: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(decode_mxfp4(blocks, scales).transpose(0, 2, 1))


def _fp16_bias(fn: str, bias: Any, experts: int, n: int) -> np.ndarray:
    """The optional INT4/FP8 bias: float or bf16 ``[E, N]`` -> fp16, logical order."""
    values = check_scale_values(fn, "bias", host_array(bias, "bias"))
    check_shape(fn, "bias", values, (experts, n), "[E, N]")
    return np.ascontiguousarray(to_float16_finite(fn, "bias", values))


def _bf16_bias_bits(fn: str, bias: Any, experts: int, n: int) -> np.ndarray:
    """The MXFP4 bias as bf16 bit patterns ``[E, N]``: bfloat16 / uint16 as
    given, float rounded once to bf16 (must stay finite)."""
    bias = check_ndarray(fn, "bias", host_array(bias, "bias"))
    check_shape(fn, "bias", bias, (experts, n), "[E, N]")
    if bias.dtype == np.uint16 or bias.dtype == bfloat16_dtype():
        return np.ascontiguousarray(bias).view(np.uint16)
    if bias.dtype.kind != "f":
        raise ArgumentTypeError(
            f"{fn}: bias must have dtype bfloat16, uint16 (bf16 bits) or a float dtype, got {bias.dtype}"
        )
    with np.errstate(over="ignore"):
        rounded = bias.astype(bfloat16_dtype())
    if not np.isfinite(rounded.astype(np.float32)).all():
        fail(f"{fn}: bias must be finite in bfloat16")
    return rounded.view(np.uint16)
