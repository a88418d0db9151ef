#include "fabric/arena_plan.h"

#include <limits>

namespace activekv::fabric {

std::size_t ArenaPlan::reserve(const std::string& name, std::size_t bytes, std::size_t alignment) {
  if (sealed_) {
    ++refused_after_seal_;
    throw ArenaSealedError("arena is sealed: reservation '" + name + "' of " +
                           std::to_string(bytes) +
                           " bytes refused after warm-up (every buffer must be reserved before "
                           "seal())");
  }
  if (alignment == 0 || (alignment & (alignment - 1)) != 0) {
    throw std::invalid_argument("alignment: expected a power of two; got " +
                                std::to_string(alignment));
  }
  const std::size_t offset = (end_ + alignment - 1) & ~(alignment - 1);
  if (offset < end_ || bytes > std::numeric_limits<std::size_t>::max() - offset) {
    throw std::length_error("arena: reservation '" + name + "' overflows the address space");
  }
  reservations_.push_back(Reservation{name, offset, bytes});
  end_ = offset + bytes;
  return offset;
}

}  // namespace activekv::fabric
