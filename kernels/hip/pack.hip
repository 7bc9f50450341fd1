// HIP build of the shard pack/unpack kernels (hipcc, AMD: HIP_PLATFORM=amd). The design is
// kernels/common/pack_kernel.h; kernels/cuda/pack.cu is the same design for CUDA. Compile with
// -I kernels.
#include "common/nereus_gpu.h"

#if !defined(__HIPCC__) && !defined(__HIP__)
#error "kernels/hip/pack.hip is the HIP translation unit: compile it with hipcc"
#endif

#include "common/pack_kernel.h"
