// W4A16 kernels for 16-row activation slabs.
#include "w4a16_kernel.cuh"
#include "w4a16_tiles.h"

namespace ferrum::w4a16 {

template <>
cudaError_t launch_m8<2>(NConfig nc, Args& args, const Launch& launch, int* stage) {
  switch (nc) {
    case NConfig::N128_K128:
      return launch_tile<Tile<2, NConfig::N128_K128>>(args, launch, stage);
    case NConfig::N256_K64:
      return launch_tile<Tile<2, NConfig::N256_K64>>(args, launch, stage);
    case NConfig::N64_K128:
      return launch_tile<Tile<2, NConfig::N64_K128>>(args, launch, stage);
    case NConfig::N256_K128:
      return launch_tile<Tile<2, NConfig::N256_K128>>(args, launch, stage);
    case NConfig::N256_K64_WGMMA:
      break;  // warpgroup tiles serve 64-row slabs only
  }
  return cudaErrorInvalidValue;
}

}  // namespace ferrum::w4a16
