// The plan of the device arena: every buffer is reserved during warm-up; after seal() any
// reservation is refused with ArenaSealedError and counted, never served by a fresh allocation.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

namespace activekv::fabric {

class ArenaSealedError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The arena cannot hold a reservation made during warm-up (a sizing error, not a rule violation).
class ArenaExhaustedError : public std::runtime_error {
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

  // `kind` names what is reserved in errors ("device" for the arena's device block: "device
  // allocation 'x'"); `capacity` bounds the plan (the arena's block; unbounded by default).
  explicit ArenaPlan(std::string kind = "", std::size_t capacity = kUnbounded);

  // Reserves `bytes` at a multiple of `alignment` (a power of two) from `origin`, the address
  // offset 0 stands for (so that an arena's addresses are aligned, whatever its block's base);
  // returns the offset. After seal() ArenaSealedError (counted); beyond the capacity
  // ArenaExhaustedError; std::invalid_argument for a bad alignment. A failure changes nothing
  // else.
  std::size_t reserve(const std::string& name, std::size_t bytes, std::size_t alignment,
                      std::uintptr_t origin = 0);
  void seal() { sealed_ = true; }

  bool sealed() const { return sealed_; }
  std::size_t capacity() const { return capacity_; }
  std::size_t total_bytes() const { return end_; }
  std::uint64_t refused_after_seal() const { return refused_after_seal_; }
  // What the last reservation refused after seal() was ("device allocation 'x' of 8 bytes").
  const std::string& last_refusal() const { return last_refusal_; }
  const std::vector<Reservation>& reservations() const { return reservations_; }

 private:
  static constexpr std::size_t kUnbounded = std::numeric_limits<std::size_t>::max();

  std::string kind_;
  std::size_t capacity_;
  std::string last_refusal_;
  std::vector<Reservation> reservations_;
  std::size_t end_ = 0;
  bool sealed_ = false;
  std::uint64_t refused_after_seal_ = 0;
};

}  // namespace activekv::fabric
