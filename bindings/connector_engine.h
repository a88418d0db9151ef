// The engine a vLLM worker's connector serves from: one per vLLM engine_id in a process, shared
// by its worker cores while their settings agree, with the block index it publishes.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "bindings/connector_config.h"
#include "offload/engine.h"
#include "offload/shared_index.h"

namespace activekv::bindings::connector {

namespace nb = nanobind;
using activekv::offload::Engine;
using activekv::offload::SharedIndexError;
using activekv::offload::SharedIndexWriter;

// A worker's engine, the KV caches it views and the block index it publishes for the
// scheduler's process.
struct WorkerEngine {
  explicit WorkerEngine(const Settings& given)
      : settings(given),
        engine(settings.layout, settings.mode, settings.cpu_bytes, settings.num_regions,
               settings.region_blocks, settings.num_device_blocks, settings.route),
        index(settings.engine_id, settings.rank, engine.num_slots()) {}

  // The arrays the engine's views point into, replaced with them (GIL held). Kept here, not by
  // the core that registered them: the engine is shared by every worker core of its engine_id,
  // and outlives any one of them. Declared before `engine`, so released after it: its last owner
  // never drains transfers into freed memory.
  std::vector<nb::ndarray<>> kv_arrays;
  // What the engine was made with: a later core of its engine_id shares it only where its own
  // settings are the same (shared_engine).
  const Settings settings;
  Engine engine;
  SharedIndexWriter index;
};

// The worker cores of one process share one engine per vLLM engine_id (one rank's pool and its
// index, which admits one writer): vLLM makes one worker connector per process, but a new one
// may be made while the last is not yet collected. Guarded by the GIL.
inline std::shared_ptr<WorkerEngine> shared_engine(const Settings& settings) {
  static std::map<std::string, std::weak_ptr<WorkerEngine>> engines;
  std::weak_ptr<WorkerEngine>& slot = engines[settings.engine_id];
  if (std::shared_ptr<WorkerEngine> existing = slot.lock()) {
    // Sharing it would silently serve this core with another pool, mode or layout than it asked
    // for: refused, naming every setting that differs (one line).
    const std::vector<std::string> differences = engine_differences(existing->settings, settings);
    if (!differences.empty()) {
      std::string message;
      for (const std::string& difference : differences) {
        message += (message.empty() ? "" : "; ") + difference;
      }
      throw ConnectorConfigError(message);
    }
    return existing;
  }
  std::shared_ptr<WorkerEngine> engine;
  try {
    engine = std::make_shared<WorkerEngine>(settings);
  } catch (const activekv::offload::CudaRouteError& error) {
    throw ConnectorConfigError(extra_key("device") + " = \"cuda\": the CUDA route cannot start (" +
                               error.what() + ")");
  } catch (const SharedIndexError& error) {
    throw ConnectorConfigError(std::string("kv_transfer_config.engine_id: ") + error.what());
  } catch (const std::invalid_argument& error) {
    throw ConnectorConfigError(in_config_terms(error.what()));
  }
  slot = engine;
  return engine;
}

}  // namespace activekv::bindings::connector
