#!/usr/bin/env python3
"""Fused-MoE Marlin GEMMs against the read roofline and against cuBLAS.

Two MoE layers, at every m (tokens) asked for:
  * ``qwen``   Qwen3-30B-A3B-like: hidden 2048, expert intermediate 768, 128
               experts, top-8; INT4 (u4b8, group 128) x FP16.
               gate_up N=1536 K=2048, down N=2048 K=768.
  * ``gptoss`` GPT-OSS-20B-like: hidden 2880, intermediate 2880, 32 experts,
               top-4; MXFP4 x BF16 with the bf16 bias.
               gate_up N=5760 K=2880, down N=2880 K=2944 (K padded from 2880
               for the kernel's 128x64 tile).
  * ``qwen-fp8-tp4``  the Qwen-like layer's tensor-parallel shard of four,
               FP8 E4M3 channelwise x FP16: gate_up N=384 K=2048 (a partial
               last 256-column tile), down N=2048 K=192.
Routing: each token picks top_k distinct experts uniformly at random (fixed
seed), aligned once by ferrum_ffi.moe_ops.moe_align_block_size.

For each GEMM (gate_up, down) and, when ``ferrum_ffi.moe_layer`` exists, for
the whole layer, in the same run and the same way:
  * ``marlin``  the fused launch (launch_marlin_moe / _mxfp4_bf16) on random
                weights in the Marlin layout; down with mul_topk_weights;
  * ``read``    bench.py's streaming-read kernel over a buffer of the bytes
                the launch must read: the experts the routing touches x one
                expert's weight + scale (+ bias) bytes;
  * ``cuBLAS``  a loop over the touched experts of dense GEMMs of the same
                work (each expert's rows, pre-gathered, x its dense weight):
                CuPy fp16 matmul; PyTorch bf16 matmul when torch is installed
                (else not measured). Dense down GEMMs use the logical K.
With --adds the GEMM rows run the layer variants (the ``_ex`` entries) as
fused_moe does in atomic mode: partials added into an output zeroed before
each call (outside the interval; in the layer the previous kernel zeroes it),
the down GEMM summing each token's top_k rows; at M = 1 with direct routing
(no align arrays: each routed row's expert read from topk_ids).
Layer rows (``layer(fused_moe)``): the whole fused_moe call (routing align,
both GEMMs, the activation; the top-k sum in fp32 mode) against the read of both
projections' touched bytes and against the two cuBLAS loops' times summed (no
activation, no gather or sum in that sum: a lower bound for cuBLAS).
Timing: CUDA events around each call, the L2 flushed by a 512 MB fill before
it, then a device-side spin (longer than the host needs to enqueue the call)
so that Python launch overhead never shows in the event interval; the median
of --repeat calls (default 50). ``host us`` is the host time to enqueue one
call (Python overhead, not in the kernel time).

Reported per row: time, achieved TB/s over the touched bytes, the fraction of
the read roofline (read us / marlin us) and the speed-up over the cuBLAS loop
(cuBLAS us / marlin us). Prints a table; --json writes every number.
Usage: python scripts/bench_moe.py [--layers qwen,gptoss] [--m 1 4 16 64 256]
       [--repeat 50] [--json out.json]
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import inspect
import json
import os
import statistics
import sys
import time
import traceback
from collections import Counter
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
M_VALUES = (1, 4, 16, 64, 256)
BLOCK_SIZES = (8, 16, 32, 48, 64)
DEFAULT_REPEAT = 50
FLUSH_BYTES = 512 << 20  # several times the H200's 60 MB L2 (as ferrum_ffi.timing)
MXFP4_GROUP = 32


# ---- the layers -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GemmSpec:
    """One projection of all experts: ``y = x[:, :k] @ W_e``, ``W_e [k, n]``
    (``k`` physical, ``logical_k`` what a dense GEMM needs)."""

    name: str
    n: int
    k: int
    logical_k: int


@dataclass(frozen=True)
class LayerSpec:
    key: str
    title: str
    hidden: int
    intermediate: int
    experts: int
    top_k: int
    kind: str  # "u4b8" or "fe4m3fn" (fp16 activations), "mxfp4" (bf16)
    group_size: int
    gemms: tuple[GemmSpec, GemmSpec]

    @property
    def activation(self) -> str:
        return "bf16" if self.kind == "mxfp4" else "f16"


LAYERS: dict[str, LayerSpec] = {
    "qwen": LayerSpec(
        key="qwen", title="Qwen3-30B-A3B-like", hidden=2048, intermediate=768, experts=128, top_k=8,
        kind="u4b8", group_size=128,
        gemms=(GemmSpec("gate_up", 2 * 768, 2048, 2048), GemmSpec("down", 2048, 768, 768)),
    ),
    "gptoss": LayerSpec(
        key="gptoss", title="GPT-OSS-20B-like", hidden=2880, intermediate=2880, experts=32, top_k=4,
        kind="mxfp4", group_size=MXFP4_GROUP,
        # The down K is the library's physical K for (2880, 2880) unless
        # --gptoss-down-k says otherwise (with_physical_k).
        gemms=(GemmSpec("gate_up", 2 * 2880, 2880, 2880), GemmSpec("down", 2880, 2880, 2880)),
    ),
    "qwen-fp8-tp4": LayerSpec(
        key="qwen-fp8-tp4", title="Qwen3-30B-A3B-like FP8, TP shard 1 of 4", hidden=2048, intermediate=192,
        experts=128, top_k=8, kind="fe4m3fn", group_size=-1,
        gemms=(GemmSpec("gate_up", 2 * 192, 2048, 2048), GemmSpec("down", 2048, 192, 192)),
    ),
}


def with_physical_k(layer: LayerSpec, physical_k: Callable[[int, int], int], down_k: int | None) -> LayerSpec:
    """The layer with each MXFP4 projection's physical K: ``physical_k(n,
    logical_k)`` (the library's rule), or ``down_k`` for the down projection."""
    if layer.kind != "mxfp4":
        return layer
    gemms = []
    for gemm in layer.gemms:
        k = down_k if gemm.name == "down" and down_k is not None else physical_k(gemm.n, gemm.logical_k)
        if k < gemm.logical_k or k % 64:
            raise ValueError(f"{layer.key} {gemm.name}: physical K {k} must be a multiple of 64 and at least "
                             f"the logical K {gemm.logical_k}")
        gemms.append(GemmSpec(gemm.name, gemm.n, k, gemm.logical_k))
    return replace(layer, gemms=tuple(gemms))


# ---- pure helpers (tests/test_bench_moe_cpu.py) ------------------------------------------------------


def expert_bytes(kind: str, n: int, k: int, group_size: int) -> int:
    """Bytes one expert's launch reads from the weight buffers: the Marlin
    codes, the scales, the zero points (u4) and the bias (mxfp4)."""
    groups = 1 if group_size == -1 else k // group_size
    if kind in ("u4b8", "u4"):
        nbytes = k * n // 2 + groups * n * 2
        return nbytes + (groups * n // 2 if kind == "u4" else 0)  # zero points: 4 bits each
    if kind == "fe4m3fn":
        return k * n + groups * n * 2
    if kind == "mxfp4":
        return k * n // 2 + (k // MXFP4_GROUP) * n + 2 * n
    raise ValueError(f"unknown weight kind {kind!r}")


def route(m: int, top_k: int, experts: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Uniform random routing: each token picks ``top_k`` distinct experts
    (every subset equally likely); weights are a softmax over the chosen
    experts' random logits. ``(ids int32 [m, top_k], weights float32 [m, top_k])``."""
    if not 1 <= top_k <= experts:
        raise ValueError(f"top_k={top_k} must be in 1..experts={experts}")
    rng = np.random.default_rng([seed, m, top_k, experts])
    ids = rng.random((m, experts)).argsort(axis=1)[:, :top_k].astype(np.int32)
    logits = rng.standard_normal((m, top_k))
    weights = np.exp(logits - logits.max(axis=1, keepdims=True))
    return ids, (weights / weights.sum(axis=1, keepdims=True)).astype(np.float32)


def touched_experts(ids: np.ndarray) -> np.ndarray:
    """The distinct experts the routing names, ascending."""
    return np.unique(np.asarray(ids).reshape(-1))


def touched_bytes(ids: np.ndarray, kind: str, n: int, k: int, group_size: int) -> int:
    return int(touched_experts(ids).size) * expert_bytes(kind, n, k, group_size)


def rows_by_expert(ids: np.ndarray) -> dict[int, np.ndarray]:
    """Expert -> its pair ids ``t = token * top_k + slot`` (ascending), for
    the touched experts; the token of ``t`` is ``t // top_k``."""
    flat = np.asarray(ids).reshape(-1)
    return {int(e): np.flatnonzero(flat == e) for e in touched_experts(flat)}


def parse_layers(text: str) -> list[str]:
    keys = [item.strip() for item in text.replace(" ", ",").split(",") if item.strip()]
    unknown = [key for key in keys if key not in LAYERS]
    if unknown or not keys:
        raise ValueError(f"--layers: unknown {unknown or text!r}; choose from {', '.join(LAYERS)}")
    return list(dict.fromkeys(keys))


def spin_ns_for(host_us: float) -> int:
    """Device-side delay before the start event: twice the host's enqueue
    time plus 100 us (at least 200 us, at most 100 ms), so the call is queued
    before the GPU reaches it."""
    return int(min(max(2.0 * host_us + 100.0, 200.0), 100_000.0) * 1000)


# The fused layer: ferrum_ffi.moe_layer is written separately, so its call is
# found from its signature: parameters are matched to these roles by name.
FUSED_FUNCTIONS = ("fused_moe", "fused_marlin_moe", "moe_layer", "fused_experts")
ROLE_NAMES: dict[str, tuple[str, ...]] = {
    "x": ("x", "hidden_states", "hidden", "a", "input", "inputs", "activations"),
    "w13": ("w13", "w1", "gate_up", "w_gate_up", "gate_up_weight", "w13_weight", "gate_up_proj"),
    "w2": ("w2", "down", "w_down", "down_weight", "w2_weight", "down_proj"),
    "topk_weights": ("topk_weights", "routing_weights", "topk_weight"),
    "topk_ids": ("topk_ids", "topk_indices", "selected_experts"),
    "router_logits": ("router_logits", "gating_output", "logits", "gating_logits", "router"),
    "top_k": ("top_k", "topk"),
    "activation": ("activation", "act", "activation_fn", "act_fn", "activation_type"),
    "fp32_reduce": ("fp32_reduce", "use_fp32_reduce"),
}
GPT_OSS_ACTIVATIONS = ("gpt_oss_swiglu", "swigluoai", "swiglu_oai", "gpt_oss", "gptoss")


def _role_of(name: str) -> str | None:
    return next((role for role, names in ROLE_NAMES.items() if name in names), None)


def plan_fused_call(signature: inspect.Signature, values: Mapping[str, Any]) -> tuple[list, dict]:
    """``(args, kwargs)`` for a function of ``signature`` from ``values`` keyed
    by role (ROLE_NAMES). Routing goes as topk_ids/topk_weights when the
    function takes them, else as router_logits + top_k. Raises ValueError
    naming a required parameter no role supplies."""
    params = list(signature.parameters.values())
    roles = {p.name: _role_of(p.name) for p in params}
    takes_topk = any(role in ("topk_ids", "topk_weights") for role in roles.values())
    args: list = []
    kwargs: dict = {}
    for p in params:
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        role = roles[p.name]
        required = p.default is p.empty
        if role in ("router_logits", "top_k") and takes_topk and not required:
            role = None  # routing is given as ids and weights
        if role is None or role not in values:
            if required:
                raise ValueError(f"cannot supply the required parameter {p.name!r} of {signature}")
            continue
        if p.kind is p.POSITIONAL_ONLY:
            args.append(values[role])
        else:
            kwargs[p.name] = values[role]
    return args, kwargs


def describe_call(name: str, args: list, kwargs: dict) -> str:
    def show(value: Any) -> str:
        if isinstance(value, (str, int, float)):
            return repr(value)
        return type(value).__name__

    parts = [show(a) for a in args] + [f"{k}={show(v)}" for k, v in kwargs.items()]
    return f"{name}({', '.join(parts)})"


def format_table(rows: Sequence[Mapping[str, Any]]) -> str:
    head = (f"{'layer':<7} {'gemm':<16} {'m':>4} {'exp':>4} {'blk':>3} {'MB':>8} {'marlin us':>10} {'host us':>8} "
            f"{'TB/s':>6} {'read us':>8} {'of read':>8} {'cuBLAS us':>10} {'x cuBLAS':>9}")
    lines = [head, "-" * len(head)]

    def num(value, fmt: str, width: int) -> str:
        return f"{value:{width}{fmt}}" if isinstance(value, (int, float)) else f"{'-':>{width}}"

    for r in rows:
        if r.get("error"):
            error = r["error"] if len(r["error"]) <= 110 else r["error"][:107] + "..."
            lines.append(f"{r['layer']:<7} {r['gemm']:<16} {r['m']:>4} ERROR: {error}")
            continue
        lines.append(
            f"{r['layer']:<7} {r['gemm']:<16} {r['m']:>4} {r['experts_touched']:>4} {num(r.get('block'), 'd', 3)} "
            f"{r['touched_bytes'] / 1e6:>8.2f} {num(r.get('marlin_us'), '.1f', 10)} {num(r.get('host_us'), '.0f', 8)} "
            f"{num(r.get('marlin_tb_s'), '.2f', 6)} {num(r.get('read_us'), '.1f', 8)} "
            f"{num(r.get('fraction_of_read'), '.0%', 8)} {num(r.get('cublas_us'), '.1f', 10)} "
            + (f"{r['speedup_vs_cublas']:8.2f}x" if isinstance(r.get("speedup_vs_cublas"), float) else f"{'-':>9}")
        )
    return "\n".join(lines)


# ---- device side ---------------------------------------------------------------------------------------

_SPIN_KERNEL = r"""
extern "C" __global__ void spin_ns(unsigned long long ns) {
  unsigned long long start, now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  } while (now - start < ns);
}
"""


def _dense_bench_module():
    """scripts/bench.py, for its streaming-read kernel (loaded by path: scripts/ is no package)."""
    spec = importlib.util.spec_from_file_location("ferrum_bench_dense", Path(__file__).with_name("bench.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@dataclass
class Timing:
    us: float  # median device time of one call
    host_us: float  # host time to enqueue one call
    spin_us: float


class Timer:
    """CUDA events around one call on the current stream, after an L2 flush
    and a device-side spin that outlasts the host's enqueueing of the call,
    so the interval is the device's time for the call alone; the median of
    ``repeat`` calls."""

    def __init__(self, cp: Any, flush_bytes: int = FLUSH_BYTES) -> None:
        self.cp = cp
        self.flush = cp.empty(flush_bytes // 4, dtype=cp.int32)
        self.spin = cp.RawKernel(_SPIN_KERNEL, "spin_ns")
        self.start = cp.cuda.Event()
        self.end = cp.cuda.Event()

    def host_us(self, fn: Callable[[], Any], calls: int = 3) -> float:
        worst = 0.0
        for _ in range(calls):
            self.cp.cuda.Device().synchronize()
            t0 = time.perf_counter()
            fn()
            worst = max(worst, (time.perf_counter() - t0) * 1e6)
        self.cp.cuda.Device().synchronize()
        return worst

    def measure(self, fn: Callable[[], Any], repeat: int, warmup: int = 3,
                prepare: Callable[[], Any] | None = None) -> Timing:
        """``prepare``: run before each timed call, outside the interval (and
        before the L2 flush), e.g. zeroing an output the call adds into."""
        def call() -> None:
            if prepare is not None:
                prepare()
            fn()

        for _ in range(warmup):
            call()
        host = self.host_us(call)
        spin = np.uint64(spin_ns_for(host))
        times = []
        for i in range(repeat):
            if prepare is not None:
                prepare()
            self.flush.fill(i)
            self.spin((1,), (1,), (spin,))
            self.start.record()
            fn()
            self.end.record()
            self.end.synchronize()
            times.append(self.cp.cuda.get_elapsed_time(self.start, self.end) * 1000.0)
        return Timing(statistics.median(times), host, int(spin) / 1000.0)


class Bench:
    """The shared device state of one run: CuPy, ferrum_ffi, the timer, the
    read kernel and the read times already measured (by byte count)."""

    def __init__(self, cp: Any, ff: Any, repeat: int, torch: Any | None) -> None:
        self.cp = cp
        self.ff = ff
        self.repeat = repeat
        self.torch = torch
        self.timer = Timer(cp)
        self.read_kernel = cp.RawKernel(_dense_bench_module()._READ_KERNEL, "stream_read")
        self.sms = ff.mm.device_sm_count(cp.cuda.Device().id)
        self.sink = cp.zeros(1, dtype=cp.int32)
        self._read_us: dict[int, float] = {}

    def read_us(self, nbytes: int) -> float:
        """The streaming read of ``nbytes`` (one buffer, 16-byte loads), cached."""
        if nbytes not in self._read_us:
            n16 = max(1, -(-nbytes // 16))
            buf = self.cp.ones(n16 * 4, dtype=self.cp.int32)
            grid = self.sms * 8
            self._read_us[nbytes] = self.timer.measure(
                lambda: self.read_kernel((grid,), (256,), (buf, np.int64(n16), self.sink)), self.repeat).us
            del buf
        return self._read_us[nbytes]


def bf16_device(cp: Any, ff: Any, host: np.ndarray) -> Any:
    """float host values -> a bf16 device array (uint16 bits behind
    ff.bfloat16_view: every CuPy version holds that)."""
    import ml_dtypes

    bits16 = np.ascontiguousarray(host, dtype=np.float32).astype(ml_dtypes.bfloat16).view(np.uint16)
    return ff.bfloat16_view(cp.asarray(bits16))


def bf16_empty(cp: Any, ff: Any, shape: tuple[int, ...]) -> Any:
    return ff.bfloat16_view(cp.empty(shape, dtype=cp.uint16))


def all_finite(cp: Any, ff: Any, array: Any) -> bool:
    if isinstance(array, ff.Bfloat16Array):
        exponent = array.base.view(cp.uint16) & 0x7F80
        return not bool((exponent == 0x7F80).any())
    if type(array).__module__.split(".")[0] == "torch":
        import torch

        return bool(torch.isfinite(array).all())
    return bool(cp.isfinite(array).all())


def random_marlin_weight(bench: Bench, layer: LayerSpec, gemm: GemmSpec, seed: int) -> Any:
    """A MarlinMoeWeight of random codes straight in the Marlin layout on the
    device (quantising 128 experts on the host would dominate the run):
    u4b8 and fe4m3fn with fp16 scales in [0.002, 0.02] (E4M3 bytes below
    magnitude 2: no NaN codes); mxfp4 with E8M0 bytes 119..124 (0 in the
    padded K groups, as from_mxfp4 pads) and a small bf16 bias."""
    import ml_dtypes

    from ferrum_ffi.moe_weights import MarlinMoeWeight

    rng = np.random.default_rng([seed, gemm.n, gemm.k])
    e, n, k = layer.experts, gemm.n, gemm.k
    words = 4 * n if layer.kind == "fe4m3fn" else 2 * n
    qweight = rng.integers(np.iinfo(np.int32).min, np.iinfo(np.int32).max, size=(e, k // 16, words),
                           dtype=np.int32, endpoint=True)
    if layer.kind == "fe4m3fn":
        qweight &= np.int32(np.uint32(0xBFBFBFBF).view(np.int32))
    if layer.kind == "mxfp4":
        scales = rng.integers(119, 125, size=(e, k // MXFP4_GROUP, n), dtype=np.uint8)
        scales[:, gemm.logical_k // MXFP4_GROUP:] = 0
        bias = (rng.standard_normal((e, n)) * 0.1).astype(np.float32).astype(ml_dtypes.bfloat16)
        host = MarlinMoeWeight(kind="mxfp4", num_experts=e, n=n, k=k, logical_k=gemm.logical_k,
                               group_size=MXFP4_GROUP, qweight=qweight, scales=scales, bias=bias)
    else:
        groups = 1 if layer.group_size == -1 else k // layer.group_size
        scales = rng.uniform(0.002, 0.02, size=(e, groups, n)).astype(np.float16)
        host = MarlinMoeWeight(kind=layer.kind, num_experts=e, n=n, k=k, logical_k=k, group_size=layer.group_size,
                               qweight=qweight, scales=scales)
    return host.to_device()


@dataclass
class Routing:
    ids: np.ndarray
    weights: np.ndarray
    block: int
    sorted_ids: Any
    expert_ids: Any
    count: Any
    ids_device: Any
    weights_device: Any
    touched: int


def device_routing(bench: Bench, layer: LayerSpec, m: int, seed: int, block: int | None,
                   warp_specialised: bool) -> Routing:
    ids, weights = route(m, layer.top_k, layer.experts, seed)
    touched = int(touched_experts(ids).size)
    # fused_moe's rule
    block = block or bench.ff.moe_layer.default_block_size(m, layer.top_k, layer.experts, warp_specialised)
    ids_device = bench.cp.asarray(ids)
    sorted_ids, expert_ids, count = bench.ff.moe_ops.moe_align_block_size(ids_device, layer.experts, block)
    return Routing(ids, weights, block, sorted_ids, expert_ids, count, ids_device, bench.cp.asarray(weights), touched)


def marlin_call(bench: Bench, weight: Any, a: Any, c: Any, routing: Routing, prob_m: int, top_k: int,
                mul: bool, fp32_reduce: bool, add_rows_div: int = 0) -> Callable[[], None]:
    """The fused launch of one projection as a closure (scratch allocated here);
    ``add_rows_div``: the layer variant, adding into a zeroed ``c``."""
    cp, ff = bench.cp, bench.ff
    from ferrum_ffi.moe_validation import MoeF16WeightType, moe_c_tmp_floats, moe_workspace_ints

    rows = prob_m * top_k
    workspace = cp.zeros(moe_workspace_ints(bench.sms), dtype=cp.int32)
    c_tmp = (cp.zeros(max(moe_c_tmp_floats(routing.block, bench.sms), rows * weight.n), dtype=cp.float32)
             if fp32_reduce else None)
    common = dict(
        a=a, b=weight.qweight, c=c, scales=weight.scales, workspace=workspace, sorted_token_ids=routing.sorted_ids,
        expert_ids=routing.expert_ids, num_tokens_past_padded=routing.count, prob_m=prob_m, prob_n=weight.n,
        prob_k=weight.k, top_k=top_k, moe_block_size=routing.block, group_size=weight.group_size, c_tmp=c_tmp,
        topk_weights=routing.weights_device, mul_topk_weights=mul, use_fp32_reduce=fp32_reduce,
        add_rows_div=add_rows_div,
    )
    if add_rows_div and routing.ids.shape[0] == 1 and routing.block == 8:
        # fused_moe's decode step: no align arrays, each routed row names its expert.
        common.update(sorted_token_ids=None, num_tokens_past_padded=None, expert_ids=routing.ids_device,
                      direct_routing=True)
    if weight.kind == "mxfp4":
        return lambda: ff.launch_marlin_moe_mxfp4_bf16(**common, bias=weight.bias, expert_count=weight.num_experts)
    kind = MoeF16WeightType.E4M3 if weight.kind == "fe4m3fn" else MoeF16WeightType.U4B8
    return lambda: ff.launch_marlin_moe(**common, weight_type=kind, zero_points=weight.zero_points,
                                        expert_count=weight.num_experts)


class DenseExperts:
    """Dense [E, K, N] weights of one projection for the cuBLAS loop: fp16
    CuPy arrays, or bf16 torch tensors (values random; timing only)."""

    def __init__(self, bench: Bench, layer: LayerSpec, gemm: GemmSpec, seed: int) -> None:
        self.bench, self.gemm = bench, gemm
        self.torch = layer.activation == "bf16"
        e, k, n = layer.experts, gemm.logical_k, gemm.n
        if self.torch:
            torch = bench.torch
            generator = torch.Generator(device="cuda").manual_seed(seed)
            self.w = torch.empty((e, k, n), dtype=torch.bfloat16, device="cuda")
            for i in range(e):
                self.w[i] = torch.randn((k, n), generator=generator, device="cuda", dtype=torch.float32) * 0.02
        else:
            cp = bench.cp
            rng = cp.random.RandomState(seed)
            self.w = cp.empty((e, k, n), dtype=cp.float16)
            for i in range(e):
                self.w[i] = (rng.standard_normal((k, n), dtype=cp.float32) * 0.02).astype(cp.float16)

    def loop(self, x_rows: Callable[[np.ndarray], Any], groups: Mapping[int, np.ndarray]) -> tuple[Callable, int]:
        """One GEMM per touched expert: ``x_rows(rows)`` (gathered here, not
        timed) @ W_e into a preallocated output."""
        items = []
        for e, rows in groups.items():
            a = x_rows(rows)
            if self.torch:
                out = self.bench.torch.empty((a.shape[0], self.gemm.n), dtype=a.dtype, device=a.device)
            else:
                out = self.bench.cp.empty((a.shape[0], self.gemm.n), dtype=a.dtype)
            items.append((a, self.w[e], out))
        if self.torch:
            matmul = self.bench.torch.matmul

            def run() -> None:
                for a, w, out in items:
                    matmul(a, w, out=out)
        else:
            matmul = self.bench.cp.matmul

            def run() -> None:
                for a, w, out in items:
                    matmul(a, w, out=out)
        return run, len(items)


def dense_rows(bench: Bench, layer: LayerSpec, source: np.ndarray) -> Callable[[np.ndarray], Any]:
    """A gatherer of rows of the host matrix ``source`` into contiguous
    device arrays of the dense GEMM's type."""
    def gather(rows: np.ndarray) -> Any:
        part = np.ascontiguousarray(source[rows])
        if layer.activation == "bf16":
            return bench.torch.from_numpy(part.astype(np.float32)).to("cuda").to(bench.torch.bfloat16)
        return bench.cp.asarray(part.astype(np.float16))

    return gather


def find_fused_moe() -> tuple[Callable | None, str]:
    try:
        module = importlib.import_module("ferrum_ffi.moe_layer")
    except ModuleNotFoundError as exc:
        if exc.name == "ferrum_ffi.moe_layer":
            return None, "ferrum_ffi.moe_layer does not exist in this tree: layer rows skipped"
        return None, f"ferrum_ffi.moe_layer failed to import: {exc!r}"
    except Exception as exc:  # noqa: BLE001 - report whatever the module raised
        return None, f"ferrum_ffi.moe_layer failed to import: {exc!r}"
    for name in FUSED_FUNCTIONS:
        fn = getattr(module, name, None)
        if callable(fn):
            return fn, f"ferrum_ffi.moe_layer.{name}"
    return None, f"ferrum_ffi.moe_layer has none of {', '.join(FUSED_FUNCTIONS)}: layer rows skipped"


def fused_layer_call(bench: Bench, fn: Callable, name: str, layer: LayerSpec, values: dict) -> tuple[Callable, str]:
    """A working call of the fused layer: tried once per activation candidate
    (GPT-OSS: its SwiGLU names first); raises RuntimeError with every reason."""
    signature = inspect.signature(fn)
    takes_activation = any(_role_of(p) == "activation" for p in signature.parameters)
    candidates: tuple[str | None, ...] = (None,)
    if takes_activation:
        candidates = GPT_OSS_ACTIVATIONS + (None,) if layer.kind == "mxfp4" else (None, "silu")
    reasons = []
    for activation in candidates:
        given = dict(values) if activation is None else {**values, "activation": activation}
        try:
            args, kwargs = plan_fused_call(signature, given)
            out = fn(*args, **kwargs)
            bench.cp.cuda.Device().synchronize()
        except Exception as exc:  # noqa: BLE001 - try the next form, report all
            reasons.append(f"activation={activation!r}: {type(exc).__name__}: {exc}")
            continue
        if out is not None and not all_finite(bench.cp, bench.ff, out):
            reasons.append(f"activation={activation!r}: non-finite output")
            continue
        return (lambda: fn(*args, **kwargs)), describe_call(name, args, kwargs)
    raise RuntimeError(f"no call of {name}{signature} worked: " + " | ".join(reasons))


def router_logits(bench: Bench, ids: np.ndarray, experts: int, seed: int) -> Any:
    """fp32 logits whose top_k are exactly ``ids`` (chosen experts + 20)."""
    rng = np.random.default_rng([seed, 99])
    logits = rng.standard_normal((ids.shape[0], experts)).astype(np.float32)
    np.put_along_axis(logits, ids, np.take_along_axis(logits, ids, axis=1) + 20.0, axis=1)
    return bench.cp.asarray(logits)


# ---- one layer ------------------------------------------------------------------------------------------


@dataclass
class RunOptions:
    m_values: tuple[int, ...]
    seed: int = 0
    fp32_reduce: bool = False
    block: int | None = None
    cublas: bool = True
    layer: bool = True
    adds: bool = False  # the GEMMs as fused_moe runs them in atomic mode


@dataclass
class Report:
    rows: list[dict] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def _row(layer: LayerSpec, gemm: str, m: int, routing: Routing, nbytes: int, **values) -> dict:
    return {"layer": layer.key, "gemm": gemm, "m": m, "top_k": layer.top_k, "experts": layer.experts,
            "kind": layer.kind, "experts_touched": routing.touched, "block": routing.block,
            "touched_bytes": nbytes, **values}


def _ratios(row: dict) -> dict:
    us = row.get("marlin_us")
    if isinstance(us, float) and us > 0:
        row["marlin_tb_s"] = row["touched_bytes"] / us / 1e6
        row["fraction_of_read"] = row["read_us"] / us
        if isinstance(row.get("cublas_us"), float):
            row["speedup_vs_cublas"] = row["cublas_us"] / us
    return row


def bench_layer(bench: Bench, layer: LayerSpec, options: RunOptions, report: Report) -> None:
    cp, ff = bench.cp, bench.ff
    reduce = "fp32" if options.fp32_reduce else "adds" if options.adds else "atomic"
    print(f"[{layer.key}] {layer.title}: preparing {layer.experts} experts x {len(layer.gemms)} projections "
          f"({layer.kind}) ...", flush=True)
    weights = [random_marlin_weight(bench, layer, gemm, options.seed) for gemm in layer.gemms]
    warp_specialised = ff.moe_layer.tall_blocks_warp_specialised(cp.cuda.Device().id, *weights)
    dense = None
    if options.cublas:
        if layer.activation == "bf16" and bench.torch is None:
            report.notes.append(f"{layer.key}: PyTorch not installed: no bf16 cuBLAS reference")
        else:
            dense = [DenseExperts(bench, layer, gemm, options.seed + i) for i, gemm in enumerate(layer.gemms)]
    fused, fused_name = (None, "")
    if options.layer:
        fused, fused_name = find_fused_moe()
        if fused is None:
            report.notes.append(f"{layer.key}: {fused_name}")
            fused_name = ""
    gate_up, down = layer.gemms
    for m in options.m_values:
        try:
            routing = device_routing(bench, layer, m, options.seed, options.block, warp_specialised)
        except Exception as exc:  # noqa: BLE001
            report.errors.append(f"{layer.key} m={m} routing: {exc!r}")
            continue
        groups = rows_by_expert(routing.ids)
        pairs = m * layer.top_k
        rng = np.random.default_rng([options.seed, m])
        x_host = rng.standard_normal((m, gate_up.logical_k)).astype(np.float32)
        inter_host = np.zeros((pairs, down.k), dtype=np.float32)
        inter_host[:, : down.logical_k] = rng.standard_normal((pairs, down.logical_k))
        to_device = (lambda h: bf16_device(cp, ff, h)) if layer.activation == "bf16" else \
            (lambda h: cp.asarray(h.astype(np.float16)))
        x = to_device(x_host)
        inter = to_device(inter_host)
        layer_bytes = 0
        layer_cublas = 0.0
        # gate_up: token rows in, top_k rows out per token; down: one row in and
        # out per (token, slot) pair, scaled by its top-k weight. The dense loop
        # gathers, per expert, the tokens (gate_up) or the pairs (down) it serves.
        projections = (
            (0, x, m, layer.top_k, False, x_host, lambda t: t // layer.top_k),
            (1, inter, pairs, 1, True, inter_host[:, : down.logical_k], lambda t: t),
        )
        for index, a, prob_m, top_k, mul, source, dense_rows_of in projections:
            gemm, weight = layer.gemms[index], weights[index]
            nbytes = touched_bytes(routing.ids, layer.kind, gemm.n, gemm.k, layer.group_size)
            layer_bytes += nbytes
            row = _row(layer, gemm.name, m, routing, nbytes, n=gemm.n, k=gemm.k, reduce=reduce)
            try:
                # --adds: gate_up adds its partials into a zeroed output, down
                # adds each token's top_k rows into the token's row.
                div = (1 if index == 0 else layer.top_k) if options.adds else 0
                shape = (prob_m * top_k // max(div, 1), gemm.n)
                c = bf16_empty(cp, ff, shape) if layer.activation == "bf16" else cp.empty(shape, dtype=cp.float16)
                raw = c.base if isinstance(c, ff.Bfloat16Array) else c  # the uint16 bits of a bf16 array
                zero = (lambda raw=raw: raw.fill(0)) if div else None
                if zero is not None:
                    zero()
                call = marlin_call(bench, weight, a, c, routing, prob_m, top_k, mul, options.fp32_reduce, div)
                call()
                cp.cuda.Device().synchronize()
                if not all_finite(cp, ff, c):
                    raise RuntimeError("the Marlin output holds NaN/Inf")
                timing = bench.timer.measure(call, bench.repeat, prepare=zero)
                row.update(marlin_us=timing.us, host_us=timing.host_us, spin_us=timing.spin_us,
                           read_us=bench.read_us(nbytes))
            except Exception as exc:  # noqa: BLE001 - keep measuring the rest
                row["error"] = f"{type(exc).__name__}: {exc}"
                report.errors.append(f"{layer.key} {gemm.name} m={m}: {row['error']}\n{traceback.format_exc()}")
                report.rows.append(row)
                layer_cublas = float("nan")
                continue
            if dense is not None:
                try:
                    loop, calls = dense[index].loop(dense_rows(bench, layer, source),
                                                    {e: dense_rows_of(t) for e, t in groups.items()})
                    row.update(cublas_us=bench.timer.measure(loop, bench.repeat).us, cublas_calls=calls)
                    layer_cublas += row["cublas_us"]
                except Exception as exc:  # noqa: BLE001
                    report.errors.append(f"{layer.key} {gemm.name} m={m} cuBLAS: {exc!r}")
                    layer_cublas = float("nan")
            report.rows.append(_ratios(row))
        if fused is not None:
            row = _row(layer, "layer(fused_moe)", m, routing, layer_bytes, reduce="fused_moe's own")
            try:
                values = {
                    "x": x, "w13": weights[0], "w2": weights[1], "topk_weights": routing.weights_device,
                    "topk_ids": routing.ids_device, "top_k": layer.top_k, "fp32_reduce": options.fp32_reduce,
                    "router_logits": router_logits(bench, routing.ids, layer.experts, options.seed),
                }
                call, described = fused_layer_call(bench, fused, fused_name, layer, values)
                timing = bench.timer.measure(call, bench.repeat)
                row.update(marlin_us=timing.us, host_us=timing.host_us, spin_us=timing.spin_us,
                           read_us=bench.read_us(layer_bytes), call=described, block=None)
                if dense is not None and np.isfinite(layer_cublas):
                    row["cublas_us"] = layer_cublas  # the two loops' medians, summed
                report.rows.append(_ratios(row))
            except Exception as exc:  # noqa: BLE001
                row["error"] = f"{type(exc).__name__}: {exc}"
                report.errors.append(f"{layer.key} fused_moe: {row['error']}")
                report.rows.append(row)
        print(f"[{layer.key}] m={m} done", flush=True)
    del weights, dense
    cp.get_default_memory_pool().free_all_blocks()
    if bench.torch is not None:
        bench.torch.cuda.empty_cache()


# ---- command line -----------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", default="qwen,gptoss", help="comma-separated: " + ", ".join(LAYERS))
    parser.add_argument("--m", type=int, nargs="+", default=list(M_VALUES), help="token counts (default %(default)s)")
    parser.add_argument("--repeat", type=int, default=DEFAULT_REPEAT, help="timed calls per median (default 50)")
    parser.add_argument("--json", type=Path, default=None, help="also write every number to this JSON file")
    parser.add_argument("--seed", type=int, default=0, help="routing and weights seed")
    parser.add_argument("--fp32-reduce", action="store_true", help="deterministic fp32 reduction instead of atomics")
    parser.add_argument("--block", type=int, default=None, choices=BLOCK_SIZES,
                        help="force moe_block_size (default: fused_moe's rule, ferrum_ffi.moe_layer.default_block_size)")
    parser.add_argument("--gptoss-down-k", type=int, default=None, metavar="K",
                        help="physical K of the GPT-OSS down projection (default: the library's "
                             "mxfp4_physical_k(2880, 2880); 2944 is the original engine's padded layout)")
    parser.add_argument("--no-cublas", action="store_true", help="skip the cuBLAS loops")
    parser.add_argument("--no-layer", action="store_true", help="skip the fused_moe layer rows")
    parser.add_argument("--adds", action="store_true",
                        help="time the GEMMs as fused_moe runs them in atomic mode (the _ex entries adding into "
                             "an output zeroed before each call, outside the timing; down sums each token's rows)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        layers = parse_layers(args.layers)
    except ValueError as exc:
        print(f"bench_moe: {exc}", file=sys.stderr)
        return 2
    if args.adds and args.fp32_reduce:
        print("bench_moe: --adds is atomic mode; it excludes --fp32-reduce", file=sys.stderr)
        return 2
    bad_m = [m for m in args.m if m < 1]
    if bad_m or args.repeat < 1:
        print(f"bench_moe: --m values must be >= 1 (got {bad_m}) and --repeat >= 1", file=sys.stderr)
        return 2
    if args.gptoss_down_k is not None and (args.gptoss_down_k < 2880 or args.gptoss_down_k % 64):
        print(f"bench_moe: --gptoss-down-k {args.gptoss_down_k} must be a multiple of 64 and >= 2880", file=sys.stderr)
        return 2
    if args.json is not None and not args.json.parent.exists():
        print(f"bench_moe: the folder of --json {args.json} does not exist", file=sys.stderr)
        return 2
    try:
        import cupy as cp
    except ImportError as exc:
        print(f"bench_moe: CuPy is not installed ({exc}); nothing to measure", file=sys.stderr)
        return 1
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))  # the repository's ferrum_ffi, as scripts/check_w4a16.py
    try:
        import ferrum_ffi as ff
        import ferrum_ffi.formats  # noqa: F401 - the modules read as ff.<name> below
        import ferrum_ffi.mm  # noqa: F401
        import ferrum_ffi.moe_ops  # noqa: F401

        if ff.device_count() == 0:
            print("bench_moe: no CUDA device", file=sys.stderr)
            return 1
        ff.library()
    except Exception as exc:  # noqa: BLE001 - a missing or mismatched library: say so plainly
        print(f"bench_moe: cannot load ferrum_ffi's library: {exc} (set FERRUM_MARLIN_LIBRARY to a build of "
              "libferrum_marlin.so)", file=sys.stderr)
        return 1
    torch = None
    try:
        import torch as _torch

        if _torch.cuda.is_available():
            torch = _torch
    except ImportError:
        pass
    forced = {name: os.environ[name] for name in ("FERRUM_VLLM_MOE_THREAD_K", "FERRUM_VLLM_MOE_THREAD_N")
              if name in os.environ}
    device = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)["name"]
    device = device.decode() if isinstance(device, bytes) else str(device)
    print(f"bench_moe: {device}; layers {', '.join(layers)}; m {args.m}; repeat {args.repeat}; "
          f"reduce {'fp32' if args.fp32_reduce else 'adds' if args.adds else 'atomic'}; torch {'yes' if torch else 'no'}"
          + (f"; forced tile {forced}" if forced else ""), flush=True)
    specs = {key: with_physical_k(LAYERS[key], ff.formats.mxfp4_physical_k, args.gptoss_down_k) for key in layers}
    for spec in specs.values():
        print("  " + spec.key + ": " + ", ".join(f"{g.name} N={g.n} K={g.k}" + (f" (logical {g.logical_k})"
                                                  if g.k != g.logical_k else "") for g in spec.gemms), flush=True)
    bench = Bench(cp, ff, args.repeat, torch)
    report = Report()
    options = RunOptions(tuple(args.m), args.seed, args.fp32_reduce, args.block, not args.no_cublas, not args.no_layer,
                         args.adds)
    for key in layers:
        try:
            bench_layer(bench, specs[key], options, report)
        except Exception as exc:  # noqa: BLE001 - the other layer may still run
            report.errors.append(f"{key}: {type(exc).__name__}: {exc}\n{traceback.format_exc()}")
            cp.get_default_memory_pool().free_all_blocks()
    print()
    print(format_table(report.rows))
    for note in report.notes:
        print(f"note: {note}")
    calls = {row["layer"]: row["call"] for row in reversed(report.rows) if row.get("call")}
    for key, call in calls.items():
        print(f"note: {key} layer call: {call}")
    for error, count in Counter(report.errors).items():
        print(f"error{f' (x{count})' if count > 1 else ''}: {error}", file=sys.stderr)
    if args.json is not None:
        payload = {
            "device": device, "sms": bench.sms, "repeat": args.repeat, "seed": args.seed,
            "reduce": "fp32" if args.fp32_reduce else "adds" if args.adds else "atomic", "forced_tile": forced,
            "layers": {key: asdict(spec) for key, spec in specs.items()},
            "results": report.rows, "notes": report.notes, "errors": report.errors,
        }
        args.json.write_text(json.dumps(payload, indent=2, default=str))
        print(f"wrote {args.json}")
    return 1 if report.errors else 0


if __name__ == "__main__":
    raise SystemExit(main())
