// Pieces both modules bind the same way.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
// robin_map for its version only: nanobind's static library compiles this copy of it in.
#include <tsl/robin_growth_policy.h>

#include <cstdint>
#include <exception>
#include <new>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/build_info.h"
#include "common/sbom_facts.h"
#include "cuda/probe.h"

// The C++ runtime linked into the module (zig's libc++, with its libc++abi and libunwind, in the
// hermetic build; libstdc++ where a g++ builds the wheel).
#if defined(_LIBCPP_VERSION)
ACTIVEKV_SBOM_FACT(kCxxRuntimeFact, "cxx_runtime=libc++ " ACTIVEKV_SBOM_TEXT(_LIBCPP_VERSION));
#elif defined(_GLIBCXX_RELEASE)
ACTIVEKV_SBOM_FACT(kCxxRuntimeFact, "cxx_runtime=libstdc++ " ACTIVEKV_SBOM_TEXT(_GLIBCXX_RELEASE));
#endif
// The binding library and the hash map it carries, as compiled into this module (NB_STATIC).
#define ACTIVEKV_SBOM_VERSION(major, minor, patch) \
  ACTIVEKV_SBOM_TEXT(major) "." ACTIVEKV_SBOM_TEXT(minor) "." ACTIVEKV_SBOM_TEXT(patch)
ACTIVEKV_SBOM_FACT(kNanobindFact, "nanobind=" ACTIVEKV_SBOM_VERSION(NB_VERSION_MAJOR, NB_VERSION_MINOR,
                                                                  NB_VERSION_PATCH));
ACTIVEKV_SBOM_FACT(kRobinMapFact, "robin_map=" ACTIVEKV_SBOM_VERSION(TSL_RH_VERSION_MAJOR,
                                                                   TSL_RH_VERSION_MINOR,
                                                                   TSL_RH_VERSION_PATCH));

namespace activekv::bindings {

namespace nb = nanobind;

// "[2, 16, 8]": a shape or strides as error messages show them.
inline std::string list_text(const std::vector<std::int64_t>& values) {
  std::string text = "[";
  for (std::size_t i = 0; i < values.size(); ++i) {
    text += (i == 0 ? "" : ", ") + std::to_string(values[i]);
  }
  return text + "]";
}

template <typename... Args>
std::vector<std::int64_t> shape_of(const nb::ndarray<Args...>& array) {
  return {array.shape_ptr(), array.shape_ptr() + array.ndim()};
}

// C order, in elements; a dimension of extent 1 may have any stride (as numpy has it).
template <typename... Args>
bool c_contiguous(const nb::ndarray<Args...>& array) {
  if (array.stride_ptr() == nullptr) return true;
  std::int64_t contiguous = 1;
  for (std::size_t dim = array.ndim(); dim-- > 0;) {
    const auto extent = static_cast<std::int64_t>(array.shape(dim));
    if (extent != 1 && array.stride(dim) != contiguous) return false;
    contiguous *= extent;
  }
  return true;
}

// An integer argument as Python gave it (an int, or anything with __index__), of any size. The
// callee checks its range, so a value that does not fit the C++ type is a ValueError naming the
// argument rather than nanobind's generic "incompatible function arguments" TypeError; anything
// that is not an integer at all still is that TypeError.
struct PyInteger {
  nb::object value;

  // The value as T when low <= value <= high, else nothing.
  template <typename T>
  std::optional<T> within(T low, T high) const {
    T converted{};
    if (!nb::try_cast<T>(value, converted, /*convert=*/false)) return std::nullopt;
    if (converted < low || converted > high) return std::nullopt;
    return converted;
  }

  std::string text() const { return nb::repr(value).c_str(); }
};

// `argument` as T within [low, high]; else Error("<name>: expected <expected>; got <value>").
template <typename Error, typename T>
T integer_argument(const PyInteger& argument, const std::string& name, T low, T high,
                   const std::string& expected) {
  if (const std::optional<T> value = argument.within<T>(low, high)) return *value;
  throw Error(name + ": expected " + expected + "; got " + argument.text());
}

// Raised to Python (as RuntimeError) when the CUDA runtime reports an error.
inline void throw_on_cuda_error(int code, const char* what) {
  if (code != 0) {
    throw std::runtime_error(std::string(what) + ": CUDA error " + std::to_string(code) + " (" +
                             akv_cuda_error_string(code) + ")");
  }
}

inline nb::dict build_info_dict() {
  const BuildInfo info = build_info();
  nb::dict result;
  result["version"] = info.version;
  result["cxx_compiler"] = info.cxx_compiler;
  result["cuda_architectures"] = info.cuda_architectures;
  result["cuda_runtime_version"] = info.cuda_runtime_version;
  return result;
}

// Each module carries its own copy of the C++ runtime (zig's libc++, linked in), so its exceptions
// match only its own type_info: nanobind's built-in translator, which lives in whichever module
// was imported first, cannot catch another module's std::invalid_argument (Python then sees
// "exception could not be translated"). Every module translates its own standard exceptions,
// as nanobind would; called first in NB_MODULE, so the module's specific ones are tried before.
inline void translate_standard_exceptions() {
  nb::register_exception_translator([](const std::exception_ptr& raised, void*) {
    try {
      std::rethrow_exception(raised);
    } catch (const std::bad_alloc& error) {
      PyErr_SetString(PyExc_MemoryError, error.what());
    } catch (const std::out_of_range& error) {
      PyErr_SetString(PyExc_IndexError, error.what());
    } catch (const std::overflow_error& error) {
      PyErr_SetString(PyExc_OverflowError, error.what());
    } catch (const std::invalid_argument& error) {
      PyErr_SetString(PyExc_ValueError, error.what());
    } catch (const std::domain_error& error) {
      PyErr_SetString(PyExc_ValueError, error.what());
    } catch (const std::length_error& error) {
      PyErr_SetString(PyExc_ValueError, error.what());
    } catch (const std::range_error& error) {
      PyErr_SetString(PyExc_ValueError, error.what());
    } catch (const std::exception& error) {
      PyErr_SetString(PyExc_RuntimeError, error.what());
    }
  });
}

// Binds build_info() and cuda_device_count() into `m`.
inline void bind_build_and_device(nb::module_& m) {
  m.def("build_info", &build_info_dict,
        "Version, compiler, CUDA architectures and CUDA runtime version of this build.");
  m.def(
      "cuda_device_count",
      []() {
        int count = 0;
        throw_on_cuda_error(akv_cuda_device_count(&count), "cuda_device_count");
        return count;
      },
      "Number of visible CUDA devices; raises RuntimeError naming the CUDA error when the "
      "driver or a device is missing.",
      nb::call_guard<nb::gil_scoped_release>());  // the first call initialises CUDA
}

}  // namespace activekv::bindings

namespace nanobind::detail {

// Takes what operator.index takes, as a Python int; the signature shows `int`.
template <>
struct type_caster<activekv::bindings::PyInteger> {
  NB_TYPE_CASTER(activekv::bindings::PyInteger, const_name("int"))

  bool from_python(handle source, uint8_t, cleanup_list*) noexcept {
    if (!PyIndex_Check(source.ptr())) return false;
    PyObject* index = PyNumber_Index(source.ptr());
    if (index == nullptr) {
      PyErr_Clear();
      return false;
    }
    value.value = steal(index);
    return true;
  }

  static handle from_cpp(const activekv::bindings::PyInteger& integer, rv_policy,
                         cleanup_list*) noexcept {
    return integer.value.inc_ref();
  }
};

}  // namespace nanobind::detail
