// The connector's worker half: its rank's engine (shared per engine_id, connector_engine.h) on the
// KV caches vLLM registers, running each step's plan (connector_plan.h) layer by layer through
// vLLM's forward hooks, and publishing what its pool gained and lost to the scheduler's index.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "bindings/connector_config.h"
#include "bindings/connector_engine.h"
#include "bindings/connector_plan.h"
#include "bindings/kv_views.h"
#include "offload/engine.h"

namespace activekv::bindings::connector {

namespace nb = nanobind;

class WorkerHalf {
 public:
  explicit WorkerHalf(const Settings& settings)
      : settings_(settings), worker_(shared_engine(settings)), engine_(worker_->engine) {}

  const Settings& settings() const { return settings_; }
  const std::map<std::string, std::uint64_t>& event_counts() const { return event_counts_; }

  void register_kv_caches(nb::handle kv_caches) {
    if (!nb::isinstance<nb::dict>(kv_caches)) {
      throw ConnectorConfigError("kv_caches: expected a dict of layer name to tensor; got " +
                                 type_of(kv_caches));
    }
    const nb::dict caches = nb::borrow<nb::dict>(kv_caches);
    std::vector<nb::ndarray<>> arrays;
    std::vector<activekv::offload::DeviceKvLayer> views;
    for (const std::string& name : settings_.layer_names) {
      if (!caches.contains(name.c_str())) {
        throw ConnectorConfigError("kv_caches: expected a tensor for layer " + name +
                                   " (kv_cache_config's layer_names); got none");
      }
      const auto [array, strides] =
          kv_layer_view(caches[name.c_str()], "kv_caches[\"" + name + "\"]", engine_);
      arrays.push_back(array);
      views.push_back({array.data(), settings_.num_device_blocks, strides});
    }
    // GIL held: the engine's views and the arrays keeping their memory alive change together.
    engine_.register_kv_caches(views);
    worker_->kv_arrays = std::move(arrays);
    layer_index_.clear();
    for (std::size_t i = 0; i < settings_.layer_names.size(); ++i) {
      layer_index_[settings_.layer_names[i]] = static_cast<std::int64_t>(i);
    }
  }

  void start_load_kv(nb::handle connector) { begin_step(connector, "start_load_kv"); }

  void wait_for_layer_load(nb::handle connector, const std::string& layer_name) {
    begin_step(connector, "wait_for_layer_load");
    const std::int64_t layer = layer_of(layer_name);
    std::vector<std::size_t> lost;
    {
      nb::gil_scoped_release release;
      lost = engine_.wait_for_layer_load(layer);
    }
    for (std::size_t block : lost) load_errors_.insert(static_cast<std::int64_t>(block));
  }

  void save_kv_layer(nb::handle connector, const std::string& layer_name) {
    begin_step(connector, "save_kv_layer");
    const std::int64_t layer = layer_of(layer_name);
    void* const compute_stream = current_compute_stream();
    nb::gil_scoped_release release;
    engine_.save_kv_layer(layer, compute_stream);
  }

  void wait_for_save(nb::handle connector) {
    begin_step(connector, "wait_for_save");  // a step without a forward has had no hook yet
    {
      nb::gil_scoped_release release;
      engine_.wait_for_save();
    }
    step_running_ = false;
    drain_events();
  }

  std::set<std::int64_t> get_block_ids_with_load_errors() {
    std::set<std::int64_t> errors;
    errors.swap(load_errors_);
    return errors;
  }

  // Its pool's pinned, storing, committed and free blocks, the blocks it published, quarantined
  // regions, a step in progress (tests).
  nb::dict state() const {
    const activekv::offload::BlockStore& store = engine_.store();
    nb::dict result;
    result["published_blocks"] = worker_->index.size();
    result["step_running"] = step_running_;
    result["pinned_blocks"] = store.pinned_blocks();
    result["storing_blocks"] = store.storing_blocks();
    result["committed_blocks"] = store.committed_blocks();
    result["free_slots"] = store.free_slots();
    result["quarantined_regions"] = engine_.quarantined_regions();
    result["invariants"] = store.check_invariants();
    return result;
  }

  // Tests and traces only: the next lease of this direction and layer has a fence of unknown
  // outcome (Engine.inject_fence_fault).
  void inject_fence_fault(const std::string& direction, std::int64_t layer) {
    const auto parsed = activekv::offload::parse_direction(direction);
    nb::gil_scoped_release release;
    engine_.inject_fence_fault(parsed, layer);
  }

 private:
  // CUDA route: the stream the forward runs on, PyTorch's current stream (vLLM runs the model on
  // it), so that a layer's store starts once the forward has written the layer. CPU route: none.
  void* current_compute_stream() {
    if (settings_.route != Route::cuda) return nullptr;
    if (!current_stream_.is_valid()) {
      current_stream_ = nb::module_::import_("torch").attr("cuda").attr("current_stream");
    }
    return reinterpret_cast<void*>(
        nb::cast<std::uintptr_t>(current_stream_().attr("cuda_stream")));
  }

  std::int64_t layer_of(const std::string& layer_name) const {
    auto found = layer_index_.find(layer_name);
    if (found == layer_index_.end()) {
      throw ConnectorConfigError("layer_name: expected a layer registered by register_kv_caches; "
                                 "got " + layer_name);
    }
    return found->second;
  }

  // The first hook of a step gives the engine the step's plan. vLLM calls start_load_kv before
  // the forward only when a step has synchronous loads; otherwise the layer hooks come first.
  void begin_step(nb::handle connector, const char* hook) {
    if (step_running_) return;
    // Before anything is planned: a hook refused here leaves the engine as it was, so the step
    // can start once the caches are registered.
    if (worker_->kv_arrays.empty()) {
      throw activekv::offload::EngineStateError(
          std::string(hook) + ": called out of order; expected register_kv_caches first");
    }
    const nb::object metadata = connector.attr("_get_connector_metadata")();
    const StepPlan& plan = metadata_plan(metadata);
    std::vector<std::uint64_t> load_keys, store_keys;
    std::vector<std::int64_t> load_blocks, store_blocks;
    for (const auto& [key, block] : plan.loads) {
      load_keys.push_back(key);
      load_blocks.push_back(block);
    }
    for (const auto& [key, block] : plan.stores) {
      store_keys.push_back(key);
      store_blocks.push_back(block);
    }
    std::vector<std::size_t> missed;
    {
      nb::gil_scoped_release release;
      // One call: a step refused for a bad store plans none of its loads either.
      engine_.plan_step(load_keys, load_blocks, store_keys, store_blocks);
      // A block the scheduler half saw committed may be gone by now (evicted by a store that
      // ran between its lookup and this step): vLLM counted those tokens as loaded, so they
      // are reported as failed loads and recomputed, never left as whatever the block held.
      missed = engine_.build_step();
      engine_.start_load();
    }
    for (std::size_t block : missed) load_errors_.insert(static_cast<std::int64_t>(block));
    step_running_ = true;
  }

  // The engine keeps an event log until it is taken; the half keeps counts per kind and
  // publishes what the pool gained and lost to the scheduler's block index.
  void drain_events() {
    const std::vector<activekv::offload::Event> events = engine_.take_events();
    for (const auto& event : events) {
      ++event_counts_[activekv::offload::event_kind_name(event.kind)];
    }
    worker_->index.publish(events);
  }

  const Settings settings_;
  // The engine and the KV caches it views, shared by the worker halves of its engine_id.
  const std::shared_ptr<WorkerEngine> worker_;
  activekv::offload::Engine& engine_;  // worker_'s
  nb::object current_stream_;  // torch.cuda.current_stream (CUDA route), looked up once
  std::unordered_map<std::string, std::int64_t> layer_index_;
  bool step_running_ = false;
  std::set<std::int64_t> load_errors_;
  std::map<std::string, std::uint64_t> event_counts_;
};

}  // namespace activekv::bindings::connector
