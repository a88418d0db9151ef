// KV memory handed in from Python (numpy arrays, DLPack tensors such as vLLM's torch KV caches),
// checked in one place: Engine.register_kv_caches (activekv._engine) and
// ConnectorCore.register_kv_caches (activekv._vllm) take and refuse the same tensors, with the same
// messages and the same Python error, activekv._engine.EngineInputError (a ValueError).
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <algorithm>
#include <cstdint>
#include <exception>
#include <string>
#include <utility>
#include <vector>

#include "bindings/arrays.h"
#include "offload/engine.h"
#include "offload/kv_layout.h"

namespace activekv::bindings {

// numpy's and torch's spelling of a DLPack element type: uint16, float32, bfloat16.
inline std::string dtype_text(const nb::dlpack::dtype& dtype) {
  using Code = nb::dlpack::dtype_code;
  const std::pair<Code, const char*> kinds[] = {{Code::Int, "int"},       {Code::UInt, "uint"},
                                                {Code::Float, "float"},   {Code::Bfloat, "bfloat"},
                                                {Code::Complex, "complex"}, {Code::Bool, "bool"}};
  const std::string lanes = dtype.lanes == 1 ? "" : "x" + std::to_string(dtype.lanes);
  for (const auto& [code, name] : kinds) {
    if (dtype.code == static_cast<std::uint8_t>(code)) {
      return name + std::to_string(dtype.bits) + lanes;
    }
  }
  return "DLPack type code " + std::to_string(dtype.code) + " of " + std::to_string(dtype.bits) +
         " bits" + lanes;
}

// Where a DLPack array's memory is, as messages name it: "host memory", "cuda:1".
inline std::string device_text(std::int32_t type, std::int32_t id) {
  if (type == nb::device::cpu::value) return "host memory";
  if (type == nb::device::cuda::value) return "cuda:" + std::to_string(id);
  return "DLPack device type " + std::to_string(type);
}

// One lane of `bits`-bit elements of kind `code`.
inline nb::dlpack::dtype scalar_dtype(nb::dlpack::dtype_code code, std::size_t bits) {
  return {static_cast<std::uint8_t>(code), static_cast<std::uint8_t>(bits), 1};
}

// What an array handed to the engine must be; writable or not is the Array type's part
// (nb::ndarray<> or nb::ndarray<nb::ro>).
struct KvViewRule {
  std::vector<nb::dlpack::dtype> dtypes;  // the element types taken
  std::string dtypes_text;                // how messages name them: "raw words (uint8)"
  std::vector<std::int64_t> shape;
  std::string shape_text;                 // the names of shape's dimensions
  offload::Route route = offload::Route::cpu;
  int cuda_device = -1;                   // the GPU its memory must be on (CUDA route)
};

// Why numpy could not hand `item` over (DLPack and the buffer protocol both refuse it), naming
// the dtype or strides refused; empty for anything that is not a numpy-like array.
inline std::string unexported_array_problem(nb::handle item) {
  nb::object dtype = nb::getattr(item, "dtype", nb::none());
  nb::object shape = nb::getattr(item, "shape", nb::none());
  nb::object strides = nb::getattr(item, "strides", nb::none());
  if (!nb::hasattr(dtype, "isnative") || !nb::hasattr(dtype, "kind") ||
      !nb::hasattr(dtype, "itemsize") || !nb::isinstance<nb::tuple>(shape) ||
      !nb::isinstance<nb::tuple>(strides) || nb::len(shape) != nb::len(strides)) {
    return {};
  }
  const std::string text = nb::str(dtype).c_str();
  const std::string kind = nb::cast<std::string>(nb::str(dtype.attr("kind")));
  if (kind.size() != 1 || std::string("biufc").find(kind) == std::string::npos) {
    return "expected an array of numbers (numpy or DLPack); got one of dtype " + text;
  }
  if (!nb::cast<bool>(dtype.attr("isnative"))) {
    return "expected an array in this machine's byte order; got one of dtype " + text +
           " (byte-swapped)";
  }
  const auto element = nb::cast<std::int64_t>(dtype.attr("itemsize"));
  std::vector<std::int64_t> byte_strides;
  bool whole = true;
  const nb::tuple extents = nb::borrow<nb::tuple>(shape);
  const nb::tuple steps = nb::borrow<nb::tuple>(strides);
  for (std::size_t dim = 0; dim < steps.size(); ++dim) {
    std::int64_t extent = 0;
    std::int64_t stride = 0;
    if (!nb::try_cast<std::int64_t>(extents[dim], extent) ||
        !nb::try_cast<std::int64_t>(steps[dim], stride)) {
      return {};
    }
    byte_strides.push_back(stride);
    // As numpy exports: a dimension of extent 1 may have any stride, never used.
    whole = whole && (extent == 1 || (element > 0 && stride % element == 0));
  }
  if (!whole) {
    return "expected strides that are multiples of its " + std::to_string(element) +
           "-byte elements; got " + list_text(byte_strides) + " (in bytes)";
  }
  return {};
}

// `item` as an Array in the memory `rule` asks for (not yet its type or shape). Cast once: a
// DLPack capsule can be taken only once.
template <typename Array>
Array device_array(nb::handle item, const std::string& name, const KvViewRule& rule) {
  using offload::EngineInputError;
  Array array;
  if (!nb::try_cast<Array>(item, array, /*convert=*/false)) {
    const std::string problem = unexported_array_problem(item);
    if (!problem.empty()) throw EngineInputError(name + ": " + problem);
    const std::string type = nb::type_name(item.type()).c_str();
    nb::ndarray<nb::ro> read_only;
    if (nb::try_cast(item, read_only, /*convert=*/false)) {
      // A numpy scalar hands over its value read-only (buffer protocol, no DLPack): it is not
      // an array to write into at all.
      if (read_only.ndim() == 0 && !nb::hasattr(item, "__dlpack__")) {
        throw EngineInputError(name + ": expected an array (numpy or DLPack); got a " + type +
                               " scalar");
      }
      throw EngineInputError(name + ": expected a writable array (loads write into it); got a "
                                    "read-only one");
    }
    throw EngineInputError(name + ": expected an array (numpy or DLPack); got " + type);
  }
  const bool on_cuda = rule.route == offload::Route::cuda;
  const std::int32_t type = array.device_type();
  const std::int32_t id = array.device_id();
  if (on_cuda ? type != nb::device::cuda::value || id != rule.cuda_device
              : type != nb::device::cpu::value) {
    const std::string expected =
        on_cuda ? "on cuda:" + std::to_string(rule.cuda_device) : std::string("in host memory");
    throw EngineInputError(name + ": expected an array " + expected +
                           " (the engine's device is \"" + offload::route_name(rule.route) +
                           "\"); got one " + (type == nb::device::cpu::value ? "in " : "on ") +
                           device_text(type, id));
  }
  return array;
}

// EngineInputError naming `name` unless `array`'s element type is one of `rule`'s.
template <typename Array>
void check_dtype(const Array& array, const std::string& name, const KvViewRule& rule) {
  const nb::dlpack::dtype dtype = array.dtype();
  bool taken = false;
  for (const nb::dlpack::dtype& accepted : rule.dtypes) taken = taken || dtype == accepted;
  if (!taken) {
    throw offload::EngineInputError(name + ": expected " + rule.dtypes_text + "; got " +
                                    dtype_text(dtype));
  }
}

// The engine reads and writes whole elements in place (SPEC.md §1): a misaligned one would be
// undefined behaviour in C++ and a fault on some devices, so it is refused, not copied.
template <typename Array>
void check_aligned(const Array& array, const std::string& name, std::size_t element_bytes) {
  const std::size_t offset = reinterpret_cast<std::uintptr_t>(array.data()) % element_bytes;
  if (offset != 0) {
    throw offload::EngineInputError(
        name + ": expected an array aligned to its " + std::to_string(element_bytes) +
        "-byte elements; got one that starts " + std::to_string(offset) +
        " byte(s) past such a boundary");
  }
}

// EngineInputError naming `name` unless `array` is of `rule`'s shape, C-contiguous and aligned.
template <typename Array>
void check_dense(const Array& array, const std::string& name, const KvViewRule& rule) {
  using offload::EngineInputError;
  const std::vector<std::int64_t> shape = shape_of(array);
  if (shape != rule.shape) {
    throw EngineInputError(name + ": expected shape " + rule.shape_text + " = " +
                           list_text(rule.shape) + "; got " + list_text(shape));
  }
  if (!c_contiguous(array)) {
    const std::vector<std::int64_t> strides(array.stride_ptr(), array.stride_ptr() + array.ndim());
    throw EngineInputError(name + ": expected a C-contiguous array; got strides " +
                           list_text(strides) + " (in elements) for shape " + list_text(shape));
  }
  check_aligned(array, name, array.dtype().bits / 8);
}

// `item` as an Array that `rule` allows, taken as it is: never converted or copied, as the engine
// reads and writes the caller's memory in place. Otherwise EngineInputError naming `name`, what
// was expected and what it got, for the first of these checks that fails.
template <typename Array>
Array checked_kv_view(nb::handle item, const std::string& name, const KvViewRule& rule) {
  Array array = device_array<Array>(item, name, rule);
  check_dtype(array, name, rule);
  check_dense(array, name, rule);
  return array;
}

// One KV-cache layer as the engine views it: the array (which keeps its memory alive) and where
// each block's K and V are in it.
struct KvLayerView {
  nb::ndarray<> array;
  offload::KvStrides strides;
};

// vLLM's per-layer view [num_device_blocks, num_kv_heads, block_size, 2 * head_dim] (see
// kv_layer_view), its strides read from the array. `rule.dtypes` are the typed elements it may
// hold; bytes (int8, uint8) are taken too, the last dimension then in bytes.
inline KvLayerView vllm_layer_view(const nb::ndarray<>& array, const std::string& name,
                                   const offload::Engine& engine, KvViewRule rule) {
  using Code = nb::dlpack::dtype_code;
  using offload::EngineInputError;
  const offload::KvBlockLayout& layout = engine.layout();
  const std::size_t word = offload::dtype_bytes(layout.dtype());
  rule.dtypes.push_back(scalar_dtype(Code::Int, 8));
  rule.dtypes.push_back(scalar_dtype(Code::UInt, 8));
  rule.dtypes_text += " (or its bytes, int8 or uint8)";
  check_dtype(array, name, rule);
  const std::size_t element = array.dtype().bits / 8;
  const auto blocks = static_cast<std::int64_t>(engine.num_device_blocks());
  const std::vector<std::int64_t> expected{
      blocks, layout.num_kv_heads(), layout.block_size(),
      static_cast<std::int64_t>(2 * layout.head_dim() * word / element)};
  const std::vector<std::int64_t> shape = shape_of(array);
  if (shape != expected) {
    std::string why;
    if (shape.size() == 4 && shape[0] > blocks && blocks > 0 && shape[0] % blocks == 0) {
      why = " (kernel blocks of " + std::to_string(shape[2]) + " tokens splitting each KV cache "
            "block of " + std::to_string(layout.block_size()) + " tokens are not served)";
    }
    throw EngineInputError(name + ": expected shape [num_device_blocks, num_kv_heads, "
                           "block_size, 2 * head_dim" + (element == word ? "" : " * bytes") +
                           "] = " + list_text(expected) + "; got " + list_text(shape) + why);
  }
  // DLPack's compact row-major form has no strides; a dimension of extent 1 any (torch leaves odd
  // ones there), never used.
  std::vector<std::int64_t> strides{expected[1] * expected[2] * expected[3],
                                    expected[2] * expected[3], expected[3], 1};
  for (std::size_t dim = 0; dim < 4 && array.stride_ptr() != nullptr; ++dim) {
    strides[dim] = expected[dim] == 1 && dim != 3 ? 0 : array.stride(dim);
  }
  const bool negative = std::any_of(strides.begin(), strides.end(), [](auto v) { return v < 0; });
  if (strides[3] != 1 || negative) {
    throw EngineInputError(name + ": expected strides with the last one 1 and none negative "
                           "(each token's K and V words contiguous); got " + list_text(strides) +
                           " (in elements)");
  }
  check_aligned(array, name, word);
  const auto bytes = [&](std::int64_t stride) { return static_cast<std::size_t>(stride) * element; };
  const offload::KvStrides placed{bytes(strides[0]), bytes(strides[2]), bytes(strides[1]),
                                  layout.head_dim() * word};
  for (const std::size_t stride : {placed.block, placed.token, placed.head}) {
    if (stride % word != 0) {
      throw EngineInputError(name + ": expected strides that keep words aligned (multiples of " +
                             std::to_string(word) + " bytes); got " + list_text(strides) +
                             " (in " + std::to_string(element) + "-byte elements)");
    }
  }
  return {array, placed};
}

// One KV-cache layer handed to `engine` as `name` ("layers[0]", "kv_caches[\"...\"]"): writable
// (loads write into it), on the engine's device, aligned, in one of two forms (SPEC.md §1):
// * C-contiguous [2, num_device_blocks, block_size, num_kv_heads, head_dim] (K, then V);
// * vLLM's per-layer view [num_device_blocks, num_kv_heads, block_size, 2 * head_dim] with any
//   strides but a contiguous last dimension: each (block, head, token) holds K's head_dim words,
//   then V's. This is what vLLM 0.33.0's allocate_kv_cache hands out under every KVCacheLayout.
// Its elements are the layout's raw words (as numpy callers hold them: numpy has no bfloat16) or
// of the layout's own dtype (as vLLM's torch KV caches are); the view form also as bytes (int8 or
// uint8, its last dimension in bytes). Any other type of that width (int16; float16 under bf16)
// says the layout does not describe the tensor: the compressed modes would read its bits as
// another dtype.
inline KvLayerView kv_layer_view(nb::handle item, const std::string& name,
                                 const offload::Engine& engine) {
  using Code = nb::dlpack::dtype_code;
  const offload::KvBlockLayout& layout = engine.layout();
  const std::size_t word = offload::dtype_bytes(layout.dtype());
  const nb::dlpack::dtype own =
      scalar_dtype(layout.dtype() == offload::KvDtype::bf16 ? Code::Bfloat : Code::Float, word * 8);
  const nb::dlpack::dtype words = scalar_dtype(Code::UInt, word * 8);
  const auto blocks = static_cast<std::int64_t>(engine.num_device_blocks());
  const std::vector<std::int64_t> dense_shape{2, blocks, layout.block_size(),
                                              layout.num_kv_heads(), layout.head_dim()};
  const std::string types = "raw words (" + dtype_text(words) + ") or " + dtype_text(own) +
                            ", of dtype " + offload::dtype_name(layout.dtype());
  const KvViewRule rule{{words, own},
                        types,
                        dense_shape,
                        "[2, num_device_blocks, block_size, num_kv_heads, head_dim]",
                        engine.route(),
                        engine.cuda_device()};
  nb::ndarray<> array = device_array<nb::ndarray<>>(item, name, rule);
  if (array.ndim() == 4) return vllm_layer_view(array, name, engine, rule);
  check_dtype(array, name, rule);
  check_dense(array, name, rule);
  return {array, offload::dense_kv_strides(layout, engine.num_device_blocks())};
}

// For modules other than activekv._engine: raise their EngineInputError (KV tensors refused
// above, bad input to the engine) and EngineStateError (engine hooks out of order) as
// activekv._engine's classes, so Python catches one type whichever binding raised it. Call after
// translate_standard_exceptions: later translators are tried first.
template <typename Error>
void translate_as_engine_error(const char* name) {
  nb::object type = nb::module_::import_("activekv._engine").attr(name);
  nb::register_exception_translator(
      [](const std::exception_ptr& raised, void* payload) {
        try {
          std::rethrow_exception(raised);
        } catch (const Error& error) {
          PyErr_SetString(static_cast<PyObject*>(payload), error.what());
        }
      },
      type.release().ptr());  // a reference kept for good: modules are never unloaded
}

inline void translate_engine_errors() {
  translate_as_engine_error<offload::EngineInputError>("EngineInputError");
  translate_as_engine_error<offload::EngineStateError>("EngineStateError");
}

}  // namespace activekv::bindings
