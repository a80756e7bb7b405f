// Block tile geometry shared by the Marlin kernels of this library.
//
// A block (8 warps) owns an n_tile x k_tile slice of the packed weight per
// pipeline stage and an m_rows-row slab of activations. Each warp owns one
// 64-column chunk (four 16x16 W^T fragments per 16-deep k step, i.e. one
// 16-byte load per lane from the Marlin layout) and a share of the stage's
// k steps; warps that share a chunk reduce through shared memory at the end of
// every column they finish.
#pragma once

#include <stddef.h>

#include "types.h"

namespace ferrum {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
// K-sharded act-order (row groups): scale rows staged per stage from the
// stage's first group on; rows of later groups are read from global memory.
constexpr int kRowGroupWindow = 8;

template <int M8, int NChunks, int KRows, int Stages, int MinBlocks, int Bits, bool Wgmma = false,
          bool RowGroups = false>
struct TileShape {
  static constexpr int m8 = M8;                 // 8-row activation tiles per slab
  static constexpr int m_rows = 8 * M8;         // activation rows per slab
  static constexpr int n_chunks = NChunks;      // 64-column chunks per block tile
  static constexpr int n_tile = 64 * NChunks;
  static constexpr int k_rows = KRows;          // 16-deep k steps per stage
  static constexpr int k_tile = 16 * KRows;
  static constexpr int stages = Stages;
  static constexpr int min_blocks = MinBlocks;  // blocks per SM the registers must allow
  // 16-byte weight loads per lane per chunk and k step: 4-bit codes fill one,
  // 8-bit codes two.
  static constexpr int b_words = Bits / 4;
  // Hopper warpgroup MMA: the four warps of a warpgroup own the four chunks.
  static constexpr bool wgmma = Wgmma;
  static_assert(!Wgmma || (NChunks == 4 && M8 == 8 && KRows * 16 == 64),
                "wgmma tiles: 256 columns, 64 activation rows, one 128-byte k atom per stage");
  static constexpr int warps_n = NChunks;
  static constexpr int warps_k = kWarps / NChunks;
  static constexpr int rows_per_warp = KRows / warps_k;
  static_assert(kWarps % NChunks == 0, "warps must split evenly over chunks");
  static_assert(KRows % warps_k == 0, "k steps must split evenly over warps");
  static_assert(M8 == 1 || M8 % 2 == 0, "activation tiles are loaded in pairs");

  // Shared memory, in 16-byte units per stage.
  static constexpr int b_stage = KRows * NChunks * 32 * b_words;  // packed weight
  static constexpr int a_stage = m_rows * KRows * 2;    // activations, 128B-swizzled
  // Group sizes down to 32 put up to k_tile/32 scale rows into one stage;
  // row groups a window of them.
  static constexpr int s_rows = RowGroups ? kRowGroupWindow : ((KRows / 2) > 0 ? (KRows / 2) : 1);
  static constexpr int s_stage = s_rows * NChunks * 8;
  // 4-bit zero points: 64 columns = 32 bytes per chunk and group row.
  static constexpr int z_stage = s_rows * NChunks * 2;
  // Row groups: the stage's rows of the sorted g_idx (int32).
  static constexpr int g_stage = RowGroups ? KRows * 4 : 0;
  // fp32 reduction tile; the +4 float pad keeps fragment stores conflict-free.
  static constexpr int red_stride = n_tile + 4;
  static constexpr size_t smem_bytes =
      16 * static_cast<size_t>(Stages) * (b_stage + a_stage + s_stage + z_stage + g_stage) +
      4 * static_cast<size_t>(m_rows) * red_stride + 16;  // + one flag word
};

}  // namespace ferrum
