// Hopper warpgroup MMA (sm_90a): the weight fragment comes from registers (the
// same 16x16 fragment per warp that mma.m16n8k16 takes, so dequant.cuh serves
// both), the activations from shared memory through a matrix descriptor.
//
// Only compiled into sm_90a code; elsewhere the wrappers trap, and the host
// never selects a wgmma tile for them (see FERRUM_HAVE_SM90A).
#pragma once

#include <stdint.h>

#include <type_traits>

#include "ptx.cuh"

namespace ferrum::wgmma {

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define FERRUM_WGMMA_AVAILABLE 1
#endif

// K-major operand in 128-byte-swizzled rows (the layout load_stage writes:
// 16-byte unit u of row r at u ^ (r % 8)), 8-row groups 1024 bytes apart.
// Advancing 16 fp16 along K inside the 128-byte row adds 32 bytes to the start.
__device__ __forceinline__ uint64_t sw128_kmajor_desc(const void* smem) {
  const uint64_t addr = static_cast<uint64_t>(ptx::smem_u32(smem));
  uint64_t desc = (addr & 0x3FFFF) >> 4;      // start address, bits 0-13
  desc |= static_cast<uint64_t>(1) << 16;     // leading byte offset: unused for swizzled K-major
  desc |= static_cast<uint64_t>(1024 >> 4) << 32;  // stride byte offset: 8 rows x 128 B
  desc |= static_cast<uint64_t>(1) << 62;     // layout: 128-byte swizzle
  return desc;
}

__device__ __forceinline__ void fence() {
#ifdef FERRUM_WGMMA_AVAILABLE
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#else
  __trap();
#endif
}

__device__ __forceinline__ void commit() {
#ifdef FERRUM_WGMMA_AVAILABLE
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}

template <int Pending>
__device__ __forceinline__ void wait() {
#ifdef FERRUM_WGMMA_AVAILABLE
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(Pending) : "memory");
#endif
}

// Ties accumulators to this point: the compiler may not move their reads or
// writes across it. The tensor cores write them asynchronously, so their
// values are final only after a wait_group, and nothing in the wgmma or wait
// statements tells the compiler so (CUTLASS fences its operands the same way).
template <class Accumulators>
__device__ __forceinline__ void fence_operands(Accumulators& acc) {
  static_assert(std::is_array_v<Accumulators> && std::is_same_v<std::remove_all_extents_t<Accumulators>, float>,
                "an array of fp32 accumulators");
  float* const v = reinterpret_cast<float*>(&acc);
#pragma unroll
  for (int i = 0; i < static_cast<int>(sizeof(Accumulators) / sizeof(float)); ++i)
    asm volatile("" : "+f"(v[i])::"memory");
}

// Hands registers from the copying warpgroup to the computing ones (the
// per-thread limits of a warpgroup; the block's total must not grow).
template <int Regs>
__device__ __forceinline__ void release_registers() {
#ifdef FERRUM_WGMMA_AVAILABLE
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(Regs));
#endif
}
template <int Regs>
__device__ __forceinline__ void claim_registers() {
#ifdef FERRUM_WGMMA_AVAILABLE
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(Regs));
#endif
}

// Shared-memory writes by ordinary instructions (cp.async included) become
// visible to wgmma's async proxy only after this fence.
__device__ __forceinline__ void fence_async_shared() {
#ifdef FERRUM_WGMMA_AVAILABLE
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}

// D[64 x N] = A[64 x 16] (registers) * B[16 x N] (shared) + (keep_d ? D : 0); fp16 or bf16
// inputs, fp32 D. Warp w of the warpgroup holds rows 16w..16w+15 of A and of D;
// d[j][e] is (row g + 8(e/2), column 8j + 2q + e%2) as in mma.m16n8k16, with
// g = lane / 4, q = lane % 4. (Generated operand lists: N/2 accumulators.)
#define FERRUM_WGMMA_INS "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(keep_d)
#define FERRUM_WGMMA_D4(j) "+f"(d[j][0]), "+f"(d[j][1]), "+f"(d[j][2]), "+f"(d[j][3])
// Operand numbers: the accumulators %0.. first (lists growing with N), then
// the four A registers, the descriptor and keep_d.
#define FERRUM_WGMMA_TEXT(SHAPE, TYPE, DREGS, A0, A1, A2, A3, DESC, KEEP)                              \
  "{\n.reg .pred p;\nsetp.ne.b32 p, %" #KEEP ", 0;\n"                                                 \
  "wgmma.mma_async.sync.aligned." SHAPE ".f32." TYPE "." TYPE " {" DREGS "}, "                          \
  "{%" #A0 ", %" #A1 ", %" #A2 ", %" #A3 "}, %" #DESC ", p, 1, 1, 0;\n}\n"
#define FERRUM_WGMMA_R0_7 "%0, %1, %2, %3, %4, %5, %6, %7"
#define FERRUM_WGMMA_R8_15 ", %8, %9, %10, %11, %12, %13, %14, %15"
#define FERRUM_WGMMA_R8_23 ", %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23"
#define FERRUM_WGMMA_R8_31 \
  ", %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, " \
  "%24, %25, %26, %27, %28, %29, %30, %31"
#define FERRUM_WGMMA_R32_63 \
  ", %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
  "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define FERRUM_WGMMA_R64_127 \
  ", %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, " \
  "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, " \
  "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, " \
  "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
#define FERRUM_WGMMA_D0_1 FERRUM_WGMMA_D4(0), FERRUM_WGMMA_D4(1)
#define FERRUM_WGMMA_D2_7 \
  FERRUM_WGMMA_D4(2), FERRUM_WGMMA_D4(3), FERRUM_WGMMA_D4(4), FERRUM_WGMMA_D4(5), FERRUM_WGMMA_D4(6), \
  FERRUM_WGMMA_D4(7)
#define FERRUM_WGMMA_D8_15 \
  FERRUM_WGMMA_D4(8), FERRUM_WGMMA_D4(9), FERRUM_WGMMA_D4(10), FERRUM_WGMMA_D4(11), FERRUM_WGMMA_D4(12), \
  FERRUM_WGMMA_D4(13), FERRUM_WGMMA_D4(14), FERRUM_WGMMA_D4(15)
#define FERRUM_WGMMA_D16_31 \
  FERRUM_WGMMA_D4(16), FERRUM_WGMMA_D4(17), FERRUM_WGMMA_D4(18), FERRUM_WGMMA_D4(19), FERRUM_WGMMA_D4(20), \
  FERRUM_WGMMA_D4(21), FERRUM_WGMMA_D4(22), FERRUM_WGMMA_D4(23), FERRUM_WGMMA_D4(24), FERRUM_WGMMA_D4(25), \
  FERRUM_WGMMA_D4(26), FERRUM_WGMMA_D4(27), FERRUM_WGMMA_D4(28), FERRUM_WGMMA_D4(29), FERRUM_WGMMA_D4(30), \
  FERRUM_WGMMA_D4(31)
#define FERRUM_WGMMA_N16_TEXT(TYPE) FERRUM_WGMMA_TEXT("m64n16k16", TYPE, FERRUM_WGMMA_R0_7, 8, 9, 10, 11, 12, 13)
#define FERRUM_WGMMA_N16_OUTS FERRUM_WGMMA_D0_1
#define FERRUM_WGMMA_N32_TEXT(TYPE) \
  FERRUM_WGMMA_TEXT("m64n32k16", TYPE, FERRUM_WGMMA_R0_7 FERRUM_WGMMA_R8_15, 16, 17, 18, 19, 20, 21)
#define FERRUM_WGMMA_N32_OUTS FERRUM_WGMMA_D0_1, FERRUM_WGMMA_D4(2), FERRUM_WGMMA_D4(3)
#define FERRUM_WGMMA_N48_TEXT(TYPE) \
  FERRUM_WGMMA_TEXT("m64n48k16", TYPE, FERRUM_WGMMA_R0_7 FERRUM_WGMMA_R8_23, 24, 25, 26, 27, 28, 29)
#define FERRUM_WGMMA_N48_OUTS FERRUM_WGMMA_D0_1, FERRUM_WGMMA_D4(2), FERRUM_WGMMA_D4(3), FERRUM_WGMMA_D4(4), FERRUM_WGMMA_D4(5)
#define FERRUM_WGMMA_N64_TEXT(TYPE) \
  FERRUM_WGMMA_TEXT("m64n64k16", TYPE, FERRUM_WGMMA_R0_7 FERRUM_WGMMA_R8_31, 32, 33, 34, 35, 36, 37)
#define FERRUM_WGMMA_N64_OUTS FERRUM_WGMMA_D0_1, FERRUM_WGMMA_D2_7
#define FERRUM_WGMMA_N128_TEXT(TYPE)                                                                    \
  FERRUM_WGMMA_TEXT("m64n128k16", TYPE, FERRUM_WGMMA_R0_7 FERRUM_WGMMA_R8_31 FERRUM_WGMMA_R32_63, 64, 65, 66, \
                    67, 68, 69)
#define FERRUM_WGMMA_N128_OUTS FERRUM_WGMMA_N64_OUTS, FERRUM_WGMMA_D8_15
#define FERRUM_WGMMA_N256_TEXT(TYPE)                                                                   \
  FERRUM_WGMMA_TEXT("m64n256k16", TYPE,                                                                \
                    FERRUM_WGMMA_R0_7 FERRUM_WGMMA_R8_31 FERRUM_WGMMA_R32_63 FERRUM_WGMMA_R64_127, 128, 129, \
                    130, 131, 132, 133)
#define FERRUM_WGMMA_N256_OUTS FERRUM_WGMMA_N128_OUTS, FERRUM_WGMMA_D16_31
template <int N, bool Bf16>
__device__ __forceinline__ void mma_m64k16(float (&d)[N / 8][4], const uint32_t (&a)[4], uint64_t desc_b,
                                           int keep_d = 1) {
  static_assert(N == 16 || N == 32 || N == 48 || N == 64 || N == 128 || N == 256,
                "MMA widths built: 16, 32, 48, 64, 128 and 256");
#ifdef FERRUM_WGMMA_AVAILABLE
#define FERRUM_WGMMA_ISSUE(NN)                                                                   \
  if constexpr (N == NN && Bf16)                                                                 \
    asm volatile(FERRUM_WGMMA_N##NN##_TEXT("bf16") : FERRUM_WGMMA_N##NN##_OUTS : FERRUM_WGMMA_INS); \
  else if constexpr (N == NN)                                                                    \
    asm volatile(FERRUM_WGMMA_N##NN##_TEXT("f16") : FERRUM_WGMMA_N##NN##_OUTS : FERRUM_WGMMA_INS);
  FERRUM_WGMMA_ISSUE(16)
  FERRUM_WGMMA_ISSUE(32)
  FERRUM_WGMMA_ISSUE(48)
  FERRUM_WGMMA_ISSUE(64)
  FERRUM_WGMMA_ISSUE(128)
  FERRUM_WGMMA_ISSUE(256)
#undef FERRUM_WGMMA_ISSUE
#else
  (void)d;
  (void)a;
  (void)desc_b;
  (void)keep_d;
  __trap();
#endif
}

#undef FERRUM_WGMMA_INS
#undef FERRUM_WGMMA_D4
#undef FERRUM_WGMMA_TEXT
#undef FERRUM_WGMMA_R0_7
#undef FERRUM_WGMMA_R8_15
#undef FERRUM_WGMMA_R8_23
#undef FERRUM_WGMMA_R8_31
#undef FERRUM_WGMMA_R32_63
#undef FERRUM_WGMMA_R64_127
#undef FERRUM_WGMMA_D0_1
#undef FERRUM_WGMMA_D2_7
#undef FERRUM_WGMMA_D8_15
#undef FERRUM_WGMMA_D16_31
#undef FERRUM_WGMMA_N16_TEXT
#undef FERRUM_WGMMA_N16_OUTS
#undef FERRUM_WGMMA_N32_TEXT
#undef FERRUM_WGMMA_N32_OUTS
#undef FERRUM_WGMMA_N48_TEXT
#undef FERRUM_WGMMA_N48_OUTS
#undef FERRUM_WGMMA_N64_TEXT
#undef FERRUM_WGMMA_N64_OUTS
#undef FERRUM_WGMMA_N128_TEXT
#undef FERRUM_WGMMA_N128_OUTS
#undef FERRUM_WGMMA_N256_TEXT
#undef FERRUM_WGMMA_N256_OUTS

}  // namespace ferrum::wgmma
