"""Plain NumPy references of the MoE routing and the small MoE ops, written
from the header's definitions in the most direct way (float64 math), for the
CPU and GPU tests of ferrum_ffi.moe_ops."""

from __future__ import annotations

import numpy as np


def align_capacity(num_tokens: int, top_k: int, num_experts: int, block_size: int) -> tuple[int, int]:
    sorted_capacity = num_tokens * top_k + num_experts * (block_size - 1)
    return sorted_capacity, -(-sorted_capacity // block_size)


def moe_align_block_size(topk_ids, num_experts, block_size, expert_map=None,
                         sorted_capacity=None, expert_ids_capacity=None):
    """(sorted_token_ids, expert_ids, num_tokens_post_padded) as int32 arrays of
    the given capacities (default: align_capacity)."""
    topk_ids = np.asarray(topk_ids)
    num_tokens, top_k = topk_ids.shape
    ids = topk_ids.reshape(-1)
    default_sorted, default_blocks = align_capacity(num_tokens, top_k, num_experts, block_size)
    sorted_ids = np.full(sorted_capacity or default_sorted, ids.size, dtype=np.int32)
    expert_ids = np.full(expert_ids_capacity or default_blocks, -1, dtype=np.int32)
    position = 0
    for e in range(num_experts):
        members = np.flatnonzero(ids == e)  # ascending t
        sorted_ids[position:position + members.size] = members
        blocks = -(-members.size // block_size)
        block0 = position // block_size
        expert_ids[block0:block0 + blocks] = e if expert_map is None else expert_map[e]
        position += blocks * block_size
    return sorted_ids, expert_ids, np.array([position], dtype=np.int32)


def topk_softmax(logits, top_k: int, renormalize: bool = True):
    """(weights float64, ids int32), [num_tokens, top_k]: ranked by the logit
    (as fp32), ties to the lower id; NaN counts as -inf."""
    x = np.asarray(logits).astype(np.float32).astype(np.float64)
    x = np.where(np.isnan(x), -np.inf, x)
    probs = np.exp(x - x.max(axis=1, keepdims=True))
    probs /= probs.sum(axis=1, keepdims=True)
    ids = np.argsort(-x, axis=1, kind="stable")[:, :top_k]  # stable: equal logits keep id order
    weights = np.take_along_axis(probs, ids, axis=1)
    if renormalize:
        weights = weights / weights.sum(axis=1, keepdims=True)
    return weights, ids.astype(np.int32)


def _sigmoid(z):
    return 1.0 / (1.0 + np.exp(-z))


def silu_and_mul(x):
    """float64 ``silu(x[..., :d]) * x[..., d:]``."""
    x = np.asarray(x).astype(np.float64)
    d = x.shape[-1] // 2
    gate, up = x[..., :d], x[..., d:]
    return gate * _sigmoid(gate) * up


def gpt_oss_swiglu(x, physical_d=None, alpha=1.702, limit=7.0):
    """float64 clamped SwiGLU of interleaved (gate, up) pairs, zero-padded to physical_d."""
    x = np.asarray(x).astype(np.float64)
    logical_d = x.shape[-1] // 2
    gate = np.minimum(x[..., 0::2], limit)
    up = np.clip(x[..., 1::2], -limit, limit)
    out = np.zeros(x.shape[:-1] + (physical_d or logical_d,))
    out[..., :logical_d] = (up + 1.0) * gate * _sigmoid(alpha * gate)
    return out


def moe_sum(x, top_k: int):
    """float64 sum of each token's top_k consecutive rows: [tokens, d]."""
    x = np.asarray(x).astype(np.float64)
    return x.reshape(-1, top_k, x.shape[-1]).sum(axis=1)
