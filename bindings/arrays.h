// Array shapes as the bindings check and name them: a shape's text, its extents, C order.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

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

}  // namespace activekv::bindings
