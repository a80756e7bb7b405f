#include "routed_launch.h"

#include "../dense/gemm_tiles.h"
#include "../dense/wide_tile.h"

namespace ferrum::moe {

namespace {

template <int M8, NConfig NC, int Bits>
TileInfo info() {
  using T = dense::Tile<M8, NC, Bits>;
  return TileInfo{T::m_rows, T::n_tile, T::k_tile, T::smem_bytes};
}

template <NConfig NC, int Bits>
TileInfo info_m8(int m8) {
  if constexpr (NC == NConfig::N256_K128) {
    return m8 == 1 ? info<1, NC, Bits>() : info<2, NC, Bits>();
  } else {
    switch (m8) {
      case 1: return info<1, NC, Bits>();
      case 2: return info<2, NC, Bits>();
      case 4: return info<4, NC, Bits>();
      case 6: return info<6, NC, Bits>();
      default: return info<8, NC, Bits>();
    }
  }
}

template <int Bits>
TileInfo info_bits(int m8, NConfig nc) {
  switch (nc) {
    case NConfig::N256_K64: return info_m8<NConfig::N256_K64, Bits>(m8);
    case NConfig::N64_K128: return info_m8<NConfig::N64_K128, Bits>(m8);
    case NConfig::N128_K64: return info_m8<NConfig::N128_K64, Bits>(m8);
    case NConfig::N256_K128: return info_m8<NConfig::N256_K128, Bits>(m8);
    case NConfig::N128_K128:
    default: return info_m8<NConfig::N128_K128, Bits>(m8);
  }
}

template <AType A, WType W, Route R>
cudaError_t launch_height(int m8, NConfig nc, Args& args, const Launch& launch, int* stage) {
  // Direct routing puts one row in a slab: only 8-row slabs are built for it.
  if constexpr (R == Route::Direct) {
    if (m8 == 1) return dense::launch_routed<A, W, 1, R>(nc, args, launch, stage);
    return cudaErrorInvalidValue;
  }
  switch (m8) {
    case 1:
      // Buckets hold 16 to 64 rows: no 8-row bucketed kernel is built.
      if constexpr (R != Route::Bucketed) return dense::launch_routed<A, W, 1, R>(nc, args, launch, stage);
      break;
    case 2: return dense::launch_routed<A, W, 2, R>(nc, args, launch, stage);
    case 4: return dense::launch_routed<A, W, 4, R>(nc, args, launch, stage);
    case 6: return dense::launch_routed<A, W, 6, R>(nc, args, launch, stage);
    case 8: return dense::launch_routed<A, W, 8, R>(nc, args, launch, stage);
  }
  return cudaErrorInvalidValue;
}

}  // namespace

bool routed_m8_supported(int m8) { return m8 == 1 || m8 == 2 || m8 == 4 || m8 == 6 || m8 == 8; }

template <int Tokens, int Bits>
TileInfo wide_info() {
  using W = dense::WideTile<Tokens, Bits, 2, false, true>;
  return TileInfo{W::m_rows, W::n_tile, W::k_tile, W::smem_bytes, W::serves_partial_n};
}

TileInfo routed_tile_info(int m8, NConfig nc, int bits) {
  if (nc == NConfig::WIDE_T32) return bits == 8 ? wide_info<32, 8>() : wide_info<32, 4>();
  if (nc == NConfig::WIDE_T48) return bits == 8 ? wide_info<48, 8>() : wide_info<48, 4>();
  if (nc == NConfig::WIDE_T64) return bits == 8 ? wide_info<64, 8>() : wide_info<64, 4>();
  return bits == 8 ? info_bits<8>(m8, nc) : info_bits<4>(m8, nc);
}

// Routed launches accept n and k that a tile leaves partial (multiples of 64;
// the missing part of the last tile is neither read nor stored), so the tile
// is chosen for speed alone: slabs of at most 16 rows take the deep 16 KB-stage
// tile where k >= 128, every other slab 256 x 64 tiles where n >= 256 (H200,
// GPT-OSS-like M=256 in 32-row blocks: gate_up 365 -> 323 us against 128 x 128,
// 48-row blocks 299 -> 278), a narrower N 128 x 128; a dimension shorter than
// the tile takes the narrower one. On Hopper, blocks of 32, 48 and 64 rows run
// the warp-specialised kernel (see routed_wide_config).
bool routed_auto_config(int m8, int n, int k, bool hopper, NConfig* nc) {
  if (n % 64 != 0 || k % 64 != 0) return false;
  if (hopper && routed_wide_config(m8, n, k, nc)) return true;
  if (m8 <= dense::kDeepTileMaxM8 && n >= 256 && k >= 128) *nc = NConfig::N256_K128;
  else if (n >= 256) *nc = NConfig::N256_K64;
  else if (k >= 128 && n >= 128) *nc = NConfig::N128_K128;
  else if (k >= 128) *nc = NConfig::N64_K128;
  else *nc = NConfig::N128_K64;
  return true;
}

// Blocks of 32, 48 and 64 rows of every routed format: the 8-warp tiles are
// compute-bound at those heights, the warpgroup MMAs are not (MXFP4 too:
// H200, GPT-OSS-like M = 256, blocks of 64 239 + 132 us for gate_up + down
// against 261 + 144 in the 8-warp kernel's blocks of 48). Its 64-deep slots
// must divide k; the last 256-column tile may be partial (n >= 256). (16-row
// routed slabs in whole slots were built and measured slower than the 8-warp
// kernel's blocks of 8 from M = 1 to 64, Qwen-like and GPT-OSS-like: not kept.)
bool routed_wide_config(int m8, int n, int k, NConfig* nc) {
  if (m8 != 4 && m8 != 6 && m8 != 8) return false;
  if (n < 256 || n % 64 != 0 || k % 64 != 0) return false;
  *nc = m8 == 4 ? NConfig::WIDE_T32 : m8 == 6 ? NConfig::WIDE_T48 : NConfig::WIDE_T64;
  return true;
}

bool routed_forced_config(int thread_k, int thread_n, NConfig* nc) {
  if (thread_k == 128 && thread_n == 128) *nc = NConfig::N128_K128;
  else if (thread_k == 64 && thread_n == 256) *nc = NConfig::N256_K64;
  else if (thread_k == 128 && thread_n == 64) *nc = NConfig::N64_K128;
  else if (thread_k == 64 && thread_n == 128) *nc = NConfig::N128_K64;
  else if (thread_k == 128 && thread_n == 256) *nc = NConfig::N256_K128;
  else return false;
  return true;
}

// The 8-warp routed kernels of every fused-MoE format, routed by R.
template <Route R>
cudaError_t launch_format(AType a, WType w, int m8, NConfig nc, Args& args, const Launch& launch, int* stage) {
  if (a == AType::BF16) {
    if (w == WType::FE2M1) return launch_height<AType::BF16, WType::FE2M1, R>(m8, nc, args, launch, stage);
    return cudaErrorInvalidValue;
  }
  switch (w) {
    case WType::U4B8: return launch_height<AType::F16, WType::U4B8, R>(m8, nc, args, launch, stage);
    case WType::U4: return launch_height<AType::F16, WType::U4, R>(m8, nc, args, launch, stage);
    case WType::FE4M3FN: return launch_height<AType::F16, WType::FE4M3FN, R>(m8, nc, args, launch, stage);
    default: return cudaErrorInvalidValue;
  }
}

cudaError_t launch_routed_gemm(AType a, WType w, int m8, Route r, NConfig nc, Args& args,
                               const Launch& launch, int* stage) {
  if (r == Route::Bucketed) {
    if (a == AType::F16 && w == WType::U4B8)
      return launch_height<AType::F16, WType::U4B8, Route::Bucketed>(m8, nc, args, launch, stage);
    return cudaErrorInvalidValue;
  }
  if (dense::is_wide(nc)) {
    if (r != Route::Sorted) return cudaErrorInvalidValue;
    if (a == AType::BF16 && w == WType::FE2M1)
      return dense::launch_wide_routed<AType::BF16, WType::FE2M1>(8 * m8, args, launch, stage);
    if (a != AType::F16) return cudaErrorInvalidValue;
    switch (w) {
      case WType::U4B8: return dense::launch_wide_routed<AType::F16, WType::U4B8>(8 * m8, args, launch, stage);
      case WType::U4: return dense::launch_wide_routed<AType::F16, WType::U4>(8 * m8, args, launch, stage);
      case WType::FE4M3FN: return dense::launch_wide_routed<AType::F16, WType::FE4M3FN>(8 * m8, args, launch, stage);
      default: return cudaErrorInvalidValue;
    }
  }
  if (r == Route::Direct) return launch_format<Route::Direct>(a, w, m8, nc, args, launch, stage);
  if (r == Route::Sorted) return launch_format<Route::Sorted>(a, w, m8, nc, args, launch, stage);
  return cudaErrorInvalidValue;
}

}  // namespace ferrum::moe
