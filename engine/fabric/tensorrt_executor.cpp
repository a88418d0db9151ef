// Compiled only with a TensorRT SDK (engine/CMakeLists.txt); see tensorrt_executor.h.
#include "fabric/tensorrt_executor.h"

#include <NvInfer.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <iostream>
#include <stdexcept>

#include "fabric/errors.h"

namespace activekv::fabric {

namespace {

class Logger final : public nvinfer1::ILogger {
 public:
  void log(Severity severity, const char* message) noexcept override {
    if (severity <= Severity::kWARNING) std::cerr << "[tensorrt] " << message << '\n';
  }
};

// Every allocation TensorRT makes comes from the arena; after seal() it gets nullptr (counted by
// the arena), never a fresh cudaMalloc.
class ArenaGpuAllocator final : public nvinfer1::IGpuAsyncAllocator {
 public:
  explicit ArenaGpuAllocator(const char* purpose) : purpose_(purpose) {}
  void bind(DeviceArena& arena) { arena_ = &arena; }

  void* allocateAsync(std::uint64_t const size, std::uint64_t const alignment,
                      nvinfer1::AllocatorFlags const /*flags*/,
                      cudaStream_t /*stream*/) noexcept override {
    if (arena_ == nullptr || size == 0) return nullptr;
    const std::size_t align = alignment == 0 ? 256 : static_cast<std::size_t>(alignment);
    return arena_->try_allocate(MemoryKind::device, purpose_, static_cast<std::size_t>(size),
                                align);
  }
  // Arena memory lives as long as the arena: a release is a no-op that reports success.
  bool deallocateAsync(void* const /*memory*/, cudaStream_t /*stream*/) noexcept override {
    return true;
  }

 private:
  const char* purpose_;
  DeviceArena* arena_ = nullptr;
};

class ArenaOutputAllocator final : public nvinfer1::IOutputAllocator {
 public:
  void bind(DeviceArena& arena) { arena_ = &arena; }
  void set_bound(void* memory, std::size_t bytes) {
    bound_ = memory;
    bound_bytes_ = bytes;
  }
  void* reallocateOutputAsync(char const* tensor_name, void* /*current*/, std::uint64_t size,
                              std::uint64_t alignment, cudaStream_t /*stream*/) noexcept override {
    // The step's bound output buffer when it is large enough; otherwise the arena (refused after
    // seal, which makes enqueueV3 fail rather than allocate).
    if (bound_ != nullptr && size <= bound_bytes_) return bound_;
    if (arena_ == nullptr) return nullptr;
    return arena_->try_allocate(MemoryKind::device, tensor_name, static_cast<std::size_t>(size),
                                alignment == 0 ? 256 : static_cast<std::size_t>(alignment));
  }
  void notifyShape(char const* /*tensor_name*/, nvinfer1::Dims const& /*dims*/) noexcept override {}

 private:
  DeviceArena* arena_ = nullptr;
  void* bound_ = nullptr;
  std::size_t bound_bytes_ = 0;
};

std::size_t element_size(nvinfer1::DataType type) {
  switch (type) {
    case nvinfer1::DataType::kFLOAT:
    case nvinfer1::DataType::kINT32:
      return 4;
    case nvinfer1::DataType::kHALF:
    case nvinfer1::DataType::kBF16:
      return 2;
    case nvinfer1::DataType::kINT64:
      return 8;
    default:
      return 1;
  }
}

}  // namespace

struct TensorRtExecutor::State {
  Logger logger;
  ArenaGpuAllocator engine_allocator{"tensorrt.engine"};
  ArenaGpuAllocator temporary_allocator{"tensorrt.temporary"};
  ArenaOutputAllocator output_allocator;
  std::vector<char> plan;
  std::string input;
  std::string output;
  std::unique_ptr<nvinfer1::IRuntime> runtime;
  std::unique_ptr<nvinfer1::ICudaEngine> engine;
  std::unique_ptr<nvinfer1::IExecutionContext> context;
  std::size_t input_bytes = 0;
  std::size_t output_bytes = 0;

  std::size_t tensor_bytes(const std::string& name) const {
    const nvinfer1::Dims dims = engine->getTensorShape(name.c_str());
    std::size_t count = 1;
    for (int i = 0; i < dims.nbDims; ++i) {
      if (dims.d[i] < 0) {
        throw std::invalid_argument("tensor '" + name + "' has a dynamic shape; the decode "
                                    "step binds static buffers");
      }
      count *= static_cast<std::size_t>(dims.d[i]);
    }
    return count * element_size(engine->getTensorDataType(name.c_str()));
  }
};

TensorRtExecutor::TensorRtExecutor(std::vector<char> plan, std::string input_tensor,
                                   std::string output_tensor)
    : state_(std::make_unique<State>()) {
  state_->plan = std::move(plan);
  state_->input = std::move(input_tensor);
  state_->output = std::move(output_tensor);
  state_->runtime.reset(nvinfer1::createInferRuntime(state_->logger));
  if (!state_->runtime) throw LibraryCallError("createInferRuntime failed");
  // Installed before deserialisation, so the engine's own memory also comes from the arena.
  state_->runtime->setGpuAllocator(&state_->engine_allocator);
}

TensorRtExecutor::~TensorRtExecutor() = default;

std::string TensorRtExecutor::name() const { return "tensorrt(" + state_->input + " -> " +
                                                    state_->output + ")"; }
std::size_t TensorRtExecutor::input_bytes() const { return state_->input_bytes; }
std::size_t TensorRtExecutor::output_bytes() const { return state_->output_bytes; }

int TensorRtExecutor::aux_streams_required() const {
  return state_->engine ? state_->engine->getNbAuxStreams() : 0;
}

void TensorRtExecutor::prepare(DeviceArena& arena, StreamManager& streams) {
  State& s = *state_;
  s.engine_allocator.bind(arena);
  s.temporary_allocator.bind(arena);
  s.output_allocator.bind(arena);
  s.engine.reset(s.runtime->deserializeCudaEngine(s.plan.data(), s.plan.size()));
  if (!s.engine) throw LibraryCallError("IRuntime::deserializeCudaEngine failed");
  s.input_bytes = s.tensor_bytes(s.input);
  s.output_bytes = s.tensor_bytes(s.output);

  s.context.reset(s.engine->createExecutionContext(
      nvinfer1::ExecutionContextAllocationStrategy::kUSER_MANAGED));
  if (!s.context) throw LibraryCallError("ICudaEngine::createExecutionContext failed");
  const std::int64_t device_bytes = s.engine->getDeviceMemorySizeV2();
  void* device_memory = arena.allocate(MemoryKind::device, "tensorrt.context",
                                       static_cast<std::size_t>(device_bytes));
  s.context->setDeviceMemoryV2(device_memory, device_bytes);
  if (!s.context->setTemporaryStorageAllocator(&s.temporary_allocator)) {
    throw LibraryCallError("IExecutionContext::setTemporaryStorageAllocator failed");
  }
  if (!s.context->setOutputAllocator(s.output.c_str(), &s.output_allocator)) {
    throw LibraryCallError("IExecutionContext::setOutputAllocator failed");
  }
  const int aux = s.engine->getNbAuxStreams();
  if (aux > static_cast<int>(streams.aux().size())) {
    throw std::invalid_argument("the engine wants " + std::to_string(aux) +
                                " aux streams; the stream manager owns " +
                                std::to_string(streams.aux().size()));
  }
  if (aux > 0) {
    std::vector<cudaStream_t> aux_streams;
    for (int i = 0; i < aux; ++i) {
      aux_streams.push_back(static_cast<cudaStream_t>(streams.aux()[static_cast<std::size_t>(i)]));
    }
    s.context->setAuxStreams(aux_streams.data(), aux);
  }
}

void TensorRtExecutor::enqueue(const void* device_input, void* device_output,
                               StreamHandle stream) {
  State& s = *state_;
  if (!s.context) throw std::logic_error("TensorRtExecutor::enqueue before prepare");
  s.output_allocator.set_bound(device_output, s.output_bytes);
  if (!s.context->setTensorAddress(s.input.c_str(), const_cast<void*>(device_input)) ||
      !s.context->setTensorAddress(s.output.c_str(), device_output)) {
    throw LibraryCallError("IExecutionContext::setTensorAddress failed");
  }
  if (!s.context->enqueueV3(static_cast<cudaStream_t>(stream))) {
    throw LibraryCallError("IExecutionContext::enqueueV3 failed");
  }
}

}  // namespace activekv::fabric
