"""A host emulation of the native MoE entry points, for CPU tests of how
``fused_moe`` chains them: every call reads and writes real host memory at
the pointers it is given, following the header's definitions (ferrum_marlin.h,
"Fused-MoE Marlin GEMMs" and "MoE routing and the small ops"), with float64
math rounded once to the output type.

The GEMMs take their weights from a table keyed by the weight buffer's
pointer (:meth:`HostMoeLibrary.register`), so the emulation needs no Marlin
decoding. Fresh allocations are filled with NaN bytes, so a row that is read
before anything wrote it shows up in the result."""

from __future__ import annotations

import ctypes

import ml_dtypes
import numpy as np

from ferrum_ffi._abi import (
    FERRUM_DTYPE_BF16,
    FERRUM_DTYPE_F16,
    FERRUM_DTYPE_F32,
    FERRUM_MOE_ROUTING_DIRECT,
    FERRUM_MOE_ROUTING_SETTLED,
)

from . import mm_fakes
from . import moe_reference as ops

BF16 = np.dtype(ml_dtypes.bfloat16)
_DTYPES = {FERRUM_DTYPE_F16: np.dtype(np.float16), FERRUM_DTYPE_BF16: BF16, FERRUM_DTYPE_F32: np.dtype(np.float32)}


def at(ptr: int, dtype, shape) -> np.ndarray:
    """A NumPy view of host memory at ``ptr``."""
    dtype = np.dtype(dtype)
    count = int(np.prod(shape))
    raw = (ctypes.c_uint8 * (count * dtype.itemsize)).from_address(ptr)
    return np.frombuffer(raw, dtype=np.uint8).view(dtype).reshape(shape)


class HostFlat:
    """A host-backed stand-in for a device array (16-byte aligned) that slices
    and reshapes into views, as CuPy and torch arrays do."""

    def __init__(self, array: np.ndarray):
        assert array.ctypes.data % 16 == 0
        self.array = array
        self.dtype = array.dtype
        bf16 = array.dtype == BF16
        self.__cuda_array_interface__ = {
            "version": 3, "shape": array.shape, "typestr": "<V2" if bf16 else array.dtype.str,
            "data": (array.ctypes.data, False), "strides": None,
        }

    @classmethod
    def empty(cls, shape, dtype) -> "HostFlat":
        dtype = np.dtype(dtype)
        count = int(np.prod(shape))
        raw = np.full(count * dtype.itemsize + 16, 0xFF, dtype=np.uint8)  # NaN / -1 in every dtype
        offset = (-raw.ctypes.data) % 16
        return cls(raw[offset:offset + count * dtype.itemsize].view(dtype).reshape(shape))

    def __getitem__(self, index: slice) -> "HostFlat":
        return HostFlat(self.array[index])

    def reshape(self, shape) -> "HostFlat":
        return HostFlat(self.array.reshape(shape))


def _round(x: np.ndarray, dtype: np.dtype) -> np.ndarray:
    with np.errstate(over="ignore", invalid="ignore"):
        return np.asarray(x, dtype=np.float64).astype(dtype)


class HostMoeLibrary(mm_fakes.FakeLibrary):
    """The native entry points of a MoE layer, run on the host; ``calls``
    records their names in order."""

    def __init__(self, sms: int = 4):
        super().__init__(sms=sms)
        self.calls: list[str] = []
        self.weights: dict[int, tuple[np.ndarray, np.ndarray | None]] = {}

    def register(self, weight, dense: np.ndarray, bias: np.ndarray | None = None) -> None:
        """The float64 ``dense [E, logical_k, n]`` (and logical bias ``[E, n]``)
        of a device weight whose ``qweight`` is host-backed; K is zero-padded
        to the weight's physical K, as the padded codes weigh 0."""
        padded = np.zeros((dense.shape[0], weight.k, dense.shape[2]))
        padded[:, : dense.shape[1]] = dense
        self.weights[weight.qweight.__cuda_array_interface__["data"][0]] = (padded, bias)

    # ---- routing and small ops ---------------------------------------------------------

    def ferrum_moe_align_block_size(self, topk_ids, num_tokens, top_k, num_experts, block_size, expert_map,
                                    sorted_ids, sorted_capacity, expert_ids, expert_capacity, count, dev, stream):
        self.calls.append("align")
        ids = at(topk_ids, np.int32, (num_tokens, top_k))
        mapping = None if expert_map is None else at(expert_map, np.int32, (num_experts,))
        results = ops.moe_align_block_size(ids, num_experts, block_size, mapping, sorted_capacity, expert_capacity)
        for ptr, values in zip((sorted_ids, expert_ids, count), results):
            at(ptr, np.int32, values.shape)[...] = values
        return 0

    def ferrum_moe_align_block_size_ex(self, topk_ids, num_tokens, top_k, num_experts, block_size, expert_map,
                                       sorted_ids, sorted_capacity, expert_ids, expert_capacity, count, dev, stream,
                                       clear, clear_bytes):
        self.ferrum_moe_align_block_size(topk_ids, num_tokens, top_k, num_experts, block_size, expert_map,
                                         sorted_ids, sorted_capacity, expert_ids, expert_capacity, count, dev, stream)
        ctypes.memset(clear, 0, clear_bytes)
        return 0

    def ferrum_topk_softmax(self, logits, dtype, num_tokens, num_experts, top_k, renormalize, weights, ids, dev,
                            stream):
        self.calls.append("topk_softmax")
        w, i = ops.topk_softmax(at(logits, _DTYPES[dtype], (num_tokens, num_experts)), top_k, bool(renormalize))
        at(weights, np.float32, w.shape)[...] = w
        at(ids, np.int32, i.shape)[...] = i
        return 0

    def ferrum_silu_and_mul(self, x, out, rows, d, dtype, dev, stream):
        self.calls.append("silu_and_mul")
        kind = _DTYPES[dtype]
        at(out, kind, (rows, d))[...] = _round(ops.silu_and_mul(at(x, kind, (rows, 2 * d))), kind)
        return 0

    def ferrum_gpt_oss_swiglu(self, x, out, rows, logical_d, physical_d, alpha, limit, dtype, dev, stream):
        self.calls.append("gpt_oss_swiglu")
        kind = _DTYPES[dtype]
        result = ops.gpt_oss_swiglu(at(x, kind, (rows, 2 * logical_d)), physical_d, alpha, limit)
        at(out, kind, (rows, physical_d))[...] = _round(result, kind)
        return 0

    def ferrum_moe_sum(self, x, out, tokens, top_k, d, dtype, dev, stream):
        self.calls.append("moe_sum")
        kind = _DTYPES[dtype]
        at(out, kind, (tokens, d))[...] = _round(ops.moe_sum(at(x, kind, (tokens * top_k, d)), top_k), kind)
        return 0

    def ferrum_marlin_memset_async(self, ptr, value, nbytes, stream):
        self.calls.append("memset")
        ctypes.memset(ptr, value, nbytes)
        return 0

    # ---- the GEMMs ---------------------------------------------------------------------

    def _gemm(self, dtype, a, b, c, workspace, sorted_ids, expert_ids, count, topk_weights, block, top_k, mul,
              is_ep, prob_m, prob_n, prob_k, add_rows_div=0, clear=None, clear_bytes=0, flags=0):
        """C[t] = A[t // top_k] @ W[e] (+ bias[e]) (x topk_weights[t]) for every
        id t of a block whose expert e is not skipped (direct routing: every
        row t, expert expert_ids[t]); with add_rows_div, C[t // div] += that,
        rounded after every add; ``clear`` zeroed first (settled: last)."""
        assert (at(workspace, np.int32, (4 * self.sms,)) == 0).all(), "the workspace must be zero on entry"
        settled = bool(flags & FERRUM_MOE_ROUTING_SETTLED)
        if clear is not None and not settled:
            ctypes.memset(clear, 0, clear_bytes)
        dense, bias = self.weights[b]
        rows = prob_m * top_k
        if flags & FERRUM_MOE_ROUTING_DIRECT:
            assert sorted_ids is None and count is None and block == 8
            ids, experts, block = np.arange(rows), at(expert_ids, np.int32, (rows,)), 1
        else:
            used = int(at(count, np.int32, (1,))[0])
            ids = at(sorted_ids, np.int32, (used,))
            experts = at(expert_ids, np.int32, (used // block,))
        a_rows = at(a, dtype, (prob_m, prob_k)).astype(np.float64)
        scale = at(topk_weights, np.float32, (rows,)) if mul else None
        div = add_rows_div if add_rows_div > 0 else 1
        out = at(c, dtype, (rows // div, prob_n))
        for i, t in enumerate(ids):
            e = experts[i // block]
            if not 0 <= t < rows or (is_ep and e < 0):
                continue
            value = a_rows[t // top_k] @ dense[e] + (0.0 if bias is None else bias[e])
            value = value * (1.0 if scale is None else float(scale[t]))
            if add_rows_div > 0:
                value = value + out[t // div].astype(np.float64)
            out[t // div] = _round(value, dtype)
        if clear is not None and settled:
            ctypes.memset(clear, 0, clear_bytes)
        return 0

    def ferrum_vllm_marlin_moe_f16(self, a, b, c, c_tmp, scales, zp, workspace, sorted_ids, expert_ids, count,
                                   topk_weights, block, top_k, mul, is_ep, prob_m, prob_n, prob_k, group, has_zp,
                                   dev, stream, atomic, fp32):
        self.calls.append("gemm_f16")
        return self._gemm(np.dtype(np.float16), a, b, c, workspace, sorted_ids, expert_ids, count, topk_weights,
                          block, top_k, mul, is_ep, prob_m, prob_n, prob_k)

    ferrum_vllm_marlin_moe_fp8_f16 = ferrum_vllm_marlin_moe_f16

    def ferrum_vllm_marlin_moe_f16_ex(self, a, b, c, c_tmp, scales, zp, workspace, sorted_ids, expert_ids, count,
                                      topk_weights, block, top_k, mul, is_ep, prob_m, prob_n, prob_k, group, has_zp,
                                      dev, stream, atomic, fp32, add_rows_div, clear, clear_bytes, flags):
        self.calls.append("gemm_f16")
        return self._gemm(np.dtype(np.float16), a, b, c, workspace, sorted_ids, expert_ids, count, topk_weights,
                          block, top_k, mul, is_ep, prob_m, prob_n, prob_k, add_rows_div, clear, clear_bytes, flags)

    ferrum_vllm_marlin_moe_fp8_f16_ex = ferrum_vllm_marlin_moe_f16_ex

    def ferrum_vllm_marlin_moe_mxfp4_bf16(self, a, b, c, c_tmp, bias, scales, workspace, sorted_ids, expert_ids,
                                          count, topk_weights, block, top_k, mul, is_ep, prob_m, prob_n, prob_k,
                                          group, dev, stream, atomic, fp32):
        self.calls.append("gemm_mxfp4")
        return self._gemm(BF16, a, b, c, workspace, sorted_ids, expert_ids, count, topk_weights, block, top_k, mul,
                          is_ep, prob_m, prob_n, prob_k)

    def ferrum_vllm_marlin_moe_mxfp4_bf16_ex(self, a, b, c, c_tmp, bias, scales, workspace, sorted_ids, expert_ids,
                                             count, topk_weights, block, top_k, mul, is_ep, prob_m, prob_n, prob_k,
                                             group, dev, stream, atomic, fp32, add_rows_div, clear, clear_bytes,
                                             flags):
        self.calls.append("gemm_mxfp4")
        return self._gemm(BF16, a, b, c, workspace, sorted_ids, expert_ids, count, topk_weights, block, top_k, mul,
                          is_ep, prob_m, prob_n, prob_k, add_rows_div, clear, clear_bytes, flags)
