"""Host (Python) time of one warmed-up ``fused_moe`` call, on the CPU.

The native entry points are no-ops (a stub library that answers 0), device
arrays are ``__cuda_array_interface__`` fakes, and the modules are patched as
the CPU tests patch them, so what is timed is the Python path alone: argument
reading, every rule, scratch lookup and the five ctypes-shaped calls. Layers:
Qwen3-30B-A3B-like (INT4 u4b8, E=128, H=2048, I=768, top_k=8) and
GPT-OSS-20B-like (MXFP4, E=32, H=I=2880, top_k=4), decode (M=1).

    python -m tests.bench_fused_moe_host [--calls 1000]

Each case reports the median of ``--calls`` timed calls after a warm-up, with
the same input arrays every call and with fresh ones (other pointers) every
call.
"""

from __future__ import annotations

import argparse
import importlib
import statistics
import time

import pytest

import ferrum_ffi as ff
from ferrum_ffi import _devices, _scratch, moe, moe_ops

from . import mm_fakes
from .mm_fakes import FakeCAI, bf16_cai
from .moe_host_kernels import HostFlat

layer = importlib.import_module("ferrum_ffi.moe_layer")


class StubLibrary(mm_fakes.FakeLibrary):
    """Every native entry point answers success at once."""

    def __getattr__(self, name):
        if not name.startswith("ferrum_"):
            raise AttributeError(name)
        return lambda *args: 0


def install(patch: pytest.MonkeyPatch) -> StubLibrary:
    lib = mm_fakes.install_library(patch, StubLibrary(sms=132))
    for module in (moe, moe_ops, _scratch, _devices, layer):
        patch.setattr(module, "library", lambda: lib)
    for module in (moe_ops, _scratch, layer):
        patch.setattr(module, "allocate", lambda like, view, shape, dtype, device, stream=None:
                      HostFlat.empty(shape, dtype))
    for module in (moe, moe_ops, layer):
        patch.setattr(module, "device_of", lambda obj, view: 0)
    patch.setattr(_scratch, "_cache", {})
    patch.setattr(_scratch, "_arrays", {})
    return lib


def device_weight(kind: str, experts: int, n: int, k: int) -> ff.MarlinMoeWeight:
    """A device-side weight of fake buffers (the stub kernels never read them)."""
    words = 4 * n if kind == "fe4m3fn" else 2 * n
    group = 32 if kind == "mxfp4" else 128
    return ff.MarlinMoeWeight(
        kind=kind, num_experts=experts, n=n, k=k, logical_k=k, group_size=group,
        qweight=FakeCAI((experts, k // 16, words), "<i4"),
        scales=FakeCAI((experts, k // group, n), "|u1" if kind == "mxfp4" else "<f2"),
        bias=bf16_cai((experts, n)) if kind == "mxfp4" else None,
    )


CASES = {
    "qwen3-30b-a3b u4b8": dict(kind="u4b8", experts=128, hidden=2048, inter=768, top_k=8, activation="silu"),
    "gpt-oss-20b mxfp4": dict(kind="mxfp4", experts=32, hidden=2880, inter=2880, top_k=4,
                              activation="gpt_oss_swiglu"),
}


def inputs(case: dict, m: int) -> dict:
    mx = case["kind"] == "mxfp4"
    shape = (m, case["hidden"])
    return dict(
        hidden=bf16_cai(shape) if mx else FakeCAI(shape, "<f2"),
        topk_weights=FakeCAI((m, case["top_k"]), "<f4"),
        topk_ids=FakeCAI((m, case["top_k"]), "<i4"),
        out=bf16_cai(shape) if mx else FakeCAI(shape, "<f2"),
    )


def median_us(call, arguments: list[dict], calls: int) -> float:
    for args in arguments[:50]:
        call(args)
    times = []
    for i in range(calls):
        args = arguments[i % len(arguments)]
        start = time.perf_counter_ns()
        call(args)
        times.append(time.perf_counter_ns() - start)
    return statistics.median(times) / 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--m", type=int, default=1)
    options = parser.parse_args()
    with pytest.MonkeyPatch.context() as patch:
        install(patch)
        for name, case in CASES.items():
            w13 = device_weight(case["kind"], case["experts"], 2 * case["inter"], case["hidden"])
            w2 = device_weight(case["kind"], case["experts"], case["hidden"], case["inter"])

            def call(args: dict) -> None:
                ff.fused_moe(w13=w13, w2=w2, activation=case["activation"], stream=7, **args)

            same = [inputs(case, options.m)]
            fresh = [inputs(case, options.m) for _ in range(options.calls)]
            print(f"{name}, M={options.m}: fused_moe host time per call, median of {options.calls}: "
                  f"{median_us(call, same, options.calls):.1f} us (same arrays), "
                  f"{median_us(call, fresh, options.calls):.1f} us (fresh arrays)")


if __name__ == "__main__":
    main()
