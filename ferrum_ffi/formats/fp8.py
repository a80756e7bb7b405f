"""FP8-E4M3 weights (``float8_e4m3fn`` checkpoints) and their conversion to the
8-bit Marlin layout.

On-disk tensors of one linear layer (``torch.nn.Linear`` orientation):

* ``weight`` ``[N_out, K_in]`` float8_e4m3fn: one byte per value, 1 sign bit,
  4 exponent bits (bias 7), 3 mantissa bits; exponent 0 is subnormal
  (``m/8 * 2**-6``); no infinities; ``S.1111.111`` (0x7F / 0xFF) is NaN;
  largest finite value 448. Here the weight is handled as its raw bytes
  (uint8), or as an ml_dtypes ``float8_e4m3fn`` array.
* the scale, which multiplies: ``w[n, k] = e4m3(weight[n, k]) * scale``, one
  of

  - per-tensor: one value (shape ``()``, ``[1]`` or ``[1, 1]``);
  - per-channel: ``[N_out]`` or ``[N_out, 1]``;
  - 128x128 blocks: ``[ceil(N_out/128), ceil(K_in/128)]``, value
    ``[n // 128, k // 128]`` (DeepSeek-style ``weight_scale_inv``: despite the
    name it is the dequantisation multiplier), float32 or bf16 (the seeds'
    fixture passes little-endian bf16 bytes and multiplies, exactly as
    here).

Checked: the E4M3FN decoding against ml_dtypes' ``float8_e4m3fn`` on all 256
bytes (tests); the block-scale indexing and multiply against the seeds' FP8
Marlin-MoE fixture. Not checked against a checkpoint: the exact tensor names
and shapes of per-tensor / per-channel scales (``()``, ``[1]``, ``[N, 1]`` are
all accepted).

Marlin side
===========
The GEMM's weight is ``W[k, n] = weight[n, k]``; its **bytes** go unchanged
into the 8-bit Marlin layout (:func:`.marlin.marlin_pack_int8`). The kernel
turns a byte into fp16 by moving sign, exponent and mantissa into fp16
position (``sign << 15 | (byte & 0x7F) << 7``); with fp16's exponent bias 15
instead of 7 that gives ``e4m3(byte) * 2**-8`` exactly, subnormals included
(:func:`e4m3_to_kernel_fp16`). The scales therefore carry the
**exponent-bias factor** :data:`FP8_EXPONENT_BIAS_FACTOR` = 256:

* per-tensor and per-channel scales become channelwise fp16 ``[1, N]``
  ``scale[n] * 256`` (channelwise Marlin permutation, group_size -1);
* block scales become group-128 fp16 ``[K/128, N]``:
  ``s[g, n] = block[n // 128, g] * 256`` (grouped Marlin permutation).

So the kernel computes ``(e4m3(byte) * 2**-8) * (scale * 256)``, which is
``e4m3(byte) * scale`` exactly whenever ``scale * 256`` is exact in fp16 (it
is for bf16 scales in fp16's normal range). NaN bytes have no fp16 image that
stays NaN under the bit move, so the converters reject them.
"""

from __future__ import annotations

import numpy as np

from ferrum_ffi.status import ArgumentError, ArgumentTypeError

from ._common import (
    bfloat16_bits_to_float32,
    check_float_dtype,
    check_ndarray,
    check_ndim,
    check_shape,
    check_size,
    is_bfloat16,
)
from .marlin import (
    CHUNK_COLUMNS,
    TILE,
    marlin_pack_rows,
    marlin_permute_scales,
)

try:  # optional: the reference decoder, when present
    import ml_dtypes as _ml_dtypes

    _E4M3FN = np.dtype(_ml_dtypes.float8_e4m3fn)
except ImportError:  # pragma: no cover - exercised only without ml_dtypes
    _E4M3FN = None

__all__ = [
    "FP8_EXPONENT_BIAS_FACTOR",
    "FP8_BLOCK",
    "E4M3_NAN_BYTES",
    "e4m3_to_float",
    "e4m3_decode_bits",
    "e4m3_to_kernel_fp16",
    "fp8_reference_dequant",
    "prepare_fp8_weight_for_marlin",
    "prepare_block_fp8_weight_for_fp8_marlin",
    "quantize_fp8_blocks",
]

FP8_EXPONENT_BIAS_FACTOR = 2.0 ** (15 - 7)
"""256: the kernel's E4M3 -> fp16 bit move yields ``value * 2**-8`` (fp16
exponent bias 15 vs E4M3's 7), so every prepared scale is multiplied by this."""
FP8_BLOCK = (128, 128)
"""The only block shape of block-FP8 scales served (group size 128 along K)."""
E4M3_NAN_BYTES = (0x7F, 0xFF)
"""The two E4M3FN NaN encodings."""


# --------------------------------------------------------------------------
# Decoders
# --------------------------------------------------------------------------
def _as_e4m3_bytes(fn: str, name: str, values: object) -> np.ndarray:
    """uint8 view of E4M3 data: a uint8 or float8_e4m3fn ndarray (any shape)
    or a bytes-like object (1-D)."""
    if isinstance(values, (bytes, bytearray, memoryview)):
        return np.frombuffer(values, dtype=np.uint8)
    values = check_ndarray(fn, name, values)
    if values.dtype.name == "float8_e4m3fn" and values.dtype.itemsize == 1:
        return values.view(np.uint8)
    if values.dtype != np.uint8:
        raise ArgumentTypeError(
            f"{fn}: {name} must have dtype uint8 (raw E4M3 bytes) or float8_e4m3fn, got {values.dtype}"
        )
    return values


def e4m3_decode_bits(values: object) -> np.ndarray:
    """Bit-level E4M3FN decoder, independent of any FP8 library: float32 of
    the same shape. ``e = (b >> 3) & 15``, ``m = b & 7``: ``(8 + m) * 2**(e -
    10)`` for ``e > 0``, ``m * 2**-9`` for ``e == 0``, sign from bit 7, NaN for
    ``b & 0x7F == 0x7F``. Every finite result is exact in float32."""
    b = _as_e4m3_bytes("e4m3_decode_bits", "values", values).astype(np.int32)
    exponent = (b >> 3) & 0x0F
    mantissa = (b & 0x07).astype(np.float32)
    magnitude = np.where(
        exponent == 0,
        np.ldexp(mantissa, -9),
        np.ldexp(mantissa + np.float32(8), exponent - 10),
    ).astype(np.float32)
    magnitude[(b & 0x7F) == 0x7F] = np.nan
    return np.where(b & 0x80, -magnitude, magnitude).astype(np.float32)


def e4m3_to_float(values: object) -> np.ndarray:
    """E4M3FN bytes -> float32 (same shape), through ``ml_dtypes.float8_e4m3fn``
    when it is installed, otherwise :func:`e4m3_decode_bits` (the tests check
    that both agree on all 256 bytes)."""
    b = _as_e4m3_bytes("e4m3_to_float", "values", values)
    if _E4M3FN is None:
        return e4m3_decode_bits(b)
    return np.ascontiguousarray(b).view(_E4M3FN).astype(np.float32)


def e4m3_to_kernel_fp16(values: object) -> np.ndarray:
    """The kernel's conversion of E4M3 bytes to fp16: ``sign << 15 | (b &
    0x7F) << 7`` read as fp16, equal to ``e4m3(b) * 2**-8`` for every non-NaN
    byte (the reason for :data:`FP8_EXPONENT_BIAS_FACTOR`). NaN bytes come
    out finite (``±1.875``), which is why the converters reject them."""
    b = _as_e4m3_bytes("e4m3_to_kernel_fp16", "values", values).astype(np.uint16)
    return (((b & 0x80) << 8) | ((b & 0x7F) << 7)).astype(np.uint16).view(np.float16)


# --------------------------------------------------------------------------
# Scales
# --------------------------------------------------------------------------
def _scale_values(fn: str, name: str, scale: object) -> np.ndarray:
    """float64 values of a scale given as a float/bf16 ndarray, a Python or
    NumPy real number, or bytes of little-endian bf16 (1-D)."""
    if isinstance(scale, (bytes, bytearray, memoryview)):
        raw = np.frombuffer(scale, dtype=np.uint8)
        if raw.size % 2:
            raise ArgumentError(
                f"{fn}: {name} given as bytes must be little-endian bf16 values "
                f"(an even number of bytes), got {raw.size} bytes"
            )
        return bfloat16_bits_to_float32(raw.view("<u2").astype(np.uint16)).astype(np.float64)
    if isinstance(scale, (float, int, np.floating, np.integer)) and not isinstance(
        scale, (bool, np.bool_)
    ):
        return np.asarray(float(scale), dtype=np.float64)
    scale = check_ndarray(fn, name, scale)
    if is_bfloat16(scale.dtype):
        return bfloat16_bits_to_float32(np.ascontiguousarray(scale).view(np.uint16)).astype(np.float64)
    if scale.dtype.kind != "f":
        raise ArgumentTypeError(
            f"{fn}: {name} must have a floating dtype (float16/32/64 or bfloat16), got {scale.dtype}"
        )
    return scale.astype(np.float64)


def _check_block(fn: str, block: object) -> tuple[int, int] | None:
    if block is None:
        return None
    if not isinstance(block, (tuple, list)) or len(block) != 2:
        raise ArgumentTypeError(f"{fn}: block must be a pair (128, 128) or None, got {block!r}")
    if any(isinstance(b, (bool, np.bool_)) or not isinstance(b, (int, np.integer)) for b in block):
        raise ArgumentTypeError(f"{fn}: block must hold ints, got {block!r}")
    if tuple(int(b) for b in block) != FP8_BLOCK:
        raise ArgumentError(
            f"{fn}: block={tuple(int(b) for b in block)} must be (128, 128) "
            "(FP8 group sizes are -1 and 128)"
        )
    return FP8_BLOCK


def _channel_scales(fn: str, name: str, s: np.ndarray, n: int) -> np.ndarray:
    """Per-tensor or per-channel scale values -> float64 [N]."""
    if s.size == 1 and s.ndim <= 2:
        return np.full(n, float(s.reshape(-1)[0]))
    if s.shape in ((n,), (n, 1)):
        return s.reshape(n)
    raise ArgumentError(
        f"{fn}: {name} must be one value (per-tensor), [N] or [N, 1] (per-channel) with N={n}, "
        f"got shape {s.shape}; pass block=(128, 128) for block scales"
    )


def _block_scales(fn: str, name: str, s: np.ndarray, n: int, k: int) -> np.ndarray:
    """Block scale values -> float64 [ceil(N/128), ceil(K/128)]."""
    rows, cols = -(-n // FP8_BLOCK[0]), -(-k // FP8_BLOCK[1])
    if s.shape == (rows * cols,):
        return s.reshape(rows, cols)
    check_ndim(fn, name, s, 2)
    check_shape(fn, name, s, (rows, cols), "[ceil(N/128), ceil(K/128)]")
    return s


# --------------------------------------------------------------------------
# Reference and converters
# --------------------------------------------------------------------------
def _check_weight(fn: str, weight: object) -> np.ndarray:
    weight = _as_e4m3_bytes(fn, "weight_bytes", weight)
    check_ndim(fn, "weight_bytes", weight, 2)
    check_size(fn, "weight_bytes.shape[0]", weight.shape[0])
    check_size(fn, "weight_bytes.shape[1]", weight.shape[1])
    return weight


def fp8_reference_dequant(weight_bytes: object, scale: object, block: object = None) -> np.ndarray:
    """float64 ``W[K, N] = e4m3(weight[n, k]) * scale`` from the on-disk
    tensors: ``weight_bytes`` ``[N, K]``; ``scale`` per-tensor or per-channel
    (``block=None``) or 128x128 block scales (``block=(128, 128)``, also as
    bf16 bytes or flattened). Exact (a float64 product of an E4M3 value and a
    bf16/fp16/fp32 scale loses nothing)."""
    fn = "fp8_reference_dequant"
    weight = _check_weight(fn, weight_bytes)
    n, k = weight.shape
    block = _check_block(fn, block)
    s = _scale_values(fn, "scale", scale)
    values = e4m3_to_float(weight).astype(np.float64)  # [N, K]
    if block is None:
        values *= _channel_scales(fn, "scale", s, n)[:, None]
    else:
        blocks = _block_scales(fn, "scale", s, n, k)
        values *= blocks[np.arange(n)[:, None] // FP8_BLOCK[0], np.arange(k)[None, :] // FP8_BLOCK[1]]
    return np.ascontiguousarray(values.T)


def _marlin_fp16_scales(fn: str, name: str, scales: np.ndarray) -> np.ndarray:
    """``scales * FP8_EXPONENT_BIAS_FACTOR`` in fp16, refusing NaN/inf and
    what overflows fp16 (|scale| > 65504/256)."""
    if not np.isfinite(scales).all():
        raise ArgumentError(f"{fn}: {name} must be finite")
    with np.errstate(over="ignore"):
        s16 = (scales * FP8_EXPONENT_BIAS_FACTOR).astype(np.float16)
    if not np.isfinite(s16).all():
        raise ArgumentError(
            f"{fn}: {name} times the exponent-bias factor 256 must be finite in float16 "
            f"(|scale| <= {65504 / FP8_EXPONENT_BIAS_FACTOR})"
        )
    return s16


def _prepare(fn: str, weight: np.ndarray, s: np.ndarray, scale_name: str, block) -> tuple[np.ndarray, np.ndarray]:
    n, k = weight.shape
    check_size(fn, "n (weight_bytes.shape[0])", n, CHUNK_COLUMNS)
    check_size(fn, "k (weight_bytes.shape[1])", k, TILE if block is None else FP8_BLOCK[1])
    nan = (weight & 0x7F) == 0x7F  # exactly the E4M3_NAN_BYTES
    if nan.any():
        n0, k0 = (int(i) for i in np.argwhere(nan)[0])
        raise ArgumentError(
            f"{fn}: weight_bytes must not contain E4M3 NaN (0x7F/0xFF); found at [{n0}, {k0}]"
        )
    if block is None:
        per_channel = _marlin_fp16_scales(fn, scale_name, _channel_scales(fn, scale_name, s, n))
        marlin_scales = marlin_permute_scales(per_channel[None, :], -1)
    else:
        blocks = _marlin_fp16_scales(fn, scale_name, _block_scales(fn, scale_name, s, n, k))
        grouped = blocks[np.arange(n) // FP8_BLOCK[0], :].T  # [K/128, N]
        marlin_scales = marlin_permute_scales(np.ascontiguousarray(grouped), FP8_BLOCK[1])
    packed = marlin_pack_rows(lambda r0, r1: weight[:, r0:r1].T, k, n, 8)
    return packed, marlin_scales


def prepare_fp8_weight_for_marlin(
    weight_bytes: object, scale: object, block: object = None
) -> tuple[np.ndarray, np.ndarray]:
    """E4M3 ``weight_bytes`` ``[N, K]`` and its scale -> ``(packed, scales)``
    for the Marlin FE4M3FN weight type:

    * ``packed`` int32 ``[K/16, 4N]``: the bytes of ``W[k, n] = weight[n, k]``
      in the 8-bit Marlin layout;
    * ``scales`` fp16 in Marlin order, times :data:`FP8_EXPONENT_BIAS_FACTOR`:
      ``[1, N]`` channelwise (group_size -1) for a per-tensor or per-channel
      ``scale`` (``block=None``), ``[K/128, N]`` group-128 for 128x128 block
      scales (``block=(128, 128)``).

    N must be a multiple of 64, K of 16 (of 128 with block scales)."""
    fn = "prepare_fp8_weight_for_marlin"
    weight = _check_weight(fn, weight_bytes)
    block = _check_block(fn, block)
    return _prepare(fn, weight, _scale_values(fn, "scale", scale), "scale", block)


def prepare_block_fp8_weight_for_fp8_marlin(
    weight_bytes: object, inverse_scales: object, n: int, k: int, block: object = FP8_BLOCK
) -> tuple[np.ndarray, np.ndarray]:
    """Block-FP8 checkpoint tensors -> ``(packed_weight int32 [k/16, 4n],
    packed_scales fp16 [k/128, n])`` (see :func:`prepare_fp8_weight_for_marlin`).

    ``weight_bytes``: ``[n, k]`` uint8/float8_e4m3fn ndarray, or ``n*k`` bytes
    (row-major). ``inverse_scales``: the checkpoint's block scales (they
    multiply), ``[ceil(n/128), ceil(k/128)]`` or flattened, as a float or
    bfloat16 ndarray, or as little-endian bf16 bytes."""
    fn = "prepare_block_fp8_weight_for_fp8_marlin"
    n = check_size(fn, "n", n)
    k = check_size(fn, "k", k)
    block = _check_block(fn, block)
    if block is None:
        raise ArgumentError(f"{fn}: block must be (128, 128), got None")
    weight = _as_e4m3_bytes(fn, "weight_bytes", weight_bytes)
    if weight.ndim == 1:
        if weight.size != n * k:
            raise ArgumentError(
                f"{fn}: weight_bytes must have shape ({n}, {k}) or {n * k} values (row-major), "
                f"got shape {weight.shape}"
            )
        weight = weight.reshape(n, k)
    check_ndim(fn, "weight_bytes", weight, 2)
    check_shape(fn, "weight_bytes", weight, (n, k), "[n, k], or n*k bytes")
    return _prepare(fn, weight, _scale_values(fn, "inverse_scales", inverse_scales), "inverse_scales", block)


# --------------------------------------------------------------------------
# Quantiser (tests and demos)
# --------------------------------------------------------------------------
_E4M3_MAX = 448.0  # the largest finite E4M3FN value


def quantize_fp8_blocks(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Round-to-nearest FP8-E4M3 of float ``w [N, K]`` with 128x128 block
    scales -> ``(weight float8_e4m3fn [N, K], weight_scale_inv float32
    [ceil(N/128), ceil(K/128)])``, the block-FP8 checkpoint layout (for tests
    and demos, not a calibrated quantiser; needs ml_dtypes).

    Per block the scale is ``absmax / 448`` rounded **up** to a value whose
    product with :data:`FP8_EXPONENT_BIAS_FACTOR` is exact in fp16: the
    prepared Marlin scale is then exactly the checkpoint's, and no value
    exceeds 448 after the division. An all-zero block gets the scale 1.0."""
    fn = "quantize_fp8_blocks"
    if _E4M3FN is None:  # pragma: no cover - exercised only without ml_dtypes
        raise ArgumentError(f"{fn}: needs the ml_dtypes package (pip install ml_dtypes)")
    w = check_ndarray(fn, "w", w)
    check_float_dtype(fn, "w", w)
    check_ndim(fn, "w", w, 2)
    n = check_size(fn, "w.shape[0]", w.shape[0])
    k = check_size(fn, "w.shape[1]", w.shape[1])
    x = w.astype(np.float64)
    if not np.isfinite(x).all():
        raise ArgumentError(f"{fn}: w must be finite")
    rows, cols = -(-n // FP8_BLOCK[0]), -(-k // FP8_BLOCK[1])
    padded = np.zeros((rows * FP8_BLOCK[0], cols * FP8_BLOCK[1]))
    padded[:n, :k] = np.abs(x)
    absmax = padded.reshape(rows, FP8_BLOCK[0], cols, FP8_BLOCK[1]).max(axis=(1, 3))
    wanted = absmax / _E4M3_MAX * FP8_EXPONENT_BIAS_FACTOR
    with np.errstate(over="ignore"):
        kernel_scale = wanted.astype(np.float16)
    low = kernel_scale.astype(np.float64) < wanted
    kernel_scale[low] = np.nextafter(kernel_scale[low], np.float16(np.inf))
    if not np.isfinite(kernel_scale).all():
        limit = 65504 / FP8_EXPONENT_BIAS_FACTOR * _E4M3_MAX
        raise ArgumentError(f"{fn}: w has |w| too large for an fp16 Marlin scale (needs |w| <= ~{limit:.0f})")
    scale = kernel_scale.astype(np.float64) / FP8_EXPONENT_BIAS_FACTOR
    scale[absmax == 0] = 1.0
    per_value = scale[np.arange(n)[:, None] // FP8_BLOCK[0], np.arange(k)[None, :] // FP8_BLOCK[1]]
    return (x / per_value).astype(_E4M3FN), scale.astype(np.float32)
