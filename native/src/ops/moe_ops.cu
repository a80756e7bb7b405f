// The elementwise ops around the MoE GEMMs: the activations between the two
// GEMMs (SiLU-and-mul, GPT-OSS's clamped SwiGLU) and the sum of each token's
// top_k expert rows. Each row of the problem is one row of blocks; inside a
// row, threads step over 8-element (16-byte) vectors when the widths and
// pointers allow it, element by element otherwise. fp32 math, one rounding.
#include <math.h>
#include <stdint.h>

#include "../core/chained_launch.h"
#include "../core/ptx.cuh"
#include "entry_checks.h"
#include "values.cuh"

namespace ferrum::ops {

namespace {

constexpr int kThreads = 128;

// Rows go on gridDim.x (up to 2^31 - 1); the steps of a row on gridDim.y,
// which stops at 65535 (the kernels loop past it).
dim3 row_grid(int rows, int steps) {
  const long long chunks = (static_cast<long long>(steps) + kThreads - 1) / kThreads;  // steps may be near 2^31
  return dim3(rows, chunks < 65535 ? static_cast<unsigned>(chunks) : 65535u);
}

// Unsigned: a step index below 2^31 plus the grid stride cannot wrap.
#define FERRUM_FOR_EACH_STEP(s, steps)                                                       \
  for (unsigned s = blockIdx.y * blockDim.x + threadIdx.x; s < static_cast<unsigned>(steps); \
       s += gridDim.y * blockDim.x)

__device__ __forceinline__ float sigmoid(float z) { return 1.0f / (1.0f + expf(-z)); }

template <AType A, int W>
__global__ void __launch_bounds__(kThreads)
    silu_and_mul_kernel(const Scalar<A>* __restrict__ x, Scalar<A>* __restrict__ out, int d) {
  ptx::enter_chain();
  const size_t row = blockIdx.x;
  const Scalar<A>* gate = x + row * 2 * static_cast<size_t>(d);
  const Scalar<A>* up = gate + d;
  Scalar<A>* dst = out + row * static_cast<size_t>(d);
  FERRUM_FOR_EACH_STEP(s, d / W) {
    float g[W], u[W], o[W];
    Pack<A, W>::load(gate + s * W, g);
    Pack<A, W>::load(up + s * W, u);
#pragma unroll
    for (int i = 0; i < W; ++i) o[i] = g[i] * sigmoid(g[i]) * u[i];
    Pack<A, W>::store(dst + s * W, o);
  }
}

// W outputs per step read 2W interleaved (gate, up) inputs; when W == 8 both
// widths are multiples of 8, so a step lies wholly inside or outside logical_d.
template <AType A, int W>
__global__ void __launch_bounds__(kThreads)
    gpt_oss_swiglu_kernel(const Scalar<A>* __restrict__ x, Scalar<A>* __restrict__ out, int logical_d,
                          int physical_d, float alpha, float limit) {
  ptx::enter_chain();
  const size_t row = blockIdx.x;
  const Scalar<A>* src = x + row * 2 * static_cast<size_t>(logical_d);
  Scalar<A>* dst = out + row * static_cast<size_t>(physical_d);
  FERRUM_FOR_EACH_STEP(s, physical_d / W) {
    const unsigned j = s * W;
    float o[W];
    if (j < static_cast<unsigned>(logical_d)) {
      float v[2 * W];
      Pack<A, 2 * W>::load(src + 2 * static_cast<size_t>(j), v);
#pragma unroll
      for (int i = 0; i < W; ++i) {
        const float g = fminf(v[2 * i], limit);
        const float u = fminf(fmaxf(v[2 * i + 1], -limit), limit);
        o[i] = (u + 1.0f) * g * sigmoid(alpha * g);
      }
    } else {
#pragma unroll
      for (int i = 0; i < W; ++i) o[i] = 0.0f;  // the padding columns of the next GEMM's input
    }
    Pack<A, W>::store(dst + j, o);
  }
}

// Rows j = 0..top_k-1 of a token added in that order: the same bits every run.
template <AType A, int W>
__global__ void __launch_bounds__(kThreads)
    moe_sum_kernel(const Scalar<A>* __restrict__ x, Scalar<A>* __restrict__ out, int top_k, int d) {
  ptx::enter_chain();
  const size_t token = blockIdx.x;
  const Scalar<A>* src = x + token * top_k * static_cast<size_t>(d);
  Scalar<A>* dst = out + token * static_cast<size_t>(d);
  FERRUM_FOR_EACH_STEP(s, d / W) {
    float acc[W] = {};
    for (int j = 0; j < top_k; ++j) {
      float v[W];
      Pack<A, W>::load(src + j * static_cast<size_t>(d) + s * W, v);
#pragma unroll
      for (int i = 0; i < W; ++i) acc[i] += v[i];
    }
    Pack<A, W>::store(dst + s * W, acc);
  }
}

#undef FERRUM_FOR_EACH_STEP

// The checks every op here shares: dtype, 2-byte element alignment, sizes.
int check_common(const char* entry, const void* x, const void* out, int dtype) {
  if (int st = check_dtype(entry, dtype, false)) return st;
  if (int st = check_pointer(entry, "x", x, 2)) return st;
  return check_pointer(entry, "out", out, 2);
}

bool vectorisable(const void* x, const void* out) { return aligned(x, 16) && aligned(out, 16); }

template <AType A>
cudaError_t launch_silu_and_mul(const void* x, void* out, int rows, int d, bool vec, cudaStream_t stream) {
  const auto* src = static_cast<const Scalar<A>*>(x);
  auto* dst = static_cast<Scalar<A>*>(out);
  if (vec)
    return launch_chained(silu_and_mul_kernel<A, 8>, row_grid(rows, d / 8), dim3(kThreads), 0, stream, src, dst, d);
  return launch_chained(silu_and_mul_kernel<A, 1>, row_grid(rows, d), dim3(kThreads), 0, stream, src, dst, d);
}

template <AType A>
cudaError_t launch_gpt_oss_swiglu(const void* x, void* out, int rows, int logical_d, int physical_d, float alpha,
                                  float limit, bool vec, cudaStream_t stream) {
  const auto* src = static_cast<const Scalar<A>*>(x);
  auto* dst = static_cast<Scalar<A>*>(out);
  if (vec)
    return launch_chained(gpt_oss_swiglu_kernel<A, 8>, row_grid(rows, physical_d / 8), dim3(kThreads), 0, stream,
                          src, dst, logical_d, physical_d, alpha, limit);
  return launch_chained(gpt_oss_swiglu_kernel<A, 1>, row_grid(rows, physical_d), dim3(kThreads), 0, stream, src,
                        dst, logical_d, physical_d, alpha, limit);
}

template <AType A>
cudaError_t launch_moe_sum(const void* x, void* out, int tokens, int top_k, int d, bool vec, cudaStream_t stream) {
  const auto* src = static_cast<const Scalar<A>*>(x);
  auto* dst = static_cast<Scalar<A>*>(out);
  if (vec)
    return launch_chained(moe_sum_kernel<A, 8>, row_grid(tokens, d / 8), dim3(kThreads), 0, stream, src, dst, top_k,
                          d);
  return launch_chained(moe_sum_kernel<A, 1>, row_grid(tokens, d), dim3(kThreads), 0, stream, src, dst, top_k, d);
}

cudaStream_t as_stream(ferrum_stream_t s) { return reinterpret_cast<cudaStream_t>(s); }

}  // namespace

}  // namespace ferrum::ops

using namespace ferrum;
using namespace ferrum::ops;

extern "C" int ferrum_silu_and_mul(const void* x, void* out, int rows, int d, int dtype, int dev,
                                   ferrum_stream_t stream) {
  constexpr const char* kEntry = "ferrum_silu_and_mul";
  clear_error();
  if (int st = check_common(kEntry, x, out, dtype)) return st;
  if (int st = check_positive(kEntry, "rows", rows)) return st;
  if (int st = check_positive(kEntry, "d", d)) return st;
  DeviceGuard guard;
  if (int st = guard.enter(kEntry, dev)) return st;
  const bool vec = d % 8 == 0 && vectorisable(x, out);
  const cudaError_t err = dtype == FERRUM_DTYPE_F16
                              ? launch_silu_and_mul<AType::F16>(x, out, rows, d, vec, as_stream(stream))
                              : launch_silu_and_mul<AType::BF16>(x, out, rows, d, vec, as_stream(stream));
  return launched(err, "ferrum_silu_and_mul: launch");
}

extern "C" int ferrum_gpt_oss_swiglu(const void* x, void* out, int rows, int logical_d, int physical_d,
                                     float alpha, float limit, int dtype, int dev, ferrum_stream_t stream) {
  constexpr const char* kEntry = "ferrum_gpt_oss_swiglu";
  clear_error();
  if (int st = check_common(kEntry, x, out, dtype)) return st;
  if (int st = check_positive(kEntry, "rows", rows)) return st;
  if (int st = check_positive(kEntry, "logical_d", logical_d)) return st;
  if (physical_d < logical_d)
    return bad_shape("%s: physical_d=%d must be >= logical_d=%d", kEntry, physical_d, logical_d);
  if (isnan(alpha)) return invalid("%s: alpha must not be NaN", kEntry);
  // A negative limit leaves no value for clamp(u, -limit, limit); infinity turns the clamps off.
  if (!(limit >= 0.0f)) return invalid("%s: limit=%g must be >= 0 (inf: no clamp)", kEntry, limit);
  DeviceGuard guard;
  if (int st = guard.enter(kEntry, dev)) return st;
  const bool vec = logical_d % 8 == 0 && physical_d % 8 == 0 && vectorisable(x, out);
  const cudaError_t err =
      dtype == FERRUM_DTYPE_F16
          ? launch_gpt_oss_swiglu<AType::F16>(x, out, rows, logical_d, physical_d, alpha, limit, vec, as_stream(stream))
          : launch_gpt_oss_swiglu<AType::BF16>(x, out, rows, logical_d, physical_d, alpha, limit, vec,
                                               as_stream(stream));
  return launched(err, "ferrum_gpt_oss_swiglu: launch");
}

extern "C" int ferrum_moe_sum(const void* x, void* out, int tokens, int top_k, int d, int dtype, int dev,
                              ferrum_stream_t stream) {
  constexpr const char* kEntry = "ferrum_moe_sum";
  clear_error();
  if (int st = check_common(kEntry, x, out, dtype)) return st;
  if (int st = check_positive(kEntry, "tokens", tokens)) return st;
  if (int st = check_positive(kEntry, "top_k", top_k)) return st;
  if (int st = check_positive(kEntry, "d", d)) return st;
  DeviceGuard guard;
  if (int st = guard.enter(kEntry, dev)) return st;
  const bool vec = d % 8 == 0 && vectorisable(x, out);
  const cudaError_t err = dtype == FERRUM_DTYPE_F16
                              ? launch_moe_sum<AType::F16>(x, out, tokens, top_k, d, vec, as_stream(stream))
                              : launch_moe_sum<AType::BF16>(x, out, tokens, top_k, d, vec, as_stream(stream));
  return launched(err, "ferrum_moe_sum: launch");
}
