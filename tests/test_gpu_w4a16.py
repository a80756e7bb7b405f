"""W4A16 Marlin GEMM on the GPU against float64 references of the dequantized weight."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import ferrum_ffi as ff
from ferrum_ffi.formats import marlin_pack_int4, marlin_permute_scales

from .gpu_reference import random_int4_layer, reference_gemm, relative_l2

pytestmark = pytest.mark.gpu

M_VALUES = (1, 2, 3, 7, 8, 15, 16, 17, 31, 33, 64, 127, 128, 255, 256, 1024)
TOLERANCE = 2e-3  # fp16 output and fp16 partial sums; typical error is ~4e-4


def make_layer(cp, k, n, group_size, seed=0, experts=1):
    rng = np.random.default_rng(seed)
    layers = [random_int4_layer(rng, k, n, group_size) for _ in range(experts)]
    weight = ff.MarlinWeight.from_marlin(
        [marlin_pack_int4(c) for c, _ in layers],
        [marlin_permute_scales(s, group_size) for _, s in layers],
        k,
        group_size,
    )
    return weight, layers


def activations(cp, m, k, seed=1):
    rng = np.random.default_rng(seed)
    return cp.asarray(rng.standard_normal((m, k)).astype(np.float16))


def poisoned(cp, shape):
    return cp.full(shape, cp.nan, dtype=cp.float16)


@pytest.fixture(scope="module")
def layer_4096(cp):
    return {g: make_layer(cp, 4096, 4096, g, seed=10 + g) for g in (128, -1)}


@pytest.mark.parametrize("group_size", [128, -1])
@pytest.mark.parametrize("m", M_VALUES)
def test_gemm_4096_square(cp, layer_4096, m, group_size):
    weight, [(codes, scales)] = layer_4096[group_size]
    a = activations(cp, m, 4096, seed=m)
    out = ff.marlin_gemm(a, weight, out=poisoned(cp, (m, 4096)))
    ref = reference_gemm(cp, a, codes, scales, group_size)
    assert relative_l2(cp, out, ref) < TOLERANCE


@pytest.mark.parametrize(
    "k,n", [(1024, 192), (2048, 640), (768, 1152), (4096, 14336), (14336, 4096), (256, 64)]
)
@pytest.mark.parametrize("m", [1, 16, 17, 64, 65, 255, 1024])
def test_gemm_shapes(cp, k, n, m):
    group_size = 128
    weight, [(codes, scales)] = make_layer(cp, k, n, group_size, seed=k + n)
    a = activations(cp, m, k, seed=m)
    out = ff.marlin_gemm(a, weight, out=poisoned(cp, (m, n)))
    assert relative_l2(cp, out, reference_gemm(cp, a, codes, scales, group_size)) < TOLERANCE


@pytest.mark.parametrize("m", [1, 16, 100, 1024])
def test_vocabulary_sized_n(cp, m):
    k, n = 1024, 151936  # N % 256 != 0
    weight, [(codes, scales)] = make_layer(cp, k, n, 128, seed=7)
    a = activations(cp, m, k)
    out = ff.marlin_gemm(a, weight, out=poisoned(cp, (m, n)))
    assert relative_l2(cp, out, reference_gemm(cp, a, codes, scales, 128)) < TOLERANCE


@pytest.mark.parametrize("tile", [(128, 128), (64, 256), (128, 64)])
@pytest.mark.parametrize("m", [1, 9, 16, 33, 64, 200])
def test_forced_tiles(cp, layer_4096, tile, m):
    weight, [(codes, scales)] = layer_4096[128]
    a = activations(cp, m, 4096, seed=3 * m)
    out = ff.marlin_gemm(a, weight, thread_k=tile[0], thread_n=tile[1])
    assert relative_l2(cp, out, reference_gemm(cp, a, codes, scales, 128)) < TOLERANCE


@pytest.mark.parametrize("m", [1, 5, 16])
def test_deep_tile_for_small_slabs(cp, layer_4096, m):
    weight, [(codes, scales)] = layer_4096[128]
    a = activations(cp, m, 4096, seed=5 * m)
    out = ff.marlin_gemm(a, weight, thread_k=128, thread_n=256)
    assert relative_l2(cp, out, reference_gemm(cp, a, codes, scales, 128)) < TOLERANCE


def test_deep_tile_rejects_tall_slabs(cp, layer_4096):
    weight, _ = layer_4096[128]
    with pytest.raises(ff.ArgumentError, match="prob_m <= 16|m <= 16"):
        ff.marlin_gemm(activations(cp, 17, 4096), weight, thread_k=128, thread_n=256)


@pytest.mark.parametrize("m", [1, 16])
def test_long_problem_auto_tile(cp, m):
    k, n = 8192, 28672
    weight, [(codes, scales)] = make_layer(cp, k, n, 128, seed=8)
    a = activations(cp, m, k)
    out = ff.marlin_gemm(a, weight, out=poisoned(cp, (m, n)))
    assert relative_l2(cp, out, reference_gemm(cp, a, codes, scales, 128)) < TOLERANCE


@pytest.mark.parametrize("sms", [1, 7, 64])
def test_fewer_sms_longer_stripes(cp, layer_4096, sms):
    weight, [(codes, scales)] = layer_4096[-1]
    a = activations(cp, 48, 4096)
    out = ff.marlin_gemm(a, weight, sms=sms)
    assert relative_l2(cp, out, reference_gemm(cp, a, codes, scales, -1)) < TOLERANCE


def test_from_float_quantises_close_to_the_float_weight(cp):
    rng = np.random.default_rng(5)
    w = rng.standard_normal((2048, 1024)).astype(np.float32)
    weight = ff.MarlinWeight.from_float(w, group_size=128)
    a = activations(cp, 16, 2048)
    out = ff.marlin_gemm(a, weight).astype(cp.float64)
    ref = a.astype(cp.float64) @ cp.asarray(w, dtype=cp.float64)
    # INT4 round-to-nearest: ~10% relative error of the product is expected.
    assert float(cp.linalg.norm(out - ref) / cp.linalg.norm(ref)) < 0.15


def test_from_gptq_matches_gptq_semantics(cp):
    from ferrum_ffi.formats import gptq_pack_int4

    rng = np.random.default_rng(6)
    k, n = 1024, 512
    codes, scales = random_int4_layer(rng, k, n, 128)
    weight = ff.MarlinWeight.from_gptq(gptq_pack_int4(codes), scales, group_size=128)
    a = activations(cp, 5, k)
    out = ff.marlin_gemm(a, weight)
    assert relative_l2(cp, out, reference_gemm(cp, a, codes, scales, 128)) < TOLERANCE


def test_offset_variants_cover_each_expert(cp):
    k, n_e, experts = 1024, 256, 3
    weight, layers = make_layer(cp, k, n_e, 128, seed=21, experts=experts)
    a = activations(cp, 24, k)
    for e, (codes, scales) in enumerate(layers):
        out = ff.marlin_gemm_with_offset(a, weight, expert_offset=e * n_e, expert_n=n_e)
        assert relative_l2(cp, out, reference_gemm(cp, a, codes, scales, 128)) < TOLERANCE
    # strided: rows [4, 4+9) of a into rows [2, 2+9) of a bigger output
    out = poisoned(cp, (16, n_e))
    ff.marlin_gemm_with_offset_strided(a, 4, weight, out, 2, 9, expert_offset=2 * n_e, expert_n=n_e)
    codes, scales = layers[2]
    assert relative_l2(cp, out[2:11], reference_gemm(cp, a[4:13], codes, scales, 128)) < TOLERANCE
    assert bool(cp.isnan(out[:2]).all()) and bool(cp.isnan(out[11:]).all())


def test_offset_out_of_range_is_rejected_before_the_call(cp):
    weight, _ = make_layer(cp, 256, 128, 128, seed=2, experts=2)
    a = activations(cp, 4, 256)
    with pytest.raises(ff.ArgumentError, match="exceeds the stacked n"):
        ff.marlin_gemm_with_offset(a, weight, expert_offset=256, expert_n=128)


def test_non_default_stream_and_workspace_reuse(cp, layer_4096):
    weight, [(codes, scales)] = layer_4096[128]
    stream = cp.cuda.Stream(non_blocking=True)
    outs, inputs = [], []
    with stream:
        for i in range(40):
            a = activations(cp, 1 + (i * 7) % 70, 4096, seed=100 + i)
            inputs.append(a)
            outs.append(ff.marlin_gemm(a, weight, stream=stream))
    stream.synchronize()
    assert int(cp.count_nonzero(weight.workspace)) == 0
    for a, out in zip(inputs[::7], outs[::7]):
        assert relative_l2(cp, out, reference_gemm(cp, a, codes, scales, 128)) < TOLERANCE


def test_locks_stay_in_the_documented_workspace(cp, layer_4096):
    # One slab per launch (max_par = 1): the 256-row tile's columns (m = 200,
    # 300 on Hopper) and the narrower tiles must keep their locks inside
    # max(1, n/128) * max_par entries; a sentinel guards the entries after them.
    weight, [(codes, scales)] = layer_4096[128]
    need = 4096 // 128
    sentinel = 0x12345
    buffer = cp.zeros(need + 64, dtype=cp.int32)
    buffer[need:] = sentinel
    one_slab = dataclasses.replace(weight, workspace=buffer[:need], max_par=1)
    for m in (200, 300, 17, 1):
        a = activations(cp, m, 4096, seed=m)
        out = ff.marlin_gemm(a, one_slab)
        assert relative_l2(cp, out, reference_gemm(cp, a, codes, scales, 128)) < TOLERANCE, m
    assert int(cp.count_nonzero(buffer[:need])) == 0
    assert bool((buffer[need:] == sentinel).all())


class _CaiWrapper:
    """A minimal foreign producer: only __cuda_array_interface__ v3."""

    def __init__(self, array, stream_ptr):
        self._array = array
        iface = dict(array.__cuda_array_interface__)
        iface["stream"] = stream_ptr
        iface["version"] = 3
        self.__cuda_array_interface__ = iface


def test_foreign_cai_producer_with_stream(cp, layer_4096):
    weight, [(codes, scales)] = layer_4096[-1]
    producer = cp.cuda.Stream(non_blocking=True)
    with producer:
        a = activations(cp, 12, 4096)
    out = cp.empty((12, 4096), dtype=cp.float16)
    ff.marlin_gemm(_CaiWrapper(a, producer.ptr), weight, out=_CaiWrapper(out, producer.ptr), stream=0)
    cp.cuda.runtime.deviceSynchronize()
    assert relative_l2(cp, out, reference_gemm(cp, a, codes, scales, -1)) < TOLERANCE


def test_torch_tensors_if_available(cp, layer_4096):
    torch = pytest.importorskip("torch")
    weight, [(codes, scales)] = layer_4096[128]
    a = torch.randn(33, 4096, dtype=torch.float16, device="cuda")
    out = ff.marlin_gemm(a, weight)
    assert isinstance(out, torch.Tensor)
    torch.cuda.synchronize()
    assert relative_l2(cp, cp.asarray(out), reference_gemm(cp, cp.asarray(a), codes, scales, 128)) < TOLERANCE


def test_graph_capture_replays_correctly(cp, layer_4096):
    weight, [(codes, scales)] = layer_4096[128]
    a = activations(cp, 8, 4096)
    out = cp.empty((8, 4096), dtype=cp.float16)
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        ff.marlin_gemm(a, weight, out=out, stream=stream)  # warm-up outside capture
        stream.begin_capture()
        ff.marlin_gemm(a, weight, out=out, stream=stream)
        graph = stream.end_capture()
        out.fill(cp.nan)
        graph.launch(stream)
    stream.synchronize()
    assert relative_l2(cp, out, reference_gemm(cp, a, codes, scales, 128)) < TOLERANCE


def test_profiling_counts_phases_per_projection(cp, layer_4096, monkeypatch):
    from ferrum_ffi import profile

    monkeypatch.setattr(profile, "runtime_config", lambda: profile.RuntimeConfig(profile=True))
    weight, _ = layer_4096[128]
    a = activations(cp, 4, 4096)
    ff.drain_profile()
    with ff.profile_label("model.layers.3.self_attn.qkv_proj"):
        ff.marlin_gemm(a, weight)
        ff.marlin_gemm(a, weight)
    ff.marlin_gemm(a, weight)  # no label: "other"
    snapshot = ff.drain_profile()
    qkv = snapshot.by_projection["qkv_proj"]
    assert qkv.kernel_calls == 2 and qkv.ws_zero_calls == 2 and qkv.kernel_us > 0
    assert snapshot.by_projection["other"].kernel_calls == 1
    assert snapshot.total.kernel_calls == 3
    assert ff.drain_profile().total.kernel_calls == 0


def test_shape_trace_prints_one_line_per_call(cp, layer_4096, monkeypatch, capsys):
    from ferrum_ffi import profile

    config = profile.RuntimeConfig(trace_shapes=True, trace_shapes_max=2)
    monkeypatch.setattr(profile, "runtime_config", lambda: config)
    monkeypatch.setattr(profile, "_trace_calls", 0)
    weight, _ = layer_4096[-1]
    a = activations(cp, 3, 4096)
    for _ in range(3):
        ff.marlin_gemm(a, weight)
    lines = [l for l in capsys.readouterr().err.splitlines() if l.startswith("[marlin-shape-trace]")]
    assert len(lines) == 2
    assert "m=3 n=4096 k=4096 gs=-1" in lines[0] and "a_ptr=0x" in lines[0]
