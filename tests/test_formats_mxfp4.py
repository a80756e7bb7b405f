"""CPU tests of ferrum_ffi.formats.mxfp4: the decoder and every Marlin
preparation step against loop references written from the GPT-OSS layout and
the Marlin specification, the equivalence with the fp16 scale path, round
trips, padding, the quantiser and every validation rule."""

from __future__ import annotations

import re

import numpy as np
import pytest

from ferrum_ffi.formats import (
    decode_mxfp4,
    marlin_permute_scales,
    marlin_scale_permutation,
    marlin_unpack_int4,
    mxfp4_physical_k,
    pad_mxfp4_k,
    permute_mxfp4_marlin_bias_bf16,
    prepare_mxfp4_expert_scales_for_marlin,
    quantize_mxfp4,
    repack_gptq_to_marlin,
    repack_scales_to_marlin,
    transpose_mxfp4_expert_blocks_to_gptq_words,
    unpermute_mxfp4_marlin_bias_bf16,
)
from ferrum_ffi.status import ArgumentError, ArgumentTypeError

from . import quant_layers as ql
from .marlin_reference import ref_lane_order

BF16 = ql.bfloat16()
MAGNITUDES = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]
INTERLEAVE = [0, 2, 4, 6, 1, 3, 5, 7]
PERM32 = [2 * i + o for i in range(4) for o in (0, 1, 8, 9, 16, 17, 24, 25)]


def random_layer(rng, n: int, k: int, lead: tuple[int, ...] = ()) -> tuple[np.ndarray, np.ndarray]:
    blocks = rng.integers(0, 256, size=lead + (n, k // 2), dtype=np.uint8)
    scales = rng.integers(118, 136, size=lead + (n, k // 32), dtype=np.uint8)
    return blocks, scales


# ---------------------------------------------------------------------------
# Loop references, straight from the layout descriptions.
# ---------------------------------------------------------------------------
def ref_code(blocks: np.ndarray, row: int, feature: int) -> int:
    byte = int(blocks[row, feature // 2])
    return byte & 0x0F if feature % 2 == 0 else byte >> 4


def ref_decode(blocks: np.ndarray, scales: np.ndarray) -> np.ndarray:
    n, k = blocks.shape[0], 2 * blocks.shape[1]
    out = np.zeros((n, k))
    for row in range(n):
        for feature in range(k):
            code = ref_code(blocks, row, feature)
            value = MAGNITUDES[code & 7] * (-1.0 if code & 8 else 1.0)
            out[row, feature] = value * 2.0 ** (int(scales[row, feature // 32]) - 127)
    return out


def ref_gptq_words(blocks: np.ndarray) -> np.ndarray:
    n, k = blocks.shape[0], 2 * blocks.shape[1]
    out = np.zeros((k // 8, n), dtype=np.int64)
    for r in range(k // 8):
        for col in range(n):
            word = 0
            for i in range(8):
                word |= ref_code(blocks, col, 8 * r + i) << (4 * i)
            out[r, col] = word - (1 << 32) if word >= 1 << 31 else word
    return out.astype(np.int32)


def ref_marlin_codes(packed: np.ndarray, k: int, n: int) -> np.ndarray:
    """Per tile-row, the values of the Marlin spec's step-2 order, read out of
    each word's nibbles through the step-3 interleave."""
    out = np.zeros((k // 16, 16 * n), dtype=np.int64)
    for kt in range(k // 16):
        for w in range(2 * n):
            word = int(packed[kt, w]) & 0xFFFFFFFF
            for i in range(8):
                out[kt, 8 * w + INTERLEAVE[i]] = (word >> (4 * i)) & 0xF
    return out


def ref_grouped_scales(scales: np.ndarray) -> np.ndarray:
    """Transpose to [groups, N], then per 64 columns new[8i + j] = old[i + 8j]."""
    t = scales.T
    out = np.zeros_like(t)
    for row in range(t.shape[0]):
        for base in range(0, t.shape[1], 64):
            for i in range(8):
                for j in range(8):
                    out[row, base + 8 * i + j] = t[row, base + i + 8 * j]
    return out


def ref_p32(bias: np.ndarray) -> np.ndarray:
    out = np.zeros_like(bias)
    for e in range(bias.shape[0]):
        for base in range(0, bias.shape[1], 32):
            for p in range(32):
                out[e, base + p] = bias[e, base + PERM32[p]]
    return out


# ---------------------------------------------------------------------------
# Decoder
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("n,k", [(1, 32), (3, 64), (8, 96)])
def test_decode_matches_loop_reference(n, k):
    blocks, scales = random_layer(np.random.default_rng(n + k), n, k)
    np.testing.assert_array_equal(decode_mxfp4(blocks, scales), ref_decode(blocks, scales))


def test_decode_every_code_and_the_scale_extremes():
    codes = np.arange(16, dtype=np.uint8)
    blocks = np.tile(codes[0::2] | (codes[1::2] << 4), 4)[None, :].repeat(4, axis=0)  # [4, 32]: K = 64
    scales = np.array([[127, 128], [0, 1], [254, 126], [127, 127]], dtype=np.uint8)
    w = decode_mxfp4(blocks, scales)
    signed = MAGNITUDES + [-m for m in MAGNITUDES]
    np.testing.assert_array_equal(w[3], np.tile(signed, 4))
    np.testing.assert_array_equal(w[0, :32], np.tile(signed, 2))
    np.testing.assert_array_equal(w[0, 32:], 2.0 * np.tile(signed, 2))
    np.testing.assert_array_equal(w[1, :32], 2.0**-127 * np.tile(signed, 2))
    assert w[2, 15] == -6.0 * 2.0**127
    assert np.signbit(w[3, 8]) and w[3, 8] == 0.0  # code 8 is -0.0


def test_decode_leading_expert_axes_float32_and_e8m0_dtype():
    blocks, scales = random_layer(np.random.default_rng(1), 64, 128, lead=(2, 3))
    w = decode_mxfp4(blocks, scales)
    assert w.shape == (2, 3, 64, 128) and w.dtype == np.float64
    np.testing.assert_array_equal(w[1, 2], ref_decode(blocks[1, 2], scales[1, 2]))
    w32 = decode_mxfp4(blocks, scales, np.float32)
    assert w32.dtype == np.float32
    np.testing.assert_array_equal(w32, w)  # exact: these scales stay in float32's range
    import ml_dtypes

    np.testing.assert_array_equal(decode_mxfp4(blocks, scales.view(ml_dtypes.float8_e8m0fnu)), w)


def test_decode_nan_scale_and_float32_overflow():
    blocks = np.full((1, 16), 0x77, dtype=np.uint8)  # every code 7: +6
    assert np.isnan(decode_mxfp4(blocks, np.array([[255]], np.uint8))).all()
    assert np.isinf(decode_mxfp4(blocks, np.array([[254]], np.uint8), np.float32)).all()
    assert (decode_mxfp4(blocks, np.array([[254]], np.uint8)) == 6.0 * 2.0**127).all()


# ---------------------------------------------------------------------------
# Weight: GPTQ words, then the 4-bit Marlin layout
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("n,k", [(1, 8), (5, 24), (64, 32), (128, 64)])
def test_gptq_words_match_loop_reference(n, k):
    blocks, _ = random_layer(np.random.default_rng(n * k), n, max(k, 32))
    blocks = np.ascontiguousarray(blocks[:, : k // 2])
    words = transpose_mxfp4_expert_blocks_to_gptq_words(blocks, n, k)
    assert words.dtype == np.int32 and words.shape == (k // 8, n) and words.flags.c_contiguous
    np.testing.assert_array_equal(words, ref_gptq_words(blocks))


def test_gptq_words_hand_computed():
    # Features 0..7 of the only column hold codes 1..8: word nibble i is feature i.
    blocks = np.array([[0x21, 0x43, 0x65, 0x87]], dtype=np.uint8)
    assert transpose_mxfp4_expert_blocks_to_gptq_words(blocks, 1, 8)[0, 0] == np.int32(np.uint32(0x87654321).view(np.int32))


@pytest.mark.parametrize("n,k", [(64, 16), (64, 64), (128, 32)])
def test_marlin_tiles_hold_the_codes_where_int4_codes_go(n, k):
    blocks, _ = random_layer(np.random.default_rng(7 * n + k), n, max(k, 32))
    blocks = np.ascontiguousarray(blocks[:, : k // 2])
    packed = repack_gptq_to_marlin(transpose_mxfp4_expert_blocks_to_gptq_words(blocks, n, k), k, n)
    codes = np.array([[ref_code(blocks, col, row) for col in range(n)] for row in range(k)])  # W[k, n]
    np.testing.assert_array_equal(ref_marlin_codes(packed, k, n), ref_lane_order(codes))
    np.testing.assert_array_equal(marlin_unpack_int4(packed, k, n), codes)


# ---------------------------------------------------------------------------
# Scales
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("n,k", [(64, 32), (128, 96), (192, 256)])
def test_scales_match_loop_reference_and_the_fp16_group_32_path(n, k):
    _, scales = random_layer(np.random.default_rng(n + 3 * k), n, k)
    scales = np.random.default_rng(n).integers(0, 255, size=scales.shape, dtype=np.uint8)  # every byte but NaN
    got = prepare_mxfp4_expert_scales_for_marlin(scales, n, k)
    assert got.dtype == np.uint8 and got.shape == (k // 32, n) and got.flags.c_contiguous
    np.testing.assert_array_equal(got, ref_grouped_scales(scales))
    # Bytes are exact in fp16: the fp16 scales of group size 32 move the same way.
    fp16 = repack_scales_to_marlin(np.ascontiguousarray(scales.T).astype(np.float16), k, n, 32)
    np.testing.assert_array_equal(got, fp16.astype(np.uint8))


def test_scale_permutation_accessor_is_the_scales_own():
    s = np.arange(2 * 128, dtype=np.float16).reshape(2, 128)
    for group_size, width in ((32, 64), (128, 64), (-1, 32)):
        perm = marlin_scale_permutation(group_size)
        assert perm.size == width and not perm.flags.writeable
        rows = s[:1] if group_size == -1 else s
        by_chunk = rows.reshape(rows.shape[0], -1, width)[:, :, perm].reshape(rows.shape)
        np.testing.assert_array_equal(by_chunk, marlin_permute_scales(rows, group_size))
    assert marlin_scale_permutation(-1).tolist() == PERM32


# ---------------------------------------------------------------------------
# Bias
# ---------------------------------------------------------------------------
def test_bias_is_p32_per_expert_in_every_input_form():
    bits = np.random.default_rng(11).standard_normal((3, 128)).astype(BF16).view(np.uint16)  # finite, for the scales
    expected = ref_p32(bits)
    got = permute_mxfp4_marlin_bias_bf16(bits, 3, 128)
    assert got.dtype == np.uint16 and got.shape == (3, 128)
    np.testing.assert_array_equal(got, expected)
    as_bf16 = permute_mxfp4_marlin_bias_bf16(bits.view(BF16), 3, 128)
    assert as_bf16.dtype == BF16
    np.testing.assert_array_equal(as_bf16.view(np.uint16), expected)
    raw = permute_mxfp4_marlin_bias_bf16(bits.astype("<u2").tobytes(), 3, 128)
    assert isinstance(raw, bytes) and raw == expected.astype("<u2").tobytes()
    # The same order as the channelwise (P32) bf16 scales, bit for bit.
    for e in range(3):
        np.testing.assert_array_equal(
            as_bf16[e].view(np.uint16), marlin_permute_scales(bits[e : e + 1].view(BF16), -1)[0].view(np.uint16)
        )


def test_bias_round_trips():
    bits = np.random.default_rng(12).integers(0, 1 << 16, size=(2, 192), dtype=np.uint16)
    for form in (bits, bits.view(BF16), bytearray(bits.astype("<u2").tobytes())):
        back = unpermute_mxfp4_marlin_bias_bf16(permute_mxfp4_marlin_bias_bf16(form, 2, 192), 2, 192)
        if isinstance(form, np.ndarray):
            assert back.dtype == form.dtype
            np.testing.assert_array_equal(back.view(np.uint16), bits)
        else:
            assert back == bytes(form)


# ---------------------------------------------------------------------------
# Physical K and padding
# ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    "n,k,expected",
    [(2880, 2880, 2880), (5760, 2880, 2880), (64, 32, 64), (64, 96, 128), (64, 128, 128), (128, 32, 64),
     (128, 96, 128), (192, 2880, 2880), (192, 320, 320), (256, 64, 64), (2880, 2944, 2944), (64, 2848, 2880)],
)
def test_physical_k(n, k, expected):
    # The kernels run partial tiles: K is only rounded up to the thread width 64,
    # whatever n is (GPT-OSS's down projection keeps K = 2880, no 2944 padding).
    physical = mxfp4_physical_k(n, k)
    assert physical == expected
    assert physical % 64 == 0 and k <= physical < k + 64


def test_the_original_engines_padding_stays_available():
    # Its GPT-OSS down projection ran with K padded 2880 -> 2944: pad_mxfp4_k still does that.
    blocks, scales = random_layer(np.random.default_rng(12), 64, 2880)
    padded_blocks, padded_scales = pad_mxfp4_k(blocks, scales, 2944)
    assert padded_blocks.shape == (64, 1472) and padded_scales.shape == (64, 92)
    padded = decode_mxfp4(padded_blocks, padded_scales)
    np.testing.assert_array_equal(padded[:, :2880], decode_mxfp4(blocks, scales))
    assert (padded[:, 2880:] == 0).all()


def test_padding_keeps_values_and_weighs_zero():
    rng = np.random.default_rng(13)
    blocks, scales = random_layer(rng, 64, 96, lead=(2,))
    padded_blocks, padded_scales = pad_mxfp4_k(blocks, scales, 128)
    assert padded_blocks.shape == (2, 64, 64) and padded_scales.shape == (2, 64, 4)
    w, padded = decode_mxfp4(blocks, scales), decode_mxfp4(padded_blocks, padded_scales)
    np.testing.assert_array_equal(padded[..., :96], w)
    assert (padded[..., 96:] == 0).all() and (padded_blocks[..., 48:] == 0).all() and (padded_scales[..., 3:] == 0).all()
    same = pad_mxfp4_k(blocks, scales, 96)
    assert same[0] is blocks and same[1] is scales


# ---------------------------------------------------------------------------
# Quantiser
# ---------------------------------------------------------------------------
def test_quantize_error_bound_and_exact_round_trip():
    w = np.random.default_rng(14).standard_normal((2, 64, 128)) * np.array([1e-3, 10.0])[:, None, None]
    blocks, scales = quantize_mxfp4(w)
    assert blocks.shape == (2, 64, 64) and scales.shape == (2, 64, 4)
    d = decode_mxfp4(blocks, scales)
    step = 2.0 ** (scales.astype(np.float64) - 127)  # one E2M1 unit of the group
    # Spacing is at most 2 units (between 4 and 6), nothing saturates: |error| <= 1 unit.
    assert (np.abs(d - w).reshape(2, 64, 4, 32) <= step[..., None]).all()
    again = quantize_mxfp4(d)
    np.testing.assert_array_equal(decode_mxfp4(*again), d)


def test_quantize_rounds_to_nearest_ties_to_even_and_zero_groups():
    # Group absmax 6 -> scale 2**0, so each value is rounded on the E2M1 grid itself.
    values = [6.0, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 4.9, -5.1, -0.2, 0.3]
    w = np.zeros((2, 32))
    w[0, : len(values)] = values
    blocks, scales = quantize_mxfp4(w)
    assert scales.tolist() == [[127], [127]]
    expected = [6.0, 0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0, 4.0, -6.0, -0.0, 0.5]
    np.testing.assert_array_equal(decode_mxfp4(blocks, scales)[0, : len(values)], expected)
    assert (decode_mxfp4(blocks, scales)[1] == 0).all()


# ---------------------------------------------------------------------------
# Validation: every rule, with a neighbour that passes.
# ---------------------------------------------------------------------------
B = np.zeros((64, 16), np.uint8)  # n = 64, k = 32
S = np.full((64, 1), 127, np.uint8)
BITS = np.zeros((2, 64), np.uint16)


def _with(a: np.ndarray, index, value) -> np.ndarray:
    out = a.copy()
    out[index] = value
    return out


REJECTIONS = [
    # decode_mxfp4
    (lambda: decode_mxfp4(B.astype(np.int8), S), ArgumentTypeError, "decode_mxfp4: blocks must have dtype uint8",
     lambda: decode_mxfp4(B, S)),
    (lambda: decode_mxfp4(B, S.astype(np.int32)), ArgumentTypeError, "scales must have dtype uint8 or float8_e8m0fnu",
     lambda: decode_mxfp4(B, S)),
    (lambda: decode_mxfp4(B.tolist(), S), ArgumentTypeError, "blocks must be a numpy.ndarray, got list",
     lambda: decode_mxfp4(B, S)),
    (lambda: decode_mxfp4(B[0], S), ArgumentError, "blocks must be at least 2-D", lambda: decode_mxfp4(B, S)),
    (lambda: decode_mxfp4(B[:, :8], S), ArgumentError, "K = 2 * blocks.shape[-1]=16 must be a multiple of 32",
     lambda: decode_mxfp4(B[:, :16], S)),
    (lambda: decode_mxfp4(B, S[:63]), ArgumentError, "scales must have shape (64, 1)", lambda: decode_mxfp4(B, S)),
    (lambda: decode_mxfp4(B, S, np.float16), ArgumentTypeError, "dtype must be float32 or float64",
     lambda: decode_mxfp4(B, S, np.float32)),
    # transpose_mxfp4_expert_blocks_to_gptq_words
    (lambda: transpose_mxfp4_expert_blocks_to_gptq_words(B, 64, 36), ArgumentError,
     "transpose_mxfp4_expert_blocks_to_gptq_words: k=36 must be a multiple of 8",
     lambda: transpose_mxfp4_expert_blocks_to_gptq_words(B, 64, 32)),
    (lambda: transpose_mxfp4_expert_blocks_to_gptq_words(B, 32, 64), ArgumentError,
     "blocks must have shape (32, 32) ([n, k/2])", lambda: transpose_mxfp4_expert_blocks_to_gptq_words(B.T, 16, 128)),
    (lambda: transpose_mxfp4_expert_blocks_to_gptq_words(B.view(np.int8), 64, 32), ArgumentTypeError,
     "blocks must have dtype uint8", lambda: transpose_mxfp4_expert_blocks_to_gptq_words(B, 64, 32)),
    (lambda: transpose_mxfp4_expert_blocks_to_gptq_words(B[None], 64, 32), ArgumentError, "blocks must be 2-D",
     lambda: transpose_mxfp4_expert_blocks_to_gptq_words(B, 64, 32)),
    (lambda: transpose_mxfp4_expert_blocks_to_gptq_words(B, 64.0, 32), ArgumentTypeError, "n must be an int",
     lambda: transpose_mxfp4_expert_blocks_to_gptq_words(B, 64, 32)),
    # prepare_mxfp4_expert_scales_for_marlin
    (lambda: prepare_mxfp4_expert_scales_for_marlin(S[:32], 32, 32), ArgumentError,
     "prepare_mxfp4_expert_scales_for_marlin: n=32 must be a multiple of 64",
     lambda: prepare_mxfp4_expert_scales_for_marlin(S, 64, 32)),
    (lambda: prepare_mxfp4_expert_scales_for_marlin(S, 64, 48), ArgumentError, "k=48 must be a multiple of 32",
     lambda: prepare_mxfp4_expert_scales_for_marlin(S, 64, 32)),
    (lambda: prepare_mxfp4_expert_scales_for_marlin(S, 64, 64), ArgumentError, "scales must have shape (64, 2) ([n, k/32])",
     lambda: prepare_mxfp4_expert_scales_for_marlin(np.hstack([S, S]), 64, 64)),
    (lambda: prepare_mxfp4_expert_scales_for_marlin(S.T, 64, 32), ArgumentError, "scales must have shape (64, 1)",
     lambda: prepare_mxfp4_expert_scales_for_marlin(S, 64, 32)),
    (lambda: prepare_mxfp4_expert_scales_for_marlin(_with(S, (5, 0), 255), 64, 32), ArgumentError,
     "scales must not contain the E8M0 NaN byte 0xFF; found at [5, 0]",
     lambda: prepare_mxfp4_expert_scales_for_marlin(_with(S, (5, 0), 254), 64, 32)),
    (lambda: prepare_mxfp4_expert_scales_for_marlin(S.astype(np.float32), 64, 32), ArgumentTypeError,
     "scales must have dtype uint8", lambda: prepare_mxfp4_expert_scales_for_marlin(S, 64, 32)),
    # permute_mxfp4_marlin_bias_bf16 / unpermute
    (lambda: permute_mxfp4_marlin_bias_bf16(BITS.astype(np.float32), 2, 64), ArgumentTypeError,
     "permute_mxfp4_marlin_bias_bf16: bias must have dtype bfloat16 or uint16",
     lambda: permute_mxfp4_marlin_bias_bf16(BITS, 2, 64)),
    (lambda: permute_mxfp4_marlin_bias_bf16(BITS, 1, 64), ArgumentError, "bias must have shape (1, 64) ([expert_count, n])",
     lambda: permute_mxfp4_marlin_bias_bf16(BITS[:1], 1, 64)),
    (lambda: permute_mxfp4_marlin_bias_bf16(BITS.reshape(-1), 2, 64), ArgumentError, "bias must be 2-D",
     lambda: permute_mxfp4_marlin_bias_bf16(BITS.tobytes(), 2, 64)),
    (lambda: permute_mxfp4_marlin_bias_bf16(BITS.tobytes()[:-2], 2, 64), ArgumentError,
     "bias given as bytes must hold expert_count*n=128 little-endian bf16 values (256 bytes), got 254 bytes",
     lambda: permute_mxfp4_marlin_bias_bf16(BITS.tobytes(), 2, 64)),
    (lambda: permute_mxfp4_marlin_bias_bf16(BITS[:, :32], 2, 32), ArgumentError, "n=32 must be a multiple of 64",
     lambda: permute_mxfp4_marlin_bias_bf16(BITS, 2, 64)),
    (lambda: permute_mxfp4_marlin_bias_bf16(BITS, 0, 64), ArgumentError, "expert_count=0 must be positive",
     lambda: permute_mxfp4_marlin_bias_bf16(BITS, 2, 64)),
    (lambda: unpermute_mxfp4_marlin_bias_bf16(BITS, 3, 64), ArgumentError,
     "unpermute_mxfp4_marlin_bias_bf16: bias must have shape (3, 64)", lambda: unpermute_mxfp4_marlin_bias_bf16(BITS, 2, 64)),
    # mxfp4_physical_k
    (lambda: mxfp4_physical_k(96, 32), ArgumentError, "mxfp4_physical_k: n=96 must be a multiple of 64",
     lambda: mxfp4_physical_k(64, 32)),
    (lambda: mxfp4_physical_k(64, 48), ArgumentError, "k=48 must be a multiple of 32", lambda: mxfp4_physical_k(64, 64)),
    # pad_mxfp4_k
    (lambda: pad_mxfp4_k(B, S, 16), ArgumentError, "pad_mxfp4_k: physical_k=16 must be a multiple of 32",
     lambda: pad_mxfp4_k(B, S, 64)),
    (lambda: pad_mxfp4_k(np.hstack([B, B]), np.hstack([S, S]), 32), ArgumentError,
     "physical_k=32 must be at least K=64", lambda: pad_mxfp4_k(np.hstack([B, B]), np.hstack([S, S]), 64)),
    (lambda: pad_mxfp4_k(B, S[None], 64), ArgumentError, "scales must have shape (64, 1)", lambda: pad_mxfp4_k(B, S, 64)),
    # quantize_mxfp4
    (lambda: quantize_mxfp4(np.ones((4, 48))), ArgumentError, "quantize_mxfp4: w.shape[1]=48 must be a multiple of 32",
     lambda: quantize_mxfp4(np.ones((4, 64)))),
    (lambda: quantize_mxfp4(np.ones((4, 32), np.int32)), ArgumentTypeError, "w must have a floating dtype",
     lambda: quantize_mxfp4(np.ones((4, 32), np.float16))),
    (lambda: quantize_mxfp4(np.ones(32)), ArgumentError, "w must be at least 2-D", lambda: quantize_mxfp4(np.ones((1, 32)))),
    (lambda: quantize_mxfp4(_with(np.ones((2, 32)), (1, 3), np.nan)), ArgumentError, "w must be finite",
     lambda: quantize_mxfp4(_with(np.ones((2, 32)), (1, 3), 1e30))),
]


@pytest.mark.parametrize("call,error,fragment,neighbour", REJECTIONS, ids=[r[2] for r in REJECTIONS])
def test_validation(call, error, fragment, neighbour):
    with pytest.raises(error, match=re.escape(fragment)):
        call()
    neighbour()
