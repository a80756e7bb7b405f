// Host-side planning of the routed (MoE) launches of the dense kernel: slab
// heights, tiles, and the dispatch to the instantiated kernels.
#pragma once

#include "../dense/gemm.h"

namespace ferrum::moe {

using dense::Args;
using dense::Launch;
using dense::NConfig;
using dense::Route;
using dense::TileInfo;

// Slab heights built for routed launches: moe_block_size / 8.
bool routed_m8_supported(int m8);

TileInfo routed_tile_info(int m8, NConfig nc, int bits);

// The automatic tile for (n, k) (hopper: the warp-specialised kernel is
// available), or false when no routed tile divides them.
bool routed_auto_config(int m8, int n, int k, bool hopper, NConfig* nc);

// The warp-specialised kernel's tile for blocks of 8 * m8 rows, or false when
// it serves none of them (Hopper builds with sm_90a code only).
bool routed_wide_config(int m8, int n, int k, NConfig* nc);

// (thread_k, thread_n) of a routed tile; false if none is built.
bool routed_forced_config(int thread_k, int thread_n, NConfig* nc);

cudaError_t launch_routed_gemm(AType a, WType w, int m8, Route r, NConfig nc, Args& args,
                               const Launch& launch, int* stage);

}  // namespace ferrum::moe
