// The fused-MoE Marlin entry points with vLLM's calling convention
// (sorted_token_ids / expert_ids): every rule of ferrum_marlin.h is checked
// before the device is touched, then one routed launch of the dense kernel
// covers all experts; the slab count is read on the device (no host sync).
#include <stdint.h>
#include <stdlib.h>

#include "../dense/launch_plan.h"
#include "../status.h"
#include "profile_sink.h"
#include "routed_launch.h"

namespace ferrum::moe {

namespace {

struct MoeCall {
  const char* entry;
  AType a_type;
  WType w_type;  // U4B8 or U4 (chosen by has_zp), FE4M3FN, FE2M1
  const void* a;
  const void* b;
  void* c;
  void* c_tmp;
  const void* scales;
  const void* zeros;
  const void* bias;
  void* workspace;
  const int* sorted_token_ids;
  const int* expert_ids;
  const int* num_tokens_past_padded;
  const float* topk_weights;
  int moe_block_size, top_k, mul_topk_weights, is_ep;
  int prob_m, prob_n, prob_k, group_size, has_zp, dev;
  cudaStream_t stream;
  int use_atomic_add, use_fp32_reduce;
  // The _ex entries (ferrum_marlin.h); zero for the others.
  int add_rows_div = 0;
  void* clear = nullptr;
  size_t clear_bytes = 0;
  int routing_flags = 0;  // FERRUM_MOE_ROUTING_*
  bool direct() const { return (routing_flags & FERRUM_MOE_ROUTING_DIRECT) != 0; }
};

template <class... Ts>
int invalid(const char* fmt, Ts... args) {
  return fail(FERRUM_STAGE_ARGUMENT, FERRUM_STATUS_INVALID_VALUE, fmt, args...);
}

template <class... Ts>
int bad_shape(const char* fmt, Ts... args) {
  return fail(FERRUM_STAGE_SHAPE, FERRUM_STATUS_INVALID_VALUE, fmt, args...);
}

int check_group(const MoeCall& m) {
  const int g = m.group_size;
  switch (m.w_type) {
    case WType::FE4M3FN:
      if (g != -1 && g != 128)
        return bad_shape("%s: E4M3 group_size must be -1 or 128, got %d", m.entry, g);
      break;
    case WType::FE2M1:
      if (g != 32)
        return bad_shape("%s: MXFP4 E2M1/E8M0 group_size must be exactly 32, got %d", m.entry, g);
      break;
    default:
      if (!int_group_size_served(g))
        return bad_shape("%s: INT4 group_size must be -1, 32, 64 or a power of two >= 128, got %d", m.entry, g);
  }
  if (g > 0 && m.prob_k % g != 0)
    return bad_shape("%s: prob_k %d must be divisible by group_size %d", m.entry, m.prob_k, g);
  return 0;
}

// The _ex entries' own arguments.
int check_layer_extras(const MoeCall& m) {
  const char* e = m.entry;
  if (m.add_rows_div < 0) return invalid("%s: add_rows_div must be >= 0, got %d", e, m.add_rows_div);
  if (m.add_rows_div > 0) {
    if (m.use_atomic_add == 0)
      return invalid("%s: add_rows_div > 0 adds into a zeroed C and needs use_atomic_add", e);
    if ((static_cast<int64_t>(m.prob_m) * m.top_k) % m.add_rows_div != 0)
      return bad_shape("%s: add_rows_div %d must divide prob_m * top_k = %lld", e, m.add_rows_div,
                       static_cast<long long>(m.prob_m) * m.top_k);
  }
  if ((m.clear == nullptr) != (m.clear_bytes == 0))
    return invalid("%s: clear_bytes must be positive exactly when clear is non-null", e);
  if ((m.routing_flags & FERRUM_MOE_ROUTING_SETTLED) && m.clear != nullptr && !m.direct())
    return invalid("%s: a settled launch clears only with direct routing (FERRUM_MOE_ROUTING_DIRECT)", e);
  if (m.direct() && m.moe_block_size != 8)
    return invalid("%s: direct routing puts one row in each slab and needs moe_block_size 8, got %d", e,
                   m.moe_block_size);
  if (m.clear != nullptr) {
    if (int st = check_pointer(e, "clear", m.clear, 16)) return st;
    if (m.clear_bytes % 16 != 0)
      return invalid("%s: clear_bytes %zu must be a multiple of 16", e, m.clear_bytes);
    if (m.clear_bytes > (size_t{1} << 56))
      return invalid("%s: clear_bytes %zu is beyond any device's memory", e, m.clear_bytes);
  }
  return 0;
}

// Every rule that needs no device, in the order of the seeds' validation.
int check_call(const MoeCall& m) {
  const char* e = m.entry;
  const bool mxfp4 = m.w_type == WType::FE2M1;
  if (int st = check_pointer(e, "a", m.a, 16)) return st;
  if (int st = check_pointer(e, "b", m.b, 16)) return st;
  if (int st = check_pointer(e, "c", m.c, 16)) return st;
  if (mxfp4) {
    if (int st = check_pointer(e, "b_bias", m.bias, 16)) return st;
  }
  if (int st = check_pointer(e, "b_scales", m.scales, 16)) return st;
  if (int st = check_pointer(e, "workspace", m.workspace, 4)) return st;
  constexpr int kKnownFlags = FERRUM_MOE_ROUTING_SETTLED | FERRUM_MOE_ROUTING_DIRECT;
  if ((m.routing_flags & ~kKnownFlags) != 0)
    return invalid("%s: routing_flags %d holds bits other than FERRUM_MOE_ROUTING_SETTLED and _DIRECT", e,
                   m.routing_flags);
  if (m.direct()) {
    if (m.sorted_token_ids != nullptr || m.num_tokens_past_padded != nullptr)
      return invalid("%s: direct routing takes no sorted_token_ids or num_tokens_past_padded (pass NULL)", e);
  } else {
    if (int st = check_pointer(e, "sorted_token_ids", m.sorted_token_ids, 4)) return st;
  }
  if (int st = check_pointer(e, "expert_ids", m.expert_ids, 4)) return st;
  if (!m.direct()) {
    if (int st = check_pointer(e, "num_tokens_past_padded", m.num_tokens_past_padded, 4)) return st;
  }
  if (m.c_tmp != nullptr) {
    if (int st = check_pointer(e, "c_tmp", m.c_tmp, 16)) return st;
  }
  if (m.zeros != nullptr) {
    if (int st = check_pointer(e, "b_zeros", m.zeros, 16)) return st;
  }
  if (m.topk_weights != nullptr) {
    if (int st = check_pointer(e, "topk_weights", m.topk_weights, 4)) return st;
  }
  if (m.prob_m <= 0 || m.prob_n <= 0 || m.prob_k <= 0)
    return invalid("%s: prob_m, prob_n, and prob_k must be positive, got [%d, %d, %d]", e, m.prob_m,
                   m.prob_n, m.prob_k);
  const int b = m.moe_block_size;
  if (b != 8 && b != 16 && b != 32 && b != 48 && b != 64)
    return invalid("%s: unsupported moe_block_size %d; expected one of 8, 16, 32, 48, 64", e, b);
  if (m.top_k <= 0) return invalid("%s: top_k must be positive, got %d", e, m.top_k);
  if (static_cast<int64_t>(m.prob_m) * m.top_k > INT32_MAX)
    return invalid("%s: prob_m * top_k overflows the kernel's i32 output-row domain", e);
  if (m.prob_n % 64 != 0)
    return bad_shape("%s: prob_n %d must be divisible by the Marlin minimum thread width 64", e, m.prob_n);
  if (m.prob_k % 64 != 0)
    return bad_shape("%s: prob_k %d must be divisible by the Marlin minimum thread width 64", e, m.prob_k);
  if (m.prob_n > FERRUM_MAX_DIM || m.prob_k > FERRUM_MAX_DIM)
    return bad_shape("%s: prob_n %d and prob_k %d must be at most FERRUM_MAX_DIM=%d", e, m.prob_n, m.prob_k,
                     FERRUM_MAX_DIM);
  if (int st = check_group(m)) return st;
  if (m.dev < 0) return invalid("%s: device_ordinal must be non-negative, got %d", e, m.dev);
  if ((m.has_zp != 0) != (m.zeros != nullptr))
    return invalid("%s: has_zero_points must exactly match the zero_points pointer", e);
  if (m.w_type == WType::FE4M3FN && (m.has_zp != 0 || m.zeros != nullptr))
    return invalid("%s: E4M3 forbids zero points", e);
  if (m.mul_topk_weights != 0 && m.topk_weights == nullptr)
    return invalid("%s: mul_topk_weights requires a non-null topk_weights pointer", e);
  if ((m.use_atomic_add != 0) == (m.use_fp32_reduce != 0))
    return invalid("%s: exactly one of use_atomic_add and use_fp32_reduce must be enabled", e);
  if ((m.use_fp32_reduce != 0) != (m.c_tmp != nullptr))
    return invalid("%s: use_fp32_reduce must exactly match the c_tmp pointer", e);
  return check_layer_extras(m);
}

// Whether a layer launch of `rows` routed rows (prob_m * top_k, added into a
// zeroed C) takes the 64-deep 256-column tile instead of the 128-deep one:
// twice as many, smaller units, for a decode step whose little work the
// 128-deep tiles would spread unevenly over the blocks. Measured on whole
// layers (H200, fused_moe, session 37, µs): at 4 rows 64-deep wins (GPT-OSS-
// like M = 1 36.9 -> 35.3); at 8 rows 128-deep wins (Qwen-like M = 1 19.9 ->
// 19.4, GPT-OSS-like M = 2 56.3 -> 55.3) except where its units would be fewer
// than two per SM (the Qwen-like FP8 TP-4 shard's gate/up, n = 384: 256 units
// on 132 SMs; 15.5 -> 15.8 with 128-deep); from 16 rows 128-deep everywhere.
bool decode_step_takes_k64(int64_t rows, int n, int k, int sms) {
  constexpr int64_t kFewRows = 4, kFewRowsOrSparse = 8;
  if (rows <= kFewRows) return true;
  if (rows > kFewRowsOrSparse) return false;
  const int64_t deep_units = rows * ((n + 255) / 256) * ((k + 127) / 128);
  return deep_units < 2ll * sms;
}

// FERRUM_VLLM_MOE_THREAD_K / _THREAD_N, when both are set: the forced tile.
// Returns 1 when a tile is forced, 0 when not, a status when it is illegal.
int env_tile(const char* entry, NConfig* nc) {
  const char* tk = getenv("FERRUM_VLLM_MOE_THREAD_K");
  const char* tn = getenv("FERRUM_VLLM_MOE_THREAD_N");
  if (tk == nullptr || tn == nullptr || *tk == '\0' || *tn == '\0') return 0;
  const int k = atoi(tk), n = atoi(tn);
  if (!routed_forced_config(k, n, nc))
    return invalid("%s: FERRUM_VLLM_MOE_THREAD_K=%s / _THREAD_N=%s name no tile; use (128,128), "
                   "(128,64), (64,256), (64,128) or (128,256)",
                   entry, tk, tn);
  return 1;
}

int run(const MoeCall& m) {
  clear_error();
  if (int st = check_call(m)) return st;
  const int m8 = m.moe_block_size / 8;
  const int bits = weight_bits(m.w_type);
  NConfig nc{};
  int forced = env_tile(m.entry, &nc);
  if (forced < 0 || forced > 1) return forced;
  if (forced && nc == NConfig::N256_K128 && m8 > dense::kDeepTileMaxM8)
    return bad_shape("%s: the tile (thread_k=128, thread_n=256) serves moe_block_size <= 16, got %d", m.entry,
                     m.moe_block_size);
  dense::DeviceFacts facts{};
  if (int st = dense::query_device(m.entry, m.dev, -1, &facts)) return st;
  // n, k multiples of 64: always a tile.
  if (!forced) {
    routed_auto_config(m8, m.prob_n, m.prob_k, facts.hopper, &nc);
    const int64_t rows = static_cast<int64_t>(m.prob_m) * m.top_k;
    if (m.add_rows_div > 0 && nc == NConfig::N256_K128 && decode_step_takes_k64(rows, m.prob_n, m.prob_k, facts.sms))
      nc = NConfig::N256_K64;
  }
  const TileInfo tile = routed_tile_info(m8, nc, bits);
  // The kernels count work units (slab, column tile, k tile) in 32 bits, and a
  // routing block holds at least one routed row: at most prob_m * top_k slabs.
  const int64_t unit_bound = static_cast<int64_t>(m.prob_m) * m.top_k * ((m.prob_n + tile.n_tile - 1) / tile.n_tile) *
                             ((m.prob_k + tile.k_tile - 1) / tile.k_tile);
  if (unit_bound > INT32_MAX)
    return bad_shape("%s: prob_m * top_k = %lld routed rows in %d x %d tiles may make more than 2^31 work units",
                     m.entry, static_cast<long long>(m.prob_m) * m.top_k, tile.k_tile, tile.n_tile);
  if (static_cast<size_t>(facts.max_smem) < tile.smem_bytes)
    return fail(FERRUM_STAGE_MAX_SHARED_MEMORY, cudaErrorInvalidConfiguration,
                "%s: tile needs %zu bytes of shared memory, device %d offers %d", m.entry,
                tile.smem_bytes, m.dev, facts.max_smem);
  DeviceGuard guard;
  if (int st = guard.enter(m.entry, m.dev)) return st;

  const int n = m.prob_n, k = m.prob_k;
  const int64_t groups = m.group_size == -1 ? 1 : k / m.group_size;
  const int scale_bytes = m.w_type == WType::FE2M1 ? 1 : 2;
  Args args{};
  args.a = m.a;
  args.b = m.b;
  args.c = m.c;
  args.s = m.scales;
  args.z = m.zeros;
  args.bias = m.bias;
  args.locks = static_cast<int*>(m.workspace);
  args.c_tmp = static_cast<float*>(m.c_tmp);
  args.m = m.prob_m * m.top_k;
  args.n = n;
  args.k = k;
  args.a_row_int4 = k / 8;
  args.b_row_int4 = bits == 4 ? n / 2 : n;
  args.s_row_halves = n;
  args.z_row_int4 = n / 32;
  args.group_shift = m.group_size == -1 ? -1 : log2_exact(m.group_size);
  args.lock_by_range = true;
  args.fp32_reduce = m.use_fp32_reduce != 0;
  dense::Routing& r = args.route;
  r.sorted_ids = m.sorted_token_ids;
  r.slab_experts = m.expert_ids;
  r.used_ids = m.num_tokens_past_padded;
  r.row_weights = m.mul_topk_weights != 0 ? m.topk_weights : nullptr;
  r.rows = m.prob_m * m.top_k;
  // A direct launch's slabs are its routed rows, known here: the host splits
  // its work (launch_resident), so its blocks start without that arithmetic.
  if (m.direct()) args.slabs = r.rows;
  r.top_k = m.top_k;
  r.b_expert_int4 = static_cast<long long>(k / 16) * args.b_row_int4;
  r.s_expert_bytes = groups * n * scale_bytes;
  r.z_expert_int4 = groups * n / 32;
  r.bias_expert_bytes = static_cast<long long>(n) * 2;
  r.bias_p32 = m.w_type == WType::FE2M1;
  args.add_rows_div = m.add_rows_div;
  args.clear = static_cast<int4*>(m.clear);
  args.clear_int4 = static_cast<long long>(m.clear_bytes / 16);
  args.routing_settled = (m.routing_flags & FERRUM_MOE_ROUTING_SETTLED) != 0;
  args.a_after_previous_kernel = args.routing_settled;

  int stage = FERRUM_STAGE_KERNEL_LAUNCH;
  const cudaError_t err = launch_routed_gemm(m.a_type, m.w_type, m8, m.direct() ? Route::Direct : Route::Sorted, nc, args,
                                             Launch{facts.sms, m.dev, m.stream, /*overlap_previous=*/true}, &stage);
  if (err != cudaSuccess) return fail_cuda(stage, err, m.entry);
  record_launch(LaunchRecord{m.entry, m.prob_m, n, k, tile.k_tile, tile.n_tile, m.moe_block_size, m.top_k,
                             m.group_size, bits, m.has_zp != 0, m.mul_topk_weights != 0, m.is_ep != 0,
                             m.use_fp32_reduce != 0, facts.sms});
  return 0;
}

}  // namespace

}  // namespace ferrum::moe

using ferrum::AType;
using ferrum::WType;

namespace {

// The INT4 / FP8 x FP16 entries and their layer variants (extras zero for the former).
int f16_entry(const char* entry, bool fp8, const void* a, const void* b, void* c, void* c_tmp, const void* b_scales,
              const void* b_zeros, void* workspace, const int* sorted_token_ids, const int* expert_ids,
              const int* num_tokens_past_padded, const float* topk_weights, int moe_block_size, int top_k,
              int mul_topk_weights, int is_ep, int prob_m, int prob_n, int prob_k, int group_size, int has_zp,
              int dev, ferrum_stream_t stream, int use_atomic_add, int use_fp32_reduce, int add_rows_div,
              void* clear, size_t clear_bytes, int routing_flags) {
  const WType w = fp8 ? WType::FE4M3FN : has_zp ? WType::U4 : WType::U4B8;
  return ferrum::moe::run({entry, AType::F16, w, a, b, c, c_tmp, b_scales, b_zeros, nullptr, workspace,
                           sorted_token_ids, expert_ids, num_tokens_past_padded, topk_weights, moe_block_size, top_k,
                           mul_topk_weights, is_ep, prob_m, prob_n, prob_k, group_size, has_zp, dev,
                           reinterpret_cast<cudaStream_t>(stream), use_atomic_add, use_fp32_reduce, add_rows_div,
                           clear, clear_bytes, routing_flags});
}

int mxfp4_entry(const char* entry, const void* a, const void* b, void* c, void* c_tmp, const void* b_bias,
                const void* b_scales, void* workspace, const int* sorted_token_ids, const int* expert_ids,
                const int* num_tokens_past_padded, const float* topk_weights, int moe_block_size, int top_k,
                int mul_topk_weights, int is_ep, int prob_m, int prob_n, int prob_k, int group_size, int dev,
                ferrum_stream_t stream, int use_atomic_add, int use_fp32_reduce, int add_rows_div, void* clear,
                size_t clear_bytes, int routing_flags) {
  return ferrum::moe::run({entry, AType::BF16, WType::FE2M1, a, b, c, c_tmp, b_scales, nullptr, b_bias, workspace,
                           sorted_token_ids, expert_ids, num_tokens_past_padded, topk_weights, moe_block_size, top_k,
                           mul_topk_weights, is_ep, prob_m, prob_n, prob_k, group_size, 0, dev,
                           reinterpret_cast<cudaStream_t>(stream), use_atomic_add, use_fp32_reduce, add_rows_div,
                           clear, clear_bytes, routing_flags});
}

}  // namespace

#define FERRUM_F16_MOE_PARAMS                                                                                    \
  const void *a, const void *b, void *c, void *c_tmp, const void *b_scales, const void *b_zeros, void *workspace, \
      const int *sorted_token_ids, const int *expert_ids, const int *num_tokens_past_padded,                    \
      const float *topk_weights, int moe_block_size, int top_k, int mul_topk_weights, int is_ep, int prob_m,     \
      int prob_n, int prob_k, int group_size, int has_zp, int dev, ferrum_stream_t stream, int use_atomic_add,  \
      int use_fp32_reduce
#define FERRUM_F16_MOE_ARGS                                                                                   \
  a, b, c, c_tmp, b_scales, b_zeros, workspace, sorted_token_ids, expert_ids, num_tokens_past_padded,          \
      topk_weights, moe_block_size, top_k, mul_topk_weights, is_ep, prob_m, prob_n, prob_k, group_size, has_zp, \
      dev, stream, use_atomic_add, use_fp32_reduce
#define FERRUM_MXFP4_MOE_PARAMS                                                                               \
  const void *a, const void *b, void *c, void *c_tmp, const void *b_bias, const void *b_scales, void *workspace, \
      const int *sorted_token_ids, const int *expert_ids, const int *num_tokens_past_padded,                    \
      const float *topk_weights, int moe_block_size, int top_k, int mul_topk_weights, int is_ep, int prob_m,     \
      int prob_n, int prob_k, int group_size, int dev, ferrum_stream_t stream, int use_atomic_add,              \
      int use_fp32_reduce
#define FERRUM_MXFP4_MOE_ARGS                                                                                 \
  a, b, c, c_tmp, b_bias, b_scales, workspace, sorted_token_ids, expert_ids, num_tokens_past_padded,           \
      topk_weights, moe_block_size, top_k, mul_topk_weights, is_ep, prob_m, prob_n, prob_k, group_size, dev,    \
      stream, use_atomic_add, use_fp32_reduce
// The header declares each of these in full; a definition that disagreed with
// its declaration would not compile (two C functions of one name).

extern "C" {

FERRUM_API int ferrum_vllm_marlin_moe_f16(FERRUM_F16_MOE_PARAMS) {
  return f16_entry("ferrum_vllm_marlin_moe_f16", false, FERRUM_F16_MOE_ARGS, 0, nullptr, 0, 0);
}

FERRUM_API int ferrum_vllm_marlin_moe_fp8_f16(FERRUM_F16_MOE_PARAMS) {
  return f16_entry("ferrum_vllm_marlin_moe_fp8_f16", true, FERRUM_F16_MOE_ARGS, 0, nullptr, 0, 0);
}

FERRUM_API int ferrum_vllm_marlin_moe_mxfp4_bf16(FERRUM_MXFP4_MOE_PARAMS) {
  return mxfp4_entry("ferrum_vllm_marlin_moe_mxfp4_bf16", FERRUM_MXFP4_MOE_ARGS, 0, nullptr, 0, 0);
}

FERRUM_API int ferrum_vllm_marlin_moe_f16_ex(FERRUM_F16_MOE_PARAMS, int add_rows_div, void* clear,
                                             size_t clear_bytes, int routing_flags) {
  return f16_entry("ferrum_vllm_marlin_moe_f16_ex", false, FERRUM_F16_MOE_ARGS, add_rows_div, clear, clear_bytes,
                   routing_flags);
}

FERRUM_API int ferrum_vllm_marlin_moe_fp8_f16_ex(FERRUM_F16_MOE_PARAMS, int add_rows_div, void* clear,
                                                 size_t clear_bytes, int routing_flags) {
  return f16_entry("ferrum_vllm_marlin_moe_fp8_f16_ex", true, FERRUM_F16_MOE_ARGS, add_rows_div, clear,
                   clear_bytes, routing_flags);
}

FERRUM_API int ferrum_vllm_marlin_moe_mxfp4_bf16_ex(FERRUM_MXFP4_MOE_PARAMS, int add_rows_div, void* clear,
                                                    size_t clear_bytes, int routing_flags) {
  return mxfp4_entry("ferrum_vllm_marlin_moe_mxfp4_bf16_ex", FERRUM_MXFP4_MOE_ARGS, add_rows_div, clear,
                     clear_bytes, routing_flags);
}

}  // extern "C"
