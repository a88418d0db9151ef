// GPU staging benchmark (issue 4): the engine's CUDA route against its baselines, all measured in
// this one process on the same GPU, the same pinned 4 GiB-class pool and the same scattered blocks:
//   ceiling   one contiguous 1 GiB pinned copy each way;
//   memcpy    one cudaMemcpyAsync per block;
//   batch     one cudaMemcpyBatchAsync for all blocks, and one per layer (what the engine's copy
//             engine path issues);
//   kernels   the plain staging kernels alone, and (sm_90 and up) the bulk copy kernel alone, as
//             the engine launches them (its zero-copy paths);
//   engine    whole engine steps (plans, hooks, kernels or copies, fences) moving the same bytes,
//             in two scenarios on the same engine, each loads alone, stores alone and both at
//             once, as GB/s and as a fraction of this run's ceiling:
//               random    blocks loaded in random order from all over the full pool (runs of one:
//                         the worst case), new blocks stored where the allocator puts them;
//               requests  request-shaped: chains of 16-64 blocks, each new request sharing a
//                         prefix (a quarter to three quarters of its chain) of a recent earlier
//                         request's chain, which it loads back (as far as still committed) while
//                         the step stores its own blocks; loads alone read earlier chains back
//                         whole. Measured first on a freshly filled pool, after request-shaped
//                         warm-up steps have turned it over twice, so eviction has fragmented it (the engine frees slots
//                         only by LRU eviction, so a warm pool is full; each step's stores take
//                         the slots its evictions free). Device blocks are shuffled per step (a
//                         fragmented vLLM free-block queue) unless ACTIVEKV_BENCH_DEVICE_RUNS=1;
//               pressure  serving-shaped under eviction pressure: requests of 8-160 blocks
//                         sharing a prefix (a hit ratio of 0.2-0.5) of an earlier request drawn by
//                         recency, the rest of each prompt stored, `blocks` per step in all, so
//                         steps are heavy with stores, each evicts about as many blocks and the
//                         pool turns over every few steps;
//             each scenario's steps of both at once also against their mix-adjusted ceiling
//             (the longest of loads / H2D, stores / D2H and all bytes / both ways, this run's
//             ceilings), and `phases_ms`: where a step's time goes (plans, build_step, eviction,
//             allocation, issue, wait, commit, events; the engine's own clock for the three
//             inside it, Engine::last_step_times);
//             with the rule's path (auto) and, per forced path (ACTIVEKV_CUDA_TRANSFER_PATH:
//             kernels, block-copies, runs, runs-staged, runs-batched; ACTIVEKV_BENCH_PATHS=0
//             leaves them out, ACTIVEKV_BENCH_PATHS=runs,kernels picks some),
//             so the rule's thresholds (cuda_route.cpp) can be chosen from one run; int8 against
//             exact tokens/s per scenario, the two engines side by side, their steps taking
//             turns (measure_together), each figure the median of 3 x repeats steps.
// Loads and stores overlapped are measured for the contiguous copy, the raw paths and the engine.
// On request, on stderr only: ACTIVEKV_BENCH_BULK_SWEEP=1 sweeps the bulk copy kernel's plan;
// ACTIVEKV_BENCH_RUNS=1 measures runs of consecutive slots (a layout the engine does not have);
// ACTIVEKV_BENCH_BOUNCE=1 measures host threads gathering slots into contiguous pinned chunks.
// A "block" is one layer of one KV block (K and V): the unit a lease scatters. Prints one JSON
// object (the shape release/report.py reads as gpu-staging.json) on stdout; progress on stderr.
//
// Usage: activekv_staging_bench [pool_gib=4] [moved_gib=1] [repeats=5]
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <memory>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "cuda/staging.h"
#include "offload/cuda_route.h"
#include "offload/engine.h"

namespace {

using activekv::offload::CompressionMode;
using activekv::offload::choose_transfer_path;
using activekv::offload::dense_kv_strides;
using activekv::offload::DeviceKvLayer;
using activekv::offload::Engine;
using activekv::offload::KvBlockLayout;
using activekv::offload::KvDtype;
using activekv::offload::Route;
using activekv::offload::stored_block_bytes;
using activekv::offload::stored_layer_bytes;
using activekv::offload::transfer_path_name;

constexpr std::size_t kGiB = std::size_t{1} << 30;
constexpr std::size_t kKiB = 1024;
constexpr std::uint32_t kLayers = 32;
constexpr std::uint32_t kHeads = 8;
constexpr std::uint32_t kHeadDim = 128;  // fp16: 2 KiB of K (and of V) per token
// The issue's block sizes, and 128 KiB: where the engine's exact mode moves to the copy engines.
constexpr std::size_t kBlockSizes[] = {16 * kKiB, 64 * kKiB, 128 * kKiB, 256 * kKiB, 1024 * kKiB};

void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) {
    throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(status));
  }
}

double median(std::vector<double> times) {
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

template <typename Body>
double median_seconds(int repeats, Body&& body) {
  std::vector<double> times;
  for (int i = 0; i < repeats; ++i) {
    const auto start = std::chrono::steady_clock::now();
    body();
    times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  return median(times);
}

double gbps(std::size_t bytes, double seconds) { return static_cast<double>(bytes) / seconds / 1e9; }

struct DeviceBuffer {
  void* data = nullptr;
  explicit DeviceBuffer(std::size_t bytes) { check(cudaMalloc(&data, bytes), "cudaMalloc"); }
  ~DeviceBuffer() { cudaFree(data); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
};

struct PinnedBuffer {
  void* data = nullptr;
  explicit PinnedBuffer(std::size_t bytes) { check(cudaHostAlloc(&data, bytes, 0), "cudaHostAlloc"); }
  ~PinnedBuffer() { cudaFreeHost(data); }
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
};

struct Ways {
  double h2d;
  double d2h;
};

// ---- baselines: the same scattered blocks from a pinned pool of the same size ----

struct Scatter {
  std::vector<void*> host;
  std::vector<void*> device;
  std::size_t block;
};

Scatter scatter(void* pool, std::size_t pool_bytes, void* device, std::size_t moved,
                std::size_t block, std::mt19937_64& random) {
  const std::size_t slots = pool_bytes / block;
  const std::size_t count = moved / block;
  std::vector<std::size_t> order(slots);
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::shuffle(order.begin(), order.end(), random);
  Scatter result{{}, {}, block};
  for (std::size_t i = 0; i < count; ++i) {
    result.host.push_back(static_cast<std::uint8_t*>(pool) + order[i] * block);
    result.device.push_back(static_cast<std::uint8_t*>(device) + i * block);
  }
  return result;
}

// GB/s each way of what `enqueue(in)` puts on `stream` to move all of `s` in (H2D) or out.
template <typename Enqueue>
Ways each_way(const Scatter& s, cudaStream_t stream, int repeats, Enqueue&& enqueue) {
  const std::size_t bytes = s.host.size() * s.block;
  const auto seconds = [&](bool in) {
    return median_seconds(repeats, [&] {
      enqueue(in);
      check(cudaStreamSynchronize(stream), "sync");
    });
  };
  return {gbps(bytes, seconds(true)), gbps(bytes, seconds(false))};
}

Ways per_block_memcpy(const Scatter& s, cudaStream_t stream, int repeats) {
  return each_way(s, stream, repeats, [&](bool in) {
    for (std::size_t i = 0; i < s.host.size(); ++i) {
      check(cudaMemcpyAsync(in ? s.device[i] : s.host[i], in ? s.host[i] : s.device[i], s.block,
                            in ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost, stream),
            "cudaMemcpyAsync");
    }
  });
}

// `s` in `batches` cudaMemcpyBatchAsync calls, enqueued back to back on `stream`: one for all
// blocks, or one per layer (the engine's copy-engine path).
void enqueue_batches(const Scatter& s, bool in, std::size_t batches, cudaStream_t stream) {
  std::vector<std::size_t> sizes(s.host.size(), s.block);
  cudaMemcpyAttributes attributes{};
  attributes.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
  std::size_t first = 0;
  const std::size_t per_batch = s.host.size() / batches;
  for (std::size_t at = 0; at + per_batch <= s.host.size(); at += per_batch) {
    void* const* to = (in ? s.device : s.host).data() + at;
    void* const* from = (in ? s.host : s.device).data() + at;
    check(cudaMemcpyBatchAsync(to, const_cast<const void* const*>(from), sizes.data(), per_batch,
                               &attributes, &first, 1, stream),
          "cudaMemcpyBatchAsync");
  }
}

Ways batch_memcpy(const Scatter& s, std::size_t batches, cudaStream_t stream, int repeats) {
  return each_way(s, stream, repeats, [&](bool in) { enqueue_batches(s, in, batches, stream); });
}

// GB/s of `load()` and `store()`, which enqueue `bytes` in all on `in` and `out`, run at once.
template <typename Load, typename Store>
double both_ways(std::size_t bytes, cudaStream_t in, cudaStream_t out, int repeats, Load&& load,
                 Store&& store) {
  return gbps(bytes, median_seconds(repeats, [&] {
                load();
                store();
                check(cudaStreamSynchronize(in), "sync");
                check(cudaStreamSynchronize(out), "sync");
              }));
}

// GB/s of per-layer batches loading `in` and storing `out` at once on two streams.
double batch_both_ways(const Scatter& in, const Scatter& out, cudaStream_t load,
                       cudaStream_t store, int repeats) {
  return both_ways(
      (in.host.size() + out.host.size()) * in.block, load, store, repeats,
      [&] { enqueue_batches(in, true, kLayers, load); },
      [&] { enqueue_batches(out, false, kLayers, store); });
}

// ---- runs of consecutive slots (ACTIVEKV_BENCH_RUNS=1): what a pool layout or allocator that
// kept a step's blocks together would give; the engine's slots are scattered ----

// `bytes` of whole blocks (all layers) in consecutive slots from `slots` on, moved in (H2D) or
// out as one pitched copy per layer between the pool and a contiguous device range: a slot holds
// every layer of its block, so one layer's pieces lie kLayers * block apart. The copy engines'
// cost per copy is paid per layer, not per block.
void enqueue_runs(void* slots, void* device, std::size_t block, std::size_t bytes, bool in,
                  cudaStream_t stream) {
  const std::size_t per_layer = bytes / block / kLayers;
  for (std::uint32_t layer = 0; layer < kLayers; ++layer) {
    auto* host = static_cast<std::uint8_t*>(slots) + layer * block;
    auto* dev = static_cast<std::uint8_t*>(device) + layer * per_layer * block;
    check(in ? cudaMemcpy2DAsync(dev, block, host, kLayers * block, block, per_layer,
                                 cudaMemcpyHostToDevice, stream)
             : cudaMemcpy2DAsync(host, kLayers * block, dev, block, block, per_layer,
                                 cudaMemcpyDeviceToHost, stream),
          "cudaMemcpy2DAsync");
  }
}

// ---- host threads through bounce chunks (ACTIVEKV_BENCH_BOUNCE=1): CPU threads gather scattered
// slots into contiguous pinned chunks that cross the bus as one copy each (and scatter stored
// chunks back), so the copy engines pay their cost per chunk, not per block. The price is host
// cores and host memory bandwidth, which a serving process needs for itself ----

constexpr std::size_t kBounceChunk = 4 << 20;

// One host thread's share: its own stream and a ring of two pinned chunks.
struct BounceLane {
  PinnedBuffer ring[2] = {PinnedBuffer(kBounceChunk), PinnedBuffer(kBounceChunk)};
  cudaStream_t stream = nullptr;
  cudaEvent_t done[2] = {nullptr, nullptr};

  BounceLane() {
    check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
    for (cudaEvent_t& event : done) {
      check(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), "cudaEventCreate");
    }
  }
  ~BounceLane() {
    for (cudaEvent_t event : done) cudaEventDestroy(event);
    cudaStreamDestroy(stream);
  }
  BounceLane(const BounceLane&) = delete;
  BounceLane& operator=(const BounceLane&) = delete;

  // Chunks lane, lane + lanes, ... of `s` (its device blocks are consecutive), in or out; a
  // chunk's copy overlaps the gather or scatter of the lane's previous one.
  void move(const Scatter& s, bool in, std::size_t lane, std::size_t lanes) {
    const std::size_t per_chunk = kBounceChunk / s.block;
    const std::size_t chunks = (s.host.size() + per_chunk - 1) / per_chunk;
    const auto blocks = [&](std::size_t chunk) {
      return std::min(per_chunk, s.host.size() - chunk * per_chunk);
    };
    const auto copy_out = [&](std::size_t chunk, int slot) {
      check(cudaMemcpyAsync(ring[slot].data, s.device[chunk * per_chunk], blocks(chunk) * s.block,
                            cudaMemcpyDeviceToHost, stream),
            "cudaMemcpyAsync");
      check(cudaEventRecord(done[slot], stream), "cudaEventRecord");
    };
    if (!in && lane < chunks) copy_out(lane, 0);
    int slot = 0;
    for (std::size_t chunk = lane, n = 0; chunk < chunks; chunk += lanes, ++n, slot ^= 1) {
      auto* bytes = static_cast<std::uint8_t*>(ring[slot].data);
      if (in) {
        if (n >= 2) check(cudaEventSynchronize(done[slot]), "cudaEventSynchronize");
        for (std::size_t i = 0; i < blocks(chunk); ++i) {
          std::memcpy(bytes + i * s.block, s.host[chunk * per_chunk + i], s.block);
        }
        check(cudaMemcpyAsync(s.device[chunk * per_chunk], bytes, blocks(chunk) * s.block,
                              cudaMemcpyHostToDevice, stream),
              "cudaMemcpyAsync");
        check(cudaEventRecord(done[slot], stream), "cudaEventRecord");
      } else {
        if (chunk + lanes < chunks) copy_out(chunk + lanes, slot ^ 1);
        check(cudaEventSynchronize(done[slot]), "cudaEventSynchronize");
        for (std::size_t i = 0; i < blocks(chunk); ++i) {
          std::memcpy(s.host[chunk * per_chunk + i], bytes + i * s.block, s.block);
        }
      }
    }
    check(cudaStreamSynchronize(stream), "sync");
  }
};

// GB/s of `threads` host threads per direction loading `in` (if any) and storing `out` (if any).
double bounce(const Scatter* in, const Scatter* out, std::vector<std::unique_ptr<BounceLane>>& lanes,
              std::size_t threads, int repeats) {
  const std::size_t bytes = ((in ? in->host.size() : 0) + (out ? out->host.size() : 0)) *
                            (in ? in : out)->block;
  return gbps(bytes, median_seconds(repeats, [&] {
                std::vector<std::thread> workers;
                for (std::size_t t = 0; t < threads; ++t) {
                  if (in) workers.emplace_back([&, t] { lanes[t]->move(*in, true, t, threads); });
                  if (out) {
                    workers.emplace_back(
                        [&, t] { lanes[threads + t]->move(*out, false, t, threads); });
                  }
                }
                for (std::thread& worker : workers) worker.join();
              }));
}

// ---- the staging kernels alone (exact mode), each launch one layer's share of the blocks ----

// How a launch crosses the bus (akv_stage_args): the plain kernels at most max_blocks wide, or,
// with bulk_piece > 0, the bulk copy kernel.
struct BusLaunch {
  std::uint32_t max_blocks;
  std::uint32_t bulk_piece = 0;
  std::uint32_t bulk_stages = 0;
  std::uint32_t bulk_blocks = 0;
};

// One direction's kernel launches over a Scatter: its transfer list in device memory (as the
// engine keeps it), K and V of block i at i and count + i tensors into the Scatter's device range.
struct KernelPlan {
  const Scatter& s;
  std::size_t per_layer;
  void* list = nullptr;
  void* pool_device = nullptr;

  KernelPlan(const Scatter& scattered, void* pool) : s(scattered), per_layer(s.host.size() / kLayers) {
    std::vector<akv_transfer> entries;
    for (std::size_t i = 0; i < s.host.size(); ++i) {
      entries.push_back({static_cast<std::uint64_t>(static_cast<std::uint8_t*>(s.host[i]) -
                                                    static_cast<std::uint8_t*>(pool)),
                         i});
    }
    check(cudaMalloc(&list, entries.size() * sizeof(akv_transfer)), "cudaMalloc");
    check(cudaMemcpy(list, entries.data(), entries.size() * sizeof(akv_transfer),
                     cudaMemcpyHostToDevice),
          "cudaMemcpy");
    check(cudaHostGetDevicePointer(&pool_device, pool, 0), "cudaHostGetDevicePointer");
  }
  ~KernelPlan() { cudaFree(list); }
  KernelPlan(const KernelPlan&) = delete;
  KernelPlan& operator=(const KernelPlan&) = delete;

  void launch(bool in, const BusLaunch& bus, cudaStream_t stream) const {
    for (std::uint32_t layer = 0; layer < kLayers; ++layer) {
      const akv_stage_args args{static_cast<const akv_transfer*>(list) + layer * per_layer,
                                static_cast<std::uint32_t>(per_layer),
                                static_cast<std::uint8_t*>(pool_device),
                                0,
                                static_cast<std::uint8_t*>(s.device[0]),
                                // [2, blocks, T * H, D]: contiguous K and V tensors.
                                s.block / 2,
                                kHeadDim * 2,
                                kHeadDim * 2,
                                s.host.size() * (s.block / 2),
                                1,
                                1,
                                static_cast<std::uint32_t>(s.block / 2 / (kHeadDim * 2)),
                                kHeadDim,
                                AKV_MODE_EXACT,
                                AKV_DTYPE_FP16,
                                nullptr,
                                s.block,
                                bus.max_blocks,
                                bus.bulk_piece,
                                bus.bulk_stages,
                                bus.bulk_blocks};
      check(static_cast<cudaError_t>(akv_stage_bus(&args, in ? 1 : 0, stream)), "akv_stage_bus");
    }
  }
};

Ways kernels_one_way(const KernelPlan& plan, const BusLaunch& bus, cudaStream_t stream,
                     int repeats) {
  return each_way(plan.s, stream, repeats, [&](bool in) { plan.launch(in, bus, stream); });
}

// GB/s of the kernels loading `in` and storing `out` at once on two streams.
double kernels_both_ways(const KernelPlan& in, const KernelPlan& out, const BusLaunch& bus,
                         cudaStream_t load, cudaStream_t store, int repeats) {
  return both_ways(
      (in.s.host.size() + out.s.host.size()) * in.s.block, load, store, repeats,
      [&] { in.launch(true, bus, load); }, [&] { out.launch(false, bus, store); });
}

// ---- the engine ----

// Device blocks are handed out shuffled (as vLLM's free-block queue hands them out once it is
// fragmented), unless ACTIVEKV_BENCH_DEVICE_RUNS=1: then in order, so a run of slots meets a run
// of device blocks (the route's direct copies).
bool device_blocks_in_order() {
  const char* value = std::getenv("ACTIVEKV_BENCH_DEVICE_RUNS");
  return value != nullptr && std::string(value) == "1";
}

// Sets ACTIVEKV_CUDA_TRANSFER_PATH while an engine is made (the route reads it then).
class ForcedPath {
 public:
  explicit ForcedPath(const char* path) : set_(path != nullptr) {
    if (set_) setenv("ACTIVEKV_CUDA_TRANSFER_PATH", path, 1);
  }
  ~ForcedPath() {
    if (set_) unsetenv("ACTIVEKV_CUDA_TRANSFER_PATH");
  }
  ForcedPath(const ForcedPath&) = delete;
  ForcedPath& operator=(const ForcedPath&) = delete;

 private:
  bool set_;
};

// The parts of a step, timed apart (`phases_ms` of the record): where its time goes. plans:
// plan_load and plan_store; build_step; eviction and allocation: the engine's own clock of
// allocate_stores at save_kv_layer(0) (Engine::last_step_times; allocation without the eviction);
// issue: start_load and the save_kv_layer calls less that allocation; wait: the
// wait_for_layer_load calls and wait_for_save less the commits; commit: wait_for_save's commits;
// events: take_events.
constexpr const char* kPhases[] = {"plans", "build_step", "eviction", "allocation", "issue",
                                   "wait", "commit", "events"};
constexpr std::size_t kPhaseCount = std::size(kPhases);

// The traffic of an engine scenario (see the file's comment).
enum class Scenario : std::uint8_t { random, requests, pressure };
const char* scenario_name(Scenario scenario) {
  return scenario == Scenario::random ? "random"
         : scenario == Scenario::requests ? "requests"
                                          : "pressure";
}

// The copy ceiling of a step that loads `load_bytes` and stores `store_bytes` (the mix-adjusted
// ceiling): the longest of its loads over the H2D ceiling, its stores over the D2H one, and all of
// it over the both-ways one, each measured in this run. Seconds.
double mix_ceiling_seconds(double load_bytes, double store_bytes, double h2d_gbps, double d2h_gbps,
                           double both_gbps) {
  return std::max({load_bytes / (h2d_gbps * 1e9), store_bytes / (d2h_gbps * 1e9),
                   (load_bytes + store_bytes) / (both_gbps * 1e9)});
}

// What one measured step moved, and its runs (the engine's count, SPEC.md §2).
struct StepResult {
  double seconds = 0;
  std::size_t loaded = 0;  // blocks
  std::size_t stored = 0;
  activekv::offload::StepRuns runs;
  double phases[kPhaseCount] = {};  // seconds per kPhases
};

// Median GB/s of a scenario's steps: loads alone, stores alone, both at once; and the mean
// blocks per run of the loads and of the stores.
struct Rates {
  double load = 0;
  double store = 0;
  double both = 0;
  double load_run = 0;
  double store_run = 0;
  double load_tokens = 0;   // tokens/s, loads alone
  double store_tokens = 0;  // tokens/s, stores alone
  // Steps of both: the median of their mix-adjusted ceilings (GB/s) and of their time against it
  // (mix_ceiling_seconds / seconds), and the share of their bytes that were loads.
  double both_mix_ceiling = 0;
  double both_of_mix_ceiling = 0;
  double both_load_share = 0;
  // Median milliseconds per kPhases: loads alone, stores alone, both.
  double phases_ms[3][kPhaseCount] = {};
};

// The run's copy ceilings (GB/s), for the mix-adjusted ceiling of each step.
struct Ceilings {
  double h2d = 0;
  double d2h = 0;
  double both = 0;
};

struct EngineRig {
  KvBlockLayout layout;
  std::size_t blocks;  // per step, per direction
  std::unique_ptr<Engine> engine;
  std::vector<std::unique_ptr<DeviceBuffer>> kv;
  std::uint64_t next_hash = 1;
  std::vector<std::uint64_t> stored;  // committed hashes
  std::unordered_map<std::uint64_t, std::size_t> position;  // hash -> index in `stored`
  std::mt19937_64 random{7};
  // Request-shaped traffic: every request's chain of hashes, oldest first, and how many of them
  // were made before the current step (a prefix is shared only with those).
  std::vector<std::vector<std::uint64_t>> requests;
  std::size_t settled_requests = 0;
  std::vector<std::int64_t> load_devices;
  std::vector<std::int64_t> store_devices;

  EngineRig(std::uint32_t tokens, CompressionMode mode, std::size_t pool_bytes,
            std::size_t blocks_per_step, const char* forced_path)
      : layout(kLayers, tokens, kHeads, kHeadDim, KvDtype::fp16), blocks(blocks_per_step) {
    {
      const ForcedPath forced(forced_path);
      // Room for a load step and a store step side by side in the device KV.
      engine = std::make_unique<Engine>(layout, mode, pool_bytes, 4, blocks, 2 * blocks, Route::cuda);
    }
    std::vector<DeviceKvLayer> views;
    for (std::uint32_t layer = 0; layer < kLayers; ++layer) {
      kv.push_back(std::make_unique<DeviceBuffer>(2 * 2 * blocks * layout.bytes_per_tensor()));
      check(cudaMemset(kv.back()->data, 0x3C, 2 * 2 * blocks * layout.bytes_per_tensor()),
            "cudaMemset");
      views.push_back({kv.back()->data, 2 * blocks, dense_kv_strides(layout, 2 * blocks)});
    }
    engine->register_kv_caches(views);
    // Loads into the first `blocks` device blocks, stores from the others.
    load_devices.resize(blocks);
    std::iota(load_devices.begin(), load_devices.end(), std::int64_t{0});
    store_devices.resize(blocks);
    std::iota(store_devices.begin(), store_devices.end(), static_cast<std::int64_t>(blocks));
    // Fill the pool, so that loads come from slots scattered over all of it: one step more than
    // it holds whole steps (eviction frees whole extents, so the stored count may never reach
    // num_slots).
    for (std::size_t step = 0; step < (engine->num_slots() + blocks - 1) / blocks; ++step) {
      random_step(false, true);
    }
  }

  // One step of `loads` and `stores` through the engine API; the seconds of the engine's calls
  // alone (plans through wait_for_save and the events taken).
  StepResult run(const std::vector<std::uint64_t>& loads,
                 const std::vector<std::uint64_t>& stores) {
    if (!device_blocks_in_order()) {
      std::shuffle(load_devices.begin(), load_devices.end(), random);
      std::shuffle(store_devices.begin(), store_devices.end(), random);
    }
    const std::vector<std::int64_t> load_blocks(load_devices.begin(),
                                                load_devices.begin() + static_cast<std::ptrdiff_t>(loads.size()));
    const std::vector<std::int64_t> store_blocks(
        store_devices.begin(), store_devices.begin() + static_cast<std::ptrdiff_t>(stores.size()));
    using Clock = std::chrono::steady_clock;
    const auto since = [](Clock::time_point& mark) {
      const Clock::time_point now = Clock::now();
      const double seconds = std::chrono::duration<double>(now - mark).count();
      mark = now;
      return seconds;
    };
    StepResult result;
    double issue = 0;
    double wait = 0;
    const auto start = Clock::now();
    auto mark = start;
    if (!loads.empty()) engine->plan_load(loads, load_blocks);
    if (!stores.empty()) engine->plan_store(stores, store_blocks);
    result.phases[0] = since(mark);
    engine->build_step();
    result.phases[1] = since(mark);
    engine->start_load();
    issue += since(mark);
    for (std::uint32_t layer = 0; layer < kLayers; ++layer) {
      engine->wait_for_layer_load(layer);
      wait += since(mark);
      engine->save_kv_layer(layer);
      issue += since(mark);
    }
    engine->wait_for_save();
    wait += since(mark);
    // The step's events are taken inside the step, as vLLM's connector does at wait_for_save (and
    // as the Python bench's event_arrays() is timed).
    const std::vector<activekv::offload::Event> events = engine->take_events();
    result.phases[7] = since(mark);
    result.seconds = std::chrono::duration<double>(mark - start).count();
    const activekv::offload::StepTimes times = engine->last_step_times();
    const double allocation = static_cast<double>(times.allocation_ns) * 1e-9;
    const double eviction = static_cast<double>(times.eviction_ns) * 1e-9;
    const double commit = static_cast<double>(times.commit_ns) * 1e-9;
    result.phases[2] = eviction;
    result.phases[3] = allocation - eviction;
    result.phases[4] = issue - allocation;
    result.phases[5] = wait - commit;
    result.phases[6] = commit;
    result.runs = engine->last_step_runs();
    result.loaded = result.runs.load_blocks;
    result.stored = result.runs.store_blocks;
    // Track what is committed, so that later loads pick committed blocks only. A lost fence
    // (a path the GPU refused, a fault) makes the step's figures meaningless: stop there.
    using activekv::offload::EventKind;
    for (const auto& event : events) {
      if (event.kind == EventKind::quarantine || event.kind == EventKind::load_error ||
          event.kind == EventKind::drop || event.kind == EventKind::fatal) {
        const char* kind = event.kind == EventKind::quarantine ? "quarantine"
                           : event.kind == EventKind::load_error ? "load_error"
                           : event.kind == EventKind::drop       ? "drop"
                                                                 : "fatal";
        throw std::runtime_error(std::string("staging bench: a step lost a transfer (") + kind +
                                 " " + std::to_string(event.value) +
                                 "): nothing it measures counts");
      }
      if (event.kind == EventKind::commit) {
        position[event.value] = stored.size();
        stored.push_back(event.value);
      } else if (event.kind == EventKind::evict) {
        const std::size_t at = position.at(event.value);
        position[stored.back()] = at;
        stored[at] = stored.back();
        stored.pop_back();
        position.erase(event.value);
      }
    }
    settled_requests = requests.size();
    return result;
  }

  // Random scatter (the worst case): `blocks` committed blocks in random order, `blocks` new
  // ones stored (where the allocator puts them).
  StepResult random_step(bool load, bool store) {
    std::vector<std::uint64_t> loads;
    std::sample(stored.begin(), stored.end(), std::back_inserter(loads), load ? blocks : 0,
                random);
    std::shuffle(loads.begin(), loads.end(), random);
    std::vector<std::uint64_t> stores(store ? blocks : 0);
    std::iota(stores.begin(), stores.end(), next_hash);
    next_hash += stores.size();
    return run(loads, stores);
  }

  // Request-shaped: requests of 16-64 blocks, each (where it loads) sharing a prefix of an earlier
  // request's chain, loaded as far as it is still committed, and storing its own blocks after
  // it, until `blocks` are loaded (if `load`) and `blocks` stored (if `store`). Loads alone are
  // earlier requests' chains read back whole (as far as committed).
  StepResult request_step(bool load, bool store) {
    std::vector<std::uint64_t> loads;
    std::vector<std::uint64_t> stores;
    std::uniform_int_distribution<std::size_t> length(16, 64);
    std::size_t attempts = 0;
    while (((load && loads.size() < blocks) || (store && stores.size() < blocks)) &&
           attempts++ < 64 * blocks) {
      const std::size_t chain = length(random);
      std::vector<std::uint64_t> hashes;
      if (load && loads.size() < blocks && settled_requests > 0) {
        // A recent earlier request (those are the ones still committed, mostly).
        const std::size_t recent = std::min<std::size_t>(settled_requests, engine->num_slots() / 64 + 1);
        std::uniform_int_distribution<std::size_t> pick(settled_requests - recent, settled_requests - 1);
        const std::vector<std::uint64_t>& parent = requests[pick(random)];
        const std::size_t shared = store ? std::uniform_int_distribution<std::size_t>(
                                               chain / 4, 3 * chain / 4)(random)
                                         : chain;
        hashes.assign(parent.begin(),
                      parent.begin() + static_cast<std::ptrdiff_t>(std::min(shared, parent.size())));
        hashes.resize(std::min(hashes.size(), engine->lookup(hashes)));
        hashes.resize(std::min(hashes.size(), blocks - loads.size()));
        loads.insert(loads.end(), hashes.begin(), hashes.end());
      }
      if (store && stores.size() < blocks) {
        const std::size_t own = std::min(chain - std::min(chain, hashes.size()), blocks - stores.size());
        for (std::size_t i = 0; i < own; ++i) {
          hashes.push_back(next_hash);
          stores.push_back(next_hash++);
        }
      }
      if (store && !hashes.empty()) requests.push_back(std::move(hashes));
    }
    engine->take_events();  // the lookups'
    return run(loads, stores);
  }

  // Under eviction pressure (serving-shaped): requests of 8-160 blocks, each sharing a prefix
  // (a hit ratio of 0.2-0.5 of its prompt) of an earlier request drawn by recency (its age in
  // requests geometric, mean 32), loaded as far as still committed, the rest of its prompt
  // stored, until the step holds `blocks` in all, loads and stores together: steps heavy with
  // stores, each evicting about as many blocks (the warm pool is full), so the pool turns over
  // every few steps. Loads alone (stores alone) keep that side of the same kind of requests.
  StepResult pressure_step(bool load, bool store) {
    std::vector<std::uint64_t> loads;
    std::vector<std::uint64_t> stores;
    std::uniform_int_distribution<std::size_t> length(8, 160);
    std::uniform_real_distribution<double> hit(0.2, 0.5);
    std::geometric_distribution<std::size_t> age(1.0 / 33.0);
    const auto room = [&] { return blocks - (load ? loads.size() : 0) - (store ? stores.size() : 0); };
    std::size_t attempts = 0;
    while (room() > 0 && attempts++ < 64 * blocks) {
      // A prompt longer than the step's room is cut to it (a chunk of a long prefill), its hit
      // ratio kept, so that large blocks' steps stay heavy with stores too.
      const std::size_t prompt = std::min(length(random), room());
      const auto shared = static_cast<std::size_t>(hit(random) * static_cast<double>(prompt) + 0.5);
      std::vector<std::uint64_t> hashes;
      if (settled_requests > 0) {
        const std::vector<std::uint64_t>& parent =
            requests[settled_requests - 1 - std::min(age(random), settled_requests - 1)];
        hashes.assign(parent.begin(),
                      parent.begin() + static_cast<std::ptrdiff_t>(std::min(shared, parent.size())));
        hashes.resize(std::min(hashes.size(), engine->lookup(hashes)));
        if (load) {
          hashes.resize(std::min(hashes.size(), room()));
          loads.insert(loads.end(), hashes.begin(), hashes.end());
        }
      }
      if (store) {
        const std::size_t own = std::min(prompt - std::min(prompt, hashes.size()), room());
        for (std::size_t i = 0; i < own; ++i) {
          hashes.push_back(next_hash);
          stores.push_back(next_hash++);
        }
        if (!hashes.empty()) requests.push_back(std::move(hashes));
      }
    }
    engine->take_events();  // the lookups'
    return run(loads, stores);
  }

  // Request-shaped steps until the pool has turned over twice (the order of eviction mixed by
  // the loads' refreshes of shared prefixes): the fragmented pool the measured steps allocate in.
  // Twice: on the host-only route, the runs per step settle by then (about 5 blocks per load run
  // and 5-8 per store run with 64-2048 blocks per step and a pool of 4 steps).
  void warm_requests() {
    std::size_t turned = 0;
    while (turned < 2 * engine->num_slots()) turned += request_step(true, true).stored;
  }

  StepResult step_of(Scenario kind, bool load, bool store) {
    switch (kind) {
      case Scenario::requests:
        return request_step(load, store);
      case Scenario::pressure:
        return pressure_step(load, store);
      case Scenario::random:
        break;
    }
    return random_step(load, store);
  }

  // A measurement of one scenario, taken a sample at a time (measure_together): begin() starts
  // it (request-shaped steps first turn the pool over), sample() adds one step of loads alone,
  // one of stores alone and one of both, rates() gives their medians.
  Scenario scenario = Scenario::random;
  std::vector<StepResult> loads_alone;
  std::vector<StepResult> stores_alone;
  std::vector<StepResult> both_at_once;

  // Request-shaped and pressure steps first turn the pool over twice.
  void begin(Scenario kind) {
    scenario = kind;
    loads_alone.clear();
    stores_alone.clear();
    both_at_once.clear();
    if (kind == Scenario::requests) warm_requests();
    if (kind == Scenario::pressure) {
      std::size_t turned = 0;
      while (turned < 2 * engine->num_slots()) turned += pressure_step(true, true).stored;
    }
  }

  void sample() {
    loads_alone.push_back(step_of(scenario, true, false));
    stores_alone.push_back(step_of(scenario, false, true));
    both_at_once.push_back(step_of(scenario, true, true));
  }

  Rates rates(const Ceilings& ceilings) const {
    const double block_bytes = static_cast<double>(kLayers * stored_layer_bytes(layout, engine->mode()));
    const double block_tokens = static_cast<double>(kLayers * layout.block_size());
    // The median over `steps` of their blocks (loaded, stored or both) times `unit` per second.
    const auto median_rate = [](const std::vector<StepResult>& steps, bool count_loads,
                                bool count_stores, double unit) {
      std::vector<double> values;
      for (const StepResult& step : steps) {
        const std::size_t moved = (count_loads ? step.loaded : 0) + (count_stores ? step.stored : 0);
        values.push_back(static_cast<double>(moved) * unit / step.seconds);
      }
      return median(values);
    };
    double load_blocks = 0;
    double load_runs = 0;
    double store_blocks = 0;
    double store_runs = 0;
    for (const StepResult& step : both_at_once) {
      load_blocks += static_cast<double>(step.runs.load_blocks);
      load_runs += static_cast<double>(step.runs.load_runs);
      store_blocks += static_cast<double>(step.runs.store_blocks);
      store_runs += static_cast<double>(step.runs.store_runs);
    }
    Rates result{median_rate(loads_alone, true, false, block_bytes / 1e9),
                 median_rate(stores_alone, false, true, block_bytes / 1e9),
                 median_rate(both_at_once, true, true, block_bytes / 1e9),
                 load_runs > 0 ? load_blocks / load_runs : 0,
                 store_runs > 0 ? store_blocks / store_runs : 0,
                 median_rate(loads_alone, true, false, block_tokens),
                 median_rate(stores_alone, false, true, block_tokens)};
    std::vector<double> mix_gbps;
    std::vector<double> of_mix;
    for (const StepResult& step : both_at_once) {
      const double load_bytes = static_cast<double>(step.loaded) * block_bytes;
      const double store_bytes = static_cast<double>(step.stored) * block_bytes;
      const double floor = mix_ceiling_seconds(load_bytes, store_bytes, ceilings.h2d, ceilings.d2h,
                                               ceilings.both);
      mix_gbps.push_back((load_bytes + store_bytes) / floor / 1e9);
      of_mix.push_back(floor / step.seconds);
    }
    result.both_mix_ceiling = median(mix_gbps);
    result.both_of_mix_ceiling = median(of_mix);
    result.both_load_share = load_blocks + store_blocks > 0
                                 ? load_blocks / (load_blocks + store_blocks) : 0;
    const std::vector<StepResult>* ways[] = {&loads_alone, &stores_alone, &both_at_once};
    for (std::size_t way = 0; way < 3; ++way) {
      for (std::size_t phase = 0; phase < kPhaseCount; ++phase) {
        std::vector<double> values;
        for (const StepResult& step : *ways[way]) values.push_back(step.phases[phase] * 1e3);
        result.phases_ms[way][phase] = median(values);
      }
    }
    return result;
  }
};

// One scenario on each rig, their samples taking turns (one rig's loads, stores and both, then the
// next rig's, `repeats` times): a slow spell of the machine falls on all of them alike, so their
// ratios (int8 against exact) hold.
std::vector<Rates> measure_together(const std::vector<EngineRig*>& rigs, int repeats,
                                    Scenario scenario, const Ceilings& ceilings) {
  for (EngineRig* rig : rigs) rig->begin(scenario);
  for (int i = 0; i < repeats; ++i) {
    for (EngineRig* rig : rigs) rig->sample();
  }
  std::vector<Rates> rates;
  for (const EngineRig* rig : rigs) rates.push_back(rig->rates(ceilings));
  return rates;
}

std::string number(double value) {
  char text[64];
  std::snprintf(text, sizeof text, "%.2f", value);
  return text;
}

std::string number3(double value) {
  char text[64];
  std::snprintf(text, sizeof text, "%.3f", value);
  return text;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const std::size_t pool_bytes = (argc > 1 ? std::stoul(argv[1]) : 4) * kGiB;
    const std::size_t moved = (argc > 2 ? std::stoul(argv[2]) : 1) * kGiB;
    const int repeats = argc > 3 ? std::stoi(argv[3]) : 5;
    // Engine steps of each kind per figure (its median): int8 against exact near 1.8 moved by
    // 0.1-0.3 between runs of one wheel with 5 (an H100, the Python bench's 64 KiB request rows).
    const int engine_repeats = 3 * repeats;

    cudaDeviceProp properties{};
    check(cudaGetDeviceProperties(&properties, 0), "cudaGetDeviceProperties");
    cudaStream_t stream = nullptr;
    check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
    std::mt19937_64 random(1);

    std::string rows;
    const auto row = [&](std::size_t block, const char* method, Ways ways) {
      rows += std::string(rows.empty() ? "" : ",\n    ") + "{\"block_bytes\": " +
              std::to_string(block) + ", \"method\": \"" + method + "\", \"h2d_gbps\": " +
              number(ways.h2d) + ", \"d2h_gbps\": " + number(ways.d2h) + "}";
      std::fprintf(stderr, "%8zu KiB  %-28s H2D %7.2f GB/s  D2H %7.2f GB/s\n", block / kKiB,
                   method, ways.h2d, ways.d2h);
    };

    int processors = 0;
    check(cudaDeviceGetAttribute(&processors, cudaDevAttrMultiProcessorCount, 0), "attribute");
    // The plain kernels and the bulk copy kernel, launched as the engine launches them.
    const BusLaunch plain{static_cast<std::uint32_t>(2 * processors)};
    const bool has_bulk = properties.major >= 9;
    const BusLaunch bulk{plain.max_blocks, AKV_BULK_PIECE, AKV_BULK_STAGES,
                         static_cast<std::uint32_t>(processors)};
    cudaStream_t other = nullptr;
    check(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking), "cudaStreamCreate");

    Ways ceiling{};
    double ceiling_both = 0;
    // Loads and stores at once, raw, by block size: the plain kernels, the bulk copy kernel and
    // per-layer batches.
    struct RawBoth {
      double kernels;
      double bulk;
      double batches;
    };
    std::unordered_map<std::size_t, RawBoth> raw_both;
    {
      PinnedBuffer pool(pool_bytes);
      DeviceBuffer device(2 * moved);  // loads into the first half, stores from the second
      std::memset(pool.data, 0x5A, pool_bytes);  // touch every page before timing
      std::uint8_t* const second = static_cast<std::uint8_t*>(device.data) + moved;
      std::uint8_t* const pool_second = static_cast<std::uint8_t*>(pool.data) + moved;
      ceiling = per_block_memcpy(Scatter{{pool.data}, {device.data}, moved}, stream, repeats);
      ceiling_both = both_ways(
          2 * moved, stream, other, repeats,
          [&] {
            check(cudaMemcpyAsync(device.data, pool.data, moved, cudaMemcpyHostToDevice, stream),
                  "copy");
          },
          [&] {
            check(cudaMemcpyAsync(pool_second, second, moved, cudaMemcpyDeviceToHost, other),
                  "copy");
          });
      std::fprintf(stderr,
                   "ceiling (contiguous %zu GiB): H2D %.2f GB/s  D2H %.2f GB/s  both ways %.2f GB/s\n",
                   moved / kGiB, ceiling.h2d, ceiling.d2h, ceiling_both);
      for (const std::size_t block : kBlockSizes) {
        const Scatter s = scatter(pool.data, pool_bytes, device.data, moved, block, random);
        row(block, "per-block cudaMemcpyAsync", per_block_memcpy(s, stream, repeats));
        row(block, "cudaMemcpyBatchAsync", batch_memcpy(s, 1, stream, repeats));
        row(block, "cudaMemcpyBatchAsync per layer", batch_memcpy(s, kLayers, stream, repeats));
        const KernelPlan loads(s, pool.data);
        row(block, "staging kernels", kernels_one_way(loads, plain, stream, repeats));
        if (has_bulk) row(block, "bulk copy kernel", kernels_one_way(loads, bulk, stream, repeats));
        // Half the bytes each way, from other slots into other device blocks.
        const Scatter in = scatter(pool.data, pool_bytes, device.data, moved / 2, block, random);
        const Scatter out = scatter(pool.data, pool_bytes, second, moved / 2, block, random);
        const KernelPlan kernel_in(in, pool.data);
        const KernelPlan kernel_out(out, pool.data);
        const RawBoth both{
            kernels_both_ways(kernel_in, kernel_out, plain, stream, other, repeats),
            has_bulk ? kernels_both_ways(kernel_in, kernel_out, bulk, stream, other, repeats) : 0,
            batch_both_ways(in, out, stream, other, repeats)};
        raw_both[block] = both;
        std::fprintf(stderr,
                     "%8zu KiB  both ways: kernels %.2f GB/s  bulk %.2f GB/s  per-layer batches "
                     "%.2f GB/s\n",
                     block / kKiB, both.kernels, both.bulk, both.batches);
        // The bulk plan's neighbourhood (ACTIVEKV_BENCH_BULK_SWEEP=1): piece, stages in flight
        // per thread block, thread blocks per SM (1/2, 1, 2).
        if (has_bulk && block <= 64 * kKiB && std::getenv("ACTIVEKV_BENCH_BULK_SWEEP") != nullptr) {
          for (const std::uint32_t piece : {8 * 1024u, 16 * 1024u, 32 * 1024u}) {
            for (const std::uint32_t stages : {2u, 4u, 8u}) {
              for (const std::uint32_t halves_per_sm : {1u, 2u, 4u}) {
                if (piece > block || piece * stages > 200 * 1024u) continue;
                const BusLaunch swept{plain.max_blocks, piece, stages,
                                      halves_per_sm * static_cast<std::uint32_t>(processors) / 2};
                const Ways one = kernels_one_way(kernel_in, swept, stream, repeats);
                std::fprintf(stderr,
                             "%8zu KiB  bulk piece %2u KiB x %u stages, %.1f/SM: H2D %.2f  D2H "
                             "%.2f  both ways %.2f GB/s\n",
                             block / kKiB, piece / 1024, stages, halves_per_sm / 2.0, one.h2d, one.d2h,
                             kernels_both_ways(kernel_in, kernel_out, swept, stream, other, repeats));
              }
            }
          }
        }
        if (block <= 128 * kKiB && std::getenv("ACTIVEKV_BENCH_BOUNCE") != nullptr) {
          std::vector<std::unique_ptr<BounceLane>> lanes;
          for (int i = 0; i < 16; ++i) lanes.push_back(std::make_unique<BounceLane>());
          for (const std::size_t threads : {1u, 2u, 4u, 8u}) {
            std::fprintf(stderr,
                         "%8zu KiB  bounce chunks, %zu host thread(s) per direction: H2D %.2f  "
                         "D2H %.2f  both ways %.2f GB/s\n",
                         block / kKiB, threads, bounce(&s, nullptr, lanes, threads, repeats),
                         bounce(nullptr, &s, lanes, threads, repeats),
                         bounce(&in, &out, lanes, threads, repeats));
          }
        }
        // Runs of consecutive slots, alone and beside the bulk copy kernel moving the other way
        // (SM-driven and copy-engine traffic on the bus at once).
        if (block <= 128 * kKiB && std::getenv("ACTIVEKV_BENCH_RUNS") != nullptr) {
          const std::size_t half = moved / 2;
          void* const loads_from = pool.data;
          void* const stores_to = static_cast<std::uint8_t*>(pool.data) + half;
          const auto runs = [&](bool loading, cudaStream_t on) {
            enqueue_runs(loading ? loads_from : stores_to, loading ? device.data : second, block,
                         half, loading, on);
          };
          const auto one_way = [&](bool loading) {
            return gbps(half, median_seconds(repeats, [&] {
                          runs(loading, stream);
                          check(cudaStreamSynchronize(stream), "sync");
                        }));
          };
          std::fprintf(stderr,
                       "%8zu KiB  runs of consecutive slots, one pitched copy per layer: H2D "
                       "%.2f  D2H %.2f  both ways %.2f GB/s\n",
                       block / kKiB, one_way(true), one_way(false),
                       both_ways(moved, stream, other, repeats, [&] { runs(true, stream); },
                                 [&] { runs(false, other); }));
          if (has_bulk) {
            std::fprintf(
                stderr,
                "%8zu KiB  bulk copy kernel loads + run stores: %.2f GB/s; run loads + bulk "
                "copy kernel stores: %.2f GB/s\n",
                block / kKiB,
                both_ways(moved, stream, other, repeats, [&] { kernel_in.launch(true, bulk, stream); },
                          [&] { runs(false, other); }),
                both_ways(moved, stream, other, repeats, [&] { runs(true, stream); },
                          [&] { kernel_out.launch(false, bulk, other); }));
          }
        }
      }
    }

    // The path the rule picks for a layer of `blocks` blocks in runs of `per_run` on average.
    const auto picked = [](const KvBlockLayout& layout, CompressionMode mode,
                           activekv::offload::Direction direction, double blocks, double per_run) {
      const auto runs = static_cast<std::size_t>(per_run > 0 ? blocks / per_run + 0.5 : 0);
      return std::string(transfer_path_name(choose_transfer_path(
          layout, mode, direction, {static_cast<std::size_t>(blocks), runs, true, true})));
    };
    const auto bus = [&](const KvBlockLayout& layout, CompressionMode mode, const Rates& rates,
                         double blocks) {
      const std::string load =
          picked(layout, mode, activekv::offload::Direction::load, blocks, rates.load_run);
      const std::string store =
          picked(layout, mode, activekv::offload::Direction::store, blocks, rates.store_run);
      return load == store ? load : "loads: " + load + ", stores: " + store;
    };
    // Forced paths (ACTIVEKV_CUDA_TRANSFER_PATH) beside the rule, so the thresholds can be chosen
    // from this one run; ACTIVEKV_BENCH_PATHS=0 leaves them out, a comma-separated list picks.
    const char* const paths_setting = std::getenv("ACTIVEKV_BENCH_PATHS");
    std::vector<std::string> forced_paths{"kernels", "block-copies", "runs", "runs-staged",
                                          "runs-batched"};
    if (paths_setting != nullptr) {
      forced_paths.clear();
      std::string list = paths_setting;
      for (std::size_t at = 0; at <= list.size();) {
        const std::size_t comma = std::min(list.find(',', at), list.size());
        const std::string name = list.substr(at, comma - at);
        if (!name.empty() && name != "0") forced_paths.push_back(name);
        at = comma + 1;
      }
    }
    const bool forced_rows = !forced_paths.empty();
    std::string overlapped;
    std::string compressed;
    std::string scenarios;
    std::string ratios;
    std::string phases;
    const Ceilings ceilings{ceiling.h2d, ceiling.d2h, ceiling_both};
    const auto started = std::chrono::steady_clock::now();
    const auto elapsed = [&] {
      return std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    };
    // One scenario row: GB/s and the fraction of the same run's ceiling.
    const auto scenario_row = [&](std::size_t block, const char* scenario, const std::string& path,
                                  const std::string& picks, const Rates& r) {
      scenarios += std::string(scenarios.empty() ? "" : ",\n    ") + "{\"block_bytes\": " +
                   std::to_string(block) + ", \"scenario\": \"" + scenario + "\", \"path\": \"" +
                   path + "\", \"bus\": \"" + picks + "\", \"load_gbps\": " + number(r.load) +
                   ", \"store_gbps\": " + number(r.store) + ", \"both_ways_gbps\": " +
                   number(r.both) + ", \"load_of_ceiling\": " + number(r.load / ceiling.h2d) +
                   ", \"store_of_ceiling\": " + number(r.store / ceiling.d2h) +
                   ", \"both_ways_of_ceiling\": " + number(r.both / ceiling_both) +
                   ", \"both_ways_mix_ceiling_gbps\": " + number(r.both_mix_ceiling) +
                   ", \"both_ways_of_mix_ceiling\": " + number3(r.both_of_mix_ceiling) +
                   ", \"both_ways_load_share\": " + number3(r.both_load_share) +
                   ", \"load_blocks_per_run\": " + number(r.load_run) +
                   ", \"store_blocks_per_run\": " + number(r.store_run) + "}";
      std::fprintf(stderr,
                   "%8zu KiB  %-8s %-12s load %6.2f (%.2f)  store %6.2f (%.2f)  both %6.2f (%.2f; "
                   "%.3f of its mix ceiling %.2f, loads %.0f%%) GB/s (of ceiling)  blocks/run "
                   "%.1f / %.1f  [%s]  t=%.0fs\n",
                   block / kKiB, scenario, path.c_str(), r.load, r.load / ceiling.h2d, r.store,
                   r.store / ceiling.d2h, r.both, r.both / ceiling_both, r.both_of_mix_ceiling,
                   r.both_mix_ceiling, 100 * r.both_load_share, r.load_run, r.store_run,
                   picks.c_str(), elapsed());
    };
    // Where a step's time went (kPhases, median ms), per way, for one scenario and mode.
    const auto phase_row = [&](std::size_t block, const char* scenario, const char* mode,
                               const std::string& path, const Rates& r) {
      const char* const way_names[] = {"load", "store", "both"};
      std::string text = "{\"block_bytes\": " + std::to_string(block) + ", \"scenario\": \"" +
                         scenario + "\", \"mode\": \"" + mode + "\", \"path\": \"" + path + "\"";
      for (std::size_t way = 0; way < 3; ++way) {
        text += std::string(", \"") + way_names[way] + "\": {";
        for (std::size_t phase = 0; phase < kPhaseCount; ++phase) {
          text += std::string(phase ? ", " : "") + "\"" + kPhases[phase] +
                  "\": " + number3(r.phases_ms[way][phase]);
        }
        text += "}";
      }
      phases += std::string(phases.empty() ? "" : ",\n    ") + text + "}";
      std::fprintf(stderr, "%8zu KiB  %-8s %-5s both: ", block / kKiB, scenario, mode);
      for (std::size_t phase = 0; phase < kPhaseCount; ++phase) {
        std::fprintf(stderr, "%s %.3f  ", kPhases[phase], r.phases_ms[2][phase]);
      }
      std::fprintf(stderr, "ms\n");
    };
    for (const std::size_t block : kBlockSizes) {
      // block = K + V of one layer: tokens * 2 * (heads * head_dim * 2 bytes).
      const auto tokens = static_cast<std::uint32_t>(block / (2 * kHeads * kHeadDim * 2));
      const std::size_t blocks = moved / (block * kLayers);
      const auto per_step = static_cast<double>(blocks);
      {
        // Exact and int8 side by side, their steps taking turns (measure_together); requests
        // first: the random loads' refreshes would leave the pool scrambled for them.
        EngineRig exact(tokens, CompressionMode::exact, pool_bytes, blocks, nullptr);
        EngineRig int8(tokens, CompressionMode::int8, pool_bytes, blocks, nullptr);
        const std::vector<Rates> by_requests =
            measure_together({&exact, &int8}, engine_repeats, Scenario::requests, ceilings);
        const std::vector<Rates> by_pressure =
            measure_together({&exact, &int8}, engine_repeats, Scenario::pressure, ceilings);
        const std::vector<Rates> by_random =
            measure_together({&exact, &int8}, engine_repeats, Scenario::random, ceilings);
        const Rates& exact_pressure = by_pressure[0];
        const Rates& int8_pressure = by_pressure[1];
        const Rates& exact_requests = by_requests[0];
        const Rates& int8_requests = by_requests[1];
        const Rates& exact_random = by_random[0];
        const Rates& int8_random = by_random[1];
        const std::string random_bus = bus(exact.layout, CompressionMode::exact, exact_random, per_step);
        row(block, "engine", {exact_random.load, exact_random.store});
        overlapped += std::string(overlapped.empty() ? "" : ",\n    ") + "{\"block_bytes\": " +
                      std::to_string(block) + ", \"bus\": \"" + random_bus +
                      "\", \"engine_both_ways_gbps\": " + number(exact_random.both) +
                      ", \"kernels_both_ways_gbps\": " + number(raw_both.at(block).kernels) +
                      ", \"bulk_both_ways_gbps\": " + number(raw_both.at(block).bulk) +
                      ", \"batches_both_ways_gbps\": " + number(raw_both.at(block).batches) +
                      "}";
        scenario_row(block, "random", "auto", random_bus, exact_random);
        scenario_row(block, "requests", "auto",
                     bus(exact.layout, CompressionMode::exact, exact_requests, per_step),
                     exact_requests);
        scenario_row(block, "pressure", "auto",
                     bus(exact.layout, CompressionMode::exact, exact_pressure, per_step),
                     exact_pressure);
        for (const Scenario kind : {Scenario::requests, Scenario::pressure, Scenario::random}) {
          const std::vector<Rates>& by = kind == Scenario::requests   ? by_requests
                                         : kind == Scenario::pressure ? by_pressure
                                                                      : by_random;
          phase_row(block, scenario_name(kind), "exact", "auto", by[0]);
          phase_row(block, scenario_name(kind), "int8", "auto", by[1]);
        }
        const std::string int8_random_bus = bus(int8.layout, CompressionMode::int8, int8_random, per_step);
        const double load_ratio = int8_random.load_tokens / exact_random.load_tokens;
        const double store_ratio = int8_random.store_tokens / exact_random.store_tokens;
        compressed += std::string(compressed.empty() ? "" : ",\n    ") + "{\"block_bytes\": " +
                      std::to_string(block) + ", \"bus\": \"" + int8_random_bus +
                      "\", \"exact_load_tokens_per_s\": " + number(exact_random.load_tokens) +
                      ", \"int8_load_tokens_per_s\": " + number(int8_random.load_tokens) +
                      ", \"int8_over_exact_load\": " + number(load_ratio) +
                      ", \"int8_over_exact_store\": " + number(store_ratio) + "}";
        const auto ratio_row = [&](const char* scenario, const Rates& exact_rates,
                                   const Rates& int8_rates, const std::string& picks) {
          const double load = int8_rates.load_tokens / exact_rates.load_tokens;
          const double store = int8_rates.store_tokens / exact_rates.store_tokens;
          ratios += std::string(ratios.empty() ? "" : ",\n    ") + "{\"block_bytes\": " +
                    std::to_string(block) + ", \"scenario\": \"" + scenario + "\", \"bus\": \"" +
                    picks + "\", \"int8_over_exact_load\": " + number(load) +
                    ", \"int8_over_exact_store\": " + number(store) + "}";
          std::fprintf(stderr,
                       "%8zu KiB  %-8s int8 / exact tokens/s: load %.2fx  store %.2fx  [%s]  t=%.0fs\n",
                       block / kKiB, scenario, load, store, picks.c_str(), elapsed());
        };
        ratio_row("random", exact_random, int8_random, int8_random_bus);
        ratio_row("requests", exact_requests, int8_requests,
                  bus(int8.layout, CompressionMode::int8, int8_requests, per_step));
        ratio_row("pressure", exact_pressure, int8_pressure,
                  bus(int8.layout, CompressionMode::int8, int8_pressure, per_step));
      }
      if (!forced_rows) continue;
      for (const std::string& name : forced_paths) {
        const char* const path = name.c_str();
        EngineRig forced(tokens, CompressionMode::exact, pool_bytes, blocks, path);
        const Rates request_rates =
            measure_together({&forced}, engine_repeats, Scenario::requests, ceilings)[0];
        const Rates pressure_rates =
            measure_together({&forced}, engine_repeats, Scenario::pressure, ceilings)[0];
        const Rates random_rates =
            measure_together({&forced}, engine_repeats, Scenario::random, ceilings)[0];
        scenario_row(block, "random", path, path, random_rates);
        scenario_row(block, "requests", path, path, request_rates);
        scenario_row(block, "pressure", path, path, pressure_rates);
      }
    }
    cudaStreamDestroy(stream);
    cudaStreamDestroy(other);

    std::printf(
        "{\n  \"gpu\": \"%s\",\n  \"pool_bytes\": %zu,\n  \"moved_bytes\": %zu,\n"
        "  \"layers\": %u,\n  \"repeats\": %d,\n  \"engine_repeats\": %d,\n  \"device_blocks\": \"%s\",\n"
        "  \"ceiling_gbps\": {\"h2d\": %s, \"d2h\": %s},\n  \"both_ways_ceiling_gbps\": %s,\n"
        "  \"rows\": [\n    %s\n  ],\n"
        "  \"overlapped\": [\n    %s\n  ],\n  \"int8_vs_exact\": [\n    %s\n  ],\n"
        "  \"scenarios\": [\n    %s\n  ],\n  \"int8_vs_exact_by_scenario\": [\n    %s\n  ],\n"
        "  \"phases_ms\": [\n    %s\n  ]\n}\n",
        properties.name, pool_bytes, moved, kLayers, repeats, engine_repeats,
        device_blocks_in_order() ? "in order" : "shuffled", number(ceiling.h2d).c_str(),
        number(ceiling.d2h).c_str(), number(ceiling_both).c_str(), rows.c_str(),
        overlapped.c_str(), compressed.c_str(), scenarios.c_str(), ratios.c_str(),
        phases.c_str());
    return 0;
  } catch (const std::exception& error) {
    std::fprintf(stderr, "staging bench: %s\n", error.what());
    return 1;
  }
}
