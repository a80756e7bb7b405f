#include <stdint.h>

#include "act_order.h"

#include "../core/ptx.cuh"

namespace ferrum::dense {

namespace {

constexpr int kGatherThreads = 256;

// One block per (row, 2048-column chunk): perm is read coalesced and stays in
// L1/L2 across rows; the scattered 2-byte reads of a row hit the same few
// cache lines.
__global__ void __launch_bounds__(kGatherThreads) gather_kernel(const uint16_t* a, int lda, const int* perm,
                                                                uint16_t* out, int k) {
  // The GEMM after this kernel may start its weight fetches now (it waits for
  // this grid's writes before it reads them).
  ptx::griddep_launch_dependents();
  const int row = blockIdx.y;
  const uint16_t* src = a + static_cast<size_t>(row) * lda;
  uint16_t* dst = out + static_cast<size_t>(row) * k;
  const int j0 = blockIdx.x * (kGatherThreads * 8);
#pragma unroll
  for (int e = 0; e < 8; ++e) {
    const int j = j0 + e * kGatherThreads + threadIdx.x;
    if (j < k) {
      const int p = __ldg(perm + j);
      dst[j] = src[static_cast<unsigned>(p) < static_cast<unsigned>(k) ? p : 0];
    }
  }
}

}  // namespace

cudaError_t gather_columns(const void* a, int lda, const int* perm, void* a_tmp, int m, int k,
                           cudaStream_t stream) {
  const int chunks = (k + kGatherThreads * 8 - 1) / (kGatherThreads * 8);
  // gridDim.y is limited to 65535 rows per launch.
  for (int row0 = 0; row0 < m; row0 += 65535) {
    const int rows = m - row0 < 65535 ? m - row0 : 65535;
    gather_kernel<<<dim3(chunks, rows), kGatherThreads, 0, stream>>>(
        static_cast<const uint16_t*>(a) + static_cast<size_t>(row0) * lda, lda, perm,
        static_cast<uint16_t*>(a_tmp) + static_cast<size_t>(row0) * k, k);
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
  }
  return cudaSuccess;
}

}  // namespace ferrum::dense
