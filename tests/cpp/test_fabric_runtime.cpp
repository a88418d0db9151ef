// The fabric's rules on a host-memory backend: the sealed arena, the stream manager's refusals,
// and the decode step binding, enqueueing and completing through events.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include "test_support.h"

#include <cstdint>
#include <cstring>
#include <string>
#include <memory>
#include <vector>

#include "fabric/arena.h"
#include "fabric/decode_step.h"
#include "fabric/device_backend.h"
#include "fabric/errors.h"
#include "fabric/stream_manager.h"
#include "test_fabric_fakes.h"

using activekv::fabric::ArenaExhaustedError;
using activekv::fabric::ArenaSealedError;
using activekv::fabric::DecodeStep;
using activekv::fabric::DeviceArena;
using activekv::fabric::LayerShape;
using activekv::fabric::MemoryKind;
using activekv::fabric::StreamManager;
using activekv::fabric::StreamRole;
using activekv::fabric::StreamRuleError;
using activekv::fabric::TokenMixing;
using activekv::testing::contains;
using activekv::testing::error_message;
using activekv::testing::FakeBackend;
using activekv::testing::HostExecutor;

TEST_CASE("the arena takes its blocks once and carves aligned buffers") {
  FakeBackend backend;
  {
    DeviceArena arena(backend, 4096, 1024);
    CHECK(backend.allocations[0] == 1);
    CHECK(backend.allocations[1] == 1);
    char* a = static_cast<char*>(arena.allocate(MemoryKind::device, "a", 100));
    char* b = static_cast<char*>(arena.allocate(MemoryKind::device, "b", 10, 256));
    CHECK(b - a == 256);
    CHECK(arena.used(MemoryKind::device) == 266);
    CHECK(arena.reservation_count(MemoryKind::device) == 2);
    arena.allocate(MemoryKind::pinned, "p", 1000, 8);
    CHECK(arena.used(MemoryKind::pinned) == 1000);
    // Carving never goes back to the backend.
    CHECK(backend.allocations[0] == 1);
    CHECK(backend.allocations[1] == 1);
  }
  CHECK(backend.live.empty());  // both blocks released with the arena
}

TEST_CASE("the arena aligns addresses, whatever its block's base") {
  FakeBackend backend;  // blocks 256-byte aligned, as cudaMalloc's; TensorRT may ask for more
  DeviceArena arena(backend, 1 << 16, 0);
  arena.allocate(MemoryKind::device, "byte", 1, 1);
  for (const std::size_t alignment : {std::size_t{256}, std::size_t{4096}}) {
    CAPTURE(alignment);
    void* buffer = arena.allocate(MemoryKind::device, "aligned", 8, alignment);
    CHECK(reinterpret_cast<std::uintptr_t>(buffer) % alignment == 0);
  }
}

TEST_CASE("after seal every request is refused and counted and none reaches the backend") {
  FakeBackend backend;
  DeviceArena arena(backend, 4096, 4096);
  arena.allocate(MemoryKind::device, "warmup", 64);
  arena.seal();
  CHECK(arena.sealed());
  const std::string message = error_message<ArenaSealedError>(
      [&] { arena.allocate(MemoryKind::device, "late_workspace", 128); });
  CHECK(contains(message, "late_workspace"));
  CHECK(contains(message, "128 bytes"));
  CHECK(contains(message, "never falls back to cudaMalloc"));
  CHECK(arena.try_allocate(MemoryKind::pinned, "late_pinned", 8, 8) == nullptr);
  CHECK(arena.refused_after_seal() == 2);
  CHECK(contains(arena.last_refusal(), "pinned allocation 'late_pinned'"));
  CHECK(arena.used(MemoryKind::device) == 64);
  CHECK(backend.allocations[0] == 1);
  CHECK(backend.allocations[1] == 1);
}

TEST_CASE("an oversized reservation fails without changing the arena") {
  FakeBackend backend;
  DeviceArena arena(backend, 1000, 0);
  arena.allocate(MemoryKind::device, "first", 600);
  const std::string message = error_message<ArenaExhaustedError>(
      [&] { arena.allocate(MemoryKind::device, "second", 600); });
  CHECK(contains(message, "'second'"));
  CHECK(contains(message, "1000 bytes"));
  CHECK(arena.used(MemoryKind::device) == 600);
  CHECK(arena.reservation_count(MemoryKind::device) == 1);
  CHECK(arena.refused_after_seal() == 0);  // a sizing error is not a rule violation
  CHECK(error_message<ArenaExhaustedError>(
            [&] { arena.allocate(MemoryKind::pinned, "none", 1); }) != "");
  CHECK(error_message<std::invalid_argument>(
            [&] { arena.allocate(MemoryKind::device, "odd", 1, 3); }) != "");
}

TEST_CASE("a failed pinned block releases the device block") {
  FakeBackend backend;
  backend.failing_kind = MemoryKind::pinned;
  CHECK(error_message<std::runtime_error>([&] { DeviceArena arena(backend, 64, 64); }) ==
        "no memory of that kind");
  CHECK(backend.allocations[0] == 1);  // the device block was taken ...
  CHECK(backend.live.empty());         // ... and given back
}

TEST_CASE("compute and aux streams may not be synchronised but the copy stream may") {
  FakeBackend backend;
  StreamManager streams(backend, 2, 4);
  CHECK(streams.role(streams.compute()) == StreamRole::compute);
  CHECK(streams.role(streams.copy()) == StreamRole::copy);
  CHECK(streams.role(streams.aux()[1]) == StreamRole::aux);
  CHECK(streams.runtime_streams().size() == 4);

  const std::string message =
      error_message<StreamRuleError>([&] { streams.synchronize(streams.compute()); });
  CHECK(contains(message, "synchronising the compute stream is refused"));
  CHECK(error_message<StreamRuleError>([&] { streams.synchronize(streams.aux()[0]); }) != "");
  CHECK(streams.refused_syncs() == 2);
  CHECK(backend.stream_syncs == 0);  // a refused sync never reaches the device

  streams.synchronize(streams.copy());
  CHECK(backend.stream_syncs == 1);
  int foreign = 0;
  CHECK(error_message<std::invalid_argument>([&] { streams.synchronize(&foreign); }) != "");
  CHECK(streams.refused_syncs() == 2);
}

TEST_CASE("capturing any runtime stream is refused") {
  FakeBackend backend;
  StreamManager streams(backend, 1, 1);
  for (void* stream : streams.runtime_streams()) {
    const std::string message =
        error_message<StreamRuleError>([&] { streams.begin_capture(stream); });
    CHECK(contains(message, "capture"));
    CHECK(contains(message, "refused"));
  }
  CHECK(streams.refused_captures() == 3);
  CHECK(error_message<std::invalid_argument>([&] { streams.begin_capture(nullptr); }) != "");
}

TEST_CASE("an enqueue onto a capturing runtime stream is refused") {
  FakeBackend backend;
  StreamManager streams(backend, 0, 2);
  streams.check_enqueue(streams.compute());
  backend.capturing.insert(streams.compute());
  const std::string message =
      error_message<StreamRuleError>([&] { streams.check_enqueue(streams.compute()); });
  CHECK(contains(message, "compute stream is being captured"));
  CHECK(error_message<StreamRuleError>([&] { streams.record_completion(streams.compute()); }) !=
        "");
  CHECK(streams.refused_enqueues() == 2);
  CHECK(backend.events_recorded == 0);
  streams.check_enqueue(streams.copy());  // only the capturing stream is refused
}

TEST_CASE("streams and events are created at warm-up and released with the manager") {
  FakeBackend backend;
  {
    StreamManager streams(backend, 3, 5);
    CHECK(backend.handles.size() == 2 + 3 + 5);
    // The ring reuses its events: no creation per step.
    for (int i = 0; i < 12; ++i) streams.record_completion(streams.compute());
    CHECK(backend.handles.size() == 10);
    CHECK(backend.events_recorded == 12);
  }
  CHECK(backend.handles.empty());
  CHECK(error_message<std::invalid_argument>([&] { StreamManager none(backend, 0, 0); }) != "");
}

TEST_CASE("the decode step binds arena buffers and observes completion through events") {
  FakeBackend backend;
  const LayerShape shape{2, 4, 8, 16};
  HostExecutor executor(shape, TokenMixing::causal_mean, 3);
  DeviceArena arena(backend, 1 << 16, 1 << 16);
  StreamManager streams(backend, 0, 2);
  DecodeStep step(arena, streams, executor);
  CHECK(arena.reservation_count(MemoryKind::device) == 3);  // scratch, input, output
  CHECK(arena.reservation_count(MemoryKind::pinned) == 2);
  CHECK(error_message<std::logic_error>([&] { step.wait(); }) != "");

  std::vector<float> input(shape.activation_floats());
  for (std::size_t i = 0; i < input.size(); ++i) {
    input[i] = activekv::fabric::seeded_value(9, i);
  }
  std::memcpy(step.host_input(), input.data(), step.input_bytes());
  arena.seal();
  const std::size_t allocations = backend.allocations[0] + backend.allocations[1];
  for (int i = 0; i < 5; ++i) {
    step.enqueue();
    step.wait();
  }
  CHECK(step.steps() == 5);
  CHECK(executor.steps == 5);
  CHECK(backend.events_recorded == 5);
  CHECK(backend.event_waits == 5);
  CHECK(backend.stream_syncs == 0);
  CHECK(backend.allocations[0] + backend.allocations[1] == allocations);  // nothing per step
  CHECK(arena.refused_after_seal() == 0);

  const auto expected = activekv::fabric::host_layer_forward(
      shape, activekv::fabric::LayerWeights::generate(shape, 3), TokenMixing::causal_mean, input);
  std::vector<float> output(expected.size());
  std::memcpy(output.data(), step.host_output(), step.output_bytes());
  CHECK(output == expected);

  backend.capturing.insert(streams.compute());
  CHECK(error_message<StreamRuleError>([&] { step.enqueue(); }) != "");
  CHECK(step.steps() == 5);  // the refused step enqueued nothing
  CHECK(executor.steps == 5);
}

TEST_CASE("a decode step built after seal is refused") {
  FakeBackend backend;
  const LayerShape shape{1, 2, 4, 4};
  HostExecutor executor(shape, TokenMixing::none, 1);
  DeviceArena arena(backend, 1 << 12, 1 << 12);
  StreamManager streams(backend, 0, 1);
  arena.seal();
  const std::string message =
      error_message<ArenaSealedError>([&] { DecodeStep step(arena, streams, executor); });
  CHECK(contains(message, "host.scratch"));
  CHECK(arena.refused_after_seal() == 1);
}

namespace {

// An executor whose sizes are known only once prepared (as TensorRT's, read from the engine),
// and whose output is wider than its input.
class LateSizedExecutor final : public activekv::fabric::Executor {
 public:
  LateSizedExecutor(std::size_t input = 4 * sizeof(float), std::size_t output = 16 * sizeof(float))
      : prepared_input_(input), prepared_output_(output) {}
  std::string name() const override { return "late-sized"; }
  std::size_t input_bytes() const override { return input_; }
  std::size_t output_bytes() const override { return output_; }
  void prepare(DeviceArena&, StreamManager&) override {
    input_ = prepared_input_;
    output_ = prepared_output_;
  }
  void enqueue(const void*, void* output, activekv::fabric::StreamHandle) override {
    std::memset(output, 0x3f, output_);  // the whole output tensor, as an engine writes it
  }

 private:
  std::size_t prepared_input_;
  std::size_t prepared_output_;
  std::size_t input_ = 0;
  std::size_t output_ = 0;
};

}  // namespace

TEST_CASE("the decode step sizes its buffers from the prepared executor, and run checks rows") {
  FakeBackend backend;
  LateSizedExecutor executor;
  DeviceArena arena(backend, 1 << 12, 1 << 12);
  StreamManager streams(backend, 0, 2);
  DecodeStep step(arena, streams, executor);
  CHECK(step.input_bytes() == 4 * sizeof(float));
  CHECK(step.output_bytes() == 16 * sizeof(float));
  CHECK(arena.used(MemoryKind::device) >= 20 * sizeof(float));
  const std::vector<float> output = step.run(std::vector<float>(4, 1.0f));
  CHECK(output.size() == 16);  // the executor's output, not the input's length
  const std::string message =
      error_message<std::invalid_argument>([&] { step.run(std::vector<float>(3, 1.0f)); });
  CHECK(contains(message, "rows: expected 16 bytes of floats; got 3 floats"));
  CHECK(step.steps() == 1);  // the refused run enqueued nothing
}

TEST_CASE("a decode step refuses an executor whose prepared tensors are empty or not floats") {
  FakeBackend backend;
  DeviceArena arena(backend, 1 << 12, 1 << 12);
  StreamManager streams(backend, 0, 2);
  LateSizedExecutor empty(4 * sizeof(float), 0);
  CHECK(contains(error_message<std::logic_error>([&] { DecodeStep step(arena, streams, empty); }),
                 "executor late-sized has an empty input or output tensor after prepare()"));
  LateSizedExecutor ragged(4 * sizeof(float), 10);
  CHECK(contains(error_message<std::logic_error>([&] { DecodeStep step(arena, streams, ragged); }),
                 "the executor's output of 10 bytes is not whole floats"));
}

TEST_CASE("a layer shape whose activation overflows cuBLAS's int counts is refused") {
  // Each field and batch * slots are within bounds; batch * slots * hidden is 2**32 floats.
  const LayerShape shape{131072, 1, 32768, 1};
  const std::string message = error_message<std::invalid_argument>([&] { shape.validate(); });
  CHECK(contains(message, "batch * slots * hidden: 4294967296 floats"));
  LayerShape{65536, 1, 32767, 1}.validate();  // just under INT_MAX floats
}

TEST_CASE("the CUDA backend starts on a GPU or fails naming the CUDA call") {
  // On a machine without a driver or device the error is clean and names the call; on a GPU
  // machine the backend runs a real stream, event and copy round trip.
  std::unique_ptr<activekv::fabric::DeviceBackend> backend;
  try {
    backend = activekv::fabric::make_cuda_backend(0);
  } catch (const activekv::fabric::CudaError& error) {
    MESSAGE("no usable GPU: " << std::string(error.what()));
    CHECK(contains(error.what(), "cudaGetDeviceCount"));
    CHECK(contains(error.what(), "CUDA error"));
    return;
  }
  CHECK(backend->name() == "cuda:0");
  DeviceArena arena(*backend, 1 << 20, 1 << 20);
  StreamManager streams(*backend, 1, 2);
  auto* host = static_cast<int*>(arena.allocate(MemoryKind::pinned, "host", 4 * sizeof(int)));
  void* device = arena.allocate(MemoryKind::device, "device", 4 * sizeof(int));
  for (int i = 0; i < 4; ++i) host[i] = i + 1;
  backend->copy_async(device, host, 4 * sizeof(int), streams.compute());
  backend->copy_async(host + 2, device, 2 * sizeof(int), streams.compute());
  streams.wait(streams.record_completion(streams.compute()));
  CHECK(host[2] == 1);
  CHECK(host[3] == 2);
  CHECK_FALSE(backend->is_capturing(streams.compute()));
  CHECK(error_message<StreamRuleError>([&] { streams.synchronize(streams.compute()); }) != "");
}
