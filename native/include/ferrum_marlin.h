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

/* Bumped on every change of a signature, struct or meaning (2: the _ex MoE
 * entries take routing flags, FERRUM_MOE_ROUTING_DIRECT added). */
#define FERRUM_MARLIN_ABI_VERSION 2

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

/* The largest n, k and row stride (lda, prob_n_full) any entry point accepts
 * (2^28; stage FERRUM_STAGE_SHAPE beyond): the kernels' strides are 32-bit
 * products of them. */
#define FERRUM_MAX_DIM 268435456

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
 * Any prob_m: rows beyond max_par slabs (of 16..256 rows, by tile) are served by
 *   further launches on `stream`.
 * Never synchronises `stream`; allocates nothing; graph-capturable.
 */
FERRUM_API int marlin_cuda(const void* A, const void* B, void* C, const void* s, int prob_m,
                           int prob_n, int prob_k, void* workspace, int groupsize, int dev,
                           ferrum_stream_t stream, int thread_k, int thread_n, int sms,
                           int max_par, int prob_n_full);

/* ---- General Marlin GEMM ---------------------------------------------------
 * C[m, n] = A[m, k] . dequant(B)[k, n], one entry point for every activation and
 * weight type, described by a versioned struct: `abi_version` and `struct_size`
 * come first so fields can be appended later without breaking callers (the
 * library accepts any struct_size >= the size of version 1 and reads only the
 * fields it knows).
 *
 * Types (FerrumMarlinLaunch.a_type / b_type):
 *   a_type  FERRUM_DTYPE_F16, FERRUM_DTYPE_BF16: activations, scales and C share it
 *   b_type  FERRUM_WEIGHT_U4       INT4 codes with a zero point per group and column
 *                                  (AWQ, compressed-tensors asymmetric): (q - z) * s
 *           FERRUM_WEIGHT_U4B8     INT4 codes, symmetric, bias 8 (GPTQ): (q - 8) * s
 *           FERRUM_WEIGHT_U8B128   8-bit codes, symmetric, bias 128: (q - 128) * s
 *           FERRUM_WEIGHT_FE4M3FN  FP8 E4M3 bytes: e4m3(q) * s / 256 (the scales
 *                                  carry FERRUM_FP8_SCALE_FACTOR = 256, see below)
 *
 * Buffers (device pointers):
 *   a           [m, lda] row-major, a_type; 16-byte aligned, lda % 8 == 0, lda >= k
 *               (ACT_ORDER: any lda > 0; a is read only at columns perm[j] < min(k, lda))
 *   b           Marlin-packed int32 [k/16, 2n] (4-bit) or [k/16, 4n] (8-bit)
 *   c           [m, n] row-major, a_type
 *   b_scales    [num_groups, n] a_type in the Marlin scale order (grouped or
 *               channelwise permutation); FE4M3FN scales are multiplied by 256;
 *               with K_FULL clear: every group of the whole layer
 *   zero_points U4 only: int32 [num_groups, n/8], Marlin zero-point order
 *   g_idx       act-order only: int32 [k], the group of each row of the permuted
 *               weight (the sorted g_idx). With K_FULL set it must equal
 *               i / group_size for row i (what GPTQ desc_act gives an unsharded
 *               layer): the kernel takes each row's group from its index. With
 *               K_FULL clear the kernel reads it: values in [0, num_groups),
 *               non-decreasing (a value outside is clamped into that range, so
 *               it cannot read past b_scales / zero_points; ferrum_ffi's
 *               from_gptq checks the values)
 *   perm        act-order only: int32 [k], a_tmp[:, i] = a[:, perm[i]]
 *   a_tmp       act-order only: [m, k] a_type scratch (contiguous)
 *   c_tmp       FP32_REDUCE only: fp32 scratch of at least
 *               FERRUM_MM_C_TMP_FLOATS_PER_SM * sms floats (sms resolved)
 *   workspace   int32 locks, at least FERRUM_MM_WORKSPACE_INTS_PER_SM * sms
 *               entries (sms resolved); zero on entry, left zero on exit
 *   a_scales    reserved, must be NULL
 *   bias        optional [n] a_type added to every row of C (NULL: none)
 * Every 16-byte rule above also holds for b, c, b_scales, zero_points, a_tmp,
 * c_tmp, bias; g_idx, perm and workspace need 4 bytes. The *_bytes fields give the
 * capacity of workspace / c_tmp / a_tmp; the library checks the spans it needs.
 *
 * Problem: m >= 0 (0 is a no-op), n % 64 == 0, k % 128 == 0 (other shapes are
 *   padded by the caller: zero-valued weight columns / rows, i.e. codes equal to
 *   the zero point, with zero columns of a for padded rows; README "Shapes");
 *   group_size -1 (channelwise, num_groups == 1), 32, 64 or a power of two >= 128,
 *   dividing k with num_groups == k / group_size; FE4M3FN takes -1 or 128 only.
 *   K_FULL clear: the layer's group_size (same rule but for dividing k),
 *   num_groups >= 1 (the layer's group
 *   count; k need not be a multiple of group_size), n % 128 == 0.
 * Flags:
 *   ACT_ORDER        gather A by perm into a_tmp first (needs g_idx, perm, a_tmp,
 *                    an integer weight type and group_size > 0); forbidden otherwise
 *   K_FULL           the layer is not sharded along K. Clear (vLLM's
 *                    is_k_full=false; needs ACT_ORDER): a K shard of an act-order
 *                    layer, whose rows hold each group only in part: every row
 *                    takes its own group's scales (and zero points) from g_idx.
 *                    Dequantises: on Hopper (sm_90a) with m > 16 and n % 256
 *                    == 0 in the warp-specialised kernel's tiles, otherwise in
 *                    the 8-warp kernel's 128 x 128 tile (slabs of 8, 16 or 64
 *                    rows); a shard whose row count is not
 *                    a multiple of 128 is padded by the caller with zero-valued
 *                    rows (codes equal to the zero point) of any group, perm
 *                    mapping them to any column of a
 *   HAS_ZERO_POINTS  set exactly when b_type is U4 (zero_points then non-NULL)
 *   ATOMIC_ADD       partial sums of a column shared by several blocks are added
 *                    into C with atomics (the default when neither mode is set)
 *   FP32_REDUCE      partial sums go through c_tmp in fp32 and are added in a
 *                    fixed order: deterministic results; excludes ATOMIC_ADD
 * Execution: device >= 0; sms -1 (all) or >= 1 (clamped to the device);
 *   thread_k/thread_n -1/-1 (automatic) or a tile override: (128,128), (64,256),
 *   (128,64), or (128,256) when m <= 16; K_FULL clear: -1/-1 or (128,128).
 *   Automatic on Hopper (sm_90a build) with k % 64 == 0 and n % 64 == 0 (the
 *   last column tile may be partial; K_FULL clear: n % 256 == 0), for
 *   m > 16 and (K_FULL set) for m = 9..16 with group_size -1 or >= 64 (INT8
 *   also 32): a warp-specialised warpgroup-MMA kernel (256 x 64 tiles, 256 x
 *   128 for 4-bit weights in 16-row slabs; slabs of 16, 32 (k >= 8192), 64 or
 *   128 rows; 128 x 64 tiles of 256-row slabs for m > 128 while
 *   m * k * 2 <= 32 MB; 384 or 512 threads,
 *   one block per SM; same workspace and c_tmp bounds); an override always
 *   selects the 8-warp kernel's tile. On a device with less shared memory per
 *   block than the chosen tile needs (sm_86/89: ~99 KB) the same tile runs
 *   shorter activation slabs (and the automatic deep 256-column tile runs as
 *   128-column tiles).
 * Never synchronises `stream`; allocates nothing; graph-capturable.
 */
#define FERRUM_DTYPE_F16 1
#define FERRUM_DTYPE_BF16 2

#define FERRUM_WEIGHT_U4 1
#define FERRUM_WEIGHT_U4B8 2
#define FERRUM_WEIGHT_U8B128 3
#define FERRUM_WEIGHT_FE4M3FN 4

#define FERRUM_MM_FLAG_ACT_ORDER 0x1u
#define FERRUM_MM_FLAG_K_FULL 0x2u
#define FERRUM_MM_FLAG_HAS_ZERO_POINTS 0x4u
#define FERRUM_MM_FLAG_ATOMIC_ADD 0x8u
#define FERRUM_MM_FLAG_FP32_REDUCE 0x10u

#define FERRUM_MM_LAUNCH_VERSION 1
#define FERRUM_FP8_SCALE_FACTOR 256
#define FERRUM_MM_WORKSPACE_INTS_PER_SM 4
#define FERRUM_MM_C_TMP_FLOATS_PER_SM 65536

typedef struct FerrumMarlinLaunch {
  unsigned int abi_version; /* FERRUM_MM_LAUNCH_VERSION */
  unsigned int struct_size; /* sizeof(FerrumMarlinLaunch) of the caller */
  /* buffers */
  const void* a;
  const void* b;
  void* c;
  void* c_tmp;
  const void* b_scales;
  const void* zero_points;
  const int* g_idx;
  const int* perm;
  void* a_tmp;
  void* workspace;
  const void* a_scales;
  const void* bias;
  size_t workspace_bytes;
  size_t c_tmp_bytes;
  size_t a_tmp_bytes;
  /* problem */
  int m;
  int n;
  int k;
  int lda;
  int num_groups;
  int group_size;
  /* types */
  int a_type;
  int b_type;
  /* execution */
  int device;
  int sms;
  ferrum_stream_t stream;
  unsigned int flags;
  int thread_k;
  int thread_n;
} FerrumMarlinLaunch;

FERRUM_API int ferrum_marlin_mm(const FerrumMarlinLaunch* launch);

/* ---- Fused-MoE Marlin GEMMs (vLLM marlin_moe_wna16 calling convention) -----
 * C[sorted_token_ids[i], :] = A[sorted_token_ids[i] / top_k, :] . dequant(B[e])
 * for every row i of block j = i / moe_block_size, e = expert_ids[j]:
 *   a                 [prob_m, prob_k] row-major (fp16; bf16 for MXFP4), 16-byte aligned
 *   b                 stacked Marlin weights, one [prob_k/16, 2*prob_n] int32 tile
 *                     (4-bit: INT4, E2M1) or [prob_k/16, 4*prob_n] (FP8) per expert
 *   c                 [prob_m * top_k, prob_n]; rows no valid id names are not written
 *   b_scales          [E, groups, prob_n] in the Marlin scale order: fp16 (INT4, FP8
 *                     with FERRUM_FP8_SCALE_FACTOR folded in) or E8M0 bytes (MXFP4)
 *   b_zeros           has_zp only: int32 [E, groups, prob_n/8] zero-point codes,
 *                     Marlin zero-point order
 *   b_bias            MXFP4 only: bf16 [E, prob_n] in the P32 order of the
 *                     channelwise scales (ferrum_ffi.formats.mxfp4)
 *   sorted_token_ids  int32: ids t = token * top_k + slot; t >= prob_m * top_k
 *                     (or < 0) is padding. Only the first *num_tokens_past_padded
 *                     entries are read.
 *   expert_ids        int32 [*num_tokens_past_padded / moe_block_size]; with is_ep
 *                     a negative id skips the block (another rank's expert)
 *   topk_weights      fp32 [prob_m * top_k] indexed by t; mul_topk_weights scales
 *                     row t of C by it (after the bias)
 *   workspace         int32 locks, >= FERRUM_MOE_WORKSPACE_INTS_PER_SM * sms of the
 *                     device; zero on entry, left zero on exit (graph-capturable)
 *   c_tmp             use_fp32_reduce only: fp32 scratch of at least
 *                     FERRUM_MOE_C_TMP_FLOATS_PER_SM_PER_ROW * moe_block_size * sms
 *                     floats: every resident block may own two moe_block_size x 256
 *                     fp32 tiles, two blocks per SM
 * Rules (checked natively, status stage 7/8 on failure): non-null, 16-byte aligned
 * a, b, c, b_scales, b_zeros, b_bias, c_tmp; 4-byte aligned int32/fp32 arrays;
 * moe_block_size in {8, 16, 32, 48, 64}; top_k >= 1; prob_m, prob_n, prob_k >= 1;
 * prob_m * top_k fits int32; prob_n % 64 == 0, prob_k % 64 == 0 (a tile that does
 * not divide them runs a partial last tile: nothing outside the problem is read or
 * written, so no padding is needed; (thread_k, thread_n) tiles (128,256) for
 * moe_block_size <= 16, (128,128), (128,64), (64,256), (64,128)); group_size
 * -1, 32, 64 or a power of two >= 128 dividing prob_k (INT4), -1 or 128 (FP8),
 * exactly 32 (MXFP4);
 * has_zp exactly when b_zeros is non-NULL (never for FP8); mul_topk_weights needs
 * topk_weights; exactly one of use_atomic_add / use_fp32_reduce, c_tmp non-NULL
 * exactly with use_fp32_reduce. Atomic mode needs no zeroed C (the first partial
 * of a tile is stored, later ones added). Expert ids must name experts of b: the
 * library cannot see E and trusts the routing arrays, like every MoE kernel.
 * MXFP4 with moe_block_size <= 16 multiplies code images (value * 2^-126) by
 * the activations times 2^64 (exact; fp32 sums carry 2^-62 until the column's
 * end): activations must stay below 2^64 in magnitude, and products or outputs
 * below 2^-64 lose precision (taller blocks keep fp32's range).
 * FERRUM_VLLM_MOE_THREAD_K / _THREAD_N force a tile when both are set (an unknown
 * pair is an argument error).
 * On sm_90 and newer these GEMMs, the align, router and elementwise ops below are
 * launched as programmatic dependents of the stream's previous kernel: their
 * blocks are scheduled while it finishes and wait for it before touching memory,
 * so stream order holds exactly as with plain launches (and in graphs).
 */
#define FERRUM_MOE_WORKSPACE_INTS_PER_SM 4
#define FERRUM_MOE_C_TMP_FLOATS_PER_SM_PER_ROW 1024

FERRUM_API int ferrum_vllm_marlin_moe_f16(const void* a, const void* b, void* c, void* c_tmp,
                                          const void* b_scales, const void* b_zeros,
                                          void* workspace, const int* sorted_token_ids,
                                          const int* expert_ids, const int* num_tokens_past_padded,
                                          const float* topk_weights, int moe_block_size, int top_k,
                                          int mul_topk_weights, int is_ep, int prob_m, int prob_n,
                                          int prob_k, int group_size, int has_zp, int dev,
                                          ferrum_stream_t stream, int use_atomic_add,
                                          int use_fp32_reduce);
FERRUM_API int ferrum_vllm_marlin_moe_fp8_f16(const void* a, const void* b, void* c, void* c_tmp,
                                              const void* b_scales, const void* b_zeros,
                                              void* workspace, const int* sorted_token_ids,
                                              const int* expert_ids,
                                              const int* num_tokens_past_padded,
                                              const float* topk_weights, int moe_block_size,
                                              int top_k, int mul_topk_weights, int is_ep, int prob_m,
                                              int prob_n, int prob_k, int group_size, int has_zp,
                                              int dev, ferrum_stream_t stream, int use_atomic_add,
                                              int use_fp32_reduce);
FERRUM_API int ferrum_vllm_marlin_moe_mxfp4_bf16(const void* a, const void* b, void* c, void* c_tmp,
                                                 const void* b_bias, const void* b_scales,
                                                 void* workspace, const int* sorted_token_ids,
                                                 const int* expert_ids,
                                                 const int* num_tokens_past_padded,
                                                 const float* topk_weights, int moe_block_size,
                                                 int top_k, int mul_topk_weights, int is_ep,
                                                 int prob_m, int prob_n, int prob_k, int group_size,
                                                 int dev, ferrum_stream_t stream, int use_atomic_add,
                                                 int use_fp32_reduce);

/* The same three GEMMs for a MoE layer's calls (fused_moe uses them), each with
 * the arguments of its entry above and four more:
 *   add_rows_div  0: C as above. r >= 1: C is zero on entry and every partial of
 *                 output row t (of prob_m * top_k) is added, with atomics and no
 *                 locks, into row t / r of C, which has prob_m * top_k / r rows
 *                 (r must divide prob_m * top_k); the MXFP4 bias is added once per
 *                 row t. r = top_k of the layer sums each token's expert rows (the
 *                 down GEMM, topk weights applied per row). Needs use_atomic_add;
 *                 partials and rows are summed in 16-bit arithmetic, in no fixed
 *                 order.
 *   clear         NULL, or a 16-byte aligned buffer that this launch zeroes once
 *                 the previous kernel of the stream is done (before the next one
 *                 starts): the next GEMM's add_rows_div destination. It must not
 *                 overlap any buffer this launch reads or writes.
 *   clear_bytes   0 with clear NULL, else a positive multiple of 16.
 *   routing_flags 0, or an OR of:
 *     FERRUM_MOE_ROUTING_SETTLED  the routing arrays and topk_weights were
 *                 written before the stream's previous kernel, only `a` by it
 *                 (fused_moe's down GEMM after the activation): the launch reads
 *                 them and pulls its first weight stages into L2 while that kernel
 *                 finishes, and waits for it before reading `a` or writing anything.
 *                 A clear needs FERRUM_MOE_ROUTING_DIRECT too (done after the last
 *                 stage). Without it the launch waits first, as the entries above
 *                 do.
 *     FERRUM_MOE_ROUTING_DIRECT  no align step: routed row t (of prob_m * top_k)
 *                 is slab t alone, multiplied by expert expert_ids[t] (so
 *                 expert_ids holds prob_m * top_k entries: topk_ids as the router
 *                 wrote them, or mapped to local ids, -1 skipped under is_ep);
 *                 sorted_token_ids and num_tokens_past_padded must be NULL and
 *                 moe_block_size 8. Every routed row streams its expert's weights:
 *                 meant for decode steps whose rows name distinct experts (one
 *                 token), where it saves the align kernel and a dependent read.
 * A launch whose routing holds no rows still clears. Same status stages. */
#define FERRUM_MOE_ROUTING_SETTLED 1
#define FERRUM_MOE_ROUTING_DIRECT 2
FERRUM_API int ferrum_vllm_marlin_moe_f16_ex(const void* a, const void* b, void* c, void* c_tmp,
                                             const void* b_scales, const void* b_zeros,
                                             void* workspace, const int* sorted_token_ids,
                                             const int* expert_ids,
                                             const int* num_tokens_past_padded,
                                             const float* topk_weights, int moe_block_size,
                                             int top_k, int mul_topk_weights, int is_ep, int prob_m,
                                             int prob_n, int prob_k, int group_size, int has_zp,
                                             int dev, ferrum_stream_t stream, int use_atomic_add,
                                             int use_fp32_reduce, int add_rows_div, void* clear,
                                             size_t clear_bytes, int routing_flags);
FERRUM_API int ferrum_vllm_marlin_moe_fp8_f16_ex(const void* a, const void* b, void* c, void* c_tmp,
                                                 const void* b_scales, const void* b_zeros,
                                                 void* workspace, const int* sorted_token_ids,
                                                 const int* expert_ids,
                                                 const int* num_tokens_past_padded,
                                                 const float* topk_weights, int moe_block_size,
                                                 int top_k, int mul_topk_weights, int is_ep,
                                                 int prob_m, int prob_n, int prob_k, int group_size,
                                                 int has_zp, int dev, ferrum_stream_t stream,
                                                 int use_atomic_add, int use_fp32_reduce,
                                                 int add_rows_div, void* clear, size_t clear_bytes,
                                                 int routing_flags);
FERRUM_API int ferrum_vllm_marlin_moe_mxfp4_bf16_ex(const void* a, const void* b, void* c,
                                                    void* c_tmp, const void* b_bias,
                                                    const void* b_scales, void* workspace,
                                                    const int* sorted_token_ids,
                                                    const int* expert_ids,
                                                    const int* num_tokens_past_padded,
                                                    const float* topk_weights, int moe_block_size,
                                                    int top_k, int mul_topk_weights, int is_ep,
                                                    int prob_m, int prob_n, int prob_k,
                                                    int group_size, int dev, ferrum_stream_t stream,
                                                    int use_atomic_add, int use_fp32_reduce,
                                                    int add_rows_div, void* clear,
                                                    size_t clear_bytes, int routing_flags);

/* Profile sink: while a path is set, every MoE GEMM launch appends one JSON line
 *   {"event":"vllm_moe_config","entry":...,"shape":{"prob_m","prob_n","prob_k",
 *    "thread_k","thread_n","moe_block_size","top_k","group_size",...},
 *    "commit_sha":...,"env_hash":...,"model":...,"concurrency":...,
 *    "runtime_flags":<runtime_flags_json>}
 * Environment, read at every launch: FERRUM_VLLM_MOE_LOG_CONFIG=0 suspends the
 * sink, =1 also echoes each line to stderr; FERRUM_VLLM_MOE_LOG_CONFIG_MIN_PAIRS /
 * _MAX_PAIRS keep only launches whose prob_m * top_k lies in the range.
 * Thread-safe. The file is opened (append) by set_profile_config; if that fails,
 * the sink stays off, ferrum_marlin_last_error() says why and
 * ferrum_vllm_marlin_moe_profile_enabled() returns 0. NULL strings count as "". */
FERRUM_API void ferrum_vllm_marlin_moe_set_profile_config(const char* path, const char* commit_sha,
                                                          const char* env_hash, const char* model,
                                                          int concurrency,
                                                          const char* runtime_flags_json);
FERRUM_API void ferrum_vllm_marlin_moe_clear_profile_config(void);
FERRUM_API int ferrum_vllm_marlin_moe_profile_enabled(void);

/* ---- Bucketed MoE W4A16 (one launch per bucket of experts) ----------------
 * For y in [0, expert_count): e = active_expert_ids ? active_expert_ids[y] : y;
 * rows r < min(tokens_per_expert[e], prob_m) of A and C starting at row
 * a_row_offsets[e]: C[off + r, :] = A[off + r, :] . dequant(B_e), where
 *   B_e = B + e * b_int4_per_expert (16-byte units), s_e = s + e * s_int4_per_expert,
 *   locks_e = workspace + e * locks_i32_per_expert (>= prob_n / 64 locks each).
 * FP16 x INT4 (bias 8) in the W4A16 layouts of marlin_cuda; prob_m in {16, 32, 48, 64};
 * prob_n, prob_k multiples of 64 (partial last tiles as above; thread_k/thread_n
 * -1/-1 or (128,128), (128,64), (64,256), (64,128), (128,256) for prob_m 16); groupsize
 * -1 or 128; prob_n_full the column stride of B_e / s_e (-1 = prob_n); the strides
 * must cover one expert (b: prob_k*prob_n_full/32, s: groups*prob_n_full/8). Rows
 * past an expert's count are zero padding and are not written.
 */
FERRUM_API int marlin_cuda_moe(const void* A, const void* B, void* C, const void* s, int prob_m,
                               int prob_n, int prob_k, void* workspace, const int* a_row_offsets,
                               const int* tokens_per_expert, const int* active_expert_ids,
                               int expert_count, int b_int4_per_expert, int s_int4_per_expert,
                               int locks_i32_per_expert, int groupsize, int dev,
                               ferrum_stream_t stream, int thread_k, int thread_n, int sms,
                               int prob_n_full);

/* ---- MoE routing and the small ops of a MoE layer -------------------------- */
#define FERRUM_DTYPE_F32 3

/* topk_ids [num_tokens, top_k] int32 -> vLLM's block-aligned routing, one launch:
 *   sorted_token_ids  each expert's ids t (ascending) padded with num_tokens*top_k
 *                     to a multiple of block_size; capacity >= num_tokens*top_k +
 *                     num_experts*(block_size-1) (every entry is written)
 *   expert_ids        expert of each block, -1 past the blocks in use; capacity >=
 *                     ceil(the sorted capacity needed / block_size); with expert_map
 *                     ([num_experts] global -> local id or -1) the mapped id
 *   num_tokens_post_padded  one int32: entries of sorted_token_ids in use
 * Ids outside [0, num_experts) are dropped (their rows stay unwritten);
 * num_experts <= 1024. Outputs must not overlap the inputs. */
FERRUM_API int ferrum_moe_align_block_size(const int* topk_ids, int num_tokens, int top_k,
                                           int num_experts, int block_size, const int* expert_map,
                                           int* sorted_token_ids, int sorted_capacity,
                                           int* expert_ids, int expert_ids_capacity,
                                           int* num_tokens_post_padded, int dev,
                                           ferrum_stream_t stream);
/* The same, and clear_bytes of clear (16-byte aligned, a multiple of 16; NULL and 0
 * for none) zeroed by extra blocks of the launch once the previous kernel is done:
 * the next GEMM's add_rows_div destination (fused_moe: the gate/up output). The
 * buffer must not overlap the others. */
FERRUM_API int ferrum_moe_align_block_size_ex(const int* topk_ids, int num_tokens, int top_k,
                                              int num_experts, int block_size,
                                              const int* expert_map, int* sorted_token_ids,
                                              int sorted_capacity, int* expert_ids,
                                              int expert_ids_capacity, int* num_tokens_post_padded,
                                              int dev, ferrum_stream_t stream, void* clear,
                                              size_t clear_bytes);
/* Router: softmax over logits [num_tokens, num_experts] (dtype F16/BF16/F32), the
 * top_k largest (ties: lower id) -> topk_weights fp32 and topk_ids int32
 * [num_tokens, top_k]; renormalize divides the k weights by their sum. */
FERRUM_API int ferrum_topk_softmax(const void* logits, int dtype, int num_tokens, int num_experts,
                                   int top_k, int renormalize, float* topk_weights, int* topk_ids,
                                   int dev, ferrum_stream_t stream);
/* out[r, j] = silu(x[r, j]) * x[r, d + j]; x [rows, 2d], out [rows, d]; F16/BF16. */
FERRUM_API int ferrum_silu_and_mul(const void* x, void* out, int rows, int d, int dtype, int dev,
                                   ferrum_stream_t stream);
/* GPT-OSS clamped SwiGLU on interleaved gate/up: g = min(x[r, 2j], limit),
 * u = clamp(x[r, 2j+1], -limit, limit), out[r, j] = (u + 1) * g * sigmoid(alpha * g)
 * for j < logical_d and 0 for logical_d <= j < physical_d; x [rows, 2*logical_d],
 * out [rows, physical_d]; F16/BF16. */
FERRUM_API int ferrum_gpt_oss_swiglu(const void* x, void* out, int rows, int logical_d,
                                     int physical_d, float alpha, float limit, int dtype, int dev,
                                     ferrum_stream_t stream);
/* out[t, :] = sum over j < top_k of x[t * top_k + j, :]; x [tokens*top_k, d],
 * out [tokens, d]; F16/BF16, fp32 accumulation. */
FERRUM_API int ferrum_moe_sum(const void* x, void* out, int tokens, int top_k, int d, int dtype,
                              int dev, ferrum_stream_t stream);

#ifdef __cplusplus
}
#endif

#endif /* FERRUM_MARLIN_H */
