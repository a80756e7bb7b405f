// Building staged statuses and the per-thread failure message; the argument
// checks every entry point shares.
#pragma once

#include <cuda_runtime.h>
#include <stdint.h>

#include "ferrum_marlin.h"

namespace ferrum {

// Encodes (stage << 16) | status and records a printf-style message for
// ferrum_marlin_last_error() on this thread.
int fail(int stage, int cuda_status, const char* fmt, ...) __attribute__((format(printf, 3, 4)));
int fail_cuda(int stage, cudaError_t err, const char* what);
void clear_error();

inline bool aligned(const void* p, uintptr_t bytes) {
  return (reinterpret_cast<uintptr_t>(p) % bytes) == 0;
}

// Argument rule helpers: return 0 when the rule holds, a status otherwise.
int check_pointer(const char* entry, const char* name, const void* p, uintptr_t alignment);

// Makes `dev` current for the lifetime of the guard and restores the caller's
// device afterwards, so entry points can be called from any thread state.
class DeviceGuard {
 public:
  DeviceGuard() = default;
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;
  // Returns a status (stage "device") on failure.
  int enter(const char* entry, int dev);
  ~DeviceGuard();

 private:
  int previous_ = -1;
};

}  // namespace ferrum
