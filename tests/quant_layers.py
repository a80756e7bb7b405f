"""Random layers in each on-disk format, written with NumPy from the format
descriptions (no ferrum_ffi packer in the loop), for the weight, checkpoint
and GPU tests. Each returns the checkpoint's tensors under their usual names."""

from __future__ import annotations

import numpy as np

E4M3_NAN_BYTES = (0x7F, 0xFF)


def bfloat16():
    import ml_dtypes

    return np.dtype(ml_dtypes.bfloat16)


def pack_along_last_axis(values: np.ndarray, bits: int) -> np.ndarray:
    """[R, C] codes -> int32 [R, C*bits/32], value i of a word at bits i*bits."""
    per = 32 // bits
    rows, cols = values.shape
    v = values.astype(np.uint32).reshape(rows, cols // per, per)
    shifted = v << (bits * np.arange(per, dtype=np.uint32))
    return np.bitwise_or.reduce(shifted, axis=-1).astype(np.uint32).view(np.int32)


def pack_along_first_axis(values: np.ndarray, bits: int) -> np.ndarray:
    """[R, C] codes -> int32 [R*bits/32, C], row r*per + i of a word at bits i*bits."""
    return np.ascontiguousarray(pack_along_last_axis(np.ascontiguousarray(values.T), bits).T)


def random_scales(rng: np.random.Generator, shape, dtype=np.float16) -> np.ndarray:
    return rng.uniform(0.002, 0.02, size=shape).astype(np.float32).astype(dtype)


def groups_of(k: int, group_size: int) -> int:
    return 1 if group_size == -1 else k // group_size


def gptq_layer(rng, k, n, *, bits=4, group_size=128, sym=True, act_order=False, scale_dtype=np.float16,
               with_qzeros=True) -> dict:
    """AutoGPTQ: qweight [K*bits/32, N], scales [G, N], qzeros [G, N*bits/32]
    storing zero - 1, g_idx [K] (a shuffled k // group_size for act-order)."""
    groups = groups_of(k, group_size)
    codes = rng.integers(0, 1 << bits, size=(k, n))
    if sym:
        zeros = np.full((groups, n), 1 << (bits - 1))
    else:
        zeros = rng.integers(0, 1 << bits, size=(groups, n))
    tensors = {
        "qweight": pack_along_first_axis(codes, bits),
        "scales": random_scales(rng, (groups, n), scale_dtype),
    }
    if with_qzeros or not sym:
        tensors["qzeros"] = pack_along_last_axis((zeros - 1) & ((1 << bits) - 1), bits)
    rows = k if group_size == -1 else group_size
    g_idx = np.arange(k) // rows
    if act_order:
        g_idx = rng.permutation(g_idx)
    tensors["g_idx"] = g_idx.astype(np.int32)
    return tensors


AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)


def awq_pack_words(values: np.ndarray) -> np.ndarray:
    """AWQ packs along N: nibble i of word w holds column 8w + AWQ_ORDER[i]."""
    rows, cols = values.shape
    reordered = values.reshape(rows, cols // 8, 8)[:, :, list(AWQ_ORDER)].reshape(rows, cols)
    return pack_along_last_axis(reordered, 4)


def awq_layer(rng, k, n, *, group_size=128, scale_dtype=np.float16) -> dict:
    groups = groups_of(k, group_size)
    return {
        "qweight": awq_pack_words(rng.integers(0, 16, size=(k, n))),
        "qzeros": awq_pack_words(rng.integers(0, 16, size=(groups, n))),
        "scales": random_scales(rng, (groups, n), scale_dtype),
    }


def ct_layer(rng, k, n, *, bits=4, group_size=128, asym=False, scale_dtype=np.float16) -> dict:
    """compressed-tensors pack-quantized, torch orientation [N, K]: signed
    values stored + 2**(bits-1), packed along K; zero points packed along N."""
    half = 1 << (bits - 1)
    groups = groups_of(k, group_size)
    signed = rng.integers(-half, half, size=(n, k))
    tensors = {
        "weight_packed": pack_along_last_axis(signed + half, bits),
        "weight_scale": random_scales(rng, (n, groups), scale_dtype),
        "weight_shape": np.array([n, k], dtype=np.int64),
    }
    if asym:
        zp = rng.integers(-half, half, size=(n, groups))
        tensors["weight_zero_point"] = pack_along_first_axis(zp + half, bits)
    return tensors


def e4m3_bytes(rng, shape) -> np.ndarray:
    """Realistic FP8 weights: normal values rounded to E4M3 (no NaN byte)."""
    import ml_dtypes

    values = rng.standard_normal(shape).astype(np.float32) * 2.0
    return values.astype(ml_dtypes.float8_e4m3fn)


def every_finite_e4m3(n: int, k: int) -> np.ndarray:
    """[n, k] bytes cycling through all 254 finite E4M3 codes (subnormals and
    both zeros included) -- as float8_e4m3fn."""
    import ml_dtypes

    finite = np.array([b for b in range(256) if b not in E4M3_NAN_BYTES], dtype=np.uint8)
    return np.resize(finite, (n, k)).view(ml_dtypes.float8_e4m3fn)


def fp8_layer(rng, k, n, *, kind="channel", scale_dtype=np.float32, weight=None) -> dict:
    """FP8: weight [N, K] float8_e4m3fn and weight_scale (per-tensor [], per-
    channel [N, 1]) or weight_scale_inv ([ceil(N/128), ceil(K/128)] blocks)."""
    weight = e4m3_bytes(rng, (n, k)) if weight is None else weight
    if kind == "tensor":
        return {"weight": weight, "weight_scale": np.array(0.0125, dtype=scale_dtype)}
    if kind == "channel":
        return {"weight": weight, "weight_scale": rng.uniform(0.001, 0.01, size=(n, 1)).astype(scale_dtype)}
    blocks = (-(-n // 128), -(-k // 128))
    return {"weight": weight, "weight_scale_inv": rng.uniform(0.001, 0.01, size=blocks).astype(np.float32).astype(scale_dtype)}
