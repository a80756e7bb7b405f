#include <stdint.h>

#include "act_order.h"

#include "../core/chained_launch.h"
#include "../core/ptx.cuh"

namespace ferrum::dense {

namespace {

constexpr int kGatherThreads = 256;
constexpr int kColumnsPerThread = 8;  // one 16-byte store

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
  uint32_t v[kColumnsPerThread];
#pragma unroll
  for (int e = 0; e < kColumnsPerThread; ++e)
    v[e] = src[static_cast<unsigned>(p[e]) < columns ? p[e] : 0];
  const uint4 packed = make_uint4(v[0] | v[1] << 16, v[2] | v[3] << 16, v[4] | v[5] << 16, v[6] | v[7] << 16);
  *reinterpret_cast<uint4*>(out + static_cast<size_t>(blockIdx.y) * k + j) = packed;
}

}  // namespace

cudaError_t gather_columns(const void* a, int lda, const int* perm, void* a_tmp, int m, int k,
                           cudaStream_t stream) {
  if (k % kColumnsPerThread != 0) return cudaErrorInvalidValue;  // the GEMM needs k % 128 == 0 anyway
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
