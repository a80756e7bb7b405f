// W4A16 kernels for 32-row activation slabs (one translation unit per slab
// height, so the build runs in parallel).
#include "w4a16_kernel.cuh"

namespace ferrum::w4a16 {

template <>
cudaError_t launch_m8<4>(NConfig nc, Args& args, const Launch& launch, int* stage) {
  return launch_slab<4>(nc, args, launch, stage);
}

}  // namespace ferrum::w4a16
