// activekv._vllm: the native core of ActiveKV's vLLM connector, and the vLLM plugin entry point.
//
// vLLM needs its connector to be a Python subclass of KVConnectorBase_V1 (a nanobind class cannot
// be one: no inspect.signature, and a metaclass conflict), so shims/activekv/vllm_connector.py is
// that subclass: it holds one ConnectorCore and forwards every hook to it in one call. All the
// work is here: vLLM's objects are read duck-typed and the C++ Engine does the rest.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <new>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include <nanobind/stl/map.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/set.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include "bindings/build_facts.h"  // the SBOM facts every module carries
#include "bindings/errors.h"
#include "bindings/connector_config.h"
#include "bindings/connector_engine.h"
#include "bindings/kv_views.h"
#include "bindings/vllm_release.h"
#include "offload/compression.h"
#include "offload/engine.h"
#include "offload/kv_layout.h"
#include "offload/shared_index.h"

namespace nb = nanobind;
using activekv::offload::CompressionMode;
using activekv::offload::DeviceKvLayer;
using activekv::offload::Engine;
using activekv::offload::KvBlockLayout;
using activekv::offload::KvDtype;
using activekv::offload::Route;
using activekv::offload::SharedIndexError;
using activekv::offload::SharedIndexReader;
using activekv::offload::SharedIndexWriter;

using activekv::bindings::kv_layer_view;

namespace {

// The connector's settings and shared engine (connector_config.h, connector_engine.h).
using namespace activekv::bindings::connector;  // NOLINT(google-build-using-namespace)

// The name vLLM's KVTransferConfig.kv_connector uses, and where the factory finds the shim.
constexpr const char* kConnectorName = "ActiveKVConnector";
constexpr const char* kShimModule = "activekv.vllm_connector";
constexpr const char* kShimClass = "ActiveKVConnector";
constexpr const char* kMetadataClass = "ActiveKVMetadata";
constexpr const char* kFactoryModule = "vllm.distributed.kv_transfer.kv_connector.factory";
constexpr const char* kRoleModule = "vllm.distributed.kv_transfer.kv_connector.v1.base";

// (block hash key, device block) of one planned transfer.
using BlockRef = std::pair<std::uint64_t, std::int64_t>;

// The plan of one step, sent by the scheduler half to the workers as vLLM's connector metadata.
// It pickles as two lists, so vLLM may ship it to worker processes.
struct StepPlan {
  std::vector<BlockRef> loads;
  std::vector<BlockRef> stores;
};

// What the scheduler half remembers of one request between hooks.
struct TrackedRequest {
  nb::object request;                  // vLLM's Request: its block_hashes grow with its tokens
  std::vector<std::uint64_t> keys;      // engine keys of the block hashes seen so far
  std::vector<std::int64_t> block_ids;  // KV cache group 0, as the scheduler allocated them
  std::int64_t num_computed_tokens = 0;
  std::size_t local_blocks = 0;   // block-aligned local prefix-cache hit at lookup
  std::size_t hit_blocks = 0;     // leading blocks committed in the host pool at lookup
  std::size_t load_blocks = 0;    // blocks this connector offered to load
  std::size_t stored_blocks = 0;  // leading blocks known to be in the pool or planned to be
};

// vLLM's KVConnectorRole, or None where vLLM is not installed (the core's tests build it from
// duck-typed vLLM objects). Inside vLLM the module is imported already: this is a dict lookup.
nb::object vllm_role_type() {
  nb::object spec = nb::module_::import_("importlib.util").attr("find_spec")("vllm");
  if (spec.is_none()) return nb::none();
  require_supported_vllm();  // a connector made without the plugin (kv_connector_module_path)
  return nb::module_::import_(kRoleModule).attr("KVConnectorRole");
}

// The name of `role`, vLLM's KVConnectorRole.SCHEDULER or .WORKER; ConnectorConfigError naming
// `role` for anything else (the string "scheduler", an int, None), which would otherwise have
// been taken for a worker. Without vLLM, an object whose `name` is one of the two stands in.
std::string role_name(nb::handle role) {
  const nb::object type = vllm_role_type();
  int of_type = 1;
  if (!type.is_none() && (of_type = PyObject_IsInstance(role.ptr(), type.ptr())) < 0) {
    throw nb::python_error();
  }
  std::string text;
  const bool member =
      of_type == 1 &&
      nb::try_cast<std::string>(nb::getattr(role, "name", nb::none()), text, false) &&
      (text == "SCHEDULER" || text == "WORKER");
  if (!member) {
    throw ConnectorConfigError(
        "role: expected vLLM's KVConnectorRole.SCHEDULER or KVConnectorRole.WORKER; got " +
        std::string(nb::repr(role).c_str()) + " (" + type_of(role) + ")");
  }
  return text;
}

class ConnectorCore {
 public:
  // The scheduler half holds no pool: it reads the block index every worker publishes (in this
  // process or another). The worker half holds its rank's engine.
  ConnectorCore(nb::handle vllm_config, nb::handle role, nb::handle kv_cache_config)
      : role_(role_name(role)), settings_(read_settings(vllm_config, kv_cache_config)) {
    if (role_ == "SCHEDULER") {
      check_engine_arguments(settings_);
      index_.emplace(settings_.engine_id, settings_.world_size);
    } else {
      worker_ = shared_engine(settings_);
      engine_ = &worker_->engine;
    }
  }

  const std::string& role() const { return role_; }
  std::size_t num_layers() const { return settings_.layer_names.size(); }
  const std::map<std::string, std::uint64_t>& event_counts() const { return event_counts_; }

  // ---- scheduler half ----

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
      SharedIndexReader& index = scheduler_index("get_num_new_matched_tokens");
      nb::gil_scoped_release release;
      hits = index.lookup(offered);
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

  // The step's plan in the shim's KVConnectorMetadata subclass, as vLLM declares the return type.
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
    nb::object metadata = nb::module_::import_(kShimModule).attr(kMetadataClass)();
    metadata.attr("plan") = nb::cast(std::move(plan_));
    plan_ = StepPlan{};
    return metadata;
  }

  // ---- worker half ----

  void register_kv_caches(nb::handle kv_caches) {
    worker_engine("register_kv_caches");
    if (!nb::isinstance<nb::dict>(kv_caches)) {
      throw ConnectorConfigError("kv_caches: expected a dict of layer name to tensor; got " +
                                 type_of(kv_caches));
    }
    const nb::dict caches = nb::borrow<nb::dict>(kv_caches);
    std::vector<nb::ndarray<>> arrays;
    std::vector<DeviceKvLayer> views;
    for (const std::string& name : settings_.layer_names) {
      if (!caches.contains(name.c_str())) {
        throw ConnectorConfigError("kv_caches: expected a tensor for layer " + name +
                                   " (kv_cache_config's layer_names); got none");
      }
      const auto [array, strides] =
          kv_layer_view(caches[name.c_str()], "kv_caches[\"" + name + "\"]", *engine_);
      arrays.push_back(array);
      views.push_back({array.data(), settings_.num_device_blocks, strides});
    }
    // GIL held: the engine's views and the arrays keeping their memory alive change together.
    engine_->register_kv_caches(views);
    worker_->kv_arrays = std::move(arrays);
    layer_index_.clear();
    for (std::size_t i = 0; i < settings_.layer_names.size(); ++i) {
      layer_index_[settings_.layer_names[i]] = static_cast<std::int64_t>(i);
    }
  }

  void start_load_kv(nb::handle connector, nb::handle /*forward_context*/) {
    begin_step(connector, "start_load_kv");
  }

  void wait_for_layer_load(nb::handle connector, const std::string& layer_name) {
    begin_step(connector, "wait_for_layer_load");
    const std::int64_t layer = layer_of(layer_name);
    std::vector<std::size_t> lost;
    {
      nb::gil_scoped_release release;
      lost = engine_->wait_for_layer_load(layer);
    }
    for (std::size_t block : lost) load_errors_.insert(static_cast<std::int64_t>(block));
  }

  void save_kv_layer(nb::handle connector, const std::string& layer_name, nb::handle /*kv_layer*/,
                     nb::handle /*attn_metadata*/) {
    begin_step(connector, "save_kv_layer");
    const std::int64_t layer = layer_of(layer_name);
    void* const compute_stream = current_compute_stream();
    nb::gil_scoped_release release;
    engine_->save_kv_layer(layer, compute_stream);
  }

  void wait_for_save(nb::handle connector) {
    begin_step(connector, "wait_for_save");  // a step without a forward has had no hook yet
    {
      nb::gil_scoped_release release;
      engine_->wait_for_save();
    }
    step_running_ = false;
    drain_events();
  }

  // What the connector holds between steps (tests). Scheduler half: the requests it tracks and the
  // workers alive. Worker half: its pool's pinned, storing, committed and free blocks, the blocks
  // it published, quarantined regions, a step in progress.
  nb::dict state() {
    nb::dict result;
    if (index_) {
      result["requests"] = requests_.size();
      result["live_ranks"] = index_->live_ranks();
      return result;
    }
    const activekv::offload::BlockStore& store = engine_->store();
    result["published_blocks"] = worker_->index.size();
    result["step_running"] = step_running_;
    result["pinned_blocks"] = store.pinned_blocks();
    result["storing_blocks"] = store.storing_blocks();
    result["committed_blocks"] = store.committed_blocks();
    result["free_slots"] = store.free_slots();
    result["quarantined_regions"] = engine_->quarantined_regions();
    result["invariants"] = store.check_invariants();
    return result;
  }

  // Tests and traces only: the next lease of this direction and layer has a fence of unknown
  // outcome (Engine.inject_fence_fault).
  void inject_fence_fault(const std::string& direction, std::int64_t layer) {
    worker_engine("inject_fence_fault");
    const auto parsed = activekv::offload::parse_direction(direction);
    nb::gil_scoped_release release;
    engine_->inject_fence_fault(parsed, layer);
  }

  std::set<std::int64_t> get_block_ids_with_load_errors() {
    std::set<std::int64_t> errors;
    errors.swap(load_errors_);
    return errors;
  }

 private:
  static std::string request_id(nb::handle request) {
    return nb::cast<std::string>(request.attr("request_id"));
  }

  SharedIndexReader& scheduler_index(const char* hook) {
    if (!index_) {
      throw std::logic_error(std::string(hook) + ": a scheduler hook, called on the " + role_ +
                             " half");
    }
    return *index_;
  }

  Engine& worker_engine(const char* hook) {
    if (engine_ == nullptr) {
      throw std::logic_error(std::string(hook) + ": a worker hook, called on the " + role_ + " half");
    }
    return *engine_;
  }

  std::size_t planned_loads() const { return plan_.loads.size() + offered_loads_; }

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
    worker_engine(hook);
    // Before anything is planned: a hook refused here leaves the engine as it was, so the step
    // can start once the caches are registered.
    if (worker_->kv_arrays.empty()) {
      throw activekv::offload::EngineStateError(
          std::string(hook) + ": called out of order; expected register_kv_caches first");
    }
    nb::object metadata = connector.attr("_get_connector_metadata")();
    StepPlan* plan = nullptr;
    if (!nb::try_cast<StepPlan*>(nb::getattr(metadata, "plan", nb::none()), plan) ||
        plan == nullptr) {
      throw ConnectorConfigError("connector metadata: expected the ActiveKVMetadata ActiveKV's "
                                 "scheduler half built (with its StepPlan); got " +
                                 type_of(metadata));
    }
    std::vector<std::uint64_t> load_keys, store_keys;
    std::vector<std::int64_t> load_blocks, store_blocks;
    for (const auto& [key, block] : plan->loads) {
      load_keys.push_back(key);
      load_blocks.push_back(block);
    }
    for (const auto& [key, block] : plan->stores) {
      store_keys.push_back(key);
      store_blocks.push_back(block);
    }
    std::vector<std::size_t> missed;
    {
      nb::gil_scoped_release release;
      // One call: a step refused for a bad store plans none of its loads either.
      engine_->plan_step(load_keys, load_blocks, store_keys, store_blocks);
      // A block the scheduler half saw committed may be gone by now (evicted by a store that
      // ran between its lookup and this step): vLLM counted those tokens as loaded, so they
      // are reported as failed loads and recomputed, never left as whatever the block held.
      missed = engine_->build_step();
      engine_->start_load();
    }
    for (std::size_t block : missed) load_errors_.insert(static_cast<std::int64_t>(block));
    step_running_ = true;
  }

  // The engine keeps an event log until it is taken; the connector keeps counts per kind and
  // publishes what the pool gained and lost to the scheduler's block index.
  void drain_events() {
    const std::vector<activekv::offload::Event> events = engine_->take_events();
    for (const auto& event : events) {
      ++event_counts_[activekv::offload::event_kind_name(event.kind)];
    }
    worker_->index.publish(events);
  }

  std::string role_;  // checked before the configuration: a refused role reads nothing
  Settings settings_;
  // Worker half: the engine and the KV caches it views (shared by the cores of its engine_id).
  std::shared_ptr<WorkerEngine> worker_;
  Engine* engine_ = nullptr;  // worker_'s
  // Scheduler half.
  std::optional<SharedIndexReader> index_;
  std::unordered_map<std::string, TrackedRequest> requests_;
  StepPlan plan_;
  std::size_t offered_loads_ = 0;  // offered by lookups this step, not yet allocated
  // Worker half.
  nb::object current_stream_;  // torch.cuda.current_stream (CUDA route), looked up once
  std::unordered_map<std::string, std::int64_t> layer_index_;
  bool step_running_ = false;
  std::set<std::int64_t> load_errors_;
  std::map<std::string, std::uint64_t> event_counts_;
};

// vLLM's plugin entry point (group vllm.general_plugins): registers the connector with
// KVConnectorFactory unless a connector of that name is registered already (registering a name
// twice raises in vLLM). True when this call registered it. An unsupported vLLM is refused first,
// so nothing is registered and vLLM's start-up stops on the plugin's error.
bool register_connector() {
  require_supported_vllm();
  nb::object factory = nb::module_::import_(kFactoryModule).attr("KVConnectorFactory");
  nb::object registry = factory.attr("_registry");
  if (nb::cast<bool>(registry.attr("__contains__")(kConnectorName))) return false;
  factory.attr("register_connector")(kConnectorName, kShimModule, kShimClass);
  return true;
}

}  // namespace

NB_MODULE(_vllm, m) {
  m.doc() = "ActiveKV's vLLM connector: the native core behind activekv.vllm_connector.";
  activekv::bindings::translate_standard_exceptions();
  activekv::bindings::translate_engine_errors();
  nb::exception<ConnectorConfigError>(m, "ConnectorConfigError", PyExc_ValueError);
  nb::exception<UnsupportedVllmError>(m, "UnsupportedVllmError", PyExc_RuntimeError);
  m.attr("CONNECTOR_NAME") = kConnectorName;
  m.attr("SUPPORTED_VLLM") = kSupportedVllm;
  m.def("vllm_version_supported", &vllm_version_supported, nb::arg("version"),
        "Whether a vllm.__version__ is a release this connector serves (SUPPORTED_VLLM).");

  m.def("register_connector", &register_connector,
        "vLLM plugin entry point: registers ActiveKVConnector with KVConnectorFactory once; "
        "True when this call registered it.");

  using Refs = std::vector<BlockRef>;
  nb::class_<StepPlan>(m, "StepPlan",
                       "One step's planned loads and stores, (block hash key, device block) "
                       "pairs: the connector metadata vLLM sends to the workers.")
      .def(nb::init<Refs, Refs>(), nb::arg("loads") = Refs{}, nb::arg("stores") = Refs{})
      .def_ro("loads", &StepPlan::loads)
      .def_ro("stores", &StepPlan::stores)
      .def("__getstate__",
           [](const StepPlan& plan) { return std::make_tuple(plan.loads, plan.stores); })
      .def("__setstate__", [](StepPlan& plan, const std::tuple<Refs, Refs>& state) {
        new (&plan) StepPlan{std::get<0>(state), std::get<1>(state)};
      });

  nb::class_<ConnectorCore>(m, "ConnectorCore",
                            "Everything ActiveKVConnector does: each hook of vLLM's "
                            "KVConnectorBase_V1 is one call here.")
      // role takes None too, so that it is refused by name (role_name) like any other non-role.
      .def(nb::init<nb::handle, nb::handle, nb::handle>(), nb::arg("vllm_config"),
           nb::arg("role").none(), nb::arg("kv_cache_config"))
      .def_prop_ro("role", &ConnectorCore::role)
      .def_prop_ro("num_layers", &ConnectorCore::num_layers)
      .def_prop_ro("event_counts", &ConnectorCore::event_counts,
                   "Engine events seen so far, counted by kind (hit, loaded, commit, ...).")
      .def("get_num_new_matched_tokens", &ConnectorCore::get_num_new_matched_tokens,
           nb::arg("request"), nb::arg("num_computed_tokens"))
      .def("update_state_after_alloc", &ConnectorCore::update_state_after_alloc,
           nb::arg("request"), nb::arg("blocks"), nb::arg("num_external_tokens"))
      .def("build_connector_meta", &ConnectorCore::build_connector_meta,
           nb::arg("scheduler_output"))
      .def("register_kv_caches", &ConnectorCore::register_kv_caches, nb::arg("kv_caches"))
      .def("start_load_kv", &ConnectorCore::start_load_kv, nb::arg("connector"),
           nb::arg("forward_context").none())
      .def("wait_for_layer_load", &ConnectorCore::wait_for_layer_load, nb::arg("connector"),
           nb::arg("layer_name"))
      .def("save_kv_layer", &ConnectorCore::save_kv_layer, nb::arg("connector"),
           nb::arg("layer_name"), nb::arg("kv_layer").none(), nb::arg("attn_metadata").none())
      .def("wait_for_save", &ConnectorCore::wait_for_save, nb::arg("connector"))
      .def("get_block_ids_with_load_errors", &ConnectorCore::get_block_ids_with_load_errors)
      .def_prop_ro("state", &ConnectorCore::state,
                   "What the connector holds now (requests, pinned/storing/committed blocks, free "
                   "slots, quarantined regions, a running step): for tests and diagnostics.")
      .def("inject_fence_fault", &ConnectorCore::inject_fence_fault, nb::arg("direction"),
           nb::arg("layer"),
           "Tests and traces only: the next lease of this direction (\"load\" | \"store\") and "
           "layer has a fence of unknown outcome.");
}
