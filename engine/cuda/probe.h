// C interface of the CUDA objects. nvcc compiles them with the host g++, while the rest of the
// wheel links zig's libc++: this header and the .cu host code use no C++ standard library, so no
// libstdc++ symbol can be left undefined in the final module (release/build/elfcheck.py verifies it).
#pragma once

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

// CUDART_VERSION the objects were compiled against.
int akv_cuda_compiled_runtime_version(void);

// Number of visible CUDA devices; returns the cudaError_t code (0 is success).
int akv_cuda_device_count(int* count);

// Human-readable name of a cudaError_t code (a static string owned by the CUDA runtime).
const char* akv_cuda_error_string(int code);

// Sums `count` 32-bit words on device 0 (copy in, reduce, copy out); returns the cudaError_t code.
// Exists to prove on a GPU machine that the wheel's own kernels run.
int akv_cuda_checksum(const uint32_t* host_words, size_t count, uint64_t* sum);

#ifdef __cplusplus
}
#endif
