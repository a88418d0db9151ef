// activekv._fabric: the C++ boundary of the GPU runtime.
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "bindings/build_facts.h"
#include "bindings/errors.h"
#include "bindings/integers.h"
#include "fabric/arena_plan.h"
#include "fabric/cupti_monitor.h"
#include "fabric/decode_worker.h"
#include "fabric/errors.h"
#include "fabric/planted_violations.h"

namespace nb = nanobind;
using namespace nb::literals;
namespace fabric = activekv::fabric;
using activekv::bindings::integer_argument;
using activekv::bindings::PyInteger;
using fabric::ArenaPlan;

namespace {

// An unsigned argument (a size, a count, a seed): ValueError naming it when negative or too large.
template <typename T = std::size_t>
T unsigned_argument(const PyInteger& value, const char* name) {
  return integer_argument<std::invalid_argument, T>(
      value, name, 0, std::numeric_limits<T>::max(),
      "a non-negative integer below 2**" + std::to_string(std::numeric_limits<T>::digits));
}

fabric::TokenMixing parse_mixing(const std::string& text, const char* argument) {
  if (text == "causal") return fabric::TokenMixing::causal_mean;
  if (text == "none") return fabric::TokenMixing::none;
  throw std::invalid_argument(std::string(argument) + ": expected \"causal\" or \"none\"; got \"" +
                              text + "\"");
}

const char* convention_key(fabric::TensorConvention convention) {
  return convention == fabric::TensorConvention::packed_tokens ? "packed" : "padded";
}

nb::dict timings_dict(const fabric::StepTimings& timings) {
  nb::dict result;
  result["steps"] = timings.steps;
  result["seconds"] = timings.seconds;
  result["mean_us"] = timings.mean_us;
  result["median_us"] = timings.median_us;
  result["p99_us"] = timings.p99_us;
  result["min_us"] = timings.min_us;
  result["max_us"] = timings.max_us;
  return result;
}

nb::dict arena_dict(fabric::DeviceArena& arena) {
  nb::dict result;
  for (fabric::MemoryKind kind : {fabric::MemoryKind::device, fabric::MemoryKind::pinned}) {
    nb::dict block;
    block["capacity"] = arena.capacity(kind);
    block["used"] = arena.used(kind);
    block["reservations"] = arena.reservation_count(kind);
    result[fabric::memory_kind_name(kind)] = block;
  }
  result["sealed"] = arena.sealed();
  result["refused_after_seal"] = arena.refused_after_seal();
  result["last_refusal"] = arena.last_refusal();
  return result;
}

std::uintptr_t handle_value(fabric::StreamHandle stream) {
  return reinterpret_cast<std::uintptr_t>(stream);
}

fabric::WorkerConfig worker_config(std::vector<std::string> cublas_libraries,
                                   const PyInteger& batch, const PyInteger& slots,
                                   const PyInteger& hidden, const PyInteger& ffn,
                                   const std::string& executor_mixing,
                                   const PyInteger& executor_seed,
                                   const std::string& model_mixing, const PyInteger& model_seed,
                                   const PyInteger& workspace_bytes, double probe_tolerance,
                                   const PyInteger& device) {
  fabric::WorkerConfig config;
  config.cublas_libraries = std::move(cublas_libraries);
  config.shape = fabric::LayerShape{
      unsigned_argument(batch, "batch"), unsigned_argument(slots, "slots"),
      unsigned_argument(hidden, "hidden"), unsigned_argument(ffn, "ffn")};
  config.executor_mixing = parse_mixing(executor_mixing, "executor_mixing");
  config.executor_seed = unsigned_argument<std::uint64_t>(executor_seed, "executor_seed");
  config.model_mixing = parse_mixing(model_mixing, "model_mixing");
  config.model_seed = unsigned_argument<std::uint64_t>(model_seed, "model_seed");
  config.workspace_bytes = unsigned_argument(workspace_bytes, "workspace_bytes");
  config.probe_tolerance = probe_tolerance;
  config.device = integer_argument<std::invalid_argument, int>(
      device, "device", 0, std::numeric_limits<int>::max(), "a CUDA device ordinal (0 or more)");
  return config;
}

// A violation planted on purpose for the GPU gate's negative controls (planted_violations.h).
nb::dict plant_violation(fabric::DecodeWorker& worker, const std::string& kind) {
  nb::dict result;
  result["kind"] = kind;
  const fabric::StreamHandle compute = worker.streams().compute();
  if (kind == "device_allocation") {
    fabric::planted::device_allocation(1ul << 20);
  } else if (kind == "compute_stream_sync") {
    fabric::planted::stream_synchronize(compute);
  } else if (kind == "capture") {
    fabric::planted::begin_capture(compute);
    // While the compute stream is captured, the runtime must refuse to enqueue onto it.
    bool refused = false;
    std::string message;
    try {
      worker.run_pipelined(1);
    } catch (const fabric::StreamRuleError& error) {
      refused = true;
      message = error.what();
    } catch (...) {
      fabric::planted::end_capture(compute);
      throw;
    }
    fabric::planted::end_capture(compute);
    result["enqueue_refused"] = refused;
    result["enqueue_message"] = message;
  } else {
    throw std::invalid_argument(
        "kind: expected \"device_allocation\", \"compute_stream_sync\" or \"capture\"; got \"" +
        kind + "\"");
  }
  return result;
}

}  // namespace

NB_MODULE(_fabric, m) {
  m.doc() = "Fabric boundary: sealed arena, stream rules and decode step of a GPU runtime.";
  activekv::bindings::translate_standard_exceptions();
  activekv::bindings::bind_build_and_device(m);

  nb::exception<fabric::ArenaSealedError>(m, "ArenaSealedError", PyExc_RuntimeError);
  nb::exception<fabric::ArenaExhaustedError>(m, "ArenaExhaustedError", PyExc_RuntimeError);
  nb::exception<fabric::StreamRuleError>(m, "StreamRuleError", PyExc_RuntimeError);
  nb::exception<fabric::ConventionProbeError>(m, "ConventionProbeError", PyExc_RuntimeError);
  nb::exception<fabric::CudaError>(m, "CudaError", PyExc_RuntimeError);
  nb::exception<fabric::LibraryLoadError>(m, "LibraryLoadError", PyExc_RuntimeError);
  nb::exception<fabric::LibraryCallError>(m, "LibraryCallError", PyExc_RuntimeError);

  m.attr("has_tensorrt_executor") =
#ifdef ACTIVEKV_HAVE_TENSORRT
      true;
#else
      false;
#endif

  nb::class_<ArenaPlan>(m, "ArenaPlan",
                        "Reservations of the device arena; refused and counted after seal().")
      .def(nb::init<>())
      .def(
          "reserve",
          [](ArenaPlan& plan, const std::string& name, const PyInteger& bytes,
             const PyInteger& alignment) {
            return plan.reserve(name, unsigned_argument(bytes, "bytes"),
                                unsigned_argument(alignment, "alignment"));
          },
          "name"_a, "bytes"_a, "alignment"_a = 256,
          "Reserves bytes at an aligned offset; returns the offset.")
      .def("seal", &ArenaPlan::seal, "Ends warm-up: later reservations raise ArenaSealedError.")
      .def_prop_ro("sealed", &ArenaPlan::sealed)
      .def_prop_ro("total_bytes", &ArenaPlan::total_bytes)
      .def_prop_ro("refused_after_seal", &ArenaPlan::refused_after_seal);

  m.def("base_api_name", &fabric::base_api_name, "callback_name"_a,
        "A CUPTI callback name without its version and per-thread suffixes.");
  m.def(
      "classify_api",
      [](const std::string& name) -> std::optional<std::string> {
        const auto category = fabric::classify_api(name);
        if (!category) return std::nullopt;
        return std::string(fabric::api_category_name(*category));
      },
      "callback_name"_a,
      "The warm-up rules' category of a driver or runtime API callback name, or None.");

  nb::class_<fabric::CuptiMonitor>(
      m, "CuptiMonitor",
      "CUPTI callback subscriber counting allocations, syncs and captures by callback id and "
      "phase; libcupti is loaded from the first of `libraries` that loads.")
      .def(nb::init<const std::vector<std::string>&, const std::string&>(), "libraries"_a,
           "phase"_a = "warmup")
      .def("set_phase", &fabric::CuptiMonitor::set_phase, "name"_a)
      .def_prop_ro("phase", &fabric::CuptiMonitor::phase)
      .def(
          "watch_streams",
          [](fabric::CuptiMonitor& monitor, const std::vector<std::uintptr_t>& streams) {
            std::vector<fabric::StreamHandle> handles;
            for (std::uintptr_t stream : streams) {
              handles.push_back(reinterpret_cast<fabric::StreamHandle>(stream));
            }
            monitor.watch_streams(handles);
          },
          "streams"_a, "Syncs and captures on these streams count as on runtime streams.")
      .def("counts",
           [](const fabric::CuptiMonitor& monitor) {
             nb::list result;
             for (const auto& count : monitor.counts()) {
               nb::dict row;
               row["phase"] = count.phase;
               row["domain"] = fabric::api_domain_name(count.domain);
               row["callback_id"] = count.callback_id;
               row["api"] = count.api;
               row["category"] = fabric::api_category_name(count.category);
               row["runtime_stream"] = count.runtime_stream;
               row["calls"] = count.calls;
               result.append(row);
             }
             return result;
           })
      .def("tracked",
           [](const fabric::CuptiMonitor& monitor) {
             nb::list result;
             for (const auto& entry : monitor.tracked()) {
               nb::dict row;
               row["domain"] = fabric::api_domain_name(entry.domain);
               row["callback_id"] = entry.callback_id;
               row["api"] = entry.api;
               row["category"] = fabric::api_category_name(entry.category);
               result.append(row);
             }
             return result;
           })
      .def_prop_ro("library_path", &fabric::CuptiMonitor::library_path)
      .def_prop_ro("cupti_version", &fabric::CuptiMonitor::cupti_version);

  nb::class_<fabric::DecodeWorker>(
      m, "DecodeWorker",
      "A decode worker on the GPU (CUDA backend, sealed arena, stream manager, cuBLAS executor, "
      "decode step). Construction is warm-up and runs the convention probe: it raises "
      "ConventionProbeError unless exactly one tensor convention matches.")
      .def(
          "__init__",
          [](fabric::DecodeWorker* self, std::vector<std::string> cublas_libraries,
             const PyInteger& batch, const PyInteger& slots, const PyInteger& hidden,
             const PyInteger& ffn, const std::string& executor_mixing,
             const PyInteger& executor_seed, const std::string& model_mixing,
             const PyInteger& model_seed, const PyInteger& workspace_bytes,
             double probe_tolerance, const PyInteger& device) {
            new (self) fabric::DecodeWorker(worker_config(
                std::move(cublas_libraries), batch, slots, hidden, ffn, executor_mixing,
                executor_seed, model_mixing, model_seed, workspace_bytes, probe_tolerance,
                device));
          },
          "cublas_libraries"_a, "batch"_a = 8, "slots"_a = 16, "hidden"_a = 512,
          "ffn"_a = 2048, "executor_mixing"_a = "causal", "executor_seed"_a = 1,
          "model_mixing"_a = "causal", "model_seed"_a = 1,
          "workspace_bytes"_a = fabric::CublasExecutor::kDefaultWorkspaceBytes,
          "probe_tolerance"_a = 1e-3, "device"_a = 0)
      .def_prop_ro("convention",
                   [](const fabric::DecodeWorker& w) { return convention_key(w.convention()); })
      .def_prop_ro("probe",
                   [](const fabric::DecodeWorker& w) {
                     const fabric::ProbeReport& report = w.probe_report();
                     nb::dict result;
                     result["packed_matches"] = report.packed.matches;
                     result["packed_max_error"] = report.packed.max_error;
                     result["padded_matches"] = report.padded.matches;
                     result["padded_max_error"] = report.padded.max_error;
                     result["tolerance"] = report.tolerance;
                     return result;
                   })
      .def_prop_ro("runtime_streams",
                   [](fabric::DecodeWorker& w) {
                     std::vector<std::uintptr_t> values;
                     for (auto stream : w.streams().runtime_streams()) {
                       values.push_back(handle_value(stream));
                     }
                     return values;
                   })
      .def_prop_ro("compute_stream",
                   [](fabric::DecodeWorker& w) { return handle_value(w.streams().compute()); })
      .def_prop_ro("steps", &fabric::DecodeWorker::steps)
      .def("seal", &fabric::DecodeWorker::seal, "Ends warm-up: the arena refuses every request.")
      .def(
          "run_latency",
          [](fabric::DecodeWorker& w, const PyInteger& steps) {
            const auto count = unsigned_argument<std::uint64_t>(steps, "steps");
            fabric::StepTimings timings{};
            {
              nb::gil_scoped_release release;
              timings = w.run_latency(count);
            }
            return timings_dict(timings);
          },
          "steps"_a, "Runs steps one at a time, each waited for through its completion event.")
      .def(
          "run_pipelined",
          [](fabric::DecodeWorker& w, const PyInteger& steps) {
            const auto count = unsigned_argument<std::uint64_t>(steps, "steps");
            fabric::StepTimings timings{};
            {
              nb::gil_scoped_release release;
              timings = w.run_pipelined(count);
            }
            return timings_dict(timings);
          },
          "steps"_a, "Enqueues steps back to back and waits once, for the last.")
      .def("verify_last_output", &fabric::DecodeWorker::verify_last_output,
           "Max relative error of the last step's output against the host reference.")
      .def(
          "request_allocation",
          [](fabric::DecodeWorker& w, const PyInteger& bytes) {
            w.arena().allocate(fabric::MemoryKind::device, "python.request",
                               unsigned_argument(bytes, "bytes"));
          },
          "bytes"_a, "Asks the arena for device memory (refused with ArenaSealedError after seal).")
      .def(
          "request_compute_sync",
          &fabric::DecodeWorker::request_compute_sync,
          "Asks to synchronise the compute stream (always refused with StreamRuleError).")
      .def(
          "request_capture",
          &fabric::DecodeWorker::request_capture,
          "Asks to capture the compute stream (always refused with StreamRuleError).")
      .def("plant_violation", &plant_violation, "kind"_a,
           "Negative controls of the GPU gate: a raw cudaMalloc (\"device_allocation\"), "
           "cudaStreamSynchronize of the compute stream (\"compute_stream_sync\") or a capture "
           "of it (\"capture\"), each bypassing the rules so the CUPTI monitor must see it.")
      .def_prop_ro("refusals",
                   [](fabric::DecodeWorker& w) {
                     nb::dict result;
                     result["arena"] = w.arena().refused_after_seal();
                     result["sync"] = w.streams().refused_syncs();
                     result["capture"] = w.streams().refused_captures();
                     result["enqueue"] = w.streams().refused_enqueues();
                     return result;
                   })
      .def_prop_ro("arena", [](fabric::DecodeWorker& w) { return arena_dict(w.arena()); })
      .def_prop_ro("executor", [](const fabric::DecodeWorker& w) {
        nb::dict result;
        result["name"] = w.executor().name();
        result["library"] = w.executor().library_path();
        result["cublas_version"] = w.executor().library_version();
        return result;
      });
}
