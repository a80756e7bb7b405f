// The end of a column tile, shared by the Marlin kernels of this library: the
// block's fp32 partial (in shared memory, row-major [MRows][NTile + 4]) is
// combined with the other blocks' partials of the same column and stored to C
// with channelwise scales, bias and top-k weights (see gemm_kernel.cuh for the
// two reduction protocols). Threads: how many threads of the block take part;
// sync(): their barrier (the whole block, or a named barrier when only some
// warps run the epilogue). Parts: a column tile may be reduced and stored in
// Parts consecutive NTile-wide parts (one after the other through the same
// shared buffer), each with its own c_tmp slot and, with locks by range, its
// own lock. The wide kernel's
// columns that need no fp32 reduction leave instead as one 16-bit tile of final
// values (store_stashed: the whole tile, or a chunk at a time, under part 0's lock).
#pragma once

#include "../core/formats.cuh"
#include "../core/ptx.cuh"
#include "gemm.h"
#include "stripes.cuh"

namespace ferrum::dense {

template <int MRows, int NTile, int Threads, class F, Route R, int Parts = 1>
struct ColumnEpilogue {
  using N = typename F::N;
  static constexpr int kRedStride = NTile + 4;  // the pad keeps fragment stores conflict-free

  // Channelwise scales (and the MXFP4 bias) are permuted per 32 columns so
  // that column 8a + e of a chunk sits at 8 (e / 2) + 2a + e % 2.
  __device__ static int channel_index(int n) {
    return (n & ~31) + 2 * ((n >> 3) & 3) + 8 * ((n & 7) >> 1) + (n & 1);
  }
  // The 16-bit value of column n of a per-column vector, as fp32.
  __device__ static float channel_value(const void* v, int n, bool permuted) {
    const int i = permuted ? channel_index(n) : n;
    const float2 pair = N::to_float2(__ldg(static_cast<const uint32_t*>(v) + i / 2));
    return (i & 1) ? pair.y : pair.x;
  }

  // Stores (or atomically adds) the block's rows of column tile c of `slab`
  // from sh_red, with channelwise scales, and the bias where add_bias.
  // Sorted launches with add_rows_div add output row t into row t / div.
  __device__ static void store_rows(const Args& p, const float* sh_red, int tid, int used_ids, int slab,
                                    long long e, int c, bool atomic, bool add_bias) {
    const bool grouped = p.group_shift >= 0;
    constexpr int vec_per_row = NTile / 8;
    const uint32_t* const s_pairs =
        reinterpret_cast<const uint32_t*>(static_cast<const char*>(p.s) + e * p.route.s_expert_bytes);
    const char* const bias = p.bias == nullptr ? nullptr
                                               : static_cast<const char*>(p.bias) + e * p.route.bias_expert_bytes;
    [[maybe_unused]] int first_row = 0, rows_in = 0;
    if constexpr (R == Route::Bucketed) {
      first_row = __ldg(p.route.row_offsets + e);
      rows_in = min(__ldg(p.route.row_counts + e), MRows);
    }
    for (int v = tid; v < MRows * vec_per_row; v += Threads) {
      const int mr = v / vec_per_row;
      const int nv = v - mr * vec_per_row;
      int grow;
      float row_weight = 1.f;
      if constexpr (R == Route::Dense) {
        grow = slab * MRows + mr;
        if (grow >= p.m) continue;
      } else if constexpr (routed_by_ids(R)) {
        grow = routed_row<R>(p.route, true, slab, mr, MRows, used_ids);
        if (static_cast<unsigned>(grow) >= static_cast<unsigned>(p.route.rows)) continue;
        if (p.route.row_weights != nullptr) row_weight = __ldg(p.route.row_weights + grow);
      } else {
        if (mr >= rows_in) continue;
        grow = first_row + mr;
      }
      const float4* src = reinterpret_cast<const float4*>(sh_red + mr * kRedStride + nv * 8);
      const float4 lo = src[0];
      const float4 hi = src[1];
      float vals[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
      const int ncol = c * NTile + nv * 8;
      if (ncol >= p.n) continue;  // a partial last column tile
      if (!grouped) {
        const uint32_t* s2 = s_pairs + channel_index(ncol) / 2;  // columns ncol + 2 e2 + {0, 1}: pair 4 e2
#pragma unroll
        for (int e2 = 0; e2 < 4; ++e2) {
          const float2 s = N::to_float2(s2[4 * e2]);
          vals[2 * e2] *= s.x;
          vals[2 * e2 + 1] *= s.y;
        }
      }
      if (add_bias && bias != nullptr) {
        uint32_t bw[4];
        if (p.route.bias_p32) {
          const uint32_t* b2 = reinterpret_cast<const uint32_t*>(bias) + channel_index(ncol) / 2;
#pragma unroll
          for (int e2 = 0; e2 < 4; ++e2) bw[e2] = b2[4 * e2];
        } else {
          const int4 bv = *reinterpret_cast<const int4*>(bias + 2 * static_cast<size_t>(ncol));
          bw[0] = bv.x;
          bw[1] = bv.y;
          bw[2] = bv.z;
          bw[3] = bv.w;
        }
#pragma unroll
        for (int e2 = 0; e2 < 4; ++e2) {
          const float2 b = N::to_float2(bw[e2]);
          vals[2 * e2] += b.x;
          vals[2 * e2 + 1] += b.y;
        }
      }
      if constexpr (routed_by_ids(R)) {
#pragma unroll
        for (int e2 = 0; e2 < 8; ++e2) vals[e2] *= row_weight;
      }
      uint32_t packed[4];
#pragma unroll
      for (int e2 = 0; e2 < 4; ++e2) packed[e2] = N::from_floats(vals[2 * e2], vals[2 * e2 + 1]);
      if constexpr (routed_by_ids(R)) {
        if (p.add_rows_div > 1) grow /= p.add_rows_div;
      }
      char* const dst = static_cast<char*>(p.c) + 2 * (static_cast<size_t>(grow) * p.n + ncol);
      const int4 x = make_int4(packed[0], packed[1], packed[2], packed[3]);
      if (!atomic)
        __stcg(reinterpret_cast<int4*>(dst), x);
      else
        atomic_add8<N>(dst, x);
    }
  }

  // The blocks (stripes r_lo..r_hi) that share column `col`, and its lock.
  struct Share {
    int r_lo;
    int r_hi;
    int contributors;
    int order;  // 0: this block's part is ready first (it stores; the others add)
    int* lock;
    __device__ bool shared() const { return contributors > 1; }
    __device__ bool adds() const { return contributors > 1 && order > 0; }
  };
  __device__ static Share share_of(const Args& p, long long e, int c, int col, int range, int iters, int k_tiles,
                                   int part) {
    Share sh;
    const int first_unit = col * k_tiles;
    sh.r_lo = first_unit / iters;
    sh.r_hi = (first_unit + k_tiles - 1) / iters;
    sh.contributors = sh.r_hi - sh.r_lo + 1;
    sh.order = sh.r_hi - range;
    // A range is the lowest contributor of at most one shared column (its
    // last one), so r_lo names the column's lock uniquely within the launch.
    // Per-column locks (marlin_cuda: no fp32 reduce, so a column of parts
    // leaves as one 16-bit tile under part 0's lock) are one per column: the
    // caller's workspace holds one lock per column tile of the launch.
    sh.lock = R == Route::Bucketed ? p.locks + e * p.route.locks_per_expert + c
              : p.lock_by_range   ? p.locks + Parts * sh.r_lo + part
                                  : p.locks + col;
    return sh;
  }

  // The other contributors add to the first partial only once it is stored.
  template <class Sync>
  __device__ static void await_first(const Share& sh, int tid, Sync sync) {
    if (tid == 0) {
      while (ptx::ld_acquire_gpu(sh.lock) < 1) __nanosleep(32);
    }
    sync();
  }
  // After this block's store or adds: the lock counts it; the last resets it.
  template <class Sync>
  __device__ static void count_done(const Share& sh, int tid, Sync sync) {
    // The stored partial must be in place before the lock lets the others
    // add to it: thread 0's release, after the barrier, publishes every
    // thread's stores, and only thread 0 waits for them to land (a fence in
    // every thread stalled all the block's warps). The adds need no release
    // (nothing in the launch reads them, and they commute).
    // No thread waits for an old value where none is needed: the first
    // contributor is never the last to count (the others count only once
    // they have seen its count), and the only other contributor of a column
    // of two resets the lock it has seen counted. A block's last column is
    // usually one it adds to, so a returning add there held the block, and
    // the launch, for one more round trip.
    sync();
    if (tid == 0) {
      if (!sh.adds())
        ptx::red_add_release_gpu(sh.lock, 1);
      else if (sh.contributors == 2)
        ptx::st_relaxed_gpu(sh.lock, 0);
      else if (atomicAdd(sh.lock, 1) == sh.contributors - 1)
        atomicExch(sh.lock, 0);
    }
  }

  // The wide kernel without fp32 reduce (dense slabs): a column tile's final
  // 16-bit values -- channelwise scales applied, and the bias where this
  // block stores -- sit in `stash`, row-major with StashStride halves per row,
  // StashCols columns from the tile's column `first` (the whole tile, or
  // one of several passes through the buffer), and are stored, or added once
  // the column's first partial is in place, in 16-byte vectors. One lock per
  // column tile (part 0's; the others stay zero), awaited in the first pass
  // and counted after the last.
  template <int StashStride, int StashCols, class Sync>
  __device__ static void store_stashed(const Args& p, const int4* stash, int tid, Sync sync, int slab, int c, int col,
                                       int range, int iters, int k_tiles, int first, bool first_pass, bool last_pass) {
    static_assert(R == Route::Dense && StashStride % 8 == 0 && StashCols % 8 == 0, "dense slabs, 16-byte rows");
    const Share sh = share_of(p, 0, c, col, range, iters, k_tiles, 0);
    const bool atomic = sh.adds();
    if (atomic && first_pass) await_first(sh, tid, sync);
    constexpr int kVecPerRow = StashCols / 8;
    const int rows = min(MRows, p.m - slab * MRows);
    const int col0 = c * (Parts * NTile) + first;
    const int vecs_in_n = (p.n - col0) / 8;  // a partial last column tile stores only its columns inside n
    char* const c0 = static_cast<char*>(p.c) + 2 * (static_cast<size_t>(slab) * MRows * p.n + col0);
    for (int v = tid; v < rows * kVecPerRow; v += Threads) {
      const int mr = v / kVecPerRow;
      const int nv = v - mr * kVecPerRow;
      if (nv >= vecs_in_n) continue;
      const int4 x = stash[mr * (StashStride / 8) + nv];
      char* const dst = c0 + 2 * (static_cast<size_t>(mr) * p.n + nv * 8);
      if (!atomic)
        __stcg(reinterpret_cast<int4*>(dst), x);
      else
        atomic_add8<N>(dst, x);
    }
    if (last_pass && sh.shared())
      count_done(sh, tid, sync);
    else
      sync();  // the stash is free again
  }

  // Everything after the block's partial of part `part` of column `col`
  // (slab, tile c, expert e) is in sh_red and the participating threads have
  // synchronised. range: this block's stripe; iters: units per stripe.
  template <class Sync>
  __device__ static void reduce_and_store(const Args& p, float* sh_red, int& sh_last, int tid, Sync sync,
                                          int used_ids, int slab, long long e, int c, int col, int range,
                                          int iters, int k_tiles, int part = 0) {
    if (routed_by_ids(R) && p.add_rows_div > 0) {
      // C was zeroed by an earlier kernel: every contributor adds, none waits;
      // the bias comes with the part that is ready first: share_of's order 0,
      // the stripe holding the column's last unit (no divisions on this path).
      const bool ready_first = static_cast<long long>(col + 1) * k_tiles <= static_cast<long long>(range + 1) * iters;
      store_rows(p, sh_red, tid, used_ids, slab, e, Parts * c + part, true, ready_first);
      sync();  // sh_red is refilled next
      return;
    }
    const Share sh = share_of(p, e, c, col, range, iters, k_tiles, part);
    const int r_lo = sh.r_lo, r_hi = sh.r_hi, contributors = sh.contributors;
    int* const lock = sh.lock;
    const bool shared_column = sh.shared();
    if (p.fp32_reduce && shared_column) {
      // Slot 2r holds range r's first column, 2r + 1 its last one.
      constexpr int kSlotFloats = MRows * NTile;
      constexpr int vec4_per_row = NTile / 4;
      auto slot_of = [&](int r) {
        const int which = (r * iters) / k_tiles == col ? 0 : 1;
        return reinterpret_cast<float4*>(p.c_tmp + (static_cast<size_t>(2 * r + which) * Parts + part) * kSlotFloats);
      };
      const int rows_here = R == Route::Dense ? min(MRows, p.m - slab * MRows) : MRows;
      float4* const mine = slot_of(range);
      for (int v = tid; v < rows_here * vec4_per_row; v += Threads) {
        const int mr = v / vec4_per_row;
        const int nv = v - mr * vec4_per_row;
        __stcg(mine + v, *reinterpret_cast<const float4*>(sh_red + mr * kRedStride + nv * 4));
      }
      // Thread 0 releases the block's slot and acquires the others' (the
      // barriers carry both to and from the other threads).
      sync();
      if (tid == 0) {
        sh_last = ptx::atom_add_acq_rel_gpu(lock, 1) == contributors - 1;
        if (sh_last) atomicExch(lock, 0);
      }
      sync();
      if (sh_last) {
        for (int v = tid; v < rows_here * vec4_per_row; v += Threads) {
          float4 sum = __ldcg(slot_of(r_lo) + v);
          for (int r = r_lo + 1; r <= r_hi; ++r) {
            const float4 x = __ldcg(slot_of(r) + v);
            sum.x += x.x;
            sum.y += x.y;
            sum.z += x.z;
            sum.w += x.w;
          }
          const int mr = v / vec4_per_row;
          const int nv = v - mr * vec4_per_row;
          *reinterpret_cast<float4*>(sh_red + mr * kRedStride + nv * 4) = sum;
        }
        sync();
        store_rows(p, sh_red, tid, used_ids, slab, e, Parts * c + part, false, true);
      }
      sync();
    } else {
      // The first partial (ready earliest, see gemm_kernel.cuh) is
      // stored, the others are added atomically once it is in place. The lock
      // counts finished contributors; the last one resets it to zero.
      const bool atomic = sh.adds();
      if (atomic) await_first(sh, tid, sync);
      store_rows(p, sh_red, tid, used_ids, slab, e, Parts * c + part, atomic, !atomic);
      if (shared_column) {
        count_done(sh, tid, sync);
      } else {
        sync();
      }
    }
  }
};

}  // namespace ferrum::dense
