// activekv._engine: the KV-cache offload engine.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>

#include "bindings/common.h"
#include "offload/kv_layout.h"

namespace nb = nanobind;
using activekv::offload::KvBlockLayout;
using activekv::offload::KvDtype;

NB_MODULE(_engine, m) {
  m.doc() = "ActiveKV engine: KV blocks kept in host RAM and staged back layer by layer.";
  activekv::bindings::bind_build_and_device(m);

  nb::exception<activekv::offload::LayoutError>(m, "LayoutError", PyExc_ValueError);

  nb::enum_<KvDtype>(m, "KvDtype", "Element type of offloaded KV, carried as raw bits.")
      .value("fp16", KvDtype::fp16)
      .value("bf16", KvDtype::bf16)
      .value("fp32", KvDtype::fp32);

  nb::class_<KvBlockLayout>(m, "KvBlockLayout",
                            "Geometry of one KV block: K and V of every layer.")
      .def(nb::init<std::uint32_t, std::uint32_t, std::uint32_t, std::uint32_t, KvDtype>(),
           nb::arg("num_layers"), nb::arg("block_size"), nb::arg("num_kv_heads"),
           nb::arg("head_dim"), nb::arg("dtype"))
      .def_prop_ro("num_layers", &KvBlockLayout::num_layers)
      .def_prop_ro("block_size", &KvBlockLayout::block_size)
      .def_prop_ro("num_kv_heads", &KvBlockLayout::num_kv_heads)
      .def_prop_ro("head_dim", &KvBlockLayout::head_dim)
      .def_prop_ro("dtype", &KvBlockLayout::dtype)
      .def_prop_ro("bytes_per_tensor", &KvBlockLayout::bytes_per_tensor)
      .def_prop_ro("bytes_per_layer", &KvBlockLayout::bytes_per_layer)
      .def_prop_ro("bytes_per_block", &KvBlockLayout::bytes_per_block)
      .def("offset_of", &KvBlockLayout::offset_of, nb::arg("layer"), nb::arg("value"),
           "Byte offset of one layer's K (value=False) or V (value=True) inside a block.")
      .def("__repr__",
           [](const KvBlockLayout& layout) { return "KvBlockLayout(" + layout.describe() + ")"; });

  m.def(
      "cuda_checksum",
      [](nb::ndarray<const std::uint32_t, nb::ndim<1>, nb::c_contig, nb::device::cpu> words) {
        std::uint64_t sum = 0;
        activekv::bindings::throw_on_cuda_error(akv_cuda_checksum(words.data(), words.size(), &sum),
                                                "cuda_checksum");
        return sum;
      },
      nb::arg("words"),
      "Sums a 1-D uint32 host array with the wheel's own CUDA kernel on device 0.");
}
