// Kernels of a chain (router -> align -> GEMM -> activation -> GEMM -> sum)
// are launched as programmatic dependents of the kernel before them in the
// stream (sm_90 and newer): their blocks are scheduled, and run up to their
// first ptx::griddep_wait(), while that kernel finishes, instead of after a
// full drain and launch. Semantics are those of plain stream order as long
// as every block of a chained kernel waits before it touches global memory:
// the wait returns once the previous kernel has completed and its writes are
// visible (and that kernel's own wait, before it completed, covered the one
// before it).
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <utility>

#include "types.h"

namespace ferrum {

// Whether the current device schedules programmatic dependents (compute
// capability 9.0 or newer); cached per device.
inline bool chained_launch_supported() {
  static std::atomic<int> cached[kMaxDevices] = {};  // 0 unknown, 1 no, 2 yes
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return false;
  if (dev < 0 || dev >= kMaxDevices) return false;
  int v = cached[dev].load(std::memory_order_relaxed);
  if (v == 0) {
    int major = 0;
    v = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess && major >= 9 ? 2 : 1;
    cached[dev].store(v, std::memory_order_relaxed);
  }
  return v == 2;
}

// `kernel<<<grid, block, smem, stream>>>(args...)` as a programmatic
// dependent of the stream's previous kernel where the device supports it.
template <class... Params, class... Args>
cudaError_t launch_chained(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                           Args&&... args) {
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  config.attrs = &attr;
  config.numAttrs = chained_launch_supported() ? 1 : 0;
  return cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
}

}  // namespace ferrum
