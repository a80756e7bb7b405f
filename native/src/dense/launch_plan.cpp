#include "launch_plan.h"

#include <stdint.h>

#include "../status.h"
#include "gemm_tiles.h"
#include "wide_tile.h"

namespace ferrum::dense {

namespace {

#ifdef FERRUM_HAVE_SM90A
constexpr bool kHaveSm90a = true;
#else
constexpr bool kHaveSm90a = false;
#endif

template <int M8, NConfig NC, int Bits>
TileInfo info() {
  using T = Tile<M8, NC, Bits>;
  // The automatic deep tile may leave its last column tile partial (the
  // kernel's step_back); forced tiles must divide n (check_forced_tile).
  return TileInfo{T::m_rows, T::n_tile, T::k_tile, T::smem_bytes, NC == NConfig::N256_K128};
}

template <NConfig NC, int Bits>
TileInfo info_m8(int m8) {
  if constexpr (NC == NConfig::N256_K128) {
    return m8 == 1 ? info<1, NC, Bits>() : info<2, NC, Bits>();
  } else if constexpr (NC == NConfig::N256_K64_WGMMA) {
    return info<8, NC, Bits>();
  } else {
    switch (m8) {
      case 1: return info<1, NC, Bits>();
      case 2: return info<2, NC, Bits>();
      case 4: return info<4, NC, Bits>();
      default: return info<8, NC, Bits>();
    }
  }
}

template <int Tokens, int Bits>
TileInfo info_wide() {
  using W = WideTile<Tokens, Bits>;
  return TileInfo{W::m_rows, W::n_tile, W::k_tile, W::smem_bytes, W::serves_partial_n};
}

template <int Bits>
TileInfo info_bits(int m8, NConfig nc) {
  switch (nc) {
    case NConfig::WIDE_T16: return info_wide<16, Bits>();
    case NConfig::WIDE_T32: return info_wide<32, Bits>();
    case NConfig::WIDE_T48: return info_wide<48, Bits>();
    case NConfig::WIDE_T64: return info_wide<64, Bits>();
    case NConfig::WIDE_T128: return info_wide<128, Bits>();
    case NConfig::WIDE_T256: return info_wide<256, Bits>();
    case NConfig::N128_K128: return info_m8<NConfig::N128_K128, Bits>(m8);
    case NConfig::N256_K64: return info_m8<NConfig::N256_K64, Bits>(m8);
    case NConfig::N256_K128: return info_m8<NConfig::N256_K128, Bits>(m8);
    case NConfig::N256_K64_WGMMA: return info_m8<NConfig::N256_K64_WGMMA, Bits>(m8);
    case NConfig::N128_K128_ROW_GROUPS: return info_m8<NConfig::N128_K128_ROW_GROUPS, Bits>(m8);
    case NConfig::N64_K128:
    default: return info_m8<NConfig::N64_K128, Bits>(m8);
  }
}

template <AType A, WType W>
cudaError_t launch_format(int m8, NConfig nc, Args& args, const Launch& launch, int* stage) {
  if (is_wide(nc))
    return launch_wide<A, W>(tile_info(1, nc, weight_bits(W)).m_rows, args, launch, stage);
  switch (m8) {
    case 1: return launch_slab<A, W, 1>(nc, args, launch, stage);
    case 2: return launch_slab<A, W, 2>(nc, args, launch, stage);
    case 4: return launch_slab<A, W, 4>(nc, args, launch, stage);
    default: return launch_slab<A, W, 8>(nc, args, launch, stage);
  }
}

template <AType A>
cudaError_t launch_act(WType w, int m8, NConfig nc, Args& args, const Launch& launch, int* stage) {
  switch (w) {
    case WType::U4: return launch_format<A, WType::U4>(m8, nc, args, launch, stage);
    case WType::U4B8: return launch_format<A, WType::U4B8>(m8, nc, args, launch, stage);
    case WType::U8B128: return launch_format<A, WType::U8B128>(m8, nc, args, launch, stage);
    case WType::FE4M3FN: return launch_format<A, WType::FE4M3FN>(m8, nc, args, launch, stage);
    case WType::FE2M1: break;  // MXFP4 is a MoE-only format (routed launches)
  }
  return cudaErrorInvalidValue;
}

}  // namespace

int slab_m8(int m) {
  if (m <= 8) return 1;
  if (m <= 16) return 2;
  if (m <= 32) return 4;
  return 8;
}

TileInfo tile_info(int m8, NConfig nc, int bits) {
  return bits == 8 ? info_bits<8>(m8, nc) : info_bits<4>(m8, nc);
}

namespace {

// The warp-specialised kernel's tile for an m-row problem on Hopper (n and k
// multiples of 64), or N128_K128 where the 8-warp kernel serves it better.
NConfig wide_config(int m, int k, int group_size, WType w) {
  // Over 128 rows, 256-row slabs halve the dequantisation per product
  // (H200, m = 192..1024: 3-5 % faster) but double the activation reads
  // per weight byte: while A stays well inside L2 that is free; past it
  // (k = 28672, m = 1024: 59 MB of A) it cost 4 %.
  constexpr int64_t kActivationsInL2 = 32ll << 20;  // bytes
  if (m > 128 && static_cast<int64_t>(m) * k * 2 <= kActivationsInL2) return NConfig::WIDE_T256;
  if (m > 64) return NConfig::WIDE_T128;
  // 33..48 rows: 48-row slabs drop a quarter of the 64-row MMA work
  // (H200, m = 33..48: 3-6 % faster on 8192 x 28672 and 28672 x 8192,
  // 2-4 % on the 4096-wide shapes, every weight type).
  // 17..32 rows: 32-row slabs halve the MMA work of 64-row ones; on long k
  // runs that pays (H200, m = 24..32: 3-7 % on k >= 8192), on k = 4096 with
  // wide n it cost 1-2 % (4096 x 14336, 4096 x 28672).
  if (m > 48) return NConfig::WIDE_T64;
  if (m > 32) return NConfig::WIDE_T48;
  if (m > 16) return k < 8192 ? NConfig::WIDE_T64 : NConfig::WIDE_T32;
  // 9..16 rows: the 16-row tile (H200: 4-bit 4-8 %, 8-bit 1-21 % faster than
  // the 8-warp kernel; at 8 rows and below it is not faster), where its
  // whole slots fold their partials per group of 64 or more or
  // channelwise, or where it dequantises (INT8 groups of 32). 4-bit groups
  // of 32 stay on the 8-warp kernel (not built for the tile).
  if (m > 8 && (group_size < 0 || group_size >= 64 || (w == WType::U8B128 && group_size == 32)))
    return NConfig::WIDE_T16;
  return NConfig::N128_K128;
}

}  // namespace

// On Hopper (sm_90a) problems of more than 16 rows (and most of 9..16, see
// wide_config) take the warp-specialised kernel where its tile serves n (any
// multiple of 64) and k;
// elsewhere slabs of up to 8 rows on Hopper (4-bit, FP8 and fp16 INT8 weights),
// and small 4-bit slabs on long problems (at least 8 units per resident block,
// two blocks per SM), take the deep 256 x 128 tile; otherwise 128x128 tiles keep
// many columns and short k runs.
// 64-row slabs prefer 256 columns per tile, which halves the activation
// traffic per weight byte.
NConfig auto_config(int m, int n, int k, int group_size, int sms, AType a, WType w, bool hopper) {
  const int m8 = slab_m8(m);
  const int bits = weight_bits(w);
  if (hopper && n % 64 == 0 && k % 64 == 0) {
    const NConfig wide = wide_config(m, k, group_size, w);
    // n: whole column tiles, or a partial last one (H200, W4A16 8192 x 29568
    // against the 8-warp kernel's 128-column tiles: m = 16 56.7 -> 41.7 us,
    // m = 64 121 -> 63.3, m = 256 441 -> 167).
    if (wide != NConfig::N128_K128 && tile_fits_n(tile_info(1, wide, bits), n)) return wide;
  }
  if (m8 == 8 && n % 256 == 0 && hopper) return NConfig::N256_K64_WGMMA;
  // The deep tile's 16 KB stages halve the per-stage fixed costs (barrier,
  // scale and zero-point copies, the image path's fold). On Hopper slabs of
  // up to 8 rows take it wherever it divides the problem, however few units
  // each block then gets (H200, m = 1..8, 2048 x 2048 up to 14336 x 4096,
  // against 128 x 128: W4A16 2-9 % faster, f16-u4 3-13 %, bf16 act-order
  // 3-13 %; only channelwise weights at m = 8 on 4096-wide shapes lost, by
  // up to 2.6 %). 8-bit weights there too (FP8 1-8 %, fp16 INT8 1-5 %), but
  // not bf16 INT8: its two images per code fill the deep tile's registers
  // (2.8 % slower on 8192 x 28672).
  // n: whole 256-column tiles, or on Hopper a partial last one where the
  // columns it computes past n are at most n / 8 (H200, W4A16 m = 1 against
  // 128- or 64-column tiles: 8192 x 29568 45.5 -> 42.1 us, 3584 x 151936
  // 94.3 -> 82.2, 4096 x 2880 11.7 -> 10.0).
  const int deep_waste = (n + 255) / 256 * 256 - n;
  const bool deep_n = n % 256 == 0 || (hopper && n % 64 == 0 && deep_waste * 8 <= n);
  const bool divides = m8 <= kDeepTileMaxM8 && deep_n && k % 128 == 0;
  const bool two_images = a == AType::BF16 && w == WType::U8B128;
  if (divides && hopper && m8 == 1 && !two_images) return NConfig::N256_K128;
  if (divides && bits == 4 && static_cast<int64_t>(n / 256) * (k / 128) >= static_cast<int64_t>(16) * sms)
    return NConfig::N256_K128;
  if (m8 == 8 && n % 256 == 0) return NConfig::N256_K64;
  if (n % 128 == 0) return NConfig::N128_K128;
  return NConfig::N64_K128;
}

bool fit_shared_memory(int max_smem, int bits, bool may_change_tile, NConfig* nc, int* m8) {
  auto fits = [&] { return tile_info(*m8, *nc, bits).smem_bytes <= static_cast<size_t>(max_smem); };
  if (fits()) return true;
  if (*nc == NConfig::N256_K64_WGMMA || is_wide(*nc)) return false;  // Hopper tiles, sized for Hopper
  if (*nc == NConfig::N256_K128 && may_change_tile) {
    *nc = NConfig::N128_K128;
    if (fits()) return true;
  }
  while (*m8 > 1) {
    *m8 /= 2;
    if (*nc == NConfig::N128_K128_ROW_GROUPS && *m8 == 4) continue;  // not built for row groups
    if (fits()) return true;
  }
  return false;
}

bool forced_config(int thread_k, int thread_n, NConfig* nc) {
  if (thread_k == 128 && thread_n == 128) *nc = NConfig::N128_K128;
  else if (thread_k == 128 && thread_n == 256) *nc = NConfig::N256_K128;
  else if (thread_k == 64 && thread_n == 256) *nc = NConfig::N256_K64;
  else if (thread_k == 128 && thread_n == 64) *nc = NConfig::N64_K128;
  else return false;
  return true;
}

bool tile_fits_n(const TileInfo& tile, int n) {
  return n % tile.n_tile == 0 || (tile.partial_n && n % 64 == 0);
}

int column_tiles(const TileInfo& tile, int n) { return (n + tile.n_tile - 1) / tile.n_tile; }

int check_forced_tile(const char* entry, const TileInfo& tile, int n, int k) {
  if (n % tile.n_tile != 0)
    return fail(FERRUM_STAGE_SHAPE, FERRUM_STATUS_INVALID_VALUE,
                "%s: n=%d is not a multiple of the tile width %d", entry, n, tile.n_tile);
  return check_tile_fits(entry, tile, n, k);
}

int check_tile_fits(const char* entry, const TileInfo& tile, int n, int k) {
  if (!tile_fits_n(tile, n))
    return fail(FERRUM_STAGE_SHAPE, FERRUM_STATUS_INVALID_VALUE,
                "%s: n=%d is not a multiple of the tile width %d", entry, n, tile.n_tile);
  if (k % tile.k_tile != 0)
    return fail(FERRUM_STAGE_SHAPE, FERRUM_STATUS_INVALID_VALUE,
                "%s: k=%d is not a multiple of the tile depth %d", entry, k, tile.k_tile);
  return 0;
}

int query_device(const char* entry, int dev, int sms_request, DeviceFacts* facts) {
  auto cuda_fail = [entry](int stage, cudaError_t e, const char* what) {
    return fail(stage, static_cast<int>(e), "%s: %s: %s (%s)", entry, what, cudaGetErrorName(e),
                cudaGetErrorString(e));
  };
  int dev_sms = 0;
  cudaError_t err = cudaDeviceGetAttribute(&dev_sms, cudaDevAttrMultiProcessorCount, dev);
  if (err != cudaSuccess) return cuda_fail(FERRUM_STAGE_SM_COUNT, err, "multiprocessor count");
  int cc_major = 0;
  err = cudaDeviceGetAttribute(&cc_major, cudaDevAttrComputeCapabilityMajor, dev);
  if (err != cudaSuccess) return cuda_fail(FERRUM_STAGE_DEVICE, err, "compute capability");
  if (cc_major < 8)
    return fail(FERRUM_STAGE_DEVICE, cudaErrorNoKernelImageForDevice,
                "%s: device %d has compute capability %d.x; sm_80 or newer is required", entry, dev,
                cc_major);
  int max_smem = 0;
  err = cudaDeviceGetAttribute(&max_smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
  if (err != cudaSuccess) return cuda_fail(FERRUM_STAGE_MAX_SHARED_MEMORY, err, "shared memory");
  facts->sms = (sms_request == -1 || sms_request > dev_sms) ? dev_sms : sms_request;
  // Warpgroup MMA needs sm_90a machine code, which only Hopper (9.0) runs.
  facts->hopper = kHaveSm90a && cc_major == 9;
  facts->max_smem = max_smem;
  return 0;
}

cudaError_t launch_gemm(AType a, WType w, int m8, NConfig nc, Args& args, const Launch& launch, int* stage) {
  if (a == AType::BF16) return launch_act<AType::BF16>(w, m8, nc, args, launch, stage);
  return launch_act<AType::F16>(w, m8, nc, args, launch, stage);
}

}  // namespace ferrum::dense
