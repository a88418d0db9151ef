// Compression of offloaded KV (SPEC.md §5): exact raw words, or int8 / fp8 (E4M3) codes with one
// float32 scale per (token, head). Bit-identical to reference/compression.py.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "offload/kv_layout.h"

namespace activekv::offload {

enum class CompressionMode : std::uint8_t { exact, int8, fp8_e4m3 };

// "exact" | "int8" | "fp8_e4m3"; LayoutError naming `mode` for anything else.
CompressionMode parse_mode(std::string_view name);
const char* mode_name(CompressionMode mode);

// Bytes one layer of one block takes in the host pool (K and V).
std::size_t stored_layer_bytes(const KvBlockLayout& layout, CompressionMode mode);
// Bytes of a whole block (all layers): the host pool's slot size.
std::size_t stored_block_bytes(const KvBlockLayout& layout, CompressionMode mode);

// Encodes one layer of one block. `k` and `v` each point at T*H*D raw words of the layout's
// dtype; `out` receives stored_layer_bytes(layout, mode) bytes.
void encode_layer(const KvBlockLayout& layout, CompressionMode mode, const void* k, const void* v,
                  std::uint8_t* out);

// Decodes what encode_layer wrote back into raw words of the layout's dtype.
void decode_layer(const KvBlockLayout& layout, CompressionMode mode, const std::uint8_t* stored,
                  void* k, void* v);

}  // namespace activekv::offload
