// Library information and the small runtime helpers that let framework-free
// callers (ferrum_ffi without CuPy, C programs) zero workspaces, order streams
// and time launches through the same CUDA runtime the kernels use.
#include <cuda_runtime.h>
#include <string.h>

#include "ferrum_marlin.h"
#include "status.h"

#ifndef FERRUM_BUILD_ARCHS
#define FERRUM_BUILD_ARCHS "unknown"
#endif
#ifndef FERRUM_VERSION
#define FERRUM_VERSION "0.0.0"
#endif

using ferrum::fail;
using ferrum::fail_cuda;

namespace {

cudaStream_t as_stream(ferrum_stream_t s) { return reinterpret_cast<cudaStream_t>(s); }

int null_argument(const char* entry, const char* name) {
  return fail(FERRUM_STAGE_ARGUMENT, FERRUM_STATUS_INVALID_VALUE, "%s: %s must not be null", entry,
              name);
}

}  // namespace

extern "C" {

int ferrum_marlin_abi_version(void) { return FERRUM_MARLIN_ABI_VERSION; }

const char* ferrum_marlin_build_info(void) {
#define FERRUM_STR2(x) #x
#define FERRUM_STR(x) FERRUM_STR2(x)
  return "ferrum_marlin " FERRUM_VERSION "; abi " FERRUM_STR(FERRUM_MARLIN_ABI_VERSION) "; cuda archs " FERRUM_BUILD_ARCHS;
}

int ferrum_marlin_device_count(int* count) {
  ferrum::clear_error();
  if (count == nullptr) return null_argument("ferrum_marlin_device_count", "count");
  *count = 0;
  const cudaError_t err = cudaGetDeviceCount(count);
  if (err != cudaSuccess) {
    *count = 0;
    return fail_cuda(FERRUM_STAGE_DEVICE, err, "ferrum_marlin_device_count");
  }
  return 0;
}

int ferrum_marlin_device_info(int dev, char* name, size_t name_len, int* cc_major, int* cc_minor,
                              int* sm_count, size_t* total_mem) {
  ferrum::clear_error();
  cudaDeviceProp prop;
  const cudaError_t err = cudaGetDeviceProperties(&prop, dev);
  if (err != cudaSuccess) return fail_cuda(FERRUM_STAGE_DEVICE, err, "ferrum_marlin_device_info");
  if (name != nullptr && name_len > 0) {
    strncpy(name, prop.name, name_len - 1);
    name[name_len - 1] = '\0';
  }
  if (cc_major) *cc_major = prop.major;
  if (cc_minor) *cc_minor = prop.minor;
  if (sm_count) *sm_count = prop.multiProcessorCount;
  if (total_mem) *total_mem = prop.totalGlobalMem;
  return 0;
}

int ferrum_marlin_pointer_device(const void* ptr, int* dev) {
  ferrum::clear_error();
  if (ptr == nullptr) return null_argument("ferrum_marlin_pointer_device", "ptr");
  if (dev == nullptr) return null_argument("ferrum_marlin_pointer_device", "dev");
  cudaPointerAttributes attr;
  const cudaError_t err = cudaPointerGetAttributes(&attr, ptr);
  if (err != cudaSuccess) return fail_cuda(FERRUM_STAGE_DEVICE, err, "ferrum_marlin_pointer_device");
  if (attr.type != cudaMemoryTypeDevice && attr.type != cudaMemoryTypeManaged) {
    *dev = -1;
    return fail(FERRUM_STAGE_ARGUMENT, FERRUM_STATUS_INVALID_VALUE,
                "ferrum_marlin_pointer_device: %p is not device memory", ptr);
  }
  *dev = attr.device;
  return 0;
}

int ferrum_marlin_memset_async(void* ptr, int value, size_t bytes, ferrum_stream_t stream) {
  ferrum::clear_error();
  if (bytes == 0) return 0;
  if (ptr == nullptr) return null_argument("ferrum_marlin_memset_async", "ptr");
  const cudaError_t err = cudaMemsetAsync(ptr, value, bytes, as_stream(stream));
  if (err != cudaSuccess) return fail_cuda(FERRUM_STAGE_KERNEL_LAUNCH, err, "ferrum_marlin_memset_async");
  return 0;
}

int ferrum_marlin_stream_wait(ferrum_stream_t consumer, ferrum_stream_t producer) {
  ferrum::clear_error();
  if (consumer == producer) return 0;
  cudaEvent_t event;
  cudaError_t err = cudaEventCreateWithFlags(&event, cudaEventDisableTiming);
  if (err != cudaSuccess) return fail_cuda(FERRUM_STAGE_KERNEL_LAUNCH, err, "ferrum_marlin_stream_wait: event");
  err = cudaEventRecord(event, as_stream(producer));
  if (err == cudaSuccess) err = cudaStreamWaitEvent(as_stream(consumer), event, 0);
  // Destroying a recorded event is safe: the wait keeps what it needs.
  cudaEventDestroy(event);
  if (err != cudaSuccess) return fail_cuda(FERRUM_STAGE_KERNEL_LAUNCH, err, "ferrum_marlin_stream_wait");
  return 0;
}

int ferrum_marlin_event_create(void** event) {
  ferrum::clear_error();
  if (event == nullptr) return null_argument("ferrum_marlin_event_create", "event");
  cudaEvent_t e;
  const cudaError_t err = cudaEventCreate(&e);
  if (err != cudaSuccess) return fail_cuda(FERRUM_STAGE_KERNEL_LAUNCH, err, "ferrum_marlin_event_create");
  *event = e;
  return 0;
}

int ferrum_marlin_event_record(void* event, ferrum_stream_t stream) {
  ferrum::clear_error();
  if (event == nullptr) return null_argument("ferrum_marlin_event_record", "event");
  const cudaError_t err = cudaEventRecord(static_cast<cudaEvent_t>(event), as_stream(stream));
  if (err != cudaSuccess) return fail_cuda(FERRUM_STAGE_KERNEL_LAUNCH, err, "ferrum_marlin_event_record");
  return 0;
}

int ferrum_marlin_event_elapsed_ms(void* start, void* end, float* ms) {
  ferrum::clear_error();
  if (start == nullptr) return null_argument("ferrum_marlin_event_elapsed_ms", "start");
  if (end == nullptr) return null_argument("ferrum_marlin_event_elapsed_ms", "end");
  if (ms == nullptr) return null_argument("ferrum_marlin_event_elapsed_ms", "ms");
  cudaError_t err = cudaEventSynchronize(static_cast<cudaEvent_t>(end));
  if (err == cudaSuccess)
    err = cudaEventElapsedTime(ms, static_cast<cudaEvent_t>(start), static_cast<cudaEvent_t>(end));
  if (err != cudaSuccess) return fail_cuda(FERRUM_STAGE_KERNEL_LAUNCH, err, "ferrum_marlin_event_elapsed_ms");
  return 0;
}

int ferrum_marlin_event_destroy(void* event) {
  ferrum::clear_error();
  if (event == nullptr) return 0;
  const cudaError_t err = cudaEventDestroy(static_cast<cudaEvent_t>(event));
  if (err != cudaSuccess) return fail_cuda(FERRUM_STAGE_KERNEL_LAUNCH, err, "ferrum_marlin_event_destroy");
  return 0;
}

}  // extern "C"
