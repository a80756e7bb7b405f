"""Argument checks and bit packing shared by the format modules.

Every check raises ArgumentError / ArgumentTypeError naming the calling
function, the argument and the rule.
"""

from __future__ import annotations

import numpy as np

from .._abi import INT_GROUP_SIZE_RULE, int_group_size_served
from ..status import ArgumentError, ArgumentTypeError

SUPPORTED_BITS = (4, 8)
"""Integer code widths the Marlin layouts are defined for."""

def check_ndarray(fn: str, name: str, value: object) -> np.ndarray:
    """Reject non-arrays up front: silent ``np.asarray`` of a list or tensor
    would hide dtype mistakes that matter bit-for-bit here."""
    if not isinstance(value, np.ndarray):
        raise ArgumentTypeError(
            f"{fn}: {name} must be a numpy.ndarray, got {type(value).__name__}"
        )
    return value


def check_ndim(fn: str, name: str, a: np.ndarray, ndim: int) -> None:
    if a.ndim != ndim:
        raise ArgumentError(f"{fn}: {name} must be {ndim}-D, got shape {a.shape}")


def check_integer_dtype(fn: str, name: str, a: np.ndarray, itemsize: int | None = None) -> None:
    """Codes and packed words must be integers; packed words must be 32-bit
    because the layout is defined in 32-bit words."""
    if a.dtype.kind not in "iu" or (itemsize is not None and a.dtype.itemsize != itemsize):
        want = "a 32-bit integer dtype (int32/uint32)" if itemsize == 4 else "an integer dtype"
        raise ArgumentTypeError(f"{fn}: {name} must have {want}, got {a.dtype}")


def check_float_dtype(fn: str, name: str, a: np.ndarray) -> None:
    if a.dtype.kind != "f":
        raise ArgumentTypeError(f"{fn}: {name} must have a floating dtype, got {a.dtype}")


def check_size(fn: str, name: str, value: object, multiple: int = 1) -> int:
    """A dimension argument: a positive int, a multiple of what the layout tiles by."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise ArgumentTypeError(f"{fn}: {name} must be an int, got {type(value).__name__}")
    value = int(value)
    if value <= 0:
        raise ArgumentError(f"{fn}: {name}={value} must be positive")
    if value % multiple:
        raise ArgumentError(f"{fn}: {name}={value} must be a multiple of {multiple}")
    return value


def check_group_size(fn: str, group_size: object) -> int:
    """-1 means one scale row for all of K (channelwise); otherwise positive."""
    if isinstance(group_size, (bool, np.bool_)) or not isinstance(group_size, (int, np.integer)):
        raise ArgumentTypeError(
            f"{fn}: group_size must be an int, got {type(group_size).__name__}"
        )
    group_size = int(group_size)
    if group_size != -1 and group_size <= 0:
        raise ArgumentError(f"{fn}: group_size={group_size} must be -1 or positive")
    return group_size


def check_shape(fn: str, name: str, a: np.ndarray, expected: tuple[int, ...], why: str) -> None:
    if a.shape != expected:
        raise ArgumentError(f"{fn}: {name} must have shape {expected} ({why}), got {a.shape}")


def check_codes(fn: str, name: str, codes: object, max_value: int = 15) -> np.ndarray:
    """Codes are 2-D integers in 0..max_value (15 for 4 bits, 255 for 8);
    anything else would be silently truncated to a different code by the
    packer."""
    codes = check_ndarray(fn, name, codes)
    check_integer_dtype(fn, name, codes)
    check_ndim(fn, name, codes, 2)
    if codes.size:
        low = 0 if codes.dtype.kind == "u" else int(codes.min())
        high = int(codes.max())
        if low < 0 or high > max_value:
            raise ArgumentError(
                f"{fn}: {name} values must be in 0..{max_value}, got range {low}..{high}"
            )
    return codes


def check_bits(fn: str, bits: object) -> int:
    """Code width: 4 or 8 (the widths the Marlin layouts are defined for)."""
    if isinstance(bits, (bool, np.bool_)) or not isinstance(bits, (int, np.integer)):
        raise ArgumentTypeError(f"{fn}: bits must be an int, got {type(bits).__name__}")
    bits = int(bits)
    if bits not in SUPPORTED_BITS:
        raise ArgumentError(f"{fn}: bits={bits} must be 4 or 8")
    return bits


def check_int_group_size(fn: str, group_size: object, k: int | None = None, k_name: str = "k") -> int:
    """``group_size`` one the integer-weight kernels serve (-1, 32, 64 or a
    power of two >= 128) and, when ``k`` is known, dividing it. Returns the
    rows per group (``k`` itself for -1 when ``k`` is given)."""
    group_size = check_group_size(fn, group_size)
    if not int_group_size_served(group_size):
        raise ArgumentError(f"{fn}: group_size={group_size} must be {INT_GROUP_SIZE_RULE}")
    if k is None:
        return group_size
    if group_size == -1:
        return k
    if k % group_size:
        raise ArgumentError(f"{fn}: {k_name}={k} must be a multiple of group_size={group_size}")
    return group_size


def is_bfloat16(dtype: np.dtype) -> bool:
    """ml_dtypes' bfloat16, recognised by name so ml_dtypes stays optional."""
    return dtype.name == "bfloat16" and dtype.itemsize == 2


def bfloat16_bits_to_float32(bits16: np.ndarray) -> np.ndarray:
    """uint16 bfloat16 bit patterns -> float32 (exact: bf16 is float32's top half)."""
    return (bits16.astype(np.uint32) << 16).view(np.float32)


def check_scale_values(fn: str, name: str, scales: object) -> np.ndarray:
    """Scales of an on-disk format: a float ndarray (fp16/fp32/fp64) or an
    ml_dtypes bfloat16 ndarray. Returned as float32/float64 values (exact)."""
    scales = check_ndarray(fn, name, scales)
    if is_bfloat16(scales.dtype):
        return bfloat16_bits_to_float32(np.ascontiguousarray(scales).view(np.uint16))
    if scales.dtype.kind != "f":
        raise ArgumentTypeError(
            f"{fn}: {name} must have a floating dtype (float16/32/64 or bfloat16), got {scales.dtype}"
        )
    return scales


def check_scales(fn: str, name: str, scales: object) -> np.ndarray:
    scales = check_ndarray(fn, name, scales)
    check_float_dtype(fn, name, scales)
    check_ndim(fn, name, scales, 2)
    return scales


def to_float16_finite(fn: str, name: str, scales: np.ndarray) -> np.ndarray:
    """The kernel reads fp16; a value that overflows (or is NaN) would poison
    every output column it touches, so refuse it here, where it is traceable."""
    with np.errstate(over="ignore"):  # overflow is reported below, by name
        s16 = scales.astype(np.float16)
    if not np.isfinite(s16).all():
        raise ArgumentError(f"{fn}: {name} must be finite in float16 (|s| <= 65504)")
    return s16


def little_endian_bytes(words: np.ndarray) -> np.ndarray:
    """Bytes of 32-bit words in little-endian order, whatever the host: the
    layout puts value i at bits 4i, so byte j always holds values 2j, 2j+1."""
    le = np.ascontiguousarray(words, dtype=words.dtype.newbyteorder("<"))
    return le.view(np.uint8)


def words_from_bytes(nibble_pairs: np.ndarray) -> np.ndarray:
    """Inverse of little_endian_bytes for a contiguous uint8 array whose last
    axis is a multiple of 4; returns native int32."""
    return nibble_pairs.view("<i4").astype(np.int32, copy=False)


def pack_last_axis(values: np.ndarray, bits: int) -> np.ndarray:
    """uint8 values [R, C] (C a multiple of 32/bits, each < 2**bits) -> int32
    [R, C*bits/32]: value ``i`` of each run at bits ``i*bits`` of its word."""
    rows, cols = values.shape
    if bits == 4:
        values = values[:, 0::2] | (values[:, 1::2] << 4)
    return words_from_bytes(np.ascontiguousarray(values, dtype=np.uint8)).reshape(
        rows, cols * bits // 32
    )


def unpack_last_axis(words: np.ndarray, bits: int) -> np.ndarray:
    """Inverse of pack_last_axis: 32-bit words [R, W] -> uint8 [R, W*32/bits]."""
    rows, width = words.shape
    b = little_endian_bytes(words).reshape(rows, 4 * width)
    if bits == 8:
        return b.copy()
    out = np.empty((rows, 8 * width), dtype=np.uint8)
    np.bitwise_and(b, 0x0F, out=out[:, 0::2])
    np.right_shift(b, 4, out=out[:, 1::2])
    return out
