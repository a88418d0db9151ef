// The executor behind the decode step: one step's work on the compute stream, from a bound device
// input buffer to a bound device output buffer. Implementations: the cuBLAS executor (NVIDIA
// library kernels; proves the rules on the GPU) and the TensorRT executor (built only where the
// TensorRT SDK is found). Everything an executor needs is reserved from the arena in prepare().
#pragma once

#include <cstddef>
#include <string>

#include "fabric/arena.h"
#include "fabric/device_backend.h"
#include "fabric/stream_manager.h"

namespace activekv::fabric {

class Executor {
 public:
  virtual ~Executor() = default;
  virtual std::string name() const = 0;
  virtual std::size_t input_bytes() const = 0;
  virtual std::size_t output_bytes() const = 0;
  // Warm-up only: reserves workspace, weights and scratch from the arena and binds the streams.
  virtual void prepare(DeviceArena& arena, StreamManager& streams) = 0;
  // Enqueues one step; never allocates, never synchronises.
  virtual void enqueue(const void* device_input, void* device_output, StreamHandle stream) = 0;
};

}  // namespace activekv::fabric
