#include "profile_sink.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mutex>
#include <string>

#include "../status.h"
#include "ferrum_marlin.h"

namespace ferrum::moe {

namespace {

struct Sink {
  std::mutex mutex;
  FILE* file = nullptr;
  std::string metadata;  // the fields after "shape", already JSON
};

Sink& sink() {
  static Sink s;
  return s;
}

// JSON string literal of s (quotes, backslashes and control characters escaped).
std::string quoted(const char* s) {
  std::string out = "\"";
  for (const unsigned char* p = reinterpret_cast<const unsigned char*>(s ? s : ""); *p; ++p) {
    switch (*p) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (*p < 0x20) {
          char buf[8];
          snprintf(buf, sizeof buf, "\\u%04x", *p);
          out += buf;
        } else {
          out += static_cast<char>(*p);
        }
    }
  }
  return out + "\"";
}

// An integer environment variable, or `fallback` when unset or not a number.
long long env_int(const char* name, long long fallback) {
  const char* v = getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  char* end = nullptr;
  const long long x = strtoll(v, &end, 10);
  return (end != nullptr && *end == '\0') ? x : fallback;
}

}  // namespace

void record_launch(const LaunchRecord& r) {
  Sink& s = sink();
  {
    std::lock_guard<std::mutex> lock(s.mutex);
    if (s.file == nullptr) return;
  }
  const long long mode = env_int("FERRUM_VLLM_MOE_LOG_CONFIG", -1);
  if (mode == 0) return;
  const long long pairs = static_cast<long long>(r.prob_m) * r.top_k;
  if (pairs < env_int("FERRUM_VLLM_MOE_LOG_CONFIG_MIN_PAIRS", 0)) return;
  if (pairs > env_int("FERRUM_VLLM_MOE_LOG_CONFIG_MAX_PAIRS", pairs)) return;
  char shape[512];
  snprintf(shape, sizeof shape,
           "{\"prob_m\":%d,\"prob_n\":%d,\"prob_k\":%d,\"thread_k\":%d,\"thread_n\":%d,"
           "\"moe_block_size\":%d,\"top_k\":%d,\"group_size\":%d,\"num_bits\":%d,\"has_zp\":%s,"
           "\"mul_topk_weights\":%s,\"is_ep\":%s,\"use_fp32_reduce\":%s,\"sms\":%d,\"pairs\":%lld}",
           r.prob_m, r.prob_n, r.prob_k, r.thread_k, r.thread_n, r.moe_block_size, r.top_k,
           r.group_size, r.num_bits, r.has_zp ? "true" : "false", r.mul_topk_weights ? "true" : "false",
           r.is_ep ? "true" : "false", r.fp32_reduce ? "true" : "false", r.sms, pairs);
  std::lock_guard<std::mutex> lock(s.mutex);
  if (s.file == nullptr) return;  // cleared meanwhile
  const std::string line = std::string("{\"event\":\"vllm_moe_config\",\"entry\":") + quoted(r.entry) +
                           ",\"shape\":" + shape + s.metadata + "}\n";
  fputs(line.c_str(), s.file);
  fflush(s.file);
  if (mode == 1) fputs(line.c_str(), stderr);
}

}  // namespace ferrum::moe

extern "C" {

FERRUM_API void ferrum_vllm_marlin_moe_set_profile_config(const char* path, const char* commit_sha,
                                                          const char* env_hash, const char* model,
                                                          int concurrency,
                                                          const char* runtime_flags_json) {
  using namespace ferrum::moe;
  Sink& s = sink();
  std::lock_guard<std::mutex> lock(s.mutex);
  if (s.file != nullptr) fclose(s.file);
  s.file = nullptr;
  if (path == nullptr || *path == '\0') {
    ferrum::fail(FERRUM_STAGE_ARGUMENT, FERRUM_STATUS_INVALID_VALUE,
                 "ferrum_vllm_marlin_moe_set_profile_config: path must be a non-empty string");
    return;
  }
  FILE* f = fopen(path, "a");
  if (f == nullptr) {
    ferrum::fail(FERRUM_STAGE_ARGUMENT, FERRUM_STATUS_INVALID_VALUE,
                 "ferrum_vllm_marlin_moe_set_profile_config: cannot open '%s' for appending: %s", path,
                 strerror(errno));
    return;
  }
  // runtime_flags_json is the caller's JSON value, spliced in as given ({} if empty).
  const char* flags = (runtime_flags_json != nullptr && *runtime_flags_json != '\0') ? runtime_flags_json : "{}";
  s.metadata = ",\"commit_sha\":" + quoted(commit_sha) + ",\"env_hash\":" + quoted(env_hash) +
               ",\"model\":" + quoted(model) + ",\"concurrency\":" + std::to_string(concurrency) +
               ",\"runtime_flags\":" + flags;
  s.file = f;
  ferrum::clear_error();
}

FERRUM_API void ferrum_vllm_marlin_moe_clear_profile_config(void) {
  using namespace ferrum::moe;
  Sink& s = sink();
  std::lock_guard<std::mutex> lock(s.mutex);
  if (s.file != nullptr) fclose(s.file);
  s.file = nullptr;
  s.metadata.clear();
}

FERRUM_API int ferrum_vllm_marlin_moe_profile_enabled(void) {
  using namespace ferrum::moe;
  Sink& s = sink();
  std::lock_guard<std::mutex> lock(s.mutex);
  return s.file != nullptr ? 1 : 0;
}

}  // extern "C"
