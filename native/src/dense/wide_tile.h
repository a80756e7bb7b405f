// Tile geometry of the warp-specialised Hopper kernel (wide_kernel.cuh), in a
// host-visible header so the launch planner can size it.
#pragma once

#include <stddef.h>

namespace ferrum::dense {

// Shared memory the wide kernel may use per block (Hopper opt-in maximum).
constexpr size_t kWideSmemBudget = 227 * 1024;

// Groups: consumer warpgroups (two; three for the whole-slot mode of 16-row slabs,
// whose warpgroups take whole slots in turn). Slabs of 256 rows: each of the
// two consumer warpgroups owns one 64-column chunk (a 128 x 256 tile whose
// m64n256 MMAs need half the dequantisation per product of two m64n128);
// otherwise two chunks each (256 columns).
// RowGroups: K-sharded act-order (dequantisation mode): each slot also holds
// its rows of the sorted g_idx and a window of scale rows from its first group.
// Gather: routed (MoE) slabs, whose activation rows the copier gathers one
// 16-byte copy at a time (the rows of a routing block are scattered over A).
// PartialTile: the instance for a partial last column tile (see partial_n).
template <int Tokens, int Bits, int Groups = 2, bool RowGroups = false, bool Gather = false,
          bool PartialTile = false>
struct WideTile {
  static_assert(Groups == 2 || (Groups == 3 && Tokens == 16), "three consumer warpgroups serve 16-row slabs");
  static_assert(!Gather || ((Tokens == 32 || Tokens == 48 || Tokens == 64) && Groups == 2 && !RowGroups),
                "routed slabs: 32, 48 or 64 rows, dequantisation mode");
  static_assert(Tokens == 16 || Tokens == 32 || Tokens == 48 || Tokens == 64 || Tokens == 128 || Tokens == 256,
                "warpgroup MMA widths built: 16, 32, 48, 64, 128 and 256 tokens");
  static constexpr int m_rows = Tokens;  // activation rows per slab = MMA n
  static constexpr int m8 = Tokens / 8;
  static constexpr int chunks_per_group = Tokens == 256 ? 1 : 2;  // dequantisation mode
  static constexpr int n_chunks = Tokens == 256 ? 2 : 4;
  static constexpr int n_tile = 64 * n_chunks;
  // 16-deep k rows per slot. 4-bit weights of 16-row slabs take 128-deep
  // slots: their slots are a weight stream whose per-slot costs (the
  // copier's issue, barriers, the fold) limited them at 64.
  static constexpr int k_rows = Tokens == 16 && Bits == 4 ? 8 : 4;
  static constexpr int k_tile = 16 * k_rows;
  // Activations: one 128-byte swizzle atom (64 k) per row and atom, atoms
  // one after the other (atom h of a slot at h * m_rows * 8 int4).
  static constexpr int k_atoms = k_tile / 64;
  // Activations by tensor copy (one per slot and atom), except in 16-row
  // slabs: their 2 KB boxes came later than 16-byte copies by the producers
  // (H200, W4A16 m = 16: 1-5 % slower; 12-15 % faster at m = 256, 3-6 % at
  // m = 128).
  static constexpr bool tensor_a = Tokens > 16 && !Gather;
  static constexpr bool gather = Gather;
  static constexpr int b_words = Bits / 4;
  static constexpr int producers = 128;
  // A partial last column tile (n a multiple of 64 that n_tile does not
  // divide: GPT-OSS's 2880, Qwen2.5-72B's 29568, vocabularies): the copier
  // threads of its missing chunks copy the last chunk inside n again, one
  // offset per thread and column, where a k row of the tile is at most one
  // copy per producer (4-bit weights, 8-bit ones in 128-column tiles). In
  // 8-bit 256-column tiles a thread's copies lie in chunks tid / 64 and
  // tid / 64 + 2, two offsets, whose per-slot cost made whole tiles 1-3 %
  // slower at m = 64 and 128 (H200). Such n takes a PartialTile instance of
  // its own, so that whole-tile layers run the kernel without any stepping
  // back (H200: W4A16 m = 64 0.8-1.2 % slower with it). Those columns are
  // never stored.
  static constexpr bool two_chunk_rows = n_chunks * 32 * b_words > producers;
  static_assert(!PartialTile || !RowGroups, "row groups: whole column tiles");
  static constexpr bool partial_n = PartialTile;  // this instance steps back
  // Whether a launch may leave the last tile partial (on its PartialTile instance).
  static constexpr bool serves_partial_n = !RowGroups;
  static constexpr int groups = Groups;
  static constexpr int consumers = 128 * Groups;
  static constexpr int threads = producers + consumers;
  // Registers per thread after the hand-over: the block's launch allocation
  // (65536 per SM, one block: 168 per thread of 384, 128 of 512) is
  // redistributed, never grown (a warpgroup asking for more than the others
  // released waits forever). The routed copier also holds its slab's
  // gathered rows and expert (at 40 it spilled), and in a partial 8-bit
  // tile the second step back (at 48 it spilled in its slot loop).
  static constexpr int producer_regs = Gather ? (PartialTile && two_chunk_rows ? 56 : 48) : 40;
  static constexpr int consumer_regs = Groups == 3 ? 152 : Gather ? 224 : 232;
  static constexpr int launch_regs = (65536 / (producers + consumers)) / 8 * 8;
  static_assert(producers * producer_regs + consumers * consumer_regs <= launch_regs * (producers + consumers),
                "the registers the block was launched with");
  static constexpr bool row_groups = RowGroups;
  // Per slot, in 16-byte units. Groups of 32 put two scale rows into a slot;
  // row groups a window of eight; one-byte E8M0 scales (MXFP4) take half.
  static constexpr int s_rows = RowGroups ? 8 : 2;
  static constexpr int a_stage = Tokens * 8 * k_atoms;
  static constexpr int b_stage = k_rows * n_chunks * 32 * b_words;
  static constexpr int s_stage = s_rows * n_chunks * 8;
  static constexpr int z_stage = s_rows * n_chunks * 2;
  static constexpr int g_stage = RowGroups ? k_tile / 4 : 0;
  // The fp32 epilogue (fp32 reduce of a shared column) reduces and stores a
  // column tile in parts, one after the other through one buffer, which
  // leaves room for deeper pipelines: two (one per consumer warpgroup's
  // chunks), four of 32 columns for 256-row slabs (each warpgroup's chunk in
  // two; the lock and c_tmp budgets per block hold four parts of a 128-column
  // tile); 16-row slabs need little room and reduce the whole tile at once.
  static constexpr int parts = Tokens <= 16 ? 1 : Tokens == 256 ? 4 : 2;
  static constexpr int part_cols = n_tile / parts;
  static constexpr int red_stride = part_cols + 4;
  static constexpr size_t red_bytes = 4 * static_cast<size_t>(Tokens) * red_stride;
  // Without fp32 reduce the same bytes hold the column tile's final 16-bit
  // values, [m_rows][stash_stride] (rows 16 bytes apart in the banks): the
  // whole tile at once, or for 256-row slabs one warpgroup's chunk at a time.
  static constexpr int stash_passes = Tokens == 256 ? 2 : 1;
  static constexpr int stash_cols = n_tile / stash_passes;
  static constexpr int stash_stride = stash_cols + 8;
  static_assert(2 * static_cast<size_t>(Tokens) * stash_stride <= red_bytes, "the stash fits the buffer");
  static constexpr size_t stage_bytes = 16 * static_cast<size_t>(a_stage + b_stage + s_stage + z_stage + g_stage);
  // Slabs of 16 and 32 rows are a weight stream: small slots, many of them
  // in flight; taller slabs keep six (more buys nothing once the MMAs limit).
  static constexpr int max_stages = Tokens <= 32 ? 16 : 6;
  static constexpr size_t tail_bytes = 2 * 8 * max_stages + 16;  // two barriers per slot and a flag
  static constexpr int stages_fit = static_cast<int>((kWideSmemBudget - red_bytes - tail_bytes) / stage_bytes);
  static constexpr int stages_cap = stages_fit > max_stages ? max_stages : stages_fit;
  // Whole slots go to the consumer warpgroups in turn, each waiting on a
  // slot's phase parity only: a slot must come back to the same warpgroup
  // (slots a multiple of the groups), or one could wait on a fill whose
  // predecessor, consumed by another warpgroup, has not landed yet, and take
  // that older phase for its own (8-bit 16-row tiles had 10 slots).
  static constexpr int stages = Groups == 3 ? stages_cap / 3 * 3 : stages_cap;
  static_assert(stages >= 2, "a wide tile needs two pipeline slots");
  static constexpr size_t smem_bytes = stages * stage_bytes + red_bytes + tail_bytes;
};

}  // namespace ferrum::dense
