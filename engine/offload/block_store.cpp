#include "offload/block_store.h"

#include <chrono>
#include <limits>
#include <set>

namespace activekv::offload {

namespace {

std::string hash_text(std::uint64_t hash) { return "block " + std::to_string(hash); }

}  // namespace

BlockStore::BlockStore(std::size_t capacity_bytes, std::size_t slot_bytes)
    : pool_(capacity_bytes, slot_bytes),
      by_slot_(pool_.num_slots(), nullptr),
      extents_(pool_.num_slots()) {
  // At most one block per slot, and a new one briefly beside its victim: buckets sized once, so
  // steady steps never rehash.
  blocks_.reserve(pool_.num_slots() + 1);
  // A step evicts each block at most once: recording them never allocates.
  evicted_by_step_.reserve(pool_.num_slots());
  // Every extent entry free, the lowest index taken first.
  free_extents_.reserve(pool_.num_slots());
  for (std::size_t index = pool_.num_slots(); index > 0; --index) {
    free_extents_.push_back(index - 1);
  }
}

std::size_t BlockStore::lookup(const std::vector<std::uint64_t>& hashes) const {
  const std::lock_guard<std::mutex> lock(mutex_);
  std::size_t found = 0;
  for (const std::uint64_t hash : hashes) {
    const auto it = blocks_.find(hash);
    if (it == blocks_.end() || it->second.state != BlockState::committed) break;
    ++found;
  }
  return found;
}

std::optional<std::size_t> BlockStore::pin_for_load(std::uint64_t hash) {
  const std::lock_guard<std::mutex> lock(mutex_);
  const auto it = blocks_.find(hash);
  if (it == blocks_.end() || it->second.state != BlockState::committed) return std::nullopt;
  Block& block = it->second;
  if (block.pins == std::numeric_limits<std::uint32_t>::max()) {
    throw BlockStoreError(hash_text(hash) + ": too many pins");
  }
  forget(block);
  ++block.pins;
  return block.slot;
}

void BlockStore::finish_load(std::uint64_t hash, bool loaded) {
  const std::lock_guard<std::mutex> lock(mutex_);
  Block& block = block_or_throw(hash, "finish_load");
  if (block.state != BlockState::committed || block.pins == 0) {
    throw BlockStoreError("finish_load: " + hash_text(hash) + " is not pinned by a load");
  }
  forget(block);
  if (loaded) stamp(block);
  --block.pins;
  remember(block);
}

StepAllocation BlockStore::allocate_step(const std::vector<std::uint64_t>& hashes) {
  const std::lock_guard<std::mutex> lock(mutex_);
  StepAllocation result;
  // Sized first: what allocates is done before the store changes, so placement cannot throw.
  result.blocks.reserve(hashes.size());
  result.runs.reserve(hashes.size());
  std::vector<Block*> placed;  // the allocated blocks, in order, and their index in `blocks`
  std::vector<std::size_t> placed_at;
  placed.reserve(hashes.size());
  placed_at.reserve(hashes.size());
  // Free slots not yet counted for a block of this step: the first blocks take those, the later
  // ones evict (their slots join the free runs) so that placement sees the coalesced space. An
  // eviction frees a whole extent's evictable blocks: the slots beyond the first are counted
  // free for the blocks after it.
  std::size_t uncounted = pool_.free_slots();
  std::optional<std::uint64_t> inserted_now;
  evicted_by_step_.clear();
  std::uint64_t eviction_ns = 0;
  try {
    for (const std::uint64_t hash : hashes) {
      // Pinned from allocation until commit or drop; not evictable meanwhile (not committed).
      const auto [entry, inserted] =
          blocks_.try_emplace(hash, Block{hash, 0, BlockState::storing, 1, 0});
      if (!inserted) {
        result.blocks.push_back({Allocation::Outcome::already_present, 0, {}});
        continue;
      }
      inserted_now = hash;
      Allocation allocation{Allocation::Outcome::allocated, 0, {}};
      if (uncounted > 0) {
        --uncounted;
      } else if (evictable_count_ > 0) {
        const auto evicting = std::chrono::steady_clock::now();
        // The least recently used extent with an evictable block: every stamped extent is
        // listed, and an evictable block is committed, so stamped.
        std::size_t victim = least_recent_;
        while (extents_[victim].evictable == 0) victim = extents_[victim].newer;
        const SlotRun run = extents_[victim].run;
        allocation.evicted.reserve(extents_[victim].evictable);  // before anything changes
        for (std::size_t slot = run.start; slot < run.start + run.length; ++slot) {
          const Block* block = by_slot_[slot];
          if (block != nullptr && block->extent == victim && evictable(*block)) {
            allocation.evicted.push_back(block->hash);
          }
        }
        for (const std::uint64_t evicted : allocation.evicted) {
          Block& block = blocks_.at(evicted);
          release_block(block);  // first: a bad_alloc here leaves this block as it was
          blocks_.erase(evicted);  // another key: `entry` stays valid
          evicted_by_step_.push_back(evicted);
        }
        uncounted += allocation.evicted.size() - 1;
        eviction_ns += static_cast<std::uint64_t>(
            std::chrono::duration_cast<std::chrono::nanoseconds>(
                std::chrono::steady_clock::now() - evicting)
                .count());
      } else {
        blocks_.erase(entry);
        inserted_now.reset();
        result.blocks.push_back({Allocation::Outcome::refused, 0, {}});
        continue;
      }
      placed.push_back(&entry->second);
      placed_at.push_back(result.blocks.size());
      result.blocks.push_back(std::move(allocation));
      inserted_now.reset();
    }
  } catch (...) {
    if (inserted_now) blocks_.erase(*inserted_now);
    for (const Block* block : placed) {
      const std::uint64_t hash = block->hash;  // a copy: the key must outlive the erase
      blocks_.erase(hash);
    }
    throw;
  }
  evicted_by_step_.clear();  // reported by `result`
  last_eviction_ns_ = eviction_ns;
  if (placed.empty()) return result;
  pool_.take(placed.size(), result.runs);
  std::size_t next = 0;
  for (const SlotRun& run : result.runs) {
    // A run holds at least one block, so fewer runs than slots are ever live: an entry is free.
    const std::size_t extent = free_extents_.back();
    free_extents_.pop_back();
    extents_[extent] = Extent{run, run.length};
    for (std::size_t offset = 0; offset < run.length; ++offset, ++next) {
      placed[next]->slot = run.start + offset;
      placed[next]->extent = extent;
      by_slot_[run.start + offset] = placed[next];
      result.blocks[placed_at[next]].slot = run.start + offset;
    }
  }
  ++counts_.store_steps;
  counts_.extents += result.runs.size();
  if (result.runs.size() > 1) {
    ++counts_.split_steps;
    counts_.split_blocks += placed.size();
    for (const SlotRun& run : result.runs) counts_.single_slot_blocks += run.length == 1 ? 1 : 0;
  }
  return result;
}

Allocation BlockStore::allocate_for_store(std::uint64_t hash) {
  return allocate_step({hash}).blocks.front();
}

void BlockStore::commit(std::uint64_t hash) {
  const std::lock_guard<std::mutex> lock(mutex_);
  Block& block = block_or_throw(hash, "commit");
  if (block.state != BlockState::storing) {
    throw BlockStoreError("commit: " + hash_text(hash) + " is not being stored");
  }
  block.state = BlockState::committed;
  stamp(block);
  --block.pins;
  remember(block);
}

void BlockStore::drop(std::uint64_t hash) {
  const std::lock_guard<std::mutex> lock(mutex_);
  Block& block = block_or_throw(hash, "drop");
  if (block.state != BlockState::storing) {
    throw BlockStoreError("drop: " + hash_text(hash) + " is not being stored");
  }
  release_block(block);
  blocks_.erase(hash);
}

std::uint8_t* BlockStore::slot_data(std::size_t slot) {
  // No lock: the pool's memory and slot size never change after construction, so this is
  // arithmetic on immutable state (and it runs once per block per layer on the hot path).
  return pool_.slot_data(slot);
}

std::optional<BlockInfo> BlockStore::info(std::uint64_t hash) const {
  const std::lock_guard<std::mutex> lock(mutex_);
  const auto it = blocks_.find(hash);
  if (it == blocks_.end()) return std::nullopt;
  const Block& block = it->second;
  return BlockInfo{block.slot, block.state, block.pins, block.last_use};
}

std::size_t BlockStore::free_slots() const {
  const std::lock_guard<std::mutex> lock(mutex_);
  return pool_.free_slots();
}

std::vector<SlotRun> BlockStore::free_runs() const {
  const std::lock_guard<std::mutex> lock(mutex_);
  return pool_.free_runs().runs();
}

std::size_t BlockStore::free_run_count() const {
  const std::lock_guard<std::mutex> lock(mutex_);
  return pool_.free_runs().run_count();
}

std::uint64_t BlockStore::last_step_eviction_ns() const {
  const std::lock_guard<std::mutex> lock(mutex_);
  return last_eviction_ns_;
}

ExtentCounts BlockStore::extent_counts() const {
  const std::lock_guard<std::mutex> lock(mutex_);
  return counts_;
}

std::size_t BlockStore::committed_blocks() const {
  const std::lock_guard<std::mutex> lock(mutex_);
  std::size_t count = 0;
  for (const auto& entry : blocks_) count += entry.second.state == BlockState::committed ? 1 : 0;
  return count;
}

std::size_t BlockStore::storing_blocks() const {
  const std::lock_guard<std::mutex> lock(mutex_);
  std::size_t count = 0;
  for (const auto& entry : blocks_) count += entry.second.state == BlockState::storing ? 1 : 0;
  return count;
}

std::size_t BlockStore::pinned_blocks() const {
  const std::lock_guard<std::mutex> lock(mutex_);
  std::size_t count = 0;
  for (const auto& entry : blocks_) count += entry.second.pins > 0 ? 1 : 0;
  return count;
}

std::uint64_t BlockStore::clock() const {
  const std::lock_guard<std::mutex> lock(mutex_);
  return clock_;
}

std::string BlockStore::check_invariants() const {
  const std::lock_guard<std::mutex> lock(mutex_);
  if (std::string runs = pool_.free_runs().check(); !runs.empty()) return runs;
  if (blocks_.size() + pool_.free_slots() != pool_.num_slots()) {
    return "blocks (" + std::to_string(blocks_.size()) + ") + free slots (" +
           std::to_string(pool_.free_slots()) + ") != slots (" +
           std::to_string(pool_.num_slots()) + ")";
  }
  std::set<std::size_t> slots;
  std::set<std::uint64_t> stamps;
  std::size_t expected_evictable = 0;
  for (const auto& [hash, block] : blocks_) {
    if (block.slot >= pool_.num_slots() || pool_.is_free(block.slot)) {
      return hash_text(hash) + " holds slot " + std::to_string(block.slot) +
             ", which is free or out of range";
    }
    if (!slots.insert(block.slot).second) {
      return "slot " + std::to_string(block.slot) + " is held by two blocks";
    }
    if (block.state == BlockState::storing && (block.pins != 1 || block.last_use != 0)) {
      return hash_text(hash) + " is being stored with " + std::to_string(block.pins) +
             " pins and stamp " + std::to_string(block.last_use);
    }
    if (block.state == BlockState::committed) {
      if (block.last_use == 0 || block.last_use > clock_) {
        return hash_text(hash) + " has stamp " + std::to_string(block.last_use) +
               " outside 1.." + std::to_string(clock_);
      }
      if (!stamps.insert(block.last_use).second) {
        return "stamp " + std::to_string(block.last_use) + " is held by two blocks";
      }
    }
    if (evictable(block)) ++expected_evictable;
    if (block.counted != evictable(block)) {
      return hash_text(hash) + (block.counted ? " is counted evictable but pinned or storing"
                                              : " is committed and unpinned but not counted");
    }
    if (block.extent >= extents_.size() || by_slot_[block.slot] != &block) {
      return hash_text(hash) + " is not found at its slot or has no extent";
    }
    const Extent& extent = extents_[block.extent];
    if (block.slot < extent.run.start || block.slot >= extent.run.start + extent.run.length) {
      return hash_text(hash) + " lies outside its extent";
    }
    if (block.state == BlockState::committed && (!extent.listed || extent.stamp < block.last_use)) {
      return hash_text(hash) + " is committed but its extent is unstamped or older than it";
    }
  }
  // Each live extent's counts, from its blocks; free entries are exactly the others.
  std::vector<std::size_t> blocks(extents_.size(), 0);
  std::vector<std::size_t> evictable_in(extents_.size(), 0);
  for (const auto& [hash, block] : blocks_) {
    ++blocks[block.extent];
    evictable_in[block.extent] += evictable(block) ? 1 : 0;
  }
  std::size_t live = 0;
  for (std::size_t index = 0; index < extents_.size(); ++index) {
    const Extent& extent = extents_[index];
    if (blocks[index] == 0) continue;
    ++live;
    if (extent.blocks != blocks[index] || extent.evictable != evictable_in[index]) {
      return "extent " + std::to_string(index) + " counts " + std::to_string(extent.blocks) +
             " blocks, " + std::to_string(extent.evictable) + " evictable; expected " +
             std::to_string(blocks[index]) + ", " + std::to_string(evictable_in[index]);
    }
  }
  if (live + free_extents_.size() != extents_.size()) {
    return std::to_string(live) + " live extents and " + std::to_string(free_extents_.size()) +
           " free entries; expected " + std::to_string(extents_.size()) + " in all";
  }
  std::size_t listed = 0;
  std::size_t previous = kNone;
  for (std::size_t index = least_recent_; index != kNone; index = extents_[index].newer) {
    const Extent& extent = extents_[index];
    if (extent.older != previous || !extent.listed || blocks[index] == 0 ||
        (previous != kNone && extents_[previous].stamp >= extent.stamp)) {
      return "the eviction order is broken at extent " + std::to_string(index);
    }
    previous = index;
    ++listed;
  }
  std::size_t stamped = 0;
  for (std::size_t index = 0; index < extents_.size(); ++index) {
    stamped += blocks[index] > 0 && extents_[index].listed ? 1 : 0;
  }
  if (previous != most_recent_ || listed != stamped || evictable_count_ != expected_evictable) {
    return "the eviction order holds " + std::to_string(listed) + " extents (" +
           std::to_string(stamped) + " stamped) and counts " + std::to_string(evictable_count_) +
           " evictable blocks; expected " + std::to_string(expected_evictable);
  }
  return "";
}

void BlockStore::forget(Block& block) {
  if (!block.counted) return;
  --extents_[block.extent].evictable;
  --evictable_count_;
  block.counted = false;
}

void BlockStore::remember(Block& block) {
  if (block.counted || !evictable(block)) return;
  ++extents_[block.extent].evictable;
  ++evictable_count_;
  block.counted = true;
}

void BlockStore::stamp(Block& block) {
  block.last_use = ++clock_;
  // The newest stamp of all: the extent goes to the newest end.
  const std::size_t index = block.extent;
  Extent& extent = extents_[index];
  unlink(index);
  extent.stamp = clock_;
  extent.older = most_recent_;
  extent.newer = kNone;
  (most_recent_ != kNone ? extents_[most_recent_].newer : least_recent_) = index;
  most_recent_ = index;
  extent.listed = true;
}

void BlockStore::release_block(const Block& block) {
  pool_.release(block.slot);  // first: it is the one step that may throw (bad_alloc)
  const std::size_t index = block.extent;
  Extent& extent = extents_[index];
  if (block.counted) {
    --extent.evictable;
    --evictable_count_;
  }
  by_slot_[block.slot] = nullptr;
  if (--extent.blocks == 0) {
    unlink(index);
    extent = Extent{};
    free_extents_.push_back(index);  // reserved for every entry: never allocates
  }
}

void BlockStore::unlink(std::size_t index) {
  Extent& extent = extents_[index];
  if (!extent.listed) return;
  (extent.older != kNone ? extents_[extent.older].newer : least_recent_) = extent.newer;
  (extent.newer != kNone ? extents_[extent.newer].older : most_recent_) = extent.older;
  extent.older = extent.newer = kNone;
  extent.listed = false;
}

BlockStore::Block& BlockStore::block_or_throw(std::uint64_t hash, const char* what) {
  const auto it = blocks_.find(hash);
  if (it == blocks_.end()) {
    throw BlockStoreError(std::string(what) + ": " + hash_text(hash) + " is not in the store");
  }
  return it->second;
}

}  // namespace activekv::offload
