// torch extension nereus._kernels, CUDA build: the binding (common/pack_binding.h) over the
// kernels of pack.cu. kernels/hip/pack_ext.cpp is the same binding for the HIP build.
#include "common/pack_binding.h"
