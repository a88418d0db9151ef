#include "fabric/decode_worker.h"

#include <algorithm>
#include <chrono>
#include <cstring>

namespace activekv::fabric {

namespace {

constexpr std::size_t kSlack = std::size_t{1} << 20;  // alignment padding of the reservations
constexpr std::size_t kCompletionEvents = 8;

StepTimings summarise(std::vector<double> micros, double seconds, std::uint64_t steps) {
  StepTimings timings{steps, seconds, 0, 0, 0, 0, 0};
  if (micros.empty()) return timings;
  std::sort(micros.begin(), micros.end());
  double total = 0;
  for (double value : micros) total += value;
  timings.mean_us = total / static_cast<double>(micros.size());
  timings.median_us = micros[micros.size() / 2];
  timings.p99_us = micros[std::min(micros.size() - 1, micros.size() * 99 / 100)];
  timings.min_us = micros.front();
  timings.max_us = micros.back();
  return timings;
}

}  // namespace

DecodeWorker::DecodeWorker(const WorkerConfig& config) : config_(config) {
  config_.shape.validate();
  CublasExecutor::check_workspace_bytes(config_.workspace_bytes);
  // libcublas first: a missing library is named even on a machine without a GPU.
  executor_ = std::make_unique<CublasExecutor>(config_.cublas_libraries, config_.shape,
                                               config_.executor_mixing, config_.executor_seed,
                                               config_.workspace_bytes);
  backend_ = make_cuda_backend(config_.device);
  const std::size_t io_bytes = executor_->input_bytes() + executor_->output_bytes();
  arena_ = std::make_unique<DeviceArena>(*backend_, executor_->arena_bytes() + io_bytes + kSlack,
                                         io_bytes + kSlack);
  streams_ = std::make_unique<StreamManager>(*backend_, 0, kCompletionEvents);
  step_ = std::make_unique<DecodeStep>(*arena_, *streams_, *executor_);

  // The convention probe, before anything else runs: an ambiguous answer stops the worker here.
  const ProbeBatch batch = make_probe_batch(config_.shape, 0xC0FFEE);
  const LayerWeights model = LayerWeights::generate(config_.shape, config_.model_seed);
  probe_ = run_convention_probe(
      batch, config_.shape, expected_tokens(batch, config_.shape, model, config_.model_mixing),
      [this](const std::vector<float>& rows) { return step_->run(rows); }, config_.probe_tolerance);
  convention_ = decide_convention(probe_);

  steady_input_.resize(config_.shape.activation_floats());
  for (std::size_t i = 0; i < steady_input_.size(); ++i) steady_input_[i] = seeded_value(7, i);
  std::memcpy(step_->host_input(), steady_input_.data(), step_->input_bytes());
}

DecodeWorker::~DecodeWorker() {
  // Let the last enqueued step finish before its buffers and streams go away.
  if (step_ != nullptr && step_->steps() > 0) {
    try {
      step_->wait();
    } catch (...) {
    }
  }
}

std::uint64_t DecodeWorker::steps() const {
  const std::lock_guard<std::mutex> lock(mutex_);
  return step_->steps();
}

StepTimings DecodeWorker::run_latency(std::uint64_t steps) {
  const std::lock_guard<std::mutex> lock(mutex_);
  std::vector<double> micros;
  micros.reserve(steps);
  const auto start = std::chrono::steady_clock::now();
  for (std::uint64_t i = 0; i < steps; ++i) {
    const auto before = std::chrono::steady_clock::now();
    step_->enqueue();
    step_->wait();
    micros.push_back(
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - before)
            .count());
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return summarise(std::move(micros), seconds, steps);
}

StepTimings DecodeWorker::run_pipelined(std::uint64_t steps) {
  const std::lock_guard<std::mutex> lock(mutex_);
  const auto start = std::chrono::steady_clock::now();
  for (std::uint64_t i = 0; i < steps; ++i) step_->enqueue();
  if (steps > 0) step_->wait();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const double per_step = steps > 0 ? seconds * 1e6 / static_cast<double>(steps) : 0.0;
  return StepTimings{steps, seconds, per_step, per_step, per_step, per_step, per_step};
}

double DecodeWorker::verify_last_output() const {
  const std::lock_guard<std::mutex> lock(mutex_);
  const LayerWeights weights = LayerWeights::generate(config_.shape, config_.executor_seed);
  const std::vector<float> expected =
      host_layer_forward(config_.shape, weights, config_.executor_mixing, steady_input_);
  return max_relative_error(static_cast<const float*>(step_->host_output()), expected);
}

void DecodeWorker::request_compute_sync() {
  const std::lock_guard<std::mutex> lock(mutex_);
  streams_->synchronize(streams_->compute());
}

void DecodeWorker::request_capture() {
  const std::lock_guard<std::mutex> lock(mutex_);
  streams_->begin_capture(streams_->compute());
}

}  // namespace activekv::fabric
