// Dense Marlin GEMM for tall activation slabs on Hopper (sm_90a): the
// compute-bound regime, where the 8-warp kernel of gemm_kernel.cuh leaves the
// tensor cores idle while it dequantises and waits.
//
// Same problem, weight layout, formats (core/formats.cuh), work split
// ("stripes", see gemm_kernel.cuh) and column epilogue; what changes is who
// does what. Warp specialisation: warpgroup 0 only copies into a ring of
// pipeline slots (weights, scales and zero points by cp.async; the
// activations by one tensor-memory copy per slot and swizzle atom, which
// writes the 128-byte-swizzled rows the MMAs read; a slot's "full" mbarrier
// completes when all of it has landed); warpgroups 1 and 2 only compute.
// Each consumer warpgroup owns two 64-column chunks of the 256-column tile
// (one of a 128-column tile for 256-row slabs): per 16-deep k step it dequantises a weight fragment per
// chunk and issues one asynchronous warpgroup MMA per chunk (m64 x n{Tokens} x
// k16, weights from registers, activations from the 128-byte-swizzled
// slot), then waits only until at most three steps' MMAs are
// in flight, so dequantisation overlaps the tensor cores' work on earlier
// steps. A slot is handed back ("empty") once the MMAs that read it have
// retired. Warpgroup 0's copies per slot are a few adds each (offsets fixed per
// thread): as a serial integer stream they had been the bottleneck, and at
// 256 rows the activations' 16-byte copies still were (one tensor copy for
// them: W4A16 m = 256 12-15 % faster on the H200).
//
// 16-row slabs (a weight stream, not compute-bound) run differently: exact
// values, fp32 scales per slot, and whole slots handed to three consumer
// warpgroups in turn (see the whole-slot loop below). The description above
// is the dequantisation mode of the taller tiles.
#pragma once

#include <cuda_fp16.h>

#include "../core/formats.cuh"
#include "../core/mbarrier.cuh"
#include "../core/ptx.cuh"
#include "../core/tensor_map.h"
#include "../core/tma.cuh"
#include "../core/wgmma.cuh"
#include "column_epilogue.cuh"
#include "ferrum_marlin.h"
#include "gemm.h"
#include "gemm_tiles.h"
#include "launch_resident.cuh"
#include "stripes.cuh"
#include "wide_tile.h"

namespace ferrum::dense {

template <class W, class F, bool WholeSlots, bool TwoWindows = false, Route R = Route::Dense>
__global__ void __launch_bounds__(W::threads, 1) wide_kernel(const Args p, const __grid_constant__ CUtensorMap a_map) {
#ifdef FERRUM_WGMMA_AVAILABLE
  constexpr bool kBf16 = F::bf16;
  constexpr int kStages = W::stages;
  // Whole slots: each slot is one consumer warpgroup's (see below).
  constexpr int kSlotConsumers = WholeSlots ? 128 : W::consumers;
  // A warpgroup waits on a slot's phase parity only: the slot's previous fill
  // must have been its own (see WideTile::stages).
  static_assert(!WholeSlots || (kStages >= W::groups && kStages % W::groups == 0),
                "each slot comes back to the same consumer warpgroup");
  static_assert(WholeSlots || W::groups == 2, "dequantisation mode: two warpgroups of W::chunks_per_group chunks");
  static_assert(!TwoWindows || (WholeSlots && W::k_tile == 128), "two 64-deep group windows per 128-deep slot");
  // Dequantisation mode: MMAs (weight tiles per lane) per warpgroup and step.
  constexpr int kTiles = W::chunks_per_group;
  constexpr bool kTensorA = W::tensor_a;
  // Routed (vLLM fused MoE) slabs: one routing block each, the weights of its
  // expert, rows gathered by sorted_token_ids (see gemm_kernel.cuh's Route).
  constexpr bool kSorted = R == Route::Sorted;
  static_assert(R == Route::Dense || (kSorted && W::gather && !WholeSlots), "routed slabs: gathered rows");
  static_assert(!F::e8m0_scales || kSorted, "E8M0 scales (MXFP4): routed slabs");
  // The activation slots first: they must sit on 1024-byte boundaries (swizzle atoms).
  extern __shared__ __align__(1024) int4 smem[];
  int4* const sh_a = smem;
  int4* const sh_b = sh_a + kStages * W::a_stage;
  int4* const sh_s = sh_b + kStages * W::b_stage;
  int4* const sh_z = sh_s + kStages * W::s_stage;
  int4* const sh_g = sh_z + kStages * W::z_stage;  // row groups: each slot's g_idx rows
  float* const sh_red = reinterpret_cast<float*>(sh_g + kStages * W::g_stage);
  uint64_t* const full = reinterpret_cast<uint64_t*>(sh_red + W::m_rows * W::red_stride);
  uint64_t* const empty = full + kStages;
  int& sh_last = *reinterpret_cast<int*>(empty + kStages);

  const int tid = threadIdx.x;
  // The last column tile may be partial (W::partial_n): its missing chunks
  // are never stored (see step_back).
  const int n_tiles = W::partial_n ? (p.n + W::n_tile - 1) / W::n_tile : p.n / W::n_tile;
  const int k_tiles = p.k / W::k_tile;
  Stripes stripes;
  if (!stripes_of<R>(p, W::m_rows, n_tiles, k_tiles, stripes)) return;
  const int iters = stripes.iters, range = stripes.range, u_begin = stripes.u_begin, count = stripes.count;
  [[maybe_unused]] const int slabs = stripes.slabs;
  [[maybe_unused]] const int used_ids = stripes.used_ids;
  if (tid == 0) {
    for (int s = 0; s < kStages; ++s) {
      // Every producer's copies, and the tensor copy's bytes.
      mbar::init(full + s, W::producers + (kTensorA ? 1 : 0));
      mbar::init(empty + s, kSlotConsumers);
    }
    // The tensor copies complete `full` through the async proxy: it must see the initialised barriers.
    if constexpr (kTensorA) wgmma::fence_async_shared();
  }
  __syncthreads();
  if (count <= 0) return;
  if (p.a_after_previous_kernel) {
    ptx::griddep_wait();  // A is the previous kernel's output (act-order gather, MoE activation)
    if constexpr (R == Route::Sorted) ptx::griddep_launch_dependents();  // settled routing skipped enter_chain
  }
  // MXFP4's groups are 32 values: its scale-row arithmetic folds to constants.
  const int group_shift = F::e8m0_scales ? 5 : p.group_shift;
  const bool grouped = group_shift >= 0;
  const int z_shift = grouped ? group_shift : 30;  // zero points: one row when channelwise

  // The role as a warp-uniform value (a shuffle from lane 0), so that the
  // compiler sees the consumers' MMAs on a non-divergent path and does not
  // serialise them.
  const int role = __shfl_sync(0xffffffffu, tid / W::producers, 0);
  if (role == 0) {
    // ---- producer warpgroup: global -> shared ---------------------------------
    wgmma::release_registers<W::producer_regs>();
    const int4* const gB = static_cast<const int4*>(p.b);
    const int4* const gS = static_cast<const int4*>(p.s);
    const int4* const gZ = static_cast<const int4*>(p.z);
    constexpr int kBRowInt4 = W::n_chunks * 32 * W::b_words;  // one 16-deep k row of the tile
    constexpr int kBCopies = W::b_stage / W::producers;
    static_assert(W::b_stage % W::producers == 0, "copies split evenly");
    static_assert(W::producers % kBRowInt4 == 0 || kBRowInt4 % W::producers == 0, "B rows and copies nest");
    const int s_rows = grouped && W::k_tile > (1 << group_shift) ? W::k_tile >> group_shift : 1;
    constexpr int kSChunkInt4 = 4 * F::scale_bytes;  // one chunk's scales of one group row
    // (at most W::s_stage: the launchers keep 16-bit groups of 32 off 128-deep slots)
    const int s_copies = grouped && !W::row_groups ? s_rows * W::n_chunks * kSChunkInt4 : 0;
    const int z_copies = F::zero_points && !W::row_groups ? s_rows * W::n_chunks * 2 : 0;
    const int s_row_int4 = p.s_row_halves * F::scale_bytes / 16;
    // Besides its share of the weights, each copier warp takes at most one
    // other kind of copy: zero points warp 0, scales warps 1 and 2, the
    // activations' tensor copies lane 0 of warp 3. Every warp's copies of a
    // slot must be issued before the slot's `full` barrier can complete; with
    // the scales and the tensor copies both on warp 0, W4A16 at m = 48 and 64
    // took 6 % longer (H200).
    static_assert(W::producers == 128 && (W::row_groups || (W::s_stage <= 64 && W::z_stage <= 32)),
                  "scale and zero-point copier warps");
    const int s_tid = tid - 32;
    constexpr int kTensorCopier = 96;
    // The copies are one warp's serial instruction stream per SM quarter, so
    // everything per thread is fixed up front and a slot costs a few adds per
    // copy: B copy j is element tid + 128 j of the slot's k rows (row
    // (tid + 128 j) / kBRowInt4, unit (tid + 128 j) % kBRowInt4). The
    // activations are one tensor copy per swizzle atom (64 k), issued by
    // thread 0 (rows past the end of A arrive as zeros); in 16-row slabs
    // thread t copies 16-byte unit t % 8 of row t / 8 of each atom.
    // B copy 0 of this thread: element tid of the slot's rows of kBRowInt4
    // (a 128-column tile's rows are shorter than the 128 producers).
    const int b_first = (tid / kBRowInt4) * p.b_row_int4 + tid % kBRowInt4;
    const uint64_t weights_policy = ptx::evict_first_policy();
    // 16-byte activation copies (16-row and routed slabs): thread t copies
    // unit t % 8 of rows t / 8 + 16 j of each atom.
    constexpr int kACopies = kTensorA ? 1 : W::m_rows * 8 / W::producers;
    static_assert(kTensorA || kACopies * W::producers == W::m_rows * 8, "activation copies split evenly");
    const int a_row = tid >> 3;
    const int a_dst = a_row * 8 + ((tid & 7) ^ (a_row & 7));  // rows 16 apart keep the swizzle phase
    int kt = u_begin % k_tiles;
    int c = (u_begin / k_tiles) % n_tiles;
    int slab = u_begin / k_tiles / n_tiles;
    const int4* pb = nullptr;
    // 8-bit 256-column tiles: the copies of odd j lie two chunks right of
    // copy 0 (unit tid + 128); their step back less copy 0's (partial_n).
    constexpr bool kBTwoChunks = kBRowInt4 > W::producers;
    static_assert(!kBTwoChunks || kBRowInt4 == 2 * W::producers, "at most two copies per k row");
    [[maybe_unused]] int b_hi_back = 0;
    const int4* pa[kACopies] = {};
    bool a_live[kACopies] = {};  // this thread's rows exist (else it copies zeros)
    [[maybe_unused]] int a_src[kACopies] = {};  // routed: their rows of A, fixed per slab
    [[maybe_unused]] int seek_slab = -1;
    [[maybe_unused]] long long expert = 0;  // routed: the slab's expert (< 0: skipped, nothing copied)
    constexpr int kSRowInt4 = W::n_chunks * kSChunkInt4;  // a group row of the tile's scales
    constexpr int kZRowInt4 = W::n_chunks * 2;
    // A partial last column tile (W::partial_n): the threads of its missing
    // chunks copy the last chunk inside n again (in bounds, from L2; those
    // columns are never stored). Each thread's copies of one kind belong to
    // one chunk (B in 8-bit 256-column tiles: two, see b_hi_back), so the
    // step back is one offset per thread and column (a test per copy made the
    // copier spill: routed W4A16 blocks of 32 1.5x slower), in 16-byte units:
    // `unit` of chunk unit / `per_chunk`.
    auto step_back = [&](int c, int unit, int per_chunk) {
      if constexpr (!W::partial_n) return 0;
      const int chunk = unit / per_chunk;
      return (chunk - min(chunk, p.n / 64 - c * W::n_chunks - 1)) * per_chunk;
    };
    auto seek = [&]() {
      if constexpr (kSorted) {
        if (slab != seek_slab) {
          seek_slab = slab;
          // The last unit's advance seeks one slab past the work.
          expert = slab < slabs ? __ldg(p.route.slab_experts + slab) : -1;
#pragma unroll
          for (int j = 0; j < kACopies; ++j) {
            const int t = routed_row<R>(p.route, true, slab, a_row + 16 * j, W::m_rows, used_ids);
            a_live[j] = static_cast<unsigned>(t) < static_cast<unsigned>(p.route.rows);
            a_src[j] = a_live[j] ? t / p.route.top_k : 0;
          }
        }
      }
      // (B: thread tid copies unit tid % kBRowInt4 of its rows, one chunk;
      // in two-chunk rows also unit tid + 128, b_hi_back.)
      const long long e = kSorted ? max(expert, 0ll) : 0;
      pb = gB + e * p.route.b_expert_int4 + static_cast<size_t>(kt) * W::k_rows * p.b_row_int4 + c * kBRowInt4 +
           b_first - step_back(c, tid % kBRowInt4, 32 * W::b_words);
      if constexpr (kBTwoChunks && W::partial_n)
        b_hi_back = step_back(c, tid + W::producers, 32 * W::b_words) - step_back(c, tid, 32 * W::b_words);
      if constexpr (!kTensorA) {
#pragma unroll
        for (int j = 0; j < kACopies; ++j) {
          int row = a_src[j];
          if constexpr (!kSorted) {
            row = slab * W::m_rows + a_row + 16 * j;
            a_live[j] = row < p.m;
            row = a_live[j] ? row : 0;
          }
          pa[j] = static_cast<const int4*>(p.a) + static_cast<size_t>(row) * p.a_row_int4 + kt * (W::k_tile / 8) +
                  (tid & 7);
        }
      }
    };
    seek();
    // Row groups: the first group of the next slot (its scale window starts
    // there), loaded one slot ahead so that the copies never wait on it.
    [[maybe_unused]] int g_first = 0;
    if constexpr (W::row_groups) g_first = __ldg(p.row_groups + kt * W::k_tile);
#pragma unroll 1
    for (int i = 0; i < count; ++i) {
      const int slot = i % kStages;
      if (i >= kStages) mbar::wait(empty + slot, ((i / kStages) - 1) & 1);
      // A skipped routed slab (expert < 0) copies nothing: its slots only pass the barriers.
      const bool copy = !kSorted || expert >= 0;
      int4* const db = sh_b + slot * W::b_stage + tid;
#pragma unroll
      for (int j = 0; j < kBCopies; ++j) {
        const int unit = (W::producers * j) % kBRowInt4;  // 0, or 128 for odd j of two chunks per k row
        const int back = kBTwoChunks && W::partial_n && unit != 0 ? b_hi_back : 0;
        if (copy)
          ptx::cp_async16_hint(db + j * W::producers,
                               pb + ((W::producers * j) / kBRowInt4) * p.b_row_int4 + unit - back, weights_policy);
      }
      if constexpr (kTensorA) {
        if (tid == kTensorCopier) {
          tma::arrive_expect_tx(full + slot, 16u * W::a_stage);
#pragma unroll
          for (int atom = 0; atom < W::k_atoms; ++atom)
            tma::load_2d(sh_a + slot * W::a_stage + atom * (W::m_rows * 8), &a_map, kt * W::k_tile + 64 * atom,
                         slab * W::m_rows, full + slot);
        }
      } else if (copy) {
#pragma unroll
        for (int atom = 0; atom < W::k_atoms; ++atom)
#pragma unroll
          for (int j = 0; j < kACopies; ++j)
            ptx::cp_async16_or_zero(sh_a + slot * W::a_stage + atom * (W::m_rows * 8) + a_dst + 128 * j,
                                    pa[j] + 8 * atom, a_live[j]);
      }
      const long long e = kSorted ? max(expert, 0ll) : 0;
      if (copy && static_cast<unsigned>(s_tid) < static_cast<unsigned>(s_copies)) {
        const int group_row = ((kt * W::k_tile) >> group_shift) + s_tid / kSRowInt4;
        ptx::cp_async16(sh_s + slot * W::s_stage + s_tid,
                        gS + e * (p.route.s_expert_bytes / 16) + static_cast<size_t>(group_row) * s_row_int4 +
                            c * kSRowInt4 + s_tid % kSRowInt4 - step_back(c, s_tid % kSRowInt4, kSChunkInt4));
      }
      if (copy && tid < z_copies) {
        const int group_row = ((kt * W::k_tile) >> z_shift) + tid / kZRowInt4;
        ptx::cp_async16(sh_z + slot * W::z_stage + tid,
                        gZ + e * p.route.z_expert_int4 + static_cast<size_t>(group_row) * p.z_row_int4 +
                            c * kZRowInt4 + tid % kZRowInt4 - step_back(c, tid % kZRowInt4, 2));
      }
      if constexpr (W::row_groups) {
        if (tid < W::k_tile)
          ptx::cp_async4(reinterpret_cast<int*>(sh_g + slot * W::g_stage) + tid, p.row_groups + kt * W::k_tile + tid);
        // Window row r is group g_first + r, clamped into the scales' rows.
        constexpr int kRowInt4 = W::n_chunks * 8;
        static_assert(W::s_rows * kRowInt4 % W::producers == 0, "window copies split evenly");
#pragma unroll
        for (int j = 0; j < W::s_rows * kRowInt4 / W::producers; ++j) {
          const int e = tid + W::producers * j;
          const int group = min(max(g_first + e / kRowInt4, 0), p.num_groups - 1);
          ptx::cp_async16(sh_s + slot * W::s_stage + e,
                          gS + static_cast<size_t>(group) * s_row_int4 + c * kRowInt4 + e % kRowInt4);
        }
        if constexpr (F::zero_points) {
          constexpr int kZRowInt4 = W::n_chunks * 2;
          static_assert(W::s_rows * kZRowInt4 <= W::producers, "one zero-point copy per thread");
          if (tid < W::s_rows * kZRowInt4) {
            const int group = min(max(g_first + tid / kZRowInt4, 0), p.num_groups - 1);
            ptx::cp_async16(sh_z + slot * W::z_stage + tid,
                            gZ + static_cast<size_t>(group) * p.z_row_int4 + c * kZRowInt4 + tid % kZRowInt4);
          }
        }
      }
      mbar::arrive_on_copies(full + slot);
      if (++kt == k_tiles) {
        kt = 0;
        if (++c == n_tiles) {
          c = 0;
          ++slab;
        }
        seek();
      } else {
        pb += W::k_rows * p.b_row_int4;
        if constexpr (!kTensorA) {
#pragma unroll
          for (int j = 0; j < kACopies; ++j) pa[j] += W::k_tile / 8;
        }
      }
      if constexpr (W::row_groups) g_first = __ldg(p.row_groups + kt * W::k_tile);
    }
    ptx::cp_async_wait<0>();
    return;
  }

  // ---- consumer warpgroups: shared -> registers -> tensor cores ---------------
  wgmma::claim_registers<W::consumer_regs>();
  const int ctid = tid - W::producers;
  const int group = role - 1;
  // Dequantisation mode, the 64-row A operand of MMA h of this warpgroup. Two
  // chunks per warpgroup (2 group, 2 group + 1): warp w supplies tile
  // 2 (w % 2) + h of chunk 2 group + w / 2, so a lane's two tiles are adjacent
  // words of its 16-byte Marlin unit (one 8- or 16-byte shared load per step
  // instead of two 4-way-conflicting ones). One chunk (`group`): warp w
  // supplies its tile w.
  const int wg_warp = (ctid >> 5) & 3;
  const int chunk = kTiles == 2 ? 2 * group + (wg_warp >> 1) : group;
  const int tile0 = kTiles == 2 ? 2 * (wg_warp & 1) : wg_warp;
  const int lane = tid & 31;
  auto consumer_sync = [] { mbar::named_sync<1, W::consumers>(); };

  // Dequantisation mode: one accumulator per MMA; whole slots: per tile of the chunk.
  constexpr int kAccTiles = WholeSlots ? 4 : kTiles;
  float acc[kAccTiles][W::m8][4];
  auto zero_acc = [&]() {
#pragma unroll
    for (int h = 0; h < kAccTiles; ++h)
#pragma unroll
      for (int j = 0; j < W::m8; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[h][j][e] = 0.f;
  };
  // Dequantisation mode: the lane's byte offsets into a slot's weights and
  // scale pairs, fixed for the kernel and kept opaque, so that a slot's reads
  // cost one add to the slot's base (ptxas rebuilt them from the thread index
  // after every slot's wait). The zero-point word's offset stays a plain
  // value: opaque too, it made INT4 with zero points 1.6-2.2 % slower at
  // m = 64 than it is now (H200).
  int b_lane = (chunk * 32 + lane) * W::b_words * 16 + tile0 * F::words * 4;
  int s_lane = F::e8m0_scales ? chunk * 64 + (2 * (lane >> 2) + (tile0 >> 1)) * 4
                              : (chunk * 8 + (lane >> 2)) * 16 + (kTiles == 2 ? (tile0 >> 1) * 8 : tile0 * 4);
  const int z_lane = chunk * 32 + (lane >> 2) * 4;
  ptx::opaque(b_lane);
  ptx::opaque(s_lane);
  auto at = [](const int4* base, int bytes) { return reinterpret_cast<const char*>(base) + bytes; };
  // A lane's codes of one 16-deep step (its tiles' words), read for all steps
  // of a slot at once, so the shared-memory latency is paid once per slot.
  using StepWords = uint32_t[kTiles * F::words];
  auto read_words = [&](const int4* sb, int row, StepWords& w) {
    const uint32_t* const src =
        reinterpret_cast<const uint32_t*>(at(sb, row * (W::n_chunks * 32 * W::b_words * 16) + b_lane));
    if constexpr (kTiles * F::words == 1) {
      w[0] = *src;
    } else if constexpr (kTiles * F::words == 2) {
      const uint2 v = *reinterpret_cast<const uint2*>(src);
      w[0] = v.x;
      w[1] = v.y;
    } else {
      const uint4 v = *reinterpret_cast<const uint4*>(src);
      w[0] = v.x;
      w[1] = v.y;
      w[2] = v.z;
      w[3] = v.w;
    }
  };
  // The scale pairs of this lane's tiles and its zero-point word in group row
  // s_row of a slot (pairs stay zero when channelwise: the epilogue scales).
  struct GroupPairs {
    uint32_t scales[kTiles];
    uint32_t zero;
  };
  // `scaled` (grouped scales) is a constant of each copy of the slot loop
  // (`slots` below).
  auto read_pairs = [&](const int4* ss, const int4* sz, int s_row, bool scaled) {
    GroupPairs g{};
    if constexpr (F::zero_points)
      g.zero = *reinterpret_cast<const uint32_t*>(at(sz, s_row * (W::n_chunks * 2 * 16) + z_lane));
    if constexpr (F::e8m0_scales) {
      // The lane's eight E8M0 bytes of the chunk (tiles 0..3), of which its
      // two tiles' four.
      static_assert(kTiles == 2, "E8M0 scales: two tiles per warp");
      const uint32_t v = *reinterpret_cast<const uint32_t*>(at(ss, s_row * (W::n_chunks * 4 * 16) + s_lane));
      uint32_t sp[4];
      F::e8m0_pairs(v, 0u, sp);
      g.scales[0] = sp[0];
      g.scales[1] = sp[1];
    } else if (scaled) {
      const char* const pairs = at(ss, s_row * (W::n_chunks * 8 * 16) + s_lane);  // this lane's tiles' pairs
      if constexpr (kTiles == 2) {
        const uint2 v = *reinterpret_cast<const uint2*>(pairs);
        g.scales[0] = v.x;
        g.scales[1] = v.y;
      } else {
        g.scales[0] = *reinterpret_cast<const uint32_t*>(pairs);
      }
    }
    return g;
  };
  // The step's weight fragments: exact values times their group scales.
  auto fragments = [&](const StepWords& w, const GroupPairs& g, Frag16x16 (&f)[kTiles], bool scaled) {
#pragma unroll
    for (int h = 0; h < kTiles; ++h) {
      f[h] = F::dequant(w + h * F::words, F::zero_points ? F::zero_pair(g.zero, tile0 + h) : 0u);
      if (scaled) F::scale(f[h], g.scales[h]);
    }
  };

  // K-sharded act-order (row groups): the pairs of group g for this lane's
  // tiles, and its zero-point word, from the slot's window (groups g0 ..
  // g0 + s_rows - 1) or else, clamped, from global memory through the same
  // generic load; a step inside one group (the sorted g_idx has equal ends)
  // scales like any group, others per fragment row (k, k+1, k+8, k+9).
  auto row_fragments = [&](int slot, const int4* ss, const int4* sz, int col, int row, const StepWords& w,
                           Frag16x16 (&f)[kTiles]) {
    const int* const sg = reinterpret_cast<const int*>(sh_g + slot * W::g_stage);
    const int g0 = sg[0];
    auto pairs_of = [&](int g, uint32_t (&sp)[kTiles], [[maybe_unused]] uint32_t& zw) {
      const unsigned d = static_cast<unsigned>(g - g0);
      const bool staged = d < static_cast<unsigned>(W::s_rows);
      const size_t grp = min(static_cast<unsigned>(max(g, 0)), static_cast<unsigned>(p.num_groups - 1));
      const int4* const s_base = staged ? ss + d * (W::n_chunks * 8)
                                        : static_cast<const int4*>(p.s) + grp * (p.s_row_halves / 8) +
                                              col * (W::n_chunks * 8);
      const int4* const pairs = s_base + chunk * 8 + (lane >> 2);  // tiles 0..3
      if constexpr (kTiles == 2) {
        const uint2 v = reinterpret_cast<const uint2*>(pairs)[tile0 >> 1];
        sp[0] = v.x;
        sp[1] = v.y;
      } else {
        sp[0] = reinterpret_cast<const uint32_t*>(pairs)[tile0];
      }
      if constexpr (F::zero_points) {
        const int4* const z_base = staged ? sz + d * (W::n_chunks * 2)
                                          : static_cast<const int4*>(p.z) + grp * p.z_row_int4 +
                                                col * (W::n_chunks * 2);
        zw = reinterpret_cast<const uint32_t*>(z_base + chunk * 2)[lane >> 2];
      }
    };
    const int first = sg[16 * row];
    if (first == sg[16 * row + 15]) {
      uint32_t sp[kTiles], zw = 0;
      pairs_of(first, sp, zw);
#pragma unroll
      for (int h = 0; h < kTiles; ++h) {
        f[h] = F::dequant(w + h * F::words, F::zero_points ? F::zero_pair(zw, tile0 + h) : 0u);
        F::scale(f[h], sp[h]);
      }
      return;
    }
    const int* const rows = sg + 16 * row + 2 * (lane & 3);
    constexpr int kRowOffsets[4] = {0, 1, 8, 9};
    uint32_t sp[4][kTiles];
    uint32_t zw[4] = {};
#pragma unroll
    for (int j = 0; j < 4; ++j) pairs_of(rows[kRowOffsets[j]], sp[j], zw[j]);
    dequant_row_groups<F, kTiles>(w, sp, zw, tile0, f);
  };

  using Epilogue = ColumnEpilogue<W::m_rows, W::part_cols, W::consumers, F, R, W::parts>;
  static_assert(Epilogue::kRedStride == W::red_stride, "one reduction tile layout");
  static_assert(W::parts == 1 || !WholeSlots, "parts: the consumer warpgroups' chunks, in turn");
  static_assert(W::stash_passes == 1 || kTiles == 1, "stash passes: one per consumer warpgroup's chunk");
  // Accumulator (h, j, e) of lane (g, q) is C^T[n = n_of(h) + g + 8 (e/2)][m = 8j + 2q + e%2].
  auto stash = [&](const auto& a, int hs, auto n_of, bool add) {
#pragma unroll
    for (int h = 0; h < hs; ++h)
#pragma unroll
      for (int j = 0; j < W::m8; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          float* const dst = sh_red + (8 * j + 2 * (lane & 3) + (e & 1)) * W::red_stride + n_of(h) + (lane >> 2) +
                             8 * (e >> 1);
          *dst = add ? *dst + a[h][j][e] : a[h][j][e];
        }
  };
  // Dequantisation mode, a column no other block shares or no fp32 reduce
  // (the rounding and the order are the fp32 path's): the column's final values --
  // channelwise scales and, where this block stores rather than adds, the
  // bias, applied in fp32 and rounded once, as store_rows does -- go into the
  // reduction buffer as one row-major 16-bit tile (stmatrix transposes each
  // 8 x 8 block of C^T that an accumulator fragment holds into eight 16-byte
  // rows of C), and leave it in 16-byte vectors: a third of the fp32 path's
  // shared-memory traffic, and one fence instead of one per part. 256-row
  // slabs stash one warpgroup's chunk at a time (W::stash_passes), which
  // halves the buffer and buys a pipeline slot.
  auto stash_and_store = [&](const auto& a, int slab, int c, int col) {
    using N = typename F::N;
    const bool add_bias = p.bias != nullptr && !Epilogue::share_of(p, 0, c, col, range, iters, k_tiles, 0).adds();
    uint16_t* const stash = reinterpret_cast<uint16_t*>(sh_red);
    const int mi = lane >> 3;  // this lane addresses row lane % 8 of matrix mi of each stmatrix
#pragma unroll 1
    for (int pass = 0; pass < W::stash_passes; ++pass) {
      if (W::stash_passes == 1 || group == pass) {
#pragma unroll
        for (int h = 0; h < kTiles; ++h) {
          const int first = 64 * chunk + 16 * (tile0 + h);  // the warp's 16 columns of MMA h
          float scale[2] = {1.f, 1.f}, bias[2] = {0.f, 0.f};
#pragma unroll
          for (int hh = 0; hh < 2; ++hh) {
            // (columns past n, of a partial last tile, are never stored: read column n - 1)
            int n = c * W::n_tile + first + (lane >> 2) + 8 * hh;
            if constexpr (W::partial_n) n = min(n, p.n - 1);
            if (!grouped) scale[hh] = Epilogue::channel_value(p.s, n, true);
            if (add_bias) bias[hh] = Epilogue::channel_value(p.bias, n, p.route.bias_p32);
          }
          uint16_t* const rows = stash + (8 * (mi >> 1) + (lane & 7)) * W::stash_stride + first -
                                 pass * W::stash_cols + 8 * (mi & 1);
#pragma unroll
          for (int j = 0; j < W::m8; j += 2) {
            uint32_t r[4];  // matrix i: tokens 8 (j + i / 2).., columns first + 8 (i % 2)..
#pragma unroll
            for (int i = 0; i < 4; ++i) {
              const float* const x = a[h][j + (i >> 1)] + 2 * (i & 1);
              r[i] = add_bias
                         ? N::from_floats(fmaf(x[0], scale[i & 1], bias[i & 1]), fmaf(x[1], scale[i & 1], bias[i & 1]))
                         : N::from_floats(x[0] * scale[i & 1], x[1] * scale[i & 1]);  // keeps -0
            }
            ptx::stmatrix_x4_trans(rows + 8 * j * W::stash_stride, r);
          }
        }
      }
      consumer_sync();
      Epilogue::template store_stashed<W::stash_stride, W::stash_cols>(
          p, reinterpret_cast<const int4*>(sh_red), ctid, consumer_sync, slab, c, col, range, iters, k_tiles,
          pass * W::stash_cols, pass == 0, pass == W::stash_passes - 1);
    }
  };
  auto finish_column = [&](int u, const auto& a) {
    const int col = u / k_tiles;
    const int slab = col / n_tiles;
    const int c = col - slab * n_tiles;
    if constexpr (WholeSlots) {
      // Every warpgroup holds partials of all 256 columns (warp w: chunk w).
      auto n_of = [&](int h) { return 64 * wg_warp + 16 * h; };
#pragma unroll 1
      for (int g = 0; g < W::groups; ++g) {
        if (group == g) stash(a, 4, n_of, g > 0);
        consumer_sync();
      }
      Epilogue::reduce_and_store(p, sh_red, sh_last, ctid, consumer_sync, 0, slab, 0, c, col, range, iters, k_tiles);
    } else {
      // Part by part through the fp32 buffer: fp32 reduce of a shared column,
      // and every routed column (rows by sorted_token_ids, top-k weights, the
      // expert's bias and channelwise scales: store_rows).
      auto store_parts = [&](long long e) {
        // A warp's tiles tile0 + h of chunk `chunk` lie in one part, `my_part`.
        const int my_part = (64 * chunk + 16 * tile0) / W::part_cols;
        auto n_of = [&](int h) { return 64 * chunk + 16 * (tile0 + h) - my_part * W::part_cols; };
#pragma unroll 1
        for (int part = 0; part < W::parts; ++part) {
          if (my_part == part) stash(a, kTiles, n_of, false);
          consumer_sync();
          Epilogue::reduce_and_store(p, sh_red, sh_last, ctid, consumer_sync, used_ids, slab, e, c, col, range, iters,
                                     k_tiles, part);
        }
      };
      if constexpr (kSorted)
        store_parts(__ldg(p.route.slab_experts + slab));
      else if (!p.fp32_reduce || !Epilogue::share_of(p, 0, c, col, range, iters, k_tiles, 0).shared())
        stash_and_store(a, slab, c, col);
      else
        store_parts(0);
    }
  };

  const uint64_t a_desc0 = wgmma::sw128_kmajor_desc(sh_a);
  // The activations' descriptor of a slot's 16-deep step: 32 bytes further
  // into the 128-byte rows per step, a new atom block every four (the
  // descriptor's address is in 16-byte units).
  auto step_desc = [](uint64_t desc, int row) -> uint64_t {
    return desc + (row / 4) * (W::m_rows * 8) + 2 * (row % 4);
  };
  // A slot whose copies have landed: where its weights, scales and zero
  // points are, and its activations' descriptor.
  struct Slot {
    int index;
    const int4* b;
    const int4* s;
    const int4* z;
    uint64_t desc;  // of the slot's first step (step_desc)
  };
  auto await_slot = [&](int slot, uint32_t parity) -> Slot {
    mbar::wait(full + slot, parity);
    // 16-byte copies' activations, visible to the MMA's async proxy (tensor copies write there).
    if constexpr (!kTensorA) wgmma::fence_async_shared();
    return Slot{slot, sh_b + slot * W::b_stage, sh_s + slot * W::s_stage, sh_z + slot * W::z_stage,
                a_desc0 + static_cast<uint64_t>(slot) * W::a_stage};
  };
  int i = 0;
  int c_kt = u_begin % k_tiles;
  if constexpr (WholeSlots) {
    // ---- whole slots (16-row slabs) ---------------------------------------------
    // The tensor cores are nearly idle at 16 rows; what limits is each
    // consumer's instructions and latency per slot. So the three warpgroups
    // take whole slots in turn (slot i: warpgroup i mod 3), three slots in
    // work at once, each a step-by-step pipeline: a step's fragments (no
    // scale) are made while the previous step's MMAs run, and the slot's fp32
    // partials are scaled once per group window, when its MMAs have retired
    // (a window is the slot, or half of a 128-deep slot for groups of 64;
    // channelwise: unit scales here, the epilogue applies the real ones).
    // Warp w owns chunk w: per step, MMA h takes tile h of every chunk, and a
    // lane's four tiles are its Marlin unit (one 16-byte load; two for 8-bit
    // codes).
    //
    // bf16 INT4 codes multiply as raw images (E + q: one or two instructions
    // per register where exact values q - z take two or three), and one more
    // MMA per step with a constant fragment gives the activation sums that
    // remove the images' offsets when the window folds (fold_images): the
    // tensor cores have room at 16 rows, the integer and fp16 pipes do not.
    // The partials then carry E = 128 times the activation sums, which the
    // fold cancels in fp32, as the 8-warp kernel's short slabs do. H200,
    // m = 16, large layers: bf16 INT4 1.7-3.2 % faster than exact values.
    // Exact values (formats.cuh) remain for fp16 codes (their exact values
    // take one FMA a word; as images f16-u4 was 0.1-2 % slower and W4A16
    // 1.5-2.8 %), FP8 and E2M1 codes, and bf16 INT8, whose two images per
    // code spill.
    constexpr bool kSlotImages = (F::const_correction || F::zero_points) && !F::two_images && F::bf16;
    float part[4][W::m8][4];
    [[maybe_unused]] float corr[W::m8][4];
    // Kept in one register quad for the whole loop: ptxas rebuilt the
    // constants before every step (and, once, reused a constant's register
    // while an MMA still read it). XOR-ed with four different zeros it cannot
    // know (k > 0): equal values were merged, and an OR with a bit the
    // constant holds folds back to the constant.
    [[maybe_unused]] Frag16x16 correction = F::correction();
    if constexpr (kSlotImages)
      for (int r = 0; r < 4; ++r) correction.r[r] ^= (static_cast<uint32_t>(p.k) >> 31) << r;
    const int my_chunk = wg_warp;
    uint32_t scales[4] = {F::N::kOne, F::N::kOne, F::N::kOne, F::N::kOne};
    // Groups of 64 in a 128-deep slot: two windows, each folded with its scale row.
    constexpr int window = TwoWindows ? W::k_rows / 2 : W::k_rows;
    // A window's scale pairs, read while the slot is still this warpgroup's.
    auto read_scales = [&](const Slot& sl, int s_row) {
      if (grouped) {
        const int4 sc = sl.s[(s_row * W::n_chunks + my_chunk) * 8 + (lane >> 2)];
        scales[0] = sc.x;
        scales[1] = sc.y;
        scales[2] = sc.z;
        scales[3] = sc.w;
      }
    };
#pragma unroll 1
    while (i < count) {
      const int run_end = i + min(count - i, k_tiles - c_kt);
      zero_acc();
#pragma unroll 1
      for (; i < run_end; ++i) {
        if (i % W::groups != group) continue;
        const Slot sl = await_slot(i % kStages, (i / kStages) & 1);
        // The window's zero-point word (nibbles of the chunk's columns) and,
        // for exact values, its pairs {E + z(c), E + z(c+8)} per tile h.
        uint32_t zero_word = 0u;
        uint32_t zeros[4] = {0u, 0u, 0u, 0u};
        auto load_zeros = [&](int z_row) {
          if constexpr (F::zero_points) {
            zero_word = reinterpret_cast<const uint32_t*>(sl.z + (z_row * W::n_chunks + my_chunk) * 2)[lane >> 2];
            if constexpr (!kSlotImages) {
#pragma unroll
              for (int h = 0; h < 4; ++h) zeros[h] = F::zero_pair(zero_word, h);
            }
          }
        };
        auto fence_partials = [&] {
          wgmma::fence_operands(part);
          if constexpr (kSlotImages) wgmma::fence_operands(corr);
        };
        auto fold = [&] {
          if constexpr (kSlotImages) fold_images<F, W::m8>(acc, part, corr, scales, zero_word);
          else fold_scaled<F>(acc, part, scales);
        };
        load_zeros(0);
        uint32_t w[W::k_rows][4 * F::words];
#pragma unroll
        for (int row = 0; row < W::k_rows; ++row)
          unit_words<F::words>(sl.b + (row * W::n_chunks + my_chunk) * 32 * W::b_words + lane * W::b_words, w[row]);
        Frag16x16 fr[2][4];  // two fragment sets, alternating by step
#pragma unroll
        for (int row = 0; row < W::k_rows; ++row) {
#pragma unroll
          for (int h = 0; h < 4; ++h) {
            if constexpr (kSlotImages) {
              Frag16x16 unused;
              F::images(w[row] + h * F::words, fr[row & 1][h], unused);
            } else {
              fr[row & 1][h] = F::dequant(w[row] + h * F::words, zeros[h]);
            }
          }
          wgmma::fence();
          const uint64_t desc = step_desc(sl.desc, row);
#pragma unroll
          for (int h = 0; h < 4; ++h)  // a window's first step overwrites the partials
            wgmma::mma_m64k16<W::m_rows, kBf16>(part[h], fr[row & 1][h].r, desc, row % window);
          if constexpr (kSlotImages) wgmma::mma_m64k16<W::m_rows, kBf16>(corr, correction.r, desc, row % window);
          wgmma::commit();
          if (row + 1 < W::k_rows) {
            if constexpr (TwoWindows) {
              if (row + 1 == window) {  // the first of two windows
                wgmma::wait<0>();
                fence_partials();
                read_scales(sl, 0);
                fold();
                load_zeros(1);
                continue;
              }
            }
            wgmma::wait<1>();  // the previous step's fragments are free again
          }
        }
        // The last window's scales (and zero points) come out of the slot
        // before it is handed back: once every consumer arrived, the copier
        // may refill it.
        read_scales(sl, W::k_rows / window - 1);
        wgmma::wait<0>();
        fence_partials();
        mbar::arrive(empty + sl.index);
        fold();
      }
      i = run_end;
      finish_column(u_begin + i - 1, acc);
      c_kt = 0;
    }
  } else {
    // ---- dequantisation mode ----------------------------------------------------
    // MMA groups (steps) left in flight while the next step is dequantised.
    constexpr int kPending = 3;
    static_assert(kPending < W::k_rows, "a slot is released within the next slot's steps");
    static_assert(W::k_rows == 4, "64-deep slots: one group row, or two for groups of 32");
    int release = -1;  // the slot whose MMAs may still be in flight
    Frag16x16 f[W::k_rows][kTiles];
    // Slot i's ring index and phase, advanced by one per slot (no division per slot).
    int ring = i % kStages;
    uint32_t parity = (i / kStages) & 1;
    // Group row of the slot's last two steps: 1 for groups of 32 (groups are 32 or more).
    const int upper_s_row = (16 * W::k_rows / 2) >> z_shift;
#pragma unroll 1
    while (i < count) {
      const int run_end = i + min(count - i, k_tiles - c_kt);
      [[maybe_unused]] const int col = (u_begin + i) / k_tiles % n_tiles;  // row groups' global reads
      if constexpr (kSorted) {
        // A skipped routed slab (expert < 0): its slots pass the barriers
        // empty-handed; no MMAs, no store, no lock.
        if (__ldg(p.route.slab_experts + (u_begin + i) / k_tiles / n_tiles) < 0) {
#pragma unroll 1
          for (; i < run_end; ++i) {
            const Slot sl = await_slot(ring, parity);
            if (++ring == kStages) {
              ring = 0;
              parity ^= 1u;
            }
            mbar::arrive(empty + sl.index);
          }
          c_kt = 0;
          continue;
        }
      }
      zero_acc();
      // The run's slots, in one copy per value of `scaled` (inlined at both
      // calls): a run-time test around each scale multiply split the steps
      // into blocks that ptxas did not schedule across (W4A16 m = 64 5 % slower).
      auto slots = [&](const bool scaled) {
#pragma unroll 1
        for (; i < run_end; ++i) {
          const Slot sl = await_slot(ring, parity);
          if (++ring == kStages) {
            ring = 0;
            parity ^= 1u;
          }
          StepWords w[W::k_rows];
#pragma unroll
          for (int row = 0; row < W::k_rows; ++row) read_words(sl.b, row, w[row]);
          GroupPairs pairs[2]{};
          if constexpr (!W::row_groups) {
            pairs[0] = read_pairs(sl.s, sl.z, 0, scaled);
            pairs[1] = read_pairs(sl.s, sl.z, upper_s_row, scaled);
          }
#pragma unroll
          for (int row = 0; row < W::k_rows; ++row) {
            // One register set per step of the slot: a step's fragments are
            // rewritten four steps later, after its MMAs retired (kPending < 4).
            if constexpr (W::row_groups)
              row_fragments(sl.index, sl.s, sl.z, col, row, w[row], f[row]);
            else
              fragments(w[row], pairs[row / (W::k_rows / 2)], f[row], scaled);
            wgmma::fence();
#pragma unroll
            for (int h = 0; h < kTiles; ++h) wgmma::mma_m64k16<W::m_rows, kBf16>(acc[h], f[row][h].r, step_desc(sl.desc, row));
            wgmma::commit();
            wgmma::wait<kPending>();
            // The previous slot's last step has retired once kPending newer ones were issued.
            if (row == kPending - 1 && release >= 0) mbar::arrive(empty + release);
          }
          release = sl.index;
        }
      };
      if (grouped)
        slots(true);
      else
        slots(false);
      wgmma::wait<0>();
      wgmma::fence_operands(acc);
      mbar::arrive(empty + release);
      release = -1;
      finish_column(u_begin + i - 1, acc);
      c_kt = 0;
    }
  }
#else
  (void)p;
  (void)a_map;
  __trap();
#endif
}

template <class W, class F, bool WholeSlots, bool TwoWindows>
cudaError_t launch_wide_instance(Args& args, const Launch& launch, int* stage) {
  CUtensorMap a_map{};  // the activations, in boxes of one slab's rows and 64 k (slabs of more than 16 rows)
  if constexpr (W::tensor_a) {
    if (const cudaError_t err = encode_rows_map(&a_map, args.a, args.m, args.k, 8ll * args.a_row_int4, W::m_rows)) {
      *stage = FERRUM_STAGE_KERNEL_LAUNCH;
      return err;
    }
  }
  return launch_resident<wide_kernel<W, F, WholeSlots, TwoWindows>, Route::Dense>(
      W::threads, W::smem_bytes, 1, W::n_tile, W::k_tile, args, launch, stage, a_map);
}

template <int Tokens, class F, bool WholeSlots, bool RowGroups = false, bool TwoWindows = false>
cudaError_t launch_wide_kernel(Args& args, const Launch& launch, int* stage) {
  using W = WideTile<Tokens, F::bits, WholeSlots ? 3 : 2, RowGroups>;
  // Per-column locks hold one lock per column: fp32 reduce, whose parts each
  // need their own, takes locks by range (ColumnEpilogue::share_of). n: whole
  // column tiles, or a partial last one where the copier can step back.
  if ((W::parts > 1 && args.fp32_reduce && !args.lock_by_range) ||
      (args.n % W::n_tile != 0 && !(W::serves_partial_n && args.n % 64 == 0))) {
    *stage = FERRUM_STAGE_KERNEL_LAUNCH;
    return cudaErrorInvalidValue;
  }
  if constexpr (W::serves_partial_n) {
    using Partial = WideTile<Tokens, F::bits, WholeSlots ? 3 : 2, RowGroups, false, true>;
    if (args.n % W::n_tile != 0) return launch_wide_instance<Partial, F, WholeSlots, TwoWindows>(args, launch, stage);
  }
  return launch_wide_instance<W, F, WholeSlots, TwoWindows>(args, launch, stage);
}

// Routed (fused-MoE) slabs of 32, 48 or 64 rows: dequantisation mode, rows
// gathered. The slot depth must divide k; the last column tile may be
// partial (n a multiple of 64; on the PartialTile instance).
template <class W, class F>
cudaError_t launch_wide_routed_instance(Args& args, const Launch& launch, int* stage) {
  return launch_resident<wide_kernel<W, F, false, false, Route::Sorted>, Route::Sorted>(
      W::threads, W::smem_bytes, 1, W::n_tile, W::k_tile, args, launch, stage, CUtensorMap{});
}

template <int Tokens, class F>
cudaError_t launch_wide_routed_tile(Args& args, const Launch& launch, int* stage) {
  using W = WideTile<Tokens, F::bits, 2, false, true>;
  static_assert(W::serves_partial_n, "routed tiles serve any n that is a multiple of 64");
  // Every routed column leaves in parts, each under its own lock: locks by range only.
  if (!args.lock_by_range || args.k % W::k_tile != 0 || args.n % 64 != 0) {
    *stage = FERRUM_STAGE_KERNEL_LAUNCH;
    return cudaErrorInvalidValue;
  }
  if (args.n % W::n_tile != 0)
    return launch_wide_routed_instance<WideTile<Tokens, F::bits, 2, false, true, true>, F>(args, launch, stage);
  return launch_wide_routed_instance<W, F>(args, launch, stage);
}

template <AType A, WType Wt>
cudaError_t launch_wide_routed(int tokens, Args& args, const Launch& launch, int* stage) {
  using F = Format<A, Wt>;
  switch (tokens) {
    case 32: return launch_wide_routed_tile<32, F>(args, launch, stage);
    case 48: return launch_wide_routed_tile<48, F>(args, launch, stage);
    case 64: return launch_wide_routed_tile<64, F>(args, launch, stage);
    default: return cudaErrorInvalidValue;
  }
}

// 16-row slabs take whole slots with groups of 64 or more (one window per
// group) or channelwise; 8-bit weights with groups of 32 dequantise in the
// 16-row tile; 4-bit weights with groups of 32 are not built for it (the
// planner keeps them on the 8-warp kernel).
template <int Tokens, class F>
cudaError_t launch_wide_tile(Args& args, const Launch& launch, int* stage) {
  // K-sharded act-order (integer weights): dequantisation mode, slabs of 32+ rows.
  if (args.row_groups != nullptr) {
    if constexpr (Tokens > 16 && (F::const_correction || F::zero_points))
      return launch_wide_kernel<Tokens, F, false, true>(args, launch, stage);
    return cudaErrorInvalidValue;
  }
  constexpr bool kWholeSlots = Tokens <= 16 && !F::e8m0_scales;
  constexpr bool kDequant = Tokens > 16 || (F::bits == 8 && F::const_correction);
  if constexpr (kWholeSlots) {
    constexpr int kSlotShift = log2_exact(WideTile<Tokens, F::bits>::k_tile);
    if (args.group_shift < 0 || args.group_shift >= kSlotShift)
      return launch_wide_kernel<Tokens, F, true>(args, launch, stage);
    // A kernel of its own: the window test costs the one-window kernel registers (spills).
    if constexpr (kSlotShift == 7)
      if (args.group_shift == 6) return launch_wide_kernel<Tokens, F, true, false, true>(args, launch, stage);
  }
  if constexpr (kDequant) return launch_wide_kernel<Tokens, F, false>(args, launch, stage);
  return cudaErrorInvalidValue;
}

// The wide kernels of one format: slabs of 16, 32, 48, 64, 128 or 256 activation rows.
template <AType A, WType Wt>
cudaError_t launch_wide(int tokens, Args& args, const Launch& launch, int* stage) {
  using F = Format<A, Wt>;
  switch (tokens) {
    case 16: return launch_wide_tile<16, F>(args, launch, stage);
    case 32: return launch_wide_tile<32, F>(args, launch, stage);
    case 48: return launch_wide_tile<48, F>(args, launch, stage);
    case 64: return launch_wide_tile<64, F>(args, launch, stage);
    case 128: return launch_wide_tile<128, F>(args, launch, stage);
    case 256: return launch_wide_tile<256, F>(args, launch, stage);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace ferrum::dense
