// A decode worker on the GPU: the CUDA backend, the sealed arena, the stream manager, the cuBLAS
// executor and the decode step, put together in warm-up order. Construction is warm-up: every
// buffer is reserved, the convention probe runs one micro-batch under both conventions, and the
// constructor throws ConventionProbeError (the worker refuses to start) unless exactly one
// matches. seal() ends warm-up.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "fabric/arena.h"
#include "fabric/convention_probe.h"
#include "fabric/cublas_executor.h"
#include "fabric/decode_step.h"
#include "fabric/stream_manager.h"

namespace activekv::fabric {

struct WorkerConfig {
  std::vector<std::string> cublas_libraries;
  LayerShape shape{8, 16, 512, 2048};
  // What the executor computes, and what the model it should compute is: the probe compares
  // the two (they differ only in the gate's controls of the probe).
  TokenMixing executor_mixing = TokenMixing::causal_mean;
  std::uint64_t executor_seed = 1;
  TokenMixing model_mixing = TokenMixing::causal_mean;
  std::uint64_t model_seed = 1;
  std::size_t workspace_bytes = CublasExecutor::kDefaultWorkspaceBytes;
  double probe_tolerance = 1e-3;
  int device = 0;
};

struct StepTimings {
  std::uint64_t steps;
  double seconds;
  double mean_us;
  double median_us;
  double p99_us;
  double min_us;
  double max_us;
};

class DecodeWorker {
 public:
  explicit DecodeWorker(const WorkerConfig& config);
  ~DecodeWorker();

  TensorConvention convention() const { return convention_; }
  const ProbeReport& probe_report() const { return probe_; }
  const CublasExecutor& executor() const { return *executor_; }
  DeviceArena& arena() { return *arena_; }
  StreamManager& streams() { return *streams_; }
  std::uint64_t steps() const;

  void seal() { arena_->seal(); }
  // The calls below may come from several threads (Python releases the GIL while steps run):
  // each holds the worker's lock, since the step's buffers, events and counters are one.
  // Each step enqueued and waited for through its completion event (decode latency).
  StepTimings run_latency(std::uint64_t steps);
  // `steps` steps enqueued back to back, one wait at the end (throughput per step).
  StepTimings run_pipelined(std::uint64_t steps);
  // Max relative error of the last step's output against the host reference of the layer.
  double verify_last_output() const;
  // Asks to synchronise, or to capture, the compute stream: always StreamRuleError.
  void request_compute_sync();
  void request_capture();

 private:
  WorkerConfig config_;
  std::unique_ptr<DeviceBackend> backend_;
  std::unique_ptr<CublasExecutor> executor_;
  std::unique_ptr<DeviceArena> arena_;
  std::unique_ptr<StreamManager> streams_;
  std::unique_ptr<DecodeStep> step_;
  std::vector<float> steady_input_;
  ProbeReport probe_{};
  TensorConvention convention_ = TensorConvention::padded_batch;
  mutable std::mutex mutex_;
};

}  // namespace activekv::fabric
