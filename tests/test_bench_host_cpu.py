"""scripts/bench_host.py on the CPU: its timing helper and its exit without a GPU."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "bench_host.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_host_under_test", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


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
    import builtins

    real_import = builtins.__import__

    def no_cupy(name, *args, **kwargs):
        if name == "cupy":
            raise ImportError("No module named 'cupy'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_cupy)
    assert bench.main([]) == 0
    assert "needs CuPy and a CUDA device" in capsys.readouterr().out
