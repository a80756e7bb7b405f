// marlin_cuda_moe: the bucketed MoE W4A16 GEMM. One routed launch covers every
// expert of a bucket (one slab per expert, its rows at a_row_offsets[e]); the
// experts' weights, scales and locks sit at fixed strides.
#include <stdint.h>

#include "../dense/launch_plan.h"
#include "../status.h"
#include "routed_launch.h"

namespace ferrum::moe {

namespace {

constexpr const char* kEntry = "marlin_cuda_moe";

template <class... Ts>
int invalid(const char* fmt, Ts... args) {
  return fail(FERRUM_STAGE_ARGUMENT, FERRUM_STATUS_INVALID_VALUE, fmt, kEntry, args...);
}

template <class... Ts>
int bad_shape(const char* fmt, Ts... args) {
  return fail(FERRUM_STAGE_SHAPE, FERRUM_STATUS_INVALID_VALUE, fmt, kEntry, args...);
}

}  // namespace

int bucketed(const void* A, const void* B, void* C, const void* s, int prob_m, int prob_n, int prob_k,
             void* workspace, const int* a_row_offsets, const int* tokens_per_expert,
             const int* active_expert_ids, int expert_count, int b_int4_per_expert, int s_int4_per_expert,
             int locks_i32_per_expert, int groupsize, int dev, cudaStream_t stream, int thread_k,
             int thread_n, int sms, int prob_n_full) {
  clear_error();
  if (int st = check_pointer(kEntry, "A", A, 16)) return st;
  if (int st = check_pointer(kEntry, "B", B, 16)) return st;
  if (int st = check_pointer(kEntry, "C", C, 16)) return st;
  if (int st = check_pointer(kEntry, "s", s, 16)) return st;
  if (int st = check_pointer(kEntry, "workspace", workspace, 4)) return st;
  if (int st = check_pointer(kEntry, "a_row_offsets", a_row_offsets, 4)) return st;
  if (int st = check_pointer(kEntry, "tokens_per_expert", tokens_per_expert, 4)) return st;
  if (active_expert_ids != nullptr) {
    if (int st = check_pointer(kEntry, "active_expert_ids", active_expert_ids, 4)) return st;
  }
  if (expert_count < 0) return invalid("%s: expert_count=%d must be >= 0", expert_count);
  if (prob_m != 16 && prob_m != 32 && prob_m != 48 && prob_m != 64)
    return bad_shape("%s: prob_m must be in {16, 32, 48, 64}, got %d", prob_m);
  if (prob_n <= 0 || prob_n % 64 != 0) return bad_shape("%s: prob_n=%d must be a positive multiple of 64", prob_n);
  if (prob_k <= 0 || prob_k % 64 != 0) return bad_shape("%s: prob_k=%d must be a positive multiple of 64", prob_k);
  if (groupsize != -1 && groupsize != 128)
    return bad_shape("%s: groupsize=%d must be -1 (channelwise) or 128", groupsize);
  if (groupsize == 128 && prob_k % 128 != 0)
    return bad_shape("%s: prob_k=%d must be divisible by groupsize 128", prob_k);
  const int n_full = prob_n_full == -1 ? prob_n : prob_n_full;
  if (n_full < prob_n || n_full % 64 != 0)
    return bad_shape("%s: prob_n_full=%d must be -1 or a multiple of 64 >= prob_n=%d", prob_n_full, prob_n);
  if (n_full > FERRUM_MAX_DIM || prob_k > FERRUM_MAX_DIM)
    return bad_shape("%s: prob_n_full=%d and prob_k=%d must be at most FERRUM_MAX_DIM=%d", n_full, prob_k,
                     FERRUM_MAX_DIM);
  const int64_t b_need = static_cast<int64_t>(prob_k) * n_full / 32;
  if (b_int4_per_expert < b_need)
    return bad_shape("%s: b_int4_per_expert=%d is below one expert's weight (%lld)", b_int4_per_expert,
                     static_cast<long long>(b_need));
  const int64_t groups = groupsize == -1 ? 1 : prob_k / 128;
  const int64_t s_need = groups * n_full / 8;
  if (s_int4_per_expert < s_need)
    return bad_shape("%s: s_int4_per_expert=%d is below one expert's scales (%lld)", s_int4_per_expert,
                     static_cast<long long>(s_need));
  if (locks_i32_per_expert < prob_n / 64)
    return bad_shape("%s: locks_i32_per_expert=%d must be >= prob_n/64=%d", locks_i32_per_expert, prob_n / 64);
  if (sms != -1 && sms < 1) return invalid("%s: sms=%d must be -1 (all) or >= 1", sms);
  if (dev < 0) return invalid("%s: dev=%d must be >= 0", dev);
  const int m8 = prob_m / 8;
  NConfig nc{};
  if (thread_k == -1 && thread_n == -1) {
    // n, k multiples of 64: always a tile (the bucketed kernels are the 8-warp ones).
    routed_auto_config(m8, prob_n, prob_k, /*hopper=*/false, &nc);
  } else if (!routed_forced_config(thread_k, thread_n, &nc)) {
    return invalid("%s: (thread_k=%d, thread_n=%d) must be -1/-1 or (128,128), (128,64), (64,256), (64,128), "
                   "(128,256) for prob_m 16",
                   thread_k, thread_n);
  }
  if (nc == NConfig::N256_K128 && m8 > dense::kDeepTileMaxM8)
    return bad_shape("%s: the tile (thread_k=128, thread_n=256) serves prob_m <= 16, got %d", prob_m);
  const TileInfo tile = routed_tile_info(m8, nc, 4);
  const int64_t n_tiles = (prob_n + tile.n_tile - 1) / tile.n_tile;
  const int64_t k_tiles = (prob_k + tile.k_tile - 1) / tile.k_tile;
  if (static_cast<int64_t>(expert_count) * n_tiles * k_tiles > INT32_MAX)
    return bad_shape("%s: problem too large: %d experts", expert_count);
  if (expert_count == 0) return 0;

  dense::DeviceFacts facts{};
  if (int st = dense::query_device(kEntry, dev, sms, &facts)) return st;
  if (static_cast<size_t>(facts.max_smem) < tile.smem_bytes)
    return fail(FERRUM_STAGE_MAX_SHARED_MEMORY, cudaErrorInvalidConfiguration,
                "%s: tile needs %zu bytes of shared memory, device %d offers %d", kEntry, tile.smem_bytes,
                dev, facts.max_smem);
  DeviceGuard guard;
  if (int st = guard.enter(kEntry, dev)) return st;

  Args args{};
  args.a = A;
  args.b = B;
  args.c = C;
  args.s = s;
  args.locks = static_cast<int*>(workspace);
  args.m = expert_count * prob_m;
  args.n = prob_n;
  args.k = prob_k;
  args.a_row_int4 = prob_k / 8;
  args.b_row_int4 = n_full / 2;
  args.s_row_halves = n_full;
  args.group_shift = groupsize == -1 ? -1 : 7;
  args.slabs = expert_count;
  dense::Routing& r = args.route;
  r.slab_experts = active_expert_ids;
  r.row_offsets = a_row_offsets;
  r.row_counts = tokens_per_expert;
  r.locks_per_expert = locks_i32_per_expert;
  r.b_expert_int4 = b_int4_per_expert;
  r.s_expert_bytes = static_cast<long long>(s_int4_per_expert) * 16;
  int stage = FERRUM_STAGE_KERNEL_LAUNCH;
  const cudaError_t err = launch_routed_gemm(AType::F16, WType::U4B8, m8, Route::Bucketed, nc, args,
                                             Launch{facts.sms, dev, stream}, &stage);
  if (err != cudaSuccess) return fail_cuda(stage, err, kEntry);
  return 0;
}

}  // namespace ferrum::moe

extern "C" FERRUM_API int marlin_cuda_moe(const void* A, const void* B, void* C, const void* s, int prob_m,
                                          int prob_n, int prob_k, void* workspace, const int* a_row_offsets,
                                          const int* tokens_per_expert, const int* active_expert_ids,
                                          int expert_count, int b_int4_per_expert, int s_int4_per_expert,
                                          int locks_i32_per_expert, int groupsize, int dev,
                                          ferrum_stream_t stream, int thread_k, int thread_n, int sms,
                                          int prob_n_full) {
  return ferrum::moe::bucketed(A, B, C, s, prob_m, prob_n, prob_k, workspace, a_row_offsets, tokens_per_expert,
                               active_expert_ids, expert_count, b_int4_per_expert, s_int4_per_expert,
                               locks_i32_per_expert, groupsize, dev, reinterpret_cast<cudaStream_t>(stream),
                               thread_k, thread_n, sms, prob_n_full);
}
