// Portability header: the one place that names a GPU vendor's runtime.
//
// The pack/unpack design (pack_kernel.h) is written once against the names below. The CUDA
// translation unit (kernels/cuda/pack.cu, nvcc) and the HIP one (kernels/hip/pack.hip, hipcc)
// include this header first; a plain C++ compiler gets the host mode, in which the same device
// code runs serially on the CPU (pack_host.cpp, used by the CPU tests).
#pragma once

#include <stdint.h>

#if defined(__HIPCC__) || defined(__HIP_PLATFORM_AMD__) || defined(__HIP__)
#include <hip/hip_runtime.h>
#define NEREUS_GPU 1
#define NEREUS_GPU_DIALECT "hip"
typedef hipStream_t gpuStream_t;
typedef hipError_t gpuError_t;
#define gpuSuccess hipSuccess
#define gpuGetLastError hipGetLastError
#define gpuGetErrorString hipGetErrorString
#elif defined(__CUDACC__)
#include <cuda_runtime.h>
#define NEREUS_GPU 1
#define NEREUS_GPU_DIALECT "cuda"
typedef cudaStream_t gpuStream_t;
typedef cudaError_t gpuError_t;
#define gpuSuccess cudaSuccess
#define gpuGetLastError cudaGetLastError
#define gpuGetErrorString cudaGetErrorString
#else
#define NEREUS_GPU 0
#define NEREUS_GPU_DIALECT "host"
#endif

// NEREUS_LAUNCH_BOUNDS(threads, blocks): at most `threads` per block, and registers few enough
// for `blocks` resident blocks per multiprocessor (CUDA SM, AMD compute unit). The second
// argument of __launch_bounds__ means different things per vendor: CUDA's is the minimum
// resident blocks per multiprocessor; HIP's (amdgpu_waves_per_eu) the minimum waves per
// execution unit, a SIMD — a CDNA compute unit has 4, each wave is __AMDGCN_WAVEFRONT_SIZE
// threads (64 on CDNA: MI250X gfx90a, MI300X gfx942; 32 on RDNA). So `blocks` blocks per CU
// are ceil(blocks * threads / (4 * wave)) waves per SIMD.
#if defined(__HIPCC__) || defined(__HIP_PLATFORM_AMD__) || defined(__HIP__)
#if defined(__AMDGCN_WAVEFRONT_SIZE)
#define NEREUS_WAVE_SIZE __AMDGCN_WAVEFRONT_SIZE
#else
#define NEREUS_WAVE_SIZE 64  // the host pass: the attribute only has to parse
#endif
#define NEREUS_SIMDS_PER_CU 4
#define NEREUS_WAVES_PER_EU(threads, blocks) \
  (((blocks) * (threads) + NEREUS_SIMDS_PER_CU * NEREUS_WAVE_SIZE - 1) / \
   (NEREUS_SIMDS_PER_CU * NEREUS_WAVE_SIZE))
#define NEREUS_LAUNCH_BOUNDS(threads, blocks) \
  __launch_bounds__(threads, NEREUS_WAVES_PER_EU(threads, blocks))
#elif defined(__CUDACC__)
#define NEREUS_LAUNCH_BOUNDS(threads, blocks) __launch_bounds__(threads, blocks)
#endif

#if NEREUS_GPU
#define NEREUS_HD __host__ __device__ __forceinline__
#define NEREUS_UNROLL _Pragma("unroll")
#define NEREUS_CHECK_ALIGNED(ptr, bytes) ((void)0)
#else
#define NEREUS_HD inline
#define NEREUS_UNROLL
// The host mode counts accesses a GPU would fault on (a unit not aligned to its size).
extern int nereus_host_misaligned;
#define NEREUS_CHECK_ALIGNED(ptr, bytes)                                   \
  do {                                                                     \
    if (reinterpret_cast<uintptr_t>(ptr) % (bytes) != 0) {                 \
      ++nereus_host_misaligned;                                            \
    }                                                                      \
  } while (0)
#endif

// Copy units of 1, 2, 4, 8 and 16 bytes; the 16-byte one compiles to one 128-bit load/store.
template <int Bytes> struct nereus_vec;
template <> struct nereus_vec<1> { typedef uint8_t type; };
template <> struct nereus_vec<2> { typedef uint16_t type; };
template <> struct nereus_vec<4> { typedef uint32_t type; };
#if NEREUS_GPU
template <> struct nereus_vec<8> { typedef uint2 type; };
template <> struct nereus_vec<16> { typedef uint4 type; };
#else
struct alignas(8) nereus_host_u64x1 { uint32_t v[2]; };
struct alignas(16) nereus_host_u128 { uint32_t v[4]; };
template <> struct nereus_vec<8> { typedef nereus_host_u64x1 type; };
template <> struct nereus_vec<16> { typedef nereus_host_u128 type; };
#endif

// Loads and stores of one copy unit. The host mode goes through memcpy, so that an access a GPU
// would fault on is counted (NEREUS_CHECK_ALIGNED) instead of crashing the test process.
#if NEREUS_GPU
template <typename V> NEREUS_HD V nereus_load(const char* p) { return *reinterpret_cast<const V*>(p); }
template <typename V> NEREUS_HD void nereus_store(char* p, const V& v) { *reinterpret_cast<V*>(p) = v; }
#else
#include <string.h>
template <typename V> NEREUS_HD V nereus_load(const char* p) {
  V v;
  memcpy(&v, p, sizeof(V));
  return v;
}
template <typename V> NEREUS_HD void nereus_store(char* p, const V& v) { memcpy(p, &v, sizeof(V)); }
#endif
