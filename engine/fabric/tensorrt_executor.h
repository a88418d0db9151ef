// The TensorRT executor, compiled only where a TensorRT SDK is found (CMake: TensorRT_ROOT); no
// machine of this workplace has one, so this file is written to the documented TensorRT 10 API and
// has never run here. All engine memory goes through the arena:
//  * IGpuAsyncAllocator installed on the IRuntime with setGpuAllocator (refuses after seal);
//  * an execution context with user-managed device memory (kUSER_MANAGED), sized by
//    getDeviceMemorySizeV2 and set with setDeviceMemoryV2;
//  * temporary-storage and output allocators that point at the arena;
//  * aux streams from the stream manager (setAuxStreams).
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "fabric/executor.h"

namespace activekv::fabric {

class TensorRtExecutor final : public Executor {
 public:
  // `plan` is a serialised engine with one input and one output tensor of static shape.
  TensorRtExecutor(std::vector<char> plan, std::string input_tensor, std::string output_tensor);
  ~TensorRtExecutor() override;

  std::string name() const override;
  std::size_t input_bytes() const override;
  std::size_t output_bytes() const override;
  void prepare(DeviceArena& arena, StreamManager& streams) override;
  void enqueue(const void* device_input, void* device_output, StreamHandle stream) override;

  // Aux streams the engine asks for; the stream manager must own this many.
  int aux_streams_required() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace activekv::fabric
