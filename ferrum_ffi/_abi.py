"""The numbers of the C ABI (general Marlin GEMM, fused MoE, MoE ops), written once.

Every value here mirrors a ``#define`` of ``native/include/ferrum_marlin.h``
under the same name (tests/test_abi.py parses the header and checks each one).
The enums give the same numbers readable names for the Python API.
"""

from __future__ import annotations

import enum

# Activation types (FerrumMarlinLaunch.a_type): activations, scales, bias and C share it.
FERRUM_DTYPE_F16 = 1
FERRUM_DTYPE_BF16 = 2
# Only the MoE ops take it (router logits of ferrum_topk_softmax); no GEMM does,
# so it is not an ActivationType.
FERRUM_DTYPE_F32 = 3

# Weight types (FerrumMarlinLaunch.b_type).
FERRUM_WEIGHT_U4 = 1  # INT4 codes with a zero point per group and column: (q - z) * s
FERRUM_WEIGHT_U4B8 = 2  # INT4 codes, symmetric, bias 8: (q - 8) * s
FERRUM_WEIGHT_U8B128 = 3  # 8-bit codes, symmetric, bias 128: (q - 128) * s
FERRUM_WEIGHT_FE4M3FN = 4  # FP8 E4M3 bytes: e4m3(q) * s / 256

# Group sizes of integer weights (general GEMM, INT4 MoE): -1 (channelwise), 32,
# 64, or a power of two >= 128 (the kernels address groups by shifts).
INT_GROUP_SIZE_RULE = "-1, 32, 64 or a power of two >= 128"


def int_group_size_served(group_size: int) -> bool:
    """Whether the integer-weight kernels serve ``group_size`` (INT_GROUP_SIZE_RULE)."""
    g = int(group_size)
    return g in (-1, 32, 64) or (g >= 128 and g & (g - 1) == 0)


# Flag bits (FerrumMarlinLaunch.flags).
FERRUM_MM_FLAG_ACT_ORDER = 0x1
FERRUM_MM_FLAG_K_FULL = 0x2
FERRUM_MM_FLAG_HAS_ZERO_POINTS = 0x4
FERRUM_MM_FLAG_ATOMIC_ADD = 0x8
FERRUM_MM_FLAG_FP32_REDUCE = 0x10

FERRUM_MM_LAUNCH_VERSION = 1
# FE4M3FN scales carry this factor: the kernel's byte -> fp16 move yields e4m3(q) / 256.
FERRUM_FP8_SCALE_FACTOR = 256
# The largest n, k and row stride any entry point accepts: strides are 32-bit products of them.
FERRUM_MAX_DIM = 2**28
FERRUM_MM_WORKSPACE_INTS_PER_SM = 4
FERRUM_MM_C_TMP_FLOATS_PER_SM = 65536

# Fused-MoE GEMM scratch: int32 locks per multiprocessor, and fp32 c_tmp floats per
# multiprocessor and per row of moe_block_size (two resident blocks per SM, each
# owning up to two moe_block_size x 256 fp32 tiles).
FERRUM_MOE_WORKSPACE_INTS_PER_SM = 4
FERRUM_MOE_C_TMP_FLOATS_PER_SM_PER_ROW = 1024
# routing_flags bits of the fused-MoE layer entries (the _ex variants).
FERRUM_MOE_ROUTING_SETTLED = 0x1
FERRUM_MOE_ROUTING_DIRECT = 0x2

MM_FLAGS_KNOWN = (
    FERRUM_MM_FLAG_ACT_ORDER
    | FERRUM_MM_FLAG_K_FULL
    | FERRUM_MM_FLAG_HAS_ZERO_POINTS
    | FERRUM_MM_FLAG_ATOMIC_ADD
    | FERRUM_MM_FLAG_FP32_REDUCE
)


class ActivationType(enum.IntEnum):
    """``a_type``: the dtype of activations, scales, bias and output."""

    F16 = FERRUM_DTYPE_F16
    BF16 = FERRUM_DTYPE_BF16


class WeightType(enum.IntEnum):
    """``b_type``: how the packed weight codes dequantise."""

    U4 = FERRUM_WEIGHT_U4
    U4B8 = FERRUM_WEIGHT_U4B8
    U8B128 = FERRUM_WEIGHT_U8B128
    FE4M3FN = FERRUM_WEIGHT_FE4M3FN

    @property
    def bits(self) -> int:
        """Bits per packed code: the 4-bit or the 8-bit Marlin layout."""
        return 4 if self in (WeightType.U4, WeightType.U4B8) else 8

    @property
    def is_integer(self) -> bool:
        """Integer codes (act-order and group sizes 32/64 are defined only for these)."""
        return self is not WeightType.FE4M3FN


class MmFlag(enum.IntFlag):
    """``flags`` bits of a launch."""

    ACT_ORDER = FERRUM_MM_FLAG_ACT_ORDER
    K_FULL = FERRUM_MM_FLAG_K_FULL
    HAS_ZERO_POINTS = FERRUM_MM_FLAG_HAS_ZERO_POINTS
    ATOMIC_ADD = FERRUM_MM_FLAG_ATOMIC_ADD
    FP32_REDUCE = FERRUM_MM_FLAG_FP32_REDUCE
