#include "offload/cuda_route.h"

#include <cuda_runtime.h>

#include <chrono>
#include <string>
#include <thread>
#include <utility>

#include "cuda/staging.h"

namespace activekv::offload {

namespace {

void check(cudaError_t status, const char* call) {
  if (status != cudaSuccess) {
    cudaGetLastError();  // a non-sticky error must not surface again at the next call
    throw CudaRouteError(std::string("CUDA route: ") + call + ": " + cudaGetErrorString(status));
  }
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
  Stream() { check(cudaStreamCreateWithFlags(&handle, cudaStreamNonBlocking), "cudaStreamCreate"); }
  ~Stream() {
    if (handle != nullptr) {
      cudaStreamSynchronize(handle);
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

// Pinned, mapped host memory of the route's own (a region's transfer list).
struct MappedBuffer {
  void* host = nullptr;
  void* device = nullptr;
  explicit MappedBuffer(std::size_t bytes) {
    check(cudaHostAlloc(&host, bytes, cudaHostAllocMapped), "cudaHostAlloc");
    const cudaError_t status = cudaHostGetDevicePointer(&device, host, 0);
    if (status != cudaSuccess) {
      cudaFreeHost(host);
      check(status, "cudaHostGetDevicePointer");
    }
  }
  ~MappedBuffer() {
    if (host != nullptr) cudaFreeHost(host);
  }
  MappedBuffer(const MappedBuffer&) = delete;
  MappedBuffer& operator=(const MappedBuffer&) = delete;
};

// Device memory of the route's own (a region's staging buffer for compressed modes).
struct DeviceBuffer {
  void* data = nullptr;
  explicit DeviceBuffer(std::size_t bytes) {
    if (bytes > 0) check(cudaMalloc(&data, bytes), "cudaMalloc");
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
    check(cudaHostRegister(pool, bytes, cudaHostRegisterMapped | cudaHostRegisterPortable),
          "cudaHostRegister");
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
  // Compressed modes: the stored layers of one lease in device memory, and the event that hands
  // them between the bus and codec streams.
  Event handed_over;
  MappedBuffer transfers;
  DeviceBuffer staged;
  Region(std::size_t blocks, std::size_t staged_bytes)
      : transfers(blocks * sizeof(akv_transfer)), staged(staged_bytes) {}
};

// Two bus-crossing launches (a load and a store) must fit on the GPU together.
std::uint32_t bus_blocks() {
  int device = 0;
  int processors = 0;
  check(cudaGetDevice(&device), "cudaGetDevice");
  check(cudaDeviceGetAttribute(&processors, cudaDevAttrMultiProcessorCount, device),
        "cudaDeviceGetAttribute");
  return static_cast<std::uint32_t>(2 * processors);
}

}  // namespace

FenceQuery classify_fence_query(int cuda_status) {
  if (cuda_status == cudaSuccess) return FenceQuery::signalled;
  if (cuda_status == cudaErrorNotReady) return FenceQuery::pending;
  return FenceQuery::unknown;
}

// Declared in the order they must be made; destroyed in reverse (streams drained first, the
// pool unregistered last).
struct CudaRoute::Resources {
  Resources(const KvBlockLayout& layout, CompressionMode compression, std::uint8_t* pool,
            std::size_t pool_bytes, std::size_t num_regions, std::size_t blocks_per_region)
      : device(current_device()),
        mode(kernel_mode(compression)),
        dtype(kernel_dtype(layout.dtype())),
        groups(layout.block_size() * layout.num_kv_heads()),
        head_dim(layout.head_dim()),
        layer_bytes(stored_layer_bytes(layout, compression)),
        max_blocks(bus_blocks()),
        pinned(pool, pool_bytes) {
    const std::size_t staged = mode == AKV_MODE_EXACT ? 0 : blocks_per_region * layer_bytes;
    regions.reserve(num_regions);
    for (std::size_t index = 0; index < num_regions; ++index) {
      regions.push_back(std::make_unique<Region>(blocks_per_region, staged));
    }
  }

  const int device;
  const int mode;
  const int dtype;
  const std::uint32_t groups;
  const std::uint32_t head_dim;
  const std::size_t layer_bytes;
  const std::uint32_t max_blocks;
  PinnedRegistration pinned;
  std::vector<std::unique_ptr<Region>> regions;
  Event compute_ready;
  // Bus transfers and (compressed modes) device-side codecs, per direction.
  Stream load_bus;
  Stream load_codec;
  Stream store_bus;
  Stream store_codec;

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
                     std::size_t pool_bytes, std::size_t num_regions, std::size_t region_blocks)
    : resources_(std::make_unique<Resources>(layout, mode, pool, pool_bytes, num_regions,
                                             region_blocks)) {}

CudaRoute::~CudaRoute() {
  const DeviceScope scope(resources_->device);
  resources_.reset();
}

int CudaRoute::device() const { return resources_->device; }

void CudaRoute::issue(Direction direction, std::size_t region_index, std::uint32_t layer,
                      const std::vector<BlockTransfer>& transfers, void* device_kv,
                      std::size_t num_device_blocks, std::size_t slot_bytes,
                      void* compute_stream) {
  Resources& r = *resources_;
  const DeviceScope scope(r.device);
  try {
    enqueue(direction, region_index, layer, transfers, device_kv, num_device_blocks, slot_bytes,
            compute_stream);
  } catch (const CudaRouteError&) {
    r.drain(direction);
    throw;
  }
}

void CudaRoute::enqueue(Direction direction, std::size_t region_index, std::uint32_t layer,
                        const std::vector<BlockTransfer>& transfers, void* device_kv,
                        std::size_t num_device_blocks, std::size_t slot_bytes,
                        void* compute_stream) {
  Resources& r = *resources_;
  Region& region = *r.regions.at(region_index);
  // The region is free (its last fence was observed), so no kernel still reads this list.
  auto* list = static_cast<akv_transfer*>(region.transfers.host);
  for (std::size_t i = 0; i < transfers.size(); ++i) {
    list[i] = {transfers[i].slot * slot_bytes, transfers[i].device_block};
  }
  const akv_stage_args args{static_cast<const akv_transfer*>(region.transfers.device),
                            static_cast<std::uint32_t>(transfers.size()),
                            static_cast<std::uint8_t*>(r.pinned.device),
                            layer * r.layer_bytes,
                            static_cast<std::uint8_t*>(device_kv),
                            num_device_blocks,
                            r.groups,
                            r.head_dim,
                            r.mode,
                            r.dtype,
                            static_cast<std::uint8_t*>(region.staged.data),
                            r.layer_bytes,
                            r.max_blocks};
  const bool exact = r.mode == AKV_MODE_EXACT;
  if (direction == Direction::load) {
    // bus -> (staged) -> codec -> fence; the codec stream runs one layer behind the bus.
    check(static_cast<cudaError_t>(akv_stage_bus(&args, 1, r.load_bus.handle)), "staging (load)");
    cudaStream_t last = r.load_bus.handle;
    if (!exact) {
      check(cudaEventRecord(region.handed_over.handle, r.load_bus.handle), "cudaEventRecord (staged)");
      check(cudaStreamWaitEvent(r.load_codec.handle, region.handed_over.handle, 0),
            "cudaStreamWaitEvent (staged)");
      check(static_cast<cudaError_t>(akv_stage_codec(&args, 1, r.load_codec.handle)),
            "decoding (load)");
      last = r.load_codec.handle;
    }
    check(cudaEventRecord(region.fence.handle, last), "cudaEventRecord (fence)");
    return;
  }
  // The layer's KV is final once the forward has written it: wait for the compute stream.
  check(cudaEventRecord(r.compute_ready.handle, static_cast<cudaStream_t>(compute_stream)),
        "cudaEventRecord (compute stream)");
  cudaStream_t first = exact ? r.store_bus.handle : r.store_codec.handle;
  check(cudaStreamWaitEvent(first, r.compute_ready.handle, 0), "cudaStreamWaitEvent (compute)");
  if (!exact) {
    check(static_cast<cudaError_t>(akv_stage_codec(&args, 0, r.store_codec.handle)),
          "encoding (store)");
    check(cudaEventRecord(region.handed_over.handle, r.store_codec.handle), "cudaEventRecord (staged)");
    check(cudaStreamWaitEvent(r.store_bus.handle, region.handed_over.handle, 0),
          "cudaStreamWaitEvent (staged)");
  }
  check(static_cast<cudaError_t>(akv_stage_bus(&args, 0, r.store_bus.handle)), "staging (store)");
  check(cudaEventRecord(region.fence.handle, r.store_bus.handle), "cudaEventRecord (fence)");
}

FenceOutcome CudaRoute::observe(Direction direction, std::size_t region_index, bool injected) {
  Resources& r = *resources_;
  const DeviceScope scope(r.device);
  Region& region = *r.regions.at(region_index);
  const cudaError_t status =
      injected ? cudaErrorLaunchFailure
               : wait_bounded([&region] { return cudaEventQuery(region.fence.handle); });
  if (classify_fence_query(status) == FenceQuery::signalled) return FenceOutcome::signalled;
  cudaGetLastError();  // the failed query's error is this fence's, not the next call's
  r.drain(direction);
  return FenceOutcome::unknown;
}

}  // namespace activekv::offload
