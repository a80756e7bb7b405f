// ferrum_marlin_mm: the general dense Marlin GEMM. Reads the versioned launch
// struct, checks every rule of ferrum_marlin.h before touching the device,
// gathers A for act-order, and runs the dense kernel once for all rows (locks
// per block range, so the workspace does not grow with the problem).
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "../status.h"
#include "act_order.h"
#include "launch_plan.h"

namespace ferrum::dense {

namespace {

constexpr const char* kEntry = "ferrum_marlin_mm";
constexpr unsigned kKnownFlags = FERRUM_MM_FLAG_ACT_ORDER | FERRUM_MM_FLAG_K_FULL |
                                 FERRUM_MM_FLAG_HAS_ZERO_POINTS | FERRUM_MM_FLAG_ATOMIC_ADD |
                                 FERRUM_MM_FLAG_FP32_REDUCE;

template <class... Args>
int invalid(const char* fmt, Args... args) {
  return fail(FERRUM_STAGE_ARGUMENT, FERRUM_STATUS_INVALID_VALUE, fmt, kEntry, args...);
}

template <class... Args>
int bad_shape(const char* fmt, Args... args) {
  return fail(FERRUM_STAGE_SHAPE, FERRUM_STATUS_INVALID_VALUE, fmt, kEntry, args...);
}

const char* type_name(int a_type) { return a_type == FERRUM_DTYPE_BF16 ? "bf16" : "f16"; }

// Every rule that needs no device: types, flags, shapes, group sizes and the
// consistency of modes and buffers.
int check_problem(const FerrumMarlinLaunch& l) {
  if (l.a_type != FERRUM_DTYPE_F16 && l.a_type != FERRUM_DTYPE_BF16)
    return invalid("%s: a_type=%d must be FERRUM_DTYPE_F16 (1) or FERRUM_DTYPE_BF16 (2)", l.a_type);
  if (l.b_type < FERRUM_WEIGHT_U4 || l.b_type > FERRUM_WEIGHT_FE4M3FN)
    return invalid("%s: b_type=%d must be a FERRUM_WEIGHT_* id (1..4)", l.b_type);
  if (l.flags & ~kKnownFlags) return invalid("%s: flags=0x%x has unknown bits", l.flags);
  if (l.m < 0) return invalid("%s: m=%d must be >= 0", l.m);
  if (l.n <= 0) return invalid("%s: n=%d must be > 0", l.n);
  if (l.k <= 0) return invalid("%s: k=%d must be > 0", l.k);
  if (l.n % 64 != 0) return bad_shape("%s: n=%d must be divisible by 64", l.n);
  if (l.n > FERRUM_MAX_DIM || l.k > FERRUM_MAX_DIM || l.lda > FERRUM_MAX_DIM)
    return bad_shape("%s: n=%d, k=%d and lda=%d must be at most FERRUM_MAX_DIM=%d", l.n, l.k, l.lda, FERRUM_MAX_DIM);
  if (l.k % 128 != 0) return bad_shape("%s: k=%d must be divisible by 128", l.k);
  // With act-order, a is read only through perm, at columns below min(k, lda)
  // (a K shard whose rows were padded has k > its activations' width).
  const bool gathered = (l.flags & FERRUM_MM_FLAG_ACT_ORDER) != 0;
  if (l.lda <= 0 || l.lda % 8 != 0 || (!gathered && l.lda < l.k))
    return bad_shape(gathered ? "%s: lda=%d must be a positive multiple of 8 (k=%d)"
                              : "%s: lda=%d must be >= k=%d and a multiple of 8",
                     l.lda, l.k);
  const bool fp8 = l.b_type == FERRUM_WEIGHT_FE4M3FN;
  const int g = l.group_size;
  if (fp8 ? (g != -1 && g != 128) : !int_group_size_served(g))
    return bad_shape(fp8 ? "%s: group_size=%d must be -1 or 128 for FE4M3FN weights"
                         : "%s: group_size=%d must be -1, 32, 64 or a power of two >= 128",
                     g);
  // K_FULL clear: a shard of an act-order layer's rows; its scales keep all
  // of the layer's groups and each row names its own (g_idx).
  const bool k_sharded = !(l.flags & FERRUM_MM_FLAG_K_FULL);
  if (k_sharded) {
    if (!(l.flags & FERRUM_MM_FLAG_ACT_ORDER))
      return invalid("%s: FERRUM_MM_FLAG_K_FULL may be clear only with FERRUM_MM_FLAG_ACT_ORDER (flags=0x%x)",
                     l.flags);
    if (l.num_groups < 1)
      return bad_shape("%s: num_groups=%d must be >= 1 (the groups of the whole layer)", l.num_groups);
    if (l.n % 128 != 0)
      return bad_shape("%s: n=%d must be divisible by 128 with FERRUM_MM_FLAG_K_FULL clear", l.n);
  } else {
    if (g > 0 && l.k % g != 0) return bad_shape("%s: k=%d must be divisible by group_size=%d", l.k, g);
    const int groups = g == -1 ? 1 : l.k / g;
    if (l.num_groups != groups)
      return bad_shape("%s: num_groups=%d must be %d (k / group_size, or 1 when channelwise)", l.num_groups,
                       groups);
  }

  const bool zp_type = l.b_type == FERRUM_WEIGHT_U4;
  const bool zp_flag = (l.flags & FERRUM_MM_FLAG_HAS_ZERO_POINTS) != 0;
  if (zp_flag != zp_type)
    return invalid(zp_type ? "%s: b_type U4 needs FERRUM_MM_FLAG_HAS_ZERO_POINTS (b_type=%d)"
                           : "%s: FERRUM_MM_FLAG_HAS_ZERO_POINTS is only valid with b_type U4 (b_type=%d)",
                   l.b_type);
  if ((l.zero_points != nullptr) != zp_type)
    return invalid(zp_type ? "%s: zero_points must not be null for b_type U4 (b_type=%d)"
                           : "%s: zero_points must be null unless b_type is U4 (b_type=%d)",
                   l.b_type);
  const bool act_order = (l.flags & FERRUM_MM_FLAG_ACT_ORDER) != 0;
  if (act_order) {
    if (fp8) return invalid("%s: act-order is not defined for FE4M3FN weights (b_type=%d)", l.b_type);
    if (g == -1) return invalid("%s: act-order needs grouped scales, got group_size=%d", g);
    if (l.g_idx == nullptr || l.perm == nullptr || l.a_tmp == nullptr)
      return invalid("%s: act-order needs g_idx, perm and a_tmp (m=%d)", l.m);
  } else if (l.g_idx != nullptr || l.perm != nullptr || l.a_tmp != nullptr) {
    return invalid("%s: g_idx, perm and a_tmp must be null without FERRUM_MM_FLAG_ACT_ORDER (flags=0x%x)",
                   l.flags);
  }
  const bool fp32_reduce = (l.flags & FERRUM_MM_FLAG_FP32_REDUCE) != 0;
  if (fp32_reduce && (l.flags & FERRUM_MM_FLAG_ATOMIC_ADD))
    return invalid("%s: FERRUM_MM_FLAG_ATOMIC_ADD and FERRUM_MM_FLAG_FP32_REDUCE exclude each other "
                   "(flags=0x%x)",
                   l.flags);
  if ((l.c_tmp != nullptr) != fp32_reduce)
    return invalid(fp32_reduce ? "%s: c_tmp must not be null with FERRUM_MM_FLAG_FP32_REDUCE (flags=0x%x)"
                               : "%s: c_tmp must be null without FERRUM_MM_FLAG_FP32_REDUCE (flags=0x%x)",
                   l.flags);
  if (l.a_scales != nullptr) return invalid("%s: a_scales is reserved and must be null (m=%d)", l.m);
  if (l.sms != -1 && l.sms < 1) return invalid("%s: sms=%d must be -1 (all) or >= 1", l.sms);
  if (l.device < 0) return invalid("%s: device=%d must be a device ordinal >= 0", l.device);
  if (!(l.thread_k == -1 && l.thread_n == -1)) {
    NConfig nc;
    if (!forced_config(l.thread_k, l.thread_n, &nc))
      return bad_shape("%s: (thread_k=%d, thread_n=%d) must be (-1,-1), (128,128), (128,256), (64,256) "
                       "or (128,64)",
                       l.thread_k, l.thread_n);
    if (nc == NConfig::N256_K128 && l.m > 16)
      return bad_shape("%s: tile (thread_k=128, thread_n=256) serves m <= 16, got m=%d", l.m);
    if (k_sharded && nc != NConfig::N128_K128)
      return bad_shape("%s: FERRUM_MM_FLAG_K_FULL clear runs the (thread_k=128, thread_n=128) tile, got "
                       "(%d, %d)",
                       l.thread_k, l.thread_n);
  }
  return 0;
}

int check_buffers(const FerrumMarlinLaunch& l) {
  const bool zp = l.b_type == FERRUM_WEIGHT_U4;
  const bool act_order = (l.flags & FERRUM_MM_FLAG_ACT_ORDER) != 0;
  const bool fp32_reduce = (l.flags & FERRUM_MM_FLAG_FP32_REDUCE) != 0;
  if (int st = check_pointer(kEntry, "a", l.a, 16)) return st;
  if (int st = check_pointer(kEntry, "b", l.b, 16)) return st;
  if (int st = check_pointer(kEntry, "c", l.c, 16)) return st;
  if (int st = check_pointer(kEntry, "b_scales", l.b_scales, 16)) return st;
  if (int st = check_pointer(kEntry, "workspace", l.workspace, 4)) return st;
  if (zp)
    if (int st = check_pointer(kEntry, "zero_points", l.zero_points, 16)) return st;
  if (act_order) {
    if (int st = check_pointer(kEntry, "g_idx", l.g_idx, 4)) return st;
    if (int st = check_pointer(kEntry, "perm", l.perm, 4)) return st;
    if (int st = check_pointer(kEntry, "a_tmp", l.a_tmp, 16)) return st;
  }
  if (fp32_reduce)
    if (int st = check_pointer(kEntry, "c_tmp", l.c_tmp, 16)) return st;
  if (l.bias != nullptr && !aligned(l.bias, 16))
    return invalid("%s: bias must be 16-byte aligned (n=%d)", l.n);
  return 0;
}

// Capacities that depend on the resolved multiprocessor count.
int check_capacities(const FerrumMarlinLaunch& l, int sms) {
  const size_t need_ws = static_cast<size_t>(FERRUM_MM_WORKSPACE_INTS_PER_SM) * sms * sizeof(int);
  if (l.workspace_bytes < need_ws)
    return bad_shape("%s: workspace_bytes=%zu must be >= %zu (FERRUM_MM_WORKSPACE_INTS_PER_SM * sms=%d int32)",
                     l.workspace_bytes, need_ws, sms);
  if (l.flags & FERRUM_MM_FLAG_FP32_REDUCE) {
    const size_t need = static_cast<size_t>(FERRUM_MM_C_TMP_FLOATS_PER_SM) * sms * sizeof(float);
    if (l.c_tmp_bytes < need)
      return bad_shape("%s: c_tmp_bytes=%zu must be >= %zu (FERRUM_MM_C_TMP_FLOATS_PER_SM * sms=%d floats)",
                       l.c_tmp_bytes, need, sms);
  }
  if (l.flags & FERRUM_MM_FLAG_ACT_ORDER) {
    const size_t need = static_cast<size_t>(l.m) * l.k * 2;
    if (l.a_tmp_bytes < need)
      return bad_shape("%s: a_tmp_bytes=%zu must be >= m*k*2 = %zu", l.a_tmp_bytes, need);
  }
  return 0;
}

// Slab height (in 8-row units) of a K-sharded act-order launch: its kernels
// are built for slabs of 8, 16 and 64 rows.
int row_groups_m8(int m) { return m <= 8 ? 1 : (m <= 16 ? 2 : 8); }

}  // namespace

int mm(const FerrumMarlinLaunch* launch) {
  clear_error();
  if (launch == nullptr)
    return fail(FERRUM_STAGE_ARGUMENT, FERRUM_STATUS_INVALID_VALUE, "%s: launch must not be null", kEntry);
  if (launch->abi_version != FERRUM_MM_LAUNCH_VERSION)
    return invalid("%s: abi_version=%u is unknown; this library reads version %d", launch->abi_version,
                   FERRUM_MM_LAUNCH_VERSION);
  if (launch->struct_size < sizeof(FerrumMarlinLaunch))
    return invalid("%s: struct_size=%u is smaller than version 1's %zu bytes", launch->struct_size,
                   sizeof(FerrumMarlinLaunch));
  // Later versions append fields; this library reads the version-1 prefix.
  FerrumMarlinLaunch l;
  memcpy(&l, launch, sizeof(l));
  if (int st = check_problem(l)) return st;
  if (l.m == 0) return 0;
  if (int st = check_buffers(l)) return st;

  const AType a_type = static_cast<AType>(l.a_type);
  const WType w_type = static_cast<WType>(l.b_type);
  const int bits = weight_bits(w_type);
  const bool k_sharded = !(l.flags & FERRUM_MM_FLAG_K_FULL);
  int m8 = k_sharded ? row_groups_m8(l.m) : slab_m8(l.m);
  const bool forced = !(l.thread_k == -1 && l.thread_n == -1);
  NConfig nc = NConfig::N128_K128;
  if (forced) {
    forced_config(l.thread_k, l.thread_n, &nc);
    if (int st = check_forced_tile(kEntry, tile_info(m8, nc, bits), l.n, l.k)) return st;
  }
  DeviceFacts facts{};
  if (int st = query_device(kEntry, l.device, l.sms, &facts)) return st;
  if (int st = check_capacities(l, facts.sms)) return st;
  if (k_sharded) {
    // Slabs over 16 rows on Hopper: the warp-specialised kernel's dequantising
    // tiles (16-row slabs have no row-group mode); otherwise the 8-warp tile.
    nc = NConfig::N128_K128_ROW_GROUPS;
    if (!forced && l.m > 16) {
      // (whole column tiles: the row-group windows have no partial tile)
      const NConfig wide = auto_config(l.m, l.n, l.k, l.group_size, facts.sms, a_type, w_type, facts.hopper);
      if (is_wide(wide) && l.n % tile_info(1, wide, bits).n_tile == 0) nc = wide;
    }
  } else if (!forced) {
    nc = auto_config(l.m, l.n, l.k, l.group_size, facts.sms, a_type, w_type, facts.hopper);
  }
  else if (nc == NConfig::N256_K64 && m8 == 8 && facts.hopper) nc = NConfig::N256_K64_WGMMA;
  fit_shared_memory(facts.max_smem, bits, !forced, &nc, &m8);  // the check below reports a misfit
  const TileInfo tile = tile_info(m8, nc, bits);
  if (int st = check_tile_fits(kEntry, tile, l.n, l.k)) return st;
  const int64_t slabs = (static_cast<int64_t>(l.m) + tile.m_rows - 1) / tile.m_rows;
  if (slabs * column_tiles(tile, l.n) * (l.k / tile.k_tile) > INT32_MAX)
    return bad_shape("%s: problem too large: m=%d, n=%d, k=%d gives more than 2^31 work units", l.m, l.n, l.k);
  if (static_cast<size_t>(facts.max_smem) < tile.smem_bytes)
    return fail(FERRUM_STAGE_MAX_SHARED_MEMORY, cudaErrorInvalidConfiguration,
                "%s: tile needs %zu bytes of shared memory, device %d offers %d", kEntry, tile.smem_bytes,
                l.device, facts.max_smem);

  DeviceGuard guard;
  if (int st = guard.enter(kEntry, l.device)) return st;
  const cudaStream_t stream = reinterpret_cast<cudaStream_t>(l.stream);
  const void* a = l.a;
  int lda = l.lda;
  if (l.flags & FERRUM_MM_FLAG_ACT_ORDER) {
    const cudaError_t err = gather_columns(l.a, l.lda, l.perm, l.a_tmp, l.m, l.k, facts.sms, facts.max_smem, stream);
    if (err != cudaSuccess) return fail_cuda(FERRUM_STAGE_ACT_ORDER_LAUNCH, err, "ferrum_marlin_mm: act-order gather");
    a = l.a_tmp;
    lda = l.k;
  }
  Args args{};
  args.a = a;
  args.b = l.b;
  args.c = l.c;
  args.s = l.b_scales;
  args.z = l.zero_points;
  args.bias = l.bias;
  args.locks = static_cast<int*>(l.workspace);
  args.c_tmp = static_cast<float*>(l.c_tmp);
  args.m = l.m;
  args.n = l.n;
  args.k = l.k;
  args.a_row_int4 = lda / 8;
  args.b_row_int4 = l.n * bits / 8;  // (bits/2) * n int32 = n * bits / 8 int4
  args.s_row_halves = l.n;
  args.z_row_int4 = l.n / 32;
  args.group_shift = l.group_size == -1 ? -1 : log2_exact(l.group_size);
  if (k_sharded) {
    args.row_groups = l.g_idx;
    args.num_groups = l.num_groups;
  }
  args.slabs = static_cast<int>(slabs);
  args.lock_by_range = true;
  args.fp32_reduce = (l.flags & FERRUM_MM_FLAG_FP32_REDUCE) != 0;
  // Act-order: the GEMM overlaps the gather's launch and run with its weight
  // fetches (programmatic dependent launch, Hopper).
  const bool overlap = (l.flags & FERRUM_MM_FLAG_ACT_ORDER) != 0 && facts.hopper;
  args.a_after_previous_kernel = (l.flags & FERRUM_MM_FLAG_ACT_ORDER) != 0;
  int stage = FERRUM_STAGE_KERNEL_LAUNCH;
  const cudaError_t err =
      launch_gemm(a_type, w_type, m8, nc, args, Launch{facts.sms, l.device, stream, overlap}, &stage);
  if (err != cudaSuccess) {
    char what[96];
    snprintf(what, sizeof(what), "ferrum_marlin_mm: launch (%s activations, b_type %d)", type_name(l.a_type),
             l.b_type);
    return fail_cuda(stage, err, what);
  }
  return 0;
}

}  // namespace ferrum::dense

extern "C" int ferrum_marlin_mm(const FerrumMarlinLaunch* launch) { return ferrum::dense::mm(launch); }
