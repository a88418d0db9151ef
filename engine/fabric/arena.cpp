#include "fabric/arena.h"

namespace activekv::fabric {

DeviceArena::DeviceArena(DeviceBackend& backend, std::size_t device_capacity,
                         std::size_t pinned_capacity)
    : backend_(backend),
      device_{nullptr, ArenaPlan(memory_kind_name(MemoryKind::device), device_capacity)},
      pinned_{nullptr, ArenaPlan(memory_kind_name(MemoryKind::pinned), pinned_capacity)} {
  if (device_capacity > 0) device_.base = backend_.allocate(MemoryKind::device, device_capacity);
  if (pinned_capacity > 0) {
    try {
      pinned_.base = backend_.allocate(MemoryKind::pinned, pinned_capacity);
    } catch (...) {
      if (device_.base != nullptr) backend_.release(MemoryKind::device, device_.base);
      throw;
    }
  }
}

DeviceArena::~DeviceArena() {
  if (device_.base != nullptr) backend_.release(MemoryKind::device, device_.base);
  if (pinned_.base != nullptr) backend_.release(MemoryKind::pinned, pinned_.base);
}

void* DeviceArena::allocate(MemoryKind kind, const std::string& name, std::size_t bytes,
                            std::size_t alignment) {
  const std::lock_guard<std::mutex> lock(mutex_);
  Block& target = block(kind);
  try {
    return static_cast<char*>(target.base) +
           target.plan.reserve(name, bytes, alignment,
                               reinterpret_cast<std::uintptr_t>(target.base));
  } catch (const ArenaSealedError&) {
    last_refusal_ = target.plan.last_refusal();
    throw;
  }
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
  device_.plan.seal();
  pinned_.plan.seal();
}

bool DeviceArena::sealed() const {
  const std::lock_guard<std::mutex> lock(mutex_);
  return device_.plan.sealed();
}

std::uint64_t DeviceArena::refused_after_seal() const {
  const std::lock_guard<std::mutex> lock(mutex_);
  return device_.plan.refused_after_seal() + pinned_.plan.refused_after_seal();
}

std::string DeviceArena::last_refusal() const {
  const std::lock_guard<std::mutex> lock(mutex_);
  return last_refusal_;
}

std::size_t DeviceArena::capacity(MemoryKind kind) const {
  const std::lock_guard<std::mutex> lock(mutex_);
  return block(kind).plan.capacity();
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
