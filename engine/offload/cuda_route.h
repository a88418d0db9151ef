// The CUDA route of the engine (SPEC.md §4 "CUDA route"): the host pool pinned and mapped at
// construction (warm-up), one layer of a lease moved by one kernel launch, one batch of copies,
// or one pitched copy per run of consecutive slots (TransferPath) on streams the engine owns
// (loads and stores on separate streams), and each region's fence a CUDA event.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <stdexcept>
#include <vector>

#include "offload/compression.h"
#include "offload/kv_layout.h"
#include "offload/staging.h"

namespace activekv::offload {

// A CUDA call failed (no device, no driver, out of pinned memory...): the message names the call
// and the runtime's error string. Python: RuntimeError.
class CudaRouteError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A CUDA allocation or pinning sized by an engine argument ran out of memory (cudaHostRegister of
// the pool, a region's buffers): the message names the argument, what was asked and the runtime's
// answer. The engine raises it as EngineInputError.
class CudaAllocationError : public CudaRouteError {
 public:
  using CudaRouteError::CudaRouteError;
};

// What a fence query answered, as the engine reads it: cudaSuccess is signalled, cudaErrorNotReady
// is still pending, and every other answer makes the outcome unknown (the region is quarantined).
enum class FenceQuery : std::uint8_t { signalled, pending, unknown };
FenceQuery classify_fence_query(int cuda_status);

// Whether the route moves this layout's blocks across PCIe in `direction` on the copy engines
// rather than through the staging kernels: copies of 128 KiB or more (compressed stores: 256 KiB
// or more). SPEC.md §4; the measurements are in cuda_route.cpp.
bool crosses_on_copy_engines(const KvBlockLayout& layout, CompressionMode mode,
                             Direction direction);

// How one layer of a lease crosses PCIe (SPEC.md §4, "The CUDA route"):
//   kernels       the zero-copy staging kernels over the mapped pool (bulk copy kernel where it
//                 can, else the plain kernels), one launch;
//   block_copies  one cudaMemcpyBatchAsync of one copy per block (K and V apart in exact mode);
//   runs          one pitched copy per run of consecutive slots between the pool and the region's
//                 device staging buffer, a kernel scattering (gathering) the device blocks, and
//                 runs whose device blocks are consecutive too copied directly, no staging;
//   runs_staged   runs, never directly (for the benchmark: the staging's own cost);
//   runs_batched  runs, the layer's pitched copies submitted as one cudaMemcpy3DBatchAsync.
enum class TransferPath : std::uint8_t { kernels, block_copies, runs, runs_staged, runs_batched };
constexpr std::size_t kTransferPaths = 5;
const char* transfer_path_name(TransferPath path);

// What a route has issued since construction: the layers each path moved, per direction
// (indexed by TransferPath), and the runs that crossed directly or through the staging buffer.
// Which path really ran, for tests and the benchmark (a forced path the layer cannot take falls
// back to the rule).
struct RouteCounts {
  std::array<std::size_t, kTransferPaths> load_layers{};
  std::array<std::size_t, kTransferPaths> store_layers{};
  std::size_t direct_runs = 0;
  std::size_t staged_runs = 0;
};

// What a layer looks like to the path rule: its blocks, the runs of its transfer list, whether
// the device KV holds each block's K (and V) as one contiguous run, whether runs can cross at all
// (the route has a staging buffer).
struct LayerTransfer {
  std::size_t blocks = 0;
  std::size_t runs = 0;
  bool contiguous = true;
  bool runs_possible = true;
};

// The rule the route applies per layer (thresholds in cuda_route.cpp, one place): where
// crosses_on_copy_engines and each block's K (and V) is contiguous in the device KV, run copies
// once the mean run holds two blocks or more, else per-block copies; elsewhere run copies once
// the mean run holds 128 KiB (loads) or 256 KiB (stores), else the kernels. The rule's runs are batched (runs_batched). `forced` (the
// benchmark's ACTIVEKV_CUDA_TRANSFER_PATH) wins wherever that path can move the layer at all.
TransferPath choose_transfer_path(const KvBlockLayout& layout, CompressionMode mode,
                                  Direction direction, const LayerTransfer& layer,
                                  std::optional<TransferPath> forced = std::nullopt);

// The benchmark's knob, read once per route at construction: ACTIVEKV_CUDA_TRANSFER_PATH unset,
// empty or "auto" is the rule; "kernels", "block-copies", "runs", "runs-staged" or "runs-batched"
// forces that path
// (CudaRouteError for anything else). Not for serving: the rule is what is measured and tuned.
std::optional<TransferPath> transfer_path_override();

class CudaRoute {
 public:
  // Pins and maps `pool` (page-aligned, `num_slots` slots in layer planes: SPEC.md §2) and makes
  // the streams, events and the regions' transfer lists: everything the route will ever
  // allocate. Where each layer's device KV is comes with each transfer (issue).
  CudaRoute(const KvBlockLayout& layout, CompressionMode mode, std::uint8_t* pool,
            std::size_t num_slots, std::size_t num_regions, std::size_t region_blocks);
  ~CudaRoute();
  CudaRoute(const CudaRoute&) = delete;
  // The CUDA device current at construction: every later call of the route runs on it.
  int device() const;
  CudaRoute& operator=(const CudaRoute&) = delete;

  // Enqueues one layer of a lease on the load (Direction::load) or store stream and records the
  // region's fence behind it. A store first waits for the work enqueued so far on
  // `compute_stream` (a cudaStream_t; null is the legacy default stream): the layer's KV is
  // final only once the forward has written it. A CUDA call that fails here leaves the lease's
  // outcome unknown, as a failed fence query would: the direction's streams are drained, so
  // nothing of it is left running, and observe answers unknown.
  void issue(Direction direction, std::size_t region, std::uint32_t layer,
             const std::vector<BlockTransfer>& transfers, const DeviceKvLayer& device_kv,
             void* compute_stream);

  // Waits for the region's fence: signalled, or unknown when the issue failed, when the query
  // answers anything but success or not-ready, or is still not ready after the timeout.
  // `injected` (tests and traces) stands for a failed query (cudaErrorLaunchFailure) and goes
  // through the same reading. After an unknown outcome the direction's streams are drained, so
  // nothing of the lost lease can still write into memory the engine hands on.
  FenceOutcome observe(Direction direction, std::size_t region, bool injected);

  RouteCounts counts() const;

 private:
  struct Resources;
  void enqueue(Direction direction, std::size_t region, std::uint32_t layer,
               const std::vector<BlockTransfer>& transfers, const DeviceKvLayer& device_kv,
               void* compute_stream);

  std::unique_ptr<Resources> resources_;
};

// Device KV of the wheel's own, for a runner that holds no framework (the GPU gates run with the
// standard library and the wheel): one zeroed buffer per layer of [2, num_device_blocks,
// block_size, num_kv_heads, head_dim] words, allocated on the current device at construction
// (warm-up), so the steps that use it allocate nothing.
class DeviceKvCache {
 public:
  DeviceKvCache(const KvBlockLayout& layout, std::size_t num_device_blocks);
  ~DeviceKvCache();
  DeviceKvCache(const DeviceKvCache&) = delete;
  DeviceKvCache& operator=(const DeviceKvCache&) = delete;

  const KvBlockLayout& layout() const { return layout_; }
  std::size_t num_device_blocks() const { return num_device_blocks_; }
  int device() const { return device_; }
  std::size_t num_layers() const;
  std::size_t layer_bytes() const { return layer_bytes_; }
  void* layer(std::size_t index) const;
  // Synchronous copies of one whole layer (bytes must be layer_bytes()); CudaRouteError names
  // the call that failed, std::out_of_range a layer past the last.
  void upload(std::size_t index, const void* host, std::size_t bytes);
  void download(std::size_t index, void* host, std::size_t bytes) const;

 private:
  struct Buffers;
  KvBlockLayout layout_;
  std::size_t num_device_blocks_;
  int device_ = 0;
  std::size_t layer_bytes_ = 0;
  std::unique_ptr<Buffers> buffers_;
};

}  // namespace activekv::offload
