// HostPool and BlockStore: slots by best fit, lookup purity, LRU by extent with pins, refusal,
// counted pins, misuse errors that change nothing, and invariants under concurrent producers and
// consumers; the extent allocator (FreeRuns, BlockStore::allocate_step): best fit, splitting,
// coalescing, eviction of whole extents before placement, pins and refusal, counts, a model check
// and a pool of 262,144 slots.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include "test_support.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>
#include <random>
#include <set>
#include <thread>
#include <vector>

#include "offload/block_store.h"
#include "offload/free_runs.h"
#include "offload/host_pool.h"

using activekv::offload::Allocation;
using activekv::offload::BlockState;
using activekv::offload::BlockStore;
using activekv::offload::BlockStoreError;
using activekv::offload::ExtentCounts;
using activekv::offload::FreeRuns;
using activekv::offload::HostPool;
using activekv::offload::HostPoolError;
using activekv::offload::kPageBytes;
using activekv::offload::SlotRun;
using activekv::offload::StepAllocation;

using activekv::testing::contains;
using activekv::testing::error_message;

// Allocation failure on demand, for the exception-safety cases: the countdown-th allocation from
// now throws bad_alloc (0: none). The test binary's own operator new, a pass-through otherwise.
namespace {
thread_local long failing_allocation = 0;
}  // namespace

void* operator new(std::size_t bytes) {
  if (failing_allocation > 0 && --failing_allocation == 0) throw std::bad_alloc();
  if (void* memory = std::malloc(bytes == 0 ? 1 : bytes)) return memory;
  throw std::bad_alloc();
}
void operator delete(void* memory) noexcept { std::free(memory); }
void operator delete(void* memory, std::size_t) noexcept { std::free(memory); }

namespace {

constexpr std::size_t kSlotBytes = 48;

using Hashes = std::vector<std::uint64_t>;

BlockStore store_of(std::size_t slots) { return BlockStore(slots * kSlotBytes, kSlotBytes); }

// Allocates and commits `hash`; the slot it got.
std::size_t store_block(BlockStore& store, std::uint64_t hash) {
  const Allocation allocation = store.allocate_for_store(hash);
  REQUIRE(allocation.outcome == Allocation::Outcome::allocated);
  store.commit(hash);
  return allocation.slot;
}

}  // namespace

TEST_CASE("a host pool hands out one slot by best fit and is page aligned") {
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
  CHECK(pool.acquire() == 1);  // two runs of one: the lowest start, whatever the release order
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
  CHECK(first.evicted == Hashes{2});
  CHECK(first.slot == 1);  // block 2's slot, handed over
  CHECK_FALSE(store.info(2).has_value());
  store.commit(4);

  const Allocation second = store.allocate_for_store(5);
  CHECK(second.evicted == Hashes{3});
  CHECK(second.slot == 2);
  store.drop(5);  // a failed store frees the slot it took
  CHECK(store.free_slots() == 1);
  CHECK(store.allocate_for_store(6).evicted.empty());  // the free slot comes first
  CHECK(store.check_invariants() == "");
}

TEST_CASE("a lost load does not refresh the block") {
  BlockStore store = store_of(2);
  store_block(store, 1);
  store_block(store, 2);
  REQUIRE(store.pin_for_load(1).has_value());
  store.finish_load(1, false);
  CHECK(store.info(1)->last_use == 1);
  CHECK(store.allocate_for_store(3).evicted == Hashes{1});
}

TEST_CASE("pinned blocks are never evicted and allocation is refused when all are pinned") {
  BlockStore store = store_of(3);
  store_block(store, 1);
  store_block(store, 2);
  REQUIRE(store.allocate_for_store(3).outcome == Allocation::Outcome::allocated);  // storing
  REQUIRE(store.pin_for_load(1).has_value());

  // Block 1 is the LRU but pinned, block 3 is being stored: block 2 goes.
  CHECK(store.allocate_for_store(4).evicted == Hashes{2});
  // Now 1 is pinned and 3, 4 are being stored: nothing to evict.
  const Allocation refused = store.allocate_for_store(5);
  CHECK(refused.outcome == Allocation::Outcome::refused);
  CHECK_FALSE(store.info(5).has_value());
  CHECK(store.info(1).has_value());
  CHECK(store.check_invariants() == "");

  store.finish_load(1, true);  // unpinned: evictable again
  CHECK(store.allocate_for_store(5).evicted == Hashes{1});
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
  CHECK(store.allocate_for_store(8).evicted == Hashes{7});
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

// ---- the extent allocator ----

namespace {

using Runs = std::vector<SlotRun>;

// A FreeRuns of `num_slots` slots whose free slots are exactly `free` (every other one taken).
FreeRuns runs_with_free(std::size_t num_slots, const std::set<std::size_t>& free) {
  FreeRuns runs(num_slots);
  Runs all;
  runs.take(num_slots, all);
  for (const std::size_t slot : free) runs.release(slot);
  REQUIRE(runs.check() == "");
  return runs;
}

Runs take(FreeRuns& runs, std::size_t count) {
  Runs taken;
  runs.take(count, taken);
  CHECK(runs.check() == "");
  return taken;
}

std::set<std::size_t> slot_range(std::size_t first, std::size_t end) {
  std::set<std::size_t> slots;
  for (std::size_t slot = first; slot < end; ++slot) slots.insert(slot);
  return slots;
}

std::set<std::size_t> joined(std::initializer_list<std::set<std::size_t>> parts) {
  std::set<std::size_t> all;
  for (const auto& part : parts) all.insert(part.begin(), part.end());
  return all;
}

// Allocates and commits `hashes` as one step; the runs it took.
Runs store_step(BlockStore& store, const std::vector<std::uint64_t>& hashes) {
  const StepAllocation step = store.allocate_step(hashes);
  for (std::size_t index = 0; index < hashes.size(); ++index) {
    if (step.blocks[index].outcome == Allocation::Outcome::allocated) store.commit(hashes[index]);
  }
  CHECK(store.check_invariants() == "");
  return step.runs;
}

// The placement rule written as plainly as SPEC.md §2 says it, over a set of free slots.
Runs model_take(std::set<std::size_t>& free, std::size_t count) {
  Runs taken;
  while (count > 0) {
    Runs runs;
    for (const std::size_t slot : free) {
      if (!runs.empty() && runs.back().start + runs.back().length == slot) {
        ++runs.back().length;
      } else {
        runs.push_back({slot, 1});
      }
    }
    const SlotRun* best = nullptr;
    for (const SlotRun& run : runs) {
      if (run.length >= count && (best == nullptr || run.length < best->length)) best = &run;
    }
    if (best == nullptr) {
      for (const SlotRun& run : runs) {
        if (best == nullptr || run.length > best->length) best = &run;
      }
    }
    const std::size_t used = std::min(best->length, count);
    taken.push_back({best->start, used});
    for (std::size_t slot = best->start; slot < best->start + used; ++slot) free.erase(slot);
    count -= used;
  }
  return taken;
}

}  // namespace

TEST_CASE("free runs: best fit takes the smallest run that holds the step, lowest start on ties") {
  // Free: [0,3) [5,9) [12,15) [20,24): lengths 3, 4, 3, 4.
  FreeRuns runs = runs_with_free(
      24, joined({slot_range(0, 3), slot_range(5, 9), slot_range(12, 15), slot_range(20, 24)}));
  CHECK(runs.run_count() == 4);
  CHECK(runs.longest_run() == 4);
  CHECK(take(runs, 3) == Runs{{0, 3}});   // two runs of 3 hold it: the lower one
  CHECK(take(runs, 4) == Runs{{5, 4}});   // the runs of 4: the lower one
  CHECK(take(runs, 2) == Runs{{12, 2}});  // the run of 3 before the run of 4; its tail stays free
  CHECK(runs.runs() == Runs{{14, 1}, {20, 4}});
  CHECK(take(runs, 1) == Runs{{14, 1}});
  CHECK(runs.free_slots() == 4);
}

TEST_CASE("free runs: a step no run holds is split, largest runs first, single slots last") {
  // Free: [0,1) [2,4) [6,9) [10,11) [13,16): lengths 1, 2, 3, 1, 3.
  FreeRuns runs = runs_with_free(
      16, joined({{0}, slot_range(2, 4), slot_range(6, 9), {10}, slot_range(13, 16)}));
  // 7 blocks: the two runs of 3 whole (lower first), then best fit for the last one: a run of 1.
  CHECK(take(runs, 7) == Runs{{6, 3}, {13, 3}, {0, 1}});
  CHECK(runs.runs() == Runs{{2, 2}, {10, 1}});
  // 3 blocks: the run of 2 whole, then the last single slot.
  CHECK(take(runs, 3) == Runs{{2, 2}, {10, 1}});
  CHECK(runs.free_slots() == 0);
  CHECK(runs.run_count() == 0);
  CHECK(runs.longest_run() == 0);
  CHECK(contains(error_message<HostPoolError>([&] { take(runs, 1); }), "free slots"));
}

TEST_CASE("free runs coalesce when slots are given back in any order") {
  FreeRuns runs = runs_with_free(10, {});
  runs.release(4);  // alone
  CHECK(runs.runs() == Runs{{4, 1}});
  runs.release(5);  // joins the run before it
  runs.release(2);  // alone
  CHECK(runs.runs() == Runs{{2, 1}, {4, 2}});
  runs.release(3);  // joins both sides
  CHECK(runs.runs() == Runs{{2, 4}});
  runs.release(1);  // joins the run after it
  runs.release(9);
  runs.release(0);
  CHECK(runs.runs() == Runs{{0, 6}, {9, 1}});
  CHECK(runs.free_slots() == 7);
  CHECK(runs.is_free(0));
  CHECK(runs.is_free(5));
  CHECK_FALSE(runs.is_free(6));
  CHECK(runs.is_free(9));
  CHECK(runs.check() == "");
  CHECK(contains(error_message<HostPoolError>([&] { runs.release(3); }), "already free"));
  CHECK(contains(error_message<HostPoolError>([&] { runs.release(10); }), "slot"));
  CHECK(runs.runs() == Runs{{0, 6}, {9, 1}});  // errors change nothing
}

TEST_CASE("free runs make the decisions of the plain model of the rule") {
  std::mt19937_64 random(19);
  for (int round = 0; round < 20; ++round) {
    const std::size_t num_slots = 1 + random() % 64;
    FreeRuns runs(num_slots);
    std::set<std::size_t> free = slot_range(0, num_slots);
    std::vector<std::size_t> taken_slots;
    for (int op = 0; op < 200; ++op) {
      if (!free.empty() && (taken_slots.empty() || random() % 2 == 0)) {
        const std::size_t count = 1 + random() % free.size();
        const Runs expected = model_take(free, count);
        const Runs taken = take(runs, count);
        REQUIRE(taken == expected);
        for (const SlotRun& run : taken) {
          for (std::size_t slot = run.start; slot < run.start + run.length; ++slot) {
            taken_slots.push_back(slot);
          }
        }
      } else {
        const std::size_t at = random() % taken_slots.size();
        const std::size_t slot = taken_slots[at];
        taken_slots.erase(taken_slots.begin() + static_cast<std::ptrdiff_t>(at));
        runs.release(slot);
        free.insert(slot);
      }
      REQUIRE(runs.check() == "");
      REQUIRE(runs.free_slots() == free.size());
    }
  }
}

TEST_CASE("a pool of 262144 slots takes and frees runs without walking the slots") {
  // A 4 GiB pool of 16 KiB slots; fragmented to the worst case, every other slot free.
  constexpr std::size_t kSlots = 262144;
  FreeRuns runs(kSlots);
  Runs all;
  runs.take(kSlots, all);
  for (std::size_t slot = 0; slot < kSlots; slot += 2) runs.release(slot);
  CHECK(runs.run_count() == kSlots / 2);
  const auto started = std::chrono::steady_clock::now();
  // 20,000 steps of 8 blocks, each split over 8 single slots, then given back (coalescing none).
  Runs taken;
  for (int step = 0; step < 20000; ++step) {
    taken.clear();
    runs.take(8, taken);
    REQUIRE(taken.size() == 8);
    for (const SlotRun& run : taken) runs.release(run.start);
  }
  const auto seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  // A scan of the slots per step would take 20,000 x 262,144 steps: minutes, not seconds (a
  // bound loose enough for sanitizer builds).
  CHECK(seconds < 20.0);
  for (std::size_t slot = 1; slot < kSlots; slot += 2) runs.release(slot);
  CHECK(runs.runs() == Runs{{0, kSlots}});
  CHECK(runs.check() == "");
}

TEST_CASE("a step's stores take one extent, in plan order") {
  BlockStore store = store_of(16);
  CHECK(store_step(store, {1, 2, 3}) == Runs{{0, 3}});
  CHECK(store_step(store, {4, 5, 6, 7}) == Runs{{3, 4}});
  for (std::uint64_t hash = 4; hash <= 7; ++hash) CHECK(store.info(hash)->slot == hash - 1);
  // Dropped stores give their slots back, coalesced: [7, 16) is one run again.
  const StepAllocation dropped = store.allocate_step({8, 9});
  CHECK(dropped.runs == Runs{{7, 2}});
  store.drop(9);
  store.drop(8);
  CHECK(store.free_runs() == Runs{{7, 9}});
  CHECK(store.free_run_count() == 1);
  const ExtentCounts counts = store.extent_counts();
  CHECK(counts.store_steps == 3);
  CHECK(counts.extents == 3);
  CHECK(counts.split_steps == 0);
  CHECK(store.check_invariants() == "");
}

TEST_CASE("a fragmented pool splits a step and counts it") {
  BlockStore store = store_of(10);
  // Slots 0..9 taken by one step; the stores of slots 1, 2, 5, 6, 7 and 9 fail (dropped).
  const StepAllocation first = store.allocate_step({1, 2, 3, 4, 5, 6, 7, 8, 9, 10});
  CHECK(first.runs == Runs{{0, 10}});
  for (std::uint64_t hash = 1; hash <= 10; ++hash) {
    const bool fails = hash == 2 || hash == 3 || hash == 6 || hash == 7 || hash == 8 || hash == 10;
    if (fails) {
      store.drop(hash);
    } else {
      store.commit(hash);
    }
  }
  CHECK(store.free_runs() == Runs{{1, 2}, {5, 3}, {9, 1}});
  const ExtentCounts before = store.extent_counts();
  // Six blocks: the run of 3 whole, then the run of 2 whole, then best fit for the last: slot 9.
  const StepAllocation split = store.allocate_step({20, 21, 22, 23, 24, 25});
  CHECK(split.runs == Runs{{5, 3}, {1, 2}, {9, 1}});
  std::vector<std::size_t> slots;
  for (const Allocation& block : split.blocks) slots.push_back(block.slot);
  CHECK(slots == std::vector<std::size_t>{5, 6, 7, 1, 2, 9});
  const ExtentCounts after = store.extent_counts();
  CHECK(after.store_steps == before.store_steps + 1);
  CHECK(after.extents == before.extents + 3);
  CHECK(after.split_steps == before.split_steps + 1);
  CHECK(after.split_blocks == before.split_blocks + 6);
  CHECK(after.single_slot_blocks == before.single_slot_blocks + 1);
  CHECK(store.free_slots() == 0);
  CHECK(store.check_invariants() == "");
}

TEST_CASE("a step evicts the least recently used extent whole, before it is placed") {
  BlockStore store = store_of(8);
  store_step(store, {1, 2, 3, 4});  // slots 0..3, stamps 1..4: one extent, its stamp 4
  store_step(store, {5, 6, 7, 8});  // slots 4..7, stamps 5..8: its stamp 8
  // A later request loads the prefix 1, 2 back: blocks 3 and 4 are the least recently used, but
  // their extent is now the most recent (stamp 10), so the other one goes, all of it.
  for (const std::uint64_t hash : {1, 2}) {
    REQUIRE(store.pin_for_load(hash).has_value());
    store.finish_load(hash, true);
  }
  const StepAllocation step = store.allocate_step({10, 11, 12, 13});
  for (const Allocation& block : step.blocks) {
    REQUIRE(block.outcome == Allocation::Outcome::allocated);
  }
  // The first store evicts the extent (by slot); its other slots are counted for the others.
  CHECK(step.blocks[0].evicted == Hashes{5, 6, 7, 8});
  for (std::size_t index = 1; index < 4; ++index) CHECK(step.blocks[index].evicted.empty());
  CHECK(step.runs == Runs{{4, 4}});  // slots 4..7: one extent
  CHECK(store.info(3).has_value());  // kept with the prefix it follows
  CHECK(store.check_invariants() == "");
}

TEST_CASE("an extent's pinned blocks stay and the extent is evicted again once they are free") {
  BlockStore store = store_of(6);
  store_step(store, {1, 2, 3});  // slots 0..2, the oldest extent
  store_step(store, {4, 5, 6});  // slots 3..5
  REQUIRE(store.pin_for_load(2).has_value());  // a load in flight: not evictable
  // Extent {1, 2, 3} is the oldest: its unpinned blocks go; 2 stays, pinned, in its extent.
  const StepAllocation first = store.allocate_step({10});
  CHECK(first.blocks[0].evicted == Hashes{1, 3});
  CHECK(first.runs == Runs{{0, 1}});  // best fit: slot 0; slot 2 stays free
  CHECK(store.info(2)->pins == 1);
  CHECK(store.check_invariants() == "");
  store.commit(10);
  // A lost load leaves block 2's stamp (and its extent's, 3) as they were: the oldest again.
  store.finish_load(2, false);
  // One free slot (2) first, then the oldest extent with an evictable block: {2} alone.
  const StepAllocation second = store.allocate_step({20, 21});
  CHECK(second.blocks[0].evicted.empty());
  CHECK(second.blocks[1].evicted == Hashes{2});
  CHECK(second.runs == Runs{{1, 2}});
  // All pinned or being stored but {4, 5, 6}: the next step evicts it whole.
  const StepAllocation third = store.allocate_step({30});
  CHECK(third.blocks[0].evicted == Hashes{4, 5, 6});
  CHECK(store.check_invariants() == "");
}

TEST_CASE("a step with some free slots takes them first, then evicts, and places all at once") {
  BlockStore store = store_of(6);
  store_step(store, {1, 2, 3, 4});  // slots 0..3; 4 and 5 free
  const StepAllocation step = store.allocate_step({10, 11, 12});
  CHECK(step.blocks[0].evicted.empty());
  CHECK(step.blocks[1].evicted.empty());
  // The third needs room: the extent of 1..4 goes, whole.
  CHECK(step.blocks[2].evicted == Hashes{1, 2, 3, 4});
  // Free before placement: [0,6), one run: best fit gives its first three slots.
  CHECK(step.runs == Runs{{0, 3}});
  CHECK(step.blocks[0].slot == 0);
  CHECK(step.blocks[1].slot == 1);
  CHECK(step.blocks[2].slot == 2);
  CHECK(store.check_invariants() == "");
}

TEST_CASE("pinned blocks are never evicted for a step and the rest of it is refused") {
  BlockStore store = store_of(4);
  store_step(store, {1, 2, 3, 4});
  for (const std::uint64_t hash : {1, 3, 4}) REQUIRE(store.pin_for_load(hash).has_value());
  // Skipped (committed, duplicate), evicting the one unpinned block, then refused.
  const StepAllocation step = store.allocate_step({1, 10, 10, 11, 12});
  CHECK(step.blocks[0].outcome == Allocation::Outcome::already_present);
  CHECK(step.blocks[1].outcome == Allocation::Outcome::allocated);
  CHECK(step.blocks[1].evicted == Hashes{2});
  CHECK(step.blocks[1].slot == 1);
  CHECK(step.blocks[2].outcome == Allocation::Outcome::already_present);
  CHECK(step.blocks[3].outcome == Allocation::Outcome::refused);
  CHECK(step.blocks[4].outcome == Allocation::Outcome::refused);
  CHECK(step.runs == Runs{{1, 1}});
  CHECK_FALSE(store.info(11).has_value());
  for (const std::uint64_t hash : {1, 3, 4}) CHECK(store.info(hash)->pins == 1);
  CHECK(store.check_invariants() == "");
  // Everything refused: nothing placed, nothing counted.
  const ExtentCounts before = store.extent_counts();
  const StepAllocation refused = store.allocate_step({20, 21});
  CHECK(refused.runs.empty());
  CHECK(store.extent_counts().store_steps == before.store_steps);
  CHECK(store.check_invariants() == "");
}

TEST_CASE("a hash evicted earlier in the same step is stored again") {
  BlockStore store = store_of(2);
  store_step(store, {1, 2});
  // 3 evicts the extent of 1 and 2; 1 is then a new store and takes the slot counted free.
  const StepAllocation step = store.allocate_step({3, 1});
  CHECK(step.blocks[0].evicted == Hashes{1, 2});
  CHECK(step.blocks[1].outcome == Allocation::Outcome::allocated);
  CHECK(step.blocks[1].evicted.empty());
  CHECK(step.runs == Runs{{0, 2}});
  CHECK(store.info(1)->state == BlockState::storing);
  CHECK(store.check_invariants() == "");
}

TEST_CASE("a step that fails at any allocation names every block it evicted and leaves the store whole") {
  bool failed_after_evicting = false;
  for (long at = 1;; ++at) {
    CAPTURE(at);
    BlockStore store = store_of(8);
    store_step(store, {1, 2, 3, 4});  // extent of stamps 1..4, the least recently used
    store_step(store, {5, 6, 7, 8});
    failing_allocation = at;
    bool threw = false;
    try {
      store.allocate_step({10, 11, 12, 13, 14, 15});
    } catch (const std::bad_alloc&) {
      threw = true;
    }
    failing_allocation = 0;
    CHECK(store.check_invariants() == "");
    std::set<std::uint64_t> drained;
    store.drain_evictions_of_failed_step([&](std::uint64_t hash) { drained.insert(hash); });
    if (!threw) {
      CHECK(drained.empty());  // a step that returned reports its evictions itself
      break;
    }
    // Every block gone from the store is named, and none of the step's own blocks stayed.
    std::set<std::uint64_t> gone;
    for (std::uint64_t hash = 1; hash <= 8; ++hash) {
      if (!store.info(hash).has_value()) gone.insert(hash);
    }
    CHECK(drained == gone);
    for (std::uint64_t hash = 10; hash <= 15; ++hash) CHECK_FALSE(store.info(hash).has_value());
    failed_after_evicting |= !drained.empty();
  }
  CHECK(failed_after_evicting);  // some failure point came after an eviction
}
