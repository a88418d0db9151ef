// Host code here must not use the C++ standard library: see probe.h.
#include "cuda/probe.h"

#include <cuda_runtime.h>

#include "common/sbom_facts.h"

ACTIVEKV_SBOM_CUDA_FACTS();

// A named namespace, not an anonymous one: nvcc names anonymous namespaces after a hash of the
// source file's absolute path, which would make the wheel's bytes depend on where it was built.
namespace activekv_cuda_detail {

__global__ void sum_words(const uint32_t* words, size_t count, unsigned long long* sum) {
  unsigned long long local = 0;
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < count;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    local += words[i];
  }
  atomicAdd(sum, local);
}

// Frees device memory when the checksum leaves by any path.
struct DeviceBuffer {
  void* ptr = nullptr;
  ~DeviceBuffer() {
    if (ptr != nullptr) {
      cudaFree(ptr);
    }
  }
};

}  // namespace activekv_cuda_detail

using activekv_cuda_detail::DeviceBuffer;
using activekv_cuda_detail::sum_words;

extern "C" int akv_cuda_compiled_runtime_version(void) { return CUDART_VERSION; }

extern "C" int akv_cuda_device_count(int* count) {
  *count = 0;
  return static_cast<int>(cudaGetDeviceCount(count));
}

extern "C" const char* akv_cuda_error_string(int code) {
  return cudaGetErrorString(static_cast<cudaError_t>(code));
}

extern "C" int akv_cuda_checksum(const uint32_t* host_words, size_t count, uint64_t* sum) {
  *sum = 0;
  DeviceBuffer words;
  DeviceBuffer total;
  const size_t bytes = count * sizeof(uint32_t);
  cudaError_t status = cudaMalloc(&words.ptr, bytes > 0 ? bytes : 1);
  if (status == cudaSuccess) status = cudaMalloc(&total.ptr, sizeof(unsigned long long));
  if (status == cudaSuccess) status = cudaMemcpy(words.ptr, host_words, bytes, cudaMemcpyHostToDevice);
  if (status == cudaSuccess) status = cudaMemset(total.ptr, 0, sizeof(unsigned long long));
  if (status == cudaSuccess) {
    sum_words<<<128, 256>>>(static_cast<const uint32_t*>(words.ptr), count,
                            static_cast<unsigned long long*>(total.ptr));
    status = cudaGetLastError();
  }
  unsigned long long result = 0;
  if (status == cudaSuccess) {
    status = cudaMemcpy(&result, total.ptr, sizeof(result), cudaMemcpyDeviceToHost);
  }
  if (status == cudaSuccess) *sum = result;
  return static_cast<int>(status);
}
