// The work split of the stripes kernels (gemm_kernel.cuh, wide_kernel.cuh):
// units are (slab, column tile, k tile), numbered slab-major, and block
// `range` (counted from the grid's end) takes `count` of them from `u_begin`.
// Sorted (fused-MoE) launches learn their slab count on the device (no host
// sync): every block derives the same split from it.
#pragma once

#include "../core/ptx.cuh"
#include "gemm.h"

namespace ferrum::dense {

struct Stripes {
  int slabs;
  int iters;     // units per block
  int used_ids;  // Sorted: the entries of sorted_ids in use
  int total;
  int range;
  int u_begin;
  int count;  // this block's units (<= 0: none)
};

// False when a sorted launch holds no work at all (every block exits).
template <Route R>
__device__ __forceinline__ bool stripes_of(const Args& p, int m_rows, int n_tiles, int k_tiles, Stripes& s) {
  s.slabs = p.slabs;
  s.iters = p.iters;
  s.used_ids = 0;
  if constexpr (R == Route::Sorted) {
    // Settled routing: only A is the previous kernel's output, and the kernel
    // waits for it before its first copy of A (there is nothing to clear).
    if (!p.routing_settled) {
      ptx::enter_chain();  // the routing is the previous kernel's output
      // Before any early exit: the clear does not depend on the routing.
      if (p.clear_int4 > 0) {
        const long long stride = static_cast<long long>(gridDim.x) * blockDim.x;
        for (long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; i < p.clear_int4;
             i += stride)
          p.clear[i] = make_int4(0, 0, 0, 0);
      }
    }
    s.used_ids = max(__ldg(p.route.used_ids), 0);
    s.slabs = (s.used_ids + m_rows - 1) / m_rows;
    const long long units = static_cast<long long>(s.slabs) * n_tiles * k_tiles;
    if (units == 0) {
      // No block waits later: the launch must still end after the previous kernel.
      if (p.routing_settled) ptx::griddep_wait();
      return false;
    }
    s.iters = static_cast<int>((units + gridDim.x - 1) / gridDim.x);
  }
  s.total = s.slabs * n_tiles * k_tiles;
  s.range = gridDim.x - 1 - blockIdx.x;
  s.u_begin = s.range * s.iters;
  s.count = min(s.iters, s.total - s.u_begin);
  return true;
}

}  // namespace ferrum::dense
