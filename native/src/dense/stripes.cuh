// The work split of the stripes kernels (gemm_kernel.cuh, wide_kernel.cuh):
// units are (slab, column tile, k tile), numbered slab-major, and block
// `range` (counted from the grid's end) takes `count` of them from `u_begin`.
// Sorted (fused-MoE) launches learn their slab count on the device (no host
// sync): every block derives the same split from it. Direct launches (one
// routed row a slab) are split on the host, as dense ones.
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

// Zeroes this block's share of p.clear (every block of the grid takes one),
// once the previous kernel is done.
__device__ __forceinline__ void clear_share(const Args& p) {
  if (p.clear_int4 <= 0) return;
  const long long stride = static_cast<long long>(gridDim.x) * blockDim.x;
  for (long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; i < p.clear_int4; i += stride)
    p.clear[i] = make_int4(0, 0, 0, 0);
}

// Sorted and Direct launches: output row t of row `row` of `slab` (t < 0 or
// >= rows: padding; also when `live` is false). The one place that reads
// sorted_ids (one predicated load: no branch around it).
template <Route R>
__device__ __forceinline__ int routed_row(const Routing& r, bool live, int slab, int row, int m_rows,
                                          int used_ids) {
  if constexpr (R == Route::Direct) return live && row == 0 ? slab : -1;
  const int idx = slab * m_rows + row;
  return live && idx < used_ids ? __ldg(r.sorted_ids + idx) : -1;
}

// Settled routing: the launch waits for the previous kernel before its first
// copy of A (and before its clear), then lets the next kernel start.
__device__ __forceinline__ void settled_wait() {
  ptx::griddep_wait();
  ptx::griddep_launch_dependents();
}

// False when a sorted launch holds no work at all (every block exits).
template <Route R>
__device__ __forceinline__ bool stripes_of(const Args& p, int m_rows, int n_tiles, int k_tiles, Stripes& s) {
  s.slabs = p.slabs;
  s.iters = p.iters;
  s.used_ids = 0;
  if constexpr (routed_by_ids(R)) {
    // Settled routing: only A is the previous kernel's output, and the kernel
    // waits for it before its first copy of A (settled_wait).
    if (!p.routing_settled) {
      ptx::enter_chain();  // the routing is the previous kernel's output
      clear_share(p);      // before any early exit: the clear does not depend on the routing
    }
    // Direct launches (slabs: the routed rows) were split on the host.
    if constexpr (R == Route::Sorted) {
      s.used_ids = max(__ldg(p.route.used_ids), 0);
      s.slabs = (s.used_ids + m_rows - 1) / m_rows;
      const long long units = static_cast<long long>(s.slabs) * n_tiles * k_tiles;
      // (More than 2^31 units: a routing count past the host's bound, which the
      // 32-bit split cannot hold; nothing is run rather than out of bounds.)
      if (units == 0 || units > INT32_MAX) {
        // No block waits later: the launch must still end after the previous kernel.
        if (p.routing_settled) ptx::griddep_wait();
        return false;
      }
      s.iters = static_cast<int>((units + gridDim.x - 1) / gridDim.x);
    }
  }
  s.total = s.slabs * n_tiles * k_tiles;
  s.range = gridDim.x - 1 - blockIdx.x;
  s.u_begin = s.range * s.iters;
  s.count = min(s.iters, s.total - s.u_begin);
  return true;
}

}  // namespace ferrum::dense
