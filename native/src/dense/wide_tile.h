// Tile geometry of the warp-specialised Hopper kernel (wide_kernel.cuh), in a
// host-visible header so the launch planner can size it.
#pragma once

#include <stddef.h>

namespace ferrum::dense {

// Problems of more rows than this take the wide kernel on Hopper. Measured
// (H200): from 17 rows on it beats the 8-warp kernel's 32-row slabs (m = 17..32
// on 8192x28672: 84 -> 77 us), at 16 rows and below the 8-warp kernel's
// weight-stream tiles are far ahead.
constexpr int kWideMinRows = 16;

// Shared memory the wide kernel may use per block (Hopper opt-in maximum).
constexpr size_t kWideSmemBudget = 227 * 1024;

template <int Tokens, int Bits>
struct WideTile {
  static_assert(Tokens == 64 || Tokens == 128, "warpgroup MMA widths built: 64 and 128 tokens");
  static constexpr int m_rows = Tokens;  // activation rows per slab = MMA n
  static constexpr int m8 = Tokens / 8;
  static constexpr int n_chunks = 4;
  static constexpr int n_tile = 256;
  static constexpr int k_rows = 4;  // one 128-byte swizzle atom of activations
  static constexpr int k_tile = 64;
  static constexpr int b_words = Bits / 4;
  static constexpr int producers = 128;
  static constexpr int consumers = 256;
  static constexpr int threads = producers + consumers;
  // Registers per thread after the hand-over (65536 per SM, one block).
  static constexpr int producer_regs = 40;
  static constexpr int consumer_regs = 232;
  // Per slot, in 16-byte units. Groups of 32 put two scale rows into a slot.
  static constexpr int a_stage = Tokens * 8;
  static constexpr int b_stage = k_rows * n_chunks * 32 * b_words;
  static constexpr int s_stage = 2 * n_chunks * 8;
  static constexpr int z_stage = 2 * n_chunks * 2;
  // The epilogue reduces and stores a column tile in two 128-column parts
  // (one per consumer warpgroup, in turn), which halves its fp32 buffer and
  // leaves room for deeper pipelines.
  static constexpr int parts = 2;
  static constexpr int part_cols = n_tile / parts;
  static constexpr int red_stride = part_cols + 4;
  static constexpr size_t red_bytes = 4 * static_cast<size_t>(Tokens) * red_stride;
  static constexpr size_t stage_bytes = 16 * static_cast<size_t>(a_stage + b_stage + s_stage + z_stage);
  static constexpr size_t tail_bytes = 2 * 8 * 8 + 16;  // barriers (at most 8 slots of two) and a flag
  static constexpr int stages_fit = static_cast<int>((kWideSmemBudget - red_bytes - tail_bytes) / stage_bytes);
  static constexpr int stages = stages_fit > 6 ? 6 : stages_fit;
  static_assert(stages >= 2, "a wide tile needs two pipeline slots");
  static constexpr size_t smem_bytes = stages * stage_bytes + red_bytes + tail_bytes;
};

}  // namespace ferrum::dense
