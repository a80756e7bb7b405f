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
  int group_size;     // -1 channelwise, else rows of K per scale row
  int slabs;
  int iters;          // work units (column x k-tile) per block
};

// Tile configurations the library is built with. M8 = activation rows / 8.
enum class NConfig { N128_K128, N256_K64, N64_K128 };

struct TileInfo {
  int m_rows;
  int n_tile;
  int k_tile;
  size_t smem_bytes;
};

TileInfo tile_info(int m8, NConfig nc);

// Sets the kernel's shared-memory attribute (once per device) and launches it.
// Returns the CUDA status and which stage failed through `stage`.
cudaError_t launch(int m8, NConfig nc, const Args& args, int grid, cudaStream_t stream,
                   int dev, int* stage);

}  // namespace ferrum::w4a16
