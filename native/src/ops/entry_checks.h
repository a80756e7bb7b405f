// The argument rules and the launch check that the entry points of the MoE
// routing and the small MoE ops share; each returns 0 or a staged status with
// a message for ferrum_marlin_last_error().
#pragma once

#include <cuda_runtime.h>

#include "../status.h"

namespace ferrum::ops {

// Largest expert count the routing kernels take: the align kernel gives each
// expert one thread of its 1024-thread block, the router 32 logits per lane.
constexpr int kMaxExperts = 1024;

template <class... Args>
int invalid(const char* fmt, Args... args) {
  return fail(FERRUM_STAGE_ARGUMENT, FERRUM_STATUS_INVALID_VALUE, fmt, args...);
}

template <class... Args>
int bad_shape(const char* fmt, Args... args) {
  return fail(FERRUM_STAGE_SHAPE, FERRUM_STATUS_INVALID_VALUE, fmt, args...);
}

inline int check_positive(const char* entry, const char* name, int value) {
  return value >= 1 ? 0 : invalid("%s: %s=%d must be >= 1", entry, name, value);
}

// F16 and BF16 always; F32 only where the entry point reads fp32 input.
inline int check_dtype(const char* entry, int dtype, bool allow_f32) {
  if (dtype == FERRUM_DTYPE_F16 || dtype == FERRUM_DTYPE_BF16) return 0;
  if (allow_f32 && dtype == FERRUM_DTYPE_F32) return 0;
  return allow_f32 ? invalid("%s: dtype=%d must be FERRUM_DTYPE_F16 (1), FERRUM_DTYPE_BF16 (2) or "
                             "FERRUM_DTYPE_F32 (3)",
                             entry, dtype)
                   : invalid("%s: dtype=%d must be FERRUM_DTYPE_F16 (1) or FERRUM_DTYPE_BF16 (2)",
                             entry, dtype);
}

inline int element_bytes(int dtype) { return dtype == FERRUM_DTYPE_F32 ? 4 : 2; }

// The status of a launch (launch_chained's result: a bad configuration or a
// missing kernel image shows up there, not at the call).
inline int launched(cudaError_t err, const char* what) {
  return err == cudaSuccess ? 0 : fail_cuda(FERRUM_STAGE_KERNEL_LAUNCH, err, what);
}

}  // namespace ferrum::ops
