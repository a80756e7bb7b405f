// Act-order (desc_act) support: the columns of A gathered by the weight's row
// permutation, so that the permuted weight's groups become contiguous.
#pragma once

#include <cuda_runtime.h>

namespace ferrum::dense {

// a_tmp[i, j] = a[i, perm[j]] for 16-bit elements; a has row stride lda (and
// may be narrower than k: a padded K shard), a_tmp is contiguous [m, k] and
// 16-byte aligned, k % 8 == 0. A perm entry outside min(k, lda) reads column 0
// rather than out of bounds. Launched as a chained
// kernel (core/chained_launch.h): it waits for the previous kernel's A.
// sms, max_smem: the multiprocessors in use and the device's opt-in shared
// memory per block (tall activations stage a row there when it fits).
cudaError_t gather_columns(const void* a, int lda, const int* perm, void* a_tmp, int m, int k, int sms, int max_smem,
                           cudaStream_t stream);

}  // namespace ferrum::dense
