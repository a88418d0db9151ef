#include "fabric/arena.h"


#include <stdexcept>

#include "fabric/errors.h"

namespace activekv::fabric {

DeviceArena::DeviceArena(DeviceBackend& backend, std::size_t device_capacity,
                         std::size_t pinned_capacity)
    : backend_(backend) {
  if (device_capacity > 0) {
    device_.base = backend_.allocate(MemoryKind::device, device_capacity);
    device_.capacity = device_capacity;
  }
  if (pinned_capacity > 0) {
    try {
      pinned_.base = backend_.allocate(MemoryKind::pinned, pinned_capacity);
    } catch (...) {
      if (device_.base != nullptr) backend_.release(MemoryKind::device, device_.base);
      throw;
    }
    pinned_.capacity = pinned_capacity;
  }
}

DeviceArena::~DeviceArena() {
  if (device_.base != nullptr) backend_.release(MemoryKind::device, device_.base);
  if (pinned_.base != nullptr) backend_.release(MemoryKind::pinned, pinned_.base);
}

void* DeviceArena::allocate(MemoryKind kind, const std::string& name, std::size_t bytes,
                            std::size_t alignment) {
  const std::lock_guard<std::mutex> lock(mutex_);
  if (sealed_) {
    ++refused_after_seal_;
    last_refusal_ = std::string(memory_kind_name(kind)) + " allocation '" + name + "' of " +
                    std::to_string(bytes) + " bytes";
    throw ArenaSealedError("arena is sealed: " + last_refusal_ +
                           " refused after warm-up (every buffer must be reserved before seal(); "
                           "the arena never falls back to cudaMalloc)");
  }
  if (alignment == 0 || (alignment & (alignment - 1)) != 0) {
    throw std::invalid_argument("alignment: expected a power of two; got " +
                                std::to_string(alignment));
  }
  Block& target = block(kind);
  const std::size_t end = target.plan.total_bytes();
  const std::size_t offset = (end + alignment - 1) & ~(alignment - 1);
  if (offset < end || offset > target.capacity || bytes > target.capacity - offset) {
    throw ArenaExhaustedError(std::string(memory_kind_name(kind)) + " arena of " +
                              std::to_string(target.capacity) + " bytes cannot hold '" + name +
                              "' (" + std::to_string(bytes) + " bytes at offset " +
                              std::to_string(offset) + "); size the arena for warm-up");
  }
  target.plan.reserve(name, bytes, alignment);
  return static_cast<char*>(target.base) + offset;
}

void* DeviceArena::try_allocate(MemoryKind kind, const std::string& name, std::size_t bytes,
                                std::size_t alignment) noexcept {
  try {
    return allocate(kind, name, bytes, alignment);
  } catch (...) {
    return nullptr;
  }
}

void DeviceArena::seal() {
  const std::lock_guard<std::mutex> lock(mutex_);
  sealed_ = true;
  device_.plan.seal();
  pinned_.plan.seal();
}

bool DeviceArena::sealed() const {
  const std::lock_guard<std::mutex> lock(mutex_);
  return sealed_;
}

std::uint64_t DeviceArena::refused_after_seal() const {
  const std::lock_guard<std::mutex> lock(mutex_);
  return refused_after_seal_;
}

std::string DeviceArena::last_refusal() const {
  const std::lock_guard<std::mutex> lock(mutex_);
  return last_refusal_;
}

std::size_t DeviceArena::capacity(MemoryKind kind) const {
  const std::lock_guard<std::mutex> lock(mutex_);
  return block(kind).capacity;
}

std::size_t DeviceArena::used(MemoryKind kind) const {
  const std::lock_guard<std::mutex> lock(mutex_);
  return block(kind).plan.total_bytes();
}

std::size_t DeviceArena::reservation_count(MemoryKind kind) const {
  const std::lock_guard<std::mutex> lock(mutex_);
  return block(kind).plan.reservations().size();
}

}  // namespace activekv::fabric
