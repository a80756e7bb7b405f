#include <stdint.h>

#include "act_order.h"

#include "../core/chained_launch.h"
#include "../core/ptx.cuh"

namespace ferrum::dense {

namespace {

constexpr int kGatherThreads = 256;
constexpr int kColumnsPerThread = 8;  // one 16-byte store

// Columns p[0..7] of one row, packed for a 16-byte store. perm comes from the
// caller: an index outside the row reads column 0, so no read leaves the row.
__device__ __forceinline__ uint4 gather8(const uint16_t* row, unsigned columns, const int (&p)[kColumnsPerThread]) {
  uint32_t v[kColumnsPerThread];
#pragma unroll
  for (int e = 0; e < kColumnsPerThread; ++e) v[e] = row[static_cast<unsigned>(p[e]) < columns ? p[e] : 0];
  return make_uint4(v[0] | v[1] << 16, v[2] | v[3] << 16, v[4] | v[5] << 16, v[6] | v[7] << 16);
}

// One thread per 8 consecutive columns of one row. Its eight perm entries and
// then its eight 2-byte reads are issued back to back (restrict: no store in
// between may alias them), so the gather costs two dependent round trips, not
// one per column; the row's scattered reads hit the same few cache lines.
__global__ void __launch_bounds__(kGatherThreads)
    gather_kernel(const uint16_t* __restrict__ a, int lda, const int* __restrict__ perm, uint16_t* __restrict__ out,
                  int k) {
  // A is the previous kernel's output; the GEMM after this kernel may start
  // its weight fetches now (it waits for this grid's writes before it reads A).
  ptx::enter_chain();
  const int j = (blockIdx.x * kGatherThreads + threadIdx.x) * kColumnsPerThread;
  if (j >= k) return;
  const uint16_t* src = a + static_cast<size_t>(blockIdx.y) * lda;
  const unsigned columns = static_cast<unsigned>(min(k, lda));  // what a row of a holds
  int p[kColumnsPerThread];
#pragma unroll
  for (int e = 0; e < kColumnsPerThread; ++e) p[e] = __ldg(perm + j + e);
  *reinterpret_cast<uint4*>(out + static_cast<size_t>(blockIdx.y) * k + j) = gather8(src, columns, p);
}

// Tall activations: one block per row stages the row in shared memory with
// 16-byte copies, then gathers from there. Scattered 2-byte reads from global
// memory fetch a 32-byte sector each (16 sectors per 16 bytes stored). H200,
// act-order W4A16 28672 x 8192: m = 256 195 -> 174 us (cuBLAS 174), m = 64
// 74.5 -> 71.9; at m = 32 the staged form was 1-1.5 % slower (fewer blocks
// than SMs, each waiting for its whole row).
constexpr int kStagedThreads = 512;
constexpr int kStagedMinRows = 64;
constexpr size_t kStagedMaxRowBytes = 200 * 1024;

__global__ void __launch_bounds__(kStagedThreads)
    gather_staged_kernel(const uint16_t* __restrict__ a, int lda, const int* __restrict__ perm,
                         uint16_t* __restrict__ out, int k) {
  extern __shared__ uint4 row_words[];
  ptx::enter_chain();
  const unsigned columns = static_cast<unsigned>(min(k, lda));  // both multiples of 8
  const uint4* src = reinterpret_cast<const uint4*>(a + static_cast<size_t>(blockIdx.x) * lda);
  for (unsigned i = threadIdx.x; i < columns / 8; i += kStagedThreads) row_words[i] = src[i];
  __syncthreads();
  const uint16_t* row = reinterpret_cast<const uint16_t*>(row_words);
  uint4* dst = reinterpret_cast<uint4*>(out + static_cast<size_t>(blockIdx.x) * k);
  const int4* perm8 = reinterpret_cast<const int4*>(perm);
  for (int i = threadIdx.x; i < k / 8; i += kStagedThreads) {
    const int4 lo = __ldg(perm8 + 2 * i);
    const int4 hi = __ldg(perm8 + 2 * i + 1);
    const int p[kColumnsPerThread] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
    dst[i] = gather8(row, columns, p);
  }
}

}  // namespace

cudaError_t gather_columns(const void* a, int lda, const int* perm, void* a_tmp, int m, int k, int max_smem,
                           cudaStream_t stream) {
  if (k % kColumnsPerThread != 0) return cudaErrorInvalidValue;  // the GEMM needs k % 128 == 0 anyway
  const size_t row_bytes = static_cast<size_t>(k < lda ? k : lda) * 2;
  if (m >= kStagedMinRows && row_bytes <= kStagedMaxRowBytes && row_bytes <= static_cast<size_t>(max_smem) &&
      reinterpret_cast<uintptr_t>(perm) % 16 == 0) {
    if (row_bytes > 48 * 1024) {
      const cudaError_t err = cudaFuncSetAttribute(gather_staged_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                   static_cast<int>(row_bytes));
      if (err != cudaSuccess) return err;
    }
    return launch_chained(gather_staged_kernel, dim3(m), dim3(kStagedThreads), row_bytes, stream,
                          static_cast<const uint16_t*>(a), lda, perm, static_cast<uint16_t*>(a_tmp), k);
  }
  const int per_block = kGatherThreads * kColumnsPerThread;
  const int chunks = (k + per_block - 1) / per_block;
  // gridDim.y is limited to 65535 rows per launch.
  for (int row0 = 0; row0 < m; row0 += 65535) {
    const int rows = m - row0 < 65535 ? m - row0 : 65535;
    const cudaError_t err = launch_chained(gather_kernel, dim3(chunks, rows), dim3(kGatherThreads), 0, stream,
                                           static_cast<const uint16_t*>(a) + static_cast<size_t>(row0) * lda, lda,
                                           perm, static_cast<uint16_t*>(a_tmp) + static_cast<size_t>(row0) * k, k);
    if (err != cudaSuccess) return err;
  }
  return cudaSuccess;
}

}  // namespace ferrum::dense
