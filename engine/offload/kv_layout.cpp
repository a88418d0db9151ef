#include "offload/kv_layout.h"

#include <initializer_list>
#include <limits>

namespace activekv::offload {

std::size_t dtype_bytes(KvDtype dtype) {
  switch (dtype) {
    case KvDtype::fp16:
    case KvDtype::bf16:
      return 2;
    case KvDtype::fp32:
      return 4;
  }
  throw LayoutError("dtype: expected fp16, bf16 or fp32");
}

const char* dtype_name(KvDtype dtype) {
  switch (dtype) {
    case KvDtype::fp16:
      return "fp16";
    case KvDtype::bf16:
      return "bf16";
    case KvDtype::fp32:
      return "fp32";
  }
  return "unknown";
}

namespace {

void require_positive(std::uint32_t value, const char* field) {
  if (value == 0) {
    throw LayoutError(std::string(field) + ": expected a positive value; got 0");
  }
}

}  // namespace

KvBlockLayout::KvBlockLayout(std::uint32_t num_layers, std::uint32_t block_size,
                             std::uint32_t num_kv_heads, std::uint32_t head_dim, KvDtype dtype)
    : num_layers_(num_layers),
      block_size_(block_size),
      num_kv_heads_(num_kv_heads),
      head_dim_(head_dim),
      dtype_(dtype) {
  require_positive(num_layers, "num_layers");
  require_positive(block_size, "block_size");
  require_positive(num_kv_heads, "num_kv_heads");
  require_positive(head_dim, "head_dim");
  // Reject geometries whose block size overflows size_t rather than wrapping silently: each
  // multiplication is checked (the factors are non-zero, checked above).
  std::size_t block = 1;
  for (const std::size_t factor : {std::size_t{block_size}, std::size_t{num_kv_heads},
                                   std::size_t{head_dim}, dtype_bytes(dtype), std::size_t{2},
                                   std::size_t{num_layers}}) {
    if (block > std::numeric_limits<std::size_t>::max() / factor) {
      throw LayoutError("block: expected a block size that fits in memory; got " + describe());
    }
    block *= factor;
  }
}

std::size_t KvBlockLayout::bytes_per_tensor() const {
  return static_cast<std::size_t>(block_size_) * num_kv_heads_ * head_dim_ * dtype_bytes(dtype_);
}

std::size_t KvBlockLayout::offset_of(std::uint32_t layer, bool value) const {
  if (layer >= num_layers_) {
    throw LayoutError("layer: expected 0 <= layer < " + std::to_string(num_layers_) + "; got " +
                      std::to_string(layer));
  }
  return layer * bytes_per_layer() + (value ? bytes_per_tensor() : 0);
}

std::string KvBlockLayout::describe() const {
  return "layers=" + std::to_string(num_layers_) + " block_size=" + std::to_string(block_size_) +
         " kv_heads=" + std::to_string(num_kv_heads_) + " head_dim=" + std::to_string(head_dim_) +
         " dtype=" + dtype_name(dtype_);
}

KvStrides dense_kv_strides(const KvBlockLayout& layout, std::size_t num_device_blocks) {
  const std::size_t row = layout.head_dim() * dtype_bytes(layout.dtype());
  return {layout.bytes_per_tensor(), layout.num_kv_heads() * row, row,
          num_device_blocks * layout.bytes_per_tensor()};
}

bool tensors_contiguous(const KvBlockLayout& layout, const KvStrides& strides) {
  const std::size_t row = layout.head_dim() * dtype_bytes(layout.dtype());
  return strides.head == row && strides.token == layout.num_kv_heads() * row;
}

}  // namespace activekv::offload
