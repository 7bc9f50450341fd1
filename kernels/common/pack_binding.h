// torch binding of the pack/unpack kernels, shared by kernels/cuda/pack_ext.cpp and
// kernels/hip/pack_ext.cpp. Vendor-neutral: it uses only torch's CPU-level headers and takes the
// stream as the integer handle Python reads from torch.cuda.current_stream().cuda_stream (a
// cudaStream_t on CUDA builds of torch, a hipStream_t on ROCm builds).
#pragma once

// (ATen's tensor, TORCH_CHECK and torch's pybind11 casters: a third less to parse than
// torch/extension.h, which adds the whole C++ frontend)
#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>
#include <torch/python.h>

#include "common/pack_api.h"

namespace nereus_pack_binding {

inline void launch(const at::Tensor& desc, int64_t n_tiles, int64_t stream, bool unpack) {
  TORCH_CHECK(desc.is_cuda(), "nereus pack: descriptor table must be on the GPU");
  TORCH_CHECK(desc.scalar_type() == at::kLong, "nereus pack: descriptor table must be int64");
  TORCH_CHECK(desc.dim() == 2 && desc.size(1) == NEREUS_PACK_DESC_FIELDS && desc.is_contiguous(),
              "nereus pack: descriptor table must be contiguous (n, ", NEREUS_PACK_DESC_FIELDS,
              ")");
  TORCH_CHECK(n_tiles >= 0, "nereus pack: negative tile count");
  const int err = nereus_pack_launch(desc.data_ptr<int64_t>(), desc.size(0), n_tiles,
                                     unpack ? 1 : 0, reinterpret_cast<void*>(stream));
  TORCH_CHECK(err == 0, "nereus pack: kernel launch failed: ", nereus_pack_error_string(err));
}

inline void pack(const at::Tensor& desc, int64_t n_tiles, int64_t stream) {
  launch(desc, n_tiles, stream, false);
}

inline void unpack(const at::Tensor& desc, int64_t n_tiles, int64_t stream) {
  launch(desc, n_tiles, stream, true);
}

}  // namespace nereus_pack_binding

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "Nereus shard pack/unpack kernels (one launch per transfer buffer)";
  m.def("pack", &nereus_pack_binding::pack, "gather the table's strided slices into the buffer",
        pybind11::arg("desc"), pybind11::arg("n_tiles"), pybind11::arg("stream"));
  m.def("unpack", &nereus_pack_binding::unpack, "scatter the buffer into the table's slices",
        pybind11::arg("desc"), pybind11::arg("n_tiles"), pybind11::arg("stream"));
  m.attr("LAYOUT_VERSION") = NEREUS_PACK_LAYOUT_VERSION;
  m.attr("DESC_FIELDS") = NEREUS_PACK_DESC_FIELDS;
  m.attr("DIALECT") = nereus_pack_dialect();
}
