// Kernels of a chain (router -> align -> GEMM -> activation -> GEMM -> sum)
// are launched as programmatic dependents of the kernel before them in the
// stream (Hopper): their blocks are scheduled, and run up to their
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

// Whether `kernel` may run as a programmatic dependent on the current device,
// cached per kernel and device: a Hopper GPU (compute capability 9.x, the only
// one this was measured on; newer ones get plain launches until they are) running
// code compiled for sm_90 or newer. A build for older targets alone runs on Hopper
// through its PTX, in which ptx::griddep_wait() is compiled out: it must not overlap.
template <class Kernel>
bool chained_launch_allowed(Kernel* kernel) {
  static std::atomic<int> cached[kMaxDevices] = {};  // 0 unknown, 1 no, 2 yes
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= kMaxDevices) {
    (void)cudaGetLastError();  // a query's failure is not the launch's
    return false;
  }
  int v = cached[dev].load(std::memory_order_relaxed);
  if (v == 0) {
    int major = 0;
    cudaFuncAttributes attributes{};
    const bool yes = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess &&
                     major == 9 && cudaFuncGetAttributes(&attributes, kernel) == cudaSuccess &&
                     attributes.ptxVersion >= 90;
    (void)cudaGetLastError();
    v = yes ? 2 : 1;
    cached[dev].store(v, std::memory_order_relaxed);
  }
  return v == 2;
}

// `kernel<<<grid, block, smem, stream>>>(args...)`, as a programmatic dependent
// of the stream's previous kernel where that is allowed. Returns the launch's
// status and, like a plain launch followed by its check, leaves the thread's
// last-error state cleared.
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
  config.numAttrs = chained_launch_allowed(kernel) ? 1 : 0;
  const cudaError_t err = cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
  const cudaError_t last = cudaGetLastError();
  return err != cudaSuccess ? err : last;
}

}  // namespace ferrum
