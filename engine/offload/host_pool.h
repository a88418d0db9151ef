// The host pool of the CPU route (SPEC.md §2): one page-aligned allocation made at construction and
// never grown, cut into fixed-size slots handed out in runs of consecutive slots (FreeRuns).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <optional>
#include <stdexcept>
#include <vector>

#include "offload/free_runs.h"

namespace activekv::offload {

// Raised for a pool that cannot hold one slot, or a slot index that the pool never handed out;
// the message names the argument.
class HostPoolError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

inline constexpr std::size_t kPageBytes = 4096;

// Bytes rounded up to whole pages; HostPoolError naming `what` when that overflows.
std::size_t round_up_to_pages(std::size_t bytes, const char* what);

// One zero-filled, page-aligned allocation owned for its whole life (std::aligned_alloc wants a
// size that is a multiple of the alignment, so the size is rounded up to pages).
class PageAlignedBuffer {
 public:
  // `bytes` may be 0 (no allocation, data() is null); HostPoolError naming `what`, the bytes asked
  // and the C library's reason when the memory cannot be allocated.
  PageAlignedBuffer(std::size_t bytes, const char* what);

  std::uint8_t* data() { return storage_.get(); }
  const std::uint8_t* data() const { return storage_.get(); }
  std::size_t size() const { return bytes_; }

 private:
  struct FreeDeleter {
    void operator()(std::uint8_t* pointer) const noexcept { std::free(pointer); }
  };

  std::size_t bytes_;
  std::unique_ptr<std::uint8_t, FreeDeleter> storage_;
};

// Not thread-safe on its own: BlockStore serializes every acquire and release under its mutex.
class HostPool {
 public:
  // num_slots = capacity_bytes / slot_bytes; HostPoolError when that is 0. Only the slots are
  // allocated (the remainder of capacity_bytes could never hold a block).
  HostPool(std::size_t capacity_bytes, std::size_t slot_bytes);

  std::size_t num_slots() const { return num_slots_; }
  std::size_t slot_bytes() const { return slot_bytes_; }
  std::size_t free_slots() const { return free_.free_slots(); }
  bool is_free(std::size_t slot) const { return free_.is_free(slot); }
  const FreeRuns& free_runs() const { return free_; }

  // One free slot, now taken (the placement rule for one block: the start of the smallest free
  // run, lowest start among equals); nullopt when every slot is taken.
  std::optional<std::size_t> acquire();
  // `count` free slots, now taken, as runs (FreeRuns::take); HostPoolError when fewer are free.
  void take(std::size_t count, std::vector<SlotRun>& taken) { free_.take(count, taken); }
  // Gives a taken slot back, coalesced with its free neighbours; HostPoolError for a slot out of
  // range or already free.
  void release(std::size_t slot);

  // Start of a slot's bytes; stable for the pool's life. HostPoolError for a slot out of range.
  std::uint8_t* slot_data(std::size_t slot);
  const std::uint8_t* slot_data(std::size_t slot) const;

 private:
  void check_slot(std::size_t slot, const char* what) const;

  std::size_t slot_bytes_;
  std::size_t num_slots_;
  PageAlignedBuffer memory_;
  // Coalesced runs of free slots: deterministic placement in O(log n) per run.
  FreeRuns free_;
};

}  // namespace activekv::offload
