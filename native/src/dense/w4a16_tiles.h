// The tile shapes the W4A16 kernel is instantiated for, one place for all of
// them: small activation slabs get deep pipelines (the kernel is a weight
// stream there), larger slabs trade stages for accumulator space.
#pragma once

#include "../core/tile.cuh"
#include "w4a16.h"

namespace ferrum::w4a16 {

// Small slabs: the kernel is a weight stream, so two blocks share each SM
// (more warps to hide latency, twice the bytes in flight). 64-row slabs need
// the registers for accumulators and run one block per SM.
template <int M8>
constexpr int stages_for() {
  return M8 <= 2 ? 6 : 4;
}
template <int M8>
constexpr int blocks_per_sm_for() {
  return M8 <= 4 ? 2 : 1;
}

template <int M8, NConfig NC>
struct Tile;
template <int M8>
struct Tile<M8, NConfig::N128_K128> : TileShape<M8, 2, 8, stages_for<M8>(), blocks_per_sm_for<M8>()> {};
template <int M8>
struct Tile<M8, NConfig::N256_K64> : TileShape<M8, 4, 4, stages_for<M8>(), blocks_per_sm_for<M8>()> {};
template <int M8>
struct Tile<M8, NConfig::N64_K128> : TileShape<M8, 1, 8, stages_for<M8>(), blocks_per_sm_for<M8>()> {};
// 16 KB weight stages: each warp runs four k steps per group before it applies
// the group's scales, halving the per-stage fixed costs of the narrow tiles.
template <int M8>
struct Tile<M8, NConfig::N256_K128> : TileShape<M8, 4, 8, 4, 2> {
  static_assert(M8 <= 2, "N256_K128 is built for slabs of at most 16 rows");
};
constexpr int kDeepTileMaxM8 = 2;
template <int M8>
struct Tile<M8, NConfig::N256_K64_WGMMA> : TileShape<M8, 4, 4, stages_for<M8>(), 1, true> {};

// Defined in w4a16_m<rows>.cu, one translation unit per slab height so the
// build runs in parallel.
template <int M8>
cudaError_t launch_m8(NConfig nc, Args& args, const Launch& launch, int* stage);
template <>
cudaError_t launch_m8<1>(NConfig, Args&, const Launch&, int*);
template <>
cudaError_t launch_m8<2>(NConfig, Args&, const Launch&, int*);
template <>
cudaError_t launch_m8<4>(NConfig, Args&, const Launch&, int*);
template <>
cudaError_t launch_m8<8>(NConfig, Args&, const Launch&, int*);

}  // namespace ferrum::w4a16
