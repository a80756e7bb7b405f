#!/usr/bin/env python3
"""Quick correctness sweep of marlin_gemm on the GPU, one line per case.

Meant for fast feedback on a device (and under compute-sanitizer with --small):
prints the relative L2 error against a float64 reference of the dequantized
weight, and whether every output element was written.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.gpu_reference import random_int4_layer, reference_gemm, relative_l2  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--small", action="store_true", help="few small cases (for sanitizers)")
    args = parser.parse_args(argv)
    import cupy as cp

    import ferrum_ffi as ff
    from ferrum_ffi.formats import marlin_pack_int4, marlin_permute_scales

    if args.small:
        cases = [(k, n, g, m) for (k, n) in ((256, 192), (512, 256)) for g in (128, -1) for m in (1, 17, 70)]
        cases += [(512, 512, g, m) for g in (128, -1) for m in (1, 16)]  # the deep tile, forced below
    else:
        cases = [
            (k, n, g, m)
            for (k, n) in ((1024, 1024), (4096, 4096), (1024, 192), (2048, 640))
            for g in (128, -1)
            for m in (1, 8, 16, 17, 33, 64, 65, 256, 1024)
        ]
    rng = np.random.default_rng(0)
    worst = 0.0
    layers = {}
    for k, n, g, m in cases:
        if (k, n, g) not in layers:
            codes, scales = random_int4_layer(rng, k, n, g)
            weight = ff.MarlinWeight.from_marlin(marlin_pack_int4(codes), marlin_permute_scales(scales, g), k, g)
            layers[(k, n, g)] = (weight, codes, scales)
        weight, codes, scales = layers[(k, n, g)]
        a = cp.asarray(rng.standard_normal((m, k)).astype(np.float16))
        out = cp.full((m, n), cp.nan, dtype=cp.float16)
        deep = args.small and n == 512
        ff.marlin_gemm(a, weight, out=out, thread_k=128 if deep else -1, thread_n=256 if deep else -1)
        err = relative_l2(cp, out, reference_gemm(cp, a, codes, scales, g))
        unwritten = int(cp.isnan(out).sum())
        worst = max(worst, err)
        print(f"k={k:5d} n={n:5d} g={g:4d} m={m:5d} rel_l2={err:.2e} unwritten={unwritten}", flush=True)
    cp.cuda.runtime.deviceSynchronize()
    print(f"worst rel_l2={worst:.2e}")
    return 0 if worst < 2e-3 else 1


if __name__ == "__main__":
    raise SystemExit(main())
