// Placeholder with the exact mode only; the compressed modes follow SPEC.md §5.
#include "offload/compression.h"

#include <cstring>

namespace activekv::offload {

CompressionMode parse_mode(std::string_view name) {
  if (name == "exact") return CompressionMode::exact;
  if (name == "int8") return CompressionMode::int8;
  if (name == "fp8_e4m3") return CompressionMode::fp8_e4m3;
  throw LayoutError("mode: expected \"exact\", \"int8\" or \"fp8_e4m3\"; got \"" +
                    std::string(name) + "\"");
}

const char* mode_name(CompressionMode mode) {
  switch (mode) {
    case CompressionMode::exact:
      return "exact";
    case CompressionMode::int8:
      return "int8";
    case CompressionMode::fp8_e4m3:
      return "fp8_e4m3";
  }
  return "unknown";
}

std::size_t stored_layer_bytes(const KvBlockLayout& layout, CompressionMode mode) {
  const std::size_t elements =
      std::size_t{layout.block_size()} * layout.num_kv_heads() * layout.head_dim();
  const std::size_t groups = std::size_t{layout.block_size()} * layout.num_kv_heads();
  if (mode == CompressionMode::exact) return 2 * elements * dtype_bytes(layout.dtype());
  return 2 * elements + 2 * groups * sizeof(float);
}

void encode_layer(const KvBlockLayout& layout, CompressionMode mode, const void* k, const void* v,
                  std::uint8_t* out) {
  if (mode != CompressionMode::exact) throw LayoutError("mode: not implemented yet");
  const std::size_t half = layout.bytes_per_tensor();
  std::memcpy(out, k, half);
  std::memcpy(out + half, v, half);
}

void decode_layer(const KvBlockLayout& layout, CompressionMode mode, const std::uint8_t* stored,
                  void* k, void* v) {
  if (mode != CompressionMode::exact) throw LayoutError("mode: not implemented yet");
  const std::size_t half = layout.bytes_per_tensor();
  std::memcpy(k, stored, half);
  std::memcpy(v, stored + half, half);
}

}  // namespace activekv::offload
