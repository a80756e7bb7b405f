"""Independent references for the GPU tests: float64 products of dequantized weights."""

from __future__ import annotations

import numpy as np


def random_int4_layer(rng: np.random.Generator, k: int, n: int, group_size: int):
    """Random codes and positive fp16 scales (no quantiser in the loop)."""
    codes = rng.integers(0, 16, size=(k, n), dtype=np.uint8)
    groups = 1 if group_size == -1 else k // group_size
    scales = rng.uniform(0.002, 0.02, size=(groups, n)).astype(np.float16)
    return codes, scales


def reference_gemm(cp, a, codes: np.ndarray, scales: np.ndarray, group_size: int):
    """float64 A @ ((q - 8) * s) on the GPU through CuPy (independent of the kernel)."""
    rows = codes.shape[0] if group_size == -1 else group_size
    s = cp.repeat(cp.asarray(scales, dtype=cp.float64), rows, axis=0)
    w = (cp.asarray(codes, dtype=cp.float64) - 8.0) * s
    return a.astype(cp.float64) @ w


def relative_l2(cp, out, ref) -> float:
    out64 = out.astype(cp.float64)
    if not bool(cp.isfinite(out64).all()):
        return float("inf")
    return float(cp.linalg.norm(out64 - ref) / max(float(cp.linalg.norm(ref)), 1e-30))
