// The MoE profile sink: one JSON line per MoE GEMM launch while a path is set
// (ferrum_vllm_marlin_moe_set_profile_config), filtered by environment.
#pragma once

namespace ferrum::moe {

struct LaunchRecord {
  const char* entry;  // exported entry point name
  int prob_m, prob_n, prob_k;
  int thread_k, thread_n;
  int moe_block_size, top_k, group_size;
  int num_bits;
  bool has_zp, mul_topk_weights, is_ep, fp32_reduce;
  int sms;
};

// Appends the record when the sink is on and the environment lets it through.
void record_launch(const LaunchRecord& r);

}  // namespace ferrum::moe
