#include "offload/free_runs.h"

#include <iterator>

#include "offload/host_pool.h"

namespace activekv::offload {

FreeRuns::FreeRuns(std::size_t num_slots) : num_slots_(num_slots), free_slots_(num_slots) {
  if (num_slots == 0) return;
  by_start_.emplace(0, num_slots);
  by_length_.emplace(num_slots, 0);
}

std::size_t FreeRuns::longest_run() const {
  return by_length_.empty() ? 0 : by_length_.rbegin()->first;
}

bool FreeRuns::is_free(std::size_t slot) const {
  auto after = by_start_.upper_bound(slot);
  if (after == by_start_.begin()) return false;
  const auto run = std::prev(after);
  return slot < run->first + run->second;
}

void FreeRuns::take(std::size_t count, std::vector<SlotRun>& taken) {
  if (count > free_slots_) {
    throw HostPoolError("count: expected at most the " + std::to_string(free_slots_) +
                        " free slots; got " + std::to_string(count));
  }
  std::size_t remaining = count;
  while (remaining > 0) {
    // Best fit: the smallest run holding every remaining block, lowest start among equals.
    auto fit = by_length_.lower_bound({remaining, 0});
    if (fit == by_length_.end()) {
      // None holds them: the largest run, lowest start among equals, taken whole.
      fit = by_length_.lower_bound({by_length_.rbegin()->first, 0});
    }
    const auto [length, start] = *fit;
    const std::size_t used = length < remaining ? length : remaining;
    taken.push_back({start, used});
    const auto run = by_start_.find(start);
    if (used == length) {
      erase(run);
    } else {
      reshape(run, start + used, length - used);
    }
    free_slots_ -= used;
    remaining -= used;
  }
}

void FreeRuns::release(std::size_t slot) {
  if (slot >= num_slots_) {
    throw HostPoolError("slot: expected 0 <= slot < " + std::to_string(num_slots_) + "; got " +
                        std::to_string(slot));
  }
  if (is_free(slot)) {
    throw HostPoolError("slot: expected a taken slot; slot " + std::to_string(slot) +
                        " is already free");
  }
  // The run ending just before `slot` and the one starting just after it, if free.
  const auto after = by_start_.lower_bound(slot);  // starts after `slot` (it is not free)
  const bool joins_after = after != by_start_.end() && after->first == slot + 1;
  auto before = after == by_start_.begin() ? by_start_.end() : std::prev(after);
  const bool joins_before = before != by_start_.end() && before->first + before->second == slot;
  if (joins_before && joins_after) {
    const std::size_t length = before->second + 1 + after->second;
    erase(after);
    reshape(before, before->first, length);
  } else if (joins_before) {
    reshape(before, before->first, before->second + 1);
  } else if (joins_after) {
    reshape(after, slot, after->second + 1);
  } else {
    // A run of its own: the only case that allocates. Both nodes are made before either index
    // changes for good, so a bad_alloc leaves the runs as they were.
    const auto placed = by_start_.emplace(slot, 1).first;
    try {
      by_length_.emplace(1, slot);
    } catch (...) {
      by_start_.erase(placed);
      throw;
    }
  }
  ++free_slots_;
}

std::vector<SlotRun> FreeRuns::runs() const {
  std::vector<SlotRun> result;
  result.reserve(by_start_.size());
  for (const auto& [start, length] : by_start_) result.push_back({start, length});
  return result;
}

std::string FreeRuns::check() const {
  if (by_start_.size() != by_length_.size()) {
    return "free runs: " + std::to_string(by_start_.size()) + " by start but " +
           std::to_string(by_length_.size()) + " by length";
  }
  std::size_t total = 0;
  std::size_t end_of_previous = 0;
  bool first = true;
  for (const auto& [start, length] : by_start_) {
    const std::string run = "free run [" + std::to_string(start) + ", +" +
                            std::to_string(length) + ")";
    if (length == 0 || start + length > num_slots_) return run + " is empty or out of range";
    if (!first && start <= end_of_previous) {
      return run + (start == end_of_previous ? " touches the run before it (not coalesced)"
                                             : " overlaps the run before it");
    }
    if (by_length_.count({length, start}) == 0) return run + " is missing from the length index";
    end_of_previous = start + length;
    first = false;
    total += length;
  }
  if (total != free_slots_) {
    return "free runs hold " + std::to_string(total) + " slots; the count says " +
           std::to_string(free_slots_);
  }
  return "";
}

void FreeRuns::reshape(ByStart::iterator run, std::size_t new_start, std::size_t new_length) {
  auto length_node = by_length_.extract({run->second, run->first});
  length_node.value() = {new_length, new_start};
  by_length_.insert(std::move(length_node));
  if (run->first == new_start) {
    run->second = new_length;
    return;
  }
  auto start_node = by_start_.extract(run);
  start_node.key() = new_start;
  start_node.mapped() = new_length;
  by_start_.insert(std::move(start_node));
}

void FreeRuns::erase(ByStart::iterator run) {
  by_length_.erase({run->second, run->first});
  by_start_.erase(run);
}

}  // namespace activekv::offload
