// ferrum_moe_align_block_size: the block-aligned routing the MoE GEMMs read,
// in one launch of one 1024-thread block, deterministic.
//
// Output contract (what the header leaves open): experts are laid out in id
// order, each taking ceil(count / block_size) blocks (none when it has no
// ids); every sorted_token_ids entry up to sorted_capacity is written, unused
// ones with num_tokens * top_k; every expert_ids entry up to
// expert_ids_capacity is written, -1 past the blocks in use. The map's values
// are copied as they are. Time grows with num_tokens * top_k on one SM: built
// for decode and moderate prefill batches.
//
// The flattened topk_ids are cut into S contiguous segments, one per warp
// (S <= 32, fewer when E is large so that S * E counters fit in shared
// memory). Pass 1: each warp counts its segment per expert, 32 ids at a time,
// the lanes of an expert found with __match_any_sync. Then every expert (one
// thread each) turns its S counts into the segment's first slot: the expert's
// padded start (a block-wide scan) plus the counts of earlier segments. Pass
// 2 repeats the walk and writes each id t at its slot plus its rank among the
// equal lanes before it. Segments, steps and lanes all follow t, so the ids
// of an expert land in ascending order whatever the scheduling.
#include <stdint.h>

#include "../core/chained_launch.h"
#include "../core/ptx.cuh"
#include "../ops/entry_checks.h"

namespace ferrum::moe {

namespace {

constexpr int kThreads = ops::kMaxExperts;  // one thread per expert in the scan
constexpr int kWarps = kThreads / 32;
constexpr unsigned kFullMask = 0xffffffffu;
// S * E segment counters at most: with the expert starts, at most 36 KB of
// shared memory, inside the 48 KB a launch gets without opting in.
constexpr int kCounterBudget = 8192;

struct Routing {
  const int* topk_ids;
  int numel;  // num_tokens * top_k, also the padding value
  int num_experts;
  int block_size;
  int segments;
  int segment_len;  // a multiple of 32
  const int* expert_map;
  int* sorted_token_ids;
  int sorted_capacity;
  int* expert_ids;
  int expert_ids_capacity;
  int* num_tokens_post_padded;
  int4* clear;  // zeroed by blocks 1.. (the _ex entry); clear_int4 16-byte units
  long long clear_int4;
};

// Pass 1 (place == false) adds a segment's ids to its counters; pass 2
// (place == true) writes them at the counters, which then hold slots.
template <bool place>
__device__ __forceinline__ void walk_segment(const Routing& r, int* counter, int segment, int lane) {
  const int64_t begin = static_cast<int64_t>(segment) * r.segment_len;
  const int64_t end = begin + r.segment_len < r.numel ? begin + r.segment_len : r.numel;
  const unsigned lanes_before = (1u << lane) - 1;
  for (int64_t base = begin; base < end; base += 32) {
    const int64_t t = base + lane;
    int e = -1;  // no id in this lane, or a dropped one
    if (t < end) {
      const int id = __ldg(r.topk_ids + t);
      if (static_cast<unsigned>(id) < static_cast<unsigned>(r.num_experts)) e = id;
    }
    const unsigned peers = __match_any_sync(kFullMask, e);
    const bool first = (peers & lanes_before) == 0;
    if (place && e >= 0) r.sorted_token_ids[counter[e] + __popc(peers & lanes_before)] = static_cast<int>(t);
    __syncwarp();  // every lane has read counter[e] before its first lane moves it
    if (e >= 0 && first) counter[e] += __popc(peers);
    __syncwarp();  // the next step reads the moved counter
  }
}

// Exclusive prefix sum of one value per thread over the block; *total gets the sum.
__device__ __forceinline__ int block_exclusive_scan(int value, int* warp_sums, int* total) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  int inclusive = value;
  for (int o = 1; o < 32; o *= 2) {
    const int other = __shfl_up_sync(kFullMask, inclusive, o);
    if (lane >= o) inclusive += other;
  }
  if (lane == 31) warp_sums[warp] = inclusive;
  __syncthreads();
  if (warp == 0) {
    int w = warp_sums[lane];
    for (int o = 1; o < kWarps; o *= 2) {
      const int other = __shfl_up_sync(kFullMask, w, o);
      if (lane >= o) w += other;
    }
    warp_sums[lane] = w;
  }
  __syncthreads();
  *total = warp_sums[kWarps - 1];
  return (warp > 0 ? warp_sums[warp - 1] : 0) + inclusive - value;
}

// The explicit 1 block per SM lets ptxas use 64 registers; with the thread
// bound alone it holds this kernel to 32 and spills.
__global__ void __launch_bounds__(kThreads, 1) align_kernel(const Routing r) {
  if (blockIdx.x > 0) {
    // The clearing blocks: the buffer may still be in use by the previous kernel.
    ptx::enter_chain();
    const long long stride = static_cast<long long>(gridDim.x - 1) * kThreads;
    for (long long i = static_cast<long long>(blockIdx.x - 1) * kThreads + threadIdx.x; i < r.clear_int4; i += stride)
      r.clear[i] = make_int4(0, 0, 0, 0);
    return;
  }
  extern __shared__ int shared[];
  int* counters = shared;                             // [segments][E]
  int* start = counters + r.segments * r.num_experts;  // [E] first padded slot of each expert
  __shared__ int warp_sums[kWarps];
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int E = r.num_experts;

  for (int i = tid; i < r.segments * E; i += kThreads) counters[i] = 0;
  ptx::enter_chain();  // topk_ids: the router's output
  __syncthreads();
  if (warp < r.segments) walk_segment<false>(r, counters + warp * E, warp, lane);
  __syncthreads();

  // Expert tid: counts of the segments -> offsets inside the expert.
  int count = 0;
  if (tid < E) {
    for (int s = 0; s < r.segments; ++s) {
      const int c = counters[s * E + tid];
      counters[s * E + tid] = count;
      count += c;
    }
  }
  const int padded = (count + r.block_size - 1) / r.block_size * r.block_size;
  int total;
  const int first = block_exclusive_scan(padded, warp_sums, &total);
  if (tid < E) {
    start[tid] = first;
    for (int s = 0; s < r.segments; ++s) counters[s * E + tid] += first;
  }
  __syncthreads();
  if (warp < r.segments) walk_segment<true>(r, counters + warp * E, warp, lane);

  // Everything else goes to slots pass 2 does not touch: no barrier needed.
  if (tid == 0) *r.num_tokens_post_padded = total;
  for (int p = first + count; p < first + padded; ++p) r.sorted_token_ids[p] = r.numel;
  // Unsigned strides: an index below 2^31 plus 1024 cannot wrap.
  const unsigned capacity = r.sorted_capacity;
  for (unsigned p = static_cast<unsigned>(total) + tid; p < capacity; p += kThreads) r.sorted_token_ids[p] = r.numel;
  const unsigned blocks = total / r.block_size;
  for (unsigned j = tid; j < static_cast<unsigned>(r.expert_ids_capacity); j += kThreads) {
    int id = -1;
    if (j < blocks) {
      // The last expert starting at or before the block owns it (empty experts
      // share their successor's start and are skipped by "last").
      const int slot = static_cast<int>(j) * r.block_size;
      int lo = 0, hi = E - 1;
      while (lo < hi) {
        const int mid = (lo + hi + 1) / 2;
        if (start[mid] <= slot) lo = mid;
        else hi = mid - 1;
      }
      id = r.expert_map ? __ldg(r.expert_map + lo) : lo;
    }
    r.expert_ids[j] = id;
  }
}

// Blocks that clear: one per 256 KB of the buffer, at most this many.
constexpr long long kClearBytesPerBlock = 256 * 1024;
constexpr long long kMaxClearBlocks = 128;

int check(const char* entry, const int* topk_ids, int num_tokens, int top_k, int num_experts, int block_size,
          const int* expert_map, const int* sorted_token_ids, int sorted_capacity, const int* expert_ids,
          int expert_ids_capacity, const int* num_tokens_post_padded) {
  if (int st = check_pointer(entry, "topk_ids", topk_ids, 4)) return st;
  if (int st = check_pointer(entry, "sorted_token_ids", sorted_token_ids, 4)) return st;
  if (int st = check_pointer(entry, "expert_ids", expert_ids, 4)) return st;
  if (int st = check_pointer(entry, "num_tokens_post_padded", num_tokens_post_padded, 4)) return st;
  if (expert_map != nullptr && !aligned(expert_map, 4))
    return ops::invalid("%s: expert_map=%p must be 4-byte aligned", entry, static_cast<const void*>(expert_map));
  if (int st = ops::check_positive(entry, "num_tokens", num_tokens)) return st;
  if (int st = ops::check_positive(entry, "top_k", top_k)) return st;
  if (int st = ops::check_positive(entry, "num_experts", num_experts)) return st;
  if (int st = ops::check_positive(entry, "block_size", block_size)) return st;
  if (num_experts > ops::kMaxExperts)
    return ops::bad_shape("%s: num_experts=%d exceeds the %d experts of the single-block kernel", entry,
                          num_experts, ops::kMaxExperts);
  const int64_t numel = static_cast<int64_t>(num_tokens) * top_k;
  if (numel > INT32_MAX)
    return ops::bad_shape("%s: num_tokens * top_k = %lld does not fit int32", entry,
                          static_cast<long long>(numel));
  const int64_t needed = numel + static_cast<int64_t>(num_experts) * (block_size - 1);
  if (needed > INT32_MAX)
    return ops::bad_shape("%s: num_tokens * top_k + num_experts * (block_size - 1) = %lld does not fit int32",
                          entry, static_cast<long long>(needed));
  if (sorted_capacity < needed)
    return ops::bad_shape("%s: sorted_capacity=%d must be >= num_tokens * top_k + num_experts * "
                          "(block_size - 1) = %lld",
                          entry, sorted_capacity, static_cast<long long>(needed));
  const int64_t blocks_needed = (needed + block_size - 1) / block_size;
  if (expert_ids_capacity < blocks_needed)
    return ops::bad_shape("%s: expert_ids_capacity=%d must be >= ceil(%lld / block_size=%d) = %lld", entry,
                          expert_ids_capacity, static_cast<long long>(needed), block_size,
                          static_cast<long long>(blocks_needed));
  return 0;
}

}  // namespace

}  // namespace ferrum::moe

namespace ferrum::moe {
namespace {

int align(const char* entry, const int* topk_ids, int num_tokens, int top_k, int num_experts, int block_size,
          const int* expert_map, int* sorted_token_ids, int sorted_capacity, int* expert_ids,
          int expert_ids_capacity, int* num_tokens_post_padded, int dev, ferrum_stream_t stream, void* clear,
          size_t clear_bytes) {
  ferrum::clear_error();
  if (int st = check(entry, topk_ids, num_tokens, top_k, num_experts, block_size, expert_map, sorted_token_ids,
                     sorted_capacity, expert_ids, expert_ids_capacity, num_tokens_post_padded))
    return st;
  if ((clear == nullptr) != (clear_bytes == 0))
    return ops::invalid("%s: clear_bytes must be positive exactly when clear is non-null", entry);
  if (clear != nullptr) {
    if (int st = check_pointer(entry, "clear", clear, 16)) return st;
    if (clear_bytes % 16 != 0) return ops::invalid("%s: clear_bytes %zu must be a multiple of 16", entry, clear_bytes);
    if (clear_bytes > (size_t{1} << 56))
      return ops::invalid("%s: clear_bytes %zu is beyond any device's memory", entry, clear_bytes);
  }
  Routing r{};
  r.topk_ids = topk_ids;
  r.numel = num_tokens * top_k;
  r.num_experts = num_experts;
  r.block_size = block_size;
  // As many 32-id steps per warp as needed, over at most kWarps segments; a
  // decode batch (a few hundred ids) uses one or a few warps.
  const int steps = static_cast<int>((static_cast<int64_t>(r.numel) + 31) / 32);
  int max_segments = kCounterBudget / num_experts;
  if (max_segments > kWarps) max_segments = kWarps;
  r.segments = steps < max_segments ? steps : max_segments;
  r.segment_len = (steps + r.segments - 1) / r.segments * 32;
  r.expert_map = expert_map;
  r.sorted_token_ids = sorted_token_ids;
  r.sorted_capacity = sorted_capacity;
  r.expert_ids = expert_ids;
  r.expert_ids_capacity = expert_ids_capacity;
  r.num_tokens_post_padded = num_tokens_post_padded;
  r.clear = static_cast<int4*>(clear);
  r.clear_int4 = static_cast<long long>(clear_bytes / 16);
  long long clear_blocks = (static_cast<long long>(clear_bytes) + kClearBytesPerBlock - 1) / kClearBytesPerBlock;
  if (clear_blocks > kMaxClearBlocks) clear_blocks = kMaxClearBlocks;
  const size_t shared_bytes = static_cast<size_t>(r.segments + 1) * num_experts * sizeof(int);

  ferrum::DeviceGuard guard;
  if (int st = guard.enter(entry, dev)) return st;
  const cudaError_t err = ferrum::launch_chained(align_kernel, dim3(1 + static_cast<unsigned>(clear_blocks)),
                                                 dim3(kThreads), shared_bytes, reinterpret_cast<cudaStream_t>(stream),
                                                 r);
  return ferrum::ops::launched(err, entry);
}

}  // namespace
}  // namespace ferrum::moe

extern "C" int ferrum_moe_align_block_size(const int* topk_ids, int num_tokens, int top_k, int num_experts,
                                           int block_size, const int* expert_map, int* sorted_token_ids,
                                           int sorted_capacity, int* expert_ids, int expert_ids_capacity,
                                           int* num_tokens_post_padded, int dev, ferrum_stream_t stream) {
  return ferrum::moe::align("ferrum_moe_align_block_size", topk_ids, num_tokens, top_k, num_experts, block_size,
                            expert_map, sorted_token_ids, sorted_capacity, expert_ids, expert_ids_capacity,
                            num_tokens_post_padded, dev, stream, nullptr, 0);
}

extern "C" int ferrum_moe_align_block_size_ex(const int* topk_ids, int num_tokens, int top_k, int num_experts,
                                              int block_size, const int* expert_map, int* sorted_token_ids,
                                              int sorted_capacity, int* expert_ids, int expert_ids_capacity,
                                              int* num_tokens_post_padded, int dev, ferrum_stream_t stream,
                                              void* clear, size_t clear_bytes) {
  return ferrum::moe::align("ferrum_moe_align_block_size_ex", topk_ids, num_tokens, top_k, num_experts, block_size,
                            expert_map, sorted_token_ids, sorted_capacity, expert_ids, expert_ids_capacity,
                            num_tokens_post_padded, dev, stream, clear, clear_bytes);
}
