// The end of a column tile, shared by the Marlin kernels of this library: the
// block's fp32 partial (in shared memory, row-major [MRows][NTile + 4]) is
// combined with the other blocks' partials of the same column and stored to C
// with channelwise scales, bias and top-k weights (see gemm_kernel.cuh for the
// two reduction protocols). Threads: how many threads of the block take part;
// sync(): their barrier (the whole block, or a named barrier when only some
// warps run the epilogue). Parts: a column tile may be reduced and stored in
// Parts consecutive NTile-wide parts (one after the other through the same
// shared buffer), each with its own lock and c_tmp slot.
#pragma once

#include "../core/formats.cuh"
#include "../core/ptx.cuh"
#include "gemm.h"

namespace ferrum::dense {

template <int MRows, int NTile, int Threads, class F, Route R, int Parts = 1>
struct ColumnEpilogue {
  using N = typename F::N;
  static constexpr int kRedStride = NTile + 4;  // the pad keeps fragment stores conflict-free

  // Stores (or atomically adds) the block's rows of column tile c of `slab`
  // from sh_red, with channelwise scales, and the bias when it stores.
  __device__ static void store_rows(const Args& p, const float* sh_red, int tid, int used_ids, int slab,
                                    long long e, int c, bool atomic) {
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
      } else if constexpr (R == Route::Sorted) {
        const int idx = slab * MRows + mr;
        grow = idx < used_ids ? __ldg(p.route.sorted_ids + idx) : -1;
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
        // Channelwise scales are permuted per 32 columns so that column
        // 8a + e of a chunk sits at 8*(e/2) + 2a + e%2.
        const uint32_t* s2 = s_pairs + ((ncol & ~31) + 2 * ((ncol >> 3) & 3)) / 2;
#pragma unroll
        for (int e2 = 0; e2 < 4; ++e2) {
          const float2 s = N::to_float2(s2[4 * e2]);
          vals[2 * e2] *= s.x;
          vals[2 * e2 + 1] *= s.y;
        }
      }
      if (!atomic && bias != nullptr) {
        uint32_t bw[4];
        if (p.route.bias_p32) {
          // Permuted like the channelwise scales (see above).
          const uint32_t* b2 = reinterpret_cast<const uint32_t*>(bias) + ((ncol & ~31) + 2 * ((ncol >> 3) & 3)) / 2;
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
      if constexpr (R == Route::Sorted) {
#pragma unroll
        for (int e2 = 0; e2 < 8; ++e2) vals[e2] *= row_weight;
      }
      uint32_t packed[4];
#pragma unroll
      for (int e2 = 0; e2 < 4; ++e2) packed[e2] = N::from_floats(vals[2 * e2], vals[2 * e2 + 1]);
      char* const dst = static_cast<char*>(p.c) + 2 * (static_cast<size_t>(grow) * p.n + ncol);
      if (!atomic) {
        __stcg(reinterpret_cast<int4*>(dst), make_int4(packed[0], packed[1], packed[2], packed[3]));
      } else {
#pragma unroll
        for (int e2 = 0; e2 < 4; ++e2) N::atomic_add(dst + 4 * e2, packed[e2]);
      }
    }
  }

  // Everything after the block's partial of part `part` of column `col`
  // (slab, tile c, expert e) is in sh_red and the participating threads have
  // synchronised. range: this block's stripe; iters: units per stripe.
  template <class Sync>
  __device__ static void reduce_and_store(const Args& p, float* sh_red, int& sh_last, int tid, Sync sync,
                                          int used_ids, int slab, long long e, int c, int col, int range,
                                          int iters, int k_tiles, int part = 0) {
    const int first_unit = col * k_tiles;
    const int r_lo = first_unit / iters;
    const int r_hi = (first_unit + k_tiles - 1) / iters;
    const int contributors = r_hi - r_lo + 1;
    const int order = r_hi - range;  // 0: this block's part is ready first
    // A range is the lowest contributor of at most one shared column (its
    // last one), so r_lo names the column's lock uniquely within the launch.
    int* const lock = R == Route::Bucketed ? p.locks + e * p.route.locks_per_expert + c
                                           : p.locks + Parts * (p.lock_by_range ? r_lo : col) + part;
    const bool shared_column = contributors > 1;
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
      __threadfence();
      sync();
      if (tid == 0) {
        sh_last = atomicAdd(lock, 1) == contributors - 1;
        if (sh_last) atomicExch(lock, 0);
      }
      sync();
      if (sh_last) {
        __threadfence();
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
        store_rows(p, sh_red, tid, used_ids, slab, e, Parts * c + part, false);
      }
      sync();
    } else {
      // The first partial (ready earliest, see gemm_kernel.cuh) is
      // stored, the others are added atomically once it is in place. The lock
      // counts finished contributors; the last one resets it to zero.
      const bool atomic = shared_column && order > 0;
      if (atomic) {
        if (tid == 0) {
          while (ptx::ld_acquire_gpu(lock) < 1) __nanosleep(32);
        }
        sync();
      }
      store_rows(p, sh_red, tid, used_ids, slab, e, Parts * c + part, atomic);
      if (shared_column) {
        // The stored partial must be in place before the lock lets the others
        // add to it; the adds themselves need no fence (nothing in the launch
        // reads them, and they commute).
        if (!atomic) __threadfence();
        sync();
        if (tid == 0 && atomicAdd(lock, 1) == contributors - 1) atomicExch(lock, 0);
      } else {
        sync();
      }
    }
  }
};

}  // namespace ferrum::dense
