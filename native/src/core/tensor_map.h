// Tensor maps (CUtensorMap) for the Hopper TMA copies of core/tma.cuh, encoded
// on the host through the driver entry point that the runtime hands out (the
// library links cudart statically and never links libcuda).
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

namespace ferrum {

// A row-major matrix of 16-bit values, `rows` x `cols` with `row_stride`
// elements between rows (a multiple of 8; `base` 16-byte aligned), read in
// boxes of box_rows x 64 elements (one 128-byte swizzle atom per row, the
// layout wgmma's 128-byte-swizzled K-major descriptors read). Rows past the
// end read as zeros. cudaErrorNotSupported when the driver has no
// cuTensorMapEncodeTiled; cudaErrorInvalidValue when it refuses the map.
cudaError_t encode_rows_map(CUtensorMap* map, const void* base, int rows, int cols, long long row_stride,
                            int box_rows);

}  // namespace ferrum
