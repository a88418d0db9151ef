#include "fabric/decode_step.h"

#include <cstring>
#include <stdexcept>

namespace activekv::fabric {

DecodeStep::DecodeStep(DeviceArena& arena, StreamManager& streams, Executor& executor)
    : streams_(streams),
      executor_(executor),
      input_bytes_(executor.input_bytes()),
      output_bytes_(executor.output_bytes()),
      host_input_(nullptr),
      host_output_(nullptr),
      device_input_(nullptr),
      device_output_(nullptr) {
  executor_.prepare(arena, streams);
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
  std::memcpy(host_input_, rows.data(), input_bytes_);
  enqueue();
  wait();
  std::vector<float> output(rows.size());
  std::memcpy(output.data(), host_output_, output_bytes_);
  return output;
}

}  // namespace activekv::fabric
