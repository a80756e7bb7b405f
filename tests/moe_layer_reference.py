"""A float64 NumPy reference of a whole MoE layer (ferrum_ffi.moe_layer),
written from its definition in the most direct way, for the CPU and GPU tests;
the GPU tests feed it ``MarlinMoeWeight.dequantize()`` (the source format's
own decoder, independent of the Marlin buffers).

The kernels round their results to the activation dtype (fp16, or bf16 for
MXFP4) at every hand-over: the gate/up GEMM's output, the activation's
output, the weighted down-GEMM rows and the sum. The reference rounds at the
same places, so what is left between it and the GPU is the GEMMs' fp32
accumulation, the kernels' own dequantisation and rounding-boundary flips.
"""

from __future__ import annotations

import numpy as np

from . import moe_reference as ops


def round_to(x: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """``x`` rounded to ``dtype`` (fp16 or bf16), back in float64."""
    with np.errstate(over="ignore"):
        return np.asarray(x, dtype=np.float64).astype(dtype).astype(np.float64)


def activate(gate_up: np.ndarray, activation: str, alpha: float = 1.702, limit: float = 7.0) -> np.ndarray:
    """silu: ``silu(x[:, :I]) * x[:, I:]``; gpt_oss_swiglu: the clamped SwiGLU of
    interleaved pairs (its zero padding weighs nothing in the down GEMM)."""
    if activation == "silu":
        return ops.silu_and_mul(gate_up)
    if activation == "gpt_oss_swiglu":
        return ops.gpt_oss_swiglu(gate_up, alpha=alpha, limit=limit)
    raise ValueError(f"unknown activation {activation!r}")


def fused_moe(
    hidden: np.ndarray,
    w13: np.ndarray,
    w2: np.ndarray,
    topk_weights: np.ndarray,
    topk_ids: np.ndarray,
    *,
    activation: str,
    dtype: np.dtype,
    expert_map: np.ndarray | None = None,
    bias13: np.ndarray | None = None,
    bias2: np.ndarray | None = None,
    alpha: float = 1.702,
    limit: float = 7.0,
) -> np.ndarray:
    """``out [M, H]`` (float64 holding ``dtype`` values) of ``hidden [M, K]``
    with ``w13 [E, K, 2I]`` and ``w2 [E, I, H]`` (float64, ``y = x @ W[e]``)
    and optional biases ``[E, 2I]`` / ``[E, H]``.

    Row ``t = m * top_k + j`` goes to expert ``g = topk_ids[m, j]``; with an
    ``expert_map`` (global -> local id or -1) it uses local expert
    ``expert_map[g]`` and adds nothing when that is -1 (another rank's
    expert). ``hidden`` may be wider than K (padded features are ignored)."""
    dtype = np.dtype(dtype)
    x = np.asarray(hidden).astype(np.float64)[:, : w13.shape[1]]
    m, top_k = topk_ids.shape
    ids = topk_ids.reshape(-1)
    weights = np.asarray(topk_weights, dtype=np.float64).reshape(-1)
    local = ids if expert_map is None else np.where((ids >= 0) & (ids < len(expert_map)), expert_map[ids], -1)
    rows = np.zeros((m * top_k, w2.shape[2]))
    for e in np.unique(local[local >= 0]):
        routed = np.flatnonzero(local == e)
        a = x[routed // top_k]
        gate_up = a @ w13[e] + (0.0 if bias13 is None else bias13[e])
        activated = round_to(activate(round_to(gate_up, dtype), activation, alpha=alpha, limit=limit), dtype)
        down = activated @ w2[e] + (0.0 if bias2 is None else bias2[e])
        rows[routed] = round_to(down * weights[routed, None], dtype)
    return round_to(rows.reshape(m, top_k, -1).sum(axis=1), dtype)

