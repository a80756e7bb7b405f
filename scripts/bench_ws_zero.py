#!/usr/bin/env python3
"""GPU time of a ``linear`` call inside a CUDA graph, with and without a lock-workspace
memset before it: what the memset node that ``linear`` issued before every call until
session 42 cost (it now zeroes the workspace only when allocating it and after a failed
launch; NOTES). 20 calls per graph, L2 flushed before each replay, CUDA events, median
of 25 replays, both variants twice in alternation.

Usage: python scripts/bench_ws_zero.py  (needs CuPy and a CUDA device)
"""
import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def graph_time(cp, call, s, reps=25, per=20) -> float:
    """µs per call of ``call(s)`` captured ``per`` times in one graph."""
    call(s)
    s.synchronize()
    s.begin_capture()
    for _ in range(per):
        call(s)
    g = s.end_capture()
    g.upload(s)
    g.launch(s)
    s.synchronize()
    flush = cp.empty(256 * 1024 * 1024 // 4, dtype=cp.float32)
    ts = []
    for _ in range(reps):
        flush.fill(0)
        e0, e1 = cp.cuda.Event(), cp.cuda.Event()
        e0.record(s)
        g.launch(s)
        e1.record(s)
        e1.synchronize()
        ts.append(cp.cuda.get_elapsed_time(e0, e1) * 1000 / per)
    return statistics.median(ts)


def main() -> int:
    try:
        import cupy as cp

        cp.cuda.runtime.getDeviceCount()
    except Exception as exc:  # noqa: BLE001 - any missing piece means no GPU run
        print(f"bench_ws_zero: needs CuPy and a CUDA device ({exc})")
        return 0
    import ferrum_ffi as ff
    from ferrum_ffi import _scratch
    from ferrum_ffi._native import library

    rng = np.random.default_rng(0)
    lib = library()
    for (k, n) in ((4096, 4096), (4096, 14336), (14336, 4096), (8192, 28672)):
        w = ff.MarlinLinearWeight.from_float(rng.standard_normal((k, n)).astype(np.float32) * 0.02, bits=4,
                                             group_size=128, sym=True, dtype=np.float16)
        for m in (1, 16):
            x = cp.asarray(rng.standard_normal((m, k)).astype(np.float16))
            out = cp.empty((m, n), cp.float16)
            s = cp.cuda.Stream(non_blocking=True)
            with s:  # the arrays' interface then names s: no producer waits inside the capture
                ff.linear(x, w, out=out, stream=s)
                s.synchronize()
                ws = _scratch._cache[(cp.cuda.Device().id, s.ptr)].workspace

                def plain(st, x=x, w=w, out=out):
                    ff.linear(x, w, out=out, stream=st)

                def zeroed(st, ws=ws, plain=plain):
                    lib.check("memset", lib.ferrum_marlin_memset_async(ws.ptr, 0, ws.nbytes, st.ptr))
                    plain(st)

                r = [graph_time(cp, f, s) for f in (zeroed, plain, zeroed, plain)]
            print(f"{k}x{n} m={m}: us per call in a graph, memset+linear {r[0]:.2f} / {r[2]:.2f}, linear {r[1]:.2f} / {r[3]:.2f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
