// HostPool and BlockStore: slots lowest first, lookup purity, LRU with pins, refusal, counted pins,
// misuse errors that change nothing, and invariants under concurrent producers and consumers.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include "test_support.h"

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "offload/block_store.h"
#include "offload/host_pool.h"

using activekv::offload::Allocation;
using activekv::offload::BlockState;
using activekv::offload::BlockStore;
using activekv::offload::BlockStoreError;
using activekv::offload::HostPool;
using activekv::offload::HostPoolError;
using activekv::offload::kPageBytes;

using activekv::testing::contains;
using activekv::testing::error_message;

namespace {

constexpr std::size_t kSlotBytes = 48;

BlockStore store_of(std::size_t slots) { return BlockStore(slots * kSlotBytes, kSlotBytes); }

// Allocates and commits `hash`; the slot it got.
std::size_t store_block(BlockStore& store, std::uint64_t hash) {
  const Allocation allocation = store.allocate_for_store(hash);
  REQUIRE(allocation.outcome == Allocation::Outcome::allocated);
  store.commit(hash);
  return allocation.slot;
}

}  // namespace

TEST_CASE("a host pool takes the lowest free slot and is page aligned") {
  HostPool pool(5 * kSlotBytes + kSlotBytes / 2, kSlotBytes);  // half a slot left over
  CHECK(pool.num_slots() == 5);
  CHECK(pool.slot_bytes() == kSlotBytes);
  CHECK(reinterpret_cast<std::uintptr_t>(pool.slot_data(0)) % kPageBytes == 0);
  CHECK(pool.slot_data(1) == pool.slot_data(0) + kSlotBytes);
  for (std::size_t expected = 0; expected < 5; ++expected) CHECK(pool.acquire() == expected);
  CHECK_FALSE(pool.acquire().has_value());
  pool.release(3);
  pool.release(1);
  CHECK(pool.free_slots() == 2);
  CHECK(pool.acquire() == 1);  // lowest first, whatever the release order
  CHECK(pool.acquire() == 3);

  CHECK(contains(error_message<HostPoolError>([&] { pool.release(5); }), "slot"));
  pool.release(2);
  CHECK(contains(error_message<HostPoolError>([&] { pool.release(2); }), "already free"));
  CHECK(pool.free_slots() == 1);
  CHECK_THROWS_AS(pool.slot_data(5), HostPoolError);
}

TEST_CASE("a host pool without room for one slot is a construction error") {
  const std::string message =
      error_message<HostPoolError>([] { HostPool pool(kSlotBytes - 1, kSlotBytes); });
  CHECK(contains(message, "capacity_bytes"));
  CHECK(contains(message, std::to_string(kSlotBytes)));
  CHECK_THROWS_AS(HostPool(100, 0), HostPoolError);
  CHECK_THROWS_AS(BlockStore(0, kSlotBytes), HostPoolError);
}

TEST_CASE("lookup counts the leading committed hashes and changes nothing") {
  BlockStore store = store_of(4);
  store_block(store, 10);
  store_block(store, 11);
  REQUIRE(store.allocate_for_store(12).outcome == Allocation::Outcome::allocated);  // storing
  store_block(store, 13);
  const auto before = store.info(10);
  const std::uint64_t clock = store.clock();

  CHECK(store.lookup({}) == 0);
  CHECK(store.lookup({10}) == 1);
  CHECK(store.lookup({10, 11}) == 2);
  CHECK(store.lookup({10, 11, 12, 13}) == 2);  // 12 is not committed yet
  CHECK(store.lookup({11, 10, 13}) == 3);
  CHECK(store.lookup({99, 10}) == 0);

  CHECK(store.clock() == clock);
  const auto after = store.info(10);
  REQUIRE(after.has_value());
  CHECK(after->last_use == before->last_use);
  CHECK(after->pins == 0);
  CHECK(store.check_invariants() == "");
}

TEST_CASE("allocation takes free slots first, then evicts the least recently used") {
  BlockStore store = store_of(3);
  CHECK(store_block(store, 1) == 0);
  CHECK(store_block(store, 2) == 1);
  CHECK(store_block(store, 3) == 2);
  CHECK(store.info(1)->last_use == 1);
  CHECK(store.info(3)->last_use == 3);

  // A completed load refreshes block 1: block 2 is now the least recently used.
  REQUIRE(store.pin_for_load(1) == std::size_t{0});
  store.finish_load(1, true);
  CHECK(store.info(1)->last_use == 4);

  const Allocation first = store.allocate_for_store(4);
  CHECK(first.outcome == Allocation::Outcome::allocated);
  CHECK(first.evicted == std::uint64_t{2});
  CHECK(first.slot == 1);  // block 2's slot, handed over
  CHECK_FALSE(store.info(2).has_value());
  store.commit(4);

  const Allocation second = store.allocate_for_store(5);
  CHECK(second.evicted == std::uint64_t{3});
  CHECK(second.slot == 2);
  store.drop(5);  // a failed store frees the slot it took
  CHECK(store.free_slots() == 1);
  CHECK(store.allocate_for_store(6).evicted == std::nullopt);  // the free slot comes first
  CHECK(store.check_invariants() == "");
}

TEST_CASE("a lost load does not refresh the block") {
  BlockStore store = store_of(2);
  store_block(store, 1);
  store_block(store, 2);
  REQUIRE(store.pin_for_load(1).has_value());
  store.finish_load(1, false);
  CHECK(store.info(1)->last_use == 1);
  CHECK(store.allocate_for_store(3).evicted == std::uint64_t{1});
}

TEST_CASE("pinned blocks are never evicted and allocation is refused when all are pinned") {
  BlockStore store = store_of(3);
  store_block(store, 1);
  store_block(store, 2);
  REQUIRE(store.allocate_for_store(3).outcome == Allocation::Outcome::allocated);  // storing
  REQUIRE(store.pin_for_load(1).has_value());

  // Block 1 is the LRU but pinned, block 3 is being stored: block 2 goes.
  CHECK(store.allocate_for_store(4).evicted == std::uint64_t{2});
  // Now 1 is pinned and 3, 4 are being stored: nothing to evict.
  const Allocation refused = store.allocate_for_store(5);
  CHECK(refused.outcome == Allocation::Outcome::refused);
  CHECK_FALSE(store.info(5).has_value());
  CHECK(store.info(1).has_value());
  CHECK(store.check_invariants() == "");

  store.finish_load(1, true);  // unpinned: evictable again
  CHECK(store.allocate_for_store(5).evicted == std::uint64_t{1});
}

TEST_CASE("pins are counted") {
  BlockStore store = store_of(1);
  store_block(store, 7);
  REQUIRE(store.pin_for_load(7).has_value());
  REQUIRE(store.pin_for_load(7).has_value());
  CHECK(store.info(7)->pins == 2);
  store.finish_load(7, true);
  CHECK(store.allocate_for_store(8).outcome == Allocation::Outcome::refused);  // one pin left
  store.finish_load(7, true);
  CHECK(store.info(7)->pins == 0);
  CHECK(store.allocate_for_store(8).evicted == std::uint64_t{7});
}

TEST_CASE("storing a hash that is committed or being stored does nothing") {
  BlockStore store = store_of(4);
  store_block(store, 1);
  REQUIRE(store.allocate_for_store(2).outcome == Allocation::Outcome::allocated);
  const std::size_t free_before = store.free_slots();
  CHECK(store.allocate_for_store(1).outcome == Allocation::Outcome::already_present);
  CHECK(store.allocate_for_store(2).outcome == Allocation::Outcome::already_present);
  CHECK(store.free_slots() == free_before);
  CHECK(store.info(1)->state == BlockState::committed);
  CHECK(store.info(2)->state == BlockState::storing);
  CHECK(store.check_invariants() == "");
}

TEST_CASE("misuse is a BlockStoreError that changes nothing") {
  BlockStore store = store_of(2);
  store_block(store, 1);
  REQUIRE(store.allocate_for_store(2).outcome == Allocation::Outcome::allocated);
  const std::uint64_t clock = store.clock();

  CHECK(contains(error_message<BlockStoreError>([&] { store.commit(1); }), "not being stored"));
  CHECK(contains(error_message<BlockStoreError>([&] { store.drop(1); }), "not being stored"));
  CHECK(contains(error_message<BlockStoreError>([&] { store.commit(9); }), "not in the store"));
  CHECK(contains(error_message<BlockStoreError>([&] { store.finish_load(1, true); }),
                 "not pinned"));
  CHECK_THROWS_AS(store.finish_load(2, true), BlockStoreError);  // being stored, not loaded
  CHECK_FALSE(store.pin_for_load(2).has_value());                // not committed: a miss
  CHECK_FALSE(store.pin_for_load(9).has_value());

  CHECK(store.clock() == clock);
  CHECK(store.info(1)->pins == 0);
  CHECK(store.info(2)->state == BlockState::storing);
  CHECK(store.check_invariants() == "");
}

TEST_CASE("concurrent producers and a consumer keep every invariant") {
  constexpr std::size_t kSlots = 16;
  constexpr std::uint64_t kPerProducer = 3000;
  BlockStore store = store_of(kSlots);

  // A pinned prefix that no producer can evict: every concurrent lookup of it must agree.
  const std::vector<std::uint64_t> prefix{1, 2, 3, 4};
  for (const std::uint64_t hash : prefix) {
    const Allocation allocation = store.allocate_for_store(hash);
    REQUIRE(allocation.outcome == Allocation::Outcome::allocated);
    std::memset(store.slot_data(allocation.slot), static_cast<int>(hash & 0xFF), kSlotBytes);
    store.commit(hash);
    REQUIRE(store.pin_for_load(hash).has_value());
  }

  std::atomic<bool> producing{true};
  std::atomic<std::uint64_t> committed{0};
  std::atomic<std::uint64_t> refused{0};
  std::atomic<std::uint64_t> corrupt{0};
  std::atomic<std::uint64_t> disagreed{0};

  // Each producer stores its own hashes: the slot is written while the block is pinned by its
  // store, then committed (one in seven is dropped instead, as a failed store would be).
  auto producer = [&](std::uint64_t first) {
    for (std::uint64_t hash = first; hash < first + kPerProducer; ++hash) {
      const Allocation allocation = store.allocate_for_store(hash);
      if (allocation.outcome == Allocation::Outcome::refused) {
        ++refused;
        continue;
      }
      CHECK(allocation.outcome == Allocation::Outcome::allocated);  // never REQUIRE off main
      std::memset(store.slot_data(allocation.slot), static_cast<int>(hash & 0xFF), kSlotBytes);
      if (hash % 7 == 0) {
        store.drop(hash);
      } else {
        store.commit(hash);
        ++committed;
      }
    }
  };
  // The consumer loads what the producers committed: a pinned block's bytes cannot change.
  auto consumer = [&] {
    std::uint64_t attempt = 0;
    while (producing.load()) {
      if (store.lookup(prefix) != prefix.size()) ++disagreed;
      const std::uint64_t probe = 100 + (++attempt * 7919) % (2 * kPerProducer);
      const auto slot = store.pin_for_load(probe);
      if (!slot) continue;
      const std::uint8_t* bytes = store.slot_data(*slot);
      for (std::size_t i = 0; i < kSlotBytes; ++i) {
        if (bytes[i] != (probe & 0xFF)) ++corrupt;
      }
      store.finish_load(probe, true);
    }
  };
  auto looker = [&] {
    while (producing.load()) {
      if (store.lookup(prefix) != prefix.size()) ++disagreed;
    }
  };

  std::thread consumer_thread(consumer);
  std::thread looker_thread(looker);
  std::thread first(producer, 100);
  std::thread second(producer, 100 + kPerProducer);
  first.join();
  second.join();
  producing = false;
  consumer_thread.join();
  looker_thread.join();

  CHECK(corrupt.load() == 0);
  CHECK(disagreed.load() == 0);
  CHECK(committed.load() > 0);
  CHECK(store.check_invariants() == "");
  CHECK(store.storing_blocks() == 0);
  CHECK(store.lookup(prefix) == prefix.size());
  for (const std::uint64_t hash : prefix) CHECK(store.info(hash)->pins == 1);
  // Every slot holds a committed block: the pool is full of the most recently committed ones.
  CHECK(store.committed_blocks() + store.free_slots() == kSlots);
  CHECK(refused.load() == 0);  // 12 unpinned slots: a producer always finds a victim
}
