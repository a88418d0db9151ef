#include "offload/staging.h"

#include <limits>
#include <string>
#include <utility>

namespace activekv::offload {

namespace {

constexpr std::size_t kSizeMax = std::numeric_limits<std::size_t>::max();

std::string lease_text(const Lease& lease) {
  return "lease {region " + std::to_string(lease.region) + ", generation " +
         std::to_string(lease.generation) + "}";
}

void require_positive(std::size_t value, const char* what) {
  if (value == 0) throw StagingInputError(std::string(what) + ": expected a positive value; got 0");
}

// Bytes from one region's start to the next: its bytes rounded up to pages. Checks every size.
std::size_t region_stride(std::size_t num_regions, std::size_t region_blocks,
                          std::size_t block_bytes) {
  require_positive(num_regions, "num_regions");
  require_positive(region_blocks, "region_blocks");
  require_positive(block_bytes, "block_bytes");
  if (region_blocks > kSizeMax / block_bytes) {
    throw StagingInputError("region_blocks: " + std::to_string(region_blocks) + " blocks of " +
                            std::to_string(block_bytes) + " bytes do not fit in memory");
  }
  const std::size_t stride = round_up_to_pages(region_blocks * block_bytes, "region_blocks");
  if (num_regions > kSizeMax / stride) {
    throw StagingInputError("num_regions: " + std::to_string(num_regions) + " regions of " +
                            std::to_string(stride) + " bytes do not fit in memory");
  }
  return stride;
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

StagingPool::StagingPool(std::size_t num_regions, std::size_t region_blocks,
                         std::size_t block_bytes)
    : region_blocks_(region_blocks),
      block_bytes_(block_bytes),
      region_stride_(region_stride(num_regions, region_blocks, block_bytes)),
      region_bytes_(region_blocks * block_bytes),
      regions_(num_regions),
      memory_(region_stride_ * num_regions, "num_regions") {}

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

void StagingPool::bind(const Lease& lease, std::vector<BlockTransfer> transfers) {
  Region& region = leased(lease, RegionState::prepared, "bind");
  if (transfers.size() > region_blocks_) {
    throw StagingInputError("transfers: expected at most region_blocks = " +
                            std::to_string(region_blocks_) + " entries; got " +
                            std::to_string(transfers.size()));
  }
  region.transfers = std::move(transfers);
  region.state = RegionState::bound;
}

void StagingPool::transfer(const Lease& lease, FenceOutcome fence, const RegionCopies& copies) {
  Region& region = leased(lease, RegionState::bound, "transfer");
  copies(memory_.data() + lease.region * region_stride_, region.transfers);
  region.fence = fence;
  region.state = RegionState::in_flight;
}

CompleteStatus StagingPool::complete(const Lease& lease, const RegionCopies& on_signalled) {
  Region& region = leased(lease, RegionState::in_flight, "complete");
  if (region.fence == FenceOutcome::unknown) {
    // Whatever the copies did or still do, the region can never be trusted again.
    region.state = RegionState::quarantined;
    region.transfers.clear();
    ++quarantined_;
    return CompleteStatus::lost;
  }
  on_signalled(memory_.data() + lease.region * region_stride_, region.transfers);
  region.transfers.clear();
  region.state = RegionState::free;
  ++region.generation;
  return CompleteStatus::ok;
}

RegionState StagingPool::state(std::size_t region) const { return region_or_throw(region).state; }

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
