#!/usr/bin/env python3
"""K-sharded act-order layers (vLLM's is_k_full=False): the two layouts of
``MarlinLinearWeight.from_gptq(..., k_full=False, shard_layout=...)`` against
the same rows without act-order.

Each case is a tensor-parallel row shard (``rows = K / TP``) of a desc_act
GPTQ INT4 layer (group 128, symmetric) whose ``g_idx`` is a random permutation
of ``arange(K) // 128`` (what GPTQ desc_act gives), FP16 activations:
  * ``row_groups`` vLLM's layout: whole-layer scales, each row's group read by
                   the kernel from g_idx (K_FULL clear);
  * ``padded``     each group's rows padded to whole sub-groups (K_FULL set);
  * ``plain``      the shard's rows as an ordinary grouped layer (no gather,
                   whole groups): what the shard would cost without act-order.
Random codes and scales straight in each format (quantising on the host would
dominate the run). Timing as in bench.py: CUDA events, the L2 flushed by a
512 MB fill before every launch, the median of --repeat launches. Prints a
table (µs and each layout's time over plain) and writes JSON with --json.
Usage: python scripts/bench_kshard.py [--cases 28672x8192:2,...] [--m 1 16 64 256]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Sequence

import numpy as np

GROUP = 128
DEFAULT_CASES = "28672x8192:2,28672x8192:8,14336x4096:2,14336x4096:4"
LAYOUTS = ("row_groups", "padded")


def parse_cases(text: str) -> list[tuple[int, int, int]]:
    """``KxN:TP,...`` -> [(K, N, TP)]; K must split into TP shards of whole
    128-row groups (the plain comparison is a grouped layer of the shard)."""
    cases = []
    for item in text.split(","):
        shape, _, tp = item.partition(":")
        k, _, n = shape.partition("x")
        k, n, tp = int(k), int(n), int(tp or 1)
        if tp < 1 or k % (tp * GROUP) or n % 128:
            raise ValueError(f"case {item!r}: TP must be >= 1, K a multiple of 128*TP (whole groups per shard), "
                             "N of 128")
        cases.append((k, n, tp))
    return cases


def shard_tensors(rng: np.random.Generator, k_full: int, n: int, tp: int) -> dict[str, np.ndarray]:
    """The first of ``tp`` row shards of a random desc_act INT4 layer, AutoGPTQ
    style: the shard's qweight rows and g_idx, the whole layer's scales and
    qzeros (symmetric: stored zero 7)."""
    rows = k_full // tp
    groups = k_full // GROUP
    return {
        "qweight": rng.integers(0, 2**32, size=(rows // 8, n), dtype=np.uint64).astype(np.uint32).view(np.int32),
        "scales": (rng.random((groups, n)) * 0.01 + 0.001).astype(np.float16),
        "qzeros": np.full((groups, n // 8), 0x77777777, dtype=np.int32),
        "g_idx": rng.permutation(np.arange(k_full) // GROUP)[:rows].astype(np.int32),
    }


def weights(ff, t: dict[str, np.ndarray]) -> dict[str, object]:
    rows = t["g_idx"].size
    built = {
        layout: ff.MarlinLinearWeight.from_gptq(t["qweight"], t["scales"], t["qzeros"], t["g_idx"], group_size=GROUP,
                                                k_full=False, shard_layout=layout, keep_reference=False)
        for layout in LAYOUTS
    }
    built["plain"] = ff.MarlinLinearWeight.from_gptq(t["qweight"], t["scales"][: rows // GROUP],
                                                     t["qzeros"][: rows // GROUP], keep_reference=False)
    return built


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", default=DEFAULT_CASES, help=f"KxN:TP list (default {DEFAULT_CASES})")
    parser.add_argument("--m", type=int, nargs="+", default=[1, 16, 64, 256])
    parser.add_argument("--repeat", type=int, default=50)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    cases = parse_cases(args.cases)
    try:
        import cupy as cp

        import ferrum_ffi as ff
        from ferrum_ffi.timing import Timer

        cp.cuda.runtime.getDeviceCount()
    except Exception as exc:  # no CuPy or no GPU: nothing to measure
        print(f"bench_kshard: needs a CUDA GPU and CuPy ({exc})", file=sys.stderr)
        return 1
    timer = Timer(cp)
    rng = np.random.default_rng(0)
    results = []
    print(f"{'layer':>12} {'TP':>3} {'rows':>6} {'m':>5} {'row_groups':>11} {'padded':>8} {'plain':>8} "
          f"{'rg/plain':>9} {'pad/plain':>10}")
    for k_full, n, tp in cases:
        built = weights(ff, shard_tensors(rng, k_full, n, tp))
        rows = k_full // tp
        for m in args.m:
            x = cp.asarray(rng.standard_normal((m, rows)).astype(np.float16))
            us = {name: timer.median_us(lambda w=w: ff.linear(x, w), args.repeat) for name, w in built.items()}
            row = {"k_full": k_full, "n": n, "tp": tp, "rows": rows, "m": m,
                   "padded_k": built["padded"].k, **{f"{name}_us": v for name, v in us.items()}}
            results.append(row)
            print(f"{k_full:>6}x{n:<5} {tp:>3} {rows:>6} {m:>5} {us['row_groups']:>11.1f} {us['padded']:>8.1f} "
                  f"{us['plain']:>8.1f} {us['row_groups'] / us['plain']:>9.2f} {us['padded'] / us['plain']:>10.2f}")
    if args.json is not None:
        args.json.write_text(json.dumps({"group_size": GROUP, "results": results}, indent=2))
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
