// Identity of offloaded blocks (SPEC.md §3): vLLM block hash -> host pool slot, committed or being
// stored, pin counts, LRU stamps from one counter, and allocation of a step's stores in extents of
// consecutive slots (SPEC.md §2) that evicts whole extents, least recently used first, or
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
  // The blocks evicted to make room, when there was no free slot: every evictable block of the
  // least recently used extent, by slot (SPEC.md §3). The slots beyond the first are counted
  // free for the stores after this one.
  std::vector<std::uint64_t> evicted;
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
  // left uncounted (the slots evictions free included), else evict the evictable blocks of the
  // least recently used extent that has any, else are refused.
  // The allocated blocks are then placed in runs of consecutive slots by FreeRuns::take, over the
  // free runs the evictions left. Never blocks. A bad_alloc leaves this step's blocks unallocated
  // (blocks evicted before it stay evicted: drain_evictions_of_failed_step names them) and every
  // invariant holding.
  StepAllocation allocate_step(const std::vector<std::uint64_t>& hashes);

  // The blocks a step evicted before its allocate_step failed (bad_alloc): they are gone from
  // the store, and no Allocation reports them. `visit(hash)` for each, in the order evicted (the
  // engine logs their events), then forgotten; nothing after an allocate_step that returned.
  template <typename Visit>
  void drain_evictions_of_failed_step(Visit&& visit) {
    const std::lock_guard<std::mutex> lock(mutex_);
    for (const std::uint64_t hash : evicted_by_step_) visit(hash);
    evicted_by_step_.clear();
  }

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
  // Nanoseconds (steady clock) the last allocate_step spent evicting (a benchmark's figure).
  std::uint64_t last_step_eviction_ns() const;
  std::size_t committed_blocks() const;
  std::size_t storing_blocks() const;
  std::size_t pinned_blocks() const;  // blocks with a load in flight
  std::uint64_t clock() const;
  // Every internal invariant checked; an empty string when all hold, else the first broken one.
  std::string check_invariants() const;

 private:
  static constexpr std::size_t kNone = static_cast<std::size_t>(-1);

  struct Block {
    std::uint64_t hash;
    std::size_t slot;
    BlockState state;
    std::uint32_t pins;
    std::uint64_t last_use;
    std::size_t extent = kNone;  // index in extents_, from placement on
    bool counted = false;        // counted evictable in its extent
  };

  // The run of slots one allocation placed (SPEC.md §2): the unit of eviction. It lives while any
  // of its blocks does, so at most num_slots live at once; they sit in a table of that size,
  // recycled through a free list, so that placing a step allocates nothing.
  struct Extent {
    SlotRun run{0, 0};
    std::size_t blocks = 0;     // its blocks still in the store
    std::size_t evictable = 0;  // of those, committed and unpinned
    std::uint64_t stamp = 0;    // the newest stamp any of its blocks was given; 0 before any
    // Links of the eviction order (stamped extents only), by index.
    std::size_t older = kNone;
    std::size_t newer = kNone;
    bool listed = false;
  };

  bool evictable(const Block& block) const {
    return block.state == BlockState::committed && block.pins == 0;
  }
  // Keep the evictable counts in step with one block: call `forget` before changing its state
  // or pins, and `remember` after.
  void forget(Block& block);
  void remember(Block& block);
  // A new stamp for the block; its extent becomes the most recently used.
  void stamp(Block& block);
  // The block leaves the store (evicted, dropped): its slot, its extent's count.
  void release_block(const Block& block);
  void unlink(std::size_t extent);
  Block& block_or_throw(std::uint64_t hash, const char* what);

  mutable std::mutex mutex_;
  HostPool pool_;
  // Node-based: a Block's address is stable until it is erased, so by_slot_ can point at blocks.
  std::unordered_map<std::uint64_t, Block> blocks_;
  // slot -> the block placed in it (nullptr while free): eviction walks an extent's slots.
  std::vector<Block*> by_slot_;
  std::vector<Extent> extents_;            // num_slots entries
  std::vector<std::size_t> free_extents_;  // indexes of unused entries, taken from the back
  std::vector<std::uint64_t> evicted_by_step_;  // this allocate_step's evictions, so far
  // Stamped extents from least to most recently used (stamps are unique, from one counter): a
  // stamp always moves its extent to the newest end, O(1); eviction takes the oldest extent that
  // has an evictable block, skipping those whose blocks are all pinned.
  std::size_t least_recent_ = kNone;
  std::size_t most_recent_ = kNone;
  std::size_t evictable_count_ = 0;
  std::uint64_t clock_ = 0;
  ExtentCounts counts_;
  std::uint64_t last_eviction_ns_ = 0;
};

}  // namespace activekv::offload
