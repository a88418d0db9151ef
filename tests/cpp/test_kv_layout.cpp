// KvBlockLayout: sizes and offsets per dtype, field-naming errors, overflow rejection, describe().
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <cstddef>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>

#include "offload/kv_layout.h"

using activekv::offload::dtype_bytes;
using activekv::offload::dtype_name;
using activekv::offload::KvBlockLayout;
using activekv::offload::KvDtype;
using activekv::offload::LayoutError;

namespace {

constexpr std::uint32_t kU32Max = std::numeric_limits<std::uint32_t>::max();

// The message of the LayoutError that `make` throws; fails a check when it throws nothing.
template <typename Make>
std::string layout_error(Make make) {
  try {
    make();
  } catch (const LayoutError& error) {
    return error.what();
  }
  FAIL_CHECK("expected a LayoutError");
  return "<no exception>";
}

bool starts_with(const std::string& text, const std::string& prefix) {
  return text.compare(0, prefix.size(), prefix) == 0;
}

struct Expected {
  KvDtype dtype;
  std::size_t element_bytes;
};

}  // namespace

TEST_CASE("dtype bytes and names") {
  CHECK(dtype_bytes(KvDtype::fp16) == 2);
  CHECK(dtype_bytes(KvDtype::bf16) == 2);
  CHECK(dtype_bytes(KvDtype::fp32) == 4);
  CHECK(std::string(dtype_name(KvDtype::fp16)) == "fp16");
  CHECK(std::string(dtype_name(KvDtype::bf16)) == "bf16");
  CHECK(std::string(dtype_name(KvDtype::fp32)) == "fp32");

  const auto bogus = static_cast<KvDtype>(7);
  CHECK(std::string(dtype_name(bogus)) == "unknown");
  CHECK(starts_with(layout_error([&] { return dtype_bytes(bogus); }), "dtype:"));
  CHECK(starts_with(layout_error([&] { return KvBlockLayout(1, 1, 1, 1, bogus); }), "dtype:"));
}

TEST_CASE("sizes and offsets for fp16 bf16 and fp32") {
  // 32 layers, 16 tokens per block, 8 KV heads of 128 elements.
  for (const Expected expected : {Expected{KvDtype::fp16, 2}, Expected{KvDtype::bf16, 2},
                                  Expected{KvDtype::fp32, 4}}) {
    CAPTURE(dtype_name(expected.dtype));
    const KvBlockLayout layout(32, 16, 8, 128, expected.dtype);
    CHECK(layout.num_layers() == 32);
    CHECK(layout.block_size() == 16);
    CHECK(layout.num_kv_heads() == 8);
    CHECK(layout.head_dim() == 128);
    CHECK(layout.dtype() == expected.dtype);

    const std::size_t tensor = 16 * 8 * 128 * expected.element_bytes;  // 32 KiB or 64 KiB
    CHECK(layout.bytes_per_tensor() == tensor);
    CHECK(layout.bytes_per_layer() == 2 * tensor);
    CHECK(layout.bytes_per_block() == 32 * 2 * tensor);

    CHECK(layout.offset_of(0, false) == 0);
    CHECK(layout.offset_of(0, true) == tensor);
    CHECK(layout.offset_of(1, false) == 2 * tensor);
    CHECK(layout.offset_of(31, false) == 31 * 2 * tensor);
    CHECK(layout.offset_of(31, true) == 31 * 2 * tensor + tensor);
    // The last layer's V ends exactly at the end of the block.
    CHECK(layout.offset_of(31, true) + layout.bytes_per_tensor() == layout.bytes_per_block());
  }

  // Literal values, so the expectations above do not only restate the formula.
  CHECK(KvBlockLayout(32, 16, 8, 128, KvDtype::fp16).bytes_per_block() == 2097152);
  CHECK(KvBlockLayout(32, 16, 8, 128, KvDtype::bf16).offset_of(31, true) == 2064384);
  CHECK(KvBlockLayout(32, 16, 8, 128, KvDtype::fp32).offset_of(31, false) == 4063232);
}

TEST_CASE("odd geometry") {
  const KvBlockLayout layout(3, 5, 7, 96, KvDtype::fp32);
  CHECK(layout.bytes_per_tensor() == 13440);
  CHECK(layout.bytes_per_layer() == 26880);
  CHECK(layout.bytes_per_block() == 80640);
  CHECK(layout.offset_of(2, false) == 53760);
  CHECK(layout.offset_of(2, true) == 67200);

  const KvBlockLayout single(1, 1, 1, 1, KvDtype::bf16);
  CHECK(single.bytes_per_tensor() == 2);
  CHECK(single.bytes_per_block() == 4);
  CHECK(single.offset_of(0, true) == 2);
}

TEST_CASE("a zero field is rejected by name") {
  const std::string positive = ": expected a positive value; got 0";
  CHECK(layout_error([] { return KvBlockLayout(0, 16, 8, 128, KvDtype::fp16); }) ==
        "num_layers" + positive);
  CHECK(layout_error([] { return KvBlockLayout(32, 0, 8, 128, KvDtype::fp16); }) ==
        "block_size" + positive);
  CHECK(layout_error([] { return KvBlockLayout(32, 16, 0, 128, KvDtype::fp16); }) ==
        "num_kv_heads" + positive);
  CHECK(layout_error([] { return KvBlockLayout(32, 16, 8, 0, KvDtype::fp16); }) ==
        "head_dim" + positive);
  // LayoutError is an std::invalid_argument for callers that catch the standard type.
  CHECK_THROWS_AS(KvBlockLayout(32, 16, 8, 0, KvDtype::fp32), std::invalid_argument);
}

TEST_CASE("offset_of rejects a layer out of range") {
  const KvBlockLayout layout(32, 16, 8, 128, KvDtype::fp16);
  CHECK(layout_error([&] { return layout.offset_of(32, false); }) ==
        "layer: expected 0 <= layer < 32; got 32");
  CHECK(starts_with(layout_error([&] { return layout.offset_of(32, true); }), "layer:"));
  CHECK(starts_with(layout_error([&] { return layout.offset_of(kU32Max, false); }), "layer:"));
}

TEST_CASE("a block that does not fit in size_t is rejected") {
  static_assert(sizeof(std::size_t) == 8, "the limits below assume a 64-bit size_t");

  const std::string huge =
      layout_error([] { return KvBlockLayout(kU32Max, kU32Max, kU32Max, kU32Max, KvDtype::fp32); });
  CHECK(starts_with(huge, "block:"));
  CHECK(huge.find("layers=4294967295") != std::string::npos);
  CHECK(huge.find("dtype=fp32") != std::string::npos);

  // 2^30 tokens x 2^31 heads x 1 x 2 bytes x (K,V) x 1 layer = 2^63 bytes: fits.
  const KvBlockLayout largest(1, 1u << 30, 1u << 31, 1, KvDtype::fp16);
  CHECK(largest.bytes_per_block() == (std::size_t{1} << 63));
  // Twice that, 2^64 bytes, does not: by tokens, by layers, and by a wider dtype.
  CHECK(starts_with(layout_error([] { return KvBlockLayout(1, 1u << 31, 1u << 31, 1, KvDtype::fp16); }),
                    "block:"));
  CHECK(starts_with(layout_error([] { return KvBlockLayout(2, 1u << 30, 1u << 31, 1, KvDtype::fp16); }),
                    "block:"));
  CHECK(starts_with(layout_error([] { return KvBlockLayout(1, 1u << 30, 1u << 31, 1, KvDtype::fp32); }),
                    "block:"));
}

TEST_CASE("a block whose size wraps past 2^128 is still rejected") {
  // 2^31 x 2903110321 x 2147483649 x 3177065634 = 2^31 x (2^94 + 2); x 4 bytes x (K,V) this is
  // 2^128 + 2^35 bytes, which a 128-bit product wraps to 2^35 (32 GiB), a size that looks valid.
  CHECK(starts_with(layout_error([] {
                      return KvBlockLayout(1u << 31, 2903110321u, 2147483649u, 3177065634u,
                                           KvDtype::fp32);
                    }),
                    "block:"));
}

TEST_CASE("describe names every field") {
  CHECK(KvBlockLayout(32, 16, 8, 128, KvDtype::fp16).describe() ==
        "layers=32 block_size=16 kv_heads=8 head_dim=128 dtype=fp16");
  CHECK(KvBlockLayout(3, 5, 7, 96, KvDtype::bf16).describe() ==
        "layers=3 block_size=5 kv_heads=7 head_dim=96 dtype=bf16");
  CHECK(KvBlockLayout(1, 1, 1, 1, KvDtype::fp32).describe() ==
        "layers=1 block_size=1 kv_heads=1 head_dim=1 dtype=fp32");
}
