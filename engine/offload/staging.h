// Staging regions and leases (SPEC.md §4). A region carries one layer's transfer of up to
// region_blocks blocks behind one fence; a lease {region, generation} names one use of it. A
// region owns no bytes: the copies go straight between host slots and device blocks (the CUDA
// route's kernels read and write the pinned pool in place), so what a region guards is the fence. Each region moves
// free -> prepared -> bound -> in_flight -> free (generation + 1) when its fence is signalled, or
// -> quarantined for good when the fence's outcome is unknown. A lease that does not match its
// region's generation and state is stale: StaleLeaseError, and nothing changes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <stdexcept>
#include <vector>

namespace activekv::offload {

enum class Direction : std::uint8_t { load, store };
const char* direction_name(Direction direction);

enum class RegionState : std::uint8_t { free, prepared, bound, in_flight, quarantined };
const char* region_state_name(RegionState state);

struct Lease {
  std::size_t region;
  std::uint64_t generation;
};

// A lease used with the wrong generation, or on a region not in the state the call needs.
class StaleLeaseError : public std::logic_error {
 public:
  using std::logic_error::logic_error;
};

// A staging pool that cannot exist (no region, empty regions, sizes past the address space) or a
// transfer list longer than a region holds; the message names the argument.
class StagingInputError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

// The most regions a pool may have (SPEC.md §7): regions are bookkeeping only, but a count past
// any sane pool is a mistake, not a request.
inline constexpr std::size_t kMaxRegions = std::size_t{1} << 20;

enum class PrepareStatus : std::uint8_t {
  ok,
  no_region,        // every region is in use (some are not quarantined)
  all_quarantined,  // every region is quarantined: the engine is fatal
};

struct Prepared {
  PrepareStatus status;
  Lease lease;  // meaningful only when status == ok
};

// One block of a region's transfer: its host pool slot and its device block index.
struct BlockTransfer {
  std::size_t slot;
  std::size_t device_block;
};

enum class FenceOutcome : std::uint8_t { signalled, unknown };
enum class CompleteStatus : std::uint8_t { ok, lost };

// Copies over a region's bound transfer list.
using RegionCopies = std::function<void(const std::vector<BlockTransfer>& transfers)>;

// Not thread-safe: the engine drives it under its own mutex.
class StagingPool {
 public:
  StagingPool(std::size_t num_regions, std::size_t region_blocks);

  std::size_t num_regions() const { return regions_.size(); }
  std::size_t region_blocks() const { return region_blocks_; }
  std::size_t quarantined_regions() const { return quarantined_; }
  bool all_quarantined() const { return quarantined_ == regions_.size(); }

  // The lowest-numbered free region, now prepared for `layer` in `direction`.
  Prepared prepare(std::uint32_t layer, Direction direction);
  // prepared -> bound with this transfer list (at most region_blocks entries, else
  // StagingInputError and nothing changes).
  void bind(const Lease& lease, const std::vector<BlockTransfer>& transfers);
  // bound -> in_flight: runs `copies` now (the CPU route's copies are synchronous; the CUDA
  // route's enqueue) and arms the fence with `fence`.
  void transfer(const Lease& lease, FenceOutcome fence, const RegionCopies& copies);
  // in_flight -> free (generation + 1) after running `on_signalled`, when the fence was
  // signalled; in_flight -> quarantined, for good, when its outcome is unknown: armed so at
  // transfer, or `observed` so by whoever waited for it (the CUDA route's event query).
  CompleteStatus complete(const Lease& lease, const RegionCopies& on_signalled,
                          FenceOutcome observed = FenceOutcome::signalled);

  // Introspection (tests and diagnostics); StagingInputError for a region out of range.
  RegionState state(std::size_t region) const;
  std::uint64_t generation(std::size_t region) const;
  const std::vector<BlockTransfer>& transfers(std::size_t region) const;
  // The outcome armed at transfer (meaningful while in flight).
  FenceOutcome armed_fence(std::size_t region) const;

 private:
  struct Region {
    RegionState state = RegionState::free;
    std::uint64_t generation = 0;
    std::uint32_t layer = 0;
    Direction direction = Direction::load;
    FenceOutcome fence = FenceOutcome::signalled;
    std::vector<BlockTransfer> transfers;
  };

  // The lease's region when it holds `needed` at the lease's generation; StaleLeaseError naming
  // `call` otherwise.
  Region& leased(const Lease& lease, RegionState needed, const char* call);
  const Region& region_or_throw(std::size_t region) const;

  std::size_t region_blocks_;
  std::vector<Region> regions_;
  std::size_t quarantined_ = 0;
};

}  // namespace activekv::offload
