// Integer arguments taken as Python gives them and range-checked by the callee, so a value out of
// range is a ValueError naming the argument (PyInteger and its type caster).
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include <cstdint>
#include <optional>
#include <string>

namespace activekv::bindings {

namespace nb = nanobind;

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
