#include "fabric/arena_plan.h"

#include <limits>
#include <utility>

namespace activekv::fabric {

ArenaPlan::ArenaPlan(std::string kind, std::size_t capacity)
    : kind_(std::move(kind)), capacity_(capacity) {}

std::size_t ArenaPlan::reserve(const std::string& name, std::size_t bytes, std::size_t alignment,
                               std::uintptr_t origin) {
  if (sealed_) {
    const std::string what = (kind_.empty() ? std::string("reservation") : kind_ + " allocation") +
                             " '" + name + "' of " + std::to_string(bytes) + " bytes";
    ++refused_after_seal_;
    last_refusal_ = what;
    throw ArenaSealedError("arena is sealed: " + what +
                           " refused after warm-up (every buffer must be reserved before seal(); "
                           "the arena never falls back to cudaMalloc)");
  }
  if (alignment == 0 || (alignment & (alignment - 1)) != 0) {
    throw std::invalid_argument("alignment: expected a power of two; got " +
                                std::to_string(alignment));
  }
  // The padding that brings origin + end_ to a multiple of alignment.
  const std::size_t padding = (alignment - ((origin + end_) & (alignment - 1))) & (alignment - 1);
  const std::size_t offset = end_ + padding;
  if (offset < end_ || bytes > std::numeric_limits<std::size_t>::max() - offset) {
    throw std::length_error("arena: reservation '" + name + "' overflows the address space");
  }
  if (offset > capacity_ || bytes > capacity_ - offset) {
    throw ArenaExhaustedError((kind_.empty() ? std::string("arena") : kind_ + " arena") +
                              " of " + std::to_string(capacity_) + " bytes cannot hold '" + name +
                              "' (" + std::to_string(bytes) + " bytes at offset " +
                              std::to_string(offset) + "); size the arena for warm-up");
  }
  reservations_.push_back(Reservation{name, offset, bytes});
  end_ = offset + bytes;
  return offset;
}

}  // namespace activekv::fabric
