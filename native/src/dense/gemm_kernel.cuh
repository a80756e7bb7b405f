// Dense Marlin GEMM kernel: C[m, n] = A[m, k] . dequant(B)[k, n] (+ bias),
// one template for every activation type and weight format (core/formats.cuh).
//
// Work split ("stripes"): the problem is cut into units of one k_tile of one
// n_tile column of one m slab, numbered column by column (k fastest). Block
// range r gets units [r*iters, (r+1)*iters), so a column may be shared by a few
// consecutive ranges. Ranges are handed out in reverse block order (range r runs
// on block grid-1-r): the range that covers the *end* of a column does that part
// first in its stripe, so the partial sums of a column become ready in order of
// increasing block index, and every block only ever waits for the block just
// before it, which the hardware dispatched first — no cycles, no deadlock.
//
// Partials of a shared column are summed in C: the first-ready contributor
// stores its fp16 partial, the others add theirs with fp16x2 atomics as soon as
// it is there (no serial chain). An int32 lock per column in the workspace
// counts contributors; the last one resets it to 0, so the workspace is zero
// again after every launch (graph capture). With three or more contributors
// the order of the atomic adds, hence the last fp16 rounding, may differ
// between runs. With fp32_reduce every contributor instead parks its fp32
// partial in c_tmp and the last to arrive sums all of them in range order and
// stores the column: no waiting at all, and the same result on every run.
#pragma once

#include <cuda_fp16.h>

#include "../core/formats.cuh"
#include "../core/ptx.cuh"
#include "../core/tile.cuh"
#include "../core/timeline_probe.cuh"
#include "../core/wgmma.cuh"
#include "column_epilogue.cuh"
#include "ferrum_marlin.h"
#include "gemm.h"
#include "gemm_tiles.h"
#include "launch_resident.cuh"
#include "stripes.cuh"

namespace ferrum::dense {

// Where a weight row's group scales (and zero points) come from.
enum class Groups {
  // Group rows copied with each stage; the image path applies them once per
  // stage (groups of at least the k tile).
  Staged,
  // The same for groups shorter than the k tile (32 or 64 values): the image
  // path applies scales after every two k steps (a separate instance: the
  // branch inside the hot loop cost 8 % at m = 16).
  StagedShort,
  // K-sharded act-order (K_FULL clear): each row's group comes from the
  // sorted g_idx, so a tile may span any number of groups; the dequantising
  // path takes each fragment row's scales from the stage's window of group
  // rows (global memory past it).
  Rows,
};

template <class T, class F, Groups G, Route R>
__global__ void __launch_bounds__(kThreads, T::min_blocks) gemm_kernel(const Args p) {
  static_assert(T::b_words == F::words, "tile built for another weight width");
  using N = typename F::N;
  constexpr bool kBf16 = F::bf16;
  // 1024-byte alignment: the activation tiles are 128-byte-swizzled atoms.
  extern __shared__ __align__(1024) int4 smem[];
  int4* const sh_b = smem;
  int4* const sh_a = sh_b + T::stages * T::b_stage;
  int4* const sh_s = sh_a + T::stages * T::a_stage;
  int4* const sh_z = sh_s + T::stages * T::s_stage;
  int4* const sh_g = sh_z + T::stages * T::z_stage;  // row groups: the stage's g_idx rows
  float* const sh_red = reinterpret_cast<float*>(sh_g + T::stages * T::g_stage);
  // fp32 reduce: set when this block is the column's last contributor. In the
  // dynamic allocation: a static __shared__ variable would push the
  // 1024-byte-aligned tiles up by a whole alignment unit.
  int& sh_last = *reinterpret_cast<int*>(sh_red + T::m_rows * T::red_stride);

  const int tid = threadIdx.x;
  FERRUM_TIMELINE(probe::Timeline timeline; timeline.stamp(probe::kEntry);)
  const int lane = tid & 31;
  const int warp = tid >> 5;
  const int warp_n = warp % T::warps_n;
  const int warp_k = warp / T::warps_n;

  // Routed launches allow n and k that the tile does not divide (multiples of
  // 64): the last column / k tile is partial, its missing rows and chunks are
  // zero-filled and never stored. Dense launches of the deep tile allow such an
  // n (see step_back).
  const int n_tiles = (p.n + T::n_tile - 1) / T::n_tile;
  const int k_tiles = (p.k + T::k_tile - 1) / T::k_tile;
  // Blocks past the work exit.
  Stripes stripes;
  if (!stripes_of<R>(p, T::m_rows, n_tiles, k_tiles, stripes)) return;
  FERRUM_TIMELINE(timeline.stamp(probe::kRouted);)
  const int slabs = stripes.slabs, iters = stripes.iters, range = stripes.range, u_begin = stripes.u_begin,
            count = stripes.count;
  [[maybe_unused]] const int used_ids = stripes.used_ids;
  // The expert whose weights slab s multiplies, and whether the slab is skipped
  // (past the routed rows, or an expert of another rank under expert parallelism).
  auto slab_expert = [&](int slab) -> int {
    if constexpr (routed_by_ids(R)) return __ldg(p.route.slab_experts + slab);
    if constexpr (R == Route::Bucketed)
      return p.route.slab_experts != nullptr ? __ldg(p.route.slab_experts + slab) : slab;
    return 0;
  };
  auto slab_dead = [&](int slab) -> bool {
    if constexpr (routed_by_ids(R)) return slab >= slabs || slab_expert(slab) < 0;
    return slab >= slabs;
  };
  // MXFP4 fixes its groups at 32 values: its scale-row arithmetic folds to
  // constants.
  const int group_shift = F::e8m0_scales ? 5 : p.group_shift;
  const bool grouped = group_shift >= 0;
  constexpr bool kRowGroups = G == Groups::Rows;
  static_assert(!kRowGroups || (R == Route::Dense && !T::wgmma), "row groups: dense 8-warp tiles only");
  static_assert(kRowGroups == (T::g_stage > 0), "row groups need a tile that stages g_idx");
  const int a_row_int4 = p.a_row_int4;
  const int4* const gA = static_cast<const int4*>(p.a);
  const int4* const gB = static_cast<const int4*>(p.b);
  const int4* const gS = static_cast<const int4*>(p.s);
  const int4* const gZ = static_cast<const int4*>(p.z);
  constexpr int kChunkInt4 = 32 * T::b_words;  // one chunk's 16-deep k step

  // ---- global -> shared ------------------------------------------------------
  // Everything a thread copies is fixed per thread up to the stage's base
  // address, so the loop only adds offsets (no divisions in the steady state).
  constexpr int kBCopies = T::b_stage / kThreads;
  static_assert(T::b_stage % kThreads == 0, "weight tile must split over the block");
  constexpr int kACopies = (T::a_stage + kThreads - 1) / kThreads;
  int b_src[kBCopies];
#pragma unroll
  for (int i = 0; i < kBCopies; ++i) {
    const int e = tid + i * kThreads;
    b_src[i] = (e / (T::n_chunks * kChunkInt4)) * p.b_row_int4 + e % (T::n_chunks * kChunkInt4);
  }
  int a_src[kACopies], a_dst[kACopies], a_row[kACopies], a_unit[kACopies];
#pragma unroll
  for (int i = 0; i < kACopies; ++i) {
    const int e = tid + i * kThreads;
    const int r = e / (T::k_rows * 2);
    const int unit = e % (T::k_rows * 2);
    a_row[i] = e < T::a_stage ? r : INT32_MAX / 2;  // threads past the tile copy nothing
    a_src[i] = r * a_row_int4 + unit;
    a_unit[i] = unit;
    // 128-byte rows of 8 16-byte units, unit u of row r stored at u ^ (r % 8),
    // so that ldmatrix reads of eight rows hit eight different bank groups.
    a_dst[i] = (unit >> 3) * (T::m_rows * 8) + r * 8 + ((unit & 7) ^ (r & 7));
  }
  // Scale rows per stage: k_tile / group (group <= k_tile) or 1.
  const int s_rows = grouped && T::k_tile > (1 << group_shift) ? T::k_tile >> group_shift : 1;
  const int s_row_int4 = p.s_row_halves * F::scale_bytes / 16;
  // 16-byte scale units per 64-column chunk and group row.
  constexpr int kSChunkInt4 = 4 * F::scale_bytes;

  // Fetch cursor (the unit the next load_stage call copies) and the global
  // addresses of this thread's copies for it. Within a column the addresses
  // only advance by a fixed step per stage; `seek` recomputes them when the
  // cursor enters a new column.
  int f_kt, f_c, f_slab;
  {
    const int col = u_begin / k_tiles;
    f_kt = u_begin - col * k_tiles;
    f_slab = col / n_tiles;
    f_c = col - f_slab * n_tiles;
  }
  const int s_copies = grouped && !kRowGroups ? s_rows * (T::n_chunks * kSChunkInt4) : 0;
  // Zero points follow the scales' group rows (one row when channelwise).
  const int z_shift = grouped ? group_shift : 30;
  const int z_copies = F::zero_points && !kRowGroups ? s_rows * (T::n_chunks * 2) : 0;
  // Zero points by the last warp, scales by the first: the stage's barrier
  // waits for every warp's copies and pointer steps.
  static_assert(kRowGroups || T::z_stage <= 32, "zero points: one warp's copies");
  const int z_tid = tid - (kThreads - 32);
  bool z_mine = false;  // (a test against the constant 0 would warn in every format without zero points)
  if constexpr (F::zero_points && !kRowGroups) z_mine = static_cast<unsigned>(z_tid) < static_cast<unsigned>(z_copies);
  const size_t b_step = static_cast<size_t>(T::k_rows) * p.b_row_int4;
  const int4* pb[kBCopies];
  const int4* pa[kACopies];
  int a_step[kACopies];
  bool a_live[kACopies];
  const int4* ps = gS;
  const int4* pz = gZ;
  [[maybe_unused]] bool f_dead = false;  // the fetch cursor's slab is skipped: copy nothing
  // Sorted routing: the expert and row ids of the fetch cursor's slab, of the
  // one before it (still being computed) and of the next one, loaded a whole
  // slab ahead so that a new slab's weight copies do not wait on them.
  [[maybe_unused]] int cur_slab = -1, cur_expert = -1, prev_slab = -1, prev_expert = -1;
  [[maybe_unused]] int next_slab = -1, next_expert = -1;
  [[maybe_unused]] int cur_ids[kACopies], next_ids[kACopies];
  auto load_ids = [&](int slab, int& expert, int (&ids)[kACopies]) {
    expert = slab < slabs ? __ldg(p.route.slab_experts + slab) : -1;
#pragma unroll
    for (int i = 0; i < kACopies; ++i)
      ids[i] = routed_row<R>(p.route, slab < slabs && a_row[i] < T::m_rows, slab, a_row[i], T::m_rows, used_ids);
  };
  auto expert_of = [&](int slab) -> int {
    if constexpr (routed_by_ids(R)) {
      if (slab == cur_slab) return cur_expert;
      if (slab == prev_slab) return prev_expert;
      if (slab == next_slab) return next_expert;
    }
    return slab_expert(slab);
  };
  // A partial last column tile of a dense launch of the deep tile (n a
  // multiple of 64 that 256 does not divide, which the planner allows that
  // tile only): this thread's copies of a missing chunk read the last chunk
  // inside n again (in bounds; those columns are never stored), one offset
  // per column, set here with the rest. (Routed launches zero-fill instead:
  // load_tail_stage.) `unit`: of chunk unit / per_chunk.
  static_assert(kThreads % (T::n_chunks * kChunkInt4) == 0, "each thread's weight copies lie in one chunk");
  constexpr bool kDeepTile = T::n_tile == 256 && T::k_tile == 128 && !T::wgmma;
  auto step_back = [&](int unit, int per_chunk) {
    if constexpr (R != Route::Dense || kRowGroups || !kDeepTile) return 0;
    // (chunks of this column tile inside n: p.n / 64 - f_c * n_chunks)
    return max(unit / per_chunk + 1 - ((p.n >> 6) - f_c * T::n_chunks), 0) * per_chunk;
  };
  auto seek = [&]() {
    long long e = 0;
    if constexpr (routed_by_ids(R)) {
      if (f_slab != cur_slab) {
        prev_slab = cur_slab;
        prev_expert = cur_expert;
        if (f_slab == next_slab) {
          cur_expert = next_expert;
#pragma unroll
          for (int i = 0; i < kACopies; ++i) cur_ids[i] = next_ids[i];
        } else {
          load_ids(f_slab, cur_expert, cur_ids);
        }
        cur_slab = f_slab;
        next_slab = f_slab + 1;
        load_ids(next_slab, next_expert, next_ids);
      }
      f_dead = f_slab >= slabs || cur_expert < 0;
      e = f_dead ? 0 : cur_expert;
    } else if constexpr (R == Route::Bucketed) {
      f_dead = slab_dead(f_slab);
      e = f_dead ? 0 : slab_expert(f_slab);
    }
    const int4* const b0 = gB + e * p.route.b_expert_int4 + static_cast<size_t>(f_kt) * b_step +
                           f_c * (T::n_chunks * kChunkInt4) - step_back(tid % (T::n_chunks * kChunkInt4), kChunkInt4);
#pragma unroll
    for (int i = 0; i < kBCopies; ++i) pb[i] = b0 + b_src[i];
    if constexpr (R == Route::Dense) {
      const int rows_left = p.m - f_slab * T::m_rows;
      const int4* const a0 =
          gA + static_cast<size_t>(f_slab) * T::m_rows * a_row_int4 + f_kt * (T::k_tile / 8);
#pragma unroll
      for (int i = 0; i < kACopies; ++i) {
        // Rows past the end of A become zero rows; their copies read nothing.
        a_live[i] = a_row[i] < rows_left;
        pa[i] = a_live[i] ? a0 + a_src[i] : gA;
        a_step[i] = a_live[i] ? T::k_tile / 8 : 0;
      }
    } else {
      [[maybe_unused]] int first_row = 0, rows_in = 0;
      if constexpr (R == Route::Bucketed) {
        if (!f_dead) {
          first_row = __ldg(p.route.row_offsets + e);
          rows_in = min(__ldg(p.route.row_counts + e), T::m_rows);
        }
      }
#pragma unroll
      for (int i = 0; i < kACopies; ++i) {
        // Padding ids and rows past an expert's count become zero rows.
        int src = -1;
        if (!f_dead && a_row[i] < T::m_rows) {
          if constexpr (routed_by_ids(R)) {
            const int t = cur_ids[i];
            if (static_cast<unsigned>(t) < static_cast<unsigned>(p.route.rows)) src = t / p.route.top_k;
          } else if (a_row[i] < rows_in) {
            src = first_row + a_row[i];
          }
        }
        a_live[i] = src >= 0;
        pa[i] = a_live[i] ? gA + static_cast<size_t>(src) * a_row_int4 + a_unit[i] + f_kt * (T::k_tile / 8) : gA;
        a_step[i] = a_live[i] ? T::k_tile / 8 : 0;
      }
    }
    if (tid < s_copies) {
      const int r = tid / (T::n_chunks * kSChunkInt4);
      const int off = tid % (T::n_chunks * kSChunkInt4);
      const int group_row = ((f_kt * T::k_tile) >> group_shift) + r;
      ps = gS + e * (p.route.s_expert_bytes / 16) + static_cast<size_t>(group_row) * s_row_int4 +
           f_c * (T::n_chunks * kSChunkInt4) + off - step_back(off, kSChunkInt4);
    }
    if (z_mine) {
      const int r = z_tid / (T::n_chunks * 2);
      const int off = z_tid % (T::n_chunks * 2);
      const int group_row = ((f_kt * T::k_tile) >> z_shift) + r;
      pz = gZ + e * p.route.z_expert_int4 + static_cast<size_t>(group_row) * p.z_row_int4 +
           f_c * (T::n_tile / 32) + off - step_back(off, 2);
    }
  };
  seek();
  // Row groups: the first group of the stage the next load_stage copies (its
  // scale window starts there), loaded one call ahead so that the copy never
  // waits on it.
  [[maybe_unused]] int f_group = 0;
  if constexpr (kRowGroups) f_group = __ldg(p.row_groups + f_kt * T::k_tile);
  auto load_row_groups = [&](int slot) {
    if (tid < T::k_tile)
      ptx::cp_async4(reinterpret_cast<int*>(sh_g + slot * T::g_stage) + tid, p.row_groups + f_kt * T::k_tile + tid);
    // Window row r is group f_group + r, clamped into the scales' rows.
    constexpr int kRowInt4 = T::n_chunks * kSChunkInt4;
    const int r = tid / kRowInt4;
    if (r < kRowGroupWindow) {
      const int group = min(max(f_group + r, 0), p.num_groups - 1);
      ptx::cp_async16(sh_s + slot * T::s_stage + tid,
                      gS + static_cast<size_t>(group) * s_row_int4 + f_c * kRowInt4 + tid % kRowInt4);
    }
    if constexpr (F::zero_points) {
      constexpr int kZRowInt4 = T::n_chunks * 2;
      const int zr = tid / kZRowInt4;
      if (zr < kRowGroupWindow) {
        const int group = min(max(f_group + zr, 0), p.num_groups - 1);
        ptx::cp_async16(sh_z + slot * T::z_stage + tid,
                        gZ + static_cast<size_t>(group) * p.z_row_int4 + f_c * (T::n_tile / 32) + tid % kZRowInt4);
      }
    }
  };
  // A stage at the end of a partial column or k run: only the weight rows,
  // chunks, activation units and group rows inside the problem are read.
  auto load_tail_stage = [&](int slot, int krows, int chunks) {
    int4* const db = sh_b + slot * T::b_stage + tid;
#pragma unroll
    for (int i = 0; i < kBCopies; ++i) {
      const int e = tid + i * kThreads;
      const bool ok = e / (T::n_chunks * kChunkInt4) < krows && (e % (T::n_chunks * kChunkInt4)) / kChunkInt4 < chunks;
      ptx::cp_async16_or_zero(db + i * kThreads, ok ? pb[i] : gB, ok);
    }
    int4* const da = sh_a + slot * T::a_stage;
    const int units_left = p.k / 8 - f_kt * (T::k_tile / 8);
#pragma unroll
    for (int i = 0; i < kACopies; ++i) {
      const bool ok = a_live[i] && a_unit[i] < units_left;
      if (a_row[i] < T::m_rows) ptx::cp_async16_or_zero(da + a_dst[i], ok ? pa[i] : gA, ok);
    }
    if (tid < s_copies) {
      const int r = tid / (T::n_chunks * kSChunkInt4);
      const int chunk = (tid % (T::n_chunks * kSChunkInt4)) / kSChunkInt4;
      const int group_row = ((f_kt * T::k_tile) >> group_shift) + r;
      const bool ok = chunk < chunks && (group_row << group_shift) < p.k;
      ptx::cp_async16_or_zero(sh_s + slot * T::s_stage + tid, ok ? ps : gS, ok);
    }
    if (z_mine) {
      const int r = z_tid / (T::n_chunks * 2);
      const int chunk = (z_tid % (T::n_chunks * 2)) / 2;
      const int group_row = ((f_kt * T::k_tile) >> z_shift) + r;
      const bool ok = chunk < chunks && (z_shift >= 30 || (group_row << z_shift) < p.k);
      ptx::cp_async16_or_zero(sh_z + slot * T::z_stage + z_tid, ok ? pz : gZ, ok);
    }
  };
  const uint64_t weights_policy = ptx::evict_first_policy();
  auto load_stage = [&](int slot) {
    const int krows = p.k / 16 - f_kt * T::k_rows;
    const int chunks = p.n / 64 - f_c * T::n_chunks;
    if (R != Route::Dense && !f_dead && (krows < T::k_rows || chunks < T::n_chunks)) {
      load_tail_stage(slot, krows, chunks);
    } else if (R == Route::Dense || !f_dead) {
      int4* const db = sh_b + slot * T::b_stage + tid;
#pragma unroll
      for (int i = 0; i < kBCopies; ++i) ptx::cp_async16_hint(db + i * kThreads, pb[i], weights_policy);
      int4* const da = sh_a + slot * T::a_stage;
#pragma unroll
      for (int i = 0; i < kACopies; ++i) {
        if (a_row[i] < T::m_rows) ptx::cp_async16_or_zero(da + a_dst[i], pa[i], a_live[i]);
      }
      if (tid < s_copies) ptx::cp_async16(sh_s + slot * T::s_stage + tid, ps);
      if (z_mine) ptx::cp_async16(sh_z + slot * T::z_stage + z_tid, pz);
      if constexpr (kRowGroups) load_row_groups(slot);
    }
    if (++f_kt == k_tiles) {
      f_kt = 0;
      if (++f_c == n_tiles) {
        f_c = 0;
        ++f_slab;
      }
      seek();
    } else {
#pragma unroll
      for (int i = 0; i < kBCopies; ++i) pb[i] += b_step;
#pragma unroll
      for (int i = 0; i < kACopies; ++i) pa[i] += a_step[i];
      if (tid < s_copies) {
        const int rows_before = ((f_kt - 1) * T::k_tile) >> group_shift;
        ps += static_cast<size_t>(((f_kt * T::k_tile) >> group_shift) - rows_before) * s_row_int4;
      }
      if (z_mine) {
        const int rows_before = ((f_kt - 1) * T::k_tile) >> z_shift;
        pz += static_cast<size_t>(((f_kt * T::k_tile) >> z_shift) - rows_before) * p.z_row_int4;
      }
    }
    if constexpr (kRowGroups) f_group = __ldg(p.row_groups + f_kt * T::k_tile);
  };

  float acc[4][T::m8][4];
  auto zero_acc = [&]() {
#pragma unroll
    for (int t = 0; t < 4; ++t)
#pragma unroll
      for (int j = 0; j < T::m8; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[t][j][e] = 0.f;
  };

  // ---- shared -> registers -> tensor cores -----------------------------------
  // Activation fragments of one 16-deep k step: bf[j] = {k..k+1, k+8..k+9} of
  // m8 tile j. Matrix (lane/8) of ldmatrix.x4 is (tile jp + lane/16, k half
  // (lane/8)%2); .x2 uses only the two k halves. Step `row` is 16-byte unit
  // u = 2 row + (lane/8)%2 of the stage's 128-byte rows, at
  // (u/8)(rows 8) + r 8 + ((u%8) ^ (r%8)) for matrix row r (128-byte swizzle).
  // A warp's steps are row0 + d/2 with 2 row0 + 1 and d sharing no bits (its
  // steps interleave with a power-of-two warp stride, or are consecutive from
  // a power-of-two-aligned row0), so that offset is the lane's offset for
  // row0 with d's low bits XOR-ed in and d/8 rows added: compile-time
  // constants after unrolling, on a base fixed per thread.
  static_assert((T::warps_k & (T::warps_k - 1)) == 0 && (T::rows_per_warp & (T::rows_per_warp - 1)) == 0,
                "powers of two: a warp's step offsets are bit-disjoint");
  auto activation_base = [&](int row0) {
    const int u0 = 2 * row0 + ((lane >> 3) & 1);
    const int r8 = lane & 7;
    const int mr = T::m8 == 1 ? r8 : 8 * (lane >> 4) + r8;
    return (u0 >> 3) * (T::m_rows * 8) + mr * 8 + ((u0 & 7) ^ r8);
  };
  auto load_activations = [&](const int4* sa, int base, int d, uint32_t (&bf)[T::m8][2]) {
    const int4* const src = sa + ((base ^ (d & 7)) + (d >> 3) * (T::m_rows * 8));
    if constexpr (T::m8 == 1) {
      uint32_t r[2];
      ptx::ldmatrix_x2(r, src);
      bf[0][0] = r[0];
      bf[0][1] = r[1];
    } else {
#pragma unroll
      for (int jp = 0; jp < T::m8; jp += 2) {
        uint32_t r[4];
        ptx::ldmatrix_x4(r, src + 64 * jp);  // tile jp: 8 jp rows of 8 units further
        bf[jp][0] = r[0];
        bf[jp][1] = r[1];
        bf[jp + 1][0] = r[2];
        bf[jp + 1][1] = r[3];
      }
    }
  };
  // The lane's offsets in a stage's weights and group rows (s_lane: int4 scale
  // units, 8-byte units for E8M0 scales), and its activation base on the image
  // path: fixed for the kernel and pinned, because under the 128-register cap
  // ptxas otherwise rebuilds them from the thread index at every stage (~15
  // integer instructions per warp and stage; ptx::opaque did not stop it).
  int b_lane = warp_n * kChunkInt4 + lane * T::b_words;
  int s_lane = F::e8m0_scales ? warp_n * kSChunkInt4 * 2 + (lane >> 2) : warp_n * 8 + (lane >> 2);
  ptx::pinned(b_lane);
  ptx::pinned(s_lane);
  // The lane's weight words of one 16-deep k step of its chunk: tile t owns
  // words [t * F::words, (t + 1) * F::words).
  auto weight_words = [&](const int4* sb, int row, uint32_t (&w)[4 * F::words]) {
    unit_words<F::words>(sb + row * (T::n_chunks * kChunkInt4) + b_lane, w);
  };
  // {scale(c), scale(c + 8)} of tile t, and the zero-point word, of group row
  // s_row of the stage.
  auto scale_pairs = [&](const int4* ss, int s_row, uint32_t (&sp)[4]) {
    if constexpr (F::e8m0_scales) {
      const uint2 sc = reinterpret_cast<const uint2*>(ss + s_row * (T::n_chunks * kSChunkInt4))[s_lane];
      F::e8m0_pairs(sc.x, sc.y, sp);
    } else {
      const int4 sc = ss[s_row * (T::n_chunks * 8) + s_lane];
      sp[0] = sc.x;
      sp[1] = sc.y;
      sp[2] = sc.z;
      sp[3] = sc.w;
    }
  };
  auto zero_word = [&](const int4* sz, int s_row) -> uint32_t {
    if constexpr (F::zero_points)
      return reinterpret_cast<const uint32_t*>(sz + s_row * (T::n_chunks * 2) + warp_n * 2)[lane >> 2];
    return 0u;
  };
  // Exact values times their group scales, for the tensor-core bound paths.
  auto scaled_fragments = [&](const int4* sb, const int4* ss, const int4* sz, int row, Frag16x16 (&f)[4]) {
    uint32_t w[4 * F::words];
    weight_words(sb, row, w);
    const int s_row = (16 * row) >> z_shift;  // 0 when the group spans the tile
    const uint32_t zw = zero_word(sz, s_row);
#pragma unroll
    for (int t = 0; t < 4; ++t) f[t] = F::dequant(w + t * F::words, F::zero_points ? F::zero_pair(zw, t) : 0u);
    if (grouped) {
      uint32_t sp[4];
      scale_pairs(ss, s_row, sp);
#pragma unroll
      for (int t = 0; t < 4; ++t) F::scale(f[t], sp[t]);
    }
  };

  // K-sharded act-order: the scale pairs {scale(c), scale(c + 8)} of tiles
  // 0..3 and the zero-point word of group g for this lane, from the stage's
  // window, which holds groups g0 .. g0 + kRowGroupWindow - 1 (g0 the stage's
  // first group), else (a stage spanning more groups) from global memory
  // through the same generic load, so the warp does not diverge. Group ids
  // are clamped into the scales' rows, so a bad g_idx cannot read outside them.
  auto group_pairs = [&](const int4* ss, const int4* sz, int g0, int g, int col, uint32_t (&sp)[4],
                         [[maybe_unused]] uint32_t& zw) {
    const unsigned d = static_cast<unsigned>(g - g0);
    const bool staged = d < static_cast<unsigned>(kRowGroupWindow);
    const size_t group = min(static_cast<unsigned>(max(g, 0)), static_cast<unsigned>(p.num_groups - 1));
    const int4* const s_src =
        staged ? ss + d * (T::n_chunks * kSChunkInt4) : gS + group * s_row_int4 + col * (T::n_chunks * kSChunkInt4);
    const int4 sc = s_src[warp_n * kSChunkInt4 + (lane >> 2)];
    sp[0] = sc.x;
    sp[1] = sc.y;
    sp[2] = sc.z;
    sp[3] = sc.w;
    if constexpr (F::zero_points) {
      const int4* const z_src =
          staged ? sz + d * (T::n_chunks * 2) : gZ + group * p.z_row_int4 + col * (T::n_tile / 32);
      zw = reinterpret_cast<const uint32_t*>(z_src + warp_n * 2)[lane >> 2];
    }
  };
  // K-sharded act-order: a 16-deep step inside one group (the sorted g_idx
  // has equal ends; warp-uniform) scales like any group; otherwise rows k,
  // k+1, k+8, k+9 of the lane's fragments each take their own group's pairs.
  auto row_group_fragments = [&](const int4* sb, const int4* ss, const int4* sz, const int* sg, int col, int row,
                                 Frag16x16 (&f)[4]) {
    uint32_t w[4 * F::words];
    weight_words(sb, row, w);
    const int g0 = sg[0];
    const int first = sg[16 * row];
    if (first == sg[16 * row + 15]) {
      uint32_t sp[4], zw = 0;
      group_pairs(ss, sz, g0, first, col, sp, zw);
#pragma unroll
      for (int t = 0; t < 4; ++t) {
        f[t] = F::dequant(w + t * F::words, F::zero_points ? F::zero_pair(zw, t) : 0u);
        F::scale(f[t], sp[t]);
      }
      return;
    }
    const int* const rows = sg + 16 * row + 2 * (lane & 3);
    constexpr int kRowOffsets[4] = {0, 1, 8, 9};
    uint32_t sw[4][4];  // [row j][tile t]: the pairs of row j's group
    uint32_t zw[4] = {};
#pragma unroll
    for (int j = 0; j < 4; ++j) group_pairs(ss, sz, g0, rows[kRowOffsets[j]], col, sw[j], zw[j]);
    dequant_row_groups<F, 4>(w, sw, zw, 0, f);
  };

  // Short slabs multiply raw code images (see core/formats.cuh) and apply
  // scales to fp32 partials, once per window (a stage's steps of one group,
  // or two steps for groups shorter than the tile); taller slabs are tensor-core
  // bound and multiply exact, scaled fragments once, as do row groups.
  constexpr bool kImages = T::m8 <= 2 && !T::wgmma && !kRowGroups;
  constexpr float kImageAccUnit = F::bare_images ? F::kBareAccUnit : F::kImageAccUnit;
  auto image_correction = [] { if constexpr (F::bare_images) return F::bare_correction(); else return F::correction(); };
  int image_a_base = 0;  // see b_lane
  if constexpr (kImages) {
    image_a_base = activation_base(G == Groups::StagedShort ? warp_k * T::rows_per_warp : warp_k);
    ptx::pinned(image_a_base);
  }
  // col: the column tile of the stage (row groups only).
  auto compute_stage = [&](int slot, [[maybe_unused]] int col) {
    const int4* const sb = sh_b + slot * T::b_stage;
    const int4* const sa = sh_a + slot * T::a_stage;
    const int4* const ss = sh_s + slot * T::s_stage;
    const int4* const sz = sh_z + slot * T::z_stage;
    if constexpr (T::wgmma) {
      // Each warpgroup (one warp_k) multiplies its k steps for all four
      // chunks: warp w supplies tile t of chunk w as rows 16w.. of wgmma t.
      Frag16x16 f[T::rows_per_warp][4];
#pragma unroll
      for (int rr = 0; rr < T::rows_per_warp; ++rr) scaled_fragments(sb, ss, sz, warp_k + rr * T::warps_k, f[rr]);
      wgmma::fence();
#pragma unroll
      for (int rr = 0; rr < T::rows_per_warp; ++rr) {
        const int row = warp_k + rr * T::warps_k;  // 16-deep step: 32 bytes into the 128-byte rows
        const uint64_t desc = wgmma::sw128_kmajor_desc(reinterpret_cast<const char*>(sa) + row * 32);
#pragma unroll
        for (int t = 0; t < 4; ++t) wgmma::mma_m64k16<64, kBf16>(acc[t], f[rr][t].r, desc);
      }
      wgmma::commit();
      wgmma::wait<0>();
      wgmma::fence_operands(acc);
    } else if constexpr (kImages) {
      // part: image products of the current group window; corr: products of
      // the correction fragment, the same for every tile, so computed once.
      float part[4][T::m8][4];
      [[maybe_unused]] float corr[T::m8][4];
      constexpr bool kCorrection = F::const_correction || F::zero_points;
      {
        // Groups shorter than the tile (32 or 64 values): each warp takes
        // consecutive k steps and folds its partials every two steps (one
        // group of 32, half a group of 64), so the windows are known at
        // compile time; a runtime group length put a second copy of every
        // MMA and a branch into each step.
        constexpr bool kPerRow = G == Groups::StagedShort;
        constexpr int group_mask = kPerRow ? 1 : 0;  // k steps per window - 1
        const int row0 = kPerRow ? warp_k * T::rows_per_warp : warp_k;
        const int row_stride = kPerRow ? 1 : T::warps_k;
        const int a_base = image_a_base;
        auto activations = [&](int row, uint32_t (&bf)[T::m8][2]) {
          load_activations(sa, a_base, 2 * (row - row0), bf);
#pragma unroll
          for (int j = 0; j < T::m8; ++j) {
            if constexpr (F::act_hi_div16) bf[j][1] = N::mul(bf[j][1], 0x2c002c00u);  // 1/16
            if constexpr (F::kImageActScale != 0) {
              bf[j][0] = N::mul(bf[j][0], F::kImageActScale);
              bf[j][1] = N::mul(bf[j][1], F::kImageActScale);
            }
            if constexpr (F::bare_images) {
              bf[j][0] = N::mul(bf[j][0], F::kBareActScaleLo);
              bf[j][1] = N::mul(bf[j][1], F::kBareActScaleHi);
            }
          }
        };
        // One window per stage and one correction for every column (no zero
        // points): the correction's products over the window come first and
        // start every tile's partials, so the fold adds nothing.
        constexpr bool kCorrectionFirst = !kPerRow && F::const_correction;
        [[maybe_unused]] uint32_t bf_all[kCorrectionFirst ? T::rows_per_warp : 1][T::m8][2];
        if constexpr (kCorrectionFirst) {
          const Frag16x16 cc = image_correction();
#pragma unroll
          for (int rr = 0; rr < T::rows_per_warp; ++rr) {
            activations(row0 + rr * row_stride, bf_all[rr]);
#pragma unroll
            for (int j = 0; j < T::m8; ++j) {
              if (rr == 0)
                ptx::mma_16816_zero<kBf16>(corr[j], cc.r, bf_all[rr][j][0], bf_all[rr][j][1]);
              else
                ptx::mma_16816<kBf16>(corr[j], cc.r, bf_all[rr][j][0], bf_all[rr][j][1]);
            }
          }
        }
#pragma unroll
        for (int rr = 0; rr < T::rows_per_warp; ++rr) {
          const int row = row0 + rr * row_stride;
          const bool open = rr == 0 || (kPerRow && (row & group_mask) == 0);
          const bool close = rr == T::rows_per_warp - 1 || (kPerRow && (row & group_mask) == group_mask);
          const int s_row = (16 * row) >> z_shift;
          uint32_t w[4 * F::words];
          weight_words(sb, row, w);
          Frag16x16 f[4], fx[4];
#pragma unroll
          for (int t = 0; t < 4; ++t) {
            if constexpr (F::bare_images)
              F::bare(w + t * F::words, f[t]);
            else
              F::images(w + t * F::words, f[t], fx[t]);
          }
          uint32_t bf[T::m8][2];
          if constexpr (kCorrectionFirst) {
#pragma unroll
            for (int j = 0; j < T::m8; ++j) {
              bf[j][0] = bf_all[rr][j][0];
              bf[j][1] = bf_all[rr][j][1];
            }
          } else {
            activations(row, bf);
          }
#pragma unroll
          for (int j = 0; j < T::m8; ++j) {
            if constexpr (kCorrection && !kCorrectionFirst) {
              const Frag16x16 cc = image_correction();
              if (open)
                ptx::mma_16816_zero<kBf16>(corr[j], cc.r, bf[j][0], bf[j][1]);
              else
                ptx::mma_16816<kBf16>(corr[j], cc.r, bf[j][0], bf[j][1]);
            }
#pragma unroll
            for (int t = 0; t < 4; ++t) {
              if (open && kCorrectionFirst)
                ptx::mma_16816_from<kBf16>(part[t][j], f[t].r, bf[j][0], bf[j][1], corr[j]);
              else if (open)
                ptx::mma_16816_zero<kBf16>(part[t][j], f[t].r, bf[j][0], bf[j][1]);
              else
                ptx::mma_16816<kBf16>(part[t][j], f[t].r, bf[j][0], bf[j][1]);
              if constexpr (F::two_images) ptx::mma_16816<kBf16>(part[t][j], fx[t].r, bf[j][0], bf[j][1]);
            }
          }
          if (close) {
            // Channelwise scales wait for the epilogue.
            uint32_t sp[4] = {N::kOne, N::kOne, N::kOne, N::kOne};
            if (grouped) scale_pairs(ss, s_row, sp);
            fold_images<F, T::m8, kCorrectionFirst, F::bare_images>(acc, part, corr, sp, zero_word(sz, s_row));
          }
        }
      }
    } else {
      const int a_base = activation_base(warp_k);
#pragma unroll
      for (int rr = 0; rr < T::rows_per_warp; ++rr) {
        const int row = warp_k + rr * T::warps_k;
        Frag16x16 f[4];
        if constexpr (kRowGroups)
          row_group_fragments(sb, ss, sz, reinterpret_cast<const int*>(sh_g + slot * T::g_stage), col, row, f);
        else
          scaled_fragments(sb, ss, sz, row, f);
        uint32_t bf[T::m8][2];
        load_activations(sa, a_base, 2 * rr * T::warps_k, bf);
#pragma unroll
        for (int t = 0; t < 4; ++t)
#pragma unroll
          for (int j = 0; j < T::m8; ++j) ptx::mma_16816<kBf16>(acc[t][j], f[t].r, bf[j][0], bf[j][1]);
      }
    }
  };

  // ---- end of a column: block reduction, then the global one ---------------
  using Epilogue = ColumnEpilogue<T::m_rows, T::n_tile, kThreads, F, R>;
  static_assert(Epilogue::kRedStride == T::red_stride, "one reduction tile layout");
  auto finish_column = [&](int slab, int c, bool dead) {
    const int col = slab * n_tiles + c;
    const long long e = dead ? 0 : expert_of(slab);  // a slab past the routed ones has no expert to read

    // Accumulator (t, j, e) of lane (g, q) is C^T[n = 16t + g + 8(e/2)][m = 8j + 2q + e%2].
#pragma unroll 1
    for (int kw = 0; kw < T::warps_k; ++kw) {
      if (warp_k == kw) {
#pragma unroll
        for (int t = 0; t < 4; ++t)
#pragma unroll
          for (int j = 0; j < T::m8; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              const int n_local = warp_n * 64 + 16 * t + (lane >> 2) + 8 * (e >> 1);
              const int m_local = 8 * j + 2 * (lane & 3) + (e & 1);
              float* dst = sh_red + m_local * T::red_stride + n_local;
              const float v = kImages ? acc[t][j][e] * kImageAccUnit : acc[t][j][e];
              *dst = kw == 0 ? v : *dst + v;
            }
      }
      __syncthreads();
    }
    FERRUM_TIMELINE(timeline.stamp(probe::kReduced);)
    // A skipped slab computed nothing (its accumulators are still zero): it
    // stores nothing and touches no lock. Its accumulators still pass through
    // sh_red above: a path that skipped them made the compiler copy all of
    // them at the end of every stage.
    if (!dead)
      Epilogue::reduce_and_store(p, sh_red, sh_last, tid, [] { __syncthreads(); }, used_ids, slab, e, c, col, range,
                                 iters, k_tiles);
    zero_acc();
  };

  // ---- the pipeline ------------------------------------------------------------
  if (p.a_after_previous_kernel) {
    // The weights do not depend on the previous kernel: fetch the first stages
    // of this column into L2 while it finishes, then wait for its A.
    const int ahead = f_dead ? 0 : min(min(T::stages - 1, count), k_tiles - f_kt);
    for (int s = 0; s < ahead; ++s) {
#pragma unroll
      for (int i = 0; i < kBCopies; ++i) ptx::prefetch_l2(pb[i] + s * b_step);
    }
    // Settled routing skipped enter_chain: the next kernel may start now.
    if constexpr (routed_by_ids(R)) settled_wait();
    else ptx::griddep_wait();
  }
  FERRUM_TIMELINE(timeline.stamp(probe::kSought);)
  // Rolled: each warp runs these copies once, from a cold instruction cache
  // (unrolled, they were a quarter of the kernel's code). Not in 64-row slabs:
  // there ptxas 13.0 folds the rolled loop's uniform stage offset into INT4
  // weight copies that carry a cache policy, and the two uniform operands share
  // one field (an illegal instruction on the H200; scripts/check_sass.py).
#pragma unroll(T::m8 == 8 ? T::stages - 1 : 1)
  for (int i = 0; i < T::stages - 1; ++i) {
    if (i < count) load_stage(i);
    ptx::cp_async_commit();
  }
  FERRUM_TIMELINE(timeline.stamp(probe::kIssued);)
  zero_acc();
  // The unit being computed: its slab, column tile and k tile, counted
  // along (no divisions per column).
  int c_slab, c_c, c_kt;
  {
    const int col = u_begin / k_tiles;
    c_kt = u_begin - col * k_tiles;
    c_slab = col / n_tiles;
    c_c = col - c_slab * n_tiles;
  }
  bool c_dead = false;           // its slab is skipped (routed launches)
  // This warp's chunk lies past N in the unit's column tile (routed launches'
  // partial last tile: zero-filled weights whose columns are never stored), so
  // the warp leaves its accumulators at zero and the SM's issue slots to the
  // others. wgmma tiles multiply per warpgroup and divide N anyway.
  bool c_idle = false;
  int slot = 0;
  int fetch_slot = T::stages - 1;
#pragma unroll 1
  for (int i = 0; i < count; ++i) {
    FERRUM_TIMELINE(timeline.wait_begins();)
    ptx::cp_async_wait<T::stages - 2>();
    if constexpr (T::wgmma) wgmma::fence_async_shared();
    __syncthreads();
    FERRUM_TIMELINE(timeline.wait_ends(i == 0);)
    // The slot refilled here was consumed in iteration i-1, which every warp
    // finished before the barrier above.
    if (i + T::stages - 1 < count) load_stage(fetch_slot);
    ptx::cp_async_commit();
    fetch_slot = fetch_slot == T::stages - 1 ? 0 : fetch_slot + 1;
    if constexpr (R != Route::Dense) {
      if (c_kt == 0 || i == 0) {
        c_dead = routed_by_ids(R) ? c_slab >= slabs || expert_of(c_slab) < 0 : slab_dead(c_slab);
        if constexpr (!T::wgmma) c_idle = c_c * T::n_chunks + warp_n >= p.n / 64;
      }
    }
    if (!c_dead && !c_idle) compute_stage(slot, c_c);
    slot = slot == T::stages - 1 ? 0 : slot + 1;
    FERRUM_TIMELINE(if (i == count - 1) timeline.stamp(probe::kComputed);)
    if (c_kt == k_tiles - 1 || i == count - 1) finish_column(c_slab, c_c, c_dead);
    if (c_kt == k_tiles - 1) {
      c_kt = 0;
      if (++c_c == n_tiles) {
        c_c = 0;
        ++c_slab;
      }
    } else {
      ++c_kt;
    }
  }
  ptx::cp_async_wait<0>();
  // A settled direct launch clears last, long after its wait: the main loop's
  // registers are free by then (in the prologue the clear cost them). Sorted
  // launches cannot clear when settled: even here it costs their deep tiles
  // registers (H200: GPT-OSS-like gate/up 1-2 % slower at M = 4..16).
  if constexpr (R == Route::Direct) {
    if (p.routing_settled) clear_share(p);
  }
  FERRUM_TIMELINE(timeline.stamp(probe::kEnd); timeline.report(count, T::n_tile, T::k_tile, p.n, p.k);)
}

template <class T, class F, Groups G, Route R>
cudaError_t launch_kernel(Args& args, const Launch& launch, int* stage) {
  static_assert(T::min_blocks <= kMaxBlocksPerSm, "lock and c_tmp budgets assume two blocks per SM");
  return launch_resident<gemm_kernel<T, F, G, R>, R>(kThreads, T::smem_bytes, T::min_blocks, T::n_tile,
                                                                T::k_tile, args, launch, stage);
}

template <class T, class F, Route R = Route::Dense>
cudaError_t launch_tile(Args& args, const Launch& launch, int* stage) {
  constexpr bool kImages = T::m8 <= 2 && !T::wgmma;
  if constexpr (kImages) {
    if (args.group_shift >= 0 && (1 << args.group_shift) < T::k_tile)
      return launch_kernel<T, F, Groups::StagedShort, R>(args, launch, stage);
    // MXFP4's groups of 32 are always shorter than a tile.
    if constexpr (F::e8m0_scales) return cudaErrorInvalidValue;
  }
  return launch_kernel<T, F, Groups::Staged, R>(args, launch, stage);
}

// K-sharded act-order layers: integer weights (act-order is not defined for
// FP8), slabs of 8, 16 or 64 rows (32-row slabs would spill under the two
// blocks per SM; the host maps 17..32 rows to 64).
template <class T, class F>
cudaError_t launch_row_groups(Args& args, const Launch& launch, int* stage) {
  if constexpr (T::m8 != 4 && (F::const_correction || F::zero_points))
    return launch_kernel<T, F, Groups::Rows, Route::Dense>(args, launch, stage);
  return cudaErrorInvalidValue;
}

// The launcher of every tile built for one format and slabs of 8*M8 rows;
// each generated instantiation file defines one.
template <AType A, WType W, int M8>
cudaError_t launch_slab(NConfig nc, Args& args, const Launch& launch, int* stage) {
  using F = Format<A, W>;
  constexpr int kBits = F::bits;
  switch (nc) {
    case NConfig::N128_K128:
      return launch_tile<Tile<M8, NConfig::N128_K128, kBits>, F>(args, launch, stage);
    case NConfig::N128_K128_ROW_GROUPS:
      return launch_row_groups<Tile<M8, NConfig::N128_K128_ROW_GROUPS, kBits>, F>(args, launch, stage);
    case NConfig::N256_K64:
      return launch_tile<Tile<M8, NConfig::N256_K64, kBits>, F>(args, launch, stage);
    case NConfig::N64_K128:
      return launch_tile<Tile<M8, NConfig::N64_K128, kBits>, F>(args, launch, stage);
    case NConfig::N256_K128:
      if constexpr (M8 <= kDeepTileMaxM8)
        return launch_tile<Tile<M8, NConfig::N256_K128, kBits>, F>(args, launch, stage);
      break;  // not built for taller slabs; the host never selects it
    case NConfig::N256_K64_WGMMA:
      if constexpr (M8 == 8) return launch_tile<Tile<M8, NConfig::N256_K64_WGMMA, kBits>, F>(args, launch, stage);
      break;  // warpgroup tiles serve 64-row slabs only
  }
  return cudaErrorInvalidValue;
}

// The routed (MoE) launcher of one format and slab height: the tiles whose
// widths and depths serve every (n, k) with n, k multiples of 64 that a MoE
// layer has (the 128x64 tile for K = 2880, the 64x128 one for N = 2880).
template <AType A, WType W, int M8, Route R>
cudaError_t launch_routed(NConfig nc, Args& args, const Launch& launch, int* stage) {
  using F = Format<A, W>;
  constexpr int kBits = F::bits;
  switch (nc) {
    case NConfig::N128_K128:
      return launch_tile<Tile<M8, NConfig::N128_K128, kBits>, F, R>(args, launch, stage);
    case NConfig::N256_K64:
      return launch_tile<Tile<M8, NConfig::N256_K64, kBits>, F, R>(args, launch, stage);
    case NConfig::N64_K128:
      return launch_tile<Tile<M8, NConfig::N64_K128, kBits>, F, R>(args, launch, stage);
    case NConfig::N128_K64:
      return launch_tile<Tile<M8, NConfig::N128_K64, kBits>, F, R>(args, launch, stage);
    case NConfig::N256_K128:
      if constexpr (M8 <= kDeepTileMaxM8)
        return launch_tile<Tile<M8, NConfig::N256_K128, kBits>, F, R>(args, launch, stage);
      break;
    default:
      break;  // not built for routed launches; the host never selects them
  }
  return cudaErrorInvalidValue;
}

}  // namespace ferrum::dense
