// The per-element rules of the compressed modes (SPEC.md §5), written once for both routes: the
// CPU route (compression.cpp) and the CUDA route's kernels (cuda/staging.cu) call these, and the
// roundings are float_bits.h's. Every float operation is one explicitly rounded IEEE binary32
// operation on both (the device's __fdiv_rn / __fmul_rn; the host is built without contraction).
#pragma once

#include <cstdint>

#include "offload/float_bits.h"

namespace activekv::offload::codec_rules {

namespace fb = float_bits;

AKV_HOST_DEVICE inline float divide(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}

AKV_HOST_DEVICE inline float multiply(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}

// What an element adds to its group's amax: |x| when finite, else nothing (0).
AKV_HOST_DEVICE inline float finite_magnitude(std::uint32_t bits) {
  return fb::f32_is_finite(bits) ? fb::bits_to_float(bits & fb::kF32AbsMask) : 0.0f;
}

// scale = amax / 127 (int8) or / 448 (E4M3).
AKV_HOST_DEVICE inline float group_scale(bool int8, float amax) {
  return divide(amax, int8 ? 127.0f : 448.0f);
}

// The code of one element (binary32 bits) under its group's scale: 0 when the scale is 0 (NaN and
// ±inf included) and for NaN; otherwise x / scale rounded to the mode's code (±inf saturates).
AKV_HOST_DEVICE inline std::uint8_t encode_element(bool int8, std::uint32_t bits, float scale) {
  if (scale == 0.0f || fb::f32_is_nan(bits)) return 0;
  const float y = divide(fb::bits_to_float(bits), scale);
  return int8 ? static_cast<std::uint8_t>(fb::f32_to_int8_rne(y))
              : fb::f32_bits_to_e4m3(fb::float_to_bits(y));
}

// decode(code) * scale, in binary32.
AKV_HOST_DEVICE inline float decode_element(bool int8, std::uint8_t code, float scale) {
  const float decoded = int8 ? static_cast<float>(static_cast<std::int8_t>(code))
                             : fb::bits_to_float(fb::e4m3_to_f32_bits(code));
  return multiply(decoded, scale);
}

// A dequantized value as a word of the layer's dtype. A NaN (only stored bytes encoding never
// writes can produce one) becomes the dtype's canonical quiet NaN: IEEE-754 fixes neither the sign
// nor the payload of a NaN product.
AKV_HOST_DEVICE inline std::uint32_t narrow_to_fp32(float value) {
  const std::uint32_t bits = fb::float_to_bits(value);
  return fb::f32_is_nan(bits) ? fb::kF32CanonicalNan : bits;
}

AKV_HOST_DEVICE inline std::uint16_t narrow_to_16(float value, bool bf16) {
  const std::uint32_t bits = fb::float_to_bits(value);
  if (fb::f32_is_nan(bits)) return bf16 ? fb::kBf16CanonicalNan : fb::kFp16CanonicalNan;
  return bf16 ? fb::f32_bits_to_bf16(bits) : fb::f32_bits_to_fp16(bits);
}

}  // namespace activekv::offload::codec_rules
