#include "status.h"

#include <stdarg.h>
#include <stdio.h>

namespace ferrum {

thread_local char g_last_error[512] = "";

int fail(int stage, int cuda_status, const char* fmt, ...) {
  va_list args;
  va_start(args, fmt);
  vsnprintf(g_last_error, sizeof(g_last_error), fmt, args);
  va_end(args);
  return (stage << 16) | (cuda_status & 0xFFFF);
}

int fail_cuda(int stage, cudaError_t err, const char* what) {
  return fail(stage, static_cast<int>(err), "%s: %s (%s)", what, cudaGetErrorName(err),
              cudaGetErrorString(err));
}

void clear_error() { g_last_error[0] = '\0'; }

int check_pointer(const char* entry, const char* name, const void* p, uintptr_t alignment) {
  if (p == nullptr) {
    return fail(FERRUM_STAGE_ARGUMENT, FERRUM_STATUS_INVALID_VALUE, "%s: %s must not be null", entry,
                name);
  }
  if (!aligned(p, alignment)) {
    return fail(FERRUM_STAGE_ARGUMENT, FERRUM_STATUS_INVALID_VALUE,
                "%s: %s=%p must be %u-byte aligned", entry, name, p,
                static_cast<unsigned>(alignment));
  }
  return 0;
}

int DeviceGuard::enter(const char* entry, int dev) {
  int current = 0;
  cudaError_t err = cudaGetDevice(&current);
  if (err != cudaSuccess) return fail_cuda(FERRUM_STAGE_DEVICE, err, entry);
  if (current == dev) return 0;
  err = cudaSetDevice(dev);
  if (err != cudaSuccess) {
    return fail(FERRUM_STAGE_DEVICE, static_cast<int>(err), "%s: cannot select device %d: %s", entry,
                dev, cudaGetErrorName(err));
  }
  previous_ = current;
  return 0;
}

DeviceGuard::~DeviceGuard() {
  if (previous_ >= 0) cudaSetDevice(previous_);
}

}  // namespace ferrum

extern "C" const char* ferrum_marlin_last_error(void) { return ferrum::g_last_error; }

extern "C" const char* ferrum_marlin_status_stage_name(int stage) {
  switch (stage) {
    case FERRUM_STAGE_SM_COUNT: return "sm-count";
    case FERRUM_STAGE_MAX_SHARED_MEMORY: return "max-shared-memory";
    case FERRUM_STAGE_ACT_ORDER_LAUNCH: return "act-order-launch";
    case FERRUM_STAGE_BLOCKS_PER_SM: return "blocks-per-sm";
    case FERRUM_STAGE_FUNCTION_ATTRIBUTE: return "function-attribute";
    case FERRUM_STAGE_KERNEL_LAUNCH: return "kernel-launch";
    case FERRUM_STAGE_ARGUMENT: return "argument";
    case FERRUM_STAGE_SHAPE: return "shape";
    case FERRUM_STAGE_DEVICE: return "device";
    default: return "unknown";
  }
}

extern "C" const char* ferrum_marlin_cuda_error_name(int cuda_status) {
  return cudaGetErrorName(static_cast<cudaError_t>(cuda_status));
}
