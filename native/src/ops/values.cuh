// Loading and storing activations as fp32, one element at a time or eight
// 16-bit elements per 16-byte access, so that each op's arithmetic is written
// once in fp32 and rounded to the output type exactly once.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include "core/numeric.cuh"

namespace ferrum::ops {

template <AType A>
using Scalar = typename Num<A>::Scalar;

__device__ __forceinline__ float to_float(half x) { return __half2float(x); }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_float(float x) { return x; }

template <class T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ half from_float<half>(float x) {
  return __float2half_rn(x);
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

// W consecutive elements of A at p. W % 8 == 0 uses 16-byte accesses (p must
// then be 16-byte aligned); any other W goes element by element.
template <AType A, int W>
struct Pack {
  static constexpr bool kVector = W % 8 == 0;

  __device__ __forceinline__ static void load(const Scalar<A>* p, float (&v)[W]) {
    if constexpr (kVector) {
#pragma unroll
      for (int q = 0; q < W / 8; ++q) {
        const uint4 w = __ldg(reinterpret_cast<const uint4*>(p) + q);
        const uint32_t words[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const float2 f = Num<A>::to_float2(words[i]);
          v[8 * q + 2 * i] = f.x;
          v[8 * q + 2 * i + 1] = f.y;
        }
      }
    } else {
#pragma unroll
      for (int i = 0; i < W; ++i) v[i] = to_float(p[i]);
    }
  }

  __device__ __forceinline__ static void store(Scalar<A>* p, const float (&v)[W]) {
    if constexpr (kVector) {
#pragma unroll
      for (int q = 0; q < W / 8; ++q) {
        uint4 w;
        w.x = Num<A>::from_floats(v[8 * q + 0], v[8 * q + 1]);
        w.y = Num<A>::from_floats(v[8 * q + 2], v[8 * q + 3]);
        w.z = Num<A>::from_floats(v[8 * q + 4], v[8 * q + 5]);
        w.w = Num<A>::from_floats(v[8 * q + 6], v[8 * q + 7]);
        reinterpret_cast<uint4*>(p)[q] = w;
      }
    } else {
#pragma unroll
      for (int i = 0; i < W; ++i) p[i] = from_float<Scalar<A>>(v[i]);
    }
  }
};

}  // namespace ferrum::ops
