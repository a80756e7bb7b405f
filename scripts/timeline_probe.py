#!/usr/bin/env python3
"""Where the 8-warp kernel's time goes, block by block (a diagnostic).

Needs a library built with the CMake option FERRUM_TIMELINE_PROBE:

    cmake -S . -B build/probe -G Ninja -DCMAKE_BUILD_TYPE=Release \\
          -DCMAKE_CUDA_ARCHITECTURES=90a-real -DFERRUM_TIMELINE_PROBE=ON
    ninja -C build/probe
    FERRUM_MARLIN_LIBRARY=build/probe/libferrum_marlin.so \\
        python scripts/timeline_probe.py --layers qwen,gptoss --m 1 --shapes 4096x14336

Each working block of that build prints one ``FERRUM_TIMELINE`` line
(core/timeline_probe.cuh): global-timer stamps at its entry, once its stripe
is known (routing read), once the fetch addresses are set (and a chained
launch's previous kernel awaited), after the first stages' copies are
issued, when the first stage has landed, after its last stage's MMAs, after
the last column's block reduction and at its end, plus the time spent
waiting for stages after the first. For every case (the MoE layers'
GEMMs as fused_moe runs them, the whole fused_moe layer, dense W4A16 shapes)
the case runs once warm, then ``--runs`` times after an L2 flush, and the
last run's blocks are summarised per kernel: the 0/10/50/90/100th
percentiles of each phase in µs. Kernels of one layer are told apart by
their (n, k); times are relative to the first block of the run. The device
printf at each block's end delays what follows it, so inside a layer only
each kernel's own phases are meaningful, not the gaps between kernels.
"""

from __future__ import annotations

import argparse
import ctypes
import importlib.util
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Sequence

import numpy as np

TAG = "FERRUM_TIMELINE"
POINTS = ("entry", "routed", "sought", "issued", "first_stage", "computed", "reduced", "end")
# (label, from point, to point) of each reported phase.
PHASES = (
    ("start", None, "entry"),
    ("routing", "entry", "routed"),
    ("seek", "routed", "sought"),
    ("issue", "sought", "issued"),
    ("first stage", "issued", "first_stage"),
    ("compute", "first_stage", "computed"),
    ("block reduce", "computed", "reduced"),
    ("store", "reduced", "end"),
    ("end", None, "end"),
)
PERCENTILES = (0, 10, 50, 90, 100)


@dataclass(frozen=True)
class Block:
    block: int
    sm: int
    units: int
    n_tile: int
    k_tile: int
    n: int
    k: int
    at: tuple[int, ...]  # ns, in POINTS order
    waited: int  # ns


def parse_line(line: str) -> Block | None:
    fields = line.split()
    if len(fields) != 8 + len(POINTS) + 1 or fields[0] != TAG:
        return None
    v = [int(x) for x in fields[1:]]
    return Block(v[0], v[1], v[2], v[3], v[4], v[5], v[6], tuple(v[7:7 + len(POINTS)]), v[-1])


def parse(lines: Iterable[str]) -> dict[str, list[Block]]:
    """Blocks printed between ``BEGIN case`` and ``END case`` markers, by case."""
    cases: dict[str, list[Block]] = {}
    current = None
    for line in lines:
        if line.startswith("BEGIN "):
            current = line.split(maxsplit=1)[1].strip()
            cases[current] = []
        elif line.startswith("END "):
            current = None
        elif current is not None:
            block = parse_line(line)
            if block is not None:
                cases[current].append(block)
    return cases


def summarize(case: str, blocks: Sequence[Block]) -> str:
    """Per kernel (n, k) of the case, in launch order: percentiles of each
    phase over its blocks with work (µs; start and end from the case's first
    block)."""
    working = [b for b in blocks if b.units > 0]
    if not working:
        return f"{case}: no blocks reported"
    origin = min(b.at[0] for b in working)
    kernels: dict[tuple[int, int], list[Block]] = {}
    for b in sorted(working, key=lambda b: b.at[0]):
        kernels.setdefault((b.n, b.k), []).append(b)
    index = {p: i for i, p in enumerate(POINTS)}
    out = []
    for (n, k), group in kernels.items():
        at = (np.array([b.at for b in group], dtype=np.int64) - origin) / 1000.0
        units = [b.units for b in group]
        tiles = sorted({(b.n_tile, b.k_tile) for b in group})
        out.append(f"{case} n={n} k={k}: {len(group)} blocks, tile(s) {tiles}, units {min(units)}..{max(units)}")
        head = " ".join(f"p{q:<5}" for q in PERCENTILES)
        out.append(f"  {'phase (us)':<14}{head}")
        rows = [(label, at[:, index[b]] - (at[:, index[a]] if a else 0.0)) for label, a, b in PHASES]
        rows.append(("later waits", np.array([b.waited for b in group]) / 1000.0))
        for label, values in rows:
            out.append(f"  {label:<14}" + " ".join(f"{v:6.2f}" for v in np.percentile(values, PERCENTILES)))
    return "\n".join(out)


# ---- running the cases (GPU) ---------------------------------------------------------------------------


def _bench_moe():
    spec = importlib.util.spec_from_file_location("ferrum_bench_moe", Path(__file__).with_name("bench_moe.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


class Runner:
    """Runs each case with markers around its launch on stdout (the device
    printf output is flushed through C stdio before each marker)."""

    def __init__(self, cp, runs: int, flush_bytes: int) -> None:
        self.cp = cp
        self.runs = runs
        self.flush = cp.empty(flush_bytes // 4, dtype=cp.int32)
        self.libc = ctypes.CDLL(None)

    def _mark(self, text: str) -> None:
        self.cp.cuda.Device().synchronize()
        self.libc.fflush(None)
        sys.stdout.flush()
        os.write(1, (text + "\n").encode())

    def run(self, name: str, fn: Callable[[], object], prepare: Callable[[], object] | None = None) -> None:
        if prepare:
            prepare()
        fn()
        self._mark(f"WARM {name}")
        for r in range(self.runs):
            if prepare:
                prepare()
            self.flush.fill(r)
            self._mark(f"BEGIN {name}#{r}")
            fn()
            self._mark(f"END {name}#{r}")


def run_cases(args: argparse.Namespace) -> None:
    import cupy as cp

    import ferrum_ffi as ff

    bm = _bench_moe()
    runner = Runner(cp, args.runs, bm.FLUSH_BYTES)
    bench = bm.Bench(cp, ff, 1, None)
    for key in [k for k in args.layers.split(",") if k]:
        layer = bm.with_physical_k(bm.LAYERS[key], ff.formats.mxfp4_physical_k, None)
        weights = [bm.random_marlin_weight(bench, layer, g, args.seed) for g in layer.gemms]
        for m in args.m:
            routing = bm.device_routing(bench, layer, m, args.seed, None, False)
            rng = np.random.default_rng([args.seed, m])
            to_device = ((lambda h: bm.bf16_device(cp, ff, h)) if layer.activation == "bf16"
                         else (lambda h: cp.asarray(h.astype(np.float16))))
            gate_up, down = layer.gemms
            x = to_device(rng.standard_normal((m, gate_up.k)).astype(np.float32))
            inter = to_device(rng.standard_normal((m * layer.top_k, down.k)).astype(np.float32))
            # As fused_moe runs them: partials added into zeroed outputs.
            for index, a, prob_m, top_k, mul in ((0, x, m, layer.top_k, False), (1, inter, m * layer.top_k, 1, True)):
                gemm, weight = layer.gemms[index], weights[index]
                div = 1 if index == 0 else layer.top_k
                shape = (prob_m * top_k // div, gemm.n)
                c = bm.bf16_empty(cp, ff, shape) if layer.activation == "bf16" else cp.empty(shape, dtype=cp.float16)
                raw = c.base if isinstance(c, ff.Bfloat16Array) else c
                call = bm.marlin_call(bench, weight, a, c, routing, prob_m, top_k, mul, False, div)
                runner.run(f"{key} {gemm.name} M={m}", call, prepare=lambda raw=raw: raw.fill(0))
            fused, name = bm.find_fused_moe()
            if fused is not None:
                values = {"x": x, "w13": weights[0], "w2": weights[1], "topk_weights": routing.weights_device,
                          "topk_ids": routing.ids_device, "top_k": layer.top_k, "fp32_reduce": False,
                          "router_logits": bm.router_logits(bench, routing.ids, layer.experts, args.seed)}
                layer_call, _ = bm.fused_layer_call(bench, fused, name, layer, values)
                runner.run(f"{key} layer M={m}", layer_call)
        del weights
        cp.get_default_memory_pool().free_all_blocks()
    for shape in args.shapes:
        k, n = (int(v) for v in shape.lower().split("x"))
        rng = np.random.default_rng(args.seed)
        qweight = cp.asarray(rng.integers(-2**31, 2**31 - 1, size=(k // 16, 2 * n), dtype=np.int32))
        scales = cp.asarray(rng.uniform(0.002, 0.02, size=(k // 128, n)).astype(np.float16))
        workspace = cp.zeros(n // 128 * 16, dtype=cp.int32)
        weight = ff.MarlinWeight(qweight, scales, workspace, k, n, 128)
        for m in args.dense_m:
            a = cp.asarray(rng.standard_normal((m, k)).astype(np.float16))
            out = cp.empty((m, n), dtype=cp.float16)
            runner.run(f"w4a16 {k}x{n} m={m}", lambda a=a, out=out: ff.marlin_gemm(a, weight, out))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", default="qwen,gptoss", help="MoE layers of scripts/bench_moe.py ('' for none)")
    parser.add_argument("--m", type=int, nargs="+", default=[1], help="MoE token counts (default 1)")
    parser.add_argument("--shapes", nargs="*", default=["4096x14336", "8192x28672"], help="dense W4A16 KxN shapes")
    parser.add_argument("--dense-m", type=int, nargs="+", default=[1], help="dense rows (default 1)")
    parser.add_argument("--runs", type=int, default=2, help="flushed runs per case; the last is summarised")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--save", type=Path, default=Path("timeline_probe.log"),
                        help="where the run's raw output goes (default %(default)s)")
    parser.add_argument("--log", type=Path, default=None,
                        help="summarise the raw output of an earlier run instead of running")
    return parser


def summarize_log(text: str) -> str:
    cases = parse(text.splitlines())
    last = {case.rsplit("#", 1)[0]: case for case in cases}  # the last run of each case
    return "\n".join(summarize(case, cases[case]) for case in last.values())


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.log is None:
        # The blocks print through the C runtime's stdout: send file
        # descriptor 1 itself to the log while the cases run.
        sys.stdout.flush()
        saved = os.dup(1)
        with open(args.save, "w") as log:
            os.dup2(log.fileno(), 1)
            try:
                run_cases(args)
            finally:
                ctypes.CDLL(None).fflush(None)
                sys.stdout.flush()
                os.dup2(saved, 1)
                os.close(saved)
        args.log = args.save
    print(summarize_log(args.log.read_text()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
