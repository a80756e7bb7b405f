"""Host-side weight formats: INT4 quantisation, the GPTQ checkpoint layout and
the Marlin layout the W4A16 kernel consumes (see :mod:`.marlin` for why)."""

from .gptq import (
    gptq_pack_int4,
    gptq_unpack_int4,
    permute_gptq_qweight_rows,
    repack_gptq_to_marlin,
    repack_marlin_to_gptq,
    repack_scales_to_marlin,
)
from .marlin import (
    marlin_pack_int4,
    marlin_permute_scales,
    marlin_unpack_int4,
    marlin_unpermute_scales,
)
from .quantize import dequantize_int4_symmetric, quantize_int4_symmetric

__all__ = [
    "marlin_pack_int4",
    "marlin_unpack_int4",
    "marlin_permute_scales",
    "marlin_unpermute_scales",
    "gptq_unpack_int4",
    "gptq_pack_int4",
    "repack_gptq_to_marlin",
    "repack_marlin_to_gptq",
    "repack_scales_to_marlin",
    "permute_gptq_qweight_rows",
    "quantize_int4_symmetric",
    "dequantize_int4_symmetric",
]
