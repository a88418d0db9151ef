// The engine's CUDA route: how a fence query is read, a clear construction error without a GPU,
// and, where a GPU is, steps bit-identical to the CPU route in every mode and dtype, and an
// injected fence fault quarantining its region. The GPU cases say so and pass vacuously only on
// a machine without a device (CI); the GPU runner runs them for real.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <cuda_runtime.h>

#include "test_support.h"

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "offload/cuda_route.h"
#include "offload/engine.h"

using activekv::offload::choose_transfer_path;
using activekv::offload::classify_fence_query;
using activekv::offload::CompressionMode;
using activekv::offload::crosses_on_copy_engines;
using activekv::offload::CudaRouteError;
using activekv::offload::dense_kv_strides;
using activekv::offload::dtype_bytes;
using activekv::offload::DeviceKvLayer;
using activekv::offload::Direction;
using activekv::offload::Engine;
using activekv::offload::EngineInputError;
using activekv::offload::Event;
using activekv::offload::EventKind;
using activekv::offload::FenceQuery;
using activekv::offload::KvBlockLayout;
using activekv::offload::KvDtype;
using activekv::offload::KvStrides;
using activekv::offload::LayerTransfer;
using activekv::offload::Route;
using activekv::offload::RouteCounts;
using activekv::offload::stored_block_bytes;
using activekv::offload::transfer_path_override;
using activekv::offload::TransferPath;

using activekv::testing::contains;
using activekv::testing::error_message;

namespace {

constexpr std::uint32_t kLayers = 3;
constexpr std::size_t kDeviceBlocks = 8;
constexpr std::size_t kSlots = 16;

bool gpu_present() {
  int count = 0;
  const bool present = cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
  cudaGetLastError();
  return present;
}

// How the rig's device KV is laid out: the engine's dense [2, B, N, H, D] form, [B, 2, N, H, D]
// (each block's K then its V, as FlashInfer keeps them: the layout of the pool's slots), or vLLM
// 0.33.0's per-layer view under LBNHC ([B, N, H, C], C holding K's head_dim words then V's,
// SPEC.md §1), where no block's K is one contiguous run.
enum class View : std::uint8_t { dense, blocks_kv, vllm };

KvStrides view_strides(const KvBlockLayout& layout, View view) {
  if (view == View::dense) return dense_kv_strides(layout, kDeviceBlocks);
  if (view == View::blocks_kv) {
    const KvStrides dense = dense_kv_strides(layout, 1);
    return {2 * layout.bytes_per_tensor(), dense.token, dense.head, layout.bytes_per_tensor()};
  }
  const std::size_t row = layout.head_dim() * dtype_bytes(layout.dtype());
  const std::size_t token = layout.num_kv_heads() * 2 * row;
  return {layout.block_size() * token, token, 2 * row, row};
}

// One engine with its device KV: host vectors (cpu) or device buffers (cuda).
class Rig {
 public:
  Rig(const KvBlockLayout& layout, CompressionMode mode, Route route, View view = View::dense,
      std::size_t region_blocks = 8)
      : layout_(layout),
        route_(route),
        layer_bytes_(2 * kDeviceBlocks * layout.bytes_per_tensor()),
        engine_(layout, mode, kSlots * stored_block_bytes(layout, mode), 4, region_blocks,
                kDeviceBlocks, route) {
    std::vector<DeviceKvLayer> views;
    for (std::uint32_t layer = 0; layer < kLayers; ++layer) {
      host_.emplace_back(layer_bytes_);
      void* data = host_.back().data();
      if (route == Route::cuda) {
        REQUIRE(cudaMalloc(&data, layer_bytes_) == cudaSuccess);
        device_.push_back(data);
      }
      views.push_back({data, kDeviceBlocks, view_strides(layout, view)});
    }
    engine_.register_kv_caches(views);
  }
  ~Rig() {
    for (void* data : device_) cudaFree(data);
  }
  Rig(const Rig&) = delete;
  Rig& operator=(const Rig&) = delete;

  Engine& engine() { return engine_; }

  // Every layer's KV set to `words` (the same bytes for both routes).
  void fill(const std::vector<std::vector<std::uint8_t>>& words) {
    for (std::uint32_t layer = 0; layer < kLayers; ++layer) {
      host_[layer] = words[layer];
      if (route_ == Route::cuda) {
        REQUIRE(cudaMemcpy(device_[layer], words[layer].data(), layer_bytes_,
                           cudaMemcpyHostToDevice) == cudaSuccess);
      }
    }
  }

  std::vector<std::vector<std::uint8_t>> read() {
    if (route_ == Route::cuda) {
      for (std::uint32_t layer = 0; layer < kLayers; ++layer) {
        REQUIRE(cudaMemcpy(host_[layer].data(), device_[layer], layer_bytes_,
                           cudaMemcpyDeviceToHost) == cudaSuccess);
      }
    }
    return host_;
  }

  // One step: plans, then every hook in vLLM's order.
  std::vector<Event> step(const std::vector<std::uint64_t>& load_hashes,
                          const std::vector<std::int64_t>& load_blocks,
                          const std::vector<std::uint64_t>& store_hashes,
                          const std::vector<std::int64_t>& store_blocks, bool store_fault) {
    if (!load_hashes.empty()) engine_.plan_load(load_hashes, load_blocks);
    if (!store_hashes.empty()) engine_.plan_store(store_hashes, store_blocks);
    engine_.build_step();
    if (store_fault) engine_.inject_fence_fault(Direction::store, 1);
    engine_.start_load();
    for (std::uint32_t layer = 0; layer < kLayers; ++layer) {
      engine_.wait_for_layer_load(layer);
      engine_.save_kv_layer(layer);
    }
    engine_.wait_for_save();
    return engine_.take_events();
  }

 private:
  KvBlockLayout layout_;
  Route route_;
  std::size_t layer_bytes_;
  Engine engine_;
  std::vector<std::vector<std::uint8_t>> host_;
  std::vector<void*> device_;
};

// Sets ACTIVEKV_CUDA_TRANSFER_PATH for the scope (the route reads it at construction).
class ForcedPath {
 public:
  explicit ForcedPath(const char* value) { setenv("ACTIVEKV_CUDA_TRANSFER_PATH", value, 1); }
  ~ForcedPath() { unsetenv("ACTIVEKV_CUDA_TRANSFER_PATH"); }
  ForcedPath(const ForcedPath&) = delete;
  ForcedPath& operator=(const ForcedPath&) = delete;
};

std::vector<std::vector<std::uint8_t>> random_kv(std::size_t layer_bytes, std::uint32_t seed) {
  std::mt19937 random(seed);
  std::vector<std::vector<std::uint8_t>> words(kLayers, std::vector<std::uint8_t>(layer_bytes));
  for (auto& layer : words) {
    for (auto& byte : layer) byte = static_cast<std::uint8_t>(random());
  }
  return words;
}

}  // namespace

TEST_CASE("a fence query reads success as signalled, not ready as pending, anything else unknown") {
  CHECK(classify_fence_query(cudaSuccess) == FenceQuery::signalled);
  CHECK(classify_fence_query(cudaErrorNotReady) == FenceQuery::pending);
  for (const cudaError_t failure : {cudaErrorLaunchFailure, cudaErrorIllegalAddress,
                                    cudaErrorInvalidResourceHandle, cudaErrorUnknown}) {
    CHECK(classify_fence_query(failure) == FenceQuery::unknown);
  }
}

TEST_CASE("without a usable GPU the CUDA route is a construction error naming the call") {
  if (gpu_present()) {
    MESSAGE("a GPU is present: the construction succeeds (covered by the GPU cases)");
    return;
  }
  const KvBlockLayout layout(kLayers, 2, 1, 4, KvDtype::fp16);
  const std::string message = error_message<CudaRouteError>([&] {
    const std::size_t capacity = kSlots * stored_block_bytes(layout, CompressionMode::exact);
    Engine(layout, CompressionMode::exact, capacity, 4, 8, kDeviceBlocks, Route::cuda);
  });
  CHECK(contains(message, "CUDA route: cuda"));  // the first runtime call that failed
}

TEST_CASE("the CPU route has no CUDA route counts") {
  const KvBlockLayout layout(kLayers, 2, 1, 4, KvDtype::fp16);
  Rig cpu(layout, CompressionMode::exact, Route::cpu);
  CHECK_FALSE(cpu.engine().cuda_route_counts().has_value());
}

TEST_CASE("blocks cross on the copy engines from 128 KiB copies, compressed stores from 256 KiB") {
  const auto crosses = [](std::uint32_t tokens, CompressionMode mode, Direction direction) {
    return crosses_on_copy_engines(KvBlockLayout(kLayers, tokens, 8, 128, KvDtype::fp16), mode,
                                   direction);
  };
  for (const Direction direction : {Direction::load, Direction::store}) {
    // Exact mode copies K and V apart: 64 tokens x 8 heads x 128 x 2 bytes = 128 KiB each.
    CHECK(crosses(64, CompressionMode::exact, direction));
    CHECK_FALSE(crosses(32, CompressionMode::exact, direction));
    // Compressed modes copy the stored layer whole: 128 tokens x 8 x (2 x 128 + 2 x 4) = 264 KiB.
    CHECK(crosses(128, CompressionMode::int8, direction));
  }
  // 64 tokens: 132 KiB stored layers.
  CHECK(crosses(64, CompressionMode::int8, Direction::load));
  CHECK_FALSE(crosses(64, CompressionMode::int8, Direction::store));
  CHECK_FALSE(crosses(32, CompressionMode::fp8_e4m3, Direction::load));
}

TEST_CASE("a layer crosses by runs from 64 KiB load runs or 128 KiB store runs on average, or 2 blocks where blocks take the copy engines") {
  const auto path = [](std::uint32_t tokens, CompressionMode mode, LayerTransfer layer,
                       std::optional<TransferPath> forced = std::nullopt,
                       Direction direction = Direction::load) {
    return choose_transfer_path(KvBlockLayout(kLayers, tokens, 8, 128, KvDtype::fp16), mode,
                                direction, layer, forced);
  };
  const TransferPath runs = TransferPath::runs_batched;  // the rule's runs are batched
  // 4 tokens: 16 KiB stored layers (8 KiB K, 8 KiB V), kernels by block.
  CHECK(path(4, CompressionMode::exact, {64, 1}) == runs);  // 1 MiB runs
  CHECK(path(4, CompressionMode::exact, {64, 16}) == runs);  // 64 KiB runs
  CHECK(path(4, CompressionMode::exact, {63, 16}) == TransferPath::kernels);  // 63 KiB runs
  CHECK(path(4, CompressionMode::exact, {64, 16}, std::nullopt, Direction::store) ==
        TransferPath::kernels);  // stores from 128 KiB runs
  CHECK(path(4, CompressionMode::exact, {64, 8}, std::nullopt, Direction::store) == runs);
  CHECK(path(4, CompressionMode::exact, {63, 8}, std::nullopt, Direction::store) ==
        TransferPath::kernels);
  CHECK(path(4, CompressionMode::exact, {128, 16, false}) == runs);  // any strides
  CHECK(path(4, CompressionMode::exact, {64, 1, true, false}) == TransferPath::kernels);
  CHECK(path(4, CompressionMode::exact, {0, 0}) == TransferPath::kernels);
  // 64 tokens: 128 KiB tensors, on the copy engines by block; runs of 2 blocks already win, and
  // single blocks stay block copies however large.
  CHECK(path(64, CompressionMode::exact, {8, 8}) == TransferPath::block_copies);
  CHECK(path(64, CompressionMode::exact, {8, 5}) == TransferPath::block_copies);
  CHECK(path(64, CompressionMode::exact, {8, 4}) == runs);
  CHECK(path(64, CompressionMode::exact, {8, 8, false}) == runs);  // 256 KiB: no block copies
  CHECK(path(64, CompressionMode::exact, {8, 4, true, false}) == TransferPath::block_copies);
  // Compressed: 4 tokens of int8 are 8.25 KiB stored layers: runs from 8 of them (66 KiB);
  // stores from 16 (132 KiB).
  CHECK(path(4, CompressionMode::int8, {8, 1}) == runs);
  CHECK(path(4, CompressionMode::int8, {7, 1}) == TransferPath::kernels);
  CHECK(path(4, CompressionMode::int8, {11, 1}) == runs);  // request loads: ~11 blocks a run
  CHECK(path(4, CompressionMode::int8, {8, 1}, std::nullopt, Direction::store) ==
        TransferPath::kernels);
  CHECK(path(4, CompressionMode::int8, {15, 1}, std::nullopt, Direction::store) ==
        TransferPath::kernels);
  CHECK(path(4, CompressionMode::int8, {16, 1}, std::nullopt, Direction::store) == runs);
  // Forced: wherever the path can move the layer.
  CHECK(path(4, CompressionMode::exact, {8, 8}, TransferPath::runs) == TransferPath::runs);
  CHECK(path(64, CompressionMode::exact, {8, 1}, TransferPath::kernels) == TransferPath::kernels);
  CHECK(path(4, CompressionMode::exact, {8, 8}, TransferPath::block_copies) ==
        TransferPath::block_copies);
  CHECK(path(4, CompressionMode::exact, {8, 8, false}, TransferPath::block_copies) ==
        TransferPath::kernels);
  CHECK(path(4, CompressionMode::exact, {64, 1, true, false}, TransferPath::runs_staged) ==
        TransferPath::kernels);
  CHECK(path(4, CompressionMode::int8, {8, 8}, TransferPath::runs_batched) ==
        TransferPath::runs_batched);
}

TEST_CASE("ACTIVEKV_CUDA_TRANSFER_PATH forces a path, auto or unset is the rule, anything else is refused") {
  CHECK_FALSE(transfer_path_override().has_value());
  {
    const ForcedPath forced("runs-staged");
    CHECK(transfer_path_override() == TransferPath::runs_staged);
  }
  {
    const ForcedPath forced("block-copies");
    CHECK(transfer_path_override() == TransferPath::block_copies);
  }
  {
    const ForcedPath forced("runs-batched");
    CHECK(transfer_path_override() == TransferPath::runs_batched);
  }
  {
    const ForcedPath forced("auto");
    CHECK_FALSE(transfer_path_override().has_value());
  }
  const ForcedPath forced("fastest");
  CHECK(contains(error_message<CudaRouteError>([] { transfer_path_override(); }),
                 "ACTIVEKV_CUDA_TRANSFER_PATH: expected auto, kernels, block-copies, runs, "
                 "runs-staged or runs-batched; got \"fastest\""));
}

TEST_CASE("on a GPU the CUDA route matches the CPU route bit for bit in every mode and dtype") {
  if (!gpu_present()) {
    MESSAGE("not run: no GPU");
    return;
  }
  // (tokens, heads, head_dim): the bulk copy kernel (sm_90 and up) moving whole stored layers,
  // with the four-wide codec and with the one-wide codec (head_dim not a multiple of 4), and
  // moving pieces of K and V (32 KiB each in fp16; int8 layers of 33 KiB end in a short piece);
  // the plain kernels (3 x 6 fp16 words, 36 bytes, are no multiple of 16); the copy engines
  // (compressed: loads only at 64 tokens, both ways at 128).
  const std::uint32_t shapes[][3] = {{4, 2, 32},   {4, 2, 6},    {16, 8, 128},
                                     {3, 1, 6},    {64, 8, 128}, {128, 8, 128}};
  for (const auto& shape : shapes) {
    for (const KvDtype dtype : {KvDtype::fp16, KvDtype::bf16, KvDtype::fp32}) {
      for (const CompressionMode mode :
           {CompressionMode::exact, CompressionMode::int8, CompressionMode::fp8_e4m3}) {
        const KvBlockLayout layout(kLayers, shape[0], shape[1], shape[2], dtype);
        CAPTURE(shape[0]);
        CAPTURE(shape[2]);
        CAPTURE(static_cast<int>(dtype));
        CAPTURE(static_cast<int>(mode));
        CHECK(crosses_on_copy_engines(layout, mode, Direction::load) == (shape[0] >= 64));
        Rig cpu(layout, mode, Route::cpu);
        Rig cuda(layout, mode, Route::cuda);
        const std::size_t layer_bytes = 2 * kDeviceBlocks * layout.bytes_per_tensor();
        for (std::uint32_t step = 0; step < 3; ++step) {
          const auto words = random_kv(layer_bytes, 7 * step + static_cast<std::uint32_t>(dtype));
          cpu.fill(words);
          cuda.fill(words);
          // Each step loads what the one before stored, into other device blocks.
          std::vector<std::uint64_t> loads;
          std::vector<std::uint64_t> stores;
          for (std::uint64_t i = 0; i < 4; ++i) {
            if (step > 0) loads.push_back(100 * step + i);
            stores.push_back(100 * (step + 1) + i);
          }
          const std::vector<std::int64_t> load_blocks{4, 5, 6, 7};
          const std::vector<std::int64_t> store_blocks{0, 1, 2, 3};
          const auto cpu_events = cpu.step(loads, load_blocks, stores, store_blocks, false);
          const auto cuda_events = cuda.step(loads, load_blocks, stores, store_blocks, false);
          CHECK(cpu_events == cuda_events);
          CHECK(cpu.read() == cuda.read());
        }
      }
    }
  }
}

TEST_CASE("on a GPU a huge region_blocks sizes the route's regions by what a step can hold") {
  if (!gpu_present()) {
    MESSAGE("not run: no GPU");
    return;
  }
  // 2**60 + 1 transfer entries of 16 bytes wrap to 16 bytes: a region sized by region_blocks
  // alone would be overrun by the first lease. Any region_blocks below 2**63 serves (SPEC.md §6
  // rule 10), so the steps must match the CPU route's bit for bit.
  const std::size_t huge = (std::size_t{1} << 60) + 1;
  for (const CompressionMode mode : {CompressionMode::exact, CompressionMode::int8}) {
    const KvBlockLayout layout(kLayers, 4, 2, 32, KvDtype::fp16);
    Rig cpu(layout, mode, Route::cpu, View::dense, huge);
    Rig cuda(layout, mode, Route::cuda, View::dense, huge);
    for (std::uint32_t step = 0; step < 3; ++step) {
      const auto words = random_kv(2 * kDeviceBlocks * layout.bytes_per_tensor(), 11 + step);
      cpu.fill(words);
      cuda.fill(words);
      std::vector<std::uint64_t> loads;
      std::vector<std::uint64_t> stores;
      for (std::uint64_t i = 0; i < 4; ++i) {
        if (step > 0) loads.push_back(100 * step + i);
        stores.push_back(100 * (step + 1) + i);
      }
      const std::vector<std::int64_t> load_blocks{4, 5, 6, 7};
      const std::vector<std::int64_t> store_blocks{0, 1, 2, 3};
      CHECK(cpu.step(loads, load_blocks, stores, store_blocks, false) ==
            cuda.step(loads, load_blocks, stores, store_blocks, false));
      CHECK(cpu.read() == cuda.read());
    }
  }
  // Where even that bound's buffers cannot be sized (device blocks and region_blocks both
  // beyond any memory), the construction is refused naming region_blocks.
  const KvBlockLayout layout(kLayers, 4, 2, 32, KvDtype::fp16);
  const std::size_t beyond = std::size_t{1} << 62;
  CHECK_THROWS_WITH_AS(Engine(layout, CompressionMode::exact, kSlots * stored_block_bytes(layout, CompressionMode::exact), 4, beyond, beyond, Route::cuda),
                       doctest::Contains("region_blocks"), EngineInputError);
}

TEST_CASE("on a GPU an injected fence fault quarantines the region on the CUDA route") {
  if (!gpu_present()) {
    MESSAGE("not run: no GPU");
    return;
  }
  const KvBlockLayout layout(kLayers, 4, 2, 32, KvDtype::bf16);
  Rig cuda(layout, CompressionMode::int8, Route::cuda);
  cuda.fill(random_kv(2 * kDeviceBlocks * layout.bytes_per_tensor(), 3));
  const auto events = cuda.step({}, {}, {1, 2}, {0, 1}, true);
  bool quarantined = false;
  for (const Event& event : events) quarantined |= event.kind == EventKind::quarantine;
  CHECK(quarantined);
  CHECK(cuda.engine().quarantined_regions() == 1);
  // Dropped, never committed: nothing is found.
  CHECK(cuda.engine().lookup({1, 2}) == 0);
}

TEST_CASE("on a GPU every transfer path matches the CPU route bit for bit, runs direct, staged and split") {
  if (!gpu_present()) {
    MESSAGE("not run: no GPU");
    return;
  }
  // Each step stores 4 new blocks (one extent of the 16 slots) and, from the second, loads
  // earlier ones: a chain in order into consecutive device blocks (one direct run), a chain into
  // scattered device blocks (one staged run), a chain backwards (runs of one), two half chains
  // (a direct run of two beside a staged one), a duplicate splitting a run, and two chains at
  // once (8 blocks: the whole staging buffer, a run starting halfway). Stores go to device
  // blocks in order (a direct run) or not (staged, gathered).
  const std::vector<std::vector<std::uint64_t>> loads{
      {},
      {100, 101, 102, 103},
      {203, 202, 201, 200},
      {100, 101, 202, 203},
      {300, 301, 302, 303},
      {400, 400, 401, 402},
      {500, 501, 502, 503, 400, 401, 402, 403}};
  const std::vector<std::vector<std::int64_t>> load_blocks{
      {}, {4, 5, 6, 7}, {4, 5, 6, 7}, {4, 5, 7, 6}, {7, 4, 6, 5}, {4, 5, 6, 7},
      {0, 1, 2, 3, 4, 5, 6, 7}};
  const std::vector<std::vector<std::int64_t>> store_blocks{
      {0, 1, 2, 3}, {0, 2, 1, 3}, {0, 1, 2, 3}, {3, 2, 1, 0}, {0, 1, 2, 3}, {1, 0, 2, 3}, {}};
  // (tokens, heads, head_dim); from 16 tokens a run of 4 stored layers is a copy-engine copy
  // (256 KiB and more), so the rule takes runs even where the forced path cannot move the layer;
  // the last one's 128 KiB tensors take the copy engines block by block.
  const std::uint32_t shapes[][3] = {{4, 2, 32}, {3, 1, 6}, {16, 8, 128}, {64, 8, 128}};
  for (const char* forced :
       {"kernels", "block-copies", "runs", "runs-staged", "runs-batched", "auto"}) {
    const ForcedPath scope(forced);
    const std::optional<TransferPath> path = transfer_path_override();
    for (const View view : {View::dense, View::blocks_kv, View::vllm}) {
      for (const auto& shape : shapes) {
        for (const KvDtype dtype : {KvDtype::fp16, KvDtype::bf16, KvDtype::fp32}) {
          if (shape[0] == 64 && dtype != KvDtype::fp16) continue;  // the large shape once
          for (const CompressionMode mode :
               {CompressionMode::exact, CompressionMode::int8, CompressionMode::fp8_e4m3}) {
            const KvBlockLayout layout(kLayers, shape[0], shape[1], shape[2], dtype);
            CAPTURE(forced);
            CAPTURE(static_cast<int>(view));
            CAPTURE(shape[0]);
            CAPTURE(shape[2]);
            CAPTURE(static_cast<int>(dtype));
            CAPTURE(static_cast<int>(mode));
            Rig cpu(layout, mode, Route::cpu, view);
            Rig cuda(layout, mode, Route::cuda, view);
            const std::size_t layer_bytes = 2 * kDeviceBlocks * layout.bytes_per_tensor();
            for (std::uint32_t step = 0; step < loads.size(); ++step) {
              const auto words =
                  random_kv(layer_bytes, 11 * step + static_cast<std::uint32_t>(dtype));
              cpu.fill(words);
              cuda.fill(words);
              std::vector<std::uint64_t> stores;
              for (std::uint64_t i = 0; i < store_blocks[step].size(); ++i) {
                stores.push_back(100 * (step + 1) + i);
              }
              const auto cpu_events =
                  cpu.step(loads[step], load_blocks[step], stores, store_blocks[step], false);
              const auto cuda_events =
                  cuda.step(loads[step], load_blocks[step], stores, store_blocks[step], false);
              CHECK(cpu_events == cuda_events);
              CHECK(cpu.read() == cuda.read());
            }
            // The path forced is the path taken wherever it can move the layer: block copies
            // need each block's K contiguous (not so in vLLM's view), and fall back to the rule.
            const RouteCounts counts = *cuda.engine().cuda_route_counts();
            std::size_t layers = 0;
            for (std::size_t p = 0; p < counts.load_layers.size(); ++p) {
              layers += counts.load_layers[p] + counts.store_layers[p];
            }
            CHECK(layers == 2 * kLayers * loads.size() - 2 * kLayers);  // step 0 loads nothing
            if (!path.has_value()) continue;
            const auto taken = static_cast<std::size_t>(*path);
            const std::size_t by_path = counts.load_layers[taken] + counts.store_layers[taken];
            const bool movable = *path != TransferPath::block_copies || view != View::vllm;
            CHECK(by_path == (movable ? layers : 0));
            const bool runs = *path == TransferPath::runs || *path == TransferPath::runs_batched;
            const bool direct = runs && view != View::vllm && mode == CompressionMode::exact;
            CHECK((counts.direct_runs > 0) == direct);
            // Where block copies cannot move it, the rule decides: (batched) runs for the layers
            // whose mean run is a copy-engine copy, as a run of 4 exact layers of 16 tokens.
            const auto rule_runs = static_cast<std::size_t>(TransferPath::runs_batched);
            const bool fallback_runs =
                !movable && counts.load_layers[rule_runs] + counts.store_layers[rule_runs] > 0;
            if (!movable && shape[0] >= 16 && mode == CompressionMode::exact) CHECK(fallback_runs);
            CHECK((counts.staged_runs > 0) ==
                  (runs || *path == TransferPath::runs_staged || fallback_runs));
          }
        }
      }
    }
  }
}
