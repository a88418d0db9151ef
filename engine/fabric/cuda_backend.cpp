// The CUDA runtime backend. Compiled by the C++ compiler (zig's clang in the wheel), not nvcc: it
// holds no kernels, and host code with the standard library must not go through nvcc's g++
// (docs/toolchain.md).
#include <cuda_runtime.h>

#include <string>

#include "fabric/device_backend.h"
#include "fabric/errors.h"

namespace activekv::fabric {

const char* memory_kind_name(MemoryKind kind) {
  return kind == MemoryKind::device ? "device" : "pinned";
}

namespace {

void check(cudaError_t status, const char* call) {
  if (status != cudaSuccess) {
    throw CudaError(std::string(call) + " failed: CUDA error " +
                    std::to_string(static_cast<int>(status)) + " (" +
                    cudaGetErrorString(status) + ")");
  }
}

cudaStream_t as_stream(StreamHandle stream) { return static_cast<cudaStream_t>(stream); }
cudaEvent_t as_event(EventHandle event) { return static_cast<cudaEvent_t>(event); }

class CudaBackend final : public DeviceBackend {
 public:
  explicit CudaBackend(int device) : device_(device) {
    int count = 0;
    check(cudaGetDeviceCount(&count), "cudaGetDeviceCount (no usable CUDA driver or GPU?)");
    if (device < 0 || device >= count) {
      throw CudaError("CUDA device " + std::to_string(device) + " does not exist; " +
                      std::to_string(count) + " visible");
    }
    check(cudaSetDevice(device), "cudaSetDevice");
  }

  std::string name() const override { return "cuda:" + std::to_string(device_); }

  void* allocate(MemoryKind kind, std::size_t bytes) override {
    void* memory = nullptr;
    if (kind == MemoryKind::device) {
      check(cudaMalloc(&memory, bytes), "cudaMalloc");
    } else {
      check(cudaHostAlloc(&memory, bytes, cudaHostAllocDefault), "cudaHostAlloc");
    }
    return memory;
  }

  void release(MemoryKind kind, void* memory) noexcept override {
    if (kind == MemoryKind::device) {
      cudaFree(memory);
    } else {
      cudaFreeHost(memory);
    }
  }

  StreamHandle create_stream() override {
    cudaStream_t stream = nullptr;
    // Non-blocking: the legacy default stream never serialises with the runtime's streams.
    check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
    return stream;
  }

  void destroy_stream(StreamHandle stream) noexcept override {
    cudaStreamDestroy(as_stream(stream));
  }

  bool is_capturing(StreamHandle stream) override {
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    check(cudaStreamIsCapturing(as_stream(stream), &status), "cudaStreamIsCapturing");
    return status != cudaStreamCaptureStatusNone;
  }

  void synchronize_stream(StreamHandle stream) override {
    check(cudaStreamSynchronize(as_stream(stream)), "cudaStreamSynchronize");
  }

  EventHandle create_event() override {
    cudaEvent_t event = nullptr;
    // Blocking sync: a host wait sleeps instead of spinning a core.
    check(cudaEventCreateWithFlags(&event, cudaEventBlockingSync), "cudaEventCreateWithFlags");
    return event;
  }

  void destroy_event(EventHandle event) noexcept override { cudaEventDestroy(as_event(event)); }

  void record_event(EventHandle event, StreamHandle stream) override {
    check(cudaEventRecord(as_event(event), as_stream(stream)), "cudaEventRecord");
  }

  void wait_event(EventHandle event) override {
    check(cudaEventSynchronize(as_event(event)), "cudaEventSynchronize");
  }

  float elapsed_ms(EventHandle start, EventHandle end) override {
    float ms = 0.0f;
    check(cudaEventElapsedTime(&ms, as_event(start), as_event(end)), "cudaEventElapsedTime");
    return ms;
  }

  void copy_async(void* destination, const void* source, std::size_t bytes,
                  StreamHandle stream) override {
    check(cudaMemcpyAsync(destination, source, bytes, cudaMemcpyDefault, as_stream(stream)),
          "cudaMemcpyAsync");
  }

 private:
  int device_;
};

}  // namespace

std::unique_ptr<DeviceBackend> make_cuda_backend(int device) {
  return std::make_unique<CudaBackend>(device);
}

}  // namespace activekv::fabric
