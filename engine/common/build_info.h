// Build identity shared by both native modules: what was compiled, by what, for which GPUs.
#pragma once

#include <string>

namespace activekv {

struct BuildInfo {
  std::string version;             // the distribution version the build was configured with
  std::string cxx_compiler;        // compiler identification of the C++ objects
  std::string cuda_architectures;  // the SASS/PTX targets the CUDA objects carry
  int cuda_runtime_version;        // CUDART_VERSION of the statically linked runtime
};

BuildInfo build_info();

}  // namespace activekv
