"""Host-side weight formats: INT4 quantisation, the on-disk checkpoint layouts
(GPTQ, AWQ, compressed-tensors pack-quantized, FP8-E4M3) and the Marlin
layouts the kernels consume (see :mod:`.marlin` for why); :mod:`.prepare`
turns each format into the host buffers of a general-GEMM weight."""

from .awq import (
    awq_pack,
    awq_reference_dequant,
    awq_to_marlin,
    awq_unpack,
    awq_unpack_zeros,
)
from .compressed_tensors import (
    ct_pack,
    ct_pack_zero_points,
    ct_reference_dequant,
    ct_to_marlin,
    ct_unpack,
    ct_unpack_zero_points,
)
from .fp8 import (
    FP8_EXPONENT_BIAS_FACTOR,
    e4m3_decode_bits,
    e4m3_to_float,
    e4m3_to_kernel_fp16,
    fp8_reference_dequant,
    prepare_block_fp8_weight_for_fp8_marlin,
    prepare_fp8_weight_for_marlin,
)
from .gptq import (
    gptq_pack,
    gptq_pack_int4,
    gptq_reference_dequant,
    gptq_unpack,
    gptq_unpack_int4,
    gptq_unpack_zeros,
    gptq_zero_points,
    permute_gptq_qweight_rows,
    repack_gptq_to_marlin,
    repack_gptq_to_marlin_bits,
    repack_marlin_to_gptq,
    repack_scales_to_marlin,
)
from .marlin import (
    marlin_pack_int4,
    marlin_pack_int8,
    marlin_pack_zero_points,
    marlin_permute_scales,
    marlin_unpack_int4,
    marlin_unpack_int8,
    marlin_unpack_zero_points,
    marlin_unpermute_scales,
)
from .prepare import (
    PreparedLinear,
    prepare_awq,
    prepare_compressed_tensors,
    prepare_float,
    prepare_fp8,
    prepare_gptq,
)
from .quantize import dequantize_int4_symmetric, quantize_int4_symmetric
from .rtn import dequantize_rtn, quantize_rtn

__all__ = [
    "marlin_pack_int4",
    "marlin_unpack_int4",
    "marlin_pack_int8",
    "marlin_unpack_int8",
    "marlin_permute_scales",
    "marlin_unpermute_scales",
    "marlin_pack_zero_points",
    "marlin_unpack_zero_points",
    "gptq_unpack_int4",
    "gptq_pack_int4",
    "gptq_unpack",
    "gptq_pack",
    "gptq_unpack_zeros",
    "gptq_zero_points",
    "gptq_reference_dequant",
    "repack_gptq_to_marlin",
    "repack_gptq_to_marlin_bits",
    "repack_marlin_to_gptq",
    "repack_scales_to_marlin",
    "permute_gptq_qweight_rows",
    "awq_unpack",
    "awq_unpack_zeros",
    "awq_pack",
    "awq_reference_dequant",
    "awq_to_marlin",
    "ct_unpack",
    "ct_pack",
    "ct_unpack_zero_points",
    "ct_pack_zero_points",
    "ct_reference_dequant",
    "ct_to_marlin",
    "FP8_EXPONENT_BIAS_FACTOR",
    "e4m3_to_float",
    "e4m3_decode_bits",
    "e4m3_to_kernel_fp16",
    "fp8_reference_dequant",
    "prepare_fp8_weight_for_marlin",
    "prepare_block_fp8_weight_for_fp8_marlin",
    "quantize_int4_symmetric",
    "dequantize_int4_symmetric",
    "quantize_rtn",
    "dequantize_rtn",
    "PreparedLinear",
    "prepare_gptq",
    "prepare_awq",
    "prepare_compressed_tensors",
    "prepare_fp8",
    "prepare_float",
]
