"""MarlinLinearWeight on the CPU: built from every format through host-backed
fake device arrays, and every rule about its buffers."""

from __future__ import annotations

import numpy as np
import pytest

import ferrum_ffi as ff
from ferrum_ffi import WeightType
from ferrum_ffi._abi import FERRUM_MM_FLAG_ACT_ORDER, FERRUM_MM_FLAG_HAS_ZERO_POINTS, FERRUM_MM_FLAG_K_FULL
from ferrum_ffi.status import ArgumentError, ArgumentTypeError

from . import mm_fakes, quant_layers as ql

BF16 = ql.bfloat16()
K, N = 256, 128


# ---- MarlinLinearWeight -------------------------------------------------------------------------


@pytest.fixture
def host_device(monkeypatch):
    """Weights built from host-backed fake device arrays on device 0."""
    mm_fakes.install(monkeypatch)
    return mm_fakes.host_cai


def test_weight_from_gptq_act_order(host_device):
    t = ql.gptq_layer(np.random.default_rng(70), K, N, group_size=64, act_order=True)
    w = ff.MarlinLinearWeight.from_gptq(t["qweight"], t["scales"], t["qzeros"], t["g_idx"], bits=4, sym=True,
                                        dtype=BF16, to_device=host_device)
    assert (w.k, w.n, w.group_size, w.num_groups, w.b_type, w.dtype) == (K, N, 64, 4, WeightType.U4B8, BF16)
    assert w.act_order and w.a_type == ff.ActivationType.BF16
    assert w.flags == FERRUM_MM_FLAG_K_FULL | FERRUM_MM_FLAG_ACT_ORDER
    assert w.device == 0
    assert np.array_equal(w.perm.array, np.argsort(t["g_idx"], kind="stable"))
    assert w.reference_dequant().shape == (K, N)
    problem = w.problem(5, fp32_reduce=True)
    assert problem.flags & FERRUM_MM_FLAG_ACT_ORDER and problem.num_groups == 4


@pytest.mark.parametrize("maker", ["awq", "ct", "fp8", "float"])
def test_weight_constructors(host_device, maker):
    rng = np.random.default_rng(71)
    if maker == "awq":
        t = ql.awq_layer(rng, K, N, group_size=32)
        w = ff.MarlinLinearWeight.from_awq(t["qweight"], t["scales"], t["qzeros"], to_device=host_device)
        expected, zp = WeightType.U4, True
    elif maker == "ct":
        t = ql.ct_layer(rng, K, N, bits=8, group_size=-1)
        w = ff.MarlinLinearWeight.from_compressed_tensors(t["weight_packed"], t["weight_scale"], bits=8,
                                                          to_device=host_device)
        expected, zp = WeightType.U8B128, False
    elif maker == "fp8":
        t = ql.fp8_layer(rng, K, N, kind="block")
        w = ff.MarlinLinearWeight.from_fp8(t["weight"], t["weight_scale_inv"], dtype=BF16, to_device=host_device)
        expected, zp = WeightType.FE4M3FN, False
    else:
        w = ff.MarlinLinearWeight.from_float(rng.standard_normal((K, N)).astype(np.float32), bits=4, sym=False,
                                             to_device=host_device)
        expected, zp = WeightType.U4, True
    assert w.b_type is expected and (w.zero_points is not None) == zp and not w.act_order
    assert bool(w.flags & FERRUM_MM_FLAG_HAS_ZERO_POINTS) == zp
    assert w.reference_dequant().shape == (K, N)


def test_weight_without_reference(host_device):
    w = ff.MarlinLinearWeight.from_float(np.ones((K, N), np.float32), keep_reference=False, to_device=host_device)
    with pytest.raises(ArgumentError, match=r"no reference kept"):
        w.reference_dequant()


def fake_weight(**changes):
    base = dict(
        b=mm_fakes.FakeCAI((K // 16, 2 * N), "<i4"), scales=mm_fakes.FakeCAI((2, N), "<f2"),
        k=K, n=N, group_size=128, b_type=WeightType.U4B8,
    )
    return ff.MarlinLinearWeight(**{**base, **changes})


def test_weight_buffer_rules(monkeypatch):
    mm_fakes.install(monkeypatch)
    fake_weight()
    with pytest.raises(ArgumentError, match=r"b must have shape \(16, 256\)"):
        fake_weight(b=mm_fakes.FakeCAI((K // 16, 4 * N), "<i4"))
    fake_weight(b=mm_fakes.FakeCAI((K // 16, 4 * N), "<i4"), b_type=WeightType.U8B128)
    with pytest.raises(ArgumentTypeError, match=r"scales must have dtype bfloat16"):
        fake_weight(dtype=BF16)
    fake_weight(dtype=BF16, scales=mm_fakes.bf16_cai((2, N)))
    with pytest.raises(ArgumentError, match=r"zero_points must be given exactly for b_type U4"):
        fake_weight(b_type=WeightType.U4)
    fake_weight(b_type=WeightType.U4, zero_points=mm_fakes.FakeCAI((2, N // 8), "<i4"))
    with pytest.raises(ArgumentError, match=r"zero_points must have shape \(2, 16\)"):
        fake_weight(b_type=WeightType.U4, zero_points=mm_fakes.FakeCAI((2, N // 4), "<i4"))
    with pytest.raises(ArgumentError, match=r"g_idx and perm come together"):
        fake_weight(g_idx=mm_fakes.FakeCAI((K,), "<i4"))
    fake_weight(g_idx=mm_fakes.FakeCAI((K,), "<i4"), perm=mm_fakes.FakeCAI((K,), "<i4"))
    with pytest.raises(ArgumentError, match=r"ACT_ORDER needs an integer weight type"):
        fake_weight(b=mm_fakes.FakeCAI((K // 16, 4 * N), "<i4"), b_type=WeightType.FE4M3FN,
                    g_idx=mm_fakes.FakeCAI((K,), "<i4"), perm=mm_fakes.FakeCAI((K,), "<i4"))
    with pytest.raises(ArgumentError, match=r"group_size=32 must be one of -1, 128 for b_type=FE4M3FN"):
        fake_weight(b=mm_fakes.FakeCAI((K // 16, 4 * N), "<i4"), b_type=WeightType.FE4M3FN, group_size=32,
                    scales=mm_fakes.FakeCAI((8, N), "<f2"))
    with pytest.raises(ArgumentError, match=r"b_type=7 is not a weight type"):
        fake_weight(b_type=7)
    with pytest.raises(ArgumentTypeError, match=r"dtype must be float16 or bfloat16"):
        fake_weight(dtype=np.float32)


def test_weight_buffers_on_two_devices_are_rejected(monkeypatch):
    mm_fakes.install(monkeypatch)
    from ferrum_ffi import weights

    monkeypatch.setattr(weights, "device_of", lambda obj, view: 1 if view.shape == (2, N) else 0)
    with pytest.raises(ArgumentError, match=r"all buffers must be on one device"):
        fake_weight()
