// Exact, portable conversions between float32 and the 16-bit and 8-bit formats of SPEC.md §5,
// written as integer operations on the bit patterns (no _Float16, no intrinsics, no dependence on
// the floating-point environment), so that the CPU route, a later CUDA route and the Python
// reference (reference/compression.py) agree bit for bit.
//
// Every function is also a CUDA device function (AKV_HOST_DEVICE), so the CUDA route's kernels
// run this very code: one definition of each rounding rule for both routes. Header-only and free
// of library calls, so it is safe in .cu files too (see cuda/probe.h).
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define AKV_HOST_DEVICE __host__ __device__
#else
#define AKV_HOST_DEVICE
#endif

namespace activekv::offload::float_bits {

AKV_HOST_DEVICE inline float bits_to_float(std::uint32_t bits) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(bits);
#else
  float value;
  std::memcpy(&value, &bits, sizeof value);
  return value;
#endif
}

AKV_HOST_DEVICE inline std::uint32_t float_to_bits(float value) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(value);
#else
  std::uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  return bits;
#endif
}

inline constexpr std::uint32_t kF32SignMask = 0x80000000u;
inline constexpr std::uint32_t kF32AbsMask = 0x7FFFFFFFu;
inline constexpr std::uint32_t kF32Inf = 0x7F800000u;
// The canonical quiet NaNs decode_layer writes for a NaN product (SPEC.md §5, decode rules).
inline constexpr std::uint32_t kF32CanonicalNan = 0x7FC00000u;
inline constexpr std::uint16_t kFp16CanonicalNan = 0x7E00u;
inline constexpr std::uint16_t kBf16CanonicalNan = 0x7FC0u;

AKV_HOST_DEVICE constexpr bool f32_is_nan(std::uint32_t bits) {
  return (bits & kF32AbsMask) > kF32Inf;
}
AKV_HOST_DEVICE constexpr bool f32_is_finite(std::uint32_t bits) {
  return (bits & kF32AbsMask) < kF32Inf;
}

// Rounds `value >> shift` to nearest, ties to even (1 <= shift <= 31).
AKV_HOST_DEVICE constexpr std::uint32_t shift_right_rne(std::uint32_t value, std::uint32_t shift) {
  const std::uint32_t kept = value >> shift;
  const std::uint32_t rest = value & ((std::uint32_t{1} << shift) - 1u);
  const std::uint32_t half = std::uint32_t{1} << (shift - 1u);
  const bool up = rest > half || (rest == half && (kept & 1u) != 0);
  return kept + (up ? 1u : 0u);
}

// ---- widening (exact) ----

// IEEE binary16 -> binary32, exact; NaN payloads keep their 10 bits (shifted up).
AKV_HOST_DEVICE constexpr std::uint32_t fp16_to_f32_bits(std::uint16_t half) {
  const std::uint32_t sign = std::uint32_t{half & 0x8000u} << 16;
  const std::uint32_t exponent = (half >> 10) & 0x1Fu;
  std::uint32_t mantissa = half & 0x3FFu;
  if (exponent == 0x1Fu) return sign | kF32Inf | (mantissa << 13);  // inf, NaN
  if (exponent != 0) return sign | ((exponent + 112u) << 23) | (mantissa << 13);
  if (mantissa == 0) return sign;  // ±0
  // Subnormal: mantissa * 2^-24. Normalize so the leading one becomes the implicit bit.
  std::uint32_t biased = 113u;  // the exponent of 2^-14, the smallest normal binary16
  while ((mantissa & 0x400u) == 0) {
    mantissa <<= 1;
    --biased;
  }
  return sign | (biased << 23) | ((mantissa & 0x3FFu) << 13);
}

// bfloat16 -> binary32, exact: the top 16 bits.
AKV_HOST_DEVICE constexpr std::uint32_t bf16_to_f32_bits(std::uint16_t bf16) {
  return std::uint32_t{bf16} << 16;
}

// ---- narrowing (round to nearest, ties to even) ----

// binary32 -> binary16: round to nearest even, overflow to ±inf, subnormal results rounded
// correctly, no flush to zero. NaN -> quiet NaN with the sign and the top 9 payload bits.
AKV_HOST_DEVICE constexpr std::uint16_t f32_bits_to_fp16(std::uint32_t bits) {
  const auto sign = static_cast<std::uint16_t>((bits >> 16) & 0x8000u);
  const std::uint32_t magnitude = bits & kF32AbsMask;
  if (magnitude > kF32Inf) {
    return static_cast<std::uint16_t>(sign | 0x7E00u | ((magnitude >> 13) & 0x1FFu));
  }
  // 65520 = the midpoint between 65504 (the largest binary16) and 2^16: a tie that rounds to the
  // even neighbour 2^16, so this and everything above (inf included) is inf.
  if (magnitude >= 0x477FF000u) return static_cast<std::uint16_t>(sign | 0x7C00u);
  const std::uint32_t exponent = magnitude >> 23;
  if (exponent >= 113u) {
    // Normal result: rebias, then round away the low 13 mantissa bits (a carry into the exponent
    // field is the correct next binade).
    return static_cast<std::uint16_t>(sign | shift_right_rne(magnitude - (112u << 23), 13));
  }
  // Subnormal (or zero) result, in units of 2^-24. A binary32 value is M * 2^(e-150) with the
  // 24-bit significand M, so in units of 2^-24 it is M >> (126 - e).
  if (exponent == 0) return sign;  // binary32 subnormals are far below 2^-25
  const std::uint32_t shift = 126u - exponent;  // >= 14
  if (shift > 24u) return sign;                  // below 2^-25: rounds to zero
  const std::uint32_t significand = (magnitude & 0x7FFFFFu) | 0x800000u;
  return static_cast<std::uint16_t>(sign | shift_right_rne(significand, shift));
}

// binary32 -> bfloat16: round to nearest even of the top 16 bits (overflow to ±inf comes out of
// the carry). NaN -> quiet NaN with the sign and the top payload bits.
AKV_HOST_DEVICE constexpr std::uint16_t f32_bits_to_bf16(std::uint32_t bits) {
  if (f32_is_nan(bits)) return static_cast<std::uint16_t>((bits >> 16) | 0x0040u);
  return static_cast<std::uint16_t>(shift_right_rne(bits & kF32AbsMask, 16) |
                                    ((bits >> 16) & 0x8000u));
}

// ---- E4M3FN (OCP FP8: bias 7, 3 mantissa bits, no inf, max 448, NaN = 0x7F / 0xFF) ----

inline constexpr std::uint8_t kE4m3MaxCode = 0x7E;         // 448
inline constexpr std::uint32_t kF32Bits448 = 0x43E00000u;  // 448.0f

// Exact value of an E4M3 code as binary32 bits; 0x7F / 0xFF decode to the canonical quiet NaN
// (with the code's sign).
AKV_HOST_DEVICE constexpr std::uint32_t e4m3_to_f32_bits(std::uint8_t code) {
  const std::uint32_t sign = std::uint32_t{code & 0x80u} << 24;
  const std::uint32_t exponent = (code >> 3) & 0xFu;
  std::uint32_t mantissa = code & 0x7u;
  if (exponent == 0xFu && mantissa == 0x7u) return sign | kF32CanonicalNan;
  if (exponent != 0) return sign | ((exponent + 120u) << 23) | (mantissa << 20);
  if (mantissa == 0) return sign;
  // Subnormal: mantissa/8 * 2^-6 = mantissa * 2^-9.
  std::uint32_t biased = 121u;  // the exponent of 2^-6
  while ((mantissa & 0x8u) == 0) {
    mantissa <<= 1;
    --biased;
  }
  return sign | (biased << 23) | ((mantissa & 0x7u) << 20);
}

// binary32 -> E4M3: nearest value, ties to the even code; |y| > 448 (inf included) saturates to
// ±448 (0x7E / 0xFE); the sign bit is y's sign whatever the magnitude rounds to (-0 -> 0x80, and
// a negative y that rounds to zero too); NaN -> 0x00. Never returns 0x7F / 0xFF.
AKV_HOST_DEVICE constexpr std::uint8_t f32_bits_to_e4m3(std::uint32_t bits) {
  if (f32_is_nan(bits)) return 0x00;
  const auto sign = static_cast<std::uint8_t>((bits >> 24) & 0x80u);
  const std::uint32_t magnitude = bits & kF32AbsMask;
  if (magnitude >= kF32Bits448) return static_cast<std::uint8_t>(sign | kE4m3MaxCode);
  const std::uint32_t exponent = magnitude >> 23;
  std::uint32_t code = 0;
  if (exponent >= 121u) {
    // Normal result (|y| >= 2^-6): rebias, round away the low 20 mantissa bits. Below 448 the
    // result is at most 0x7E (448 itself), so it never reaches the NaN code.
    code = shift_right_rne(magnitude - (120u << 23), 20);
  } else if (exponent != 0) {
    // Subnormal (or zero) result in units of 2^-9: M * 2^(e-150) / 2^-9 = M >> (141 - e).
    const std::uint32_t shift = 141u - exponent;  // >= 21
    if (shift <= 24u) code = shift_right_rne((magnitude & 0x7FFFFFu) | 0x800000u, shift);
  }
  return static_cast<std::uint8_t>(sign | code);
}

// ---- int8 ----

// round_half_even(y) clamped to [-127, 127]; ±inf saturates. y must not be NaN.
AKV_HOST_DEVICE inline std::int8_t f32_to_int8_rne(float y) {
  if (y >= 127.0f) return 127;
  if (y <= -127.0f) return -127;
  // |y| < 127: truncation fits an int, and y - trunc(y) is exact (its bits are y's own low bits).
  const int truncated = static_cast<int>(y);
  const float fraction = y - static_cast<float>(truncated);
  const float distance = fraction < 0.0f ? -fraction : fraction;
  int rounded = truncated;
  if (distance > 0.5f || (distance == 0.5f && (truncated % 2) != 0)) {
    rounded += y < 0.0f ? -1 : 1;
  }
  return static_cast<std::int8_t>(rounded);
}

}  // namespace activekv::offload::float_bits
