// Host interface of the shard pack/unpack kernels and the layout of their descriptor table.
//
// Plain C++: included by the torch bindings (no vendor runtime needed) and by the kernel TUs.
// nereus/kernels/table.py builds the table and mirrors every constant below; the bindings
// export NEREUS_PACK_DESC_FIELDS and NEREUS_PACK_LAYOUT_VERSION so a mismatch fails at import.
//
// One row of NEREUS_PACK_DESC_FIELDS int64 per slice (slices with zero bytes are left out).
// A slice is a box of up to 3 outer dims over rows of ROW_BYTES contiguous bytes:
//   row r = (i0 * N1 + i1) * N2 + i2  lives at  STRIDED_PTR + i0*S0 + i1*S1 + i2*S2,
//   and packed at  PACKED_PTR + r * ROW_BYTES.
// Work partition: the slice owns tiles [FIRST_TILE, FIRST_TILE + N_TILES) of one launch
// (FIRST_TILE is the prefix sum of N_TILES, so rows are sorted by it). A tile is either one
// segment of SEG_BYTES of one row (TILES_PER_ROW > 1) or TILE_ROWS whole rows (TILES_PER_ROW == 1).
// Every address, ROW_BYTES, SEG_BYTES and the strides of dims with size > 1 are multiples of
// VEC_BYTES (1, 2, 4, 8 or 16): the copy unit of the slice. ROWS < 2^31; a tile holds at most
// NEREUS_PACK_MAX_TILE_BYTES bytes.
#pragma once

#include <stdint.h>

#define NEREUS_PACK_LAYOUT_VERSION 1
#define NEREUS_PACK_DESC_FIELDS 16

#define NEREUS_PACK_STRIDED_PTR 0
#define NEREUS_PACK_PACKED_PTR 1
#define NEREUS_PACK_ROW_BYTES 2
#define NEREUS_PACK_ROWS 3
#define NEREUS_PACK_N1 4
#define NEREUS_PACK_N2 5
#define NEREUS_PACK_S0 6
#define NEREUS_PACK_S1 7
#define NEREUS_PACK_S2 8
#define NEREUS_PACK_SEG_BYTES 9
#define NEREUS_PACK_TILES_PER_ROW 10
#define NEREUS_PACK_TILE_ROWS 11
#define NEREUS_PACK_VEC_BYTES 12
#define NEREUS_PACK_FIRST_TILE 13
#define NEREUS_PACK_N_TILES 14
// field 15 is padding (a row is 128 bytes)

// Threads per block, and copy units each thread keeps in flight per step.
#define NEREUS_PACK_THREADS 256
#define NEREUS_PACK_UNROLL 4
// Resident blocks per multiprocessor the compiler must allow: caps registers at 85 per thread
// (nvcc 13 for sm_90 needs 72/78 for pack/unpack without spilling), so 768 threads keep 48 kB
// of loads in flight per SM (per CU on AMD: NEREUS_LAUNCH_BOUNDS in nereus_gpu.h turns it into
// HIP's waves per SIMD).
#define NEREUS_PACK_MIN_BLOCKS 3
// Launch at most this many blocks; blocks stride over the remaining tiles.
#define NEREUS_PACK_MAX_BLOCKS (1 << 20)
// Upper bound on one tile's bytes (in-tile indices are 32-bit).
#define NEREUS_PACK_MAX_TILE_BYTES (1 << 24)

#ifdef __cplusplus
extern "C" {
#endif

// Enqueues ONE launch on `stream` that copies every slice of `desc` (a device pointer to
// n_slices rows): pack (unpack == 0) gathers strided -> packed, unpack scatters packed -> strided.
// Returns 0, or the vendor runtime's error code.
int nereus_pack_launch(const int64_t* desc, int64_t n_slices, int64_t n_tiles, int unpack,
                       void* stream);
// The vendor runtime's message for a code returned by nereus_pack_launch.
const char* nereus_pack_error_string(int code);
// "cuda" or "hip": the dialect the kernels were compiled in.
const char* nereus_pack_dialect(void);

#ifdef __cplusplus
}
#endif
