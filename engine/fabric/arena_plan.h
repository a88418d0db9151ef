// The plan of the device arena: every buffer is reserved during warm-up; after seal() any
// reservation is refused with ArenaSealedError and counted, never served by a fresh allocation.
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace activekv::fabric {

class ArenaSealedError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class ArenaPlan {
 public:
  struct Reservation {
    std::string name;
    std::size_t offset;
    std::size_t bytes;
  };

  // Reserves `bytes` at a multiple of `alignment` (a power of two); returns the offset.
  std::size_t reserve(const std::string& name, std::size_t bytes, std::size_t alignment);
  void seal() { sealed_ = true; }

  bool sealed() const { return sealed_; }
  std::size_t total_bytes() const { return end_; }
  std::uint64_t refused_after_seal() const { return refused_after_seal_; }
  const std::vector<Reservation>& reservations() const { return reservations_; }

 private:
  std::vector<Reservation> reservations_;
  std::size_t end_ = 0;
  bool sealed_ = false;
  std::uint64_t refused_after_seal_ = 0;
};

}  // namespace activekv::fabric
