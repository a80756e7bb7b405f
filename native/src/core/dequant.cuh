// Dequantisation of Marlin-packed weights straight into tensor-core fragments.
//
// The kernels compute C^T = W^T . A^T: the weight is the MMA's *A* operand
// (16 output columns x 16 input features per fragment) and the activations are
// its *B* operand. A Marlin-packed 32-bit word holds exactly the eight values
// one lane needs for one 16x16 tile, in the order
//   nibble: 0      1        2        3        4        5        6        7
//   value : W(r,c) W(r+8,c) W(r,c+8) W(r+8,c+8) W(r+1,c) W(r+9,c) W(r+1,c+8) W(r+9,c+8)
// with r = 2*(lane%4) along K and c = lane/4 along N. Masking nibbles 0|4 and
// 1|5 (then 2|6 and 3|7 after a byte shift) and OR-ing the fp16 exponent of
// 1024 yields two half2 values per lop3 — the pairs (k, k+1) at one column that
// an m16n8k16 A fragment holds in one register. See formats/marlin.py.
#pragma once

#include "ptx.cuh"

namespace ferrum {

// One 16x16 W^T fragment: {a0a1, a2a3, a4a5, a6a7} of mma.m16n8k16 (row g,
// row g+8, row g k+8, row g+8 k+8), g = lane/4.
struct Frag16x16 {
  uint32_t r[4];
};

// The raw fp16 images of a Marlin INT4 word: 1024 + q in the k, k+1 registers
// (r[0], r[1]) and 1024 + 16 q in the k+8, k+9 registers (r[2], r[3]). Four
// lop3 and one shift; no floating-point work.
__device__ __forceinline__ Frag16x16 extract_u4(uint32_t word) {
  constexpr uint32_t kLow = 0x000f000fu;   // nibbles 0 and 4 (then 2 and 6)
  constexpr uint32_t kHigh = 0x00f000f0u;  // nibbles 1 and 5 (then 3 and 7), x16
  constexpr uint32_t kExp = 0x64006400u;   // fp16 1024.0 in both halves
  constexpr uint32_t kOr = 0xEAu;          // lop3 table for (a & b) | c
  Frag16x16 f;
  f.r[0] = ptx::lop3<kOr>(word, kLow, kExp);   // row g,   k, k+1
  f.r[2] = ptx::lop3<kOr>(word, kHigh, kExp);  // row g,   k+8, k+9
  word >>= 8;
  f.r[1] = ptx::lop3<kOr>(word, kLow, kExp);   // row g+8, k, k+1
  f.r[3] = ptx::lop3<kOr>(word, kHigh, kExp);  // row g+8, k+8, k+9
  return f;
}

// INT4 with zero point 8 (U4B8) -> fp16 fragment of q - 8, exact.
__device__ __forceinline__ Frag16x16 dequant_u4b8(uint32_t word) {
  Frag16x16 f = extract_u4(word);
  // 1024 + q - 1032 = q - 8;  (1024 + 16 q) / 16 - 72 = q - 8: both exact in fp16.
  const half2 bias_lo = ptx::as_half2(0x64086408u);  // 1032
  const half2 inv16 = ptx::as_half2(0x2c002c00u);    // 1/16
  const half2 bias_hi = ptx::as_half2(0xd480d480u);  // -72
  f.r[0] = ptx::as_u32(__hsub2(ptx::as_half2(f.r[0]), bias_lo));
  f.r[1] = ptx::as_u32(__hsub2(ptx::as_half2(f.r[1]), bias_lo));
  f.r[2] = ptx::as_u32(__hfma2(ptx::as_half2(f.r[2]), inv16, bias_hi));
  f.r[3] = ptx::as_u32(__hfma2(ptx::as_half2(f.r[3]), inv16, bias_hi));
  return f;
}

// Bias-free U4B8 for small activation slabs, where the tensor cores idle but
// the fp16 pipe is the bottleneck: multiply the raw images of extract_u4 with
// activations whose k+8 half is pre-scaled by 1/16 (exact), then add the same
// product of this constant fragment, which removes 1032 a (low half) and
// 1152 a/16 = 72 a (high half): sum (q - 8) a with fp32 accumulation.
__device__ __forceinline__ Frag16x16 u4b8_bias_fragment() {
  Frag16x16 f;
  f.r[0] = f.r[1] = 0xe408e408u;  // -1032
  f.r[2] = f.r[3] = 0xe480e480u;  // -1152
  return f;
}

// Grouped scales: `pair` holds {scale(row g), scale(row g+8)} of one tile, the
// order the Marlin scale permutation gives each lane.
__device__ __forceinline__ void scale_frag(Frag16x16& f, uint32_t pair) {
  const half2 s = ptx::as_half2(pair);
  const half2 s_g = __low2half2(s);
  const half2 s_g8 = __high2half2(s);
  f.r[0] = ptx::as_u32(__hmul2(ptx::as_half2(f.r[0]), s_g));
  f.r[2] = ptx::as_u32(__hmul2(ptx::as_half2(f.r[2]), s_g));
  f.r[1] = ptx::as_u32(__hmul2(ptx::as_half2(f.r[1]), s_g8));
  f.r[3] = ptx::as_u32(__hmul2(ptx::as_half2(f.r[3]), s_g8));
}

}  // namespace ferrum
