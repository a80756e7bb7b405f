"""The pure parts of scripts/bench_kshard.py on the CPU: its cases, the shard
tensors it builds (which both K-shard layouts must accept), and its exit
without a GPU."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from ferrum_ffi.formats import prepare_gptq

from .script_modules import script_module


@pytest.fixture(scope="module")
def bench():
    with script_module("bench_kshard.py") as module:
        yield module


def test_cases_parse_and_refuse_shards_of_partial_words(bench):
    assert bench.parse_cases("28672x8192:2,4096x256") == [(28672, 8192, 2), (4096, 256, 1)]
    for bad in ("1000x256:2", "1536x256:8", "2048x256:0", "2048x192:2"):
        with pytest.raises(ValueError, match="TP must be >= 1, K a multiple of 128\\*TP"):
            bench.parse_cases(bad)


@pytest.mark.parametrize("layout", ["row_groups", "padded"])
def test_shard_tensors_are_a_desc_act_shard_both_layouts_take(bench, layout):
    t = bench.shard_tensors(np.random.default_rng(0), 2048, 256, 4)
    assert t["qweight"].shape == (512 // 8, 256) and t["g_idx"].shape == (512,)
    assert t["scales"].shape == (16, 256) and t["g_idx"].max() < 16
    p = prepare_gptq(t["qweight"], t["scales"], t["qzeros"], t["g_idx"], group_size=128, k_full=False,
                     shard_layout=layout, keep_reference=False)
    assert p.in_features == 512 and p.k_full == (layout == "padded")


def test_without_a_gpu_it_says_so(bench, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "cupy", None)
    assert bench.main(["--m", "1"]) == 1
    assert "needs a CUDA GPU" in capsys.readouterr().err
