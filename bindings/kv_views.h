// KV memory handed in from Python (numpy arrays, DLPack tensors such as vLLM's torch KV caches),
// checked in one place: Engine.register_kv_caches (activekv._engine) and
// ConnectorCore.register_kv_caches (activekv._vllm) take and refuse the same tensors, with the same
// messages and the same Python error, activekv._engine.EngineInputError (a ValueError).
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <cstdint>
#include <exception>
#include <string>
#include <utility>
#include <vector>

#include "bindings/common.h"
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

// `item` as an Array that `rule` allows, taken as it is: never converted or copied, as the engine
// reads and writes the caller's memory in place. Otherwise EngineInputError naming `name`, what
// was expected and what it got, for the first of these checks that fails.
template <typename Array>
Array checked_kv_view(nb::handle item, const std::string& name, const KvViewRule& rule) {
  using offload::EngineInputError;
  Array array;
  if (!nb::try_cast<Array>(item, array, /*convert=*/false)) {
    nb::ndarray<nb::ro> read_only;
    if (nb::try_cast(item, read_only, /*convert=*/false)) {
      throw EngineInputError(name + ": expected a writable array (loads write into it); got a "
                                    "read-only one");
    }
    throw EngineInputError(name + ": expected an array (numpy or DLPack); got " +
                           nb::type_name(item.type()).c_str());
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
  const nb::dlpack::dtype dtype = array.dtype();
  bool taken = false;
  for (const nb::dlpack::dtype& accepted : rule.dtypes) taken = taken || dtype == accepted;
  if (!taken) {
    throw EngineInputError(name + ": expected " + rule.dtypes_text + "; got " + dtype_text(dtype));
  }
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
  // The engine reads and writes whole elements in place (SPEC.md §1): a misaligned one would be
  // undefined behaviour in C++ and a fault on some devices, so it is refused, not copied.
  const std::size_t element_bytes = dtype.bits / 8;
  const std::size_t offset = reinterpret_cast<std::uintptr_t>(array.data()) % element_bytes;
  if (offset != 0) {
    throw EngineInputError(name + ": expected an array aligned to its " +
                           std::to_string(element_bytes) + "-byte elements; got one that starts " +
                           std::to_string(offset) + " byte(s) past such a boundary");
  }
  return array;
}

// One KV-cache layer handed to `engine` as `name` ("layers[0]", "kv_caches[\"...\"]"): writable
// (loads write into it), on the engine's device, C-contiguous
// [2, num_device_blocks, block_size, num_kv_heads, head_dim]. Its elements are the layout's raw
// words (as numpy callers hold them: numpy has no bfloat16) or of the layout's own dtype (as
// vLLM's torch KV caches are). Any other type of that width (int16; float16 under bf16) says the
// layout does not describe the tensor: the compressed modes would read its bits as another dtype.
inline nb::ndarray<> kv_layer_view(nb::handle item, const std::string& name,
                                   const offload::Engine& engine) {
  using Code = nb::dlpack::dtype_code;
  const offload::KvBlockLayout& layout = engine.layout();
  const std::size_t bits = offload::dtype_bytes(layout.dtype()) * 8;
  const nb::dlpack::dtype own =
      scalar_dtype(layout.dtype() == offload::KvDtype::bf16 ? Code::Bfloat : Code::Float, bits);
  const nb::dlpack::dtype words = scalar_dtype(Code::UInt, bits);
  KvViewRule rule{{words, own},
                  "raw words (" + dtype_text(words) + ") or " + dtype_text(own) + ", of dtype " +
                      offload::dtype_name(layout.dtype()),
                  {2, static_cast<std::int64_t>(engine.num_device_blocks()), layout.block_size(),
                   layout.num_kv_heads(), layout.head_dim()},
                  "[2, num_device_blocks, block_size, num_kv_heads, head_dim]",
                  engine.route(),
                  engine.cuda_device()};
  return checked_kv_view<nb::ndarray<>>(item, name, rule);
}

// For modules other than activekv._engine: raise their EngineInputError (KV tensors refused
// above, bad input to the engine) as activekv._engine's class, so Python catches one type whichever
// binding refused. Call after translate_standard_exceptions: later translators are tried first.
inline void translate_engine_input_errors() {
  nb::object type = nb::module_::import_("activekv._engine").attr("EngineInputError");
  nb::register_exception_translator(
      [](const std::exception_ptr& raised, void* payload) {
        try {
          std::rethrow_exception(raised);
        } catch (const offload::EngineInputError& error) {
          PyErr_SetString(static_cast<PyObject*>(payload), error.what());
        }
      },
      type.release().ptr());  // a reference kept for good: modules are never unloaded
}

}  // namespace activekv::bindings
