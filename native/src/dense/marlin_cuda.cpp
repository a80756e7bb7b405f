// marlin_cuda: the W4A16 entry point (FP16 x U4B8 of the dense kernel) with
// the original engine's signature. Validates every argument, picks a tile,
// and launches once per group of up to max_par activation slabs (its locks
// are per column, max(1, n/128) * max_par of them).
#include <stdint.h>

#include <algorithm>

#include "../status.h"
#include "launch_plan.h"

namespace ferrum::dense {

namespace {

constexpr const char* kEntry = "marlin_cuda";

int invalid(const char* fmt, int a, int b = 0) {
  return fail(FERRUM_STAGE_ARGUMENT, FERRUM_STATUS_INVALID_VALUE, fmt, kEntry, a, b);
}

int bad_shape(const char* fmt, int a, int b = 0) {
  return fail(FERRUM_STAGE_SHAPE, FERRUM_STATUS_INVALID_VALUE, fmt, kEntry, a, b);
}

}  // namespace

int w4a16(const void* A, const void* B, void* C, const void* s, int prob_m, int prob_n, int prob_k,
          void* workspace, int groupsize, int dev, cudaStream_t stream, int thread_k, int thread_n,
          int sms, int max_par, int prob_n_full) {
  clear_error();
  // ---- arguments, before anything touches the device
  if (prob_m < 0) return invalid("%s: prob_m=%d must be >= 0", prob_m);
  if (prob_n <= 0) return invalid("%s: prob_n=%d must be > 0", prob_n);
  if (prob_k <= 0) return invalid("%s: prob_k=%d must be > 0", prob_k);
  if (max_par < 1) return invalid("%s: max_par=%d must be >= 1", max_par);
  if (sms != -1 && sms < 1) return invalid("%s: sms=%d must be -1 (all) or >= 1", sms);
  if (dev < 0) return invalid("%s: dev=%d must be a device ordinal >= 0", dev);
  if (prob_n % 64 != 0) return bad_shape("%s: prob_n=%d must be divisible by 64", prob_n);
  if (prob_k % 128 != 0) return bad_shape("%s: prob_k=%d must be divisible by 128", prob_k);
  if (groupsize != -1 && groupsize != 128)
    return bad_shape("%s: groupsize=%d must be -1 (channelwise) or 128", groupsize);
  const int n_full = prob_n_full == -1 ? prob_n : prob_n_full;
  if (n_full < prob_n || n_full % 64 != 0)
    return bad_shape("%s: prob_n_full=%d must be -1 or a multiple of 64 that is >= prob_n=%d",
                     prob_n_full, prob_n);
  if (n_full > FERRUM_MAX_DIM || prob_k > FERRUM_MAX_DIM)
    return bad_shape("%s: prob_n_full=%d and prob_k=%d must be at most FERRUM_MAX_DIM (2^28)", n_full, prob_k);
  NConfig nc = NConfig::N128_K128;
  const bool forced = !(thread_k == -1 && thread_n == -1);
  if (forced && !forced_config(thread_k, thread_n, &nc))
    return bad_shape("%s: (thread_k=%d, thread_n=%d) must be (-1,-1), (128,128), (128,256), (64,256) or (128,64)",
                     thread_k, thread_n);
  if (prob_m == 0) return 0;
  if (int st = check_pointer(kEntry, "A", A, 16)) return st;
  if (int st = check_pointer(kEntry, "B", B, 16)) return st;
  if (int st = check_pointer(kEntry, "C", C, 16)) return st;
  if (int st = check_pointer(kEntry, "s", s, 16)) return st;
  if (int st = check_pointer(kEntry, "workspace", workspace, 4)) return st;

  constexpr int kBits = 4;
  int m8 = slab_m8(prob_m);
  if (forced) {
    if (nc == NConfig::N256_K128 && m8 > kDeepTileMaxM8)
      return bad_shape("%s: tile (thread_k=128, thread_n=256) serves prob_m <= 16, got prob_m=%d", prob_m);
    if (int st = check_forced_tile(kEntry, tile_info(m8, nc, kBits), prob_n, prob_k)) return st;
  }
  // One lock per column tile: the narrowest tile this call can use must fit in
  // the documented workspace of max(1, n/128) * max_par locks.
  const int64_t lock_slots = static_cast<int64_t>(std::max(1, prob_n / 128)) * max_par;
  const int narrowest = forced ? tile_info(m8, nc, kBits).n_tile : (prob_n % 128 == 0 ? 128 : 64);
  if (lock_slots < prob_n / narrowest)
    return bad_shape("%s: a workspace of max(1, n/128)*max_par locks cannot cover %d column tiles "
                     "(max_par=%d); raise max_par",
                     prob_n / narrowest, max_par);
  DeviceFacts facts{};
  if (int st = query_device(kEntry, dev, sms, &facts)) return st;
  if (!forced) nc = auto_config(prob_m, prob_n, prob_k, groupsize, facts.sms, AType::F16, WType::U4B8, facts.hopper);
  else if (nc == NConfig::N256_K64 && m8 == 8 && facts.hopper) nc = NConfig::N256_K64_WGMMA;
  fit_shared_memory(facts.max_smem, kBits, !forced, &nc, &m8);  // the check below reports a misfit
  const TileInfo tile = tile_info(m8, nc, kBits);
  if (int st = check_tile_fits(kEntry, tile, prob_n, prob_k)) return st;
  const int n_tiles = column_tiles(tile, prob_n);
  const int k_tiles = prob_k / tile.k_tile;
  // Slabs in flight per launch: each needs its own locks.
  const int64_t par_limit = std::min<int64_t>(max_par, lock_slots / n_tiles);
  if (static_cast<int64_t>(par_limit) * n_tiles * k_tiles > INT32_MAX)
    return bad_shape("%s: problem too large: %d column tiles x %d k tiles", n_tiles, k_tiles);
  if (static_cast<size_t>(facts.max_smem) < tile.smem_bytes)
    return fail(FERRUM_STAGE_MAX_SHARED_MEMORY, cudaErrorInvalidConfiguration,
                "%s: tile needs %zu bytes of shared memory, device %d offers %d", kEntry,
                tile.smem_bytes, dev, facts.max_smem);

  // ---- device
  DeviceGuard guard;
  if (int st = guard.enter(kEntry, dev)) return st;

  // ---- launches: each covers up to par_limit slabs of tile.m_rows rows
  const int rows_per_launch = static_cast<int>(std::min<int64_t>(
      par_limit * tile.m_rows, static_cast<int64_t>(INT32_MAX / 2)));
  const auto* a_bytes = static_cast<const char*>(A);
  auto* c_bytes = static_cast<char*>(C);
  for (int row0 = 0; row0 < prob_m; row0 += rows_per_launch) {
    const int m = std::min(rows_per_launch, prob_m - row0);
    Args args{};
    args.a = a_bytes + static_cast<size_t>(row0) * prob_k * 2;
    args.b = B;
    args.c = c_bytes + static_cast<size_t>(row0) * prob_n * 2;
    args.s = s;
    args.locks = static_cast<int*>(workspace);
    args.m = m;
    args.n = prob_n;
    args.k = prob_k;
    args.a_row_int4 = prob_k / 8;
    args.b_row_int4 = n_full / 2;
    args.s_row_halves = n_full;
    args.group_shift = groupsize == -1 ? -1 : 7;  // groupsize 128
    args.slabs = (m + tile.m_rows - 1) / tile.m_rows;
    int stage = FERRUM_STAGE_KERNEL_LAUNCH;
    const cudaError_t err =
        launch_gemm(AType::F16, WType::U4B8, m8, nc, args, Launch{facts.sms, dev, stream}, &stage);
    if (err != cudaSuccess) return fail_cuda(stage, err, "marlin_cuda: launch");
  }
  return 0;
}

}  // namespace ferrum::dense

extern "C" int marlin_cuda(const void* A, const void* B, void* C, const void* s, int prob_m,
                           int prob_n, int prob_k, void* workspace, int groupsize, int dev,
                           ferrum_stream_t stream, int thread_k, int thread_n, int sms, int max_par,
                           int prob_n_full) {
  return ferrum::dense::w4a16(A, B, C, s, prob_m, prob_n, prob_k, workspace, groupsize, dev,
                              reinterpret_cast<cudaStream_t>(stream), thread_k, thread_n, sms,
                              max_par, prob_n_full);
}
