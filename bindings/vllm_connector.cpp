// activekv._vllm: the native core of ActiveKV's vLLM connector, and the vLLM plugin entry point.
//
// vLLM needs its connector to be a Python subclass of KVConnectorBase_V1 (a nanobind class cannot
// be one: no inspect.signature, and a metaclass conflict), so shims/activekv/vllm_connector.py is
// that subclass: it holds one ConnectorCore and forwards every hook to it in one call. The core is
// its role's half (connector_scheduler.h, connector_worker.h), which read vLLM's objects
// duck-typed and leave the rest to the C++ Engine.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <cstdint>
#include <map>
#include <new>
#include <set>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <variant>
#include <vector>

#include <nanobind/stl/map.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/set.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include "bindings/build_facts.h"  // the SBOM facts every module carries
#include "bindings/connector_config.h"
#include "bindings/connector_plan.h"
#include "bindings/connector_scheduler.h"
#include "bindings/connector_worker.h"
#include "bindings/errors.h"
#include "bindings/vllm_release.h"

namespace nb = nanobind;

namespace {

// The connector's settings, step plan and halves (connector_*.h).
using namespace activekv::bindings::connector;  // NOLINT(google-build-using-namespace)

// The name vLLM's KVTransferConfig.kv_connector uses, and the shim's class the factory makes
// (in kShimModule, connector_plan.h).
constexpr const char* kConnectorName = "ActiveKVConnector";
constexpr const char* kShimClass = "ActiveKVConnector";
constexpr const char* kFactoryModule = "vllm.distributed.kv_transfer.kv_connector.factory";
constexpr const char* kRoleModule = "vllm.distributed.kv_transfer.kv_connector.v1.base";

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

// One connector's native core: its scheduler half or its worker half, as vLLM's role says. A hook
// of the other half is a logic_error naming both (vLLM calls each hook on one half only).
class ConnectorCore {
 public:
  using Half = std::variant<SchedulerHalf, WorkerHalf>;

  ConnectorCore(nb::handle vllm_config, nb::handle role, nb::handle kv_cache_config)
      : role_(role_name(role)), half_(make_half(role_, read_settings(vllm_config, kv_cache_config))) {}

  const std::string& role() const { return role_; }
  std::size_t num_layers() const {
    return std::visit([](const auto& half) { return half.settings().layer_names.size(); }, half_);
  }
  // Engine events the worker half drained, by kind; none on the scheduler half.
  std::map<std::string, std::uint64_t> event_counts() const {
    const auto* worker = std::get_if<WorkerHalf>(&half_);
    return worker == nullptr ? std::map<std::string, std::uint64_t>{} : worker->event_counts();
  }

  std::pair<std::int64_t, bool> get_num_new_matched_tokens(nb::handle request,
                                                           std::int64_t num_computed_tokens) {
    return scheduler("get_num_new_matched_tokens")
        .get_num_new_matched_tokens(request, num_computed_tokens);
  }
  void update_state_after_alloc(nb::handle request, nb::handle blocks,
                                std::int64_t num_external_tokens) {
    scheduler("update_state_after_alloc")
        .update_state_after_alloc(request, blocks, num_external_tokens);
  }
  nb::object build_connector_meta(nb::handle scheduler_output) {
    return scheduler("build_connector_meta").build_connector_meta(scheduler_output);
  }

  void register_kv_caches(nb::handle kv_caches) {
    worker("register_kv_caches").register_kv_caches(kv_caches);
  }
  void start_load_kv(nb::handle connector, nb::handle /*forward_context*/) {
    worker("start_load_kv").start_load_kv(connector);
  }
  void wait_for_layer_load(nb::handle connector, const std::string& layer_name) {
    worker("wait_for_layer_load").wait_for_layer_load(connector, layer_name);
  }
  void save_kv_layer(nb::handle connector, const std::string& layer_name, nb::handle /*kv_layer*/,
                     nb::handle /*attn_metadata*/) {
    worker("save_kv_layer").save_kv_layer(connector, layer_name);
  }
  void wait_for_save(nb::handle connector) { worker("wait_for_save").wait_for_save(connector); }
  // The scheduler half loads nothing, so it has no failed loads to report.
  std::set<std::int64_t> get_block_ids_with_load_errors() {
    auto* half = std::get_if<WorkerHalf>(&half_);
    return half == nullptr ? std::set<std::int64_t>{} : half->get_block_ids_with_load_errors();
  }
  void inject_fence_fault(const std::string& direction, std::int64_t layer) {
    worker("inject_fence_fault").inject_fence_fault(direction, layer);
  }

  // What the connector holds between steps (tests): each half's own state().
  nb::dict state() {
    return std::visit([](auto& half) { return half.state(); }, half_);
  }

 private:
  // Built in place (guaranteed elision): the scheduler half's index cannot be moved.
  static Half make_half(const std::string& role, const Settings& settings) {
    if (role == "SCHEDULER") return Half(std::in_place_type<SchedulerHalf>, settings);
    return Half(std::in_place_type<WorkerHalf>, settings);
  }

  SchedulerHalf& scheduler(const char* hook) {
    if (auto* half = std::get_if<SchedulerHalf>(&half_)) return *half;
    throw std::logic_error(std::string(hook) + ": a scheduler hook, called on the " + role_ +
                           " half");
  }

  WorkerHalf& worker(const char* hook) {
    if (auto* half = std::get_if<WorkerHalf>(&half_)) return *half;
    throw std::logic_error(std::string(hook) + ": a worker hook, called on the " + role_ + " half");
  }

  std::string role_;  // checked before the configuration: a refused role reads nothing
  Half half_;
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
