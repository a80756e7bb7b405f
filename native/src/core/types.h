// Activation and weight type ids shared by host and device code; the values
// are the public ones of ferrum_marlin.h.
#pragma once

#include "ferrum_marlin.h"

namespace ferrum {

enum class AType : int { F16 = FERRUM_DTYPE_F16, BF16 = FERRUM_DTYPE_BF16 };

enum class WType : int {
  U4 = FERRUM_WEIGHT_U4,            // INT4 with a zero point per group and column
  U4B8 = FERRUM_WEIGHT_U4B8,        // INT4, symmetric, bias 8
  U8B128 = FERRUM_WEIGHT_U8B128,    // 8-bit, symmetric, bias 128
  FE4M3FN = FERRUM_WEIGHT_FE4M3FN,  // FP8 E4M3, scales carry FERRUM_FP8_SCALE_FACTOR
  FE2M1 = 5,                        // MXFP4 (MoE only): E2M1 codes, E8M0 scales per 32
};

constexpr int kMaxDevices = 64;  // per-device caches of launch attributes

constexpr int weight_bits(WType w) { return (w == WType::U8B128 || w == WType::FE4M3FN) ? 8 : 4; }

// Group sizes of the integer-weight kernels: -1 (channelwise), 32 and 64
// (several groups per 128-deep stage), or a power of two >= 128 (a stage lies
// inside one group). The kernels address groups by shifts.
constexpr bool int_group_size_served(int g) { return g == -1 || g == 32 || g == 64 || (g >= 128 && (g & (g - 1)) == 0); }

// log2 of a power of two.
constexpr int log2_exact(int x) { return x <= 1 ? 0 : 1 + log2_exact(x / 2); }

}  // namespace ferrum
