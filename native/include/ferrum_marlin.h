/*
 * ferrum_marlin.h — the whole public C ABI of libferrum_marlin.so.
 *
 * Every exported symbol is declared here and nowhere else; ferrum_ffi/_native.py
 * mirrors this file prototype by prototype (tests/test_abi.py checks both ways).
 *
 * Status encoding (every entry point that returns int):
 *   0                                   success
 *   (stage << 16) | (cuda_status & 0xFFFF)   failure
 * Stages 1..6 keep the numbers of the original engine so existing callers decode
 * them unchanged; 7..9 are what the native side itself rejects before touching
 * the GPU. After any failure, ferrum_marlin_last_error() returns a message for
 * the calling thread that names the argument and the rule.
 */
#ifndef FERRUM_MARLIN_H
#define FERRUM_MARLIN_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32)
#define FERRUM_API __declspec(dllexport)
#else
#define FERRUM_API __attribute__((visibility("default")))
#endif

/* Bumped on every incompatible change of a signature, struct or meaning. */
#define FERRUM_MARLIN_ABI_VERSION 1

/* Failure stages: the high 16 bits of a status. */
#define FERRUM_STAGE_SM_COUNT 1          /* querying the multiprocessor count       */
#define FERRUM_STAGE_MAX_SHARED_MEMORY 2 /* querying / fitting shared memory        */
#define FERRUM_STAGE_ACT_ORDER_LAUNCH 3  /* act-order gather launch                 */
#define FERRUM_STAGE_BLOCKS_PER_SM 4     /* occupancy: the kernel cannot be resident */
#define FERRUM_STAGE_FUNCTION_ATTRIBUTE 5 /* cudaFuncSetAttribute                    */
#define FERRUM_STAGE_KERNEL_LAUNCH 6     /* the launch itself                       */
#define FERRUM_STAGE_ARGUMENT 7          /* null / misaligned pointer, bad value    */
#define FERRUM_STAGE_SHAPE 8             /* divisibility, tile or workspace rule    */
#define FERRUM_STAGE_DEVICE 9            /* device selection / capability           */

/* The CUDA status carried by stages 7 and 8 (cudaErrorInvalidValue). */
#define FERRUM_STATUS_INVALID_VALUE 1

typedef struct CUstream_st* ferrum_stream_t; /* same type as cudaStream_t / CUstream */

/* ---- library information ------------------------------------------------ */
FERRUM_API int ferrum_marlin_abi_version(void);
/* Static string: version and the CUDA architectures the library was built for. */
FERRUM_API const char* ferrum_marlin_build_info(void);
/* Static name of a stage number ("sm-count", ..., "unknown"). */
FERRUM_API const char* ferrum_marlin_status_stage_name(int stage);
/* Thread-local message describing the last failure on this thread ("" if none). */
FERRUM_API const char* ferrum_marlin_last_error(void);
/* Static name of a CUDA status number ("cudaErrorInvalidValue", ...). */
FERRUM_API const char* ferrum_marlin_cuda_error_name(int cuda_status);

/* ---- runtime helpers (framework-free callers need nothing else) ---------- */
FERRUM_API int ferrum_marlin_device_count(int* count);
/* name: NUL-terminated, at most name_len bytes written. */
FERRUM_API int ferrum_marlin_device_info(int dev, char* name, size_t name_len, int* cc_major,
                                         int* cc_minor, int* sm_count, size_t* total_mem);
/* Device ordinal that owns a device pointer. */
FERRUM_API int ferrum_marlin_pointer_device(const void* ptr, int* dev);
FERRUM_API int ferrum_marlin_memset_async(void* ptr, int value, size_t bytes, ferrum_stream_t stream);
/* Make `consumer` wait for the work enqueued so far on `producer` (no host sync). */
FERRUM_API int ferrum_marlin_stream_wait(ferrum_stream_t consumer, ferrum_stream_t producer);
/* CUDA events for opt-in profiling. elapsed_ms synchronises on `end`. */
FERRUM_API int ferrum_marlin_event_create(void** event);
FERRUM_API int ferrum_marlin_event_record(void* event, ferrum_stream_t stream);
FERRUM_API int ferrum_marlin_event_elapsed_ms(void* start, void* end, float* ms);
FERRUM_API int ferrum_marlin_event_destroy(void* event);

/* ---- W4A16 Marlin GEMM ----------------------------------------------------
 * C[m, n] = A[m, k] . dequant(B)[k, n]
 *   A  fp16 row-major [prob_m, prob_k]                      16-byte aligned
 *   B  int32 Marlin-packed INT4 [prob_k/16, 2*prob_n_full]  (column slice: caller
 *      offsets the pointer by 2*col0 int32, col0 a multiple of 64)
 *   C  fp16 row-major [prob_m, prob_n]
 *   s  fp16 scales in Marlin order [prob_k/groupsize, prob_n_full], or [1, prob_n_full]
 *      for groupsize -1 (channelwise)
 *   workspace  int32 locks, zero on entry, left zero on exit; at least
 *      max(1, prob_n/128) * max_par entries
 * Rules: prob_m >= 0 (0 is a no-op), prob_n % 64 == 0, prob_k % 128 == 0,
 *   groupsize in {-1, 128} with prob_k % groupsize == 0,
 *   prob_n_full == -1 or (prob_n_full >= prob_n and prob_n_full % 64 == 0),
 *   thread_k/thread_n both -1 (auto) or one of (128,128), (64,256), (128,64),
 *   or (128,256) when prob_m <= 16,
 *   sms -1 (all) or >= 1 (clamped to the device), max_par >= 1.
 * Any prob_m: rows beyond 64*max_par are served by further launches on `stream`.
 * Never synchronises `stream`; allocates nothing; graph-capturable.
 */
FERRUM_API int marlin_cuda(const void* A, const void* B, void* C, const void* s, int prob_m,
                           int prob_n, int prob_k, void* workspace, int groupsize, int dev,
                           ferrum_stream_t stream, int thread_k, int thread_n, int sms,
                           int max_par, int prob_n_full);

#ifdef __cplusplus
}
#endif

#endif /* FERRUM_MARLIN_H */
