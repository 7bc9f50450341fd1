// Multi-tensor shard pack/unpack: the one kernel design, shared by the CUDA and HIP builds.
//
// Include nereus_gpu.h first. This file names no vendor API (tests/pure/test_kernels_design.py
// checks that): the dialect lives in nereus_gpu.h only.
//
// One launch covers every slice of a transfer: block b takes tiles b, b + gridDim.x, ...; a
// binary search over the descriptor table's FIRST_TILE column (the prefix sums of per-slice tile
// counts) maps a tile to its slice, so no slice gets a launch of its own. Inside a tile the
// threads of the block copy consecutive copy units (16 bytes when the slice's alignment allows,
// else 8/4/2/1), NEREUS_PACK_UNROLL loads in flight per thread before the stores.
#pragma once

#include "common/pack_api.h"

namespace nereus_pack {

// Index of the slice that owns tile t: the last row with FIRST_TILE <= t.
NEREUS_HD int64_t find_slice(const int64_t* desc, int64_t n_slices, int64_t t) {
  int64_t lo = 0;
  int64_t hi = n_slices - 1;
  while (lo < hi) {
    const int64_t mid = (lo + hi + 1) >> 1;
    if (desc[mid * NEREUS_PACK_DESC_FIELDS + NEREUS_PACK_FIRST_TILE] <= t) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return lo;
}

// One descriptor row, read once per tile into registers (the copies may alias the table as far
// as the compiler knows, so reading fields inside the copy loop would reload them).
struct Slice {
  char* strided;
  char* packed;
  int64_t row_bytes;
  uint32_t n1;  // rows < 2^31 (the table builder keeps larger slices out)
  uint32_t n2;
  int64_t s0;
  int64_t s1;
  int64_t s2;
};

// Byte offset of row `row` from the slice origin on the strided side.
NEREUS_HD int64_t row_offset(const Slice& sl, uint32_t row) {
  if (sl.n1 == 1 && sl.n2 == 1) {
    return static_cast<int64_t>(row) * sl.s0;
  }
  const uint32_t q = row / sl.n2;
  const uint32_t i2 = row - q * sl.n2;
  const uint32_t i0 = q / sl.n1;
  const uint32_t i1 = q - i0 * sl.n1;
  return static_cast<int64_t>(i0) * sl.s0 + static_cast<int64_t>(i1) * sl.s1 +
         static_cast<int64_t>(i2) * sl.s2;
}

// Copies rows [row0, row0 + nrows), bytes [col0, col0 + ncol) of each, in units of V.
// When nrows > 1 the tile holds whole rows (col0 == 0, ncol == row_bytes), so the packed side
// of the tile is one contiguous run either way.
template <typename V, bool Unpack>
NEREUS_HD void copy_tile_units(const Slice& sl, uint32_t row0, uint32_t nrows, int64_t col0,
                               uint32_t ncol, uint32_t tid, uint32_t nthreads) {
  const int64_t unit = static_cast<int64_t>(sizeof(V));
  const uint32_t units_per_row = ncol / static_cast<uint32_t>(sizeof(V));
  const uint32_t total = nrows * units_per_row;
  char* packed = sl.packed + static_cast<int64_t>(row0) * sl.row_bytes + col0;
  const bool one_row = nrows == 1;
  char* strided = sl.strided + (one_row ? row_offset(sl, row0) + col0 : 0);
  // The strided address of unit i, computed where it is used (not kept across the two phases:
  // fewer registers, more resident blocks).
  auto strided_at = [&](uint32_t i) -> char* {
    if (one_row) {
      return strided + static_cast<int64_t>(i) * unit;
    }
    const uint32_t r = i / units_per_row;
    const uint32_t c = i - r * units_per_row;
    return strided + row_offset(sl, row0 + r) + static_cast<int64_t>(c) * unit;
  };
  for (uint32_t base = tid; base < total; base += nthreads * NEREUS_PACK_UNROLL) {
    V units[NEREUS_PACK_UNROLL];
    NEREUS_UNROLL
    for (int u = 0; u < NEREUS_PACK_UNROLL; ++u) {
      const uint32_t i = base + static_cast<uint32_t>(u) * nthreads;
      if (i < total) {
        const char* from = Unpack ? packed + static_cast<int64_t>(i) * unit : strided_at(i);
        NEREUS_CHECK_ALIGNED(from, sizeof(V));
        units[u] = nereus_load<V>(from);
      }
    }
    NEREUS_UNROLL
    for (int u = 0; u < NEREUS_PACK_UNROLL; ++u) {
      const uint32_t i = base + static_cast<uint32_t>(u) * nthreads;
      if (i < total) {
        char* to = Unpack ? strided_at(i) : packed + static_cast<int64_t>(i) * unit;
        NEREUS_CHECK_ALIGNED(to, sizeof(V));
        nereus_store<V>(to, units[u]);
      }
    }
  }
}

// The work of one thread of the block that handles tile t.
template <bool Unpack>
NEREUS_HD void copy_tile(const int64_t* desc, int64_t n_slices, int64_t t, uint32_t tid,
                         uint32_t nthreads) {
  const int64_t* d = desc + find_slice(desc, n_slices, t) * NEREUS_PACK_DESC_FIELDS;
  Slice sl;
  sl.strided = reinterpret_cast<char*>(d[NEREUS_PACK_STRIDED_PTR]);
  sl.packed = reinterpret_cast<char*>(d[NEREUS_PACK_PACKED_PTR]);
  sl.row_bytes = d[NEREUS_PACK_ROW_BYTES];
  sl.n1 = static_cast<uint32_t>(d[NEREUS_PACK_N1]);
  sl.n2 = static_cast<uint32_t>(d[NEREUS_PACK_N2]);
  sl.s0 = d[NEREUS_PACK_S0];
  sl.s1 = d[NEREUS_PACK_S1];
  sl.s2 = d[NEREUS_PACK_S2];
  const int64_t rows = d[NEREUS_PACK_ROWS];
  const int64_t seg_bytes = d[NEREUS_PACK_SEG_BYTES];
  const int64_t tiles_per_row = d[NEREUS_PACK_TILES_PER_ROW];
  const int64_t tile_rows = d[NEREUS_PACK_TILE_ROWS];
  const int64_t vec_bytes = d[NEREUS_PACK_VEC_BYTES];
  const int64_t u = t - d[NEREUS_PACK_FIRST_TILE];
  int64_t row0;
  int64_t nrows;
  int64_t col0;
  int64_t ncol;
  if (tiles_per_row > 1) {
    row0 = u / tiles_per_row;
    col0 = (u - row0 * tiles_per_row) * seg_bytes;
    nrows = 1;
    ncol = sl.row_bytes - col0 < seg_bytes ? sl.row_bytes - col0 : seg_bytes;
  } else {
    row0 = u * tile_rows;
    nrows = rows - row0 < tile_rows ? rows - row0 : tile_rows;
    col0 = 0;
    ncol = sl.row_bytes;
  }
  const uint32_t r0 = static_cast<uint32_t>(row0);
  const uint32_t nr = static_cast<uint32_t>(nrows);
  const uint32_t nc = static_cast<uint32_t>(ncol);
  switch (vec_bytes) {
    case 16:
      copy_tile_units<nereus_vec<16>::type, Unpack>(sl, r0, nr, col0, nc, tid, nthreads);
      break;
    case 8:
      copy_tile_units<nereus_vec<8>::type, Unpack>(sl, r0, nr, col0, nc, tid, nthreads);
      break;
    case 4:
      copy_tile_units<nereus_vec<4>::type, Unpack>(sl, r0, nr, col0, nc, tid, nthreads);
      break;
    case 2:
      copy_tile_units<nereus_vec<2>::type, Unpack>(sl, r0, nr, col0, nc, tid, nthreads);
      break;
    default:
      copy_tile_units<nereus_vec<1>::type, Unpack>(sl, r0, nr, col0, nc, tid, nthreads);
      break;
  }
}

}  // namespace nereus_pack

#if NEREUS_GPU

template <bool Unpack>
__global__ void NEREUS_LAUNCH_BOUNDS(NEREUS_PACK_THREADS, NEREUS_PACK_MIN_BLOCKS)
    nereus_pack_kernel(const int64_t* desc, int64_t n_slices, int64_t n_tiles) {
  for (int64_t t = blockIdx.x; t < n_tiles; t += gridDim.x) {
    nereus_pack::copy_tile<Unpack>(desc, n_slices, t, threadIdx.x, blockDim.x);
  }
}

extern "C" int nereus_pack_launch(const int64_t* desc, int64_t n_slices, int64_t n_tiles,
                                  int unpack, void* stream) {
  if (n_slices <= 0 || n_tiles <= 0) {
    return 0;
  }
  const unsigned int blocks = static_cast<unsigned int>(
      n_tiles < NEREUS_PACK_MAX_BLOCKS ? n_tiles : NEREUS_PACK_MAX_BLOCKS);
  gpuStream_t s = static_cast<gpuStream_t>(stream);
  if (unpack) {
    nereus_pack_kernel<true><<<blocks, NEREUS_PACK_THREADS, 0, s>>>(desc, n_slices, n_tiles);
  } else {
    nereus_pack_kernel<false><<<blocks, NEREUS_PACK_THREADS, 0, s>>>(desc, n_slices, n_tiles);
  }
  return static_cast<int>(gpuGetLastError());
}

extern "C" const char* nereus_pack_error_string(int code) {
  return gpuGetErrorString(static_cast<gpuError_t>(code));
}

extern "C" const char* nereus_pack_dialect(void) { return NEREUS_GPU_DIALECT; }

#endif  // NEREUS_GPU
