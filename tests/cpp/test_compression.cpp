// Compression numerics (SPEC.md §5): the float conversions of float_bits.h against known values
// and exhaustive round trips, the E4M3 and int8 quantizers (ties, saturation, signed zero, NaN),
// and encode_layer / decode_layer (stored layout, special groups, error bounds, exact mode).
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "offload/compression.h"
#include "offload/float_bits.h"
#include "offload/kv_layout.h"

namespace fb = activekv::offload::float_bits;
using activekv::offload::CompressionMode;
using activekv::offload::decode_layer;
using activekv::offload::encode_layer;
using activekv::offload::KvBlockLayout;
using activekv::offload::KvDtype;
using activekv::offload::LayoutError;
using activekv::offload::mode_name;
using activekv::offload::parse_mode;
using activekv::offload::stored_block_bytes;
using activekv::offload::stored_layer_bytes;

namespace {

constexpr CompressionMode kCompressed[] = {CompressionMode::int8, CompressionMode::fp8_e4m3};
constexpr KvDtype kDtypes[] = {KvDtype::fp16, KvDtype::bf16, KvDtype::fp32};

std::uint32_t bits_of(float value) { return fb::float_to_bits(value); }
float float_of(std::uint32_t bits) { return fb::bits_to_float(bits); }

// x * 2^exponent, exactly (for the small exponents used here).
float pow2(int exponent) { return std::ldexp(1.0f, exponent); }

// The raw words of one tensor [T, H, D] as bytes, filled from float values (narrowed with
// float_bits; the values used are chosen to be exact in the dtype unless said otherwise).
std::vector<std::uint8_t> words_from_floats(KvDtype dtype, const std::vector<float>& values) {
  const std::size_t size = activekv::offload::dtype_bytes(dtype);
  std::vector<std::uint8_t> bytes(values.size() * size);
  for (std::size_t i = 0; i < values.size(); ++i) {
    const std::uint32_t bits = bits_of(values[i]);
    if (dtype == KvDtype::fp32) {
      std::memcpy(bytes.data() + 4 * i, &bits, 4);
    } else {
      const std::uint16_t word =
          dtype == KvDtype::fp16 ? fb::f32_bits_to_fp16(bits) : fb::f32_bits_to_bf16(bits);
      std::memcpy(bytes.data() + 2 * i, &word, 2);
    }
  }
  return bytes;
}

std::vector<float> floats_from_words(KvDtype dtype, const std::vector<std::uint8_t>& bytes) {
  const std::size_t size = activekv::offload::dtype_bytes(dtype);
  std::vector<float> values(bytes.size() / size);
  for (std::size_t i = 0; i < values.size(); ++i) {
    if (dtype == KvDtype::fp32) {
      std::uint32_t bits;
      std::memcpy(&bits, bytes.data() + 4 * i, 4);
      values[i] = float_of(bits);
    } else {
      std::uint16_t word;
      std::memcpy(&word, bytes.data() + 2 * i, 2);
      values[i] = float_of(dtype == KvDtype::fp16 ? fb::fp16_to_f32_bits(word)
                                                  : fb::bf16_to_f32_bits(word));
    }
  }
  return values;
}

float scale_at(const std::vector<std::uint8_t>& stored, std::size_t offset) {
  float scale;
  std::memcpy(&scale, stored.data() + offset, sizeof scale);
  return scale;
}

struct Decoded {
  std::vector<std::uint8_t> k;
  std::vector<std::uint8_t> v;
};

Decoded decode(const KvBlockLayout& layout, CompressionMode mode,
               const std::vector<std::uint8_t>& stored) {
  Decoded out{std::vector<std::uint8_t>(layout.bytes_per_tensor()),
              std::vector<std::uint8_t>(layout.bytes_per_tensor())};
  decode_layer(layout, mode, stored.data(), out.k.data(), out.v.data());
  return out;
}

std::vector<std::uint8_t> encode(const KvBlockLayout& layout, CompressionMode mode,
                                 const std::vector<std::uint8_t>& k,
                                 const std::vector<std::uint8_t>& v) {
  std::vector<std::uint8_t> stored(stored_layer_bytes(layout, mode));
  encode_layer(layout, mode, k.data(), v.data(), stored.data());
  return stored;
}

// Nearest E4M3 code (0..0x7E) to m >= 0 by brute force in double, ties to the even code: an
// independent check of f32_bits_to_e4m3 (double holds the distances involved exactly enough).
std::uint8_t brute_force_e4m3(float m) {
  double best = std::numeric_limits<double>::infinity();
  int best_code = 0;
  for (int code = 0; code <= 0x7E; ++code) {
    const double value = static_cast<double>(float_of(fb::e4m3_to_f32_bits(
        static_cast<std::uint8_t>(code))));
    const double distance = std::fabs(value - static_cast<double>(m));
    if (distance < best || (distance == best && code % 2 == 0)) {
      best = distance;
      best_code = code;
    }
  }
  return static_cast<std::uint8_t>(best_code);
}

}  // namespace

// ---- fp16 ----

TEST_CASE("fp16 widening known values") {
  CHECK(fb::fp16_to_f32_bits(0x0000) == 0x00000000u);
  CHECK(fb::fp16_to_f32_bits(0x8000) == 0x80000000u);
  CHECK(fb::fp16_to_f32_bits(0x3C00) == bits_of(1.0f));
  CHECK(fb::fp16_to_f32_bits(0xC000) == bits_of(-2.0f));
  CHECK(fb::fp16_to_f32_bits(0x3555) == bits_of(0x555 * pow2(-10) * pow2(-2)));  // 0.333251953125
  CHECK(fb::fp16_to_f32_bits(0x7BFF) == bits_of(65504.0f));
  CHECK(fb::fp16_to_f32_bits(0x0400) == bits_of(pow2(-14)));     // smallest normal
  CHECK(fb::fp16_to_f32_bits(0x0001) == bits_of(pow2(-24)));     // smallest subnormal
  CHECK(fb::fp16_to_f32_bits(0x8001) == bits_of(-pow2(-24)));
  CHECK(fb::fp16_to_f32_bits(0x0200) == bits_of(pow2(-15)));
  CHECK(fb::fp16_to_f32_bits(0x03FF) == bits_of(1023.0f * pow2(-24)));  // largest subnormal
  CHECK(fb::fp16_to_f32_bits(0x7C00) == 0x7F800000u);
  CHECK(fb::fp16_to_f32_bits(0xFC00) == 0xFF800000u);
  CHECK(fb::fp16_to_f32_bits(0x7E00) == 0x7FC00000u);
  CHECK(fb::fp16_to_f32_bits(0x7C01) == 0x7F802000u);  // signalling payload kept
  CHECK(fb::fp16_to_f32_bits(0xFFFF) == 0xFFFFE000u);
  // Every pattern: value agrees with ldexp of its fields.
  for (std::uint32_t h = 0; h < 0x10000u; ++h) {
    const auto half = static_cast<std::uint16_t>(h);
    const std::uint32_t exponent = (h >> 10) & 0x1Fu;
    if (exponent == 0x1F) continue;
    const int mantissa = static_cast<int>(h & 0x3FFu);
    const float magnitude = exponent == 0 ? std::ldexp(static_cast<float>(mantissa), -24)
                                          : std::ldexp(static_cast<float>(mantissa + 1024),
                                                       static_cast<int>(exponent) - 25);
    const float expected = (h & 0x8000u) != 0 ? -magnitude : magnitude;
    REQUIRE(fb::fp16_to_f32_bits(half) == bits_of(expected));
  }
}

TEST_CASE("fp16 narrowing known values and ties") {
  CHECK(fb::f32_bits_to_fp16(bits_of(0.0f)) == 0x0000);
  CHECK(fb::f32_bits_to_fp16(bits_of(-0.0f)) == 0x8000);
  CHECK(fb::f32_bits_to_fp16(bits_of(1.0f)) == 0x3C00);
  CHECK(fb::f32_bits_to_fp16(bits_of(65504.0f)) == 0x7BFF);
  // Overflow: 65520 is the midpoint to 2^16 and rounds (to even) to inf; just below stays.
  CHECK(fb::f32_bits_to_fp16(0x477FEFFFu) == 0x7BFF);
  CHECK(fb::f32_bits_to_fp16(0x477FF000u) == 0x7C00);
  CHECK(fb::f32_bits_to_fp16(bits_of(-65520.0f)) == 0xFC00);
  CHECK(fb::f32_bits_to_fp16(bits_of(1e10f)) == 0x7C00);
  CHECK(fb::f32_bits_to_fp16(0x7F7FFFFFu) == 0x7C00);
  CHECK(fb::f32_bits_to_fp16(0x7F800000u) == 0x7C00);
  CHECK(fb::f32_bits_to_fp16(0xFF800000u) == 0xFC00);
  // Ties to even in the normal range: 1 + 2^-11 is halfway between 1 and 1 + 2^-10.
  CHECK(fb::f32_bits_to_fp16(bits_of(1.0f + pow2(-11))) == 0x3C00);
  CHECK(fb::f32_bits_to_fp16(bits_of(1.0f + 3 * pow2(-11))) == 0x3C02);
  CHECK(fb::f32_bits_to_fp16(bits_of(1.0f + pow2(-11)) + 1) == 0x3C01);
  CHECK(fb::f32_bits_to_fp16(bits_of(1.0f + pow2(-11)) - 1) == 0x3C00);
  // Carry into the exponent: just below 2 rounds up to 2.
  CHECK(fb::f32_bits_to_fp16(bits_of(2.0f) - 1) == 0x4000);
  // Subnormal results and their ties (units of 2^-24).
  CHECK(fb::f32_bits_to_fp16(bits_of(pow2(-24))) == 0x0001);
  CHECK(fb::f32_bits_to_fp16(bits_of(pow2(-25))) == 0x0000);         // tie 0 | 1 -> 0
  CHECK(fb::f32_bits_to_fp16(bits_of(pow2(-25)) + 1) == 0x0001);     // just above the tie
  CHECK(fb::f32_bits_to_fp16(bits_of(3 * pow2(-25))) == 0x0002);     // tie 1 | 2 -> 2
  CHECK(fb::f32_bits_to_fp16(bits_of(5 * pow2(-25))) == 0x0002);     // tie 2 | 3 -> 2
  CHECK(fb::f32_bits_to_fp16(bits_of(-3 * pow2(-25))) == 0x8002);
  CHECK(fb::f32_bits_to_fp16(bits_of(pow2(-26))) == 0x0000);
  CHECK(fb::f32_bits_to_fp16(bits_of(-pow2(-30))) == 0x8000);
  CHECK(fb::f32_bits_to_fp16(bits_of(pow2(-14) - pow2(-38))) == 0x0400);  // up into the normals
  CHECK(fb::f32_bits_to_fp16(bits_of(1023.5f * pow2(-24))) == 0x0400);    // tie 1023 | 1024
  CHECK(fb::f32_bits_to_fp16(bits_of(1022.5f * pow2(-24))) == 0x03FE);    // tie 1022 | 1023
  CHECK(fb::f32_bits_to_fp16(0x00000001u) == 0x0000);  // binary32 subnormals
  CHECK(fb::f32_bits_to_fp16(0x807FFFFFu) == 0x8000);
  // NaN: quiet, sign and top payload bits kept.
  CHECK(fb::f32_bits_to_fp16(0x7FC00000u) == 0x7E00);
  CHECK(fb::f32_bits_to_fp16(0x7F800001u) == 0x7E00);
  CHECK(fb::f32_bits_to_fp16(0xFFA02000u) == 0xFF01);
}

TEST_CASE("fp16 round trip of every pattern") {
  for (std::uint32_t h = 0; h < 0x10000u; ++h) {
    const auto half = static_cast<std::uint16_t>(h);
    const std::uint16_t back = fb::f32_bits_to_fp16(fb::fp16_to_f32_bits(half));
    const bool nan = (h & 0x7C00u) == 0x7C00u && (h & 0x3FFu) != 0;
    if (nan) {
      REQUIRE(back == (half | 0x0200u));  // quieted, otherwise kept
    } else {
      REQUIRE(back == half);
    }
  }
}

TEST_CASE("fp16 narrowing is nearest even against neighbours") {
  // For random binary32 values in the binary16 range, the result is one of the two binary16
  // neighbours, the nearer, and the even one on a tie.
  std::mt19937 generator(1234);
  std::uniform_int_distribution<std::uint32_t> exponents(90, 141);  // below 2^15
  std::uniform_int_distribution<std::uint32_t> mantissas(0, 0x7FFFFF);
  for (int i = 0; i < 200000; ++i) {
    const std::uint32_t bits = (exponents(generator) << 23) | mantissas(generator);
    const double x = static_cast<double>(float_of(bits));
    const std::uint16_t h = fb::f32_bits_to_fp16(bits);
    const double got = static_cast<double>(float_of(fb::fp16_to_f32_bits(h)));
    const double below = static_cast<double>(
        float_of(fb::fp16_to_f32_bits(static_cast<std::uint16_t>(h - (got > x ? 1 : 0)))));
    const double above = static_cast<double>(
        float_of(fb::fp16_to_f32_bits(static_cast<std::uint16_t>(h + (got <= x ? 1 : 0)))));
    REQUIRE(below <= x);
    REQUIRE(x <= above);
    const double d_got = std::fabs(got - x);
    const double d_other = std::fabs((got == below ? above : below) - x);
    REQUIRE(d_got <= d_other);
    if (d_got == d_other) REQUIRE((h & 1u) == 0);
  }
}

// ---- bf16 ----

TEST_CASE("bf16 widening and narrowing known values and ties") {
  CHECK(fb::bf16_to_f32_bits(0x3F80) == bits_of(1.0f));
  CHECK(fb::bf16_to_f32_bits(0x8000) == 0x80000000u);
  CHECK(fb::bf16_to_f32_bits(0x0001) == 0x00010000u);  // subnormal
  CHECK(fb::bf16_to_f32_bits(0x7F80) == 0x7F800000u);
  CHECK(fb::bf16_to_f32_bits(0xFFC1) == 0xFFC10000u);

  CHECK(fb::f32_bits_to_bf16(0x3F808000u) == 0x3F80);  // tie, kept part even
  CHECK(fb::f32_bits_to_bf16(0x3F818000u) == 0x3F82);  // tie, kept part odd
  CHECK(fb::f32_bits_to_bf16(0x3F807FFFu) == 0x3F80);
  CHECK(fb::f32_bits_to_bf16(0x3F808001u) == 0x3F81);
  CHECK(fb::f32_bits_to_bf16(0xBF818000u) == 0xBF82);
  CHECK(fb::f32_bits_to_bf16(0x3FFF8000u) == 0x4000);  // carry into the exponent
  CHECK(fb::f32_bits_to_bf16(0x7F7F7FFFu) == 0x7F7F);
  CHECK(fb::f32_bits_to_bf16(0x7F7F8000u) == 0x7F80);  // overflow to inf
  CHECK(fb::f32_bits_to_bf16(0xFF7FFFFFu) == 0xFF80);
  CHECK(fb::f32_bits_to_bf16(0x7F800000u) == 0x7F80);
  CHECK(fb::f32_bits_to_bf16(0x00008000u) == 0x0000);  // subnormal tie to even
  CHECK(fb::f32_bits_to_bf16(0x00018000u) == 0x0002);
  CHECK(fb::f32_bits_to_bf16(0x80008001u) == 0x8001);
  CHECK(fb::f32_bits_to_bf16(0x80000000u) == 0x8000);
  CHECK(fb::f32_bits_to_bf16(0x7F800001u) == 0x7FC0);  // NaN quieted
  CHECK(fb::f32_bits_to_bf16(0xFFC12345u) == 0xFFC1);
  CHECK(fb::f32_bits_to_bf16(0x7FFFFFFFu) == 0x7FFF);
}

TEST_CASE("bf16 round trip of every pattern") {
  for (std::uint32_t b = 0; b < 0x10000u; ++b) {
    const auto word = static_cast<std::uint16_t>(b);
    const std::uint16_t back = fb::f32_bits_to_bf16(fb::bf16_to_f32_bits(word));
    const bool nan = (b & 0x7F80u) == 0x7F80u && (b & 0x7Fu) != 0;
    REQUIRE(back == (nan ? (word | 0x0040u) : word));
  }
}

// ---- E4M3 ----

TEST_CASE("e4m3 decoding known values") {
  CHECK(fb::e4m3_to_f32_bits(0x00) == 0x00000000u);
  CHECK(fb::e4m3_to_f32_bits(0x80) == 0x80000000u);
  CHECK(fb::e4m3_to_f32_bits(0x01) == bits_of(pow2(-9)));
  CHECK(fb::e4m3_to_f32_bits(0x07) == bits_of(7 * pow2(-9)));
  CHECK(fb::e4m3_to_f32_bits(0x08) == bits_of(pow2(-6)));
  CHECK(fb::e4m3_to_f32_bits(0x38) == bits_of(1.0f));
  CHECK(fb::e4m3_to_f32_bits(0x39) == bits_of(1.125f));
  CHECK(fb::e4m3_to_f32_bits(0xC0) == bits_of(-2.0f));
  CHECK(fb::e4m3_to_f32_bits(0x7D) == bits_of(416.0f));
  CHECK(fb::e4m3_to_f32_bits(0x7E) == bits_of(448.0f));
  CHECK(fb::e4m3_to_f32_bits(0xFE) == bits_of(-448.0f));
  CHECK(fb::e4m3_to_f32_bits(0x7F) == 0x7FC00000u);
  CHECK(fb::e4m3_to_f32_bits(0xFF) == 0xFFC00000u);
  // Every finite code: the value of its fields.
  for (int code = 0; code < 256; ++code) {
    const int exponent = (code >> 3) & 0xF;
    const int mantissa = code & 7;
    if (exponent == 0xF && mantissa == 7) continue;
    const float magnitude = exponent == 0 ? std::ldexp(static_cast<float>(mantissa), -9)
                                          : std::ldexp(static_cast<float>(8 + mantissa),
                                                       exponent - 10);
    const float expected = (code & 0x80) != 0 ? -magnitude : magnitude;
    REQUIRE(fb::e4m3_to_f32_bits(static_cast<std::uint8_t>(code)) == bits_of(expected));
  }
}

TEST_CASE("e4m3 every code round trips") {
  for (int code = 0; code < 256; ++code) {
    if ((code & 0x7F) == 0x7F) continue;
    const auto c = static_cast<std::uint8_t>(code);
    REQUIRE(fb::f32_bits_to_e4m3(fb::e4m3_to_f32_bits(c)) == c);
  }
}

TEST_CASE("e4m3 ties to even") {
  // Between consecutive codes c and c+1 (same sign), the midpoint goes to the even code and a
  // float32 step either side goes to the nearer one.
  for (int code = 0; code < 0x7E; ++code) {
    CAPTURE(code);
    const float low = float_of(fb::e4m3_to_f32_bits(static_cast<std::uint8_t>(code)));
    const float high = float_of(fb::e4m3_to_f32_bits(static_cast<std::uint8_t>(code + 1)));
    const float middle = (low + high) * 0.5f;  // exact: at most 5 significant bits
    const int even = code % 2 == 0 ? code : code + 1;
    CHECK(fb::f32_bits_to_e4m3(bits_of(middle)) == even);
    CHECK(fb::f32_bits_to_e4m3(bits_of(middle) - 1) == code);
    CHECK(fb::f32_bits_to_e4m3(bits_of(middle) + 1) == code + 1);
    CHECK(fb::f32_bits_to_e4m3(bits_of(-middle)) == (even | 0x80));
  }
  CHECK(fb::f32_bits_to_e4m3(bits_of(1.0625f)) == 0x38);        // 1 | 1.125 -> 1
  CHECK(fb::f32_bits_to_e4m3(bits_of(1.1875f)) == 0x3A);        // 1.125 | 1.25 -> 1.25
  CHECK(fb::f32_bits_to_e4m3(bits_of(0.5f * pow2(-9))) == 0x00);  // 0 | smallest -> 0
  CHECK(fb::f32_bits_to_e4m3(bits_of(1.5f * pow2(-9))) == 0x02);
  CHECK(fb::f32_bits_to_e4m3(bits_of(7.5f * pow2(-9))) == 0x08);  // subnormal | normal
  CHECK(fb::f32_bits_to_e4m3(bits_of(432.0f)) == 0x7E);          // 416 | 448 -> 448
}

TEST_CASE("e4m3 saturation signed zero and NaN") {
  CHECK(fb::f32_bits_to_e4m3(bits_of(448.0f)) == 0x7E);
  CHECK(fb::f32_bits_to_e4m3(bits_of(449.0f)) == 0x7E);
  CHECK(fb::f32_bits_to_e4m3(bits_of(464.0f)) == 0x7E);
  CHECK(fb::f32_bits_to_e4m3(bits_of(480.0f)) == 0x7E);
  CHECK(fb::f32_bits_to_e4m3(bits_of(1e30f)) == 0x7E);
  CHECK(fb::f32_bits_to_e4m3(bits_of(-1e30f)) == 0xFE);
  CHECK(fb::f32_bits_to_e4m3(0x7F7FFFFFu) == 0x7E);
  CHECK(fb::f32_bits_to_e4m3(0x7F800000u) == 0x7E);
  CHECK(fb::f32_bits_to_e4m3(0xFF800000u) == 0xFE);
  CHECK(fb::f32_bits_to_e4m3(bits_of(0.0f)) == 0x00);
  CHECK(fb::f32_bits_to_e4m3(bits_of(-0.0f)) == 0x80);
  CHECK(fb::f32_bits_to_e4m3(bits_of(-1e-30f)) == 0x80);  // rounds to zero, keeps the sign
  CHECK(fb::f32_bits_to_e4m3(0x80000001u) == 0x80);
  CHECK(fb::f32_bits_to_e4m3(0x00000001u) == 0x00);
  CHECK(fb::f32_bits_to_e4m3(0x7FC00000u) == 0x00);
  CHECK(fb::f32_bits_to_e4m3(0xFFC00000u) == 0x00);
  CHECK(fb::f32_bits_to_e4m3(0x7F800001u) == 0x00);
  // Never the NaN code, for any binary32 pattern's sign and magnitude class.
  for (std::uint32_t high = 0; high < 0x10000u; ++high) {
    const std::uint8_t code = fb::f32_bits_to_e4m3((high << 16) | 0xFFFFu);
    REQUIRE((code & 0x7F) != 0x7F);
  }
}

TEST_CASE("e4m3 encoding matches brute force nearest") {
  std::mt19937 generator(99);
  std::uniform_int_distribution<std::uint32_t> exponents(100, 135);
  std::uniform_int_distribution<std::uint32_t> mantissas(0, 0x7FFFFF);
  for (int i = 0; i < 100000; ++i) {
    const std::uint32_t bits = (exponents(generator) << 23) | mantissas(generator);
    CAPTURE(bits);
    REQUIRE(fb::f32_bits_to_e4m3(bits) == brute_force_e4m3(float_of(bits)));
    REQUIRE(fb::f32_bits_to_e4m3(bits | fb::kF32SignMask) ==
            (brute_force_e4m3(float_of(bits)) | 0x80));
  }
}

// ---- int8 ----

TEST_CASE("int8 rounding half even and clamping") {
  CHECK(fb::f32_to_int8_rne(0.0f) == 0);
  CHECK(fb::f32_to_int8_rne(-0.0f) == 0);
  CHECK(fb::f32_to_int8_rne(0.5f) == 0);
  CHECK(fb::f32_to_int8_rne(1.5f) == 2);
  CHECK(fb::f32_to_int8_rne(2.5f) == 2);
  CHECK(fb::f32_to_int8_rne(3.5f) == 4);
  CHECK(fb::f32_to_int8_rne(-0.5f) == 0);
  CHECK(fb::f32_to_int8_rne(-1.5f) == -2);
  CHECK(fb::f32_to_int8_rne(-2.5f) == -2);
  CHECK(fb::f32_to_int8_rne(0.49999997f) == 0);
  CHECK(fb::f32_to_int8_rne(0.50000006f) == 1);
  CHECK(fb::f32_to_int8_rne(2.4999998f) == 2);
  CHECK(fb::f32_to_int8_rne(2.5000002f) == 3);
  CHECK(fb::f32_to_int8_rne(-2.5000002f) == -3);
  CHECK(fb::f32_to_int8_rne(126.5f) == 126);
  CHECK(fb::f32_to_int8_rne(-126.5f) == -126);
  CHECK(fb::f32_to_int8_rne(126.50001f) == 127);
  CHECK(fb::f32_to_int8_rne(127.0f) == 127);
  CHECK(fb::f32_to_int8_rne(127.5f) == 127);
  CHECK(fb::f32_to_int8_rne(1000.0f) == 127);
  CHECK(fb::f32_to_int8_rne(-1000.0f) == -127);
  CHECK(fb::f32_to_int8_rne(std::numeric_limits<float>::infinity()) == 127);
  CHECK(fb::f32_to_int8_rne(-std::numeric_limits<float>::infinity()) == -127);
  CHECK(fb::f32_to_int8_rne(1e-40f) == 0);
  for (int n = -126; n <= 126; ++n) {
    const float value = static_cast<float>(n);
    REQUIRE(fb::f32_to_int8_rne(value) == n);
    REQUIRE(fb::f32_to_int8_rne(value + 0.25f) == n);
    REQUIRE(fb::f32_to_int8_rne(value + 0.75f) == (n + 1 > 127 ? 127 : n + 1));
    const int tie = (n % 2 == 0) ? n : n + 1;  // n + 0.5 rounds to the even of n, n + 1
    REQUIRE(fb::f32_to_int8_rne(value + 0.5f) == tie);
  }
}

// ---- modes and sizes ----

TEST_CASE("modes and stored sizes") {
  CHECK(parse_mode("exact") == CompressionMode::exact);
  CHECK(parse_mode("int8") == CompressionMode::int8);
  CHECK(parse_mode("fp8_e4m3") == CompressionMode::fp8_e4m3);
  CHECK(std::string(mode_name(CompressionMode::fp8_e4m3)) == "fp8_e4m3");
  CHECK(std::string(mode_name(CompressionMode::int8)) == "int8");
  CHECK(std::string(mode_name(CompressionMode::exact)) == "exact");
  try {
    parse_mode("fp8");
    FAIL_CHECK("expected a LayoutError");
  } catch (const LayoutError& error) {
    CHECK(std::string(error.what()).rfind("mode:", 0) == 0);
  }
  const KvBlockLayout layout(32, 16, 8, 128, KvDtype::bf16);
  CHECK(stored_layer_bytes(layout, CompressionMode::exact) == 2 * 16 * 8 * 128 * 2);
  CHECK(stored_layer_bytes(layout, CompressionMode::int8) == 2 * 16 * 8 * 128 + 2 * 16 * 8 * 4);
  CHECK(stored_layer_bytes(layout, CompressionMode::fp8_e4m3) ==
        stored_layer_bytes(layout, CompressionMode::int8));
  CHECK(stored_block_bytes(layout, CompressionMode::int8) ==
        32 * stored_layer_bytes(layout, CompressionMode::int8));
  const KvBlockLayout fp32(2, 3, 5, 7, KvDtype::fp32);
  CHECK(stored_layer_bytes(fp32, CompressionMode::exact) == 2 * 3 * 5 * 7 * 4);
  CHECK(stored_layer_bytes(fp32, CompressionMode::int8) == 2 * 3 * 5 * 7 + 2 * 3 * 5 * 4);
}

// ---- encode_layer / decode_layer ----

TEST_CASE("int8 stored layout and offsets") {
  // T=2, H=3, D=4: group g = t*H + h. amax = 127 (g + 1) so scale = g + 1 exactly.
  const KvBlockLayout layout(1, 2, 3, 4, KvDtype::fp32);
  const std::size_t groups = 6;
  const std::size_t elements = 24;
  std::vector<float> k_values;
  std::vector<float> v_values;
  for (std::size_t g = 0; g < groups; ++g) {
    const auto s = static_cast<float>(g + 1);
    for (const float x : {127.0f, -63.5f, 2.5f, 0.0f}) k_values.push_back(x * s);
    for (const float x : {-127.0f, 0.5f, 1.5f, -0.0f}) v_values.push_back(x * s);
  }
  const auto stored = encode(layout, CompressionMode::int8,
                             words_from_floats(KvDtype::fp32, k_values),
                             words_from_floats(KvDtype::fp32, v_values));
  REQUIRE(stored.size() == 2 * elements + 2 * groups * 4);
  for (std::size_t g = 0; g < groups; ++g) {
    CAPTURE(g);
    const std::uint8_t* k_codes = stored.data() + g * 4;
    const std::uint8_t* v_codes = stored.data() + elements + g * 4;
    CHECK(k_codes[0] == 127);
    CHECK(k_codes[1] == static_cast<std::uint8_t>(-64));  // -63.5 -> -64 (even)
    CHECK(k_codes[2] == 2);                                // 2.5 -> 2
    CHECK(k_codes[3] == 0);
    CHECK(v_codes[0] == static_cast<std::uint8_t>(-127));
    CHECK(v_codes[1] == 0);  // 0.5 -> 0
    CHECK(v_codes[2] == 2);  // 1.5 -> 2
    CHECK(v_codes[3] == 0);  // -0 -> 0
    CHECK(scale_at(stored, 2 * elements + 4 * g) == static_cast<float>(g + 1));
    CHECK(scale_at(stored, 2 * elements + 4 * groups + 4 * g) == static_cast<float>(g + 1));
  }
  const Decoded decoded = decode(layout, CompressionMode::int8, stored);
  const auto k = floats_from_words(KvDtype::fp32, decoded.k);
  const auto v = floats_from_words(KvDtype::fp32, decoded.v);
  CHECK(k[4] == 254.0f);
  CHECK(k[5] == -128.0f);
  CHECK(k[6] == 4.0f);
  CHECK(v[7] == 0.0f);
  CHECK(bits_of(v[7]) == 0u);  // int8 has no -0
}

TEST_CASE("fp8 stored layout and offsets") {
  // amax = 448 (g + 1) so scale = g + 1 exactly.
  const KvBlockLayout layout(1, 2, 2, 4, KvDtype::fp32);
  const std::size_t groups = 4;
  const std::size_t elements = 16;
  std::vector<float> k_values;
  std::vector<float> v_values;
  for (std::size_t g = 0; g < groups; ++g) {
    const auto s = static_cast<float>(g + 1);
    for (const float x : {448.0f, -1.0625f, 0.0f, -0.0f}) k_values.push_back(x * s);
    for (const float x : {-448.0f, 1.1875f, 0.5f * pow2(-9), 416.0f}) v_values.push_back(x * s);
  }
  const auto stored = encode(layout, CompressionMode::fp8_e4m3,
                             words_from_floats(KvDtype::fp32, k_values),
                             words_from_floats(KvDtype::fp32, v_values));
  REQUIRE(stored.size() == 2 * elements + 2 * groups * 4);
  for (std::size_t g = 0; g < groups; ++g) {
    CAPTURE(g);
    const std::uint8_t* k_codes = stored.data() + g * 4;
    const std::uint8_t* v_codes = stored.data() + elements + g * 4;
    CHECK(k_codes[0] == 0x7E);
    CHECK(k_codes[1] == 0xB8);  // -1.0625 -> -1 (even)
    CHECK(k_codes[2] == 0x00);
    CHECK(k_codes[3] == 0x80);  // -0
    CHECK(v_codes[0] == 0xFE);
    CHECK(v_codes[1] == 0x3A);  // 1.1875 -> 1.25 (even)
    CHECK(v_codes[2] == 0x00);  // half the smallest subnormal -> 0 (even)
    CHECK(v_codes[3] == 0x7D);
    CHECK(scale_at(stored, 2 * elements + 4 * g) == static_cast<float>(g + 1));
    CHECK(scale_at(stored, 2 * elements + 4 * groups + 4 * g) == static_cast<float>(g + 1));
  }
  const Decoded decoded = decode(layout, CompressionMode::fp8_e4m3, stored);
  const auto k = floats_from_words(KvDtype::fp32, decoded.k);
  CHECK(k[4] == 896.0f);
  CHECK(k[5] == -2.0f);
  CHECK(bits_of(k[7]) == 0x80000000u);  // -0 survives
}

TEST_CASE("all zero and all non finite groups have scale zero") {
  for (const KvDtype dtype : kDtypes) {
    for (const CompressionMode mode : kCompressed) {
      CAPTURE(activekv::offload::dtype_name(dtype));
      CAPTURE(mode_name(mode));
      const KvBlockLayout layout(1, 1, 3, 4, dtype);
      const float inf = std::numeric_limits<float>::infinity();
      const float nan = std::numeric_limits<float>::quiet_NaN();
      // Group 0: zeros of both signs; group 1: NaN and inf only; group 2: tiny values whose
      // scale underflows to zero for fp32 (and that fp16 / bf16 flush to zero when narrowed).
      const std::vector<float> values = {0.0f, -0.0f, 0.0f,         -0.0f,
                                         nan,  inf,   -inf,         nan,
                                         0.0f, 0.0f,  float_of(1u), -float_of(1u)};
      const auto words = words_from_floats(dtype, values);
      const auto stored = encode(layout, mode, words, words);
      for (std::size_t i = 0; i < 24; ++i) REQUIRE(stored[i] == 0);
      for (std::size_t g = 0; g < 6; ++g) REQUIRE(bits_of(scale_at(stored, 24 + 4 * g)) == 0u);
      const Decoded decoded = decode(layout, mode, stored);
      for (const std::uint8_t byte : decoded.k) REQUIRE(byte == 0);
      for (const std::uint8_t byte : decoded.v) REQUIRE(byte == 0);
    }
  }
}

TEST_CASE("NaN and inf elements next to finite ones") {
  // amax is the largest finite magnitude; chosen so that the scale is exact (2 for int8, 1 for
  // fp8) and the quotients are the exact ties -63.5 and 224.
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (const KvDtype dtype : kDtypes) {
    CAPTURE(activekv::offload::dtype_name(dtype));
    const KvBlockLayout layout(1, 1, 1, 5, dtype);
    const auto int8_words = words_from_floats(dtype, {nan, inf, -inf, 254.0f, -127.0f});
    const auto int8 = encode(layout, CompressionMode::int8, int8_words, int8_words);
    CHECK(int8[0] == 0);
    CHECK(int8[1] == 127);
    CHECK(int8[2] == static_cast<std::uint8_t>(-127));
    CHECK(int8[3] == 127);
    CHECK(int8[4] == static_cast<std::uint8_t>(-64));  // -63.5 -> -64
    CHECK(scale_at(int8, 10) == 2.0f);
    const auto fp8_words = words_from_floats(dtype, {nan, inf, -inf, 448.0f, -224.0f});
    const auto fp8 = encode(layout, CompressionMode::fp8_e4m3, fp8_words, fp8_words);
    CHECK(fp8[0] == 0x00);
    CHECK(fp8[1] == 0x7E);
    CHECK(fp8[2] == 0xFE);
    CHECK(fp8[3] == 0x7E);
    CHECK(fp8[4] == 0xF6);  // -224
    CHECK(scale_at(fp8, 10) == 1.0f);
    // Decoding gives finite values: NaN comes back as 0, inf as the group's largest magnitude.
    const auto back = floats_from_words(dtype, decode(layout, CompressionMode::fp8_e4m3, fp8).k);
    CHECK(back[0] == 0.0f);
    CHECK(back[1] == 448.0f);
    CHECK(back[2] == -448.0f);
    CHECK(back[3] == 448.0f);
    CHECK(back[4] == -224.0f);
    const auto back8 = floats_from_words(dtype, decode(layout, CompressionMode::int8, int8).v);
    CHECK(back8[0] == 0.0f);
    CHECK(back8[1] == 254.0f);
    CHECK(back8[2] == -254.0f);
    CHECK(back8[4] == -128.0f);
  }
}

TEST_CASE("one huge value in a group") {
  const KvBlockLayout layout(1, 1, 1, 4, KvDtype::fp16);
  const auto words = words_from_floats(KvDtype::fp16, {65504.0f, 1.0f, -200.0f, 300.0f});
  const auto int8 = encode(layout, CompressionMode::int8, words, words);
  CHECK(int8[0] == 127);
  CHECK(int8[1] == 0);
  CHECK(int8[2] == 0);
  CHECK(int8[3] == 1);  // 300 / (65504 / 127) = 0.58
  const auto fp8 = encode(layout, CompressionMode::fp8_e4m3, words, words);
  CHECK(fp8[0] == 0x7E);
  // 1 / (65504 / 448) = 0.00684 = 3.5 * 2^-9: the tie between subnormal codes 3 and 4 is decided
  // by the float32 quotient, which is not exactly 3.5 units; check against the brute force.
  const float scale = 65504.0f / 448.0f;
  CHECK(fp8[1] == brute_force_e4m3(1.0f / scale));
  CHECK(fp8[2] == (brute_force_e4m3(200.0f / scale) | 0x80));
}

TEST_CASE("round trip error bounds on random data") {
  std::mt19937 generator(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> magnitudes(-6.0f, 6.0f);
  for (const KvDtype dtype : kDtypes) {
    for (const CompressionMode mode : kCompressed) {
      CAPTURE(activekv::offload::dtype_name(dtype));
      CAPTURE(mode_name(mode));
      const KvBlockLayout layout(1, 16, 4, 64, dtype);
      const std::size_t elements = 16 * 4 * 64;
      std::vector<float> values(elements);
      for (std::size_t g = 0; g < 16 * 4; ++g) {
        const float group_scale = std::exp2(magnitudes(generator));
        for (std::size_t i = 0; i < 64; ++i) values[g * 64 + i] = normal(generator) * group_scale;
      }
      // The input as the dtype holds it (fp16 / bf16 round the generated floats).
      const auto words = words_from_floats(dtype, values);
      const auto x = floats_from_words(dtype, words);
      const auto stored = encode(layout, mode, words, words);
      const auto back = floats_from_words(dtype, decode(layout, mode, stored).v);
      // Relative precision of the narrowing to the dtype, plus half of fp16's subnormal step.
      double narrow = 0.0;
      double narrow_abs = 0.0;
      if (dtype == KvDtype::fp16) {
        narrow = 0x1p-11;
        narrow_abs = 0x1p-25;
      } else if (dtype == KvDtype::bf16) {
        narrow = 0x1p-8;
      }
      for (std::size_t g = 0; g < 16 * 4; ++g) {
        const double scale =
            static_cast<double>(scale_at(stored, 2 * elements + 4 * (16 * 4 + g)));
        for (std::size_t i = 0; i < 64; ++i) {
          const double original = static_cast<double>(x[g * 64 + i]);
          const double restored = static_cast<double>(back[g * 64 + i]);
          const double quantization =
              mode == CompressionMode::int8
                  ? 0.5 * scale
                  : std::fmax(std::fabs(original) * 0x1p-4, scale * 0x1p-10);
          const double bound = quantization * (1.0 + 1e-5) + std::fabs(restored) * narrow +
                               narrow_abs + std::fabs(original) * 1e-6;
          REQUIRE(std::fabs(restored - original) <= bound);
        }
      }
    }
  }
}

TEST_CASE("exact mode is bit for bit including NaN payloads") {
  std::mt19937 generator(3);
  for (const KvDtype dtype : kDtypes) {
    CAPTURE(activekv::offload::dtype_name(dtype));
    const KvBlockLayout layout(1, 4, 2, 8, dtype);
    std::vector<std::uint8_t> k(layout.bytes_per_tensor());
    std::vector<std::uint8_t> v(layout.bytes_per_tensor());
    for (auto& byte : k) byte = static_cast<std::uint8_t>(generator());
    for (auto& byte : v) byte = static_cast<std::uint8_t>(generator());
    // Signalling and quiet NaNs with payloads, infinities and subnormals at the front.
    if (dtype == KvDtype::fp32) {
      const std::uint32_t specials[] = {0x7F800001u, 0xFFBFFFFFu, 0x7FC12345u, 0x00000001u,
                                        0xFF800000u};
      std::memcpy(k.data(), specials, sizeof specials);
    } else {
      const std::uint16_t specials[] = {0x7C01, 0xFFFF, 0x7F81, 0x0001, 0xFC00};
      std::memcpy(k.data(), specials, sizeof specials);
    }
    const auto stored = encode(layout, CompressionMode::exact, k, v);
    REQUIRE(stored.size() == 2 * layout.bytes_per_tensor());
    CHECK(std::memcmp(stored.data(), k.data(), k.size()) == 0);
    CHECK(std::memcmp(stored.data() + k.size(), v.data(), v.size()) == 0);
    const Decoded decoded = decode(layout, CompressionMode::exact, stored);
    CHECK(decoded.k == k);
    CHECK(decoded.v == v);
  }
}

TEST_CASE("decoding bytes encode never writes") {
  // Code 0x7F (E4M3 NaN), int8 code -128 and NaN / inf scales: defined results, canonical NaNs.
  const KvBlockLayout layout(1, 1, 1, 4, KvDtype::fp16);
  std::vector<std::uint8_t> stored(2 * 4 + 2 * 4, 0);
  const std::uint8_t codes[] = {0x7F, 0xFF, 0x80, 0x01};
  std::memcpy(stored.data(), codes, 4);
  std::memcpy(stored.data() + 4, codes, 4);
  const float k_scale = 2.0f;
  const float v_scale = std::numeric_limits<float>::quiet_NaN();
  std::memcpy(stored.data() + 8, &k_scale, 4);
  std::memcpy(stored.data() + 12, &v_scale, 4);

  const auto fp8 = decode(layout, CompressionMode::fp8_e4m3, stored);
  std::uint16_t k[4];
  std::uint16_t v[4];
  std::memcpy(k, fp8.k.data(), sizeof k);
  std::memcpy(v, fp8.v.data(), sizeof v);
  CHECK(k[0] == fb::kFp16CanonicalNan);
  CHECK(k[1] == fb::kFp16CanonicalNan);
  CHECK(k[2] == 0x8000);                                  // -0 * 2
  CHECK(k[3] == fb::f32_bits_to_fp16(bits_of(pow2(-8))));  // 2^-9 * 2
  for (const std::uint16_t word : v) CHECK(word == fb::kFp16CanonicalNan);

  const auto int8 = decode(layout, CompressionMode::int8, stored);
  std::memcpy(k, int8.k.data(), sizeof k);
  CHECK(k[0] == fb::f32_bits_to_fp16(bits_of(254.0f)));   // 127 * 2
  CHECK(k[1] == fb::f32_bits_to_fp16(bits_of(-2.0f)));    // -1 * 2
  CHECK(k[2] == fb::f32_bits_to_fp16(bits_of(-256.0f)));  // -128 * 2
  CHECK(k[3] == fb::f32_bits_to_fp16(bits_of(2.0f)));
}

TEST_CASE("unaligned buffers give the same bytes") {
  std::mt19937 generator(11);
  for (const KvDtype dtype : kDtypes) {
    for (const CompressionMode mode : kCompressed) {
      CAPTURE(activekv::offload::dtype_name(dtype));
      CAPTURE(mode_name(mode));
      const KvBlockLayout layout(1, 2, 2, 8, dtype);
      const std::size_t half = layout.bytes_per_tensor();
      std::vector<std::uint8_t> k(half);
      for (auto& byte : k) byte = static_cast<std::uint8_t>(generator());
      const auto aligned = encode(layout, mode, k, k);
      std::vector<std::uint8_t> shifted_input(half + 1);
      std::memcpy(shifted_input.data() + 1, k.data(), half);
      std::vector<std::uint8_t> shifted_out(aligned.size() + 1);
      encode_layer(layout, mode, shifted_input.data() + 1, shifted_input.data() + 1,
                   shifted_out.data() + 1);
      CHECK(std::memcmp(shifted_out.data() + 1, aligned.data(), aligned.size()) == 0);
      std::vector<std::uint8_t> k_out(half + 1);
      std::vector<std::uint8_t> v_out(half + 1);
      decode_layer(layout, mode, shifted_out.data() + 1, k_out.data() + 1, v_out.data() + 1);
      const Decoded decoded = decode(layout, mode, aligned);
      CHECK(std::memcmp(k_out.data() + 1, decoded.k.data(), half) == 0);
      CHECK(std::memcmp(v_out.data() + 1, decoded.v.data(), half) == 0);
    }
  }
}
