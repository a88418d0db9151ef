// Compression of offloaded KV, SPEC.md §5: exact raw words, or int8 / fp8 (E4M3FN) codes with one
// float32 scale per (token, head) group of head_dim elements, K and V separately. Every float
// operation is one IEEE binary32 operation (this file is compiled with -ffp-contract=off); the
// format conversions are integer code in float_bits.h. Bit-identical to
// reference/compression.py.
#include "offload/compression.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include "offload/codec_rules.h"
#include "offload/float_bits.h"

namespace activekv::offload {

namespace fb = float_bits;
namespace rules = codec_rules;

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
  switch (mode) {
    case CompressionMode::exact:
      return 2 * elements * dtype_bytes(layout.dtype());
    case CompressionMode::int8:
    case CompressionMode::fp8_e4m3: {
      // Up to 2.5x the fp16 exact size (head_dim 1), which KvBlockLayout did not check.
      const std::size_t per_group = 2 * std::size_t{layout.head_dim()} + 2 * sizeof(float);
      if (groups > std::numeric_limits<std::size_t>::max() / per_group) {
        throw LayoutError("layout: expected a stored block size that fits in memory; got " +
                          layout.describe());
      }
      return groups * per_group;
    }
  }
  throw LayoutError("mode: expected exact, int8 or fp8_e4m3");
}

std::size_t stored_block_bytes(const KvBlockLayout& layout, CompressionMode mode) {
  const std::size_t layer = stored_layer_bytes(layout, mode);
  if (layer > std::numeric_limits<std::size_t>::max() / layout.num_layers()) {
    throw LayoutError("layout: expected a stored block size that fits in memory; got " +
                      layout.describe());
  }
  return layer * layout.num_layers();
}

namespace {

void require_compressed(CompressionMode mode) {
  if (mode != CompressionMode::int8 && mode != CompressionMode::fp8_e4m3) {
    throw LayoutError("mode: expected exact, int8 or fp8_e4m3");
  }
}

// Element `index` of an array of raw words of `dtype`, widened exactly to binary32 bits. The
// words are read with memcpy: the caller's buffer need not be aligned.
std::uint32_t load_f32_bits(KvDtype dtype, const std::uint8_t* words, std::size_t index) {
  if (dtype == KvDtype::fp32) {
    std::uint32_t word;
    std::memcpy(&word, words + index * sizeof word, sizeof word);
    return word;
  }
  std::uint16_t word;
  std::memcpy(&word, words + index * sizeof word, sizeof word);
  return dtype == KvDtype::fp16 ? fb::fp16_to_f32_bits(word) : fb::bf16_to_f32_bits(word);
}

// Narrows a dequantized binary32 value to `dtype` (codec_rules.h) and stores it as element
// `index`.
void store_narrowed(KvDtype dtype, float value, std::uint8_t* words, std::size_t index) {
  if (dtype == KvDtype::fp32) {
    const std::uint32_t word = rules::narrow_to_fp32(value);
    std::memcpy(words + index * sizeof word, &word, sizeof word);
    return;
  }
  const std::uint16_t word = rules::narrow_to_16(value, dtype == KvDtype::bf16);
  std::memcpy(words + index * sizeof word, &word, sizeof word);
}

// Quantizes one tensor (K or V: `groups` groups of `group_size` elements): `codes` receives
// groups * group_size bytes, `scales` groups float32 values (byte-wise, as memcpy lays them out).
void encode_tensor(KvDtype dtype, CompressionMode mode, const std::uint8_t* words,
                   std::size_t groups, std::size_t group_size, std::uint8_t* codes,
                   std::uint8_t* scales) {
  const bool int8 = mode == CompressionMode::int8;
  for (std::size_t g = 0; g < groups; ++g) {
    const std::size_t first = g * group_size;
    // Pass 1: amax over the finite elements (0 if there are none).
    float amax = 0.0f;
    for (std::size_t i = 0; i < group_size; ++i) {
      amax = std::max(amax, rules::finite_magnitude(load_f32_bits(dtype, words, first + i)));
    }
    const float scale = rules::group_scale(int8, amax);
    std::memcpy(scales + g * sizeof scale, &scale, sizeof scale);
    // Pass 2: the words are widened again rather than kept, so nothing is allocated per tensor
    // on the engine's hot path.
    for (std::size_t i = 0; i < group_size; ++i) {
      codes[first + i] =
          rules::encode_element(int8, load_f32_bits(dtype, words, first + i), scale);
    }
  }
}

// Inverse of encode_tensor: decode(code) * scale in binary32, narrowed to `dtype`.
void decode_tensor(KvDtype dtype, CompressionMode mode, const std::uint8_t* codes,
                   const std::uint8_t* scales, std::size_t groups, std::size_t group_size,
                   std::uint8_t* words) {
  const bool int8 = mode == CompressionMode::int8;
  for (std::size_t g = 0; g < groups; ++g) {
    float scale;
    std::memcpy(&scale, scales + g * sizeof scale, sizeof scale);
    for (std::size_t i = 0; i < group_size; ++i) {
      const std::size_t index = g * group_size + i;
      store_narrowed(dtype, rules::decode_element(int8, codes[index], scale), words, index);
    }
  }
}

}  // namespace

void encode_layer(const KvBlockLayout& layout, CompressionMode mode, const void* k, const void* v,
                  std::uint8_t* out) {
  const std::size_t half = layout.bytes_per_tensor();
  if (mode == CompressionMode::exact) {
    std::memcpy(out, k, half);
    std::memcpy(out + half, v, half);
    return;
  }
  require_compressed(mode);
  const std::size_t group_size = layout.head_dim();
  const std::size_t groups = std::size_t{layout.block_size()} * layout.num_kv_heads();
  const std::size_t elements = groups * group_size;
  std::uint8_t* k_codes = out;
  std::uint8_t* v_codes = out + elements;
  std::uint8_t* k_scales = out + 2 * elements;
  std::uint8_t* v_scales = k_scales + groups * sizeof(float);
  encode_tensor(layout.dtype(), mode, static_cast<const std::uint8_t*>(k), groups, group_size,
                k_codes, k_scales);
  encode_tensor(layout.dtype(), mode, static_cast<const std::uint8_t*>(v), groups, group_size,
                v_codes, v_scales);
}

void decode_layer(const KvBlockLayout& layout, CompressionMode mode, const std::uint8_t* stored,
                  void* k, void* v) {
  const std::size_t half = layout.bytes_per_tensor();
  if (mode == CompressionMode::exact) {
    std::memcpy(k, stored, half);
    std::memcpy(v, stored + half, half);
    return;
  }
  require_compressed(mode);
  const std::size_t group_size = layout.head_dim();
  const std::size_t groups = std::size_t{layout.block_size()} * layout.num_kv_heads();
  const std::size_t elements = groups * group_size;
  const std::uint8_t* k_codes = stored;
  const std::uint8_t* v_codes = stored + elements;
  const std::uint8_t* k_scales = stored + 2 * elements;
  const std::uint8_t* v_scales = k_scales + groups * sizeof(float);
  decode_tensor(layout.dtype(), mode, k_codes, k_scales, groups, group_size,
                static_cast<std::uint8_t*>(k));
  decode_tensor(layout.dtype(), mode, v_codes, v_scales, groups, group_size,
                static_cast<std::uint8_t*>(v));
}

}  // namespace activekv::offload
