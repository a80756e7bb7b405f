#include <limits.h>
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

// Staged rows: a block copies a row of x into shared memory (16-byte cp.async,
// no register round trip) and gathers its share of the row's output from
// there. Scattered 2-byte reads from global memory fetch a 32-byte sector each
// (16 sectors per 16 bytes stored), and their round trips are serial per
// thread. A thread's perm words are the same for every row: it reads them once,
// while its first rows land, and keeps them in registers.
// - Fewer rows than SMs: a row's output is split over `gridDim.y` parts (each
//   part stages the whole row, from L2 after the first).
// - More rows than SMs: a block takes rows blockIdx.x + j * gridDim.x in turn
//   through a ring of two row buffers, so it gathers one row while the next
//   one lands.
// H200, the gather alone (ncu, L2 flushed), 28672 x 8192: m = 256 12.3 ->
// 11.6 us (reading its 14.7 MB alone takes ~8.5), m = 64 7.6 -> 5.8 (one block
// per row, perm read in the loop before), m = 16 5.0 -> 4.2 (scattered kernel
// before). With shorter rows or fewer of them the scattered kernel stays
// faster: k = 8192 (16 KB rows) at m = 16 and 32 was 1.5-2.7 % slower staged,
// m = 1 1-3 % slower at k = 8192 and 28672.
constexpr int kStagedMinRows = 64;
constexpr int kStagedMinRowsLong = 16;
constexpr size_t kStagedLongRowBytes = 32 * 1024;
constexpr int kStagedThreads = 1024;
constexpr int kStagedWordsPerThread = 4;  // a part is at most 4096 words (32768 columns) of a row
constexpr int kStagedPartWords = kStagedThreads * kStagedWordsPerThread;
constexpr size_t kStagedMaxRowBytes = 200 * 1024;

template <int Ring>
__global__ void __launch_bounds__(kStagedThreads, 1)
    gather_staged_kernel(const uint16_t* __restrict__ a, int lda, const int* __restrict__ perm,
                         uint16_t* __restrict__ out, int m, int k, int words_per_part) {
  extern __shared__ uint4 ring_words[];
  ptx::enter_chain();
  const unsigned columns = static_cast<unsigned>(min(k, lda));  // both multiples of 8
  const unsigned row_words = columns / 8;
  const int rows_step = static_cast<int>(gridDim.x);
  // Commits a group even past the last row, so the wait below counts the same
  // number of groups in flight in every iteration.
  auto stage = [&](int row, int slot) {
    if (row < m) {
      const uint4* src = reinterpret_cast<const uint4*>(a + static_cast<size_t>(row) * lda);
      uint4* dst = ring_words + static_cast<size_t>(slot) * row_words;
      for (unsigned i = threadIdx.x; i < row_words; i += kStagedThreads) ptx::cp_async16(dst + i, src + i);
    }
    ptx::cp_async_commit();
  };
#pragma unroll
  for (int slot = 0; slot < Ring; ++slot) stage(static_cast<int>(blockIdx.x) + slot * rows_step, slot);

  const int4* perm8 = reinterpret_cast<const int4*>(perm);
  const int first = static_cast<int>(blockIdx.y) * words_per_part + static_cast<int>(threadIdx.x);
  const int end = min(k / 8, static_cast<int>(blockIdx.y + 1) * words_per_part);
  int p[kStagedWordsPerThread][kColumnsPerThread];
#pragma unroll
  for (int w = 0; w < kStagedWordsPerThread; ++w) {
    const int i = first + w * kStagedThreads;
    int4 lo = make_int4(0, 0, 0, 0), hi = lo;
    if (i < end) {
      lo = __ldg(perm8 + 2 * i);
      hi = __ldg(perm8 + 2 * i + 1);
    }
    p[w][0] = lo.x, p[w][1] = lo.y, p[w][2] = lo.z, p[w][3] = lo.w;
    p[w][4] = hi.x, p[w][5] = hi.y, p[w][6] = hi.z, p[w][7] = hi.w;
  }
  int slot = 0;
  for (int r = static_cast<int>(blockIdx.x); r < m; r += rows_step) {
    ptx::cp_async_wait<Ring - 1>();
    __syncthreads();
    const uint16_t* row = reinterpret_cast<const uint16_t*>(ring_words + static_cast<size_t>(slot) * row_words);
    uint4* dst = reinterpret_cast<uint4*>(out + static_cast<size_t>(r) * k);
#pragma unroll
    for (int w = 0; w < kStagedWordsPerThread; ++w) {
      const int i = first + w * kStagedThreads;
      if (i < end) dst[i] = gather8(row, columns, p[w]);
    }
    __syncthreads();  // the slot is read by every thread before it is refilled
    stage(r + Ring * rows_step, slot);
    slot = slot + 1 == Ring ? 0 : slot + 1;
  }
}

template <int Ring>
cudaError_t launch_staged(const void* a, int lda, const int* perm, void* a_tmp, int m, int k, size_t row_bytes,
                          dim3 grid, int words_per_part, cudaStream_t stream) {
  const size_t smem = Ring * row_bytes;
  if (smem > 48 * 1024) {
    const cudaError_t err = cudaFuncSetAttribute(gather_staged_kernel<Ring>,
                                                 cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
    if (err != cudaSuccess) return err;
  }
  return launch_chained(gather_staged_kernel<Ring>, grid, dim3(kStagedThreads), smem, stream,
                        static_cast<const uint16_t*>(a), lda, perm, static_cast<uint16_t*>(a_tmp), m, k,
                        words_per_part);
}

}  // namespace

cudaError_t gather_columns(const void* a, int lda, const int* perm, void* a_tmp, int m, int k, int sms, int max_smem,
                           cudaStream_t stream) {
  if (k % kColumnsPerThread != 0) return cudaErrorInvalidValue;  // the GEMM needs k % 128 == 0 anyway
  const size_t row_bytes = static_cast<size_t>(k < lda ? k : lda) * 2;
  // The staged kernel's row index r + 2 * gridDim.x (gridDim.x <= sms) is an int.
  if ((m >= kStagedMinRows || (m >= kStagedMinRowsLong && row_bytes >= kStagedLongRowBytes)) &&
      m <= INT_MAX - 2 * sms &&
      row_bytes <= kStagedMaxRowBytes && row_bytes <= static_cast<size_t>(max_smem) &&
      reinterpret_cast<uintptr_t>(perm) % 16 == 0) {
    // One block per SM (1024 threads of up to 64 registers). Parts: as few as
    // cover a row, or, with fewer rows than SMs, as many as fill the SMs with
    // at least one output word per thread.
    const int words = k / 8;
    const int min_parts = (words + kStagedPartWords - 1) / kStagedPartWords;
    const int max_parts = (words + kStagedThreads - 1) / kStagedThreads;
    int parts = sms / m < max_parts ? sms / m : max_parts;
    parts = parts > min_parts ? parts : min_parts;
    const int words_per_part = (words + parts - 1) / parts;
    const int row_blocks = sms / parts > 1 ? sms / parts : 1;
    const dim3 grid(m < row_blocks ? m : row_blocks, parts);
    if (m > row_blocks && 2 * row_bytes <= static_cast<size_t>(max_smem))
      return launch_staged<2>(a, lda, perm, a_tmp, m, k, row_bytes, grid, words_per_part, stream);
    return launch_staged<1>(a, lda, perm, a_tmp, m, k, row_bytes, grid, words_per_part, stream);
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
