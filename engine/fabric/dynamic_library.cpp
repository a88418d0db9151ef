#include "fabric/dynamic_library.h"

#include <dlfcn.h>

#include <utility>

#include "fabric/errors.h"

namespace activekv::fabric {

DynamicLibrary::DynamicLibrary(void* handle, std::string path, std::string what)
    : handle_(handle), path_(std::move(path)), what_(std::move(what)) {}

DynamicLibrary::DynamicLibrary(DynamicLibrary&& other) noexcept
    : handle_(std::exchange(other.handle_, nullptr)),
      path_(std::move(other.path_)),
      what_(std::move(other.what_)) {}

DynamicLibrary::~DynamicLibrary() {
  if (handle_ != nullptr) dlclose(handle_);
}

DynamicLibrary DynamicLibrary::open_first(const std::vector<std::string>& candidates,
                                          const char* what) {
  std::string reasons;
  for (const std::string& candidate : candidates) {
    // RTLD_LOCAL: the library's symbols never interpose on another copy in the process.
    // RTLD_NODELETE: CUDA libraries (CUPTI hooks the driver; cuBLAS keeps per-thread state) may
    // still be called after their last handle closes, so dlclose never unmaps them.
    if (void* handle = dlopen(candidate.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE)) {
      return DynamicLibrary(handle, candidate, what);
    }
    const char* error = dlerror();
    reasons += "\n  " + candidate + ": " + (error != nullptr ? error : "not loadable");
  }
  throw LibraryLoadError(std::string(what) + " could not be loaded; tried " +
                         std::to_string(candidates.size()) + " candidate(s):" +
                         (candidates.empty() ? std::string(" none given") : reasons));
}

void* DynamicLibrary::symbol(const char* name) const {
  dlerror();
  void* address = dlsym(handle_, name);
  if (address == nullptr) {
    throw LibraryLoadError(what_ + " at " + path_ + " lacks the symbol " + name +
                           " (too old a version?)");
  }
  return address;
}

}  // namespace activekv::fabric
