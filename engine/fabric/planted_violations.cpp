#include "fabric/planted_violations.h"

#include <cuda_runtime.h>

#include <string>

#include "fabric/errors.h"

namespace activekv::fabric::planted {

namespace {

void check(cudaError_t status, const char* call) {
  if (status != cudaSuccess) {
    throw CudaError(std::string("planted ") + call + " failed: " + cudaGetErrorString(status));
  }
}

cudaStream_t as_stream(StreamHandle stream) { return static_cast<cudaStream_t>(stream); }

}  // namespace

void device_allocation(unsigned long bytes) {
  void* memory = nullptr;
  check(cudaMalloc(&memory, bytes), "cudaMalloc");
  check(cudaFree(memory), "cudaFree");
}

void stream_synchronize(StreamHandle stream) {
  check(cudaStreamSynchronize(as_stream(stream)), "cudaStreamSynchronize");
}

void begin_capture(StreamHandle stream) {
  check(cudaStreamBeginCapture(as_stream(stream), cudaStreamCaptureModeRelaxed),
        "cudaStreamBeginCapture");
}

void end_capture(StreamHandle stream) {
  cudaGraph_t graph = nullptr;
  check(cudaStreamEndCapture(as_stream(stream), &graph), "cudaStreamEndCapture");
  if (graph != nullptr) check(cudaGraphDestroy(graph), "cudaGraphDestroy");
}

}  // namespace activekv::fabric::planted
