// StagingPool: lowest free region first, the lease state machine, every illegal transition a stale
// lease that changes nothing, quarantine for good, no_region and all_quarantined.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include "test_support.h"

#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "offload/staging.h"

using activekv::offload::BlockTransfer;
using activekv::offload::CompleteStatus;
using activekv::offload::Direction;
using activekv::offload::FenceOutcome;
using activekv::offload::Lease;
using activekv::offload::PrepareStatus;
using activekv::offload::RegionCopies;
using activekv::offload::RegionState;
using activekv::offload::StagingInputError;
using activekv::offload::StagingPool;
using activekv::offload::StaleLeaseError;

using activekv::testing::contains;

namespace {

// Copies that count their calls, so a test can tell whether a refused call ran any.
struct CountingCopies {
  int calls = 0;
  RegionCopies copies() {
    return [this](const std::vector<BlockTransfer>&) { ++calls; };
  }
};

Lease prepared_lease(StagingPool& pool, std::uint32_t layer = 0) {
  const auto prepared = pool.prepare(layer, Direction::load);
  REQUIRE(prepared.status == PrepareStatus::ok);
  return prepared.lease;
}

// What a refused call must leave as it was.
struct Snapshot {
  RegionState state;
  std::uint64_t generation;
  std::size_t transfers;
  std::size_t quarantined;
};

Snapshot snapshot(const StagingPool& pool, std::size_t region) {
  return {pool.state(region), pool.generation(region), pool.transfers(region).size(),
          pool.quarantined_regions()};
}

void check_unchanged(const Snapshot& before, const Snapshot& after) {
  CHECK(before.state == after.state);
  CHECK(before.generation == after.generation);
  CHECK(before.transfers == after.transfers);
  CHECK(before.quarantined == after.quarantined);
}

// Runs `call`, which must throw StaleLeaseError naming `what`, and checks region 0 is unchanged
// and no copies ran.
void check_stale(StagingPool& pool, CountingCopies& counter, const std::function<void()>& call,
                 const std::string& what) {
  const Snapshot before = snapshot(pool, 0);
  const int calls = counter.calls;
  std::string message;
  try {
    call();
    FAIL_CHECK("expected a StaleLeaseError");
  } catch (const StaleLeaseError& error) {
    message = error.what();
  }
  CHECK(contains(message, what));
  CHECK(contains(message, "stale"));
  check_unchanged(before, snapshot(pool, 0));
  CHECK(counter.calls == calls);
}

}  // namespace

TEST_CASE("prepare takes the lowest free region") {
  StagingPool pool(3, 4);
  CHECK(pool.num_regions() == 3);
  CHECK(pool.region_blocks() == 4);
  const Lease first = prepared_lease(pool);
  const Lease second = prepared_lease(pool);
  CHECK(first.region == 0);
  CHECK(second.region == 1);
  CHECK(first.generation == 0);
  CHECK(pool.state(0) == RegionState::prepared);
  CHECK(pool.state(2) == RegionState::free);
}

TEST_CASE("a lease goes prepared, bound, in flight, then free with a new generation") {
  StagingPool pool(2, 2);
  const Lease lease = prepared_lease(pool, 5);
  pool.bind(lease, {{7, 3}, {8, 1}});
  CHECK(pool.state(0) == RegionState::bound);
  CHECK(pool.transfers(0).size() == 2);

  // The copies run at transfer over the bound list; completion sees the same list.
  int copied = 0;
  pool.transfer(lease, FenceOutcome::signalled, [&](const std::vector<BlockTransfer>& transfers) {
    REQUIRE(transfers.size() == 2);
    CHECK(transfers[0].slot == 7);
    CHECK(transfers[1].device_block == 1);
    ++copied;
  });
  CHECK(copied == 1);
  CHECK(pool.state(0) == RegionState::in_flight);
  bool delivered = false;
  const CompleteStatus status =
      pool.complete(lease, [&](const std::vector<BlockTransfer>& transfers) {
        delivered = transfers.size() == 2 && transfers[0].slot == 7;
      });
  CHECK(status == CompleteStatus::ok);
  CHECK(delivered);
  CHECK(pool.state(0) == RegionState::free);
  CHECK(pool.generation(0) == 1);
  CHECK(pool.transfers(0).empty());
  CHECK(pool.quarantined_regions() == 0);

  // The region is taken again, with the next generation.
  const Lease again = prepared_lease(pool);
  CHECK(again.region == 0);
  CHECK(again.generation == 1);
}

TEST_CASE("every illegal transition is a stale lease that changes nothing") {
  StagingPool pool(2, 2);
  CountingCopies counter;
  const std::vector<BlockTransfer> one{{0, 0}};

  // free: no call may use a lease on it.
  const Lease never{0, 0};
  check_stale(pool, counter, [&] { pool.bind(never, one); }, "bind");
  check_stale(
      pool, counter,
      [&] { pool.transfer(never, FenceOutcome::signalled, counter.copies()); },
      "transfer");
  check_stale(pool, counter, [&] { pool.complete(never, counter.copies()); }, "complete");

  // prepared: transfer and complete are out of order.
  const Lease lease = prepared_lease(pool);
  check_stale(
      pool, counter,
      [&] { pool.transfer(lease, FenceOutcome::signalled, counter.copies()); },
      "not bound");
  check_stale(pool, counter, [&] { pool.complete(lease, counter.copies()); }, "not in_flight");
  check_stale(pool, counter, [&] { pool.bind({0, 1}, one); }, "generation");  // future generation

  // bound: bind again and complete are out of order.
  pool.bind(lease, one);
  check_stale(pool, counter, [&] { pool.bind(lease, one); }, "not prepared");
  check_stale(pool, counter, [&] { pool.complete(lease, counter.copies()); }, "not in_flight");

  // in flight: bind and transfer again are out of order.
  pool.transfer(lease, FenceOutcome::signalled, counter.copies());
  CHECK(counter.calls == 1);
  check_stale(pool, counter, [&] { pool.bind(lease, one); }, "in_flight");
  check_stale(
      pool, counter,
      [&] { pool.transfer(lease, FenceOutcome::signalled, counter.copies()); },
      "in_flight");
  check_stale(pool, counter, [&] { pool.complete({0, 7}, counter.copies()); }, "generation");

  // complete: back to free, generation 1. The old lease is now stale for every call.
  CHECK(pool.complete(lease, counter.copies()) == CompleteStatus::ok);
  CHECK(counter.calls == 2);
  check_stale(pool, counter, [&] { pool.complete(lease, counter.copies()); }, "generation");
  const Lease next = prepared_lease(pool);
  CHECK(next.generation == 1);
  check_stale(pool, counter, [&] { pool.bind(lease, one); }, "generation");
  pool.bind(next, one);
  check_stale(
      pool, counter,
      [&] { pool.transfer(lease, FenceOutcome::signalled, counter.copies()); },
      "generation");

  // A region that does not exist.
  check_stale(pool, counter, [&] { pool.bind({9, 0}, one); }, "regions");
  CHECK_THROWS_AS(pool.state(9), StagingInputError);
}

TEST_CASE("bind refuses more transfers than a region holds and changes nothing") {
  StagingPool pool(1, 2);
  const Lease lease = prepared_lease(pool);
  std::string message;
  try {
    pool.bind(lease, {{0, 0}, {1, 1}, {2, 2}});
  } catch (const StagingInputError& error) {
    message = error.what();
  }
  CHECK(contains(message, "region_blocks = 2"));
  CHECK(pool.state(0) == RegionState::prepared);
  CHECK(pool.transfers(0).empty());
  pool.bind(lease, {{0, 0}, {1, 1}});  // the lease is still good
  CHECK(pool.state(0) == RegionState::bound);
}

TEST_CASE("an unknown fence quarantines the region for good and delivers nothing") {
  StagingPool pool(2, 2);
  CountingCopies counter;
  const Lease lease = prepared_lease(pool);
  pool.bind(lease, {{0, 0}});
  pool.transfer(lease, FenceOutcome::unknown, counter.copies());
  CHECK(counter.calls == 1);  // the copies were issued; only their outcome is unknown
  CHECK(pool.complete(lease, counter.copies()) == CompleteStatus::lost);
  CHECK(counter.calls == 1);  // nothing delivered
  CHECK(pool.state(0) == RegionState::quarantined);
  CHECK(pool.quarantined_regions() == 1);
  CHECK_FALSE(pool.all_quarantined());

  // Never taken again: every later prepare gets region 1, or none.
  for (int round = 0; round < 3; ++round) {
    const Lease other = prepared_lease(pool);
    CHECK(other.region == 1);
    CHECK(pool.prepare(0, Direction::store).status == PrepareStatus::no_region);
    pool.bind(other, {});
    pool.transfer(other, FenceOutcome::signalled, counter.copies());
    CHECK(pool.complete(other, counter.copies()) == CompleteStatus::ok);
  }
  CHECK(pool.state(0) == RegionState::quarantined);
  CHECK(pool.quarantined_regions() == 1);
  // Any lease on the quarantined region is stale.
  CHECK_THROWS_AS(pool.complete(lease, counter.copies()), StaleLeaseError);
  CHECK_THROWS_AS(pool.bind(lease, {}), StaleLeaseError);
}

TEST_CASE("no_region while regions are busy, all_quarantined once every region is lost") {
  StagingPool pool(2, 1);
  const Lease first = prepared_lease(pool);
  const Lease second = prepared_lease(pool);
  CHECK(pool.prepare(0, Direction::load).status == PrepareStatus::no_region);

  for (const Lease& lease : {first, second}) {
    pool.bind(lease, {});
    pool.transfer(lease, FenceOutcome::unknown, [](const auto&) {});
    CHECK(pool.complete(lease, [](const auto&) {}) == CompleteStatus::lost);
  }
  CHECK(pool.all_quarantined());
  CHECK(pool.quarantined_regions() == 2);
  // Reported at once, every time: nothing waits for a region that will never come back.
  for (int attempt = 0; attempt < 3; ++attempt) {
    CHECK(pool.prepare(0, Direction::store).status == PrepareStatus::all_quarantined);
  }
}

TEST_CASE("a staging pool that cannot exist is a construction error") {
  const auto message = [](std::size_t regions, std::size_t blocks) {
    try {
      StagingPool pool(regions, blocks);
    } catch (const StagingInputError& error) {
      return std::string(error.what());
    }
    FAIL_CHECK("expected a StagingInputError");
    return std::string();
  };
  CHECK(contains(message(0, 1), "num_regions"));
  CHECK(contains(message(1, 0), "region_blocks"));
  CHECK(contains(message(std::numeric_limits<std::size_t>::max() / 2, 1), "num_regions"));
}
