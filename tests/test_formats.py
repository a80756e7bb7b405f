"""CPU tests of ferrum_ffi.formats: every packer against a loop-by-loop
reference written straight from the layout specification, round trips, the
quantiser against its definition, and every validation rule."""

from __future__ import annotations

import re

import numpy as np
import pytest

from ferrum_ffi.formats import gptq, marlin, quantize
from ferrum_ffi.formats import (
    dequantize_int4_symmetric,
    gptq_pack_int4,
    gptq_unpack_int4,
    marlin_pack_int4,
    marlin_permute_scales,
    marlin_unpack_int4,
    marlin_unpermute_scales,
    permute_gptq_qweight_rows,
    quantize_int4_symmetric,
    repack_gptq_to_marlin,
    repack_marlin_to_gptq,
    repack_scales_to_marlin,
)
from ferrum_ffi.status import ArgumentError, ArgumentTypeError

from .marlin_reference import ref_lane_order

SEED = 20240531
SHAPES = [(16, 64), (32, 128), (48, 64), (64, 192)]
INTERLEAVE = [0, 2, 4, 6, 1, 3, 5, 7]


def random_codes(k: int, n: int, dtype=np.uint8, seed: int = SEED) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 16, size=(k, n)).astype(dtype)


def to_int32(word: int) -> int:
    """An unsigned 32-bit word as the signed value an int32 buffer holds."""
    return word - (1 << 32) if word >= (1 << 31) else word


# ---------------------------------------------------------------------------
# References: explicit loops, one per numbered step of the specification.
# ---------------------------------------------------------------------------
def ref_marlin_pack(q: np.ndarray) -> np.ndarray:
    k, n = q.shape
    step2 = ref_lane_order(q)  # steps 1-2
    # 3. Interleave each group of 8, value i at bits 4i.
    out = np.zeros((k // 16, 2 * n), dtype=np.int64)
    for kt in range(k // 16):
        for w in range(2 * n):
            old = step2[kt, 8 * w : 8 * w + 8]
            new = [old[INTERLEAVE[i]] for i in range(8)]
            word = 0
            for i in range(8):
                word |= int(new[i]) << (4 * i)
            out[kt, w] = to_int32(word)
    return out.astype(np.int32)


def ref_gptq_pack(q: np.ndarray) -> np.ndarray:
    k, n = q.shape
    out = np.zeros((k // 8, n), dtype=np.int64)
    for r in range(k // 8):
        for col in range(n):
            word = 0
            for i in range(8):
                word |= int(q[8 * r + i, col]) << (4 * i)
            out[r, col] = to_int32(word)
    return out.astype(np.int32)


def ref_permute_scales(s: np.ndarray, group_size: int) -> np.ndarray:
    rows, n = s.shape
    out = np.zeros_like(s)
    if group_size == -1:
        perm32 = [2 * i + o for i in range(4) for o in (0, 1, 8, 9, 16, 17, 24, 25)]
        for row in range(rows):
            for base in range(0, n, 32):
                for p in range(32):
                    out[row, base + p] = s[row, base + perm32[p]]
    else:
        for row in range(rows):
            for base in range(0, n, 64):
                for i in range(8):
                    for j in range(8):
                        out[row, base + 8 * i + j] = s[row, base + i + 8 * j]
    return out


def ref_quantize(w: np.ndarray, group_size: int) -> tuple[np.ndarray, np.ndarray]:
    k, n = w.shape
    gs = k if group_size == -1 else group_size
    codes = np.zeros((k, n), dtype=np.uint8)
    scales = np.zeros((k // gs, n), dtype=np.float16)
    for g in range(k // gs):
        for col in range(n):
            absmax = np.float32(0)
            for row in range(g * gs, (g + 1) * gs):
                absmax = max(absmax, abs(np.float32(w[row, col])))
            s = np.float16((absmax * np.float32(2)) / np.float32(15))
            if s == 0:
                s = np.float16(1.0)
            scales[g, col] = s
            for row in range(g * gs, (g + 1) * gs):
                v = np.rint(np.float32(w[row, col]) / np.float32(s)) + 8
                codes[row, col] = min(max(v, 0), 15)
    return codes, scales


def ref_dequantize(codes: np.ndarray, scales: np.ndarray, group_size: int) -> np.ndarray:
    k, n = codes.shape
    gs = k if group_size == -1 else group_size
    out = np.zeros((k, n), dtype=np.float64)
    for row in range(k):
        for col in range(n):
            out[row, col] = (int(codes[row, col]) - 8) * float(scales[row // gs, col])
    return out


@pytest.fixture
def tiny_steps(monkeypatch):
    """Force the chunked loops to take many small steps so that chunk
    boundaries are exercised on small shapes."""
    monkeypatch.setattr(marlin, "_STEP_VALUES", 1)
    monkeypatch.setattr(gptq, "_STEP_VALUES", 1)
    monkeypatch.setattr(quantize, "_STEP_VALUES", 1)


# ---------------------------------------------------------------------------
# Marlin weight layout
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("k,n", SHAPES)
@pytest.mark.parametrize("dtype", [np.uint8, np.int64])
def test_marlin_pack_matches_reference(k, n, dtype):
    q = random_codes(k, n, dtype)
    packed = marlin_pack_int4(q)
    assert packed.dtype == np.int32 and packed.shape == (k // 16, 2 * n)
    np.testing.assert_array_equal(packed, ref_marlin_pack(q))


@pytest.mark.parametrize("k,n", SHAPES)
def test_marlin_unpack_inverts_pack(k, n):
    q = random_codes(k, n)
    out = marlin_unpack_int4(marlin_pack_int4(q), k, n)
    assert out.dtype == np.uint8
    np.testing.assert_array_equal(out, q)


def test_marlin_chunked_matches_reference(tiny_steps):
    q = random_codes(64, 128)
    packed = marlin_pack_int4(q)
    np.testing.assert_array_equal(packed, ref_marlin_pack(q))
    np.testing.assert_array_equal(marlin_unpack_int4(packed, 64, 128), q)


def test_marlin_hand_computed_words():
    # q[k, n] = (k + n) % 16 on 16x64. Lane 0 owns column c = 0 and rows
    # 0, 1, 8, 9. Tile 0 (step 2): col 0 -> q = 0, 1, 8, 9; col 8 -> 8, 9, 0, 1
    # so old = [0, 1, 8, 9, 8, 9, 0, 1]; interleave [0,2,4,6,1,3,5,7] gives
    # [0, 8, 8, 0, 1, 9, 9, 1], nibble 0 lowest -> 0x19910880.
    k_idx, n_idx = np.meshgrid(np.arange(16), np.arange(64), indexing="ij")
    packed = marlin_pack_int4((k_idx + n_idx) % 16).view(np.uint32)
    assert packed[0, 0] == 0x19910880

    # q[k, n] = (k + n + n // 16) % 16 makes every tile t add t, so lane 0's
    # four words differ: tile t's old = [t, 1+t, 8+t, 9+t, 8+t, 9+t, t, 1+t],
    # interleaved [t, 8+t, 8+t, t, 1+t, 9+t, 9+t, 1+t]:
    #   t=0 0x19910880, t=1 0x2AA21991, t=2 0x3BB32AA2, t=3 0x4CC43BB3.
    # Word 4 = lane 1, tile 0: rows 2, 3, 10, 11 at col 0 -> 2, 3, 10, 11 and at
    #   col 8 -> 10, 11, 2, 3; interleaved [2, 10, 10, 2, 3, 11, 11, 3] -> 0x3BB32AA2.
    # Word 127 = lane 31, tile 3: col 55 and 63, rows 6, 7, 14, 15:
    #   (r + 55 + 3) % 16 = 0, 1, 8, 9; (r + 63 + 3) % 16 = 8, 9, 0, 1 -> 0x19910880.
    packed = marlin_pack_int4((k_idx + n_idx + n_idx // 16) % 16).view(np.uint32)
    assert [hex(int(w)) for w in packed[0, :5]] == [
        "0x19910880", "0x2aa21991", "0x3bb32aa2", "0x4cc43bb3", "0x3bb32aa2",
    ]
    assert packed[0, 127] == 0x19910880


def test_marlin_column_slice_is_pointer_offset():
    # ferrum_marlin.h: a column slice at col0 (multiple of 64) is the buffer
    # offset by 2*col0 words; i.e. packing a slice equals slicing the packing.
    q = random_codes(32, 192)
    full = marlin_pack_int4(q)
    np.testing.assert_array_equal(marlin_pack_int4(q[:, 64:128]), full[:, 128:256])


# ---------------------------------------------------------------------------
# GPTQ layout and conversions
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("k,n", [(8, 1), (24, 5), (64, 128)])
def test_gptq_pack_matches_reference(k, n):
    q = random_codes(k, n)
    qweight = gptq_pack_int4(q)
    assert qweight.dtype == np.int32 and qweight.shape == (k // 8, n)
    np.testing.assert_array_equal(qweight, ref_gptq_pack(q))
    np.testing.assert_array_equal(gptq_unpack_int4(qweight), q)


def test_gptq_hand_computed_words():
    # Column 0 holds 1..8 -> nibble i = i + 1 -> 0x87654321 (negative as int32);
    # column 1 holds 15 then zeros -> 0x0000000F.
    q = np.zeros((8, 2), dtype=np.uint8)
    q[:, 0] = np.arange(1, 9)
    q[0, 1] = 15
    qweight = gptq_pack_int4(q)
    assert qweight[0, 0] == to_int32(0x87654321)
    assert qweight[0, 1] == 0xF


def test_gptq_unpack_accepts_uint32():
    q = random_codes(32, 64)
    np.testing.assert_array_equal(gptq_unpack_int4(ref_gptq_pack(q).view(np.uint32)), q)


@pytest.mark.parametrize("k,n", SHAPES)
def test_repack_gptq_to_marlin(k, n):
    q = random_codes(k, n)
    qweight = ref_gptq_pack(q)
    packed = repack_gptq_to_marlin(qweight, k, n)
    np.testing.assert_array_equal(packed, ref_marlin_pack(q))
    np.testing.assert_array_equal(repack_marlin_to_gptq(packed, k, n), qweight)


def test_repack_chunked(tiny_steps):
    q = random_codes(64, 128)
    qweight = ref_gptq_pack(q)
    packed = repack_gptq_to_marlin(qweight, 64, 128)
    np.testing.assert_array_equal(packed, ref_marlin_pack(q))
    np.testing.assert_array_equal(repack_marlin_to_gptq(packed, 64, 128), qweight)
    np.testing.assert_array_equal(gptq_unpack_int4(qweight), q)
    np.testing.assert_array_equal(gptq_pack_int4(q), qweight)


@pytest.mark.parametrize("chunked", [False, True])
def test_permute_gptq_qweight_rows(chunked, monkeypatch):
    if chunked:
        monkeypatch.setattr(gptq, "_STEP_VALUES", 1)
    k, n = 64, 72
    rng = np.random.default_rng(SEED)
    q = random_codes(k, n)
    perm = rng.permutation(k)
    moved = permute_gptq_qweight_rows(ref_gptq_pack(q), perm)
    expected = np.zeros_like(q)
    for i in range(k):
        expected[i] = q[perm[i]]
    np.testing.assert_array_equal(moved, ref_gptq_pack(expected))
    back = permute_gptq_qweight_rows(moved, np.argsort(perm))
    np.testing.assert_array_equal(back, ref_gptq_pack(q))


def test_permute_act_order_groups_contiguous():
    # The act-order use: perm = argsort(g_idx) makes each group's rows contiguous.
    k, n, gs = 32, 8, 8
    rng = np.random.default_rng(SEED)
    g_idx = rng.permutation(np.repeat(np.arange(k // gs), gs))
    q = np.repeat(g_idx[:, None], n, axis=1).astype(np.uint8)  # code = its group
    perm = np.argsort(g_idx, kind="stable")
    moved = gptq_unpack_int4(permute_gptq_qweight_rows(gptq_pack_int4(q), perm))
    np.testing.assert_array_equal(moved[:, 0], np.repeat(np.arange(k // gs), gs))


# ---------------------------------------------------------------------------
# Scales
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("group_size,rows,n", [(128, 4, 64), (16, 3, 192), (-1, 1, 64), (-1, 1, 256)])
@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_scale_permutation(group_size, rows, n, dtype):
    s = np.random.default_rng(SEED).uniform(0.001, 2.0, size=(rows, n)).astype(dtype)
    permuted = marlin_permute_scales(s, group_size)
    assert permuted.dtype == np.float16 and permuted.shape == s.shape
    np.testing.assert_array_equal(permuted, ref_permute_scales(s.astype(np.float16), group_size))
    np.testing.assert_array_equal(marlin_unpermute_scales(permuted, group_size), s.astype(np.float16))


def test_scale_permutation_hand_values():
    s = np.arange(64, dtype=np.float16)[None, :]
    # grouped: new[8i + j] = old[i + 8j] -> first 8 are old 0, 8, ..., 56.
    assert marlin_permute_scales(s, 128)[0, :8].tolist() == [0, 8, 16, 24, 32, 40, 48, 56]
    # channelwise: perm32 starts 0, 1, 8, 9, 16, 17, 24, 25, then 2, 3, 10, ...
    assert marlin_permute_scales(s, -1)[0, :10].tolist() == [0, 1, 8, 9, 16, 17, 24, 25, 2, 3]


@pytest.mark.parametrize("k,group_size", [(128, 128), (256, 128), (64, 32), (64, -1)])
def test_repack_scales_to_marlin(k, group_size):
    n = 128
    rows = 1 if group_size == -1 else k // group_size
    s = np.random.default_rng(SEED).uniform(0.01, 1.0, size=(rows, n)).astype(np.float16)
    np.testing.assert_array_equal(
        repack_scales_to_marlin(s, k, n, group_size), ref_permute_scales(s, group_size)
    )


# ---------------------------------------------------------------------------
# Quantiser
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("group_size", [16, 32, -1])
@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_quantize_matches_definition(group_size, dtype):
    w = np.random.default_rng(SEED).normal(0, 0.05, size=(64, 24)).astype(dtype)
    codes, scales = quantize_int4_symmetric(w, group_size)
    ref_codes, ref_scales = ref_quantize(w, group_size)
    assert codes.dtype == np.uint8 and scales.dtype == np.float16
    np.testing.assert_array_equal(scales, ref_scales)
    np.testing.assert_array_equal(codes, ref_codes)


@pytest.mark.parametrize("group_size", [16, -1])
def test_quantize_chunked_matches_definition(group_size, tiny_steps):
    # With one-value steps the block is one group x one column: both the
    # whole-group and the column-range paths run.
    w = np.random.default_rng(SEED).normal(0, 1, size=(32, 8)).astype(np.float32)
    codes, scales = quantize_int4_symmetric(w, group_size)
    ref_codes, ref_scales = ref_quantize(w, group_size)
    np.testing.assert_array_equal(scales, ref_scales)
    np.testing.assert_array_equal(codes, ref_codes)


@pytest.mark.parametrize("group_size", [16, 64, -1])
def test_dequantize_quantize_error_bound(group_size):
    w = np.random.default_rng(SEED).normal(0, 1, size=(128, 64)).astype(np.float32)
    codes, scales = quantize_int4_symmetric(w, group_size)
    deq = dequantize_int4_symmetric(codes, scales, group_size)
    gs = 128 if group_size == -1 else group_size
    s = np.repeat(scales.astype(np.float64), gs, axis=0)
    err = np.abs(deq - w.astype(np.float64))
    interior = codes < 15  # only the top code is clipped
    assert np.all(err[interior] <= s[interior] / 2 * (1 + 1e-6))
    # The clipped top value may exceed s/2 by the fp16 rounding of the scale.
    assert np.all(err <= s * (0.5 + 2.0**-8))
    assert codes.min() >= 0 and codes.max() <= 15


def test_quantize_zero_and_tiny_groups_get_unit_scale():
    w = np.zeros((32, 3), dtype=np.float32)
    w[:16, 1] = 1e-9  # 2*absmax/15 underflows float16
    w[16:, 2] = np.linspace(-1, 1, 16)
    codes, scales = quantize_int4_symmetric(w, 16)
    assert scales[0, 0] == 1.0 and scales[1, 0] == 1.0 and scales[0, 1] == 1.0
    assert np.all(codes[:, :2] == 8)
    np.testing.assert_array_equal(dequantize_int4_symmetric(codes, scales, 16)[:, :2], 0.0)
    assert scales[1, 2] == np.float16(np.float32(2) / np.float32(15))


@pytest.mark.parametrize("group_size", [16, -1])
def test_dequantize_matches_reference(group_size):
    codes = random_codes(32, 8)
    rows = 1 if group_size == -1 else 32 // group_size
    scales = np.random.default_rng(SEED).uniform(0.01, 1, size=(rows, 8)).astype(np.float16)
    out = dequantize_int4_symmetric(codes, scales, group_size)
    assert out.dtype == np.float64
    np.testing.assert_array_equal(out, ref_dequantize(codes, scales, group_size))


# ---------------------------------------------------------------------------
# Validation: each rule rejects, naming the argument; the valid neighbour passes.
# ---------------------------------------------------------------------------
C = random_codes(32, 64)
QW = ref_gptq_pack(C)
MP = ref_marlin_pack(C)
S = np.ones((1, 64), dtype=np.float16)
S2 = np.ones((2, 64), dtype=np.float16)
W = np.ones((32, 64), dtype=np.float32)
PERM = np.arange(32)


def _with(a: np.ndarray, index, value) -> np.ndarray:
    a = a.copy()
    a[index] = value
    return a


# (call, error type, message fragment, valid neighbour)
REJECTIONS = [
    # marlin_pack_int4
    (lambda: marlin_pack_int4(C.tolist()), ArgumentTypeError, "marlin_pack_int4: codes must be a numpy.ndarray",
     lambda: marlin_pack_int4(C)),
    (lambda: marlin_pack_int4(C.astype(np.float32)), ArgumentTypeError, "codes must have an integer dtype",
     lambda: marlin_pack_int4(C.astype(np.int32))),
    (lambda: marlin_pack_int4(C.reshape(-1)), ArgumentError, "codes must be 2-D",
     lambda: marlin_pack_int4(C)),
    (lambda: marlin_pack_int4(C[:24]), ArgumentError, "codes.shape[0]=24 must be a multiple of 16",
     lambda: marlin_pack_int4(C[:16])),
    (lambda: marlin_pack_int4(random_codes(16, 96)), ArgumentError, "codes.shape[1]=96 must be a multiple of 64",
     lambda: marlin_pack_int4(random_codes(16, 128))),
    (lambda: marlin_pack_int4(_with(C, (3, 3), 16)), ArgumentError, "codes values must be in 0..15",
     lambda: marlin_pack_int4(_with(C, (3, 3), 15))),
    (lambda: marlin_pack_int4(_with(C.astype(np.int8), (3, 3), -1)), ArgumentError, "codes values must be in 0..15",
     lambda: marlin_pack_int4(_with(C.astype(np.int8), (3, 3), 0))),
    # marlin_unpack_int4
    (lambda: marlin_unpack_int4(MP, 24, 64), ArgumentError, "marlin_unpack_int4: k=24 must be a multiple of 16",
     lambda: marlin_unpack_int4(MP, 32, 64)),
    (lambda: marlin_unpack_int4(MP, 32, 96), ArgumentError, "n=96 must be a multiple of 64",
     lambda: marlin_unpack_int4(MP, 32, 64)),
    (lambda: marlin_unpack_int4(MP, 0, 64), ArgumentError, "k=0 must be positive",
     lambda: marlin_unpack_int4(MP, 32, 64)),
    (lambda: marlin_unpack_int4(MP, 32.0, 64), ArgumentTypeError, "k must be an int",
     lambda: marlin_unpack_int4(MP, np.int64(32), 64)),
    (lambda: marlin_unpack_int4(MP, 32, True), ArgumentTypeError, "n must be an int",
     lambda: marlin_unpack_int4(MP, 32, 64)),
    (lambda: marlin_unpack_int4(MP.astype(np.int64), 32, 64), ArgumentTypeError, "packed must have a 32-bit integer",
     lambda: marlin_unpack_int4(MP.view(np.uint32), 32, 64)),
    (lambda: marlin_unpack_int4(MP.astype(np.float32), 32, 64), ArgumentTypeError, "packed must have a 32-bit integer",
     lambda: marlin_unpack_int4(MP, 32, 64)),
    (lambda: marlin_unpack_int4(MP.reshape(-1), 32, 64), ArgumentError, "packed must be 2-D",
     lambda: marlin_unpack_int4(MP, 32, 64)),
    (lambda: marlin_unpack_int4(MP, 16, 64), ArgumentError, "packed must have shape (1, 128)",
     lambda: marlin_unpack_int4(MP[:1], 16, 64)),
    # marlin_permute_scales / marlin_unpermute_scales
    (lambda: marlin_permute_scales(S.astype(np.int32), -1), ArgumentTypeError, "scales must have a floating dtype",
     lambda: marlin_permute_scales(S.astype(np.float64), -1)),
    (lambda: marlin_permute_scales(S[0], -1), ArgumentError, "scales must be 2-D",
     lambda: marlin_permute_scales(S, -1)),
    (lambda: marlin_permute_scales(S2, 0), ArgumentError, "group_size=0 must be -1 or positive",
     lambda: marlin_permute_scales(S2, 1)),
    (lambda: marlin_permute_scales(S2, 128.0), ArgumentTypeError, "group_size must be an int",
     lambda: marlin_permute_scales(S2, 128)),
    (lambda: marlin_permute_scales(S2, -1), ArgumentError, "scales.shape[0]=2 must be 1 for channelwise",
     lambda: marlin_permute_scales(S2, 128)),
    (lambda: marlin_unpermute_scales(np.ones((1, 96), np.float16), 128), ArgumentError,
     "marlin_unpermute_scales: scales.shape[1]=96 must be a multiple of 64",
     lambda: marlin_unpermute_scales(np.ones((1, 128), np.float16), 128)),
    (lambda: marlin_permute_scales(_with(S.astype(np.float32), (0, 5), 1e6), -1), ArgumentError,
     "scales must be finite in float16", lambda: marlin_permute_scales(_with(S.astype(np.float32), (0, 5), 6e4), -1)),
    (lambda: marlin_permute_scales(_with(S, (0, 5), np.nan), -1), ArgumentError, "scales must be finite",
     lambda: marlin_permute_scales(S, -1)),
    # gptq_unpack_int4 / gptq_pack_int4
    (lambda: gptq_unpack_int4(QW.astype(np.int64)), ArgumentTypeError, "gptq_unpack_int4: qweight must have a 32-bit",
     lambda: gptq_unpack_int4(QW)),
    (lambda: gptq_unpack_int4(QW.reshape(-1)), ArgumentError, "qweight must be 2-D",
     lambda: gptq_unpack_int4(QW)),
    (lambda: gptq_unpack_int4(QW[:0]), ArgumentError, "qweight.shape[0]=0 must be positive",
     lambda: gptq_unpack_int4(QW[:1])),
    (lambda: gptq_pack_int4(C[:12]), ArgumentError, "gptq_pack_int4: codes.shape[0]=12 must be a multiple of 8",
     lambda: gptq_pack_int4(C[:8])),
    (lambda: gptq_pack_int4(_with(C, (0, 0), 99)), ArgumentError, "codes values must be in 0..15",
     lambda: gptq_pack_int4(C)),
    # repack_gptq_to_marlin / repack_marlin_to_gptq
    (lambda: repack_gptq_to_marlin(QW, 32, 96), ArgumentError, "repack_gptq_to_marlin: n=96 must be a multiple of 64",
     lambda: repack_gptq_to_marlin(QW, 32, 64)),
    (lambda: repack_gptq_to_marlin(QW[:3], 24, 64), ArgumentError, "k=24 must be a multiple of 16",
     lambda: repack_gptq_to_marlin(QW[:2], 16, 64)),
    (lambda: repack_gptq_to_marlin(QW, 64, 64), ArgumentError, "qweight must have shape (8, 64)",
     lambda: repack_gptq_to_marlin(QW, 32, 64)),
    (lambda: repack_gptq_to_marlin(QW.astype(np.float32), 32, 64), ArgumentTypeError, "qweight must have a 32-bit",
     lambda: repack_gptq_to_marlin(QW, 32, 64)),
    (lambda: repack_marlin_to_gptq(MP, 32, 128), ArgumentError, "repack_marlin_to_gptq: packed must have shape (2, 256)",
     lambda: repack_marlin_to_gptq(MP, 32, 64)),
    # repack_scales_to_marlin
    (lambda: repack_scales_to_marlin(S2, 40, 64, 20), ArgumentError, "repack_scales_to_marlin: k=40 must be a multiple of 16",
     lambda: repack_scales_to_marlin(S2, 64, 64, 32)),
    (lambda: repack_scales_to_marlin(S2, 64, 64, 48), ArgumentError, "k=64 must be a multiple of group_size=48",
     lambda: repack_scales_to_marlin(S2, 64, 64, 32)),
    (lambda: repack_scales_to_marlin(S2, 64, 64, 16), ArgumentError, "scales must have shape (4, 64)",
     lambda: repack_scales_to_marlin(np.ones((4, 64), np.float16), 64, 64, 16)),
    (lambda: repack_scales_to_marlin(S2, 64, 64, -1), ArgumentError, "scales must have shape (1, 64)",
     lambda: repack_scales_to_marlin(S, 64, 64, -1)),
    (lambda: repack_scales_to_marlin(S2, 64, 96, 32), ArgumentError, "n=96 must be a multiple of 64",
     lambda: repack_scales_to_marlin(S2, 64, 64, 32)),
    (lambda: repack_scales_to_marlin(S2.astype(np.int16), 64, 64, 32), ArgumentTypeError, "scales must have a floating",
     lambda: repack_scales_to_marlin(S2.astype(np.float32), 64, 64, 32)),
    # permute_gptq_qweight_rows
    (lambda: permute_gptq_qweight_rows(QW, PERM.astype(np.float64)), ArgumentTypeError,
     "permute_gptq_qweight_rows: perm must have an integer dtype", lambda: permute_gptq_qweight_rows(QW, PERM.astype(np.int32))),
    (lambda: permute_gptq_qweight_rows(QW, PERM.reshape(4, 8)), ArgumentError, "perm must be 1-D",
     lambda: permute_gptq_qweight_rows(QW, PERM)),
    (lambda: permute_gptq_qweight_rows(QW, PERM[:31]), ArgumentError, "perm must have shape (32,)",
     lambda: permute_gptq_qweight_rows(QW, PERM)),
    (lambda: permute_gptq_qweight_rows(QW, _with(PERM, 0, 32)), ArgumentError, "perm values must be in 0..31",
     lambda: permute_gptq_qweight_rows(QW, _with(PERM, 0, 0))),
    (lambda: permute_gptq_qweight_rows(QW, _with(PERM, 0, -1)), ArgumentError, "perm values must be in 0..31",
     lambda: permute_gptq_qweight_rows(QW, PERM[::-1].copy())),
    (lambda: permute_gptq_qweight_rows(QW, _with(PERM, 0, 1)), ArgumentError, "perm must be a permutation of range(32)",
     lambda: permute_gptq_qweight_rows(QW, _with(_with(PERM, 0, 1), 1, 0))),
    (lambda: permute_gptq_qweight_rows(QW.astype(np.uint8), PERM), ArgumentTypeError, "qweight must have a 32-bit",
     lambda: permute_gptq_qweight_rows(QW.view(np.uint32), PERM)),
    # quantize_int4_symmetric
    (lambda: quantize_int4_symmetric(W.astype(np.int32), 16), ArgumentTypeError,
     "quantize_int4_symmetric: w must have a floating dtype", lambda: quantize_int4_symmetric(W.astype(np.float16), 16)),
    (lambda: quantize_int4_symmetric(W[0], 16), ArgumentError, "w must be 2-D",
     lambda: quantize_int4_symmetric(W[:16], 16)),
    (lambda: quantize_int4_symmetric(W, 128), ArgumentError, "w.shape[0]=32 must be a multiple of group_size=128",
     lambda: quantize_int4_symmetric(W, 32)),
    (lambda: quantize_int4_symmetric(W, -2), ArgumentError, "group_size=-2 must be -1 or positive",
     lambda: quantize_int4_symmetric(W, -1)),
    (lambda: quantize_int4_symmetric(W[:, :0], 16), ArgumentError, "w.shape[1]=0 must be positive",
     lambda: quantize_int4_symmetric(W[:, :1], 16)),
    (lambda: quantize_int4_symmetric(_with(W, (20, 3), np.nan), 16), ArgumentError, "w must be finite",
     lambda: quantize_int4_symmetric(_with(W, (20, 3), -1e4), 16)),
    (lambda: quantize_int4_symmetric(_with(W, (20, 3), np.inf), 16), ArgumentError, "w must be finite",
     lambda: quantize_int4_symmetric(W, 16)),
    (lambda: quantize_int4_symmetric(_with(W, (20, 3), 1e6), 16), ArgumentError, "w has |w| too large for a float16 scale",
     lambda: quantize_int4_symmetric(_with(W, (20, 3), 4e5), 16)),
    # dequantize_int4_symmetric
    (lambda: dequantize_int4_symmetric(_with(C, (1, 1), 16), S, -1), ArgumentError,
     "dequantize_int4_symmetric: codes values must be in 0..15", lambda: dequantize_int4_symmetric(C, S, -1)),
    (lambda: dequantize_int4_symmetric(C, S, 16), ArgumentError, "scales must have shape (2, 64)",
     lambda: dequantize_int4_symmetric(C, S2, 16)),
    (lambda: dequantize_int4_symmetric(C, S2, 12), ArgumentError, "codes.shape[0]=32 must be a multiple of group_size=12",
     lambda: dequantize_int4_symmetric(C, S2, 16)),
    (lambda: dequantize_int4_symmetric(C, S.astype(np.int32), -1), ArgumentTypeError, "scales must have a floating",
     lambda: dequantize_int4_symmetric(C, S.astype(np.float32), -1)),
]


@pytest.mark.parametrize("call,error,fragment,neighbour", REJECTIONS, ids=[r[2] for r in REJECTIONS])
def test_validation(call, error, fragment, neighbour):
    with pytest.raises(error, match=re.escape(fragment)):
        call()
    neighbour()


def test_errors_are_value_and_type_errors():
    # Callers that only know the builtin exceptions must still catch these.
    with pytest.raises(ValueError):
        repack_gptq_to_marlin(QW, 32, 96)
    with pytest.raises(TypeError):
        marlin_pack_int4(C.astype(np.float32))


def test_permutation_tables_are_read_only():
    with pytest.raises(ValueError):
        marlin._RUN_ORDER[0] = 1
    assert sorted(marlin._RUN_ORDER.tolist()) == list(range(1024))
