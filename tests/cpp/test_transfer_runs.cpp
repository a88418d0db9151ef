// transfer_runs: a layer's transfer list as runs of consecutive host slots, in plan order, each
// saying whether its device blocks are consecutive too.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <cstddef>
#include <vector>

#include "offload/transfer_runs.h"

using activekv::offload::BlockTransfer;
using activekv::offload::count_runs;
using activekv::offload::RunCounts;
using activekv::offload::transfer_runs;
using activekv::offload::TransferRun;

using Runs = std::vector<TransferRun>;

TEST_CASE("an empty list has no runs") {
  CHECK(transfer_runs({}).empty());
  const RunCounts counts = count_runs({});
  CHECK(counts.runs == 0);
  CHECK(counts.device_consecutive == 0);
}

TEST_CASE("consecutive slots in plan order make one run") {
  // Host slots 4..7; device blocks 10..13: one pitched copy on both sides.
  const Runs direct = transfer_runs({{4, 10}, {5, 11}, {6, 12}, {7, 13}});
  CHECK(direct == Runs{{0, 4, 4, 10, true}});
  // The same slots with scattered device blocks: one host run, a scatter or gather on the device.
  const Runs scattered = transfer_runs({{4, 10}, {5, 3}, {6, 12}, {7, 13}});
  CHECK(scattered == Runs{{0, 4, 4, 10, false}});
}

TEST_CASE("a gap or a step back in slots starts a new run and plan order is kept") {
  const std::vector<BlockTransfer> list{{0, 5}, {1, 6}, {3, 7}, {2, 8}, {2, 9}, {9, 1}, {10, 0}};
  const Runs runs = transfer_runs(list);
  CHECK(runs == Runs{{0, 2, 0, 5, true},     // 0, 1
                     {2, 1, 3, 7, true},     // 3: a gap before it
                     {3, 1, 2, 8, true},     // 2: a step back, never merged with 0, 1 or 3
                     {4, 1, 2, 9, true},     // 2 again: a duplicate
                     {5, 2, 9, 1, false}});  // 9, 10 with device blocks going down
  // Read in order, the runs are the list itself.
  std::size_t next = 0;
  for (const TransferRun& run : runs) {
    CHECK(run.first == next);
    for (std::size_t i = 0; i < run.count; ++i) CHECK(list[run.first + i].slot == run.slot + i);
    next += run.count;
  }
  CHECK(next == list.size());
  const RunCounts counts = count_runs(runs);
  CHECK(counts.runs == 5);
  CHECK(counts.device_consecutive == 4);
}

TEST_CASE("a descending list is all runs of one") {
  const Runs runs = transfer_runs({{3, 0}, {2, 1}, {1, 2}, {0, 3}});
  CHECK(runs.size() == 4);
  for (const TransferRun& run : runs) CHECK(run.count == 1);
}

TEST_CASE("the output vector is reused") {
  std::vector<TransferRun> runs;
  transfer_runs({{0, 0}, {1, 1}, {5, 2}}, runs);
  CHECK(runs.size() == 2);
  const std::size_t capacity = runs.capacity();
  transfer_runs({{7, 7}}, runs);
  CHECK(runs == Runs{{0, 1, 7, 7, true}});
  CHECK(runs.capacity() == capacity);
}
