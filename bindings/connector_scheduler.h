// The connector's scheduler half: it holds no pool, reads the block index every worker publishes
// (in this process or another), offers hits to vLLM's scheduler and plans each step's loads and
// stores (connector_plan.h).
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "bindings/connector_config.h"
#include "bindings/connector_plan.h"
#include "offload/shared_index.h"

namespace activekv::bindings::connector {

namespace nb = nanobind;

// What the scheduler half remembers of one request between hooks.
struct TrackedRequest {
  nb::object request;                   // vLLM's Request: its block_hashes grow with its tokens
  std::vector<std::uint64_t> keys;      // engine keys of the block hashes seen so far
  std::vector<std::int64_t> block_ids;  // KV cache group 0, as the scheduler allocated them
  std::int64_t num_computed_tokens = 0;
  std::size_t local_blocks = 0;   // block-aligned local prefix-cache hit at lookup
  std::size_t hit_blocks = 0;     // leading blocks committed in the host pool at lookup
  std::size_t load_blocks = 0;    // blocks this connector offered to load
  std::size_t stored_blocks = 0;  // leading blocks known to be in the pool or planned to be
};

class SchedulerHalf {
 public:
  // Refuses, before opening the index, what no worker could start its engine with.
  explicit SchedulerHalf(const Settings& settings)
      : settings_(checked(settings)), index_(settings.engine_id, settings.world_size) {}

  const Settings& settings() const { return settings_; }

  std::pair<std::int64_t, bool> get_num_new_matched_tokens(nb::handle request,
                                                           std::int64_t num_computed_tokens) {
    const std::size_t block_size = settings_.layout.block_size();
    const std::string id = request_id(request);
    const auto known = requests_.find(id);
    std::vector<std::uint64_t> keys =
        known == requests_.end() ? std::vector<std::uint64_t>{} : known->second.keys;
    extend_keys(keys, request);
    // vLLM must compute at least the last prompt token itself, so never offer the whole prompt.
    const std::int64_t num_tokens = int_attr(request, "num_tokens", "request");
    const std::size_t offerable =
        num_tokens > 0 ? static_cast<std::size_t>(num_tokens - 1) / block_size : 0;
    const std::vector<std::uint64_t> offered(
        keys.begin(), keys.begin() + static_cast<std::ptrdiff_t>(std::min(keys.size(), offerable)));
    std::size_t hits = 0;
    {
      nb::gil_scoped_release release;
      hits = index_.lookup(offered);
    }
    TrackedRequest& tracked = requests_[id];
    tracked.keys = std::move(keys);
    offered_loads_ -= tracked.load_blocks;  // a request asked again (vLLM retries) counts once
    tracked.request = nb::borrow(request);
    tracked.local_blocks = static_cast<std::size_t>(num_computed_tokens) / block_size;
    tracked.hit_blocks = hits;
    // A step may load at most region_blocks blocks (the engine's staging limit).
    const std::size_t planned = planned_loads();
    const std::size_t room = planned < settings_.region_blocks ? settings_.region_blocks - planned : 0;
    tracked.load_blocks =
        hits > tracked.local_blocks ? std::min(hits - tracked.local_blocks, room) : 0;
    offered_loads_ += tracked.load_blocks;
    return {static_cast<std::int64_t>(tracked.load_blocks * block_size), false};
  }

  void update_state_after_alloc(nb::handle request, nb::handle blocks,
                                std::int64_t num_external_tokens) {
    auto found = requests_.find(request_id(request));
    if (found == requests_.end()) return;  // never looked up: nothing was offered
    TrackedRequest& tracked = found->second;
    const std::size_t block_size = settings_.layout.block_size();
    const std::size_t load_blocks =
        std::min(static_cast<std::size_t>(std::max<std::int64_t>(num_external_tokens, 0)) /
                     block_size,
                 tracked.load_blocks);
    offered_loads_ -= tracked.load_blocks;
    tracked.load_blocks = 0;
    // Below this the blocks are in the pool already (or about to be loaded from it).
    tracked.stored_blocks = std::max(
        tracked.stored_blocks, load_blocks > 0 ? tracked.local_blocks + load_blocks
                                               : std::min(tracked.hit_blocks, tracked.local_blocks));
    if (load_blocks == 0) return;
    const std::vector<std::uint64_t>& keys = extend_keys(tracked.keys, request);
    const std::vector<std::int64_t> block_ids =
        group0_block_ids(blocks.attr("get_block_ids")(), "blocks.get_block_ids()");
    const std::size_t end = tracked.local_blocks + load_blocks;
    if (end > keys.size() || end > block_ids.size()) {
      throw ConnectorConfigError("update_state_after_alloc: expected " + std::to_string(end) +
                                 " block hashes and block ids; got " +
                                 std::to_string(keys.size()) + " and " +
                                 std::to_string(block_ids.size()));
    }
    for (std::size_t i = tracked.local_blocks; i < end; ++i) {
      plan_.loads.emplace_back(keys[i], block_ids[i]);
    }
  }

  nb::object build_connector_meta(nb::handle scheduler_output) {
    for (nb::handle new_request : scheduler_output.attr("scheduled_new_reqs")) {
      auto found = requests_.find(nb::cast<std::string>(new_request.attr("req_id")));
      if (found == requests_.end()) continue;
      found->second.block_ids =
          group0_block_ids(new_request.attr("block_ids"), "scheduled_new_reqs[].block_ids");
      found->second.num_computed_tokens =
          int_attr(new_request, "num_computed_tokens", "scheduled_new_reqs[]");
    }
    nb::object cached = scheduler_output.attr("scheduled_cached_reqs");
    nb::object resumed = nb::getattr(cached, "resumed_req_ids", nb::none());
    std::size_t index = 0;
    nb::object new_block_ids = cached.attr("new_block_ids");
    nb::object computed = cached.attr("num_computed_tokens");
    for (nb::handle id : cached.attr("req_ids")) {
      const std::size_t i = index++;
      auto found = requests_.find(nb::cast<std::string>(id));
      if (found == requests_.end()) continue;
      TrackedRequest& tracked = found->second;
      nb::object groups = new_block_ids[i];
      if (!groups.is_none()) {
        std::vector<std::int64_t> ids =
            group0_block_ids(groups, "scheduled_cached_reqs.new_block_ids[]");
        const bool replaces = !resumed.is_none() && nb::cast<bool>(resumed.attr("__contains__")(id));
        if (replaces) tracked.block_ids.clear();
        tracked.block_ids.insert(tracked.block_ids.end(), ids.begin(), ids.end());
      }
      tracked.num_computed_tokens = nb::cast<std::int64_t>(computed[i]);
    }
    plan_stores(scheduler_output.attr("num_scheduled_tokens"));
    for (nb::handle id : scheduler_output.attr("finished_req_ids")) {
      requests_.erase(nb::cast<std::string>(id));
    }
    // Offers not taken up by an allocation this step lapse; a request still waiting is asked again.
    for (auto& entry : requests_) entry.second.load_blocks = 0;
    offered_loads_ = 0;
    StepPlan plan = std::move(plan_);
    plan_ = StepPlan{};
    return plan_metadata(std::move(plan));
  }

  // The requests it tracks and the workers alive (tests).
  nb::dict state() {
    nb::dict result;
    result["requests"] = requests_.size();
    result["live_ranks"] = index_.live_ranks();
    return result;
  }

 private:
  static const Settings& checked(const Settings& settings) {
    check_engine_arguments(settings);
    return settings;
  }

  static std::string request_id(nb::handle request) {
    return nb::cast<std::string>(request.attr("request_id"));
  }

  std::size_t planned_loads() const { return plan_.loads.size() + offered_loads_; }

  // Stores of every block that becomes full in this step and is not yet in the pool, at most
  // region_blocks per step (the rest waits for a later step).
  void plan_stores(nb::handle num_scheduled_tokens) {
    const std::size_t block_size = settings_.layout.block_size();
    for (auto [id, count] : nb::cast<nb::dict>(num_scheduled_tokens)) {
      auto found = requests_.find(nb::cast<std::string>(id));
      if (found == requests_.end()) continue;
      TrackedRequest& tracked = found->second;
      const std::vector<std::uint64_t>& keys = extend_keys(tracked.keys, tracked.request);
      const std::size_t computed =
          static_cast<std::size_t>(tracked.num_computed_tokens + nb::cast<std::int64_t>(count));
      const std::size_t full =
          std::min({computed / block_size, keys.size(), tracked.block_ids.size()});
      while (tracked.stored_blocks < full && plan_.stores.size() < settings_.region_blocks) {
        plan_.stores.emplace_back(keys[tracked.stored_blocks],
                                  tracked.block_ids[tracked.stored_blocks]);
        ++tracked.stored_blocks;
      }
    }
  }

  const Settings settings_;
  activekv::offload::SharedIndexReader index_;
  std::unordered_map<std::string, TrackedRequest> requests_;
  StepPlan plan_;
  std::size_t offered_loads_ = 0;  // offered by lookups this step, not yet allocated
};

}  // namespace activekv::bindings::connector
