#!/usr/bin/env python3
"""W4A16 Marlin GEMM against cuBLAS FP16 and against the read roofline.

For each (k, n) and m, in the same run and the same way (CUDA events, L2
flushed before every timed launch, median of many launches):
  * ``marlin``  — ferrum_ffi.marlin_gemm (workspace zeroing excluded: it is a
                  separate memset that graph users skip);
  * ``cublas``  — CuPy's fp16 matmul of the same shapes;
  * ``read``    — a plain kernel that streams the weight + scale bytes with
                  16-byte loads: the practical limit of a memory-bound GEMM.
With ``--types`` the general GEMM (``ferrum_ffi.linear``) is measured instead,
per activation and weight type (e.g. ``bf16-u4``, ``f16-fe4m3fn``; ``all`` for
every one), against cuBLAS of the same activation type (CuPy fp16; PyTorch for
bf16) and the read roofline of that type's weight + scale bytes; ``w4a16`` among
them adds the W4A16 kernel, and every row then carries its time over W4A16's
on the same shape and m (``vs_w4a16``: the zero-point types' target).
Prints a table (speed-up over cuBLAS, fraction of the read roofline) and writes
JSON. Usage: python scripts/bench.py [--quick] [--types all] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np

SHAPES = ((4096, 4096), (4096, 14336), (14336, 4096), (8192, 28672), (28672, 8192))
M_VALUES = (1, 16, 64, 256)

_READ_KERNEL = r"""
extern "C" __global__ void stream_read(const int4* __restrict__ p, long long n, int* sink) {
  int acc = 0;
  long long stride = (long long)gridDim.x * blockDim.x;
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += 4 * stride) {
    int4 v0 = p[i];
    int4 v1 = i + stride < n ? p[i + stride] : make_int4(0, 0, 0, 0);
    int4 v2 = i + 2 * stride < n ? p[i + 2 * stride] : make_int4(0, 0, 0, 0);
    int4 v3 = i + 3 * stride < n ? p[i + 3 * stride] : make_int4(0, 0, 0, 0);
    acc ^= v0.x ^ v0.y ^ v0.z ^ v0.w ^ v1.x ^ v1.y ^ v1.z ^ v1.w;
    acc ^= v2.x ^ v2.y ^ v2.z ^ v2.w ^ v3.x ^ v3.y ^ v3.z ^ v3.w;
  }
  if (acc == 0x7fffffff) *sink = acc;  // keeps the loads alive
}
"""


def bench_shape(cp, ff, timer, k: int, n: int, m_values, repeat: int, read_kernel, sms: int,
                tile: tuple[int, int] = (-1, -1)):
    from ferrum_ffi.formats import marlin_pack_int4, marlin_permute_scales

    rng = np.random.default_rng(k * 7 + n)
    codes = rng.integers(0, 16, size=(k, n), dtype=np.uint8)
    scales = rng.uniform(0.002, 0.02, size=(k // 128, n)).astype(np.float16)
    weight = ff.MarlinWeight.from_marlin(marlin_pack_int4(codes), marlin_permute_scales(scales, 128), k, 128)
    del codes
    w16 = cp.asarray(rng.standard_normal((k, n), dtype=np.float32) * 0.02).astype(cp.float16)
    weight_bytes = weight.qweight.nbytes + weight.scales.nbytes
    sink = cp.zeros(1, dtype=cp.int32)
    n16 = weight.qweight.nbytes // 16 + weight.scales.nbytes // 16
    # One buffer of the same byte count, so the read is a single stream.
    read_buf = cp.empty(n16 * 4, dtype=cp.int32)
    read_buf.fill(1)
    grid = sms * 8

    def read():
        read_kernel((grid,), (256,), (read_buf, np.int64(n16), sink))

    read_us = timer.median_us(read, repeat)
    rows = []
    for m in m_values:
        a = cp.asarray(rng.standard_normal((m, k)).astype(np.float16))
        out = cp.empty((m, n), dtype=cp.float16)
        ref = cp.empty((m, n), dtype=cp.float16)
        marlin_us = timer.median_us(
            lambda: ff.marlin_gemm(a, weight, out=out, thread_k=tile[0], thread_n=tile[1]), repeat)
        cublas_us = timer.median_us(lambda: cp.matmul(a, w16, out=ref), repeat)
        rows.append(
            {
                "k": k,
                "n": n,
                "m": m,
                "marlin_us": marlin_us,
                "cublas_us": cublas_us,
                "read_us": read_us,
                "weight_bytes": weight_bytes,
                "speedup_vs_cublas": cublas_us / marlin_us,
                "fraction_of_read_roofline": read_us / marlin_us,
                "marlin_tb_s": weight_bytes / marlin_us / 1e6,
            }
        )
    return rows


W4A16 = "w4a16"  # --types name of the W4A16 kernel (marlin_gemm), the zero-point types' yardstick
# activation-weight name -> (activation dtype, weight type name, group size)
TYPES = {
    "f16-u4b8": ("float16", "U4B8", 128),
    "bf16-u4b8": ("bfloat16", "U4B8", 128),
    "f16-u4": ("float16", "U4", 128),
    "bf16-u4": ("bfloat16", "U4", 128),
    "f16-u8b128": ("float16", "U8B128", -1),
    "bf16-u8b128": ("bfloat16", "U8B128", -1),
    "f16-fe4m3fn": ("float16", "FE4M3FN", -1),
    "bf16-fe4m3fn": ("bfloat16", "FE4M3FN", -1),
    # 8-bit weights in groups of 128
    "f16-u8b128-g128": ("float16", "U8B128", 128),
    "f16-fe4m3fn-g128": ("float16", "FE4M3FN", 128),
    # channelwise INT4 (one scale per column)
    "f16-u4b8-ch": ("float16", "U4B8", -1),
    "bf16-u4-ch": ("bfloat16", "U4", -1),
    # act-order (desc_act, K not sharded): the same weight behind a gather of x
    "f16-u4b8-act": ("float16", "U4B8", 128, True),
    "bf16-u4b8-act": ("bfloat16", "U4B8", 128, True),
}


def random_prepared(ff, rng, k: int, n: int, dtype_name: str, b_type_name: str, group: int,
                    act_order: bool = False):
    """A weight of random codes straight in the Marlin layout (quantising a
    28672 x 8192 matrix on the host would dominate the run); ``act_order``
    adds a random row permutation (the gather of x) with the sorted g_idx."""
    import ml_dtypes

    from ferrum_ffi.formats import PreparedLinear

    b_type = ff.WeightType[b_type_name]
    bits = 4 if b_type_name in ("U4", "U4B8") else 8
    words = rng.integers(0, 2**32, size=(k // 16, n * bits // 2), dtype=np.uint64).astype(np.uint32)
    if b_type_name == "FE4M3FN":
        words &= 0x3C3C3C3C  # finite E4M3 bytes of moderate size
    groups = 1 if group == -1 else k // group
    dtype = np.dtype(ml_dtypes.bfloat16) if dtype_name == "bfloat16" else np.dtype(np.float16)
    scales = rng.uniform(0.002, 0.02, size=(groups, n)).astype(dtype)
    zeros = None
    if b_type_name == "U4":
        zeros = rng.integers(0, 2**32, size=(groups, n // 8), dtype=np.uint64).astype(np.uint32).view(np.int32)
    g_idx = perm = None
    if act_order:
        g_idx = (np.arange(k) // group).astype(np.int32)
        perm = rng.permutation(k).astype(np.int32)
    return PreparedLinear(b=words.view(np.int32), scales=scales, k=k, n=n, group_size=group, b_type=b_type,
                          dtype=dtype, zero_points=zeros, g_idx=g_idx, perm=perm)


def optional_torch():
    """PyTorch for the cuBLAS BF16 baseline, or None (bf16 types then run without it)."""
    try:
        import torch
    except ImportError:
        torch = None
    if torch is None or not torch.cuda.is_available():
        print("bench: PyTorch with CUDA not found; cuBLAS BF16 is not measured", file=sys.stderr)
        return None
    return torch


def bench_types(cp, ff, timer, k: int, n: int, m_values, repeat: int, read_kernel, sms: int, types,
                tile: tuple[int, int] = (-1, -1)):
    rng = np.random.default_rng(k * 7 + n)
    sink = cp.zeros(1, dtype=cp.int32)
    w16 = cp.asarray(rng.standard_normal((k, n), dtype=np.float32) * 0.02).astype(cp.float16)
    torch = False  # not looked up yet
    rows = []
    read_cache: dict[int, float] = {}
    for name in types:
        dtype_name, b_type_name, group, *act_order = TYPES[name]
        weight = ff.MarlinLinearWeight.from_prepared(
            random_prepared(ff, rng, k, n, dtype_name, b_type_name, group, bool(act_order)))
        nbytes = weight.b.nbytes + weight.scales.nbytes + (0 if weight.zero_points is None else weight.zero_points.nbytes)
        if nbytes not in read_cache:
            n16 = nbytes // 16
            buf = cp.ones(n16 * 4, dtype=cp.int32)
            read_cache[nbytes] = timer.median_us(
                lambda: read_kernel((sms * 8,), (256,), (buf, np.int64(n16), sink)), repeat)
            del buf
        read_us = read_cache[nbytes]
        bf16 = dtype_name == "bfloat16"
        if bf16 and torch is False:
            torch = optional_torch()
        for m in m_values:
            a16 = cp.asarray(rng.standard_normal((m, k)).astype(np.float16))
            if bf16:
                # bf16 bits of the fp16 values (truncated: timing input only)
                x = ff.bfloat16_view((a16.astype(cp.float32).view(cp.uint32) >> 16).astype(cp.uint16))
                out = ff.bfloat16_view(cp.empty((m, n), dtype=cp.uint16))
                cublas_us = float("nan")  # reported as not measured without PyTorch
                if torch is not None:
                    ta = torch.as_tensor(a16, device="cuda").to(torch.bfloat16)
                    tw = torch.as_tensor(w16, device="cuda").to(torch.bfloat16)
                    tout = torch.empty((m, n), dtype=torch.bfloat16, device="cuda")
                    cublas_us = timer.median_us(lambda: torch.matmul(ta, tw, out=tout), repeat)
            else:
                x = a16
                out = cp.empty((m, n), dtype=cp.float16)
                ref = cp.empty((m, n), dtype=cp.float16)
                cublas_us = timer.median_us(lambda: cp.matmul(a16, w16, out=ref), repeat)
            us = timer.median_us(lambda: ff.linear(x, weight, out=out, thread_k=tile[0], thread_n=tile[1]), repeat)
            rows.append({"type": name, "k": k, "n": n, "m": m, "marlin_us": us, "cublas_us": cublas_us,
                         "read_us": read_us, "weight_bytes": nbytes, "speedup_vs_cublas": cublas_us / us,
                         "fraction_of_read_roofline": read_us / us, "marlin_tb_s": nbytes / us / 1e6})
        del weight
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="two shapes, fewer repeats")
    parser.add_argument("--repeat", type=int, default=30)
    parser.add_argument("--m", type=int, nargs="*", default=list(M_VALUES))
    parser.add_argument("--json", type=Path, default=Path("bench_w4a16.json"))
    parser.add_argument("--shapes", type=str, default="", help="k x n list, e.g. 8192x28672,4096x4096")
    parser.add_argument("--types", type=str, default="",
                        help="general GEMM types, comma-separated (" + ", ".join((W4A16, *TYPES)) + ") or 'all'")
    parser.add_argument("--tile", type=int, nargs=2, default=(-1, -1), metavar=("THREAD_K", "THREAD_N"),
                        help="force a tile (for tuning); default automatic")
    args = parser.parse_args(argv)
    try:
        import cupy as cp
    except ImportError:
        print("bench: CuPy is not installed; nothing to measure", file=sys.stderr)
        return 1
    import ferrum_ffi as ff
    from ferrum_ffi.timing import Timer

    if ff.device_count() == 0:
        print("bench: no CUDA device", file=sys.stderr)
        return 1
    # Workspace zeroing is a separate memset; time the kernel alone.
    os.environ["FERRUM_MARLIN_SKIP_WS_ZERO"] = "1"
    ff.profile.runtime_config.cache_clear()
    shapes = SHAPES[:1] + SHAPES[3:4] if args.quick else SHAPES
    if args.shapes:
        shapes = tuple(tuple(int(v) for v in item.split("x")) for item in args.shapes.split(","))
    repeat = max(5, args.repeat // 3) if args.quick else args.repeat
    sms = cp.cuda.runtime.getDeviceProperties(0)["multiProcessorCount"]
    read_kernel = cp.RawKernel(_READ_KERNEL, "stream_read")
    timer = Timer(cp)
    types = [W4A16, *TYPES] if args.types == "all" else [t for t in args.types.split(",") if t]
    with_w4a16 = W4A16 in types
    types = [t for t in types if t != W4A16]
    unknown = [t for t in types if t not in TYPES]
    if unknown:
        print(f"bench: unknown --types {unknown}; choose from {[W4A16, *TYPES]}", file=sys.stderr)
        return 2
    results = []
    for k, n in shapes:
        if with_w4a16 or not types:
            results += bench_shape(cp, ff, timer, k, n, args.m, repeat, read_kernel, sms, tuple(args.tile))
        if types:
            results += bench_types(cp, ff, timer, k, n, args.m, repeat, read_kernel, sms, types, tuple(args.tile))
    w4a16_us = {(r["k"], r["n"], r["m"]): r["marlin_us"] for r in results if "type" not in r}
    if types and w4a16_us:
        for r in results:
            r["vs_w4a16"] = r["marlin_us"] / w4a16_us[(r["k"], r["n"], r["m"])]
    args.json.write_text(json.dumps({"device": cp.cuda.runtime.getDeviceProperties(0)["name"].decode(),
                                     "results": results}, indent=2))
    print(f"{'type':>12} {'k x n':>13} {'m':>5} {'marlin us':>10} {'cublas us':>10} {'read us':>8} "
          f"{'x cuBLAS':>9} {'of read':>8} {'TB/s':>6} {'/ W4A16':>8}")
    for r in results:
        print(f"{r.get('type', 'f16-w4a16'):>12} {r['k']:>6}x{r['n']:<6} {r['m']:>5} {r['marlin_us']:>10.1f} {r['cublas_us']:>10.1f} "
              f"{r['read_us']:>8.1f} {r['speedup_vs_cublas']:>8.2f}x {r['fraction_of_read_roofline']:>7.0%} "
              f"{r['marlin_tb_s']:>6.2f} {r.get('vs_w4a16', float('nan')):>8.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
