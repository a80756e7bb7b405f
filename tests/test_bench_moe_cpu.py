"""The pure parts of scripts/bench_moe.py on the CPU: the layers' shapes, the
bytes an expert's launch reads (against real MarlinMoeWeight buffers), the
routing and what it touches, the block-size rule, the fused-layer call
planner, the table, and the command line up to the point where it needs a GPU."""

from __future__ import annotations

import inspect
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest

from ferrum_ffi.moe_weights import MarlinMoeWeight

from .script_modules import SCRIPTS, script_module

SCRIPT = SCRIPTS / "bench_moe.py"


@pytest.fixture(scope="module")
def bench():
    with script_module("bench_moe.py") as module:
        yield module


def test_the_layers_are_the_models_shapes(bench):
    qwen, gptoss = bench.LAYERS["qwen"], bench.LAYERS["gptoss"]
    assert (qwen.hidden, qwen.intermediate, qwen.experts, qwen.top_k, qwen.kind, qwen.group_size) == (
        2048, 768, 128, 8, "u4b8", 128)
    assert [(g.name, g.n, g.k) for g in qwen.gemms] == [("gate_up", 1536, 2048), ("down", 2048, 768)]
    assert (gptoss.hidden, gptoss.experts, gptoss.top_k, gptoss.kind, gptoss.activation) == (2880, 32, 4, "mxfp4",
                                                                                            "bf16")
    assert [(g.name, g.n, g.logical_k) for g in gptoss.gemms] == [("gate_up", 5760, 2880), ("down", 2880, 2880)]


def test_physical_k_of_the_mxfp4_projections(bench):
    gptoss = bench.LAYERS["gptoss"]
    padded = bench.with_physical_k(gptoss, lambda n, k: -(-k // 128) * 128, None)
    assert [(g.k, g.logical_k) for g in padded.gemms] == [(2944, 2880), (2944, 2880)]
    original = bench.with_physical_k(gptoss, lambda n, k: k, 2944)
    assert [g.k for g in original.gemms] == [2880, 2944]
    assert bench.with_physical_k(bench.LAYERS["qwen"], lambda n, k: 1 / 0, 2944) is bench.LAYERS["qwen"]
    with pytest.raises(ValueError, match="multiple of 64"):
        bench.with_physical_k(gptoss, lambda n, k: k, 2900)


def test_expert_bytes_by_hand(bench):
    assert bench.expert_bytes("u4b8", 1536, 2048, 128) == 2048 * 1536 // 2 + 16 * 1536 * 2
    assert bench.expert_bytes("mxfp4", 2880, 2944, 32) == 2944 * 2880 // 2 + 92 * 2880 + 2 * 2880
    with pytest.raises(ValueError, match="unknown weight kind"):
        bench.expert_bytes("int3", 64, 64, -1)


@pytest.mark.parametrize("kind, group_size", [("u4b8", 128), ("u4b8", -1), ("u4", 64), ("fe4m3fn", 128),
                                              ("mxfp4", 32)])
def test_expert_bytes_are_one_experts_buffers(bench, kind, group_size):
    experts, n, k = 3, 128, 256
    w = MarlinMoeWeight.from_float(np.random.default_rng(0).standard_normal((experts, n, k)), kind, group_size,
                                   keep_reference=False)
    buffers = [w.qweight, w.scales, w.zero_points, w.bias if kind == "mxfp4" else None]
    per_expert = sum(b.nbytes for b in buffers if b is not None) // experts
    assert bench.expert_bytes(kind, n, w.k, group_size) == per_expert


def test_route_is_uniform_distinct_and_reproducible(bench):
    ids, weights = bench.route(4096, 8, 128, seed=3)
    assert ids.shape == weights.shape == (4096, 8) and ids.dtype == np.int32 and weights.dtype == np.float32
    assert all(len(set(row)) == 8 for row in ids)
    np.testing.assert_allclose(weights.sum(axis=1), 1.0, rtol=1e-6)
    counts = np.bincount(ids.reshape(-1), minlength=128)
    assert counts.min() > 0.8 * counts.mean() and counts.max() < 1.2 * counts.mean()  # 256 expected each
    again, _ = bench.route(4096, 8, 128, seed=3)
    np.testing.assert_array_equal(ids, again)
    assert not np.array_equal(ids[:16], bench.route(16, 8, 128, seed=4)[0])
    with pytest.raises(ValueError, match="top_k"):
        bench.route(4, 33, 32, seed=0)


def test_touched_experts_bytes_and_rows(bench):
    ids = np.array([[3, 1], [1, 7], [7, 3], [0, 3]], dtype=np.int32)
    np.testing.assert_array_equal(bench.touched_experts(ids), [0, 1, 3, 7])
    assert bench.touched_bytes(ids, "u4b8", 256, 512, 128) == 4 * bench.expert_bytes("u4b8", 256, 512, 128)
    rows = bench.rows_by_expert(ids)
    assert list(rows) == [0, 1, 3, 7]
    np.testing.assert_array_equal(rows[3], [0, 5, 7])  # t = token * top_k + slot
    np.testing.assert_array_equal(rows[3] // 2, [0, 2, 3])  # their tokens
    assert sorted(np.concatenate(list(rows.values()))) == list(range(8))


def test_parse_layers(bench):
    assert bench.parse_layers("qwen,gptoss") == ["qwen", "gptoss"]
    assert bench.parse_layers("gptoss, qwen,gptoss") == ["gptoss", "qwen"]
    with pytest.raises(ValueError, match="unknown"):
        bench.parse_layers("qwen,llama")
    with pytest.raises(ValueError):
        bench.parse_layers(" , ")


def test_spin_outlasts_the_host(bench):
    assert bench.spin_ns_for(10.0) == 200_000
    assert bench.spin_ns_for(1000.0) == 2_100_000
    assert bench.spin_ns_for(1e9) == 100_000_000


# ---- the fused-layer call planner ------------------------------------------------------------------

VALUES = {"x": "X", "w13": "W13", "w2": "W2", "topk_weights": "TW", "topk_ids": "TI", "router_logits": "RL",
          "top_k": 4, "fp32_reduce": False}


def test_plan_ferrum_style_signature(bench):
    def fused_moe(hidden, w13, w2, topk_weights, topk_ids, *, activation="silu", block_size=None, fp32_reduce=False,
                  out=None):
        pass

    args, kwargs = bench.plan_fused_call(inspect.signature(fused_moe), VALUES)
    assert args == [] and kwargs == {"hidden": "X", "w13": "W13", "w2": "W2", "topk_weights": "TW",
                                     "topk_ids": "TI", "fp32_reduce": False}
    args, kwargs = bench.plan_fused_call(inspect.signature(fused_moe), {**VALUES, "activation": "gpt_oss_swiglu"})
    assert kwargs["activation"] == "gpt_oss_swiglu"


def test_plan_router_logits_and_positional_only(bench):
    def layer(x, w1, w2, /, gating_output, topk, renormalize=True):
        pass

    args, kwargs = bench.plan_fused_call(inspect.signature(layer), VALUES)
    assert args == ["X", "W13", "W2"] and kwargs == {"gating_output": "RL", "topk": 4}


def test_plan_refuses_an_unknown_required_parameter(bench):
    def layer(hidden_states, w13, w2, topk_weights, topk_ids, quant_config):
        pass

    with pytest.raises(ValueError, match="quant_config"):
        bench.plan_fused_call(inspect.signature(layer), VALUES)


def test_fused_layer_call_tries_the_gpt_oss_activation_names(bench):
    seen = []

    def fused_moe(hidden, w13, w2, topk_weights, topk_ids, *, activation="silu"):
        seen.append(activation)
        if activation != "swiglu_oai":
            raise ValueError(f"activation={activation!r} unknown")

    fake = SimpleNamespace(cp=SimpleNamespace(cuda=SimpleNamespace(Device=lambda: SimpleNamespace(
        synchronize=lambda: None))), ff=SimpleNamespace())
    call, described = bench.fused_layer_call(fake, fused_moe, "fused_moe", bench.LAYERS["gptoss"], VALUES)
    assert seen == ["gpt_oss_swiglu", "swigluoai", "swiglu_oai"]
    assert "activation='swiglu_oai'" in described
    call()
    assert seen[-1] == "swiglu_oai"
    with pytest.raises(RuntimeError, match="no call of fused_moe"):
        bench.fused_layer_call(fake, fused_moe, "fused_moe", bench.LAYERS["qwen"], VALUES)  # silu names only


# ---- table and command line ----------------------------------------------------------------------------


def test_table(bench):
    rows = [
        {"layer": "qwen", "gemm": "gate_up", "m": 1, "experts_touched": 8, "block": 8, "touched_bytes": 12_976_128,
         "marlin_us": 10.0, "host_us": 300.0, "marlin_tb_s": 1.3, "read_us": 8.0, "fraction_of_read": 0.8,
         "cublas_us": 25.0, "speedup_vs_cublas": 2.5},
        {"layer": "gptoss", "gemm": "down", "m": 4, "experts_touched": 16, "block": 8, "touched_bytes": 1e6,
         "marlin_us": 9.0, "host_us": 250.0, "marlin_tb_s": 0.1, "read_us": 5.0, "fraction_of_read": 0.55},
        {"layer": "gptoss", "gemm": "layer(fused_moe)", "m": 4, "error": "RuntimeError: " + "x" * 300},
    ]
    lines = bench.format_table(rows).splitlines()
    assert "x cuBLAS" in lines[0] and len(lines) == 5
    assert "12.98" in lines[2] and "80%" in lines[2] and "2.50x" in lines[2]
    assert lines[3].rstrip().endswith("-") and "55%" in lines[3]
    assert "ERROR: RuntimeError" in lines[4] and lines[4].endswith("...") and len(lines[4]) < 160


def test_command_line_errors_come_before_any_device(bench, monkeypatch, capsys):
    assert bench.main(["--layers", "llama"]) == 2
    assert "unknown" in capsys.readouterr().err
    assert bench.main(["--m", "0"]) == 2
    assert bench.main(["--gptoss-down-k", "2900"]) == 2
    assert bench.main(["--json", "/no/such/folder/out.json"]) == 2
    monkeypatch.setitem(sys.modules, "cupy", None)  # import cupy -> ImportError
    assert bench.main(["--layers", "qwen"]) == 1
    assert "CuPy is not installed" in capsys.readouterr().err


def test_help_runs_as_a_script():
    result = subprocess.run([sys.executable, str(SCRIPT), "--help"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    for flag in ("--layers", "--m", "--repeat", "--json"):
        assert flag in result.stdout
