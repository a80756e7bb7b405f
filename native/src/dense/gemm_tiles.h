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
template <int M8, int Bits>
constexpr int stages_for() {
  if constexpr (Bits == 8) return M8 <= 2 ? 4 : 3;
  return M8 <= 2 ? 6 : 4;
}
template <int M8>
constexpr int blocks_per_sm_for() {
  return M8 <= 4 ? 2 : 1;
}

template <int M8, NConfig NC, int Bits>
struct Tile;
template <int M8, int Bits>
struct Tile<M8, NConfig::N128_K128, Bits>
    : TileShape<M8, 2, 8, stages_for<M8, Bits>(), blocks_per_sm_for<M8>(), Bits> {};
template <int M8, int Bits>
struct Tile<M8, NConfig::N256_K64, Bits>
    : TileShape<M8, 4, 4, stages_for<M8, Bits>(), blocks_per_sm_for<M8>(), Bits> {};
template <int M8, int Bits>
struct Tile<M8, NConfig::N64_K128, Bits>
    : TileShape<M8, 1, 8, stages_for<M8, Bits>(), blocks_per_sm_for<M8>(), Bits> {};
template <int M8, int Bits>
struct Tile<M8, NConfig::N128_K64, Bits>
    : TileShape<M8, 2, 4, stages_for<M8, Bits>(), blocks_per_sm_for<M8>(), Bits> {};
// 16 KB (4-bit) weight stages: each warp runs four k steps per group before
// it applies the group's scales, halving the per-stage fixed costs.
template <int M8, int Bits>
struct Tile<M8, NConfig::N256_K128, Bits> : TileShape<M8, 4, 8, Bits == 8 ? 3 : 4, 2, Bits> {
  static_assert(M8 <= 2, "N256_K128 is built for slabs of at most 16 rows");
};
template <int M8, int Bits>
struct Tile<M8, NConfig::N256_K64_WGMMA, Bits>
    : TileShape<M8, 4, 4, stages_for<M8, Bits>(), 1, Bits, true> {};

// Defined by the generated instantiation files (one per activation type,
// weight type and slab height, so the build runs in parallel).
template <AType A, WType W, int M8>
cudaError_t launch_slab(NConfig nc, Args& args, const Launch& launch, int* stage);
// The routed (MoE) kernels, likewise one generated file per format and height.
template <AType A, WType W, int M8, Route R>
cudaError_t launch_routed(NConfig nc, Args& args, const Launch& launch, int* stage);

}  // namespace ferrum::dense
