"""Timing the way the benchmarks and the demo report it: CUDA events around each
launch, the L2 flushed by a large fill before it, the median of many launches."""

from __future__ import annotations

import statistics
from typing import Any, Callable

FLUSH_BYTES = 512 << 20  # several times the H200's 60 MB L2


class Timer:
    """Median of CUDA-event times, with the L2 flushed by a large fill before each launch."""

    def __init__(self, cp: Any, flush_bytes: int | None = None) -> None:
        self.cp = cp
        self.flush = cp.empty((FLUSH_BYTES if flush_bytes is None else flush_bytes) // 4, dtype=cp.int32)
        self.start = cp.cuda.Event()
        self.end = cp.cuda.Event()

    def median_us(self, fn: Callable[[], Any], repeat: int, warmup: int = 3) -> float:
        for _ in range(warmup):
            fn()
        times = []
        for i in range(repeat):
            self.flush.fill(i)
            self.start.record()
            fn()
            self.end.record()
            self.end.synchronize()
            times.append(self.cp.cuda.get_elapsed_time(self.start, self.end) * 1000.0)
        return statistics.median(times)
