#!/usr/bin/env python3
"""Run one W4A16 shape a few times (for ncu / compute-sanitizer): k n m [group]."""

from __future__ import annotations

import sys

import numpy as np


def main() -> None:
    import cupy as cp

    import ferrum_ffi as ff
    from ferrum_ffi.formats import marlin_pack_int4, marlin_permute_scales

    k, n, m = (int(x) for x in sys.argv[1:4])
    g = int(sys.argv[4]) if len(sys.argv) > 4 else 128
    tile = tuple(int(x) for x in sys.argv[5:7]) if len(sys.argv) > 6 else (-1, -1)
    rng = np.random.default_rng(0)
    codes = rng.integers(0, 16, size=(k, n), dtype=np.uint8)
    scales = rng.uniform(0.002, 0.02, size=(1 if g == -1 else k // g, n)).astype(np.float16)
    weight = ff.MarlinWeight.from_marlin(marlin_pack_int4(codes), marlin_permute_scales(scales, g), k, g)
    a = cp.asarray(rng.standard_normal((m, k)).astype(np.float16))
    out = cp.empty((m, n), dtype=cp.float16)
    for _ in range(3):
        ff.marlin_gemm(a, weight, out=out, thread_k=tile[0], thread_n=tile[1])
    cp.cuda.runtime.deviceSynchronize()


if __name__ == "__main__":
    main()
