"""Loop references of the Marlin layout, written step by step from its
specification, shared by the format tests."""

from __future__ import annotations

import numpy as np


def ref_lane_order(q: np.ndarray) -> np.ndarray:
    """Steps 1-2 of the Marlin layout (shared by 4 and 8 bits): per tile-row,
    16x16 tiles row-major along N, then per 1024-value run lane by lane, tile
    by tile, column c then c + 8, rows r, r+1, r+8, r+9."""
    k, n = q.shape
    step1 = np.zeros((k // 16, n * 16), dtype=np.int64)
    for kt in range(k // 16):
        pos = 0
        for nt in range(n // 16):
            for r in range(16):
                for c in range(16):
                    step1[kt, pos] = q[16 * kt + r, 16 * nt + c]
                    pos += 1
    step2 = np.zeros_like(step1)
    for kt in range(k // 16):
        for run in range(n * 16 // 1024):
            base = pos = run * 1024
            for lane in range(32):
                c, r = lane // 4, 2 * (lane % 4)
                for t in range(4):
                    for col in (c, c + 8):
                        for row in (r, r + 1, r + 8, r + 9):
                            step2[kt, pos] = step1[kt, base + t * 256 + row * 16 + col]
                            pos += 1
    return step2
