// One layer's transfer list merged into runs of consecutive host slots (SPEC.md §4, "Runs"), for a
// route that moves a run as one copy: the host side as one contiguous range, the device side by a
// scatter or gather kernel, or as one pitched copy where the device blocks are consecutive too.
//
// Plan order is kept: a run is a maximal stretch of *adjacent* entries of the list whose slots go
// up by one from entry to entry; nothing is sorted or merged across the list, so the runs, read
// in order, are the list itself (a list in descending slot order is all runs of one). The
// allocator (SPEC.md §2) places a step's stores in plan order along its runs, so a store list's
// runs are the runs it was given, and a chain stored in one step loads back as one run when it is
// loaded in the same order.
#pragma once

#include <cstddef>
#include <vector>

#include "offload/staging.h"

namespace activekv::offload {

struct TransferRun {
  std::size_t first;         // index in the list of the run's first entry
  std::size_t count;         // entries in the run (>= 1)
  std::size_t slot;          // host slot of the first entry: the run is slot .. slot + count - 1
  std::size_t device_block;  // device block of the first entry
  // The device blocks are device_block .. device_block + count - 1 as well (a run of one is).
  bool device_consecutive;

  bool operator==(const TransferRun& other) const {
    return first == other.first && count == other.count && slot == other.slot &&
           device_block == other.device_block && device_consecutive == other.device_consecutive;
  }
  bool operator!=(const TransferRun& other) const { return !(*this == other); }
};

// The runs of `transfers`, in list order, replacing what `runs` held (its capacity is reused, so a
// steady caller allocates nothing).
void transfer_runs(const std::vector<BlockTransfer>& transfers, std::vector<TransferRun>& runs);
std::vector<TransferRun> transfer_runs(const std::vector<BlockTransfer>& transfers);

// Counts over a list's runs: how many, and how many of them have consecutive device blocks too.
struct RunCounts {
  std::size_t runs = 0;
  std::size_t device_consecutive = 0;
};
RunCounts count_runs(const std::vector<TransferRun>& runs);

}  // namespace activekv::offload
