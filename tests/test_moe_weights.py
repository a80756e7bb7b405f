"""CPU tests of MarlinMoeWeight: every constructor's stacked buffers, decoded
expert by expert with the Marlin inverse helpers, reproduce the float64
weights of the source format's own reference decoder; each expert's slice is
the dense converter's buffer; bias orders, MXFP4 padding, uploads and every
rule of the object."""

from __future__ import annotations

import re

import numpy as np
import pytest

from ferrum_ffi._abi import FERRUM_FP8_SCALE_FACTOR
from ferrum_ffi.formats import (
    decode_mxfp4,
    e4m3_decode_bits,
    marlin_unpack_int4,
    marlin_unpack_int8,
    marlin_unpack_zero_points,
    marlin_unpermute_scales,
    permute_mxfp4_marlin_bias_bf16,
    prepare_awq,
    prepare_block_fp8_weight_for_fp8_marlin,
    prepare_compressed_tensors,
    prepare_gptq,
    quantize_fp8_blocks,
    quantize_mxfp4,
    unpermute_mxfp4_marlin_bias_bf16,
)
from ferrum_ffi.moe_weights import MOE_KINDS, MarlinMoeWeight
from ferrum_ffi.status import ArgumentError, ArgumentTypeError

from . import mm_fakes
from . import quant_layers as ql

BF16 = ql.bfloat16()
E, K, N = 3, 256, 128
SIGNED_E2M1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6])


def stack(layers: list[dict], name: str) -> np.ndarray:
    return np.stack([layer[name] for layer in layers])


def decode_buffers(w: MarlinMoeWeight, e: int) -> np.ndarray:
    """float64 W[k, n] of expert e from its Marlin buffers only (inverse helpers)."""
    group = np.arange(w.k) // (w.k if w.group_size == -1 else w.group_size)
    if w.kind == "mxfp4":
        codes = marlin_unpack_int4(w.qweight[e], w.k, w.n)
        # Bytes are exact in fp16: undo the grouped permutation through the fp16 helper.
        exponents = marlin_unpermute_scales(w.scales[e].astype(np.float16), 32).astype(np.int64)
        return SIGNED_E2M1[codes] * np.ldexp(1.0, exponents - 127)[group]
    scales = marlin_unpermute_scales(w.scales[e], w.group_size).astype(np.float64)[group]
    if w.kind == "fe4m3fn":
        codes = marlin_unpack_int8(w.qweight[e], w.k, w.n)
        return e4m3_decode_bits(codes).astype(np.float64) * scales / FERRUM_FP8_SCALE_FACTOR
    codes = marlin_unpack_int4(w.qweight[e], w.k, w.n).astype(np.float64)
    zero = 8.0 if w.kind == "u4b8" else marlin_unpack_zero_points(w.zero_points[e], w.n, 4).astype(np.float64)[group]
    return (codes - zero) * scales


def assert_buffers_decode_to_reference(w: MarlinMoeWeight, rtol: float = 0.0) -> np.ndarray:
    reference = w.dequantize()
    assert reference.shape == (w.num_experts, w.logical_k, w.n) and reference.dtype == np.float64
    for e in range(w.num_experts):
        got = decode_buffers(w, e)
        np.testing.assert_allclose(got[: w.logical_k], reference[e], rtol=rtol, atol=0)
        assert (got[w.logical_k :] == 0).all()
    return reference


def check_shapes(w: MarlinMoeWeight, kind: str, group_size: int) -> None:
    groups = 1 if group_size == -1 else w.k // group_size
    assert (w.kind, w.num_experts, w.group_size, w.num_groups) == (kind, E, group_size, groups)
    assert w.qweight.dtype == np.int32 and w.qweight.shape == (E, w.k // 16, (4 if kind == "fe4m3fn" else 2) * w.n)
    assert w.scales.shape == (E, groups, w.n)
    assert w.scales.dtype == (np.uint8 if kind == "mxfp4" else np.float16)
    if kind == "u4":
        assert w.zero_points.dtype == np.int32 and w.zero_points.shape == (E, groups, w.n // 8)
    else:
        assert w.zero_points is None
    assert not w.on_device
    assert w.activation_dtype == (BF16 if kind == "mxfp4" else np.float16)


# ---- integer checkpoints ------------------------------------------------------------------------


@pytest.mark.parametrize("sym,group_size", [(True, 128), (True, -1), (False, 32), (False, 64)])
def test_from_gptq(sym, group_size):
    rng = np.random.default_rng(1 + group_size)
    layers = [ql.gptq_layer(rng, K, N, group_size=group_size, sym=sym) for _ in range(E)]
    w = MarlinMoeWeight.from_gptq(stack(layers, "qweight"), stack(layers, "scales"), stack(layers, "qzeros"),
                                  stack(layers, "g_idx"), sym=sym)
    check_shapes(w, "u4b8" if sym else "u4", group_size)
    assert_buffers_decode_to_reference(w)
    dense = prepare_gptq(layers[2]["qweight"], layers[2]["scales"], layers[2]["qzeros"], sym=sym)
    np.testing.assert_array_equal(w.qweight[2], dense.b)
    np.testing.assert_array_equal(w.scales[2], dense.scales)
    if not sym:
        np.testing.assert_array_equal(w.zero_points[2], dense.zero_points)


def test_from_awq():
    rng = np.random.default_rng(2)
    layers = [ql.awq_layer(rng, K, N, group_size=64) for _ in range(E)]
    w = MarlinMoeWeight.from_awq(stack(layers, "qweight"), stack(layers, "scales"), stack(layers, "qzeros"))
    check_shapes(w, "u4", 64)
    assert_buffers_decode_to_reference(w)
    dense = prepare_awq(layers[1]["qweight"], layers[1]["scales"], layers[1]["qzeros"])
    np.testing.assert_array_equal(w.zero_points[1], dense.zero_points)


@pytest.mark.parametrize("asym", [False, True])
@pytest.mark.parametrize("per_expert_shape", [False, True])
def test_from_compressed_tensors(asym, per_expert_shape):
    rng = np.random.default_rng(3)
    layers = [ql.ct_layer(rng, K, N, group_size=128, asym=asym) for _ in range(E)]
    weight_shape = stack(layers, "weight_shape") if per_expert_shape else (N, K)
    w = MarlinMoeWeight.from_compressed_tensors(
        stack(layers, "weight_packed"), stack(layers, "weight_scale"),
        stack(layers, "weight_zero_point") if asym else None, weight_shape,
    )
    check_shapes(w, "u4" if asym else "u4b8", 128)
    assert_buffers_decode_to_reference(w)
    dense = prepare_compressed_tensors(layers[0]["weight_packed"], layers[0]["weight_scale"],
                                       layers[0].get("weight_zero_point"))
    np.testing.assert_array_equal(w.qweight[0], dense.b)


@pytest.mark.parametrize("n,k", [(128, 256), (192, 384)])
def test_from_fp8_blocks_is_the_block_fp8_converter_per_expert(n, k):
    rng = np.random.default_rng(4)
    layers = [ql.fp8_layer(rng, k, n, kind="block") for _ in range(E)]
    w = MarlinMoeWeight.from_fp8_blocks(stack(layers, "weight"), stack(layers, "weight_scale_inv"))
    assert (w.n, w.k, w.logical_k) == (n, k, k)
    check_shapes(w, "fe4m3fn", 128)
    for e, layer in enumerate(layers):
        packed, scales = prepare_block_fp8_weight_for_fp8_marlin(layer["weight"], layer["weight_scale_inv"], n, k)
        np.testing.assert_array_equal(w.qweight[e], packed)
        np.testing.assert_array_equal(w.scales[e], scales)
    # float32 block scales are rounded once to fp16 (times 256): 2**-11 relative.
    assert_buffers_decode_to_reference(w, rtol=2.0**-11)


def test_integer_bias_is_fp16_in_logical_order():
    rng = np.random.default_rng(5)
    layers = [ql.gptq_layer(rng, K, N, group_size=128) for _ in range(E)]
    bias = rng.standard_normal((E, N)).astype(np.float32)
    w = MarlinMoeWeight.from_gptq(stack(layers, "qweight"), stack(layers, "scales"), bias=bias.astype(BF16))
    assert w.bias.dtype == np.float16 and w.bias.shape == (E, N)
    np.testing.assert_array_equal(w.bias, bias.astype(BF16).astype(np.float32).astype(np.float16))
    with pytest.raises(ArgumentError, match=re.escape("bias must have shape (3, 128) ([E, N]), got (3, 64)")):
        MarlinMoeWeight.from_gptq(stack(layers, "qweight"), stack(layers, "scales"), bias=bias[:, :64])
    with pytest.raises(ArgumentError, match=re.escape("bias must be finite in float16")):
        MarlinMoeWeight.from_gptq(stack(layers, "qweight"), stack(layers, "scales"), bias=bias * 1e6)


# ---- MXFP4 --------------------------------------------------------------------------------------


def mxfp4_layer(rng, n: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    blocks = rng.integers(0, 256, size=(E, n, k // 2), dtype=np.uint8)
    scales = rng.integers(120, 134, size=(E, n, k // 32), dtype=np.uint8)
    return blocks, scales


def test_from_mxfp4_decodes_to_the_checkpoint_and_orders_the_bias():
    rng = np.random.default_rng(6)
    blocks, scales = mxfp4_layer(rng, N, K)
    bias = rng.standard_normal((E, N)).astype(BF16)
    w = MarlinMoeWeight.from_mxfp4(blocks, scales, bias)
    assert (w.n, w.k, w.logical_k) == (N, K, K)
    check_shapes(w, "mxfp4", 32)
    reference = assert_buffers_decode_to_reference(w)
    np.testing.assert_array_equal(reference, decode_mxfp4(blocks, scales).transpose(0, 2, 1))
    assert w.bias.dtype == BF16 and w.bias.shape == (E, N)
    np.testing.assert_array_equal(w.bias.view(np.uint16), permute_mxfp4_marlin_bias_bf16(bias, E, N).view(np.uint16))
    np.testing.assert_array_equal(unpermute_mxfp4_marlin_bias_bf16(w.bias, E, N).view(np.uint16), bias.view(np.uint16))


def test_from_mxfp4_bias_forms():
    blocks, scales = mxfp4_layer(np.random.default_rng(7), 64, 128)
    assert (MarlinMoeWeight.from_mxfp4(blocks, scales).bias.view(np.uint16) == 0).all()
    values = np.linspace(-2, 2, E * 64).reshape(E, 64)
    from_float = MarlinMoeWeight.from_mxfp4(blocks, scales, values).bias
    from_bits = MarlinMoeWeight.from_mxfp4(blocks, scales, values.astype(BF16).view(np.uint16)).bias
    np.testing.assert_array_equal(from_float.view(np.uint16), from_bits.view(np.uint16))
    with pytest.raises(ArgumentTypeError, match=r"bias must have dtype bfloat16, uint16 \(bf16 bits\) or a float"):
        MarlinMoeWeight.from_mxfp4(blocks, scales, values.astype(np.int32))
    with pytest.raises(ArgumentError, match=r"bias must be finite in bfloat16"):
        MarlinMoeWeight.from_mxfp4(blocks, scales, values * 1e300)


def test_from_mxfp4_rounds_k_up_to_the_thread_width():
    # No tile has to divide (n, k) (the kernels run partial tiles): a logical K
    # that is a multiple of 32 only is rounded up to 64, here 96 -> 128.
    blocks, scales = mxfp4_layer(np.random.default_rng(8), 64, 96)
    w = MarlinMoeWeight.from_mxfp4(blocks, scales)
    assert (w.k, w.logical_k, w.num_groups) == (128, 96, 4)
    check_shapes(w, "mxfp4", 32)
    assert_buffers_decode_to_reference(w)  # also: the padded rows weigh 0
    assert (w.scales[:, 3] == 0).all()
    explicit = MarlinMoeWeight.from_mxfp4(blocks, scales, physical_k=256)
    assert explicit.k == 256
    assert_buffers_decode_to_reference(explicit)
    with pytest.raises(ArgumentError, match=re.escape("from_mxfp4: physical_k=96 must be a multiple of 64")):
        MarlinMoeWeight.from_mxfp4(blocks, scales, physical_k=96)
    with pytest.raises(ArgumentError, match=re.escape("physical_k=64 must be at least the logical K=96")):
        MarlinMoeWeight.from_mxfp4(blocks, scales, physical_k=64)


@pytest.mark.parametrize("n,k", [(64, 64), (192, 320), (320, 192)])
def test_from_mxfp4_keeps_a_k_that_no_tile_divides(n, k):
    # Multiples of 64 run unpadded with a partial last tile (formerly 64 x 64
    # ran as K 128, 192 x 320 as K 384).
    blocks, scales = mxfp4_layer(np.random.default_rng(9), n, k)
    w = MarlinMoeWeight.from_mxfp4(blocks, scales)
    assert (w.n, w.k, w.logical_k) == (n, k, k)
    check_shapes(w, "mxfp4", 32)
    assert_buffers_decode_to_reference(w)


def test_gpt_oss_shapes():
    blocks = np.zeros((1, 2880, 1440), np.uint8)
    scales = np.full((1, 2880, 90), 127, np.uint8)
    down = MarlinMoeWeight.from_mxfp4(blocks, scales, keep_reference=False)
    # No padding: the down projection runs with its logical K.
    assert (down.n, down.k, down.logical_k) == (2880, 2880, 2880)
    assert down.qweight.shape == (1, 180, 5760) and down.scales.shape == (1, 90, 2880)
    # The original engine's padded layout, asked for explicitly.
    padded = MarlinMoeWeight.from_mxfp4(blocks, scales, physical_k=2944, keep_reference=False)
    assert (padded.n, padded.k, padded.logical_k) == (2880, 2944, 2880)
    assert padded.qweight.shape == (1, 184, 5760) and padded.scales.shape == (1, 92, 2880)
    assert (padded.scales[:, 90:] == 0).all()
    gate_up = MarlinMoeWeight.from_mxfp4(np.zeros((1, 5760, 1440), np.uint8), np.full((1, 5760, 90), 127, np.uint8),
                                         keep_reference=False)
    assert (gate_up.n, gate_up.k) == (5760, 2880)


# ---- float --------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind,group_size", [("u4b8", 128), ("u4b8", -1), ("u4", 64), ("fe4m3fn", None),
                                             ("mxfp4", None)])
def test_from_float(kind, group_size):
    w_float = np.random.default_rng(9).standard_normal((E, N, K))
    w = MarlinMoeWeight.from_float(w_float, kind, group_size)
    expected_group = {"fe4m3fn": 128, "mxfp4": 32}.get(kind, group_size)
    check_shapes(w, kind, expected_group)
    reference = assert_buffers_decode_to_reference(w)  # the quantiser's scales are exact in the buffers
    error = np.abs(reference - w_float.transpose(0, 2, 1)).max()
    assert error < {"u4b8": 0.4, "u4": 0.3, "fe4m3fn": 0.2, "mxfp4": 1.0}[kind]  # a quantisation step or less
    assert np.abs(reference).max() > 1.0


def test_quantize_fp8_blocks():
    w = np.random.default_rng(14).standard_normal((200, 300)) * 3.0
    w[128:, 256:] = 0.0  # the ragged corner block is all zero
    weight, scale_inv = quantize_fp8_blocks(w)
    assert weight.dtype.name == "float8_e4m3fn" and weight.shape == (200, 300)
    assert scale_inv.dtype == np.float32 and scale_inv.shape == (2, 3) and scale_inv[1, 2] == 1.0
    kernel = scale_inv.astype(np.float64) * FERRUM_FP8_SCALE_FACTOR
    np.testing.assert_array_equal(kernel.astype(np.float16).astype(np.float64), kernel)  # exact in fp16
    per_value = scale_inv.astype(np.float64)[np.arange(200)[:, None] // 128, np.arange(300)[None, :] // 128]
    absmax = np.array([[np.abs(w[r:r + 128, c:c + 128]).max() for c in (0, 128, 256)] for r in (0, 128)])
    assert (absmax[:, :2] <= 448 * scale_inv[:, :2]).all() and (absmax[:, :2] > 447 * scale_inv[:, :2]).all()
    decoded = e4m3_decode_bits(weight.view(np.uint8)).astype(np.float64) * per_value
    assert (np.abs(decoded - w) <= np.abs(w) * 2.0**-4 + 2.0**-10 * per_value).all()  # half an E4M3 step
    with pytest.raises(ArgumentTypeError, match=r"quantize_fp8_blocks: w must have a floating dtype"):
        quantize_fp8_blocks(np.ones((4, 4), np.int32))
    with pytest.raises(ArgumentError, match=r"quantize_fp8_blocks: w must be finite"):
        quantize_fp8_blocks(np.full((4, 4), np.inf))
    with pytest.raises(ArgumentError, match=r"w has \|w\| too large for an fp16 Marlin scale"):
        quantize_fp8_blocks(np.full((4, 4), 1e6))
    with pytest.raises(ArgumentError, match=r"w must be 2-D"):
        quantize_fp8_blocks(np.ones(4))


def test_from_float_mxfp4_equals_from_mxfp4_of_the_quantiser():
    w_float = np.random.default_rng(10).standard_normal((E, 64, 64))
    w = MarlinMoeWeight.from_float(w_float, "mxfp4")
    again = MarlinMoeWeight.from_mxfp4(*quantize_mxfp4(w_float))
    np.testing.assert_array_equal(w.qweight, again.qweight)
    np.testing.assert_array_equal(w.scales, again.scales)


# ---- uploads and references ---------------------------------------------------------------------


def test_to_device_uploads_every_buffer():
    rng = np.random.default_rng(11)
    layers = [ql.gptq_layer(rng, K, N, group_size=64, sym=False) for _ in range(E)]
    host = MarlinMoeWeight.from_gptq(stack(layers, "qweight"), stack(layers, "scales"), stack(layers, "qzeros"),
                                     sym=False, bias=np.ones((E, N), np.float32))
    device = host.to_device(mm_fakes.host_cai)
    assert device.on_device and not host.on_device
    for name in ("qweight", "scales", "zero_points", "bias"):
        np.testing.assert_array_equal(getattr(device, name).array, getattr(host, name))
    np.testing.assert_array_equal(device.dequantize(), host.dequantize())
    with pytest.raises(ArgumentError, match=r"already on a device"):
        device.to_device(mm_fakes.host_cai)
    blocks, scales = mxfp4_layer(rng, 64, 128)
    mx = MarlinMoeWeight.from_mxfp4(blocks, scales).to_device(mm_fakes.host_cai)
    assert mx.bias.dtype == BF16 and mx.scales.dtype == np.uint8


def test_without_reference():
    w = MarlinMoeWeight.from_float(np.ones((E, N, K)), "u4b8", keep_reference=False)
    with pytest.raises(ArgumentError, match=r"no reference kept"):
        w.dequantize()


# ---- rules --------------------------------------------------------------------------------------


def test_act_order_and_8_bit_are_refused():
    rng = np.random.default_rng(12)
    layers = [ql.gptq_layer(rng, K, N, group_size=64, act_order=e == 1) for e in range(E)]
    with pytest.raises(ArgumentError, match=re.escape("from_gptq (expert 1): g_idx is an act-order (desc_act) order")):
        MarlinMoeWeight.from_gptq(stack(layers, "qweight"), stack(layers, "scales"), g_idx=stack(layers, "g_idx"))
    with pytest.raises(ArgumentError, match=r"bits=8 must be 4"):
        MarlinMoeWeight.from_gptq(stack(layers, "qweight"), stack(layers, "scales"), bits=8)


def test_stacked_inputs_are_checked():
    rng = np.random.default_rng(13)
    layers = [ql.gptq_layer(rng, K, N, group_size=64) for _ in range(E)]
    qweight, scales = stack(layers, "qweight"), stack(layers, "scales")
    with pytest.raises(ArgumentError, match=re.escape("scales.shape[0]=2 must equal qweight.shape[0]=3 (experts)")):
        MarlinMoeWeight.from_gptq(qweight, scales[:2])
    with pytest.raises(ArgumentError, match=re.escape("qweight must be 3-D with the experts first, got shape (32, 128)")):
        MarlinMoeWeight.from_gptq(qweight[0], scales)
    with pytest.raises(ArgumentTypeError, match=r"qweight: expected a numpy.ndarray"):
        MarlinMoeWeight.from_gptq(qweight.tolist(), scales)
    with pytest.raises(ArgumentError, match=re.escape("from_gptq (expert 0): scales must have shape [G, n] with n=128")):
        MarlinMoeWeight.from_gptq(qweight, scales[:, :, :64])
    with pytest.raises(ArgumentError, match=re.escape("from_awq: qweight.shape[0] (experts)=0 must be positive")):
        MarlinMoeWeight.from_awq(np.zeros((0, K, N // 8), np.int32), scales, scales)
    blocks, mx_scales = mxfp4_layer(rng, 96, 64)
    with pytest.raises(ArgumentError, match=re.escape("from_mxfp4: n = blocks.shape[1]=96 must be a multiple of 64")):
        MarlinMoeWeight.from_mxfp4(blocks, mx_scales)
    with pytest.raises(ArgumentError, match=r"kind='u8' must be one of u4b8, u4, fe4m3fn, mxfp4"):
        MarlinMoeWeight.from_float(np.ones((E, N, K)), "u8")
    with pytest.raises(ArgumentError, match=r"group_size=64 must be 32 for kind 'mxfp4'"):
        MarlinMoeWeight.from_float(np.ones((E, N, K)), "mxfp4", 64)


def direct(**changes) -> MarlinMoeWeight:
    base = dict(kind="u4b8", num_experts=2, n=64, k=128, logical_k=128, group_size=64,
                qweight=np.zeros((2, 8, 128), np.int32), scales=np.ones((2, 2, 64), np.float16))
    return MarlinMoeWeight(**{**base, **changes})


OBJECT_RULES = [
    (dict(kind="u8"), ArgumentError, "kind='u8' must be one of u4b8, u4, fe4m3fn, mxfp4"),
    (dict(n=96), ArgumentError, "MarlinMoeWeight: n=96 must be a multiple of 64"),
    (dict(k=96, logical_k=96, qweight=np.zeros((2, 6, 128), np.int32), scales=np.ones((2, 3, 64), np.float16),
          group_size=32), ArgumentError, "MarlinMoeWeight: k=96 must be a multiple of 64"),
    (dict(logical_k=96), ArgumentError, "logical_k=96 must equal k=128 for kind 'u4b8'"),
    (dict(group_size=32), ArgumentError, "scales must have shape (2, 4, 64)"),
    (dict(group_size=16), ArgumentError, "group_size=16 must be -1, 32, 64 or a power of two >= 128 for kind 'u4b8'"),
    (dict(qweight=np.zeros((2, 8, 256), np.int32)), ArgumentError, "qweight must have shape (2, 8, 128)"),
    (dict(scales=np.ones((2, 2, 64), np.float32)), ArgumentTypeError, "scales must have dtype float16, got float32"),
    (dict(kind="u4"), ArgumentError, "zero_points must be given exactly for kind 'u4'"),
    (dict(zero_points=np.zeros((2, 2, 8), np.int32)), ArgumentError, "zero_points must be given exactly for kind 'u4'"),
    (dict(kind="u4", zero_points=np.zeros((2, 2, 4), np.int32)), ArgumentError, "zero_points must have shape (2, 2, 8)"),
    (dict(kind="fe4m3fn", group_size=128, scales=np.ones((2, 1, 64), np.float16)), ArgumentError,
     "qweight must have shape (2, 8, 256)"),
    (dict(kind="fe4m3fn", group_size=64), ArgumentError, "group_size=64 must be -1 or 128 for kind 'fe4m3fn'"),
    (dict(kind="mxfp4", group_size=32, scales=np.zeros((2, 4, 64), np.uint8)), ArgumentError, "bias is required for kind 'mxfp4'"),
    (dict(kind="mxfp4", group_size=32, scales=np.zeros((2, 4, 64), np.uint8), bias=np.zeros((2, 64), np.float16)),
     ArgumentTypeError, "bias must have dtype bfloat16, got float16"),
    (dict(kind="mxfp4", group_size=32, scales=np.zeros((2, 4, 64), np.uint8), logical_k=160,
          bias=np.zeros((2, 64), BF16)), ArgumentError, "logical_k=160 must not exceed k=128"),
    (dict(bias=np.zeros((2, 32), np.float16)), ArgumentError, "bias must have shape (2, 64)"),
    (dict(qweight=np.zeros((2, 128, 8), np.int32).transpose(0, 2, 1)), ArgumentError, "qweight must be C-contiguous"),
    (dict(scales=mm_fakes.FakeCAI((2, 2, 64), "<f2")), ArgumentError, "all host (numpy) arrays or all device arrays"),
    (dict(scales=mm_fakes.FakeCAI((2, 2, 64), "<f4")), ArgumentTypeError, "scales must have dtype float16"),
]


@pytest.mark.parametrize("changes,error,fragment", OBJECT_RULES, ids=[r[2] for r in OBJECT_RULES])
def test_object_rules(changes, error, fragment):
    with pytest.raises(error, match=re.escape(fragment)):
        direct(**changes)


def test_object_rule_neighbours_pass():
    direct()
    direct(kind="u4", zero_points=np.zeros((2, 2, 8), np.int32))
    direct(kind="fe4m3fn", group_size=128, qweight=np.zeros((2, 8, 256), np.int32), scales=np.ones((2, 1, 64), np.float16))
    direct(kind="mxfp4", group_size=32, logical_k=96, scales=np.zeros((2, 4, 64), np.uint8), bias=np.zeros((2, 64), BF16))
    direct(n=128, k=64, logical_k=64, qweight=np.zeros((2, 4, 256), np.int32), scales=np.ones((2, 1, 128), np.float16))
    # No tile has to divide (n, k): 64 x 64 and 192 x 320 pass.
    direct(k=64, logical_k=64, qweight=np.zeros((2, 4, 128), np.int32), scales=np.ones((2, 1, 64), np.float16))
    direct(n=192, k=320, logical_k=320, qweight=np.zeros((2, 20, 384), np.int32),
           scales=np.ones((2, 5, 192), np.float16))
    direct(qweight=mm_fakes.FakeCAI((2, 8, 128), "<i4"), scales=mm_fakes.FakeCAI((2, 2, 64), "<f2"))
    assert set(MOE_KINDS) == {"u4b8", "u4", "fe4m3fn", "mxfp4"}
