#!/usr/bin/env python3
"""Host cost per call of the Python entry points, in eager mode.

Each entry point is called back to back on a tiny problem whose kernels finish
faster than the host issues them, so the loop's wall time per call is what
argument checks, array and stream resolution and the launches cost the
caller's thread (no synchronisation inside the loop). CuPy's matmul (cuBLAS)
of the same shape is timed the same way in the same run: the cost a framework
user already pays per GEMM. CUDA graphs remove all of it; this is for code
that cannot capture. Median of rounds; prints a table, a profile of
``linear`` (``--profile``) and writes JSON.

Usage: python scripts/bench_host.py [--calls 200] [--rounds 9] [--json out.json]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import sys
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

K = N = 512


def per_call_us(cp: Any, fn: Callable[[], Any], calls: int, rounds: int) -> float:
    for _ in range(20):
        fn()
    cp.cuda.Device().synchronize()
    samples = []
    for _ in range(rounds):
        cp.cuda.Device().synchronize()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        samples.append((time.perf_counter() - t0) * 1e6 / calls)
    cp.cuda.Device().synchronize()
    return float(np.median(samples))


def bf16_device(cp: Any, ff: Any, host: np.ndarray) -> Any:
    try:
        return cp.asarray(host)
    except (TypeError, ValueError, NotImplementedError):
        return ff.bfloat16_view(cp.asarray(host.view(np.uint16)))


def cases(cp: Any, ff: Any) -> dict[str, Callable[[], Any]]:
    import ml_dtypes

    rng = np.random.default_rng(0)
    w = rng.standard_normal((K, N)).astype(np.float32) * 0.05
    x16 = cp.asarray(rng.standard_normal((1, K)).astype(np.float16))
    x_bf16 = bf16_device(cp, ff, rng.standard_normal((1, K)).astype(ml_dtypes.bfloat16))
    w16 = cp.asarray(w.astype(np.float16))
    out16 = cp.empty((1, N), dtype=cp.float16)
    out_bf16 = bf16_device(cp, ff, np.zeros((1, N), dtype=ml_dtypes.bfloat16))

    w4a16 = ff.MarlinWeight.from_float(w, 128)
    u4b8 = ff.MarlinLinearWeight.from_float(w, bits=4, group_size=128, sym=True, dtype=np.float16)
    u4_bf16 = ff.MarlinLinearWeight.from_float(w, bits=4, group_size=128, sym=False, dtype=ml_dtypes.bfloat16)

    experts, top_k, hidden, inter = 8, 2, 256, 128
    w13 = ff.MarlinMoeWeight.from_float(rng.standard_normal((experts, 2 * inter, hidden)) * 0.06, "u4b8").to_device()
    w2 = ff.MarlinMoeWeight.from_float(rng.standard_normal((experts, hidden, inter)) * 0.09, "u4b8").to_device()
    hidden_x = cp.asarray(rng.standard_normal((1, hidden)).astype(np.float16))
    topk_w = cp.asarray(np.full((1, top_k), 1.0 / top_k, dtype=np.float32))
    topk_ids = cp.asarray(np.array([[1, 5]], dtype=np.int32))
    moe_out = cp.empty((1, hidden), dtype=cp.float16)

    return {
        "cupy matmul (cuBLAS) 1x512x512": lambda: cp.matmul(x16, w16, out=out16),
        "marlin_gemm W4A16": lambda: ff.marlin_gemm(x16, w4a16, out=out16),
        "linear f16 u4b8": lambda: ff.linear(x16, u4b8, out=out16),
        "linear bf16 u4 (zero points)": lambda: ff.linear(x_bf16, u4_bf16, out=out_bf16),
        "linear f16 u4b8, out allocated": lambda: ff.linear(x16, u4b8),
        "fused_moe u4b8 E=8 top_k=2 M=1": lambda: ff.fused_moe(hidden_x, w13, w2, topk_w, topk_ids, out=moe_out),
    }


def profile_text(fn: Callable[[], Any], calls: int, top: int = 18) -> str:
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(calls):
        fn()
    profiler.disable()
    buffer = io.StringIO()
    pstats.Stats(profiler, stream=buffer).sort_stats("tottime").print_stats(top)
    return buffer.getvalue()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=200, help="calls per round (below the launch queue's depth)")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--profile", nargs="?", const="linear f16 u4b8", metavar="CALL",
                        help="print a cProfile of the call whose name starts with CALL (default: linear f16 u4b8)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import ferrum_ffi as ff

    try:
        import cupy as cp

        cp.cuda.runtime.getDeviceCount()
    except Exception as exc:  # noqa: BLE001 - any missing piece means no GPU run
        print(f"bench_host: needs CuPy and a CUDA device ({exc})")
        return 0
    rows = []
    table = cases(cp, ff)
    for name, fn in table.items():
        us = per_call_us(cp, fn, args.calls, args.rounds)
        rows.append({"call": name, "host_us_per_call": us})
        print(f"{name:40s} {us:8.2f} us per call")
    if args.profile:
        name = next((name for name in table if name.startswith(args.profile)), None)
        if name is None:
            parser.error(f"--profile: no call starts with {args.profile!r} ({', '.join(table)})")
        print(name)
        print(profile_text(table[name], 2000))
    if args.json:
        args.json.write_text(json.dumps({"device": cp.cuda.runtime.getDeviceProperties(0)["name"].decode(),
                                         "results": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
