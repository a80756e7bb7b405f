// ferrum_topk_softmax: the MoE router. One warp per token holds the token's
// logits in registers (kPerLane per lane: expert lane + 32 * i), takes the
// softmax denominator with two warp reductions, then picks the top_k experts
// one round at a time with a warp arg-max.
//
// Ranking uses the fp32 logits themselves: the softmax keeps their order, and
// ranking before exp() cannot invent ties that rounding would create. Ties go
// to the lower expert id; NaN logits rank (and weigh) as -inf so every id
// written names a real expert.
#include <math.h>
#include <stdint.h>

#include "../core/chained_launch.h"
#include "../core/ptx.cuh"
#include "entry_checks.h"
#include "values.cuh"

namespace ferrum::ops {

namespace {

constexpr int kWarpsPerBlock = 4;
constexpr unsigned kFullMask = 0xffffffffu;

// (value, id) order of the selection: larger value first, then lower id.
__device__ __forceinline__ bool ranks_before(float v, int e, float best_v, int best_e) {
  return v > best_v || (v == best_v && e < best_e);
}

template <class T, int kPerLane>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    topk_softmax_kernel(const T* __restrict__ logits, int num_tokens, int num_experts, int top_k,
                        bool renormalize, float* __restrict__ weights, int* __restrict__ ids) {
  ptx::enter_chain();
  const int token = blockIdx.x * kWarpsPerBlock + threadIdx.x / 32;
  if (token >= num_tokens) return;  // whole warps leave together
  const int lane = threadIdx.x % 32;
  const T* row = logits + static_cast<size_t>(token) * num_experts;

  float v[kPerLane];
  float max_v = -INFINITY;
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int e = lane + 32 * i;
    const float x = e < num_experts ? to_float(row[e]) : -INFINITY;
    v[i] = isnan(x) ? -INFINITY : x;
    max_v = fmaxf(max_v, v[i]);
  }
  for (int o = 16; o > 0; o /= 2) max_v = fmaxf(max_v, __shfl_xor_sync(kFullMask, max_v, o));
  float sum = 0.0f;
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) sum += expf(v[i] - max_v);  // padding slots add exp(-inf) = 0
  for (int o = 16; o > 0; o /= 2) sum += __shfl_xor_sync(kFullMask, sum, o);

  float* w_row = weights + static_cast<size_t>(token) * top_k;
  int* id_row = ids + static_cast<size_t>(token) * top_k;
  unsigned taken = 0;  // bit i: this lane's expert lane + 32 * i is already picked
  float picked = 0.0f;
  for (int r = 0; r < top_k; ++r) {
    float best_v = -INFINITY;
    int best_e = INT32_MAX;  // no candidate yet; any real expert ranks before it
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      const int e = lane + 32 * i;
      if (e < num_experts && !((taken >> i) & 1u) && ranks_before(v[i], e, best_v, best_e)) {
        best_v = v[i];
        best_e = e;
      }
    }
    // The order is total (ids are unique), so every lane ends with the same winner.
    for (int o = 16; o > 0; o /= 2) {
      const float other_v = __shfl_xor_sync(kFullMask, best_v, o);
      const int other_e = __shfl_xor_sync(kFullMask, best_e, o);
      if (ranks_before(other_v, other_e, best_v, best_e)) {
        best_v = other_v;
        best_e = other_e;
      }
    }
    if (best_e % 32 == lane) taken |= 1u << (best_e / 32);
    const float p = expf(best_v - max_v) / sum;
    picked += p;
    if (lane == 0) {
      w_row[r] = p;
      id_row[r] = best_e;
    }
  }
  if (renormalize) {
    __syncwarp();  // makes lane 0's weights visible to the lanes that rescale them
    for (int r = lane; r < top_k; r += 32) w_row[r] /= picked;
  }
}

template <class T, int kPerLane>
cudaError_t launch(const void* logits, int num_tokens, int num_experts, int top_k, bool renormalize,
                   float* weights, int* ids, cudaStream_t stream) {
  const int blocks = static_cast<int>((static_cast<long long>(num_tokens) + kWarpsPerBlock - 1) / kWarpsPerBlock);
  return launch_chained(topk_softmax_kernel<T, kPerLane>, dim3(blocks), dim3(kWarpsPerBlock * 32), 0, stream,
                 static_cast<const T*>(logits), num_tokens, num_experts, top_k, renormalize, weights, ids);
}

// The narrowest register row that holds num_experts logits.
template <class T>
cudaError_t launch_for_experts(const void* logits, int num_tokens, int num_experts, int top_k, bool renormalize,
                               float* weights, int* ids, cudaStream_t stream) {
  if (num_experts <= 32) return launch<T, 1>(logits, num_tokens, num_experts, top_k, renormalize, weights, ids, stream);
  if (num_experts <= 64) return launch<T, 2>(logits, num_tokens, num_experts, top_k, renormalize, weights, ids, stream);
  if (num_experts <= 128)
    return launch<T, 4>(logits, num_tokens, num_experts, top_k, renormalize, weights, ids, stream);
  if (num_experts <= 256)
    return launch<T, 8>(logits, num_tokens, num_experts, top_k, renormalize, weights, ids, stream);
  if (num_experts <= 512)
    return launch<T, 16>(logits, num_tokens, num_experts, top_k, renormalize, weights, ids, stream);
  return launch<T, 32>(logits, num_tokens, num_experts, top_k, renormalize, weights, ids, stream);
}

static_assert(kMaxExperts == 32 * 32, "the widest register row holds 32 logits per lane");

}  // namespace

}  // namespace ferrum::ops

using namespace ferrum;
using namespace ferrum::ops;

extern "C" int ferrum_topk_softmax(const void* logits, int dtype, int num_tokens, int num_experts, int top_k,
                                   int renormalize, float* topk_weights, int* topk_ids, int dev,
                                   ferrum_stream_t stream) {
  constexpr const char* kEntry = "ferrum_topk_softmax";
  clear_error();
  if (int st = check_dtype(kEntry, dtype, true)) return st;
  if (int st = check_pointer(kEntry, "logits", logits, element_bytes(dtype))) return st;
  if (int st = check_pointer(kEntry, "topk_weights", topk_weights, 4)) return st;
  if (int st = check_pointer(kEntry, "topk_ids", topk_ids, 4)) return st;
  if (int st = check_positive(kEntry, "num_tokens", num_tokens)) return st;
  if (int st = check_positive(kEntry, "num_experts", num_experts)) return st;
  if (int st = check_positive(kEntry, "top_k", top_k)) return st;
  if (renormalize != 0 && renormalize != 1)
    return invalid("%s: renormalize=%d must be 0 or 1", kEntry, renormalize);
  if (num_experts > kMaxExperts)
    return bad_shape("%s: num_experts=%d exceeds the %d experts a router warp holds", kEntry, num_experts,
                     kMaxExperts);
  if (top_k > num_experts)
    return bad_shape("%s: top_k=%d must be <= num_experts=%d", kEntry, top_k, num_experts);
  DeviceGuard guard;
  if (int st = guard.enter(kEntry, dev)) return st;
  const cudaStream_t s = reinterpret_cast<cudaStream_t>(stream);
  const bool renorm = renormalize == 1;
  cudaError_t err;
  if (dtype == FERRUM_DTYPE_F16)
    err = launch_for_experts<half>(logits, num_tokens, num_experts, top_k, renorm, topk_weights, topk_ids, s);
  else if (dtype == FERRUM_DTYPE_BF16)
    err = launch_for_experts<__nv_bfloat16>(logits, num_tokens, num_experts, top_k, renorm, topk_weights, topk_ids, s);
  else
    err = launch_for_experts<float>(logits, num_tokens, num_experts, top_k, renorm, topk_weights, topk_ids, s);
  return launched(err, "ferrum_topk_softmax: launch");
}
