// Per-block timelines of the 8-warp kernel, for builds with the CMake option
// FERRUM_TIMELINE_PROBE (a diagnostic; off by default, and then every use
// below compiles to nothing). Thread 0 of each block that gets a stripe
// reads the GPU's global timer (ns) at the points of Point and prints one
// line when the block ends (blocks past the work print 0 or fewer units);
// scripts/timeline_probe.py runs the cases and summarises the phases of the
// blocks with units. printf moves the block's end (and the next kernel's start), not
// the stamps taken before it.
#pragma once

#ifdef FERRUM_TIMELINE_PROBE
#include <cstdio>

namespace ferrum::probe {

enum Point {
  kEntry,       // first instruction
  kRouted,      // the block's stripe is known (sorted launches: after reading the routing)
  kSought,      // the fetch cursor's addresses are set, the previous kernel awaited
  kIssued,      // the first stages' copies are issued
  kFirstStage,  // the first stage has landed (after the pipeline's barrier)
  kComputed,    // the last stage is multiplied
  kReduced,     // the last column's partials are summed in shared memory
  kEnd,         // after the last column's stores
  kPoints
};

struct Timeline {
  unsigned long long at[kPoints] = {};
  unsigned long long waited = 0;  // pipeline waits after the first stage
  unsigned long long wait_from = 0;

  __device__ static unsigned long long now() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
  }
  __device__ void stamp(Point point) {
    if (threadIdx.x == 0) at[point] = now();
  }
  __device__ void wait_begins() {
    if (threadIdx.x == 0) wait_from = now();
  }
  __device__ void wait_ends(bool first) {
    if (threadIdx.x == 0) {
      if (first)
        at[kFirstStage] = now();
      else
        waited += now() - wait_from;
    }
  }
  // One line: block, SM, units, tile (n_tile, k_tile), problem (n, k), the
  // stamps in Point order, the waits.
  __device__ void report(int units, int n_tile, int k_tile, int n, int k) const {
    if (threadIdx.x != 0) return;
    unsigned sm;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
    printf("FERRUM_TIMELINE %d %u %d %d %d %d %d %llu %llu %llu %llu %llu %llu %llu %llu %llu\n", blockIdx.x, sm,
           units, n_tile, k_tile, n, k, at[kEntry], at[kRouted], at[kSought], at[kIssued], at[kFirstStage],
           at[kComputed], at[kReduced], at[kEnd], waited);
  }
};

}  // namespace ferrum::probe

#define FERRUM_TIMELINE(...) __VA_ARGS__
#else
#define FERRUM_TIMELINE(...)
#endif
