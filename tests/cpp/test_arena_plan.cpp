// ArenaPlan: aligned offsets, total size, alignment checks, sealing, overflow.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include "test_support.h"

#include <cstdint>
#include <cstddef>
#include <limits>
#include <stdexcept>
#include <string>

#include "fabric/arena_plan.h"

using activekv::fabric::ArenaPlan;
using activekv::fabric::ArenaSealedError;

using activekv::testing::contains;
using activekv::testing::error_message;

namespace {

constexpr std::size_t kSizeMax = std::numeric_limits<std::size_t>::max();

}  // namespace

TEST_CASE("a fresh plan is empty and open") {
  const ArenaPlan plan;
  CHECK(plan.total_bytes() == 0);
  CHECK_FALSE(plan.sealed());
  CHECK(plan.refused_after_seal() == 0);
  CHECK(plan.reservations().empty());
}

TEST_CASE("reservations are placed at aligned offsets") {
  ArenaPlan plan;
  CHECK(plan.reserve("kv_pool", 100, 64) == 0);
  CHECK(plan.total_bytes() == 100);
  CHECK(plan.reserve("staging", 10, 256) == 256);  // 100 rounded up to 256
  CHECK(plan.total_bytes() == 266);
  CHECK(plan.reserve("flag", 1, 1) == 266);  // alignment 1: directly after
  CHECK(plan.total_bytes() == 267);
  CHECK(plan.reserve("empty", 0, 16) == 272);  // a zero-byte reservation still aligns the end
  CHECK(plan.total_bytes() == 272);
  CHECK(plan.reserve("already_aligned", 8, 16) == 272);  // no padding when the end is aligned
  CHECK(plan.total_bytes() == 280);
  CHECK(plan.reserve("page", 4096, 4096) == 4096);
  CHECK(plan.total_bytes() == 8192);

  const auto& reservations = plan.reservations();
  REQUIRE(reservations.size() == 6);
  CHECK(reservations[0].name == "kv_pool");
  CHECK(reservations[0].offset == 0);
  CHECK(reservations[0].bytes == 100);
  CHECK(reservations[1].name == "staging");
  CHECK(reservations[1].offset == 256);
  CHECK(reservations[1].bytes == 10);
  CHECK(reservations[3].name == "empty");
  CHECK(reservations[3].offset == 272);
  CHECK(reservations[3].bytes == 0);
  CHECK(reservations[5].name == "page");
  CHECK(reservations[5].offset == 4096);
  CHECK(reservations[5].bytes == 4096);
  // No two reservations overlap and each starts at or after the previous one's end.
  for (std::size_t i = 1; i < reservations.size(); ++i) {
    CAPTURE(i);
    CHECK(reservations[i].offset >= reservations[i - 1].offset + reservations[i - 1].bytes);
  }
}

TEST_CASE("reservations align the address they stand for, not only the offset") {
  ArenaPlan plan;
  // A block based 256 bytes past a 512 boundary (cudaMalloc promises only 256).
  const std::uintptr_t origin = 4096 + 256;
  CHECK(plan.reserve("first", 100, 512, origin) == 256);
  CHECK((origin + 256) % 512 == 0);
  CHECK(plan.reserve("next", 8, 256, origin) == 512);  // 356 rounded up to the next 256 address
  CHECK(plan.reserve("byte", 1, 1, origin) == 520);
}

TEST_CASE("an alignment that is not a power of two is rejected") {
  ArenaPlan plan;
  plan.reserve("first", 10, 8);
  for (const std::size_t alignment : {std::size_t{0}, std::size_t{3}, std::size_t{48},
                                      std::size_t{100}, kSizeMax}) {
    CAPTURE(alignment);
    const std::string message =
        error_message<std::invalid_argument>([&] { plan.reserve("bad", 4, alignment); });
    CHECK(contains(message, "alignment"));
    CHECK(contains(message, std::to_string(alignment)));
  }
  // Nothing was added by the refused calls, and the plan still works.
  CHECK(plan.reservations().size() == 1);
  CHECK(plan.total_bytes() == 10);
  CHECK(plan.reserve("second", 1, 2) == 10);
}

TEST_CASE("after seal every reservation is refused, named and counted") {
  ArenaPlan plan;
  plan.reserve("weights", 1000, 256);
  plan.reserve("kv_pool", 4096, 4096);
  const std::size_t total_before = plan.total_bytes();
  plan.seal();
  CHECK(plan.sealed());
  CHECK(plan.refused_after_seal() == 0);

  const std::string message =
      error_message<ArenaSealedError>([&] { plan.reserve("late_scratch", 777, 64); });
  CHECK(contains(message, "'late_scratch'"));
  CHECK(contains(message, "777"));
  CHECK(plan.refused_after_seal() == 1);

  // ArenaSealedError is an std::runtime_error; every refusal counts, even with a bad alignment.
  CHECK_THROWS_AS(plan.reserve("late_again", 1, 1), std::runtime_error);
  CHECK(plan.refused_after_seal() == 2);
  CHECK_THROWS_AS(plan.reserve("late_misaligned", 1, 3), ArenaSealedError);
  CHECK(plan.refused_after_seal() == 3);
  CHECK_THROWS_AS(plan.reserve("late_empty", 0, 1), ArenaSealedError);
  CHECK(plan.refused_after_seal() == 4);

  // Nothing was added after seal.
  CHECK(plan.total_bytes() == total_before);
  REQUIRE(plan.reservations().size() == 2);
  CHECK(plan.reservations()[1].name == "kv_pool");
  CHECK(plan.sealed());
}

TEST_CASE("a reservation past the end of the address space is a length_error") {
  ArenaPlan plan;
  CHECK(plan.reserve("almost_everything", kSizeMax - 8, 1) == 0);
  CHECK(plan.total_bytes() == kSizeMax - 8);

  // The bytes overflow.
  const std::string message =
      error_message<std::length_error>([&] { plan.reserve("one_too_many", 16, 1); });
  CHECK(contains(message, "'one_too_many'"));
  // The aligned offset itself wraps around.
  CHECK_THROWS_AS(plan.reserve("wrapping_offset", 0, 64), std::length_error);
  // Exactly up to the last byte still fits.
  CHECK(plan.reserve("last_bytes", 8, 1) == kSizeMax - 8);
  CHECK(plan.total_bytes() == kSizeMax);
  CHECK_THROWS_AS(plan.reserve("nothing_left", 1, 1), std::length_error);
  CHECK(plan.reservations().size() == 2);
  CHECK(plan.refused_after_seal() == 0);

  ArenaPlan other;
  other.reserve("byte", 1, 1);
  CHECK_THROWS_AS(other.reserve("everything", kSizeMax, 1), std::length_error);
  CHECK(other.total_bytes() == 1);
  CHECK(other.reservations().size() == 1);
}
