// Host mode of the pack/unpack design, for the CPU tests: the device code of pack_kernel.h run
// serially over the tiles and threads of one launch. No thread reads what another writes, so the
// serial order gives the same bytes as the GPU. Build: c++ -O2 -fno-strict-aliasing -shared
// -fPIC -I kernels kernels/common/pack_host.cpp.
#include "common/nereus_gpu.h"

#if NEREUS_GPU
#error "pack_host.cpp is the host mode: compile it with a plain C++ compiler"
#endif

#include "common/pack_kernel.h"

int nereus_host_misaligned = 0;

// Returns 0; 1 for a bad thread count; 2 when some access was not aligned to its unit (a GPU
// would have faulted; the bytes are still copied).
extern "C" int nereus_pack_host(const int64_t* desc, int64_t n_slices, int64_t n_tiles, int unpack,
                                int threads) {
  if (threads <= 0) {
    return 1;
  }
  nereus_host_misaligned = 0;
  const uint32_t nthreads = static_cast<uint32_t>(threads);
  for (int64_t t = 0; t < n_tiles; ++t) {
    for (uint32_t tid = 0; tid < nthreads; ++tid) {
      if (unpack) {
        nereus_pack::copy_tile<true>(desc, n_slices, t, tid, nthreads);
      } else {
        nereus_pack::copy_tile<false>(desc, n_slices, t, tid, nthreads);
      }
    }
  }
  return nereus_host_misaligned == 0 ? 0 : 2;
}

extern "C" int nereus_pack_host_desc_fields(void) { return NEREUS_PACK_DESC_FIELDS; }
extern "C" int nereus_pack_host_layout_version(void) { return NEREUS_PACK_LAYOUT_VERSION; }
