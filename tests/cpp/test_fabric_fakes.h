// Host-memory stand-ins behind the fabric's interfaces, so the rules run in CPU tests: a device
// backend whose "device" is host memory (copies are memcpy, work completes at once) and an
// executor that computes the decode layer on the host. The GPU gate uses the real CUDA backend.
#pragma once

#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "fabric/decode_layer.h"
#include "fabric/device_backend.h"
#include "fabric/executor.h"

namespace activekv::testing {

using fabric::EventHandle;
using fabric::MemoryKind;
using fabric::StreamHandle;

class FakeBackend final : public fabric::DeviceBackend {
 public:
  std::string name() const override { return "fake"; }

  void* allocate(MemoryKind kind, std::size_t bytes) override {
    ++allocations[kind == MemoryKind::device ? 0 : 1];
    if (failing_kind && *failing_kind == kind) throw std::runtime_error("no memory of that kind");
    // 256-byte aligned, zeroed, as cudaMalloc's blocks are aligned.
    const std::size_t rounded = (bytes + 255) / 256 * 256;
    void* memory = std::aligned_alloc(256, rounded > 0 ? rounded : 256);
    if (memory == nullptr) throw std::bad_alloc();
    std::memset(memory, 0, rounded > 0 ? rounded : 256);
    live.insert(memory);
    return memory;
  }
  void release(MemoryKind, void* memory) noexcept override {
    live.erase(memory);
    std::free(memory);
  }

  StreamHandle create_stream() override { return new_handle(); }
  void destroy_stream(StreamHandle stream) noexcept override { handles.erase(stream); }
  bool is_capturing(StreamHandle stream) override { return capturing.count(stream) > 0; }
  void synchronize_stream(StreamHandle) override { ++stream_syncs; }

  EventHandle create_event() override { return new_handle(); }
  void destroy_event(EventHandle event) noexcept override { handles.erase(event); }
  void record_event(EventHandle, StreamHandle) override { ++events_recorded; }
  void wait_event(EventHandle) override { ++event_waits; }
  float elapsed_ms(EventHandle, EventHandle) override { return 0.0f; }

  void copy_async(void* destination, const void* source, std::size_t bytes,
                  StreamHandle) override {
    std::memcpy(destination, source, bytes);
  }

  std::size_t allocations[2] = {0, 0};
  std::optional<MemoryKind> failing_kind;  // allocations of this kind throw
  std::set<void*> live;
  std::set<void*> handles;
  std::set<StreamHandle> capturing;
  std::size_t stream_syncs = 0;
  std::size_t events_recorded = 0;
  std::size_t event_waits = 0;

 private:
  void* new_handle() {
    // Distinct non-null addresses that are never dereferenced.
    storage_.push_back(std::make_unique<char>());
    handles.insert(storage_.back().get());
    return storage_.back().get();
  }
  std::vector<std::unique_ptr<char>> storage_;
};

// The decode layer on the host, reading and writing "device" buffers of the fake backend.
class HostExecutor final : public fabric::Executor {
 public:
  HostExecutor(const fabric::LayerShape& shape, fabric::TokenMixing mixing, std::uint64_t seed)
      : shape_(shape), mixing_(mixing), weights_(fabric::LayerWeights::generate(shape, seed)) {}

  std::string name() const override { return "host"; }
  std::size_t input_bytes() const override { return shape_.activation_floats() * sizeof(float); }
  std::size_t output_bytes() const override { return input_bytes(); }
  void prepare(fabric::DeviceArena& arena, fabric::StreamManager&) override {
    scratch_ = arena.allocate(MemoryKind::device, "host.scratch", 1024);
  }
  void enqueue(const void* input, void* output, StreamHandle) override {
    if (scratch_ == nullptr) throw std::logic_error("enqueue before prepare");
    const auto* in = static_cast<const float*>(input);
    const std::vector<float> rows(in, in + shape_.activation_floats());
    const std::vector<float> result = fabric::host_layer_forward(shape_, weights_, mixing_, rows);
    std::memcpy(output, result.data(), output_bytes());
    ++steps;
  }
  std::size_t steps = 0;

 private:
  fabric::LayerShape shape_;
  fabric::TokenMixing mixing_;
  fabric::LayerWeights weights_;
  void* scratch_ = nullptr;
};

}  // namespace activekv::testing
