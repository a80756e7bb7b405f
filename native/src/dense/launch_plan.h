// Host-side planning shared by the dense entry points (marlin_cuda and
// ferrum_marlin_mm): slab height, tile choice, device facts, and the dispatch
// from runtime types to the instantiated kernels.
#pragma once

#include "gemm.h"

namespace ferrum::dense {

// 8-row activation tiles per slab for an m-row problem: 1, 2, 4 or 8.
int slab_m8(int m);

TileInfo tile_info(int m8, NConfig nc, int bits);

// The automatic tile for an m-row problem.
NConfig auto_config(int m, int n, int k, int group_size, int sms, AType a, WType w, bool hopper);

// (thread_k, thread_n) as the original kernel names them; false if no tile.
bool forced_config(int thread_k, int thread_n, NConfig* nc);

// Fits the planned tile (nc) and slab height (m8) to a device offering
// max_smem bytes of shared memory per block: unchanged when they fit, else
// the same problem in shorter slabs (and, when the tile may change, the deep
// 256-column tile as 128-column tiles). sm_86/89 offer ~99 KB, less than
// 64-row slabs or the deep tile take. False when no built tile fits.
bool fit_shared_memory(int max_smem, int bits, bool may_change_tile, NConfig* nc, int* m8);

// Whether a tile serves n columns: whole column tiles, or (tile.partial_n)
// a partial last one of a multiple of 64 columns.
bool tile_fits_n(const TileInfo& tile, int n);

// Column tiles of an n-column problem, a partial last one included.
int column_tiles(const TileInfo& tile, int n);

// Checks that a tile serves the problem (tile_fits_n, k whole k tiles);
// returns a status (stage "shape").
int check_tile_fits(const char* entry, const TileInfo& tile, int n, int k);

// The same for a tile the caller forced: whole column tiles only.
int check_forced_tile(const char* entry, const TileInfo& tile, int n, int k);

struct DeviceFacts {
  int sms;        // multiprocessors to use (the request, clamped to the device)
  bool hopper;    // warpgroup-MMA tiles are available (sm_90a code on a 9.x device)
  int max_smem;   // opt-in shared memory per block
};

// Queries the device (stages sm-count, device, max-shared-memory on failure).
int query_device(const char* entry, int dev, int sms_request, DeviceFacts* facts);

// Runs the kernel instantiated for (a, w, m8, nc).
cudaError_t launch_gemm(AType a, WType w, int m8, NConfig nc, Args& args, const Launch& launch, int* stage);

}  // namespace ferrum::dense
