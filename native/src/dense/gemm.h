// Dense Marlin GEMM: launch arguments, tile configurations and the launchers
// that the instantiation files define. Host code only (no device code here).
#pragma once

#include <cuda_runtime.h>
#include <stddef.h>

#include "../core/types.h"

namespace ferrum::dense {

// Where the rows of a slab come from and go to (MoE routing). Dense launches
// read rows in order and leave this zero.
enum class Route {
  Dense,     // slab s = rows [s * m_rows, (s + 1) * m_rows) of A and C
  Sorted,    // vLLM fused MoE: slab s = entries of sorted_ids, expert slab_experts[s]
  Bucketed,  // one slab per expert of a bucket, rows at row_offsets[e]
  Direct,    // fused MoE without the align step: slab s = output row s alone, expert slab_experts[s]
};

// Routes whose slabs name their expert in slab_experts and their rows by
// output row id t (< rows; activation row t / top_k).
constexpr bool routed_by_ids(Route r) { return r == Route::Sorted || r == Route::Direct; }

struct Routing {
  const int* sorted_ids;     // Sorted: output row t of each slab row; t >= rows or < 0: padding
  const int* slab_experts;   // Sorted, Direct: expert of each slab (< 0: skipped); Bucketed: experts or null
  const int* used_ids;       // Sorted: entries of sorted_ids in use (one device int)
  const int* row_offsets;    // Bucketed: first row of each expert in A and C
  const int* row_counts;     // Bucketed: rows of each expert
  const float* row_weights;  // Sorted: factor of output row t (top-k weight), or null
  int rows;                  // Sorted: prob_m * top_k
  int top_k;                 // Sorted: activation row = t / top_k
  int locks_per_expert;      // Bucketed: per-column locks of each expert
  long long b_expert_int4;   // expert strides of the weights, scales, zero points, bias
  long long s_expert_bytes;
  long long z_expert_int4;
  long long bias_expert_bytes;
  bool bias_p32;             // bias in the channelwise-scale order (MXFP4 MoE)
};

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
  int s_row_halves;   // scale row stride in scales (n_full); E8M0 scales are bytes
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
  // A is written by the kernel just before (the act-order gather), which this
  // one may overlap (programmatic dependent launch): the first weight stages
  // are pulled into L2 before waiting for it.
  bool a_after_previous_kernel;
  Routing route;
  // K-sharded act-order: the group of each weight row (the sorted g_idx, [k]),
  // or null; its values are clamped to [0, num_groups). Last, so that the
  // other fields keep their parameter offsets (and their paired loads).
  const int* row_groups;
  int num_groups;
  // Sorted launches of a MoE layer (the _ex entries): > 0, C is zero on entry
  // and every partial of output row t is added, with atomics and no locks,
  // into row t / add_rows_div; 0: the first partial is stored (locks).
  int add_rows_div;
  // Zeroed by a sorted launch once the previous kernel is done (the next
  // launch's add_rows_div destination); null when clear_int4 is 0.
  int4* clear;
  long long clear_int4;
  // Sorted launches: the routing arrays were written before the previous
  // kernel, only A by it: they are read (and the first weight stages pulled
  // into L2) while that kernel finishes (a_after_previous_kernel is set too).
  bool routing_settled;
};

// Tile configurations the library is built with. M8 = activation rows / 8.
enum class NConfig {
  N128_K128,
  N256_K64,
  N64_K128,
  N256_K128,       // deep weight stages for slabs of at most 16 rows on long problems
  N256_K64_WGMMA,  // N256_K64 with Hopper warpgroup MMA (64-row slabs, sm_90a builds)
  N128_K64,        // MoE: k a multiple of 64 only (GPT-OSS gate/up, K = 2880)
  // K-sharded act-order (K_FULL clear): groups per row from g_idx, slabs of
  // 8, 16 or 64 rows.
  N128_K128_ROW_GROUPS,
  // Warp-specialised Hopper kernel (wide_kernel.cuh, sm_90a builds): 256 x 64
  // tiles (256 x 128 for 4-bit 16-row slabs), slabs of 16, 32, 48, 64 or 128
  // activation rows; 128 x 64 tiles, slabs of 256.
  WIDE_T16,
  WIDE_T32,
  WIDE_T48,
  WIDE_T64,
  WIDE_T128,
  WIDE_T256,
};

// The warp-specialised Hopper kernel's tiles.
constexpr bool is_wide(NConfig nc) {
  return nc == NConfig::WIDE_T16 || nc == NConfig::WIDE_T32 || nc == NConfig::WIDE_T48 || nc == NConfig::WIDE_T64 || nc == NConfig::WIDE_T128 ||
         nc == NConfig::WIDE_T256;
}

// N256_K128 is built for slabs of at most 8 * kDeepTileMaxM8 rows.
constexpr int kDeepTileMaxM8 = 2;

struct TileInfo {
  int m_rows;
  int n_tile;
  int k_tile;
  size_t smem_bytes;
  // The tile may leave the last column tile partial (n a multiple of 64 that
  // n_tile does not divide): the copier steps back in its place (in the wide
  // kernel's 8-bit 256-column tiles, an instance of their own does).
  bool partial_n = false;
};

struct Launch {
  int sms;
  int dev;
  cudaStream_t stream;
  bool overlap_previous = false;  // programmatic dependent launch (sm_90+)
};

// Blocks per multiprocessor a launch may use at most (the lock and c_tmp
// budgets of ferrum_marlin.h assume it).
constexpr int kMaxBlocksPerSm = 2;

}  // namespace ferrum::dense
