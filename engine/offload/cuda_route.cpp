#include "offload/cuda_route.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>

#include "cuda/staging.h"
#include "offload/transfer_runs.h"

namespace activekv::offload {

namespace {

void check(cudaError_t status, const char* call) {
  if (status != cudaSuccess) {
    cudaGetLastError();  // a non-sticky error must not surface again at the next call
    throw CudaRouteError(std::string("CUDA route: ") + call + ": " + cudaGetErrorString(status));
  }
}

// check() for a call that allocates or pins memory sized by an engine argument: out of memory is
// that argument's fault (CudaAllocationError naming it, what was asked and the runtime's answer);
// any other failure is the device's.
void check_allocation(cudaError_t status, const char* call, const char* argument,
                      const std::string& asked) {
  if (status == cudaErrorMemoryAllocation) {
    cudaGetLastError();
    throw CudaAllocationError(std::string(argument) + ": cannot " + asked + " (" + call + ": " +
                              cudaGetErrorString(status) + ")");
  }
  check(status, call);
}

std::string bytes_of(std::size_t bytes, const char* memory) {
  return std::to_string(bytes) + " bytes of " + memory;
}

// How long a fence (or a drain after a lost one) may stay not-ready before it counts as unknown:
// far past any copy of one layer (a 1 GiB layer at PCIe speed takes ~20 ms), and a bound, so a
// hung kernel makes a quarantined region, never a hung engine.
constexpr std::chrono::seconds kFenceTimeout{10};

// Polls `ready` (a CUDA query) until it answers anything but not-ready, or the timeout passes.
template <typename Query>
cudaError_t wait_bounded(Query&& ready) {
  const auto deadline = std::chrono::steady_clock::now() + kFenceTimeout;
  cudaError_t status = ready();
  while (status == cudaErrorNotReady && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::yield();
    status = ready();
  }
  return status;
}

int current_device() {
  int device = 0;
  check(cudaGetDevice(&device), "cudaGetDevice");
  return device;
}

// Makes `device` current for the scope (the caller's thread may have another one current).
class DeviceScope {
 public:
  explicit DeviceScope(int device) {
    if (cudaGetDevice(&previous_) == cudaSuccess && previous_ != device) {
      check(cudaSetDevice(device), "cudaSetDevice");
      switched_ = true;
    }
  }
  ~DeviceScope() {
    if (switched_) cudaSetDevice(previous_);
  }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int previous_ = 0;
  bool switched_ = false;
};

int kernel_mode(CompressionMode mode) {
  switch (mode) {
    case CompressionMode::exact:
      return AKV_MODE_EXACT;
    case CompressionMode::int8:
      return AKV_MODE_INT8;
    case CompressionMode::fp8_e4m3:
      return AKV_MODE_FP8_E4M3;
  }
  throw CudaRouteError("CUDA route: unknown compression mode");
}

int kernel_dtype(KvDtype dtype) {
  switch (dtype) {
    case KvDtype::fp16:
      return AKV_DTYPE_FP16;
    case KvDtype::bf16:
      return AKV_DTYPE_BF16;
    case KvDtype::fp32:
      return AKV_DTYPE_FP32;
  }
  throw CudaRouteError("CUDA route: unknown dtype");
}

// RAII owners of the route's CUDA objects; each releases what it holds, never throws.
struct Stream {
  cudaStream_t handle = nullptr;
  explicit Stream(int priority = 0) {
    check(cudaStreamCreateWithPriority(&handle, cudaStreamNonBlocking, priority), "cudaStreamCreate");
  }
  // Drained first (the pool is unregistered after the streams go), but bounded: a hung kernel
  // must not hang the engine's destruction.
  ~Stream() {
    if (handle != nullptr) {
      wait_bounded([this] { return cudaStreamQuery(handle); });
      cudaStreamDestroy(handle);
    }
  }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
};

struct Event {
  cudaEvent_t handle = nullptr;
  Event() { check(cudaEventCreateWithFlags(&handle, cudaEventDisableTiming), "cudaEventCreate"); }
  ~Event() {
    if (handle != nullptr) cudaEventDestroy(handle);
  }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
};

// Pinned host memory of the route's own (a region's transfer list, as the CPU writes it), sized
// by the engine argument `argument`.
struct PinnedBuffer {
  void* data = nullptr;
  PinnedBuffer(std::size_t bytes, const char* argument) {
    check_allocation(cudaHostAlloc(&data, bytes, 0), "cudaHostAlloc", argument,
                     "allocate " + bytes_of(bytes, "pinned host memory"));
  }
  ~PinnedBuffer() {
    if (data != nullptr) cudaFreeHost(data);
  }
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
};

// Device memory of the route's own (a region's transfer list as the kernels read it, and its
// staging buffer: compressed modes' stored layers, exact mode's staged runs), sized by the engine
// argument `argument`.
struct DeviceBuffer {
  void* data = nullptr;
  DeviceBuffer(std::size_t bytes, const char* argument) {
    if (bytes > 0) {
      check_allocation(cudaMalloc(&data, bytes), "cudaMalloc", argument,
                       "allocate " + bytes_of(bytes, "device memory"));
    }
  }
  ~DeviceBuffer() {
    if (data != nullptr) cudaFree(data);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
};

// The engine's host pool, pinned and mapped for as long as the route lives.
struct PinnedRegistration {
  void* host;
  void* device = nullptr;
  PinnedRegistration(void* pool, std::size_t bytes) : host(pool) {
    check_allocation(
        cudaHostRegister(pool, bytes, cudaHostRegisterMapped | cudaHostRegisterPortable),
        "cudaHostRegister", "capacity_bytes", "pin " + bytes_of(bytes, "host memory (the pool)"));
    const cudaError_t status = cudaHostGetDevicePointer(&device, pool, 0);
    if (status != cudaSuccess) {
      cudaHostUnregister(pool);
      check(status, "cudaHostGetDevicePointer");
    }
  }
  ~PinnedRegistration() { cudaHostUnregister(host); }
  PinnedRegistration(const PinnedRegistration&) = delete;
  PinnedRegistration& operator=(const PinnedRegistration&) = delete;
};

struct Region {
  Event fence;
  // The staged layer of a lease in device memory (compressed modes' stored layers, exact mode's
  // staged runs), and the event that hands it between the bus and codec streams.
  Event handed_over;
  // Set when a CUDA call of the lease's issue failed: its outcome is unknown (observe).
  bool issue_failed = false;
  // The lease's transfer list: written here, copied to the device when it changes (a lease's
  // layers share one list). Kernels read it from device memory: read through the mapping, every
  // thread block would first wait one PCIe round trip, which made the codec latency-bound.
  PinnedBuffer listed;
  DeviceBuffer transfers;
  std::size_t listed_count = 0;
  DeviceBuffer staged;
  Region(std::size_t blocks, std::size_t staged_bytes)
      : listed(blocks * sizeof(akv_transfer), "region_blocks"),
        transfers(blocks * sizeof(akv_transfer), "region_blocks"),
        staged(staged_bytes, "region_blocks") {}
};

// Copies at least this large cross PCIe faster on the copy engines (one cudaMemcpyBatchAsync per
// layer) than through the staging kernels, alone and above all with loads and stores at once.
// Measured on an H200 (tests/gpu/staging_bench.cpp, per-layer batch rows): 128 KiB copies,
// 54 / 51 GB/s alone and 80-83 GB/s both ways, against 51 / 52 and 62-73 for the kernels; 64 KiB
// copies, 59-72 GB/s both ways, no better than the kernels; smaller ones far worse (a copy engine
// pays microseconds per copy).
constexpr std::size_t kCopyEngineMinBytes = std::size_t{128} << 10;
// Compressed stores (encode, then the copy) are the exception: with 132 KiB stored layers, int8
// stores reached 1.70-1.71x exact's tokens/s on the copy engines against 1.80x through the
// kernels; with 528 KiB ones 1.84-1.85x against 1.81x (same bench, engine rows, two runs).
constexpr std::size_t kCompressedStoreCopyEngineMinBytes = std::size_t{256} << 10;
// Runs of consecutive slots (SPEC.md §4): each run crosses as one linear copy (its span of the
// layer's plane of the pool), so the copy engines' cost per copy is paid per run, and a layer's
// runs take the copy engines from these mean sizes. Runs forced over single 64 KiB blocks moved
// 53.9 / 52.0 GB/s each way and 92.1 both at once, against the kernels' 50.1 / 51.2 and 67.0
// (staging bench, wheel 42cee316). At 128 / 256 KiB, int8's 16 KiB-block request loads (runs of
// ~93 KiB stored) stayed on the kernels beside stores on the copy engines, and copy engines one
// way beside SM copies the other moved 50-59 GB/s both ways: 1.71-1.76x exact's tokens/s. Store
// runs start higher so that a step whose loads stay on the kernels keeps its stores there too.
constexpr std::size_t kLoadRunMinBytes = std::size_t{64} << 10;
constexpr std::size_t kStoreRunMinBytes = std::size_t{128} << 10;
// Where the blocks take the copy engines anyway (per-block copies), runs of this many blocks on
// average already mean fewer, larger copies (one per run, K and V together, against two per
// block).
constexpr std::size_t kRunCopyOverBlockCopiesMinBlocks = 2;
// A run whose device blocks are consecutive too crosses directly (K and V copied straight to the
// device blocks, no staging) from this many blocks; a shorter one goes through the staging
// buffer as one copy.
constexpr std::size_t kDirectRunMinBlocks = 2;
// The rule's runs submit a layer's copies as one cudaMemcpyBatchAsync (one call into the driver
// per layer), as the per-layer batch rows above were measured: one call per copy pays the
// driver's microseconds per copy on the host (per-block cudaMemcpyAsync of 64 KiB: 16 GB/s).
constexpr bool kBatchRunCopies = true;
constexpr const char* kTransferPathVariable = "ACTIVEKV_CUDA_TRANSFER_PATH";

// The highest priority a stream can have: bus transfers are the bottleneck, so their thread
// blocks go first and the codec kernels fill in around them.
int bus_priority() {
  int least = 0;
  int greatest = 0;
  check(cudaDeviceGetStreamPriorityRange(&least, &greatest), "cudaDeviceGetStreamPriorityRange");
  return greatest;
}

int device_attribute(cudaDeviceAttr attribute, int device) {
  int value = 0;
  check(cudaDeviceGetAttribute(&value, attribute, device), "cudaDeviceGetAttribute");
  return value;
}

std::uint32_t processor_count(int device) {
  return static_cast<std::uint32_t>(device_attribute(cudaDevAttrMultiProcessorCount, device));
}

// How the bulk copy unit crosses the bus (akv_stage_args.bulk_*), sm_90 and up; none before.
// Measured on an H200 (tests/gpu/evidence/gpu-staging-63cfc8e8d919.json): alone, the bulk copy
// kernel and the plain kernels both move 50-52 GB/s each way at every block size; loads and
// stores at once, the bulk kernel 69-74 GB/s against the plain kernels' 61-63 (16 KiB to 1 MiB
// blocks), with one warp working per SM where the plain kernels take 2 x 256 threads per SM.
// Its sweep (tests/gpu/evidence/staging-bulk-sweep-2026-12-03.txt, both ways, 16 / 64 KiB): 16
// KiB pieces, 2 stages, 1 block per SM 71.8 / 73.4 GB/s, among the best (55-75 over 8-32 KiB
// pieces, 2-8 stages, 0.5-2 blocks per SM; more in flight no better), in 32 KiB of shared memory.
struct BulkPlan {
  std::uint32_t piece = 0;
  std::uint32_t stages = 0;
  std::uint32_t blocks = 0;
};

BulkPlan bulk_plan(int device, std::uint32_t processors) {
  if (device_attribute(cudaDevAttrComputeCapabilityMajor, device) < 9) return {};
  return {AKV_BULK_PIECE, AKV_BULK_STAGES, processors};
}

}  // namespace

const char* transfer_path_name(TransferPath path) {
  switch (path) {
    case TransferPath::kernels:
      return "kernels";
    case TransferPath::block_copies:
      return "block-copies";
    case TransferPath::runs:
      return "runs";
    case TransferPath::runs_staged:
      return "runs-staged";
    case TransferPath::runs_batched:
      return "runs-batched";
  }
  return "unknown";
}

std::optional<TransferPath> transfer_path_override() {
  const char* value = std::getenv(kTransferPathVariable);
  if (value == nullptr || *value == '\0' || std::string(value) == "auto") return std::nullopt;
  for (const TransferPath path : {TransferPath::kernels, TransferPath::block_copies,
                                  TransferPath::runs, TransferPath::runs_staged,
                                  TransferPath::runs_batched}) {
    if (std::string(value) == transfer_path_name(path)) return path;
  }
  throw CudaRouteError(std::string("CUDA route: ") + kTransferPathVariable +
                       ": expected auto, kernels, block-copies, runs, runs-staged or "
                       "runs-batched; got \"" +
                       value + "\"");
}

TransferPath choose_transfer_path(const KvBlockLayout& layout, CompressionMode mode,
                                  Direction direction, const LayerTransfer& layer,
                                  std::optional<TransferPath> forced) {
  // Per-block copies move whole K and V tensors: only where each is one contiguous run (compressed
  // modes too, as before runs existed).
  const bool block_copies = layer.contiguous && crosses_on_copy_engines(layout, mode, direction);
  if (forced.has_value()) {
    const bool possible = *forced == TransferPath::kernels ||
                          (*forced == TransferPath::block_copies ? layer.contiguous
                                                                 : layer.runs_possible);
    if (possible) return *forced;
  }
  if (layer.blocks == 0 || layer.runs == 0) return TransferPath::kernels;
  if (layer.runs_possible) {
    // Mean bytes (blocks) per run, compared without dividing: bytes / runs >= threshold. Where
    // blocks take the copy engines anyway, a run must merge blocks to be worth its staging.
    const std::size_t bytes = layer.blocks * stored_layer_bytes(layout, mode);
    if (block_copies ? layer.blocks >= kRunCopyOverBlockCopiesMinBlocks * layer.runs
                     : bytes >= (direction == Direction::load ? kLoadRunMinBytes
                                                              : kStoreRunMinBytes) *
                                    layer.runs) {
      return kBatchRunCopies ? TransferPath::runs_batched : TransferPath::runs;
    }
  }
  return block_copies ? TransferPath::block_copies : TransferPath::kernels;
}

bool crosses_on_copy_engines(const KvBlockLayout& layout, CompressionMode mode,
                             Direction direction) {
  // Exact mode copies K and V of a block apart (they are apart in the device KV); compressed
  // modes copy the stored layer whole.
  if (mode == CompressionMode::exact) return layout.bytes_per_tensor() >= kCopyEngineMinBytes;
  const std::size_t copy = stored_layer_bytes(layout, mode);
  return copy >= (direction == Direction::load ? kCopyEngineMinBytes
                                               : kCompressedStoreCopyEngineMinBytes);
}

FenceQuery classify_fence_query(int cuda_status) {
  if (cuda_status == cudaSuccess) return FenceQuery::signalled;
  if (cuda_status == cudaErrorNotReady) return FenceQuery::pending;
  return FenceQuery::unknown;
}

// Declared in the order they must be made; destroyed in reverse (streams drained first, the
// pool unregistered last).
struct CudaRoute::Resources {
  Resources(const KvBlockLayout& layout, CompressionMode compression, std::uint8_t* pool,
            std::size_t num_slots, std::size_t num_regions, std::size_t blocks_per_region)
      : kv_layout(layout),
        compression_mode(compression),
        device(current_device()),
        mode(kernel_mode(compression)),
        dtype(kernel_dtype(layout.dtype())),
        groups(layout.block_size() * layout.num_kv_heads()),
        head_dim(layout.head_dim()),
        layer_bytes(stored_layer_bytes(layout, compression)),
        tensor_bytes(layout.bytes_per_tensor()),
        plane_bytes(num_slots * layer_bytes),
        processors(processor_count(device)),
        max_blocks(2 * processors),
        bulk(bulk_plan(device, processors)),
        max_pitch(static_cast<std::size_t>(device_attribute(cudaDevAttrMaxPitch, device))),
        forced(transfer_path_override()),
        // Exact mode stages only for runs: its buffer is made unless the benchmark forced
        // kernels, the one path that never falls back to runs (compressed modes always stage).
        stages(mode != AKV_MODE_EXACT || forced != TransferPath::kernels),
        pinned(pool, num_slots * layout.num_layers() * layer_bytes),
        load_bus(bus_priority()),
        store_bus(bus_priority()) {
    // A region's buffers: its transfer list (twice) and its staged layer, plus the scratch lists
    // below (two copies a block at most). A count whose bytes do not fit a size_t is refused
    // rather than wrapped into a small buffer that the lease would overrun.
    const std::size_t widest = std::max({sizeof(akv_transfer), layer_bytes, 2 * sizeof(void*),
                                         2 * sizeof(std::size_t)});
    if (blocks_per_region > std::numeric_limits<std::size_t>::max() / widest) {
      throw CudaAllocationError("region_blocks: expected a region whose buffers fit in memory; got " +
                                std::to_string(blocks_per_region) + " blocks of " +
                                std::to_string(widest) + " bytes");
    }
    const std::size_t staged = stages ? blocks_per_region * layer_bytes : 0;
    regions.reserve(num_regions);
    for (std::size_t index = 0; index < num_regions; ++index) {
      regions.push_back(std::make_unique<Region>(blocks_per_region, staged));
    }
    runs.reserve(blocks_per_region);
    batch.reserve(2 * blocks_per_region);  // a direct run of two blocks or more: two copies
    const std::size_t most = (mode == AKV_MODE_EXACT ? 2 : 1) * blocks_per_region;
    destinations.reserve(most);
    sources.reserve(most);
    sizes.reserve(most);
  }

  // The path of one layer (choose_transfer_path over the runs just merged into `runs`).
  TransferPath path_for(Direction direction, std::size_t blocks, bool contiguous) const {
    // Runs need the staging buffer (exact mode too: a run that cannot cross directly is staged).
    return choose_transfer_path(kv_layout, compression_mode, direction,
                                {blocks, runs.size(), contiguous, stages},
                                forced);
  }

  const KvBlockLayout kv_layout;
  const CompressionMode compression_mode;
  const int device;
  const int mode;
  const int dtype;
  const std::uint32_t groups;
  const std::uint32_t head_dim;
  const std::size_t layer_bytes;
  const std::size_t tensor_bytes;
  // The pool in layer planes: layer l of slot s at l * plane_bytes + s * layer_bytes, so a run
  // of slots is one span of each plane.
  const std::size_t plane_bytes;
  const std::uint32_t processors;  // the device's SMs
  // Two bus-crossing launches (a load and a store) must fit on the GPU together.
  const std::uint32_t max_blocks;
  const BulkPlan bulk;
  const std::size_t max_pitch;  // the largest pitch a pitched copy takes
  const std::optional<TransferPath> forced;  // the benchmark's override, or the rule
  const bool stages;  // the regions have device staging buffers
  RouteCounts counts;
  PinnedRegistration pinned;
  std::vector<std::unique_ptr<Region>> regions;
  Event compute_ready;
  // Bus transfers and (compressed modes) device-side codecs, per direction.
  Stream load_bus;
  Stream load_codec;
  Stream store_bus;
  Stream store_codec;
  // One layer's transfer list as runs, and its pitched copies when batched, reused (nothing is
  // allocated per step).
  std::vector<TransferRun> runs;
  std::vector<cudaMemcpy3DBatchOp> batch;
  // One layer's copies for cudaMemcpyBatchAsync (read during the call), reused.
  std::vector<void*> destinations;
  std::vector<const void*> sources;
  std::vector<std::size_t> sizes;

  // Adds one linear copy of `bytes` to the layer's batch: in, pool to device; out, the reverse.
  void batch_linear(std::uint8_t* stored, std::uint8_t* on_device, std::size_t bytes, bool in) {
    destinations.push_back(in ? static_cast<void*>(on_device) : stored);
    sources.push_back(in ? static_cast<const void*>(stored) : on_device);
    sizes.push_back(bytes);
  }

  // Submits the layer's linear copies (if any) as one cudaMemcpyBatchAsync on `stream`.
  void submit_linear(cudaStream_t stream, const char* call) {
    if (sizes.empty()) return;
    cudaMemcpyAttributes attributes{};
    attributes.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
    std::size_t first = 0;
    check(cudaMemcpyBatchAsync(destinations.data(), const_cast<const void**>(sources.data()),
                               sizes.data(), sizes.size(), &attributes, &first, 1, stream),
          call);
  }

  // Whether `run` crosses directly between its slots and its device blocks (exact mode, path
  // runs, contiguous device tensors whose block stride a pitched copy can step).
  bool direct(const TransferRun& run, TransferPath path, const akv_stage_args& args) const {
    const bool may = path == TransferPath::runs || path == TransferPath::runs_batched;
    return mode == AKV_MODE_EXACT && may && args.contiguous != 0 &&
           run.device_consecutive && run.count >= kDirectRunMinBlocks &&
           args.block_stride >= tensor_bytes && args.block_stride <= max_pitch &&
           layer_bytes <= max_pitch;
  }

  // One copy of `height` rows of `width` bytes, a slot (layer_bytes) apart in the pool,
  // `device_pitch` apart on the device; in, pool to device, out the reverse. Rows that follow
  // each other on both sides are one linear copy: on an H200 the 2D copy calls moved even single
  // rows of 256 KiB-1 MiB at 31-46 GB/s where linear copies of the same bytes moved 53-54.
  // Batched: added to the layer's batch (`destinations`, `sources` and `sizes` for linear
  // copies, `batch` for pitched ones), which copy_runs submits.
  void copy(std::uint8_t* stored, std::uint8_t* on_device, std::size_t device_pitch,
            std::size_t width, std::size_t height, bool in, bool batched, cudaStream_t stream) {
    if (height == 1 || (width == layer_bytes && width == device_pitch)) {
      const std::size_t bytes = width * height;
      if (batched) {
        batch_linear(stored, on_device, bytes, in);
        return;
      }
      check(cudaMemcpyAsync(in ? static_cast<void*>(on_device) : stored,
                            in ? static_cast<const void*>(stored) : on_device, bytes,
                            in ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost, stream),
            in ? "cudaMemcpyAsync (load run)" : "cudaMemcpyAsync (store run)");
      return;
    }
    if (batched) {
      // Pointer operands: elements of one byte, rows `rowLength` bytes apart.
      cudaMemcpy3DBatchOp op{};
      cudaMemcpy3DOperand& from = op.src;
      cudaMemcpy3DOperand& to = op.dst;
      from.type = cudaMemcpyOperandTypePointer;
      to.type = cudaMemcpyOperandTypePointer;
      from.op.ptr.ptr = in ? static_cast<void*>(stored) : on_device;
      from.op.ptr.rowLength = in ? layer_bytes : device_pitch;
      to.op.ptr.ptr = in ? static_cast<void*>(on_device) : stored;
      to.op.ptr.rowLength = in ? device_pitch : layer_bytes;
      op.extent = make_cudaExtent(width, height, 1);
      op.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
      op.flags = cudaMemcpyFlagDefault;
      batch.push_back(op);
      return;
    }
    check(in ? cudaMemcpy2DAsync(on_device, device_pitch, stored, layer_bytes, width, height,
                                 cudaMemcpyHostToDevice, stream)
             : cudaMemcpy2DAsync(stored, layer_bytes, on_device, device_pitch, width, height,
                                 cudaMemcpyDeviceToHost, stream),
          in ? "cudaMemcpy2DAsync (load)" : "cudaMemcpy2DAsync (store)");
  }

  // One layer by runs (`runs`, merged from its list) on `stream`: each run one linear copy of its
  // span of the layer's plane to or from the staging buffer (the staged runs side by side in
  // list order, as the region's device list numbers them), or, direct, K and V each one pitched
  // copy to or from the device blocks (one linear copy of both where the blocks are laid out as
  // the slots). Batched: the linear copies as one cudaMemcpyBatchAsync, the pitched ones as one
  // cudaMemcpy3DBatchAsync.
  void copy_runs(const akv_stage_args& args, TransferPath path, bool in, cudaStream_t stream) {
    auto* host = static_cast<std::uint8_t*>(pinned.host) + args.layer_offset;
    const bool batched = path == TransferPath::runs_batched;
    batch.clear();
    destinations.clear();
    sources.clear();
    sizes.clear();
    std::size_t position = 0;  // staged blocks so far
    for (const TransferRun& run : runs) {
      std::uint8_t* const stored = host + run.slot * layer_bytes;
      if (direct(run, path, args)) {
        ++counts.direct_runs;
        std::uint8_t* const keys = args.kv + run.device_block * args.block_stride;
        // K then V in each block, as in each slot: one copy for both.
        if (args.value_offset == tensor_bytes && args.block_stride >= layer_bytes) {
          copy(stored, keys, args.block_stride, layer_bytes, run.count, in, batched, stream);
          continue;
        }
        copy(stored, keys, args.block_stride, tensor_bytes, run.count, in, batched, stream);
        copy(stored + tensor_bytes, keys + args.value_offset, args.block_stride, tensor_bytes,
             run.count, in, batched, stream);
        continue;
      }
      copy(stored, args.scratch + position * layer_bytes, layer_bytes, layer_bytes, run.count, in,
           batched, stream);
      ++counts.staged_runs;
      position += run.count;
    }
    submit_linear(stream,
                  in ? "cudaMemcpyBatchAsync (load runs)" : "cudaMemcpyBatchAsync (store runs)");
    if (!batch.empty()) {
      check(cudaMemcpy3DBatchAsync(batch.size(), batch.data(), 0, stream),
            in ? "cudaMemcpy3DBatchAsync (load)" : "cudaMemcpy3DBatchAsync (store)");
    }
  }

  // One layer of a lease across PCIe on `stream`: in, pool slots to the device KV (exact) or to
  // the staging buffer; out, the reverse.
  void cross_bus(const akv_stage_args& args, const std::vector<BlockTransfer>& transfers,
                 bool in, TransferPath path, cudaStream_t stream) {
    if (path == TransferPath::runs || path == TransferPath::runs_staged ||
        path == TransferPath::runs_batched) {
      copy_runs(args, path, in, stream);
      return;
    }
    if (path == TransferPath::kernels) {
      check(static_cast<cudaError_t>(akv_stage_bus(&args, in ? 1 : 0, stream)),
            in ? "staging (load)" : "staging (store)");
      return;
    }
    if (transfers.empty()) return;
    destinations.clear();
    sources.clear();
    sizes.clear();
    auto* host = static_cast<std::uint8_t*>(pinned.host) + args.layer_offset;
    for (std::size_t t = 0; t < transfers.size(); ++t) {
      std::uint8_t* stored = host + transfers[t].slot * layer_bytes;
      if (mode == AKV_MODE_EXACT) {
        std::uint8_t* const keys = args.kv + transfers[t].device_block * args.block_stride;
        batch_linear(stored, keys, tensor_bytes, in);
        batch_linear(stored + tensor_bytes, keys + args.value_offset, tensor_bytes, in);
      } else {
        batch_linear(stored, args.scratch + t * layer_bytes, layer_bytes, in);
      }
    }
    submit_linear(stream, in ? "cudaMemcpyBatchAsync (load)" : "cudaMemcpyBatchAsync (store)");
  }

  // Waits (bounded) for everything enqueued on the direction's streams.
  void drain(Direction direction) {
    const bool load = direction == Direction::load;
    for (cudaStream_t stream : {load ? load_bus.handle : store_bus.handle,
                                load ? load_codec.handle : store_codec.handle}) {
      wait_bounded([stream] { return cudaStreamQuery(stream); });
    }
    cudaGetLastError();  // what the drain met belongs to the lost lease, not to the next call
  }
};

CudaRoute::CudaRoute(const KvBlockLayout& layout, CompressionMode mode, std::uint8_t* pool,
                     std::size_t num_slots, std::size_t num_regions, std::size_t region_blocks)
    : resources_(std::make_unique<Resources>(layout, mode, pool, num_slots, num_regions,
                                             region_blocks)) {}

CudaRoute::~CudaRoute() {
  const DeviceScope scope(resources_->device);
  resources_.reset();
}

int CudaRoute::device() const { return resources_->device; }

void CudaRoute::issue(Direction direction, std::size_t region_index, std::uint32_t layer,
                      const std::vector<BlockTransfer>& transfers, const DeviceKvLayer& device_kv,
                      void* compute_stream) {
  Resources& r = *resources_;
  const DeviceScope scope(r.device);
  try {
    enqueue(direction, region_index, layer, transfers, device_kv, compute_stream);
  } catch (const CudaRouteError&) {
    r.drain(direction);
    r.regions.at(region_index)->issue_failed = true;
  }
}

void CudaRoute::enqueue(Direction direction, std::size_t region_index, std::uint32_t layer,
                        const std::vector<BlockTransfer>& transfers, const DeviceKvLayer& device_kv,
                        void* compute_stream) {
  Resources& r = *resources_;
  Region& region = *r.regions.at(region_index);
  const bool exact = r.mode == AKV_MODE_EXACT;
  const bool load = direction == Direction::load;
  const bool contiguous = tensors_contiguous(r.kv_layout, device_kv.strides);
  transfer_runs(transfers, r.runs);
  const TransferPath path = r.path_for(direction, transfers.size(), contiguous);
  ++(load ? r.counts.load_layers : r.counts.store_layers)[static_cast<std::size_t>(path)];
  const bool by_runs = path == TransferPath::runs || path == TransferPath::runs_staged ||
                       path == TransferPath::runs_batched;
  akv_stage_args args{static_cast<const akv_transfer*>(region.transfers.data),
                      static_cast<std::uint32_t>(transfers.size()),
                      static_cast<std::uint8_t*>(r.pinned.device),
                      layer * r.plane_bytes,
                      static_cast<std::uint8_t*>(device_kv.data),
                      device_kv.strides.block,
                      device_kv.strides.token,
                      device_kv.strides.head,
                      device_kv.strides.value,
                      r.kv_layout.num_kv_heads(),
                      contiguous ? 1u : 0u,
                      r.groups,
                      r.head_dim,
                      r.mode,
                      r.dtype,
                      static_cast<std::uint8_t*>(region.staged.data),
                      r.layer_bytes,
                      r.max_blocks,
                      r.bulk.piece,
                      r.bulk.stages,
                      r.bulk.blocks};
  // Exact mode by runs lists only the staged blocks, each with its offset in the staging buffer
  // (akv_stage_scatter); every other path lists every block with its slot's offset in the pool.
  const bool exact_runs = exact && by_runs;
  std::size_t listed = transfers.size();
  if (exact_runs) {
    listed = 0;
    for (const TransferRun& run : r.runs) listed += r.direct(run, path, args) ? 0 : run.count;
  }
  // Whether the layer goes through the region's device staging buffer (a kernel on the codec
  // stream between it and the device KV), and whether kernels read the list.
  const bool staged = !exact || (exact_runs && listed > 0);
  const bool kernels_read_list = staged || path == TransferPath::kernels;
  // The first stream of the layer's work: the copy of a changed transfer list goes there.
  const cudaStream_t first =
      load ? r.load_bus.handle : (staged ? r.store_codec.handle : r.store_bus.handle);
  if (!load) {
    // The layer's KV is final once the forward has written it: wait for the compute stream.
    check(cudaEventRecord(r.compute_ready.handle, static_cast<cudaStream_t>(compute_stream)),
          "cudaEventRecord (compute stream)");
    check(cudaStreamWaitEvent(first, r.compute_ready.handle, 0), "cudaStreamWaitEvent (compute)");
  }
  // The region is free (its last fence was observed), so nothing still reads its list. Kernels
  // need it (the copies take host pointers instead).
  if (kernels_read_list) {
    auto* list = static_cast<akv_transfer*>(region.listed.data);
    bool changed = listed != region.listed_count;
    std::size_t at = 0;
    const auto put = [&](const akv_transfer& entry) {
      if (changed || std::memcmp(&list[at], &entry, sizeof entry) != 0) {
        list[at] = entry;
        changed = true;
      }
      ++at;
    };
    if (exact_runs) {
      for (const TransferRun& run : r.runs) {
        if (r.direct(run, path, args)) continue;
        for (std::size_t i = 0; i < run.count; ++i) {
          put({at * r.layer_bytes, transfers[run.first + i].device_block});
        }
      }
    } else {
      for (const BlockTransfer& transfer : transfers) {
        put({transfer.slot * r.layer_bytes, transfer.device_block});
      }
    }
    if (changed) {
      region.listed_count = 0;  // the device copy is stale until the copy below is enqueued
      check(cudaMemcpyAsync(region.transfers.data, list, listed * sizeof(akv_transfer),
                            cudaMemcpyHostToDevice, first),
            "cudaMemcpyAsync (transfer list)");
      region.listed_count = listed;
    }
  }
  args.count = static_cast<std::uint32_t>(listed);
  // The device half: exact mode's scatter (gather) by runs, or the compressed modes' codec.
  const auto device_half = [&](bool in, cudaStream_t stream) {
    if (exact) {
      check(static_cast<cudaError_t>(akv_stage_scatter(&args, in ? 1 : 0, stream)),
            in ? "scattering (load)" : "gathering (store)");
    } else {
      check(static_cast<cudaError_t>(akv_stage_codec(&args, in ? 1 : 0, stream)),
            in ? "decoding (load)" : "encoding (store)");
    }
  };
  if (load) {
    // bus -> (staged) -> codec stream -> fence; the codec stream runs one layer behind the bus.
    r.cross_bus(args, transfers, true, path, r.load_bus.handle);
    cudaStream_t last = r.load_bus.handle;
    if (staged) {
      check(cudaEventRecord(region.handed_over.handle, r.load_bus.handle), "cudaEventRecord (staged)");
      check(cudaStreamWaitEvent(r.load_codec.handle, region.handed_over.handle, 0),
            "cudaStreamWaitEvent (staged)");
      device_half(true, r.load_codec.handle);
      last = r.load_codec.handle;
    }
    check(cudaEventRecord(region.fence.handle, last), "cudaEventRecord (fence)");
    return;
  }
  if (staged) {
    device_half(false, r.store_codec.handle);
    check(cudaEventRecord(region.handed_over.handle, r.store_codec.handle), "cudaEventRecord (staged)");
    check(cudaStreamWaitEvent(r.store_bus.handle, region.handed_over.handle, 0),
          "cudaStreamWaitEvent (staged)");
  }
  r.cross_bus(args, transfers, false, path, r.store_bus.handle);
  check(cudaEventRecord(region.fence.handle, r.store_bus.handle), "cudaEventRecord (fence)");
}

RouteCounts CudaRoute::counts() const { return resources_->counts; }

FenceOutcome CudaRoute::observe(Direction direction, std::size_t region_index, bool injected) {
  Resources& r = *resources_;
  const DeviceScope scope(r.device);
  Region& region = *r.regions.at(region_index);
  if (region.issue_failed) return FenceOutcome::unknown;  // drained when the issue failed
  const cudaError_t status =
      injected ? cudaErrorLaunchFailure
               : wait_bounded([&region] { return cudaEventQuery(region.fence.handle); });
  if (classify_fence_query(status) == FenceQuery::signalled) return FenceOutcome::signalled;
  cudaGetLastError();  // the failed query's error is this fence's, not the next call's
  r.drain(direction);
  return FenceOutcome::unknown;
}

struct DeviceKvCache::Buffers {
  std::vector<std::unique_ptr<DeviceBuffer>> layers;
};

namespace {
std::size_t device_layer_bytes(const KvBlockLayout& layout, std::size_t num_device_blocks) {
  if (num_device_blocks > 0 &&
      layout.bytes_per_layer() > std::numeric_limits<std::size_t>::max() / num_device_blocks) {
    throw std::invalid_argument("num_device_blocks: " + std::to_string(num_device_blocks) +
                                " blocks of " + layout.describe() + " overflow a buffer size");
  }
  return layout.bytes_per_layer() * num_device_blocks;
}
}  // namespace

DeviceKvCache::DeviceKvCache(const KvBlockLayout& layout, std::size_t num_device_blocks)
    : layout_(layout),
      num_device_blocks_(num_device_blocks),
      layer_bytes_(device_layer_bytes(layout, num_device_blocks)),
      buffers_(std::make_unique<Buffers>()) {
  check(cudaGetDevice(&device_), "cudaGetDevice");
  for (std::size_t index = 0; index < layout.num_layers(); ++index) {
    buffers_->layers.push_back(std::make_unique<DeviceBuffer>(layer_bytes_, "num_device_blocks"));
    if (layer_bytes_ > 0) {
      check(cudaMemset(buffers_->layers.back()->data, 0, layer_bytes_), "cudaMemset");
    }
  }
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
}

DeviceKvCache::~DeviceKvCache() = default;

std::size_t DeviceKvCache::num_layers() const { return buffers_->layers.size(); }

void* DeviceKvCache::layer(std::size_t index) const { return buffers_->layers.at(index)->data; }

void DeviceKvCache::upload(std::size_t index, const void* host, std::size_t bytes) {
  void* device = layer(index);
  if (bytes != layer_bytes_) {
    throw std::invalid_argument("upload: expected " + std::to_string(layer_bytes_) +
                                " bytes (one layer); got " + std::to_string(bytes));
  }
  if (bytes > 0) check(cudaMemcpy(device, host, bytes, cudaMemcpyHostToDevice), "cudaMemcpy");
}

void DeviceKvCache::download(std::size_t index, void* host, std::size_t bytes) const {
  const void* device = layer(index);
  if (bytes != layer_bytes_) {
    throw std::invalid_argument("download: expected " + std::to_string(layer_bytes_) +
                                " bytes (one layer); got " + std::to_string(bytes));
  }
  if (bytes > 0) check(cudaMemcpy(host, device, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy");
}

}  // namespace activekv::offload
