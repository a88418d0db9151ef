#include "offload/staging.h"

#include <string>

namespace activekv::offload {

namespace {

std::string lease_text(const Lease& lease) {
  return "lease {region " + std::to_string(lease.region) + ", generation " +
         std::to_string(lease.generation) + "}";
}

std::size_t positive(std::size_t value, const char* what) {
  if (value == 0) throw StagingInputError(std::string(what) + ": expected a positive value; got 0");
  return value;
}

std::size_t region_count(std::size_t value) {
  if (positive(value, "num_regions") > kMaxRegions) {
    throw StagingInputError("num_regions: expected at most " + std::to_string(kMaxRegions) +
                            "; got " + std::to_string(value));
  }
  return value;
}

}  // namespace

const char* direction_name(Direction direction) {
  switch (direction) {
    case Direction::load:
      return "load";
    case Direction::store:
      return "store";
  }
  return "unknown";
}

const char* region_state_name(RegionState state) {
  switch (state) {
    case RegionState::free:
      return "free";
    case RegionState::prepared:
      return "prepared";
    case RegionState::bound:
      return "bound";
    case RegionState::in_flight:
      return "in_flight";
    case RegionState::quarantined:
      return "quarantined";
  }
  return "unknown";
}

StagingPool::StagingPool(std::size_t num_regions, std::size_t region_blocks)
    : region_blocks_(positive(region_blocks, "region_blocks")),
      regions_(region_count(num_regions)) {}

Prepared StagingPool::prepare(std::uint32_t layer, Direction direction) {
  if (all_quarantined()) return {PrepareStatus::all_quarantined, {}};
  for (std::size_t index = 0; index < regions_.size(); ++index) {
    Region& region = regions_[index];
    if (region.state != RegionState::free) continue;
    region.state = RegionState::prepared;
    region.layer = layer;
    region.direction = direction;
    return {PrepareStatus::ok, {index, region.generation}};
  }
  return {PrepareStatus::no_region, {}};
}

void StagingPool::bind(const Lease& lease, const std::vector<BlockTransfer>& transfers) {
  Region& region = leased(lease, RegionState::prepared, "bind");
  if (transfers.size() > region_blocks_) {
    throw StagingInputError("transfers: expected at most region_blocks = " +
                            std::to_string(region_blocks_) + " entries; got " +
                            std::to_string(transfers.size()));
  }
  // assign, not a move: the region keeps its capacity, so steady steps allocate nothing here.
  region.transfers.assign(transfers.begin(), transfers.end());
  region.state = RegionState::bound;
}

void StagingPool::transfer(const Lease& lease, FenceOutcome fence, const RegionCopies& copies) {
  Region& region = leased(lease, RegionState::bound, "transfer");
  copies(region.transfers);
  region.fence = fence;
  region.state = RegionState::in_flight;
}

CompleteStatus StagingPool::complete(const Lease& lease, const RegionCopies& on_signalled,
                                     FenceOutcome observed) {
  Region& region = leased(lease, RegionState::in_flight, "complete");
  if (region.fence == FenceOutcome::unknown || observed == FenceOutcome::unknown) {
    // Whatever the copies did or still do, the region can never be trusted again.
    region.state = RegionState::quarantined;
    region.transfers.clear();
    ++quarantined_;
    return CompleteStatus::lost;
  }
  on_signalled(region.transfers);
  region.transfers.clear();
  region.state = RegionState::free;
  ++region.generation;
  return CompleteStatus::ok;
}

RegionState StagingPool::state(std::size_t region) const { return region_or_throw(region).state; }

FenceOutcome StagingPool::armed_fence(std::size_t region) const {
  return region_or_throw(region).fence;
}

std::uint64_t StagingPool::generation(std::size_t region) const {
  return region_or_throw(region).generation;
}

const std::vector<BlockTransfer>& StagingPool::transfers(std::size_t region) const {
  return region_or_throw(region).transfers;
}

StagingPool::Region& StagingPool::leased(const Lease& lease, RegionState needed, const char* call) {
  if (lease.region >= regions_.size()) {
    throw StaleLeaseError(std::string(call) + ": stale " + lease_text(lease) + ": there are " +
                          std::to_string(regions_.size()) + " regions");
  }
  Region& region = regions_[lease.region];
  if (region.generation != lease.generation) {
    throw StaleLeaseError(std::string(call) + ": stale " + lease_text(lease) +
                          ": the region is at generation " + std::to_string(region.generation));
  }
  if (region.state != needed) {
    throw StaleLeaseError(std::string(call) + ": stale " + lease_text(lease) + ": the region is " +
                          region_state_name(region.state) + ", not " + region_state_name(needed));
  }
  return region;
}

const StagingPool::Region& StagingPool::region_or_throw(std::size_t region) const {
  if (region >= regions_.size()) {
    throw StagingInputError("region: expected 0 <= region < " + std::to_string(regions_.size()) +
                            "; got " + std::to_string(region));
  }
  return regions_[region];
}

}  // namespace activekv::offload
