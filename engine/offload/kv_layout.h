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

}  // namespace activekv::offload
