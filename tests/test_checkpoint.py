"""``load_linear`` on synthetic safetensors checkpoints (written with
``safetensors.numpy.save_file``): each format recognised by its tensor names,
shapes and dtypes, built into the right weight, and decoded back to the
format's own reference; incomplete or unknown sets refused by name."""

from __future__ import annotations

import json

import numpy as np
import pytest

import ferrum_ffi as ff
from ferrum_ffi import WeightType
from ferrum_ffi.checkpoint import read_tensors
from ferrum_ffi.formats import (
    awq_reference_dequant,
    ct_reference_dequant,
    fp8_reference_dequant,
    gptq_reference_dequant,
)
from ferrum_ffi.status import ArgumentError

from . import mm_fakes, quant_layers as ql
from .test_prepare import decode_marlin

safetensors_numpy = pytest.importorskip("safetensors.numpy")

K, N = 256, 128
PREFIX = "model.layers.0.mlp.down_proj"
BF16 = ql.bfloat16()


@pytest.fixture(autouse=True)
def host_device(monkeypatch):
    mm_fakes.install(monkeypatch)


def named(tensors: dict, prefix: str = PREFIX) -> dict:
    return {f"{prefix}.{name}": value for name, value in tensors.items()}


def save(tmp_path, tensors: dict, name: str = "model.safetensors"):
    path = tmp_path / name
    safetensors_numpy.save_file(tensors, str(path))
    return path


def load(source, **kwargs) -> ff.MarlinLinearWeight:
    return ff.load_linear(source, PREFIX, to_device=mm_fakes.host_cai, keep_reference=True, **kwargs)


def decoded(weight: ff.MarlinLinearWeight) -> np.ndarray:
    """The weight's device buffers (host-backed here), decoded as in test_weights."""
    from ferrum_ffi.formats.prepare import PreparedLinear

    host = PreparedLinear(
        b=weight.b.array, scales=weight.scales.array, k=weight.k, n=weight.n, group_size=weight.group_size,
        b_type=weight.b_type, dtype=weight.dtype,
        zero_points=None if weight.zero_points is None else weight.zero_points.array,
        g_idx=None if weight.g_idx is None else weight.g_idx.array,
        perm=None if weight.perm is None else weight.perm.array,
    )
    return decode_marlin(host)


@pytest.mark.parametrize("bits, sym, act_order, expected", [
    (4, True, False, WeightType.U4B8), (8, True, False, WeightType.U8B128),
    (4, False, False, WeightType.U4), (4, True, True, WeightType.U4B8), (4, False, True, WeightType.U4),
])
def test_gptq(tmp_path, bits, sym, act_order, expected):
    t = ql.gptq_layer(np.random.default_rng(bits), K, N, bits=bits, group_size=64, sym=sym, act_order=act_order)
    w = load(save(tmp_path, named(t)))
    assert (w.b_type, w.group_size, w.act_order, w.k, w.n) == (expected, 64, act_order, K, N)
    reference = gptq_reference_dequant(t["qweight"], t["scales"], t["qzeros"], t["g_idx"], bits, sym, 64)
    np.testing.assert_array_equal(w.reference_dequant(), reference)
    np.testing.assert_array_equal(decoded(w), reference)


def test_gptq_sym_override_and_bits_from_g_idx(tmp_path):
    t = ql.gptq_layer(np.random.default_rng(3), K, N, bits=8, group_size=128, with_qzeros=False)
    w = load(save(tmp_path, named(t)))  # no qzeros: bits from g_idx, symmetric
    assert w.b_type is WeightType.U8B128
    t = ql.gptq_layer(np.random.default_rng(3), K, N, bits=4, group_size=128)
    assert load(save(tmp_path, named(t)), sym=False).b_type is WeightType.U4  # zero 8 everywhere, asked asymmetric


def test_awq(tmp_path):
    t = ql.awq_layer(np.random.default_rng(4), K, N, group_size=32)
    w = load(save(tmp_path, named(t)))
    assert (w.b_type, w.group_size) == (WeightType.U4, 32)
    np.testing.assert_array_equal(decoded(w), awq_reference_dequant(t["qweight"], t["scales"], t["qzeros"], 32))


@pytest.mark.parametrize(
    "bits, asym, expected", [(4, False, WeightType.U4B8), (8, False, WeightType.U8B128), (4, True, WeightType.U4)]
)
def test_compressed_tensors(tmp_path, bits, asym, expected):
    t = ql.ct_layer(np.random.default_rng(5), K, N, bits=bits, group_size=128, asym=asym, scale_dtype=BF16)
    w = load(save(tmp_path, named(t)), dtype=BF16)
    assert (w.b_type, w.group_size, w.dtype) == (expected, 128, BF16)
    reference = ct_reference_dequant(t["weight_packed"], t["weight_scale"], t.get("weight_zero_point"), bits)
    np.testing.assert_array_equal(decoded(w), reference)


@pytest.mark.parametrize("kind", ["tensor", "channel", "block"])
def test_fp8(tmp_path, kind):
    t = ql.fp8_layer(np.random.default_rng(6), K, N, kind=kind, scale_dtype=np.float32)
    t["input_scale"] = np.array(1.0, dtype=np.float32)  # static activation scale: not ours, ignored
    w = load(save(tmp_path, named(t)))
    assert (w.b_type, w.group_size) == (WeightType.FE4M3FN, 128 if kind == "block" else -1)
    scale = t.get("weight_scale", t.get("weight_scale_inv"))
    reference = fp8_reference_dequant(t["weight"], scale, (128, 128) if kind == "block" else None)
    np.testing.assert_allclose(decoded(w), reference, rtol=2**-11)
    np.testing.assert_array_equal(w.reference_dequant(), reference)


def test_fp8_tensors_are_read_as_raw_bytes(tmp_path):
    t = ql.fp8_layer(np.random.default_rng(7), K, N, kind="channel")
    tensors = read_tensors(save(tmp_path, named(t)), PREFIX)
    assert tensors["weight"].dtype == np.uint8
    assert np.array_equal(tensors["weight"], t["weight"].view(np.uint8))


def test_a_dict_of_arrays(tmp_path):
    t = ql.awq_layer(np.random.default_rng(8), K, N, group_size=64)
    other = named(ql.gptq_layer(np.random.default_rng(9), K, N, group_size=64), "model.layers.0.mlp.up_proj")
    w = load({**named(t), **other})
    assert w.b_type is WeightType.U4


def test_a_checkpoint_directory_with_an_index(tmp_path):
    t = ql.gptq_layer(np.random.default_rng(10), K, N, group_size=128)
    tensors = named(t)
    names = sorted(tensors)
    save(tmp_path, {name: tensors[name] for name in names[:2]}, "model-00001-of-00002.safetensors")
    save(tmp_path, {name: tensors[name] for name in names[2:]}, "model-00002-of-00002.safetensors")
    index = {"weight_map": {name: f"model-0000{1 if i < 2 else 2}-of-00002.safetensors" for i, name in enumerate(names)}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    assert load(tmp_path).b_type is WeightType.U4B8
    (tmp_path / "model.safetensors.index.json").unlink()
    assert load(tmp_path).b_type is WeightType.U4B8  # every *.safetensors of the folder
    assert load(sorted(tmp_path.glob("*.safetensors"))).b_type is WeightType.U4B8


def test_reference_is_not_kept_by_default(tmp_path):
    t = ql.awq_layer(np.random.default_rng(11), K, N, group_size=64)
    w = ff.load_linear(named(t), PREFIX, to_device=mm_fakes.host_cai)
    with pytest.raises(ArgumentError, match="no reference kept"):
        w.reference_dequant()


# ---- refusals -------------------------------------------------------------------------------


def test_missing_prefix():
    with pytest.raises(ArgumentError, match=rf"no tensor named {PREFIX}\.\*"):
        load({"model.other.weight": np.zeros(2)})


def test_incomplete_gptq_or_awq_set():
    t = ql.gptq_layer(np.random.default_rng(12), K, N, group_size=64)
    del t["scales"]
    with pytest.raises(ArgumentError, match=r"looks like GPTQ/AWQ \(qweight\) but lacks scales \(found: g_idx, qweight, qzeros\)"):
        load(named(t))


def test_qweight_matching_neither_layout():
    t = ql.gptq_layer(np.random.default_rng(13), K, N, group_size=64)
    t["scales"] = t["scales"][:, :64]
    with pytest.raises(ArgumentError, match=r"match neither GPTQ .* nor AWQ"):
        load(named(t))


def test_compressed_tensors_rules():
    t = ql.ct_layer(np.random.default_rng(14), K, N, bits=4, group_size=128)
    with pytest.raises(ArgumentError, match=r"act-order \(weight_g_idx\) is not supported"):
        load(named({**t, "weight_g_idx": np.zeros(K, np.int32)}))
    del t["weight_shape"]
    with pytest.raises(ArgumentError, match=r"without weight_shape the bit width is unknown; pass bits="):
        load(named(t))
    assert load(named(t), bits=4).b_type is WeightType.U4B8
    del t["weight_scale"]
    with pytest.raises(ArgumentError, match=r"lacks weight_scale"):
        load(named(t), bits=4)


def test_unquantised_and_unknown_layers():
    unquantised = r"unquantised weight \(dtype float16\); quantise it with MarlinLinearWeight.from_float"
    with pytest.raises(ArgumentError, match=unquantised):
        load(named({"weight": np.zeros((N, K), np.float16)}))
    with pytest.raises(ArgumentError, match=r"lacks weight_scale"):
        load(named({"weight": ql.every_finite_e4m3(N, K)}))
    with pytest.raises(ArgumentError, match=r"no known quantised layer .* found: bias"):
        load(named({"bias": np.zeros(N, np.float16)}))


def test_awq_bits_must_be_4():
    t = ql.awq_layer(np.random.default_rng(15), K, N, group_size=64)
    with pytest.raises(ArgumentError, match=r"AWQ layers are 4-bit, got bits=8"):
        load(named(t), bits=8)


def test_missing_file(tmp_path):
    with pytest.raises(ArgumentError, match=r"does not exist"):
        load(tmp_path / "nope.safetensors")
