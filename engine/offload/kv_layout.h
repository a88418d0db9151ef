// Geometry of one offloaded KV block: for every layer, K and V for block_size tokens x
// num_kv_heads x head_dim elements, carried as raw bits of the model's dtype.
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

namespace activekv::offload {

enum class KvDtype : std::uint8_t { fp16, bf16, fp32 };

std::size_t dtype_bytes(KvDtype dtype);
const char* dtype_name(KvDtype dtype);

// Raised for a layout that cannot describe a block; the message names the field.
class LayoutError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

class KvBlockLayout {
 public:
  KvBlockLayout(std::uint32_t num_layers, std::uint32_t block_size, std::uint32_t num_kv_heads,
                std::uint32_t head_dim, KvDtype dtype);

  std::uint32_t num_layers() const { return num_layers_; }
  std::uint32_t block_size() const { return block_size_; }
  std::uint32_t num_kv_heads() const { return num_kv_heads_; }
  std::uint32_t head_dim() const { return head_dim_; }
  KvDtype dtype() const { return dtype_; }

  // Bytes of K (or V) for one layer of one block.
  std::size_t bytes_per_tensor() const;
  // Bytes of K and V for one layer of one block.
  std::size_t bytes_per_layer() const { return 2 * bytes_per_tensor(); }
  // Bytes of the whole block, all layers.
  std::size_t bytes_per_block() const { return bytes_per_layer() * num_layers_; }
  // Byte offset of layer `layer`'s K (value=false) or V (value=true) inside a block.
  std::size_t offset_of(std::uint32_t layer, bool value) const;

  std::string describe() const;

 private:
  std::uint32_t num_layers_;
  std::uint32_t block_size_;
  std::uint32_t num_kv_heads_;
  std::uint32_t head_dim_;
  KvDtype dtype_;
};

// Where one layer's device KV puts each block's K and V, in bytes from the layer's start
// (SPEC.md §1): K of (device block b, token n, head h) is head_dim consecutive words at
// b * block + n * token + h * head, and its V `value` bytes after that K.
struct KvStrides {
  std::size_t block;
  std::size_t token;
  std::size_t head;
  std::size_t value;
};

// The strides of the C-contiguous [2, num_device_blocks, block_size, num_kv_heads, head_dim] form
// (index 0 is K, 1 is V).
KvStrides dense_kv_strides(const KvBlockLayout& layout, std::size_t num_device_blocks);

// Whether a block's K (and V) under `strides` is one contiguous [block_size, num_kv_heads,
// head_dim] run of words, as the host pool stores it: then it moves as one copy.
bool tensors_contiguous(const KvBlockLayout& layout, const KvStrides& strides);

// A non-owning view of one layer's device KV cache (host memory on the CPU route, GPU memory on
// the CUDA route): num_device_blocks blocks of raw words of the layout's dtype, placed by
// `strides`. Whoever registers it keeps the memory alive and its extent right.
struct DeviceKvLayer {
  void* data;
  std::size_t num_device_blocks;
  KvStrides strides;
};

}  // namespace activekv::offload
