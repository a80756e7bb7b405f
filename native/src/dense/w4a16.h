// W4A16 dense Marlin GEMM: launch arguments and the per-tile launchers that the
// instantiation files define. Host code only (no device code here).
#pragma once

#include <cuda_runtime.h>

namespace ferrum::w4a16 {

// One launch covers `slabs` slabs of m_rows activation rows.
struct Args {
  const void* a;      // fp16 [m, k] row-major, first row of this launch
  const void* b;      // Marlin int32 [k/16, 2*n_full], offset to the first column
  void* c;            // fp16 [m, n] row-major, first row of this launch
  const void* s;      // fp16 scales [k/g or 1, n_full], offset to the first column
  int* locks;         // slabs * (n / n_tile) int32, zero on entry and exit
  int m;              // rows in this launch
  int n;
  int k;
  int b_row_int4;     // packed row stride in 16-byte units (n_full / 2)
  int s_row_halves;   // scale row stride (n_full)
  int group_shift;    // log2(group size); -1 channelwise
  int slabs;
  int iters;          // work units (column x k-tile) per block; set by the launcher
};

// Tile configurations the library is built with. M8 = activation rows / 8.
enum class NConfig {
  N128_K128,
  N256_K64,
  N64_K128,
  N256_K128,  // deep weight stages for slabs of at most 16 rows on long problems
  N256_K64_WGMMA,  // N256_K64 with Hopper warpgroup MMA (64-row slabs, sm_90a builds)
};

struct TileInfo {
  int m_rows;
  int n_tile;
  int k_tile;
  size_t smem_bytes;
};

TileInfo tile_info(int m8, NConfig nc);

// Splits `args.slabs * n_tiles * k_tiles` units over at most `sms` times the
// resident blocks per multiprocessor, then launches. Sets the kernel's
// attributes once per device. Returns the CUDA status; `stage` names the step
// that failed.
struct Launch {
  int sms;
  int dev;
  cudaStream_t stream;
};

}  // namespace ferrum::w4a16
