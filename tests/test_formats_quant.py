"""CPU tests of the quantised checkpoint formats and the 8-bit / zero-point
Marlin layouts: loop-by-loop references written from the specifications,
round trips, hand-computed on-disk examples, converters checked by decoding
their Marlin buffers back, the FP8 seed fixture, and every validation rule."""

from __future__ import annotations

import re

import numpy as np
import pytest

from ferrum_ffi.formats import awq, fp8, gptq, marlin
from ferrum_ffi.formats import (
    FP8_EXPONENT_BIAS_FACTOR,
    awq_pack,
    awq_reference_dequant,
    awq_to_marlin,
    awq_unpack,
    awq_unpack_zeros,
    ct_pack,
    ct_pack_zero_points,
    ct_reference_dequant,
    ct_to_marlin,
    ct_unpack,
    ct_unpack_zero_points,
    e4m3_decode_bits,
    e4m3_to_float,
    e4m3_to_kernel_fp16,
    fp8_reference_dequant,
    gptq_pack,
    gptq_pack_int4,
    gptq_reference_dequant,
    gptq_unpack,
    gptq_unpack_zeros,
    gptq_zero_points,
    marlin_pack_int4,
    marlin_pack_int8,
    marlin_pack_zero_points,
    marlin_unpack_int4,
    marlin_unpack_int8,
    marlin_unpack_zero_points,
    marlin_unpermute_scales,
    permute_gptq_qweight_rows,
    prepare_block_fp8_weight_for_fp8_marlin,
    prepare_fp8_weight_for_marlin,
    repack_gptq_to_marlin,
    repack_gptq_to_marlin_bits,
)
from ferrum_ffi.status import ArgumentError, ArgumentTypeError

from .marlin_reference import ref_lane_order

SEED = 20240607


def rng(seed: int = SEED) -> np.random.Generator:
    return np.random.default_rng(seed)


def codes(k: int, n: int, bits: int, seed: int = SEED) -> np.ndarray:
    return rng(seed).integers(0, 1 << bits, size=(k, n)).astype(np.uint8)


def fp16_scales(rows: int, n: int, seed: int = SEED) -> np.ndarray:
    return rng(seed).uniform(0.001, 0.1, size=(rows, n)).astype(np.float16)


def to_int32(word: int) -> int:
    return word - (1 << 32) if word >= (1 << 31) else word


def pack_word(values, bits: int) -> int:
    """Value i at bits i*bits, as the signed int32 a buffer holds."""
    word = 0
    for i, v in enumerate(values):
        word |= int(v) << (bits * i)
    return to_int32(word)


@pytest.fixture
def tiny_steps(monkeypatch):
    """Many small chunks, so chunk boundaries are exercised on small shapes."""
    for module in (marlin, gptq, awq):
        monkeypatch.setattr(module, "_STEP_VALUES", 1)


# ---------------------------------------------------------------------------
# Loop references, one per numbered step of each specification.
# ---------------------------------------------------------------------------
def ref_marlin_pack8(q: np.ndarray) -> np.ndarray:
    """Step 3 for 8 bits: groups of 4 as [0, 2, 1, 3], first value lowest byte."""
    step2 = ref_lane_order(q)
    k, n = q.shape
    out = np.zeros((k // 16, 4 * n), dtype=np.int64)
    for kt in range(k // 16):
        for w in range(4 * n):
            old = step2[kt, 4 * w : 4 * w + 4]
            out[kt, w] = pack_word([old[0], old[2], old[1], old[3]], 8)
    return out.astype(np.int32)


def ref_marlin_zero_points(z: np.ndarray, bits: int) -> np.ndarray:
    g, n = z.shape
    perm = np.zeros_like(z)
    for row in range(g):
        for base in range(0, n, 64):
            for i in range(8):
                for j in range(8):
                    perm[row, base + 8 * i + j] = z[row, base + i + 8 * j]
    inter = [0, 2, 4, 6, 1, 3, 5, 7] if bits == 4 else [0, 2, 1, 3]
    per = 32 // bits
    out = np.zeros((g, n // per), dtype=np.int64)
    for row in range(g):
        for w in range(n // per):
            old = perm[row, w * per : (w + 1) * per]
            out[row, w] = pack_word([old[inter[i]] for i in range(per)], bits)
    return out.astype(np.int32)


def ref_gptq_pack(q: np.ndarray, bits: int) -> np.ndarray:
    per = 32 // bits
    k, n = q.shape
    out = np.zeros((k // per, n), dtype=np.int64)
    for r in range(k // per):
        for c in range(n):
            out[r, c] = pack_word([q[r * per + i, c] for i in range(per)], bits)
    return out.astype(np.int32)


def ref_pack_along_n(v: np.ndarray, bits: int, order=None) -> np.ndarray:
    """GPTQ qzeros (order None) or AWQ words (order = AWQ order): nibble i of
    word w holds column w*per + order[i]."""
    per = 32 // bits
    order = list(range(per)) if order is None else order
    rows, n = v.shape
    out = np.zeros((rows, n // per), dtype=np.int64)
    for r in range(rows):
        for w in range(n // per):
            out[r, w] = pack_word([v[r, w * per + order[i]] for i in range(per)], bits)
    return out.astype(np.int32)


def ref_dequant_loop(q, zero, scale, group_of_row) -> np.ndarray:
    """w[k, n] = (q[k, n] - zero[g, n]) * scale[g, n], g = group_of_row[k]."""
    k, n = q.shape
    out = np.zeros((k, n))
    for row in range(k):
        g = group_of_row[row]
        for col in range(n):
            out[row, col] = (int(q[row, col]) - int(zero[g][col])) * float(scale[g, col])
    return out


def decode_marlin_int(packed, scales, zero_points, k, n, bits, group_size, symmetric_zero=None):
    """What the kernel computes from the Marlin buffers, in float64."""
    q = (marlin_unpack_int4 if bits == 4 else marlin_unpack_int8)(packed, k, n).astype(np.float64)
    s = marlin_unpermute_scales(scales, group_size).astype(np.float64)
    if zero_points is None:
        z = np.full(s.shape, float(symmetric_zero))
    else:
        z = marlin_unpack_zero_points(zero_points, n, bits).astype(np.float64)
    g = np.arange(k) // (k if group_size == -1 else group_size)
    return (q - z[g]) * s[g]


# ---------------------------------------------------------------------------
# A. 8-bit Marlin layout
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("k,n", [(16, 64), (32, 128), (48, 192)])
@pytest.mark.parametrize("dtype", [np.uint8, np.int32])
def test_marlin_int8_matches_reference(k, n, dtype):
    q = codes(k, n, 8).astype(dtype)
    packed = marlin_pack_int8(q)
    assert packed.dtype == np.int32 and packed.shape == (k // 16, 4 * n)
    np.testing.assert_array_equal(packed, ref_marlin_pack8(q))
    out = marlin_unpack_int8(packed, k, n)
    assert out.dtype == np.uint8
    np.testing.assert_array_equal(out, q)


def test_marlin_int8_chunked(tiny_steps):
    q = codes(64, 128, 8)
    packed = marlin_pack_int8(q)
    np.testing.assert_array_equal(packed, ref_marlin_pack8(q))
    np.testing.assert_array_equal(marlin_unpack_int8(packed, 64, 128), q)


def test_marlin_int8_hand_words():
    # q[r, c] = r + 16 * (c % 16). Lane 0, tile 0, column 0: rows 0, 1, 8, 9
    # -> [0, 1, 8, 9]; order [0, 2, 1, 3] -> [0, 8, 1, 9], first value in the
    # low byte -> 0x09010800. Column 8: [128, 129, 136, 137] -> [128, 136,
    # 129, 137] -> 0x89818880. Lane 1 (word 8: a lane has 4 tiles x 2 columns
    # = 8 words) owns rows 2, 3, 10, 11 -> [2, 10, 3, 11] -> 0x0B030A02.
    r, c = np.meshgrid(np.arange(16), np.arange(64), indexing="ij")
    packed = marlin_pack_int8(r + 16 * (c % 16)).view(np.uint32)
    assert [hex(int(w)) for w in packed[0, :2]] == ["0x9010800", "0x89818880"]
    assert packed[0, 8] == 0x0B030A02


def test_marlin_int8_same_lanes_as_int4():
    # The 8-bit form is the 4-bit form with another step 3: for codes < 16
    # both put the same values in each lane's 32-value slice.
    q = codes(32, 128, 4)
    bytes8 = marlin.marlin_unpack_int8(marlin_pack_int8(q), 32, 128)
    np.testing.assert_array_equal(bytes8, marlin_unpack_int4(marlin_pack_int4(q), 32, 128))
    step2 = ref_lane_order(q)
    words8 = marlin_pack_int8(q).view(np.uint32)
    lane_values = ((words8[:, :, None] >> np.array([0, 16, 8, 24], dtype=np.uint32)) & 0xFF)
    np.testing.assert_array_equal(lane_values.reshape(2, -1), step2)


def test_marlin_int8_column_slice_is_pointer_offset():
    q = codes(32, 192, 8)
    full = marlin_pack_int8(q)
    np.testing.assert_array_equal(marlin_pack_int8(q[:, 64:128]), full[:, 256:512])


def test_marlin_int4_unchanged_by_refactor():
    # The 4-bit run order is still the published one (test_formats checks the
    # full reference); here only that the shared builder did not change it.
    assert marlin._RUN_ORDER[:8].tolist() == [0, 128, 8, 136, 16, 144, 24, 152]
    assert sorted(marlin._RUN_ORDER_INT8.tolist()) == list(range(1024))
    assert marlin._RUN_ORDER_INT8[:8].tolist() == [0, 128, 16, 144, 8, 136, 24, 152]


# ---------------------------------------------------------------------------
# B. Zero points in Marlin order
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("g,n", [(1, 64), (3, 128), (2, 192)])
def test_marlin_zero_points_match_reference(bits, g, n):
    z = codes(g, n, bits)
    packed = marlin_pack_zero_points(z, bits)
    assert packed.dtype == np.int32 and packed.shape == (g, n * bits // 32)
    np.testing.assert_array_equal(packed, ref_marlin_zero_points(z, bits))
    out = marlin_unpack_zero_points(packed, n, bits)
    assert out.dtype == np.uint8
    np.testing.assert_array_equal(out, z)


def test_marlin_zero_points_hand_words():
    # 4 bits, z[n] = n // 4. Word 0: grouped permutation new[j] = old[8j]
    # -> [0, 2, 4, 6, 8, 10, 12, 14]; interleave [0,2,4,6,1,3,5,7] ->
    # [0, 4, 8, 12, 2, 6, 10, 14], nibble 0 lowest -> 0xEA62C840.
    # Word 4 (i = 4): old[4 + 8j] // 4 = 2j + 1 -> [1, 5, 9, 13, 3, 7, 11, 15]
    # -> 0xFB73D951.
    z = (np.arange(64) // 4)[None, :]
    packed = marlin_pack_zero_points(z, 4).view(np.uint32)
    assert packed[0, 0] == 0xEA62C840 and packed[0, 4] == 0xFB73D951
    # 8 bits, z[n] = 4n. Word 0: old[0, 8, 16, 24] = [0, 32, 64, 96];
    # interleave [0, 2, 1, 3] -> [0, 64, 32, 96] -> 0x60204000.
    packed = marlin_pack_zero_points(4 * np.arange(64)[None, :], 8).view(np.uint32)
    assert packed[0, 0] == 0x60204000


# ---------------------------------------------------------------------------
# C. GPTQ
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("k,n", [(32, 3), (64, 128)])
def test_gptq_pack_matches_reference(bits, k, n):
    q = codes(k, n, bits)
    qweight = gptq_pack(q, bits)
    assert qweight.dtype == np.int32 and qweight.shape == (k * bits // 32, n)
    np.testing.assert_array_equal(qweight, ref_gptq_pack(q, bits))
    np.testing.assert_array_equal(gptq_unpack(qweight, bits), q)
    np.testing.assert_array_equal(gptq_unpack(qweight.view(np.uint32), bits), q)


def test_gptq_4bit_general_equals_int4_functions():
    q = codes(64, 64, 4)
    np.testing.assert_array_equal(gptq_pack(q, 4), gptq_pack_int4(q))
    np.testing.assert_array_equal(
        repack_gptq_to_marlin_bits(gptq_pack(q, 4), 64, 64, 4), repack_gptq_to_marlin(gptq_pack(q, 4), 64, 64)
    )


def test_gptq_hand_computed_8bit_and_zeros():
    # 8 bits: column 0 rows 0..3 = 1, 2, 3, 255 -> bytes 01 02 03 FF,
    # row 0 lowest -> 0xFF030201.
    q = np.zeros((4, 2), dtype=np.uint8)
    q[:, 0] = [1, 2, 3, 255]
    assert gptq_pack(q, 8)[0, 0] == to_int32(0xFF030201)
    # qzeros of a symmetric 4-bit checkpoint: stored 7 everywhere (zero 8 - 1)
    # -> 0x77777777; zero points are stored + 1 = 8.
    qzeros = np.full((2, 1), 0x77777777, dtype=np.int32)
    assert gptq_unpack_zeros(qzeros, 4).tolist() == [[7] * 8] * 2
    assert gptq_zero_points(qzeros, 4).tolist() == [[8] * 8] * 2
    # 8 bits: word 0x7F7F7F7F -> stored 127 -> zero 128. Word 0x000102FF:
    # values (lowest byte first) 0xFF, 2, 1, 0 -> zero points 0 (masked), 3, 2, 1.
    qzeros = np.array([[0x7F7F7F7F, 0x000102FF]], dtype=np.uint32)
    assert gptq_zero_points(qzeros, 8).tolist() == [[128] * 4 + [0, 3, 2, 1]]
    # Column order inside a 4-bit word: 0x87654321 -> columns 1..8 stored 1..8.
    assert gptq_unpack_zeros(np.array([[to_int32(0x87654321)]], np.int32), 4).tolist() == [
        list(range(1, 9))
    ]


def test_gptq_reference_dequant_hand_value():
    # 4 bits, K=32, N=8, group 32: q[3, 2] = 11, scale 0.5. Symmetric: zero 8
    # -> (11 - 8) * 0.5 = 1.5. Asymmetric with stored zero 4 (zero 5) for
    # column 2: (11 - 5) * 0.5 = 3.0.
    q = np.full((32, 8), 8, dtype=np.uint8)
    q[3, 2] = 11
    s = np.full((1, 8), 0.5, dtype=np.float16)
    qweight = gptq_pack(q, 4)
    assert gptq_reference_dequant(qweight, s, bits=4, group_size=32)[3, 2] == 1.5
    stored = np.full((1, 8), 7)
    stored[0, 2] = 4
    qzeros = ref_pack_along_n(stored, 4)
    w = gptq_reference_dequant(qweight, s, qzeros, bits=4, sym=False, group_size=32)
    assert w[3, 2] == 3.0 and w[0, 0] == 0.0


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("group_size", [32, -1])
@pytest.mark.parametrize("act_order", [False, True])
@pytest.mark.parametrize("sym", [True, False])
def test_gptq_reference_dequant_matches_loop(bits, group_size, act_order, sym):
    k, n = 64, 16
    gs = k if group_size == -1 else group_size
    groups = k // gs
    q = codes(k, n, bits)
    s = fp16_scales(groups, n)
    g_idx = rng().permutation(np.arange(k) // gs).astype(np.int32) if act_order else None
    group_of_row = g_idx if act_order else np.arange(k) // gs
    if sym:
        qzeros = None
        zero = np.full((groups, n), 1 << (bits - 1))
    else:
        zero = codes(groups, n, bits, seed=SEED + 1) % ((1 << bits) - 1) + 1  # 1..2^bits-1
        qzeros = ref_pack_along_n((zero - 1), bits)
    got = gptq_reference_dequant(gptq_pack(q, bits), s, qzeros, g_idx, bits, sym, group_size)
    assert got.dtype == np.float64 and got.shape == (k, n)
    np.testing.assert_array_equal(got, ref_dequant_loop(q, zero, s, group_of_row))


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("group_size", [32, 128, -1])
def test_gptq_to_marlin_decodes_to_reference(bits, group_size, tiny_steps):
    k, n = 128, 128
    groups = 1 if group_size == -1 else k // group_size
    qweight = gptq_pack(codes(k, n, bits), bits)
    s = fp16_scales(groups, n)
    packed = repack_gptq_to_marlin_bits(qweight, k, n, bits)
    assert packed.shape == (k // 16, bits // 2 * n)
    scales = gptq.repack_scales_to_marlin(s, k, n, group_size)
    decoded = decode_marlin_int(packed, scales, None, k, n, bits, group_size, 1 << (bits - 1))
    np.testing.assert_array_equal(decoded, gptq_reference_dequant(qweight, s, bits=bits, group_size=group_size))


def test_gptq_8bit_marlin_equals_layout_a():
    q = codes(64, 128, 8)
    np.testing.assert_array_equal(repack_gptq_to_marlin_bits(gptq_pack(q, 8), 64, 128, 8), ref_marlin_pack8(q))


def test_permute_rows_8bit():
    q = codes(32, 8, 8)
    perm = rng().permutation(32)
    moved = gptq_unpack(permute_gptq_qweight_rows(gptq_pack(q, 8), perm, bits=8), 8)
    np.testing.assert_array_equal(moved, q[perm])


# ---------------------------------------------------------------------------
# D. AWQ
# ---------------------------------------------------------------------------
AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]


def test_awq_hand_words():
    # Nibble i holds column AWQ_ORDER[i]. Word 0x76543210 (nibble i = i):
    # column 0 <- nibble 0 = 0, column 1 <- nibble 4 = 4, column 2 <- nibble
    # 1 = 1, ... -> columns [0, 4, 1, 5, 2, 6, 3, 7].
    word = np.array([[0x76543210]], dtype=np.int32)
    assert awq_unpack(word).tolist() == [[0, 4, 1, 5, 2, 6, 3, 7]]
    assert awq_unpack_zeros(word).tolist() == [[0, 4, 1, 5, 2, 6, 3, 7]]
    assert awq_pack(np.array([[0, 4, 1, 5, 2, 6, 3, 7]]))[0, 0] == 0x76543210
    # Columns 0..7 holding 1..8 -> nibbles [1, 3, 5, 7, 2, 4, 6, 8] -> 0x86427531.
    assert awq_pack(np.arange(1, 9)[None, :])[0, 0] == to_int32(0x86427531)


def test_awq_reference_dequant_hand_value():
    # Row 0 word 0x76543210 -> column 1 holds q = 4; zeros 0x11111111 -> 1 in
    # every column (as stored, no +1); scale 0.25 -> (4 - 1) * 0.25 = 0.75.
    # Row 1 all 1 -> 0.0.
    qweight = np.array([[0x76543210]] + [[0x11111111]] * 31, dtype=np.int32)
    qzeros = np.array([[0x11111111]], dtype=np.int32)
    s = np.full((1, 8), 0.25, dtype=np.float16)
    w = awq_reference_dequant(qweight, s, qzeros, 32)
    assert w[0, 1] == 0.75 and w[0, 0] == -0.25 and w[1, 5] == 0.0


@pytest.mark.parametrize("k,n", [(1, 8), (5, 24), (64, 128)])
def test_awq_pack_matches_reference(k, n):
    q = codes(k, n, 4)
    qweight = awq_pack(q)
    np.testing.assert_array_equal(qweight, ref_pack_along_n(q, 4, AWQ_ORDER))
    np.testing.assert_array_equal(awq_unpack(qweight), q)
    np.testing.assert_array_equal(awq_unpack_zeros(qweight), q)


@pytest.mark.parametrize("group_size", [32, 64, 128, -1])
def test_awq_to_marlin_decodes_to_reference(group_size, tiny_steps):
    k, n = 128, 192
    groups = 1 if group_size == -1 else k // group_size
    q, z, s = codes(k, n, 4), codes(groups, n, 4, SEED + 1), fp16_scales(groups, n)
    qweight, qzeros = awq_pack(q), awq_pack(z)
    reference = awq_reference_dequant(qweight, s, qzeros, group_size)
    np.testing.assert_array_equal(reference, ref_dequant_loop(q, z, s, np.arange(k) // (k // groups)))
    packed, scales, zero_points = awq_to_marlin(qweight, s, qzeros, group_size)
    assert packed.shape == (k // 16, 2 * n) and scales.dtype == np.float16
    assert zero_points.dtype == np.int32 and zero_points.shape == (groups, n // 8)
    np.testing.assert_array_equal(marlin_unpack_int4(packed, k, n), q)
    np.testing.assert_array_equal(decode_marlin_int(packed, scales, zero_points, k, n, 4, group_size), reference)


# ---------------------------------------------------------------------------
# E. compressed-tensors pack-quantized
# ---------------------------------------------------------------------------
def ref_ct_pack(signed: np.ndarray, bits: int) -> np.ndarray:
    per = 32 // bits
    rows, cols = signed.shape
    words = -(-cols // per)
    out = np.zeros((rows, words), dtype=np.int64)
    for r in range(rows):
        for w in range(words):
            vals = [
                int(signed[r, w * per + i]) + (1 << (bits - 1)) if w * per + i < cols else 0
                for i in range(per)
            ]
            out[r, w] = pack_word(vals, bits)
    return out.astype(np.int32)


def signed_values(rows: int, cols: int, bits: int, seed: int = SEED) -> np.ndarray:
    half = 1 << (bits - 1)
    return rng(seed).integers(-half, half, size=(rows, cols)).astype(np.int8)


def test_ct_hand_words():
    # compressed-tensors' own example: INT8 [1, 2] -> stored [129, 130], padded
    # with 0 -> 0x00008281 = 33409.
    assert ct_pack(np.array([[1, 2]], np.int8), 8).tolist() == [[33409]]
    assert ct_unpack(np.array([[33409]], np.int32), 8, (1, 2)).tolist() == [[1, 2]]
    # INT4 word 0x76543210 along K: stored 0..7 -> signed -8..-1.
    assert ct_unpack(np.array([[0x76543210]], np.int32), 4).tolist() == [list(range(-8, 0))]
    # Zero points pack along N_out: zp[n, 0] = n - 8 for 8 outputs -> stored n
    # -> one word 0x76543210 of shape [1, 1].
    zp = (np.arange(8) - 8)[:, None].astype(np.int8)
    assert ct_pack_zero_points(zp, 4).tolist() == [[0x76543210]]
    assert ct_unpack_zero_points(np.array([[0x76543210]], np.int32), 4, 8)[:, 0].tolist() == list(range(-8, 0))


def test_ct_reference_dequant_hand_value():
    # N_out=1, K_in=32, INT4 symmetric, channel scale 0.5: word 0 = 0x76543210
    # -> q[0, 1] = 1 - 8 = -7 -> W[1, 0] = -3.5. Asymmetric with zp = -8
    # (stored 0): (-7 + 8) * 0.5 = 0.5.
    weight_packed = np.array([[0x76543210, 0, 0, 0]], np.int32)
    s = np.array([[0.5]], np.float32)
    assert ct_reference_dequant(weight_packed, s)[1, 0] == -3.5
    zp = np.zeros((1, 1), np.int32)  # stored 0 -> zp -8
    assert ct_reference_dequant(weight_packed, s, zp)[1, 0] == 0.5


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("rows,cols", [(3, 8), (5, 13), (64, 128)])
def test_ct_pack_matches_reference(bits, rows, cols):
    v = signed_values(rows, cols, bits)
    packed = ct_pack(v, bits)
    np.testing.assert_array_equal(packed, ref_ct_pack(v, bits))
    np.testing.assert_array_equal(ct_unpack(packed, bits, (rows, cols)), v)
    np.testing.assert_array_equal(ct_unpack(packed, bits, np.array([rows, cols], np.int32)), v)
    zp = ct_pack_zero_points(v, bits)
    np.testing.assert_array_equal(zp, ref_ct_pack(v.T, bits).T)
    np.testing.assert_array_equal(ct_unpack_zero_points(zp, bits, rows), v)


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("group_size", [32, 128, -1])
@pytest.mark.parametrize("asym", [False, True])
def test_ct_to_marlin_decodes_to_reference(bits, group_size, asym, tiny_steps):
    n, k = 128, 128
    groups = 1 if group_size == -1 else k // group_size
    v = signed_values(n, k, bits)
    scale = rng(SEED + 2).uniform(0.001, 0.1, size=(n, groups)).astype(np.float32)
    zp = signed_values(n, groups, bits, SEED + 3) if asym else None
    weight_packed = ct_pack(v, bits)
    zp_packed = ct_pack_zero_points(zp, bits) if asym else None
    reference = ct_reference_dequant(weight_packed, scale, zp_packed, bits, weight_shape=(n, k))
    # W[k, n] = (q[n, k] - zp[n, g]) * s[n, g], checked loop by loop.
    zero = np.zeros((n, groups), int) if zp is None else zp
    loop = ref_dequant_loop(v.T, zero.T, scale.T, np.arange(k) // (k // groups))
    np.testing.assert_array_equal(reference, loop)
    explicit = ct_reference_dequant(weight_packed, scale, zp_packed, bits, group_size=group_size)
    np.testing.assert_array_equal(explicit, reference)

    packed, scales, zero_points = ct_to_marlin(weight_packed, scale, zp_packed, bits, group_size)
    assert packed.shape == (k // 16, bits // 2 * n) and scales.shape == (groups, n)
    assert (zero_points is None) == (not asym)
    # Scales become fp16; compare against the reference with those scales.
    scale16 = scale.astype(np.float16).astype(np.float32)
    reference16 = ct_reference_dequant(weight_packed, scale16, zp_packed, bits)
    decoded = decode_marlin_int(packed, scales, zero_points, k, n, bits, group_size, 1 << (bits - 1))
    np.testing.assert_array_equal(decoded, reference16)


def test_ct_bfloat16_scales():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    v = signed_values(64, 32, 4)
    s = np.full((64, 1), 0.375, dtype=ml_dtypes.bfloat16)
    w = ct_reference_dequant(ct_pack(v, 4), s)
    np.testing.assert_array_equal(w, v.T * 0.375)


# ---------------------------------------------------------------------------
# F. FP8
# ---------------------------------------------------------------------------
def test_e4m3_hand_values():
    # 0x38: e=7, m=0 -> 1.0; 0x7E: e=15, m=6 -> 1.75 * 2^8 = 448 (largest);
    # 0x01: subnormal 1/8 * 2^-6 = 2^-9; 0x08: e=1 -> 2^-6; 0xB9: sign,
    # e=7, m=1 -> -1.125; 0x80: -0.0; 0x7F / 0xFF: NaN.
    b = np.array([0x38, 0x7E, 0x01, 0x08, 0xB9, 0x80, 0x7F, 0xFF], np.uint8)
    expected = [1.0, 448.0, 2.0**-9, 2.0**-6, -1.125, -0.0]
    for decode in (e4m3_decode_bits, e4m3_to_float):
        out = decode(b)
        assert out.dtype == np.float32
        assert out[:6].tolist() == expected and np.signbit(out[5])
        assert np.isnan(out[6:]).all()
    # Kernel conversion of 0x38: bits 0x38 << 7 = 0x1C00 = fp16 2^(7-15) = 2^-8.
    assert e4m3_to_kernel_fp16(b[:1]).view(np.uint16)[0] == 0x1C00
    assert e4m3_to_kernel_fp16(b[:1])[0] == np.float16(2.0**-8)


def test_e4m3_decoders_agree_on_every_byte():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    b = np.arange(256, dtype=np.uint8)
    via_library = b.view(ml_dtypes.float8_e4m3fn).astype(np.float32)
    bits = e4m3_decode_bits(b)
    assert np.array_equal(via_library, bits, equal_nan=True)
    assert np.array_equal(np.signbit(via_library), np.signbit(bits))
    assert np.array_equal(e4m3_to_float(b), bits, equal_nan=True)
    assert np.array_equal(e4m3_to_float(b.view(ml_dtypes.float8_e4m3fn)), bits, equal_nan=True)


def test_e4m3_to_float_without_ml_dtypes(monkeypatch):
    # ml_dtypes is optional at run time: the bit-level decoder takes over.
    monkeypatch.setattr(fp8, "_E4M3FN", None)
    b = np.arange(256, dtype=np.uint8)
    assert np.array_equal(e4m3_to_float(b), e4m3_decode_bits(b), equal_nan=True)


def test_kernel_fp16_is_value_times_two_to_minus_8():
    b = np.arange(256, dtype=np.uint8)
    finite = ~np.isin(b, [0x7F, 0xFF])
    kernel = e4m3_to_kernel_fp16(b).astype(np.float64)
    assert FP8_EXPONENT_BIAS_FACTOR == 256.0
    np.testing.assert_array_equal(kernel[finite] * FP8_EXPONENT_BIAS_FACTOR, e4m3_decode_bits(b)[finite])


def fp8_weight(n: int, k: int, seed: int = SEED) -> np.ndarray:
    w = rng(seed).integers(0, 256, size=(n, k)).astype(np.uint8)
    w[np.isin(w, [0x7F, 0xFF])] = 0x38
    return w


def decode_marlin_fp8(packed, scales, n, k, group_size) -> np.ndarray:
    """Kernel semantics in float32: fp16(byte) * fp16 scale (which includes 256)."""
    b = marlin_unpack_int8(packed, k, n)
    values = e4m3_to_kernel_fp16(b).astype(np.float32)
    s = marlin_unpermute_scales(scales, group_size).astype(np.float32)
    g = np.arange(k) // (k if group_size == -1 else group_size)
    return values * s[g]


@pytest.mark.parametrize(
    "scale_kind", ["tensor-0d", "tensor-1", "python-float", "channel-n", "channel-n1", "block", "block-bf16-bytes"]
)
def test_fp8_prepare_decodes_to_reference(scale_kind, tiny_steps):
    n, k = 192, 256
    w = fp8_weight(n, k)
    # Power-of-two-ish scales keep scale * 256 exact in fp16.
    block = None
    if scale_kind == "tensor-0d":
        scale = np.array(0.0078125, np.float32)
    elif scale_kind == "tensor-1":
        scale = np.array([0.375], np.float32)
    elif scale_kind == "python-float":
        scale = 0.375
    elif scale_kind.startswith("channel"):
        scale = (rng().integers(1, 64, size=n) / 1024).astype(np.float32)
        scale = scale[:, None] if scale_kind == "channel-n1" else scale
    else:
        block = (128, 128)
        scale = (rng().integers(1, 64, size=(2, 2)) / 4096).astype(np.float32)
        if scale_kind == "block-bf16-bytes":
            scale = (scale.view(np.uint32) >> 16).astype("<u2").tobytes()
    packed, scales = prepare_fp8_weight_for_marlin(w, scale, block)
    group_size = -1 if block is None else 128
    assert packed.shape == (k // 16, 4 * n) and scales.dtype == np.float16
    assert scales.shape == ((1, n) if block is None else (k // 128, n))
    np.testing.assert_array_equal(marlin_unpack_int8(packed, k, n), w.T)
    reference = fp8_reference_dequant(w, scale, block)
    assert reference.shape == (k, n) and reference.dtype == np.float64
    np.testing.assert_array_equal(decode_marlin_fp8(packed, scales, n, k, group_size), reference)


def test_fp8_reference_dequant_hand_value():
    # weight[1, 2] = 0x40 (e=8, m=0 -> 2.0); block scale of block (0, 0) =
    # 0.25 -> W[2, 1] = 0.5; weight[130, 0] = 0xB8 (-1.0) in block row 1 with
    # scale 3.0 -> W[0, 130] = -3.0.
    w = np.zeros((192, 128), np.uint8)
    w[1, 2], w[130, 0] = 0x40, 0xB8
    out = fp8_reference_dequant(w, np.array([[0.25], [3.0]]), (128, 128))
    assert out[2, 1] == 0.5 and out[0, 130] == -3.0 and out[0, 0] == 0.0


# The seeds' fixture qwen36_a3_fp8_marlin_moe_ffi_matches_cpu_reference_for_four_cases.
LCG_MULTIPLIER = 0x5851_F42D_4C95_7F2D
LCG_INCREMENT = 0x1405_7B7E_F767_814F
ROOT_SEED = 0x5147_454E_3338_4650
SHAPE_SEED_XOR = 0x9E37_79B9_7F4A_7C15
WEIGHT_SEED_XOR = 0x5745_4947_4854_5F31
SCALE_SEED_XOR = 0x5343_414C_455F_5F31
MASK64 = (1 << 64) - 1


class Lcg:
    def __init__(self, shape_index: int, stream_xor: int):
        self.state = ROOT_SEED ^ (((shape_index + 1) * SHAPE_SEED_XOR) & MASK64) ^ stream_xor
        self.next()

    def next(self) -> int:
        self.state = (self.state * LCG_MULTIPLIER + LCG_INCREMENT) & MASK64
        return self.state


def seed_fixture(shape_index: int, n: int, k: int):
    scales = Lcg(shape_index, SCALE_SEED_XOR)
    rows, cols = -(-n // 128), -(-k // 128)
    bf16_bits = [0x3B80 + 0x20 * (scales.next() % 5) for _ in range(rows * cols)]
    inverse_scale_bytes = np.array(bf16_bits, "<u2").tobytes()
    weights = Lcg(shape_index, WEIGHT_SEED_XOR)
    source = np.zeros(n * k, np.uint8)
    for index in range(n * k):
        word = weights.next()
        if word & 0x0F:
            tier = ((index // k) % 8) // 2
            source[index] = (0x20 + tier * 8 + ((word >> 9) & 0x07)) | ((word >> 31) & 0x80)
    return source, inverse_scale_bytes, np.array(bf16_bits, np.uint32)


@pytest.mark.parametrize("shape_index,n,k", [(0, 256, 128), (1, 256, 256)])
def test_fp8_seed_fixture(shape_index, n, k):
    source, inverse_scale_bytes, bf16_bits = seed_fixture(shape_index, n, k)
    # The seed's CPU reference: f32(e4m3) * f32(bf16 scale of block (n//128, k//128)).
    cols = -(-k // 128)
    scale_f32 = (bf16_bits << 16).view(np.float32)
    index_n, index_k = np.meshgrid(np.arange(n), np.arange(k), indexing="ij")
    expected = e4m3_to_float(source).reshape(n, k) * scale_f32[(index_n // 128) * cols + index_k // 128]
    assert expected.dtype == np.float32 and np.count_nonzero(expected) > n * k // 2

    packed, scales = prepare_block_fp8_weight_for_fp8_marlin(source.tobytes(), inverse_scale_bytes, n, k, (128, 128))
    decoded = decode_marlin_fp8(packed, scales, n, k, 128)  # [K, N]
    assert decoded.dtype == np.float32
    np.testing.assert_array_equal(decoded.view(np.uint32), np.ascontiguousarray(expected.T).view(np.uint32))
    np.testing.assert_array_equal(
        fp8_reference_dequant(source.reshape(n, k), inverse_scale_bytes, (128, 128)), expected.T.astype(np.float64)
    )
    # The same through ndarray inputs (bf16 ndarray scales when available).
    again = prepare_block_fp8_weight_for_fp8_marlin(source.reshape(n, k), scale_f32.reshape(-1, cols), n, k)
    np.testing.assert_array_equal(again[0], packed)
    np.testing.assert_array_equal(again[1], scales)


def test_fp8_bfloat16_ndarray_scales():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    w = fp8_weight(128, 128)
    s = np.array([[0.0625]], dtype=ml_dtypes.bfloat16)
    packed, scales = prepare_block_fp8_weight_for_fp8_marlin(w, s, 128, 128)
    assert (scales == np.float16(16.0)).all()
    np.testing.assert_array_equal(fp8_reference_dequant(w.view(ml_dtypes.float8_e4m3fn), s, (128, 128)),
                                  e4m3_decode_bits(w).T.astype(np.float64) * 0.0625)


# ---------------------------------------------------------------------------
# G. Validation: each rule rejects, naming the argument; the valid neighbour passes.
# ---------------------------------------------------------------------------
C8 = codes(32, 64, 8)
M8 = marlin_pack_int8(C8)
Z4 = codes(2, 64, 4)
PZ4 = marlin_pack_zero_points(Z4, 4)
QW4, QW8 = gptq_pack(codes(64, 64, 4), 4), gptq_pack(codes(64, 64, 8), 8)
S2 = fp16_scales(2, 64)
S1 = fp16_scales(1, 64)
QZ4 = ref_pack_along_n(np.full((2, 64), 7), 4)
AQ = awq_pack(codes(64, 64, 4))
AZ = awq_pack(codes(2, 64, 4))
CTW = ct_pack(signed_values(64, 64, 4), 4)
CTS = np.full((64, 2), 0.5, np.float32)
CTZ = ct_pack_zero_points(signed_values(64, 2, 4), 4)
FW = fp8_weight(64, 128)
FB = np.full((1, 1), 0.5, np.float32)


def _with(a: np.ndarray, index, value) -> np.ndarray:
    a = a.copy()
    a[index] = value
    return a


REJECTIONS = [
    # A. marlin_pack_int8 / marlin_unpack_int8
    (lambda: marlin_pack_int8(C8.tolist()), ArgumentTypeError, "marlin_pack_int8: codes must be a numpy.ndarray",
     lambda: marlin_pack_int8(C8)),
    (lambda: marlin_pack_int8(C8.astype(np.float32)), ArgumentTypeError, "codes must have an integer dtype",
     lambda: marlin_pack_int8(C8.astype(np.int16))),
    (lambda: marlin_pack_int8(_with(C8.astype(np.int16), (0, 0), 256)), ArgumentError,
     "codes values must be in 0..255", lambda: marlin_pack_int8(_with(C8.astype(np.int16), (0, 0), 255))),
    (lambda: marlin_pack_int8(C8[:24]), ArgumentError, "codes.shape[0]=24 must be a multiple of 16",
     lambda: marlin_pack_int8(C8[:16])),
    (lambda: marlin_pack_int8(codes(16, 96, 8)), ArgumentError, "codes.shape[1]=96 must be a multiple of 64",
     lambda: marlin_pack_int8(codes(16, 128, 8))),
    (lambda: marlin_unpack_int8(M8, 32, 128), ArgumentError, "marlin_unpack_int8: packed must have shape (2, 512)",
     lambda: marlin_unpack_int8(M8, 32, 64)),
    (lambda: marlin_unpack_int8(M8.astype(np.int64), 32, 64), ArgumentTypeError, "packed must have a 32-bit",
     lambda: marlin_unpack_int8(M8.view(np.uint32), 32, 64)),
    (lambda: marlin_unpack_int8(M8, 40, 64), ArgumentError, "k=40 must be a multiple of 16",
     lambda: marlin_unpack_int8(M8, 32, 64)),
    # B. zero points
    (lambda: marlin_pack_zero_points(Z4, 2), ArgumentError, "marlin_pack_zero_points: bits=2 must be 4 or 8",
     lambda: marlin_pack_zero_points(Z4, 8)),
    (lambda: marlin_pack_zero_points(Z4, 4.0), ArgumentTypeError, "bits must be an int",
     lambda: marlin_pack_zero_points(Z4, np.int32(4))),
    (lambda: marlin_pack_zero_points(_with(Z4, (0, 0), 16), 4), ArgumentError, "zero_points values must be in 0..15",
     lambda: marlin_pack_zero_points(_with(Z4, (0, 0), 16), 8)),
    (lambda: marlin_pack_zero_points(codes(2, 32, 4), 4), ArgumentError,
     "zero_points.shape[1]=32 must be a multiple of 64", lambda: marlin_pack_zero_points(codes(2, 64, 4), 4)),
    (lambda: marlin_pack_zero_points(Z4[0], 4), ArgumentError, "zero_points must be 2-D",
     lambda: marlin_pack_zero_points(Z4[:1], 4)),
    (lambda: marlin_unpack_zero_points(PZ4, 128, 4), ArgumentError,
     "marlin_unpack_zero_points: packed must have shape (2, 16)", lambda: marlin_unpack_zero_points(PZ4, 64, 4)),
    (lambda: marlin_unpack_zero_points(PZ4, 64, 8), ArgumentError, "packed must have shape (2, 16)",
     lambda: marlin_unpack_zero_points(np.zeros((2, 16), np.int32), 64, 8)),
    (lambda: marlin_unpack_zero_points(PZ4.astype(np.int16), 64, 4), ArgumentTypeError, "packed must have a 32-bit",
     lambda: marlin_unpack_zero_points(PZ4, 64, 4)),
    # C. GPTQ
    (lambda: gptq_unpack(QW4, 3), ArgumentError, "gptq_unpack: bits=3 must be 4 or 8",
     lambda: gptq_unpack(QW4, 4)),
    (lambda: gptq_unpack(QW4.astype(np.int64), 4), ArgumentTypeError, "qweight must have a 32-bit",
     lambda: gptq_unpack(QW4.view(np.uint32), 4)),
    (lambda: gptq_pack(codes(10, 4, 8), 8), ArgumentError, "gptq_pack: codes.shape[0]=10 must be a multiple of 4",
     lambda: gptq_pack(codes(12, 4, 8), 8)),
    (lambda: gptq_pack(codes(8, 4, 8), 4), ArgumentError, "codes values must be in 0..15",
     lambda: gptq_pack(codes(8, 4, 4), 4)),
    (lambda: gptq_unpack_zeros(QZ4[0], 4), ArgumentError, "gptq_unpack_zeros: qzeros must be 2-D",
     lambda: gptq_unpack_zeros(QZ4, 4)),
    (lambda: gptq_zero_points(QZ4.astype(np.float32), 4), ArgumentTypeError, "qzeros must have a 32-bit",
     lambda: gptq_zero_points(QZ4, 4)),
    (lambda: gptq_reference_dequant(QW4, S2, group_size=48), ArgumentError,
     "gptq_reference_dequant: group_size=48 must be -1, 32, 64 or a power of two >= 128",
     lambda: gptq_reference_dequant(QW4, S2, group_size=32)),
    (lambda: gptq_reference_dequant(QW4, S2, group_size=128), ArgumentError, "k=64 must be a multiple of group_size=128",
     lambda: gptq_reference_dequant(QW4, S1, group_size=64)),
    (lambda: gptq_reference_dequant(QW4, S1, group_size=32), ArgumentError, "scales must have shape (2, 64)",
     lambda: gptq_reference_dequant(QW4, S1, group_size=-1)),
    (lambda: gptq_reference_dequant(QW4, S2.astype(np.int32), group_size=32), ArgumentTypeError,
     "scales must have a floating dtype", lambda: gptq_reference_dequant(QW4, S2.astype(np.float64), group_size=32)),
    (lambda: gptq_reference_dequant(QW4, S2, sym=False, group_size=32), ArgumentError,
     "qzeros is required when sym=False", lambda: gptq_reference_dequant(QW4, S2, QZ4, sym=False, group_size=32)),
    (lambda: gptq_reference_dequant(QW4, S2, QZ4[:1], group_size=32), ArgumentError, "qzeros must have shape (2, 8)",
     lambda: gptq_reference_dequant(QW4, S2, QZ4, group_size=32)),
    (lambda: gptq_reference_dequant(QW4, S2, QZ4 + 1, group_size=32), ArgumentError,
     "qzeros must hold the zero point 8 (stored 7) when sym=True",
     lambda: gptq_reference_dequant(QW4, S2, QZ4 + 1, sym=False, group_size=32)),
    (lambda: gptq_reference_dequant(QW4, S2, sym=1, group_size=32), ArgumentTypeError, "sym must be a bool",
     lambda: gptq_reference_dequant(QW4, S2, sym=np.bool_(True), group_size=32)),
    (lambda: gptq_reference_dequant(QW4, S2, g_idx=np.arange(64) // 32 + 1, group_size=32), ArgumentError,
     "g_idx values must be in 0..1", lambda: gptq_reference_dequant(QW4, S2, g_idx=np.arange(64) // 32, group_size=32)),
    (lambda: gptq_reference_dequant(QW4, S2, g_idx=_with(np.arange(64) // 32, 0, 1), group_size=32), ArgumentError,
     "g_idx must give every group exactly group_size=32 rows",
     lambda: gptq_reference_dequant(QW4, S2, g_idx=_with(_with(np.arange(64) // 32, 0, 1), 63, 0), group_size=32)),
    (lambda: gptq_reference_dequant(QW4, S2, g_idx=np.arange(32) // 16, group_size=32), ArgumentError,
     "g_idx must have shape (64,)", lambda: gptq_reference_dequant(QW4, S2, g_idx=np.arange(64) // 32, group_size=32)),
    (lambda: gptq_reference_dequant(QW4, S2, g_idx=(np.arange(64) // 32).astype(float), group_size=32),
     ArgumentTypeError, "g_idx must have an integer dtype",
     lambda: gptq_reference_dequant(QW4, S2, g_idx=(np.arange(64) // 32).astype(np.int32), group_size=32)),
    (lambda: repack_gptq_to_marlin_bits(QW8, 64, 64, 4), ArgumentError,
     "repack_gptq_to_marlin_bits: qweight must have shape (8, 64)", lambda: repack_gptq_to_marlin_bits(QW8, 64, 64, 8)),
    (lambda: repack_gptq_to_marlin_bits(QW8, 64, 96, 8), ArgumentError, "n=96 must be a multiple of 64",
     lambda: repack_gptq_to_marlin_bits(QW8, 64, 64, 8)),
    (lambda: repack_gptq_to_marlin_bits(QW8, 64, 64, 16), ArgumentError, "bits=16 must be 4 or 8",
     lambda: repack_gptq_to_marlin_bits(QW8, 64, 64, 8)),
    (lambda: permute_gptq_qweight_rows(QW8, np.arange(64), bits=4), ArgumentError,
     "perm must have shape (128,) (K = 8 * qweight.shape[0])",
     lambda: permute_gptq_qweight_rows(QW8, np.arange(64), bits=8)),
    # D. AWQ
    (lambda: awq_unpack(AQ.astype(np.int64)), ArgumentTypeError, "awq_unpack: qweight must have a 32-bit",
     lambda: awq_unpack(AQ.view(np.uint32))),
    (lambda: awq_unpack(AQ[:, :0]), ArgumentError, "qweight.shape[1]=0 must be positive",
     lambda: awq_unpack(AQ[:, :1])),
    (lambda: awq_pack(codes(4, 12, 4)), ArgumentError, "awq_pack: codes.shape[1]=12 must be a multiple of 8",
     lambda: awq_pack(codes(4, 16, 4))),
    (lambda: awq_pack(codes(4, 8, 8)), ArgumentError, "codes values must be in 0..15",
     lambda: awq_pack(codes(4, 8, 4))),
    (lambda: awq_reference_dequant(AQ, S2, AZ, 16), ArgumentError,
     "awq_reference_dequant: group_size=16 must be -1, 32, 64 or a power of two >= 128", lambda: awq_reference_dequant(AQ, S2, AZ, 32)),
    (lambda: awq_reference_dequant(AQ, S2, AZ, -1), ArgumentError, "scales must have shape (1, 64)",
     lambda: awq_reference_dequant(AQ, S1, AZ[:1], -1)),
    (lambda: awq_reference_dequant(AQ, S1, AZ, -1), ArgumentError, "qzeros must have shape (1, 8)",
     lambda: awq_reference_dequant(AQ, S1, AZ[:1], -1)),
    (lambda: awq_to_marlin(AQ[:40], S1, AZ[:1], -1), ArgumentError, "awq_to_marlin: k = qweight.shape[0]=40 must be a multiple of 16",
     lambda: awq_to_marlin(AQ[:48], S1, AZ[:1], -1)),
    (lambda: awq_to_marlin(AQ[:, :4], S2[:, :32], AZ[:, :4], 32), ArgumentError,
     "n = 8 * qweight.shape[1]=32 must be a multiple of 64", lambda: awq_to_marlin(AQ, S2, AZ, 32)),
    (lambda: awq_to_marlin(AQ, _with(S2, (0, 0), np.inf), AZ, 32), ArgumentError,
     "awq_to_marlin: scales must be finite in float16",
     lambda: awq_to_marlin(AQ, _with(S2, (0, 0), 1e4), AZ, 32)),
    # E. compressed-tensors
    (lambda: ct_unpack(CTW, 5), ArgumentError, "ct_unpack: bits=5 must be 4 or 8", lambda: ct_unpack(CTW, 8)),
    (lambda: ct_unpack(CTW, 4, (64, 72)), ArgumentError, "weight_shape[1]=72 must be in 57..64",
     lambda: ct_unpack(CTW, 4, (64, 57))),
    (lambda: ct_unpack(CTW, 4, (63, 64)), ArgumentError, "weight_shape[0]=63 must equal weight_packed.shape[0]=64",
     lambda: ct_unpack(CTW, 4, (64, 64))),
    (lambda: ct_unpack(CTW, 4, (64,)), ArgumentError, "weight_shape must hold 2 values",
     lambda: ct_unpack(CTW, 4, [64, 64])),
    (lambda: ct_unpack(CTW, 4, "64x64"), ArgumentTypeError, "weight_shape must be a numpy.ndarray, tuple or list",
     lambda: ct_unpack(CTW, 4, np.array([64, 64]))),
    (lambda: ct_pack(np.array([[8]]), 4), ArgumentError, "ct_pack: q values must be in -8..7 for bits=4",
     lambda: ct_pack(np.array([[7]]), 4)),
    (lambda: ct_pack(np.array([[-129]]), 8), ArgumentError, "values must be in -128..127",
     lambda: ct_pack(np.array([[-128]]), 8)),
    (lambda: ct_unpack_zero_points(CTZ, 4, 72), ArgumentError,
     "ct_unpack_zero_points: weight_zero_point must have shape (9, 2)", lambda: ct_unpack_zero_points(CTZ, 4, 57)),
    (lambda: ct_reference_dequant(CTW, CTS[:, :1].T), ArgumentError, "weight_scale must have shape [N_out, G] with N_out=64",
     lambda: ct_reference_dequant(CTW, CTS[:, :1])),
    (lambda: ct_reference_dequant(CTW, np.ones((64, 4), np.float32)), ArgumentError,
     "weight_scale.shape[1]=4 must give a group size of 32, 64 or a power of two >= 128",
     lambda: ct_reference_dequant(CTW, np.ones((64, 2), np.float32))),
    (lambda: ct_reference_dequant(CTW, CTS, group_size=64), ArgumentError, "weight_scale must have shape (64, 1)",
     lambda: ct_reference_dequant(CTW, CTS, group_size=32)),
    (lambda: ct_reference_dequant(CTW, CTS.reshape(-1)), ArgumentError, "weight_scale must be 2-D",
     lambda: ct_reference_dequant(CTW, CTS)),
    (lambda: ct_reference_dequant(CTW, CTS, CTZ[:, :1]), ArgumentError, "weight_zero_point must have shape (8, 2)",
     lambda: ct_reference_dequant(CTW, CTS, CTZ)),
    (lambda: ct_reference_dequant(CTW, CTS, CTZ.astype(np.int8)), ArgumentTypeError,
     "weight_zero_point must have a 32-bit", lambda: ct_reference_dequant(CTW, CTS, CTZ.view(np.uint32))),
    (lambda: ct_to_marlin(CTW[:, :5], CTS[:, :1]), ArgumentError, "ct_to_marlin: K_in=40 must be a multiple of 16",
     lambda: ct_to_marlin(CTW[:, :6], CTS[:, :1])),
    (lambda: ct_to_marlin(CTW[:32], CTS[:32]), ArgumentError, "N_out=32 must be a multiple of 64",
     lambda: ct_to_marlin(CTW, CTS)),
    # F. FP8
    (lambda: e4m3_to_float(FW.astype(np.int8)), ArgumentTypeError,
     "e4m3_to_float: values must have dtype uint8 (raw E4M3 bytes) or float8_e4m3fn",
     lambda: e4m3_to_float(FW)),
    (lambda: prepare_fp8_weight_for_marlin(_with(FW, (3, 5), 0x7F), 0.5), ArgumentError,
     "weight_bytes must not contain E4M3 NaN (0x7F/0xFF); found at [3, 5]",
     lambda: prepare_fp8_weight_for_marlin(_with(FW, (3, 5), 0x7E), 0.5)),
    (lambda: prepare_fp8_weight_for_marlin(FW[:32], 0.5), ArgumentError, "n (weight_bytes.shape[0])=32 must be a multiple of 64",
     lambda: prepare_fp8_weight_for_marlin(FW, 0.5)),
    (lambda: prepare_fp8_weight_for_marlin(FW[:, :24], 0.5), ArgumentError, "k (weight_bytes.shape[1])=24 must be a multiple of 16",
     lambda: prepare_fp8_weight_for_marlin(FW[:, :32], 0.5)),
    (lambda: prepare_fp8_weight_for_marlin(FW[:, :64], FB, (128, 128)), ArgumentError,
     "k (weight_bytes.shape[1])=64 must be a multiple of 128", lambda: prepare_fp8_weight_for_marlin(FW[:, :64], FB)),
    (lambda: prepare_fp8_weight_for_marlin(FW, FB, (64, 64)), ArgumentError, "block=(64, 64) must be (128, 128)",
     lambda: prepare_fp8_weight_for_marlin(FW, FB, [128, 128])),
    (lambda: prepare_fp8_weight_for_marlin(FW, FB, 128), ArgumentTypeError, "block must be a pair (128, 128) or None",
     lambda: prepare_fp8_weight_for_marlin(FW, FB, (128, 128))),
    (lambda: prepare_fp8_weight_for_marlin(FW, np.ones(32, np.float32)), ArgumentError,
     "scale must be one value (per-tensor), [N] or [N, 1] (per-channel) with N=64, got shape (32,)",
     lambda: prepare_fp8_weight_for_marlin(FW, np.ones(64, np.float32))),
    (lambda: prepare_fp8_weight_for_marlin(FW, np.ones((2, 1), np.float32), (128, 128)), ArgumentError,
     "scale must have shape (1, 1)", lambda: prepare_fp8_weight_for_marlin(FW, np.ones((1, 1), np.float32), (128, 128))),
    (lambda: prepare_fp8_weight_for_marlin(FW, 300.0), ArgumentError,
     "scale times the exponent-bias factor 256 must be finite in float16",
     lambda: prepare_fp8_weight_for_marlin(FW, 255.0)),
    (lambda: prepare_fp8_weight_for_marlin(FW, np.float32(np.nan)), ArgumentError, "scale must be finite",
     lambda: prepare_fp8_weight_for_marlin(FW, np.float32(1))),
    (lambda: prepare_fp8_weight_for_marlin(FW, np.ones(64, np.int32)), ArgumentTypeError, "scale must have a floating dtype",
     lambda: prepare_fp8_weight_for_marlin(FW, np.ones(64, np.float16))),
    (lambda: prepare_fp8_weight_for_marlin(FW, [0.5]), ArgumentTypeError, "scale must be a numpy.ndarray",
     lambda: prepare_fp8_weight_for_marlin(FW, np.array([0.5]))),
    (lambda: prepare_block_fp8_weight_for_fp8_marlin(FW.tobytes(), b"\x00\x3f\x00", 64, 128), ArgumentError,
     "inverse_scales given as bytes must be little-endian bf16 values (an even number of bytes)",
     lambda: prepare_block_fp8_weight_for_fp8_marlin(FW.tobytes(), b"\x00\x3f", 64, 128)),
    (lambda: prepare_block_fp8_weight_for_fp8_marlin(FW.tobytes(), b"\x00\x3f", 64, 256), ArgumentError,
     "weight_bytes must have shape (64, 256)", lambda: prepare_block_fp8_weight_for_fp8_marlin(FW.tobytes(), b"\x00\x3f", 64, 128)),
    (lambda: prepare_block_fp8_weight_for_fp8_marlin(FW, b"\x00\x3f\x00\x3f", 64, 128), ArgumentError,
     "inverse_scales must be 2-D", lambda: prepare_block_fp8_weight_for_fp8_marlin(FW, b"\x00\x3f", 64, 128)),
    (lambda: prepare_block_fp8_weight_for_fp8_marlin(FW, FB, 64, 128, None), ArgumentError,
     "block must be (128, 128), got None", lambda: prepare_block_fp8_weight_for_fp8_marlin(FW, FB, 64, 128)),
    (lambda: prepare_block_fp8_weight_for_fp8_marlin(FW, FB, 0, 128), ArgumentError, "n=0 must be positive",
     lambda: prepare_block_fp8_weight_for_fp8_marlin(FW, FB, 64, 128)),
    (lambda: fp8_reference_dequant(FW.reshape(-1), 0.5), ArgumentError, "fp8_reference_dequant: weight_bytes must be 2-D",
     lambda: fp8_reference_dequant(FW, 0.5)),
    (lambda: fp8_reference_dequant(FW, FB, (128, 64)), ArgumentError, "block=(128, 64) must be (128, 128)",
     lambda: fp8_reference_dequant(FW, FB, (128, 128))),
]


@pytest.mark.parametrize("call,error,fragment,neighbour", REJECTIONS, ids=[r[2][:60] for r in REJECTIONS])
def test_validation(call, error, fragment, neighbour):
    with pytest.raises(error, match=re.escape(fragment)):
        call()
    neighbour()
