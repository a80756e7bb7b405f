// Hopper tensor-memory-accelerator copies (sm_90): one instruction moves a
// 2-D box of a tensor map (core/tensor_map.h) into shared memory and completes
// its bytes on an mbarrier there. Only the wide kernel (sm_90a) uses them;
// elsewhere the wrappers trap.
#pragma once

#include <cuda.h>
#include <stdint.h>

#include "ptx.cuh"

namespace ferrum::tma {

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define FERRUM_TMA_AVAILABLE 1
#endif

// Box (x, y) of `map` (x the contiguous coordinate, in elements) into `dst`;
// its bytes complete on `bar` (a box past the tensor's end arrives as zeros,
// its bytes counted all the same).
__device__ __forceinline__ void load_2d(void* dst, const CUtensorMap* map, int x, int y, uint64_t* bar) {
#ifdef FERRUM_TMA_AVAILABLE
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::"r"(
          ptx::smem_u32(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(x), "r"(y), "r"(ptx::smem_u32(bar))
      : "memory");
#else
  __trap();
#endif
}

// Arrives on `bar` and announces `bytes` more transaction bytes for its phase.
__device__ __forceinline__ void arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
#ifdef FERRUM_TMA_AVAILABLE
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(ptx::smem_u32(bar)), "r"(bytes)
               : "memory");
#else
  __trap();
#endif
}

}  // namespace ferrum::tma
