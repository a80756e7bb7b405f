// The tile shapes the dense kernel is instantiated for, one place for all of
// them: small activation slabs get deep pipelines (the kernel is a weight
// stream there), larger slabs trade stages for accumulator space, and 8-bit
// weights (twice the bytes per stage) take fewer stages.
#pragma once

#include "../core/tile.cuh"
#include "gemm.h"

namespace ferrum::dense {

// Small slabs: the kernel is a weight stream, so two blocks share each SM
// (more warps to hide latency, twice the bytes in flight). 64-row slabs need
// the registers for accumulators and run one block per SM.
// Small slabs keep about 48 KB of weights in flight per block whatever the
// tile's stage size (4 KB stages of the 64-wide or 64-deep tiles get 10 stages:
// MoE decode streams a few MB per expert, so latency, not bandwidth, limits it).
template <int M8, int Bits, int NChunks, int KRows>
constexpr int stages_for() {
  constexpr int stage_bytes = KRows * NChunks * 32 * 16 * (Bits / 4);
  if constexpr (M8 <= 2) {
    constexpr int s = 49152 / stage_bytes;
    return s < 4 ? 4 : (s > 10 ? 10 : s);
  }
  return Bits == 8 ? 3 : 4;
}
template <int M8>
constexpr int blocks_per_sm_for() {
  return M8 <= 4 ? 2 : 1;
}

template <int M8, NConfig NC, int Bits>
struct Tile;
template <int M8, int Bits>
struct Tile<M8, NConfig::N128_K128, Bits>
    : TileShape<M8, 2, 8, stages_for<M8, Bits, 2, 8>(), blocks_per_sm_for<M8>(), Bits> {};
template <int M8, int Bits>
struct Tile<M8, NConfig::N256_K64, Bits>
    : TileShape<M8, 4, 4, stages_for<M8, Bits, 4, 4>(), blocks_per_sm_for<M8>(), Bits> {};
template <int M8, int Bits>
struct Tile<M8, NConfig::N64_K128, Bits>
    : TileShape<M8, 1, 8, stages_for<M8, Bits, 1, 8>(), blocks_per_sm_for<M8>(), Bits> {};
template <int M8, int Bits>
struct Tile<M8, NConfig::N128_K64, Bits>
    : TileShape<M8, 2, 4, stages_for<M8, Bits, 2, 4>(), blocks_per_sm_for<M8>(), Bits> {};
// 16 KB (4-bit) weight stages: each warp runs four consecutive k steps (one
// window for groups of at least 128 values), halving the per-stage fixed costs.
template <int M8, int Bits>
struct Tile<M8, NConfig::N256_K128, Bits> : TileShape<M8, 4, 8, Bits == 8 ? 3 : 4, 2, Bits> {
  static_assert(M8 <= 2, "N256_K128 is built for slabs of at most 16 rows");
};
template <int M8, int Bits>
struct Tile<M8, NConfig::N256_K64_WGMMA, Bits>
    : TileShape<M8, 4, 4, stages_for<M8, Bits, 4, 4>(), 1, Bits, true> {};
// K-sharded act-order: the 128 x 128 tile with a window of group rows per stage.
template <int M8, int Bits>
struct Tile<M8, NConfig::N128_K128_ROW_GROUPS, Bits>
    : TileShape<M8, 2, 8, stages_for<M8, Bits, 2, 8>(), blocks_per_sm_for<M8>(), Bits, false, true> {};

// Defined by the generated instantiation files (one per activation type,
// weight type and slab height, so the build runs in parallel).
template <AType A, WType W, int M8>
cudaError_t launch_slab(NConfig nc, Args& args, const Launch& launch, int* stage);
// The routed (MoE) kernels, likewise one generated file per format and height.
template <AType A, WType W, int M8, Route R>
cudaError_t launch_routed(NConfig nc, Args& args, const Launch& launch, int* stage);
// The warp-specialised Hopper kernels of one format (tokens: 16 to 256 rows
// per slab), one generated file per format.
template <AType A, WType W>
cudaError_t launch_wide(int tokens, Args& args, const Launch& launch, int* stage);
// Their routed (fused-MoE, sorted_token_ids) form for routing blocks of 32, 48
// or 64 rows, one generated file per fused-MoE format.
template <AType A, WType W>
cudaError_t launch_wide_routed(int tokens, Args& args, const Launch& launch, int* stage);

}  // namespace ferrum::dense
