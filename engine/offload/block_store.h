// Identity of offloaded blocks (SPEC.md §3): vLLM block hash -> host pool slot, committed or being
// stored, pin counts, LRU stamps from one counter, and allocation of a step's stores in extents of
// consecutive slots (SPEC.md §2) that evicts the least recently used unpinned committed blocks or
// refuses. Every public call takes one mutex, so a call sees and
// leaves a consistent store and concurrent lookups of the same prefix agree.
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "offload/free_runs.h"
#include "offload/host_pool.h"

namespace activekv::offload {

// A call that the store's state does not allow (committing a block that is not being stored,
// releasing a pin nobody holds): a bug in the caller, and the store is left unchanged.
class BlockStoreError : public std::logic_error {
 public:
  using std::logic_error::logic_error;
};

enum class BlockState : std::uint8_t { storing, committed };

struct BlockInfo {
  std::size_t slot;
  BlockState state;
  std::uint32_t pins;
  std::uint64_t last_use;  // 0 until the block is first stamped (at commit)
};

struct Allocation {
  enum class Outcome : std::uint8_t {
    allocated,        // `slot` now belongs to the block, which is being stored and pinned
    already_present,  // committed or being stored: nothing done
    refused,          // no free slot and every committed block pinned: nothing done
  };
  Outcome outcome;
  std::size_t slot = 0;
  // The block evicted to make room, when there was no free slot.
  std::optional<std::uint64_t> evicted;
};

// One step's allocation: each block's outcome, in the order asked, and the runs of consecutive
// slots the allocated blocks took (in that order too: the first run's slots go to the first
// allocated blocks).
struct StepAllocation {
  std::vector<Allocation> blocks;
  std::vector<SlotRun> runs;
};

// What the allocator did since the store was made (SPEC.md §2, "Extents").
struct ExtentCounts {
  std::uint64_t store_steps = 0;         // allocations that placed at least one block
  std::uint64_t extents = 0;             // runs of consecutive slots those took
  std::uint64_t split_steps = 0;         // allocations whose blocks took more than one run
  std::uint64_t split_blocks = 0;        // the blocks of those allocations
  std::uint64_t single_slot_blocks = 0;  // of those, blocks that took a run of one slot
};

class BlockStore {
 public:
  // The pool: capacity_bytes / slot_bytes slots (HostPoolError when none fit).
  BlockStore(std::size_t capacity_bytes, std::size_t slot_bytes);

  std::size_t num_slots() const { return pool_.num_slots(); }
  std::size_t slot_bytes() const { return pool_.slot_bytes(); }

  // The number of leading hashes that are committed. Pure: no stamp, no pin.
  std::size_t lookup(const std::vector<std::uint64_t>& hashes) const;

  // Load side. Pins a committed block (counted) and returns its slot; nullopt (nothing done) when
  // the hash is not committed.
  std::optional<std::size_t> pin_for_load(std::uint64_t hash);
  // Ends one load pin; a block that loaded fully is stamped first.
  void finish_load(std::uint64_t hash, bool loaded);

  // Store side, one step's stores at once (SPEC.md §2, §3), in order: a hash committed or being
  // stored (earlier in `hashes` included) is skipped; the others take free slots while any are
  // left uncounted, then each evicts the LRU unpinned committed block, then the rest are refused.
  // The allocated blocks are then placed in runs of consecutive slots by FreeRuns::take, over the
  // free runs the evictions left. Never blocks. A bad_alloc leaves this step's blocks unallocated
  // (blocks evicted before it stay evicted) and every invariant holding.
  StepAllocation allocate_step(const std::vector<std::uint64_t>& hashes);
  // A step of one block.
  Allocation allocate_for_store(std::uint64_t hash);
  // A fully stored block becomes committed: stamped, its store pin released.
  void commit(std::uint64_t hash);
  // A block whose store failed is forgotten and its slot freed.
  void drop(std::uint64_t hash);

  // A slot's bytes: stable for the store's life. Only the holder of the block's pin (its load or
  // its store) touches them, so no lock is needed for the bytes themselves.
  std::uint8_t* slot_data(std::size_t slot);

  // Introspection (tests and diagnostics).
  std::optional<BlockInfo> info(std::uint64_t hash) const;
  std::size_t free_slots() const;
  std::vector<SlotRun> free_runs() const;
  std::size_t free_run_count() const;
  ExtentCounts extent_counts() const;
  std::size_t committed_blocks() const;
  std::size_t storing_blocks() const;
  std::size_t pinned_blocks() const;  // blocks with a load in flight
  std::uint64_t clock() const;
  // Every internal invariant checked; an empty string when all hold, else the first broken one.
  std::string check_invariants() const;

 private:
  struct Block {
    std::uint64_t hash;
    std::size_t slot;
    BlockState state;
    std::uint32_t pins;
    std::uint64_t last_use;
    // Links of the eviction order (committed, unpinned blocks only).
    Block* older = nullptr;
    Block* newer = nullptr;
    bool listed = false;
  };

  bool evictable(const Block& block) const {
    return block.state == BlockState::committed && block.pins == 0;
  }
  // Keep the eviction order in step with one block: call `forget` before changing its state,
  // pins or stamp, and `remember` after.
  void forget(Block& block);
  void remember(Block& block);
  Block& block_or_throw(std::uint64_t hash, const char* what);

  mutable std::mutex mutex_;
  HostPool pool_;
  // Node-based: a Block's address is stable until it is erased, so the order can link blocks.
  std::unordered_map<std::uint64_t, Block> blocks_;
  // Committed, unpinned blocks from least to most recently used, linked through the blocks
  // (stamps are unique, from one counter). A block stamped now goes to the newest end and a pin
  // unlinks it, both O(1); only a load that fails (no new stamp) walks back to its place.
  Block* least_recent_ = nullptr;
  Block* most_recent_ = nullptr;
  std::size_t evictable_count_ = 0;
  std::uint64_t clock_ = 0;
  ExtentCounts counts_;
};

}  // namespace activekv::offload
