// The decode step: binds pre-allocated buffers (pinned host input/output, device input/output,
// all from the arena at warm-up), enqueues the copy-in, the executor and the copy-out on the
// compute stream, and records completion with an event. Nothing is allocated per step.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "fabric/arena.h"
#include "fabric/executor.h"
#include "fabric/stream_manager.h"

namespace activekv::fabric {

class DecodeStep {
 public:
  // Prepares `executor`, then reserves the step's buffers at the sizes it has once prepared;
  // must run before the arena is sealed.
  DecodeStep(DeviceArena& arena, StreamManager& streams, Executor& executor);

  void* host_input() { return host_input_; }
  const void* host_output() const { return host_output_; }
  std::size_t input_bytes() const { return input_bytes_; }
  std::size_t output_bytes() const { return output_bytes_; }

  // Enqueues one step; StreamRuleError if the compute stream is being captured.
  void enqueue();
  // Waits for the last enqueued step through its completion event.
  void wait();
  // One whole step on `rows` (exactly input_bytes of floats, else std::invalid_argument): copied
  // in, enqueued, waited for; returns the output (output_bytes of floats; the convention probe's
  // RunRows).
  std::vector<float> run(const std::vector<float>& rows);
  std::uint64_t steps() const { return steps_; }

 private:
  StreamManager& streams_;
  Executor& executor_;
  std::size_t input_bytes_;
  std::size_t output_bytes_;
  void* host_input_;
  void* host_output_;
  void* device_input_;
  void* device_output_;
  EventHandle last_completion_ = nullptr;
  std::uint64_t steps_ = 0;
};

}  // namespace activekv::fabric
