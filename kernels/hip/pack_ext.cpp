// torch extension nereus._kernels, HIP build: the binding (common/pack_binding.h) over the
// kernels of pack.hip. kernels/cuda/pack_ext.cpp is the same binding for the CUDA build.
#include "common/pack_binding.h"
