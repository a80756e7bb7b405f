// Pairs of fp16 or bf16 values held in one 32-bit register (the unit of every
// MMA fragment), and the arithmetic the kernels do on them, per activation type.
// Everything is on raw uint32_t so the dequantisation code is written once.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include "ptx.cuh"
#include "types.h"

namespace ferrum {

// Type-agnostic pair helpers (pure bit moves).
__device__ __forceinline__ uint32_t pair_neg(uint32_t x) { return x ^ 0x80008000u; }

template <AType A>
struct Num;

template <>
struct Num<AType::F16> {
  static constexpr bool bf16 = false;
  using Scalar = half;
  static constexpr uint32_t kOne = 0x3c003c00u;
  __device__ static half2 v(uint32_t x) { return *reinterpret_cast<half2*>(&x); }
  __device__ static uint32_t u(half2 x) { return *reinterpret_cast<uint32_t*>(&x); }
  __device__ static uint32_t add(uint32_t a, uint32_t b) { return u(__hadd2(v(a), v(b))); }
  __device__ static uint32_t sub(uint32_t a, uint32_t b) { return u(__hsub2(v(a), v(b))); }
  __device__ static uint32_t mul(uint32_t a, uint32_t b) { return u(__hmul2(v(a), v(b))); }
  __device__ static uint32_t fma(uint32_t a, uint32_t b, uint32_t c) {
    return u(__hfma2(v(a), v(b), v(c)));
  }
  // a times (minus) the low or the high half of pair b, on both halves: the
  // broadcast is the instruction's operand selector, not a byte permute.
  __device__ static uint32_t mul_low(uint32_t a, uint32_t b) { return u(__hmul2(v(a), __low2half2(v(b)))); }
  __device__ static uint32_t mul_high(uint32_t a, uint32_t b) { return u(__hmul2(v(a), __high2half2(v(b)))); }
  __device__ static uint32_t sub_low(uint32_t a, uint32_t b) { return u(__hsub2(v(a), __low2half2(v(b)))); }
  __device__ static uint32_t sub_high(uint32_t a, uint32_t b) { return u(__hsub2(v(a), __high2half2(v(b)))); }
  // a * b plus the low or the high half of pair c, on both halves.
  __device__ static uint32_t fma_low(uint32_t a, uint32_t b, uint32_t c) {
    return u(__hfma2(v(a), v(b), __low2half2(v(c))));
  }
  __device__ static uint32_t fma_high(uint32_t a, uint32_t b, uint32_t c) {
    return u(__hfma2(v(a), v(b), __high2half2(v(c))));
  }
  __device__ static float2 to_float2(uint32_t a) { return __half22float2(v(a)); }
  __device__ static uint32_t from_floats(float lo, float hi) { return u(__floats2half2_rn(lo, hi)); }
  // Fire-and-forget reduction in L2: atomicAdd's returning form makes every
  // add wait a full round trip (and takes a fallback loop).
  __device__ static void atomic_add(void* p, uint32_t x) {
    asm volatile("red.relaxed.gpu.global.add.noftz.f16x2 [%0], %1;\n" ::"l"(p), "r"(x) : "memory");
  }
};

template <>
struct Num<AType::BF16> {
  static constexpr bool bf16 = true;
  using Scalar = __nv_bfloat16;
  static constexpr uint32_t kOne = 0x3f803f80u;
  __device__ static __nv_bfloat162 v(uint32_t x) { return *reinterpret_cast<__nv_bfloat162*>(&x); }
  __device__ static uint32_t u(__nv_bfloat162 x) { return *reinterpret_cast<uint32_t*>(&x); }
  __device__ static uint32_t add(uint32_t a, uint32_t b) { return u(__hadd2(v(a), v(b))); }
  __device__ static uint32_t sub(uint32_t a, uint32_t b) { return u(__hsub2(v(a), v(b))); }
  __device__ static uint32_t mul(uint32_t a, uint32_t b) { return u(__hmul2(v(a), v(b))); }
  __device__ static uint32_t fma(uint32_t a, uint32_t b, uint32_t c) {
    return u(__hfma2(v(a), v(b), v(c)));
  }
  // a times (minus) the low or the high half of pair b, on both halves: the
  // broadcast is the instruction's operand selector, not a byte permute.
  __device__ static uint32_t mul_low(uint32_t a, uint32_t b) { return u(__hmul2(v(a), __low2bfloat162(v(b)))); }
  __device__ static uint32_t mul_high(uint32_t a, uint32_t b) { return u(__hmul2(v(a), __high2bfloat162(v(b)))); }
  __device__ static uint32_t sub_low(uint32_t a, uint32_t b) { return u(__hsub2(v(a), __low2bfloat162(v(b)))); }
  __device__ static uint32_t sub_high(uint32_t a, uint32_t b) { return u(__hsub2(v(a), __high2bfloat162(v(b)))); }
  // A bf16 is the top half of its fp32: one shift and one mask (the intrinsic
  // spends a byte permute and a multiply on the high half).
  __device__ static float2 to_float2(uint32_t a) {
    return make_float2(__uint_as_float(a << 16), __uint_as_float(a & 0xffff0000u));
  }
  __device__ static uint32_t from_floats(float lo, float hi) {
    return u(__floats2bfloat162_rn(lo, hi));
  }
  __device__ static void atomic_add(void* p, uint32_t x) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("red.relaxed.gpu.global.add.noftz.bf16x2 [%0], %1;\n" ::"l"(p), "r"(x) : "memory");
#else
    atomicAdd(static_cast<__nv_bfloat162*>(p), v(x));  // no bf16x2 reduction before sm_90
#endif
  }
};

// Adds eight values to a 16-byte aligned address: on Hopper one vector
// reduction (one L2 operation instead of four: at the end of a launch every
// block adds a column tile at once, and scalar reductions queued in L2).
template <class N>
__device__ __forceinline__ void atomic_add8(void* p, int4 x) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if constexpr (N::bf16)
    asm volatile("red.relaxed.gpu.global.add.noftz.v4.bf16x2 [%0], {%1, %2, %3, %4};\n" ::"l"(p), "r"(x.x), "r"(x.y),
                 "r"(x.z), "r"(x.w)
                 : "memory");
  else
    asm volatile("red.relaxed.gpu.global.add.noftz.v4.f16x2 [%0], {%1, %2, %3, %4};\n" ::"l"(p), "r"(x.x), "r"(x.y),
                 "r"(x.z), "r"(x.w)
                 : "memory");
#else
  char* const c = static_cast<char*>(p);
  N::atomic_add(c, x.x);
  N::atomic_add(c + 4, x.y);
  N::atomic_add(c + 8, x.z);
  N::atomic_add(c + 12, x.w);
#endif
}

}  // namespace ferrum
