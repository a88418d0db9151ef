#include "fabric/decode_step.h"

#include <cstring>
#include <stdexcept>
#include <string>

namespace activekv::fabric {

namespace {

// `executor`, prepared: its tensor sizes are known only then (TensorRT's come from the engine).
Executor& prepared(Executor& executor, DeviceArena& arena, StreamManager& streams) {
  executor.prepare(arena, streams);
  if (executor.input_bytes() == 0 || executor.output_bytes() == 0) {
    throw std::logic_error("decode step: executor " + executor.name() +
                           " has an empty input or output tensor after prepare()");
  }
  if (executor.output_bytes() % sizeof(float) != 0) {
    throw std::logic_error("decode step: the executor's output of " +
                           std::to_string(executor.output_bytes()) + " bytes is not whole floats");
  }
  return executor;
}

}  // namespace

DecodeStep::DecodeStep(DeviceArena& arena, StreamManager& streams, Executor& executor)
    : streams_(streams),
      executor_(prepared(executor, arena, streams)),
      input_bytes_(executor_.input_bytes()),
      output_bytes_(executor_.output_bytes()),
      host_input_(nullptr),
      host_output_(nullptr),
      device_input_(nullptr),
      device_output_(nullptr) {
  host_input_ = arena.allocate(MemoryKind::pinned, "step.host_input", input_bytes_);
  host_output_ = arena.allocate(MemoryKind::pinned, "step.host_output", output_bytes_);
  device_input_ = arena.allocate(MemoryKind::device, "step.device_input", input_bytes_);
  device_output_ = arena.allocate(MemoryKind::device, "step.device_output", output_bytes_);
}

void DecodeStep::enqueue() {
  const StreamHandle compute = streams_.compute();
  streams_.check_enqueue(compute);
  DeviceBackend& backend = streams_.backend();
  backend.copy_async(device_input_, host_input_, input_bytes_, compute);
  executor_.enqueue(device_input_, device_output_, compute);
  backend.copy_async(host_output_, device_output_, output_bytes_, compute);
  last_completion_ = streams_.record_completion(compute);
  ++steps_;
}

void DecodeStep::wait() {
  if (last_completion_ == nullptr) {
    throw std::logic_error("decode step: wait() before any step was enqueued");
  }
  streams_.wait(last_completion_);
}

std::vector<float> DecodeStep::run(const std::vector<float>& rows) {
  if (rows.size() * sizeof(float) != input_bytes_) {
    throw std::invalid_argument("decode step: rows: expected " + std::to_string(input_bytes_) +
                                " bytes of floats; got " + std::to_string(rows.size()) +
                                " floats");
  }
  std::memcpy(host_input_, rows.data(), input_bytes_);
  enqueue();
  wait();
  std::vector<float> output(output_bytes_ / sizeof(float));
  std::memcpy(output.data(), host_output_, output_bytes_);
  return output;
}

}  // namespace activekv::fabric
