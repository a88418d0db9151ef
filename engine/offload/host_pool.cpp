#include "offload/host_pool.h"

#include <cerrno>
#include <cstring>
#include <limits>
#include <string>
#include <system_error>

namespace activekv::offload {

std::size_t round_up_to_pages(std::size_t bytes, const char* what) {
  if (bytes > std::numeric_limits<std::size_t>::max() - (kPageBytes - 1)) {
    throw HostPoolError(std::string(what) + ": expected a size that fits in memory; got " +
                        std::to_string(bytes) + " bytes");
  }
  return (bytes + kPageBytes - 1) / kPageBytes * kPageBytes;
}

PageAlignedBuffer::PageAlignedBuffer(std::size_t bytes, const char* what) : bytes_(bytes) {
  if (bytes == 0) return;
  const std::size_t rounded = round_up_to_pages(bytes, what);
  errno = 0;
  storage_.reset(static_cast<std::uint8_t*>(std::aligned_alloc(kPageBytes, rounded)));
  if (!storage_) {
    // Why, as the C library says it (ENOMEM: no memory, or an address-space limit such as
    // RLIMIT_AS), so that the user can tell a pool too large for this machine from a limit.
    const int reason = errno != 0 ? errno : ENOMEM;
    throw HostPoolError(std::string(what) + ": cannot allocate " + std::to_string(rounded) +
                        " bytes of page-aligned host memory (aligned_alloc: " +
                        std::generic_category().message(reason) + ")");
  }
  // Zero-filled so that nothing ever reads indeterminate bytes, and so that the pages are
  // committed here rather than on the first transfer.
  std::memset(storage_.get(), 0, rounded);
}

HostPool::HostPool(std::size_t capacity_bytes, std::size_t slot_bytes)
    : slot_bytes_(slot_bytes),
      num_slots_(slot_bytes == 0 ? 0 : capacity_bytes / slot_bytes),
      memory_(num_slots_ * slot_bytes_, "capacity_bytes"),
      free_(num_slots_) {
  if (slot_bytes_ == 0) {
    throw HostPoolError("slot_bytes: expected a positive slot size; got 0");
  }
  if (num_slots_ == 0) {
    throw HostPoolError("capacity_bytes: expected room for at least one slot of " +
                        std::to_string(slot_bytes_) + " bytes; got " +
                        std::to_string(capacity_bytes));
  }
}

std::optional<std::size_t> HostPool::acquire() {
  if (free_.free_slots() == 0) return std::nullopt;
  std::vector<SlotRun> taken;
  free_.take(1, taken);
  return taken.front().start;
}

void HostPool::release(std::size_t slot) {
  check_slot(slot, "slot");
  free_.release(slot);
}

std::uint8_t* HostPool::slot_data(std::size_t slot) {
  check_slot(slot, "slot");
  return memory_.data() + slot * slot_bytes_;
}

const std::uint8_t* HostPool::slot_data(std::size_t slot) const {
  check_slot(slot, "slot");
  return memory_.data() + slot * slot_bytes_;
}

void HostPool::check_slot(std::size_t slot, const char* what) const {
  if (slot >= num_slots_) {
    throw HostPoolError(std::string(what) + ": expected 0 <= slot < " + std::to_string(num_slots_) +
                        "; got " + std::to_string(slot));
  }
}

}  // namespace activekv::offload
