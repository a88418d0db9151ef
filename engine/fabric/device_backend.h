// The device operations the fabric needs, behind one interface: the real CUDA backend
// (cuda_backend.cpp) for the runtime and the GPU gate, and a host-memory fake for CPU tests of the
// rules (tests/cpp/test_fabric_fakes.h). The rules themselves live above this interface.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

namespace activekv::fabric {

using StreamHandle = void*;  // cudaStream_t under the CUDA backend
using EventHandle = void*;   // cudaEvent_t under the CUDA backend

enum class MemoryKind { device, pinned };

const char* memory_kind_name(MemoryKind kind);

class DeviceBackend {
 public:
  virtual ~DeviceBackend() = default;
  virtual std::string name() const = 0;

  virtual void* allocate(MemoryKind kind, std::size_t bytes) = 0;
  virtual void release(MemoryKind kind, void* memory) noexcept = 0;

  virtual StreamHandle create_stream() = 0;
  virtual void destroy_stream(StreamHandle stream) noexcept = 0;
  virtual bool is_capturing(StreamHandle stream) = 0;
  virtual void synchronize_stream(StreamHandle stream) = 0;

  virtual EventHandle create_event() = 0;
  virtual void destroy_event(EventHandle event) noexcept = 0;
  virtual void record_event(EventHandle event, StreamHandle stream) = 0;
  // Blocks the calling host thread until `event` has completed (an event wait, not a stream sync).
  virtual void wait_event(EventHandle event) = 0;
  virtual float elapsed_ms(EventHandle start, EventHandle end) = 0;

  virtual void copy_async(void* destination, const void* source, std::size_t bytes,
                          StreamHandle stream) = 0;
};

// The CUDA runtime backend on `device`; throws CudaError naming the call when no driver or device
// is usable.
std::unique_ptr<DeviceBackend> make_cuda_backend(int device);

}  // namespace activekv::fabric
