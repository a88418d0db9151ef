// The sealed arena: one device block and one pinned host block, taken from the backend once at
// warm-up; every buffer of the runtime is carved out of them. After seal() every allocation
// request through the boundary is refused (ArenaSealedError, or nullptr from try_allocate for
// callers such as TensorRT's allocator interface that cannot throw) and counted. The arena never
// falls back to a fresh device allocation.
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>

#include "fabric/arena_plan.h"
#include "fabric/device_backend.h"

namespace activekv::fabric {

class DeviceArena {
 public:
  // Takes both blocks from `backend` now (warm-up); a zero capacity takes no block of that kind.
  DeviceArena(DeviceBackend& backend, std::size_t device_capacity, std::size_t pinned_capacity);
  ~DeviceArena();
  DeviceArena(const DeviceArena&) = delete;
  DeviceArena& operator=(const DeviceArena&) = delete;

  // Carves `bytes` at a multiple of `alignment` (a power of two). Throws ArenaSealedError after
  // seal() (counted), ArenaExhaustedError when the block is too small; a failure changes nothing.
  void* allocate(MemoryKind kind, const std::string& name, std::size_t bytes,
                 std::size_t alignment = 256);
  // As allocate(), for callers that cannot throw: nullptr on any refusal (still counted).
  void* try_allocate(MemoryKind kind, const std::string& name, std::size_t bytes,
                     std::size_t alignment) noexcept;

  void seal();
  bool sealed() const;
  std::uint64_t refused_after_seal() const;
  std::string last_refusal() const;
  std::size_t capacity(MemoryKind kind) const;
  std::size_t used(MemoryKind kind) const;
  std::size_t reservation_count(MemoryKind kind) const;

 private:
  struct Block {
    void* base = nullptr;
    ArenaPlan plan;  // bounded by the block's capacity
  };
  Block& block(MemoryKind kind) { return kind == MemoryKind::device ? device_ : pinned_; }
  const Block& block(MemoryKind kind) const {
    return kind == MemoryKind::device ? device_ : pinned_;
  }

  DeviceBackend& backend_;
  Block device_;
  Block pinned_;
  std::string last_refusal_;  // of either block
  // TensorRT may call its allocator from its own threads.
  mutable std::mutex mutex_;
};

}  // namespace activekv::fabric
