"""scripts/bench_host.py on the CPU: its timing helper and its exit without a GPU."""

from __future__ import annotations

import sys

import pytest

from .script_modules import script_module


@pytest.fixture(scope="module")
def bench():
    with script_module("bench_host.py") as module:
        yield module


class FakeCupy:
    """Just what ``per_call_us`` touches: a device to synchronise."""

    class cuda:  # noqa: N801 - mirrors cupy.cuda
        class Device:
            def synchronize(self) -> None:
                pass


def test_per_call_time_counts_every_call(bench):
    calls = []
    us = bench.per_call_us(FakeCupy, lambda: calls.append(1), calls=50, rounds=3)
    assert len(calls) == 20 + 50 * 3  # warm-up, then the timed rounds
    assert us >= 0


def test_without_a_gpu_it_says_so(bench, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "cupy", None)  # import cupy -> ImportError
    assert bench.main([]) == 0
    assert "needs CuPy and a CUDA device" in capsys.readouterr().out
