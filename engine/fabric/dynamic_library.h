// A shared library loaded at run time (dlopen), so the wheel neither links nor vendors libcublas,
// libcupti or TensorRT: a machine without them imports the module and gets LibraryLoadError only
// when the feature is used. A loaded library stays mapped for the life of the process.
#pragma once

#include <string>
#include <vector>

namespace activekv::fabric {

class DynamicLibrary {
 public:
  // Opens the first candidate (a path or a soname) that loads; LibraryLoadError lists every
  // candidate with dlerror()'s reason when none does.
  static DynamicLibrary open_first(const std::vector<std::string>& candidates, const char* what);
  DynamicLibrary(DynamicLibrary&& other) noexcept;
  DynamicLibrary& operator=(DynamicLibrary&&) = delete;
  DynamicLibrary(const DynamicLibrary&) = delete;
  DynamicLibrary& operator=(const DynamicLibrary&) = delete;
  ~DynamicLibrary();

  const std::string& path() const { return path_; }
  // LibraryLoadError naming the library and the symbol when it is missing.
  void* symbol(const char* name) const;
  template <typename Function>
  Function function(const char* name) const {
    return reinterpret_cast<Function>(symbol(name));
  }

 private:
  DynamicLibrary(void* handle, std::string path, std::string what);
  void* handle_;
  std::string path_;
  std::string what_;
};

}  // namespace activekv::fabric
