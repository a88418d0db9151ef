// The plan of one step: what the connector's scheduler half sends its worker halves, as vLLM's
// connector metadata (the shim's ActiveKVMetadata, which vLLM pickles to worker processes).
#pragma once

#include <nanobind/nanobind.h>

#include <cstdint>
#include <utility>
#include <vector>

#include "bindings/connector_config.h"

namespace activekv::bindings::connector {

namespace nb = nanobind;

// Where vLLM's factory finds the shim, and the shim's KVConnectorMetadata subclass.
constexpr const char* kShimModule = "activekv.vllm_connector";
constexpr const char* kMetadataClass = "ActiveKVMetadata";

// (block hash key, device block) of one planned transfer.
using BlockRef = std::pair<std::uint64_t, std::int64_t>;

// Pickles as two lists (activekv._vllm.StepPlan), so vLLM may ship it to worker processes.
struct StepPlan {
  std::vector<BlockRef> loads;
  std::vector<BlockRef> stores;
};

// `plan` in the shim's metadata class, as vLLM declares build_connector_meta's return type.
inline nb::object plan_metadata(StepPlan plan) {
  nb::object metadata = nb::module_::import_(kShimModule).attr(kMetadataClass)();
  metadata.attr("plan") = nb::cast(std::move(plan));
  return metadata;
}

// The plan in `metadata`, which must outlive the reference; ConnectorConfigError for anything but
// the metadata the scheduler half built.
inline const StepPlan& metadata_plan(nb::handle metadata) {
  StepPlan* plan = nullptr;
  if (!nb::try_cast<StepPlan*>(nb::getattr(metadata, "plan", nb::none()), plan) ||
      plan == nullptr) {
    throw ConnectorConfigError("connector metadata: expected the ActiveKVMetadata ActiveKV's "
                               "scheduler half built (with its StepPlan); got " +
                               type_of(metadata));
  }
  return *plan;
}

}  // namespace activekv::bindings::connector
