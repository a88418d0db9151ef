// What a module says of its own build: the facts the SBOM reads from it (the C++ runtime, nanobind
// and robin-map versions compiled in; docs/sbom.md), build_info() and cuda_device_count().
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
// robin_map for its version only: nanobind's static library compiles this copy of it in.
#include <tsl/robin_growth_policy.h>

#include "bindings/errors.h"
#include "common/build_info.h"
#include "common/sbom_facts.h"
#include "cuda/probe.h"

// The C++ runtime linked into the module (zig's libc++, with its libc++abi and libunwind, in the
// hermetic build; libstdc++ where a g++ builds the wheel).
#if defined(_LIBCPP_VERSION)
ACTIVEKV_SBOM_FACT(kCxxRuntimeFact, "cxx_runtime=libc++ " ACTIVEKV_SBOM_TEXT(_LIBCPP_VERSION));
#elif defined(_GLIBCXX_RELEASE)
ACTIVEKV_SBOM_FACT(kCxxRuntimeFact, "cxx_runtime=libstdc++ " ACTIVEKV_SBOM_TEXT(_GLIBCXX_RELEASE));
#endif
// The binding library and the hash map it carries, as compiled into this module (NB_STATIC).
#define ACTIVEKV_SBOM_VERSION(major, minor, patch) \
  ACTIVEKV_SBOM_TEXT(major) "." ACTIVEKV_SBOM_TEXT(minor) "." ACTIVEKV_SBOM_TEXT(patch)
ACTIVEKV_SBOM_FACT(kNanobindFact, "nanobind=" ACTIVEKV_SBOM_VERSION(NB_VERSION_MAJOR, NB_VERSION_MINOR,
                                                                  NB_VERSION_PATCH));
ACTIVEKV_SBOM_FACT(kRobinMapFact, "robin_map=" ACTIVEKV_SBOM_VERSION(TSL_RH_VERSION_MAJOR,
                                                                   TSL_RH_VERSION_MINOR,
                                                                   TSL_RH_VERSION_PATCH));

namespace activekv::bindings {

namespace nb = nanobind;

inline nb::dict build_info_dict() {
  const BuildInfo info = build_info();
  nb::dict result;
  result["version"] = info.version;
  result["cxx_compiler"] = info.cxx_compiler;
  result["cuda_architectures"] = info.cuda_architectures;
  result["cuda_runtime_version"] = info.cuda_runtime_version;
  return result;
}

// Binds build_info() and cuda_device_count() into `m`.
inline void bind_build_and_device(nb::module_& m) {
  m.def("build_info", &build_info_dict,
        "Version, compiler, CUDA architectures and CUDA runtime version of this build.");
  m.def(
      "cuda_device_count",
      []() {
        int count = 0;
        throw_on_cuda_error(akv_cuda_device_count(&count), "cuda_device_count");
        return count;
      },
      "Number of visible CUDA devices; raises RuntimeError naming the CUDA error when the "
      "driver or a device is missing.",
      nb::call_guard<nb::gil_scoped_release>());  // the first call initialises CUDA
}

}  // namespace activekv::bindings
