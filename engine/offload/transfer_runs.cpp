#include "offload/transfer_runs.h"

namespace activekv::offload {

void transfer_runs(const std::vector<BlockTransfer>& transfers, std::vector<TransferRun>& runs) {
  runs.clear();
  for (std::size_t index = 0; index < transfers.size(); ++index) {
    const BlockTransfer& entry = transfers[index];
    if (!runs.empty()) {
      TransferRun& run = runs.back();
      // Compared by addition on the run's first entry, so no subtraction can wrap.
      if (entry.slot == run.slot + run.count) {
        run.device_consecutive =
            run.device_consecutive && entry.device_block == run.device_block + run.count;
        ++run.count;
        continue;
      }
    }
    runs.push_back({index, 1, entry.slot, entry.device_block, true});
  }
}

std::vector<TransferRun> transfer_runs(const std::vector<BlockTransfer>& transfers) {
  std::vector<TransferRun> runs;
  transfer_runs(transfers, runs);
  return runs;
}

RunCounts count_runs(const std::vector<TransferRun>& runs) {
  RunCounts counts;
  counts.runs = runs.size();
  for (const TransferRun& run : runs) counts.device_consecutive += run.device_consecutive ? 1 : 0;
  return counts;
}

}  // namespace activekv::offload
