// Shared-memory barriers (mbarrier) for the warp-specialised Hopper kernel: a
// producer warpgroup fills pipeline slots with cp.async (each copy marks the
// slot's "full" barrier when it lands) and tensor copies (core/tma.cuh, whose
// bytes complete the barrier's phase); consumers mark the slot's "empty"
// barrier when the tensor cores are done with it. Phases alternate, so a
// waiter passes the parity of the fill (or drain) it waits for.
#pragma once

#include <stdint.h>
#include <cstdio>

#include "ptx.cuh"

namespace ferrum::mbar {

__device__ __forceinline__ void init(uint64_t* bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(ptx::smem_u32(bar)), "r"(count) : "memory");
}

__device__ __forceinline__ void arrive(uint64_t* bar) {
  asm volatile("{\n.reg .b64 state;\nmbarrier.arrive.shared::cta.b64 state, [%0];\n}\n" ::"r"(ptx::smem_u32(bar))
               : "memory");
}

// Arrives once every cp.async this thread issued so far has landed. The
// barrier's count must include this arrival (no increment of the pending count).
__device__ __forceinline__ void arrive_on_copies(uint64_t* bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(ptx::smem_u32(bar)) : "memory");
}

// Blocks until the phase with the given parity has completed. Built with
// FERRUM_DEBUG_WAITS (CMake option of that name), a wait that polls 2^22 times
// prints the block, thread and barrier and traps: a wrong pipeline protocol
// then fails its test instead of hanging the device.
__device__ __forceinline__ void wait(uint64_t* bar, uint32_t parity) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && defined(FERRUM_DEBUG_WAITS)
  for (uint32_t polls = 0;; ++polls) {
    uint32_t done;
    asm volatile(
        "{\n.reg .pred p;\n"
        "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(ptx::smem_u32(bar)), "r"(parity)
        : "memory");
    if (done) return;
    if (polls == (1u << 22)) {
      printf("ferrum: mbarrier wait stuck: block %d thread %d barrier +%u parity %u\n", blockIdx.x, threadIdx.x,
             ptx::smem_u32(bar), parity);
      __trap();
    }
  }
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile(
      "{\n.reg .pred done;\n"
      "WAIT_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT_%=;\n}\n" ::"r"(ptx::smem_u32(bar)),
      "r"(parity)
      : "memory");
#else
  (void)bar;
  (void)parity;
  __trap();
#endif
}

// A barrier over `Threads` threads of the block (id 0 is __syncthreads').
template <int Id, int Threads>
__device__ __forceinline__ void named_sync() {
  asm volatile("bar.sync %0, %1;\n" ::"n"(Id), "n"(Threads) : "memory");
}

}  // namespace ferrum::mbar
