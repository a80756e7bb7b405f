// Dense Marlin GEMM: launch arguments, tile configurations and the launchers
// that the instantiation files define. Host code only (no device code here).
#pragma once

#include <cuda_runtime.h>
#include <stddef.h>

#include "../core/types.h"

namespace ferrum::dense {

// One launch covers `slabs` slabs of m_rows activation rows.
struct Args {
  const void* a;      // [m, lda] row-major, first row of this launch
  const void* b;      // Marlin int32 [k/16, (bits/2)*n_full], offset to the first column
  void* c;            // [m, n] row-major, first row of this launch
  const void* s;      // scales [groups, n_full], offset to the first column
  const void* z;      // U4 zero points int32 [groups, n_full/8], offset likewise; else null
  const void* bias;   // [n] or null
  int* locks;         // zero on entry and exit; see lock_by_range
  float* c_tmp;       // fp32 partials when fp32_reduce
  int m;              // rows in this launch
  int n;
  int k;
  int a_row_int4;     // activation row stride in 16-byte units (lda / 8)
  int b_row_int4;     // packed row stride in 16-byte units
  int s_row_halves;   // scale row stride (n_full)
  int z_row_int4;     // zero-point row stride in 16-byte units (n_full / 32)
  int group_shift;    // log2(group size); -1 channelwise
  int slabs;
  int iters;          // work units (column x k-tile) per block; set by the launcher
  // Locks: one per column (slabs * n/n_tile of them), or one per block range
  // (at most the grid), which frees the lock count from the problem size.
  bool lock_by_range;
  // Shared columns are summed in fp32 through c_tmp in a fixed order
  // (deterministic) instead of by fp16/bf16 atomics into C.
  bool fp32_reduce;
};

// Tile configurations the library is built with. M8 = activation rows / 8.
enum class NConfig {
  N128_K128,
  N256_K64,
  N64_K128,
  N256_K128,       // deep weight stages for slabs of at most 16 rows on long problems
  N256_K64_WGMMA,  // N256_K64 with Hopper warpgroup MMA (64-row slabs, sm_90a builds)
};

// N256_K128 is built for slabs of at most 8 * kDeepTileMaxM8 rows.
constexpr int kDeepTileMaxM8 = 2;

struct TileInfo {
  int m_rows;
  int n_tile;
  int k_tile;
  size_t smem_bytes;
};

struct Launch {
  int sms;
  int dev;
  cudaStream_t stream;
};

// Blocks per multiprocessor a launch may use at most (the lock and c_tmp
// budgets of ferrum_marlin.h assume it).
constexpr int kMaxBlocksPerSm = 2;

}  // namespace ferrum::dense
