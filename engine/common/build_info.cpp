#include "common/build_info.h"

#include "cuda/probe.h"

namespace activekv {

BuildInfo build_info() {
  // Values come from CMake definitions, never __DATE__/__TIME__, so builds stay reproducible.
  return BuildInfo{ACTIVEKV_VERSION, ACTIVEKV_CXX_COMPILER, ACTIVEKV_CUDA_ARCHITECTURES,
                   akv_cuda_compiled_runtime_version()};
}

}  // namespace activekv
