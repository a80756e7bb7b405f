// Launching a stripes kernel (see gemm_kernel.cuh): every block must be
// resident at once, because blocks wait on their predecessor's partial sums,
// so the grid is the number of blocks the device can hold (at most
// max_blocks per SM) and the work units are split evenly over it.
#pragma once

#include <cuda_runtime.h>

#include "../core/chained_launch.h"
#include "../core/tile.cuh"
#include "ferrum_marlin.h"
#include "gemm.h"

namespace ferrum::dense {

// `extra`: the kernel's parameters after Args (the wide kernel's tensor map).
template <auto Kernel, Route R, class... Extra>
cudaError_t launch_resident(int threads, size_t smem_bytes, int max_blocks, int n_tile, int k_tile, Args& args,
                            const Launch& launch, int* stage, const Extra&... extra) {
  // Attributes live in the device's context: set them, and learn how many
  // blocks can be resident, once per device (a benign race repeats the work).
  static int resident[kMaxDevices] = {};
  const int dev = launch.dev;
  int blocks = (dev >= 0 && dev < kMaxDevices) ? resident[dev] : 0;
  if (blocks == 0) {
    cudaError_t err =
        cudaFuncSetAttribute(Kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem_bytes));
    if (err != cudaSuccess) {
      *stage = FERRUM_STAGE_FUNCTION_ATTRIBUTE;
      return err;
    }
    err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, Kernel, threads, smem_bytes);
    if (err != cudaSuccess || blocks < 1) {
      *stage = FERRUM_STAGE_BLOCKS_PER_SM;
      return err != cudaSuccess ? err : cudaErrorLaunchOutOfResources;
    }
    blocks = blocks < max_blocks ? blocks : max_blocks;
    if (dev >= 0 && dev < kMaxDevices) resident[dev] = blocks;
  }
  int grid = launch.sms * blocks;
  // Sorted launches split their work on the device (stripes_of): their slab
  // count is the previous kernel's output.
  if constexpr (R != Route::Sorted) {
    const int n_tiles = (args.n + n_tile - 1) / n_tile;  // as the kernel counts them
    const int k_tiles = (args.k + k_tile - 1) / k_tile;
    const int total = args.slabs * n_tiles * k_tiles;
    if (grid > total) grid = total;
    args.iters = (total + grid - 1) / grid;
    grid = (total + args.iters - 1) / args.iters;
  }
  if (launch.overlap_previous) {
    const cudaError_t err =
        launch_chained(Kernel, dim3(grid), dim3(threads), smem_bytes, launch.stream, args, extra...);
    if (err != cudaSuccess) *stage = FERRUM_STAGE_KERNEL_LAUNCH;
    return err;
  }
  Kernel<<<grid, threads, smem_bytes, launch.stream>>>(args, extra...);
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) *stage = FERRUM_STAGE_KERNEL_LAUNCH;
  return err;
}

}  // namespace ferrum::dense
