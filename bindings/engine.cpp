// activekv._engine: the KV-cache offload engine.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <nanobind/stl/pair.h>

#include "bindings/common.h"
#include "offload/compression.h"
#include "offload/kv_layout.h"

namespace nb = nanobind;
using activekv::offload::KvBlockLayout;
using activekv::offload::KvDtype;
using activekv::offload::LayoutError;

namespace {

// Raw words of one block's K or V: C-contiguous [T, H, D] of the layout's word size.
using BlockWords = nb::ndarray<nb::ro, nb::ndim<3>, nb::c_contig, nb::device::cpu>;
using NumpyArray = nb::ndarray<nb::numpy>;

void check_block_words(const KvBlockLayout& layout, const BlockWords& words, const char* name) {
  const std::size_t bits = activekv::offload::dtype_bytes(layout.dtype()) * 8;
  const nb::dlpack::dtype dtype = words.dtype();
  const bool unsigned_words = dtype.code == static_cast<std::uint8_t>(nb::dlpack::dtype_code::UInt);
  if (!unsigned_words || dtype.bits != bits || dtype.lanes != 1) {
    throw LayoutError(std::string(name) + ": expected raw words (uint" + std::to_string(bits) +
                      ") of dtype " + activekv::offload::dtype_name(layout.dtype()));
  }
  if (words.shape(0) != layout.block_size() || words.shape(1) != layout.num_kv_heads() ||
      words.shape(2) != layout.head_dim()) {
    throw LayoutError(std::string(name) + ": expected shape [block_size, num_kv_heads, head_dim]"
                      " = [" + std::to_string(layout.block_size()) + ", " +
                      std::to_string(layout.num_kv_heads()) + ", " +
                      std::to_string(layout.head_dim()) + "]");
  }
}

// A new numpy array that owns `bytes` of storage, shaped and typed as asked.
NumpyArray owned_array(std::size_t bytes, std::vector<std::size_t> shape, nb::dlpack::dtype dtype) {
  auto storage = std::make_unique<std::vector<std::uint8_t>>(bytes);
  std::uint8_t* data = storage->data();
  nb::capsule owner(storage.get(), [](void* pointer) noexcept {
    delete static_cast<std::vector<std::uint8_t>*>(pointer);
  });
  storage.release();  // owned by the capsule from here on
  return NumpyArray(data, shape.size(), shape.data(), owner, nullptr, dtype);
}

nb::dlpack::dtype word_dtype(const KvBlockLayout& layout) {
  return activekv::offload::dtype_bytes(layout.dtype()) == 2 ? nb::dtype<std::uint16_t>()
                                                             : nb::dtype<std::uint32_t>();
}

}  // namespace

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
      "stored_block_bytes",
      [](const KvBlockLayout& layout, const std::string& mode) {
        return activekv::offload::stored_block_bytes(layout, activekv::offload::parse_mode(mode));
      },
      nb::arg("layout"), nb::arg("mode"),
      "Bytes one block takes in the host pool in this mode (the slot size).");

  m.def(
      "encode_layer",
      [](const KvBlockLayout& layout, const std::string& mode, BlockWords k, BlockWords v) {
        const auto parsed = activekv::offload::parse_mode(mode);
        check_block_words(layout, k, "k");
        check_block_words(layout, v, "v");
        const std::size_t bytes = activekv::offload::stored_layer_bytes(layout, parsed);
        NumpyArray out = owned_array(bytes, {bytes}, nb::dtype<std::uint8_t>());
        activekv::offload::encode_layer(layout, parsed, k.data(), v.data(),
                                        static_cast<std::uint8_t*>(out.data()));
        return out;
      },
      nb::arg("layout"), nb::arg("mode"), nb::arg("k"), nb::arg("v"),
      "Encodes one layer of one block (K and V raw words) as the host pool stores it.");

  m.def(
      "decode_layer",
      [](const KvBlockLayout& layout, const std::string& mode,
         nb::ndarray<const std::uint8_t, nb::ndim<1>, nb::c_contig, nb::device::cpu> stored) {
        const auto parsed = activekv::offload::parse_mode(mode);
        const std::size_t expected = activekv::offload::stored_layer_bytes(layout, parsed);
        if (stored.size() != expected) {
          throw LayoutError("stored: expected " + std::to_string(expected) + " bytes; got " +
                            std::to_string(stored.size()));
        }
        const std::size_t bytes = layout.bytes_per_tensor();
        std::vector<std::size_t> shape{layout.block_size(), layout.num_kv_heads(),
                                       layout.head_dim()};
        NumpyArray k = owned_array(bytes, shape, word_dtype(layout));
        NumpyArray v = owned_array(bytes, shape, word_dtype(layout));
        activekv::offload::decode_layer(layout, parsed, stored.data(), k.data(), v.data());
        return std::make_pair(k, v);
      },
      nb::arg("layout"), nb::arg("mode"), nb::arg("stored"),
      "Decodes one stored layer back into (K, V) raw words of the layout's dtype.");

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
