"""ferrum_ffi: Marlin mixed-precision GEMMs for any CUDA array, through ctypes.

The native library (libferrum_marlin.so) is loaded on first use; everything in
``ferrum_ffi.formats`` and ``ferrum_ffi.validation`` works without a GPU.
"""

from ._abi import ActivationType, MmFlag, WeightType
from ._interop import Bfloat16Array, bfloat16_view
from ._native import ABI_VERSION, device_count, library
from .checkpoint import load_linear
from .dense import (
    MarlinWeight,
    launch_marlin_cuda,
    marlin_gemm,
    marlin_gemm_with_offset,
    marlin_gemm_with_offset_strided,
)
from .formats import (
    permute_gptq_qweight_rows,
    repack_gptq_to_marlin,
    repack_marlin_to_gptq,
    repack_scales_to_marlin,
)
from .moe_layer import FusedMoE, fused_moe, route
from .general_gemm import linear, release_scratch
from .mm import launch_marlin_mm
from .moe import (
    configure_moe_profile_sink,
    launch_marlin_cuda_moe,
    launch_marlin_moe,
    launch_marlin_moe_mxfp4_bf16,
)
from .moe_ops import gpt_oss_swiglu, moe_align_block_size, moe_sum, silu_and_mul, topk_softmax
from .moe_validation import (
    MarlinMoeF16Launch,
    MarlinMoeMxfp4Bf16Launch,
    MoeBucketProblem,
    MoeF16WeightType,
)
from .moe_weights import MOE_KINDS, MarlinMoeWeight
from .profile import drain_profile, profile_label, record_gather, runtime_config
from .status import (
    ArgumentError,
    ArgumentTypeError,
    FerrumError,
    LibraryError,
    NativeError,
    ProfileSinkError,
    StagedNativeStatus,
)
from .validation import MmProblem, W4A16Problem
from .weights import MarlinLinearWeight

__version__ = "0.1.0"

__all__ = [
    "ABI_VERSION",
    "ActivationType",
    "ArgumentError",
    "ArgumentTypeError",
    "Bfloat16Array",
    "FerrumError",
    "FusedMoE",
    "LibraryError",
    "MOE_KINDS",
    "MarlinLinearWeight",
    "MarlinMoeF16Launch",
    "MarlinMoeMxfp4Bf16Launch",
    "MarlinMoeWeight",
    "MarlinWeight",
    "MmFlag",
    "MmProblem",
    "MoeBucketProblem",
    "MoeF16WeightType",
    "NativeError",
    "ProfileSinkError",
    "StagedNativeStatus",
    "W4A16Problem",
    "WeightType",
    "bfloat16_view",
    "configure_moe_profile_sink",
    "device_count",
    "drain_profile",
    "fused_moe",
    "gpt_oss_swiglu",
    "launch_marlin_cuda",
    "launch_marlin_cuda_moe",
    "launch_marlin_mm",
    "launch_marlin_moe",
    "launch_marlin_moe_mxfp4_bf16",
    "library",
    "linear",
    "load_linear",
    "marlin_gemm",
    "marlin_gemm_with_offset",
    "marlin_gemm_with_offset_strided",
    "moe_align_block_size",
    "moe_sum",
    "permute_gptq_qweight_rows",
    "profile_label",
    "record_gather",
    "release_scratch",
    "repack_gptq_to_marlin",
    "repack_marlin_to_gptq",
    "repack_scales_to_marlin",
    "route",
    "runtime_config",
    "silu_and_mul",
    "topk_softmax",
]
