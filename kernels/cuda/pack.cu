// CUDA build of the shard pack/unpack kernels (nvcc). The design is kernels/common/pack_kernel.h;
// kernels/hip/pack.hip is the same design for HIP. Compile with -I kernels.
#include "common/nereus_gpu.h"

#if !defined(__CUDACC__) || defined(__HIPCC__)
#error "kernels/cuda/pack.cu is the CUDA translation unit: compile it with nvcc"
#endif

#include "common/pack_kernel.h"
