// The CUPTI monitor: a callback subscriber on the driver and runtime API domains that counts, by
// callback id and by phase, the calls the warm-up rules forbid (docs/gates.md): device, async,
// pool, VMM, pinned and host-register allocations; stream, context and event synchronisations;
// stream captures. Syncs and captures are split by whether their stream is one the runtime owns.
// libcupti is loaded at run time; the callback ids are classified by the names CUPTI itself
// reports (cuptiGetCallbackName), so no CUPTI header or id table is compiled in.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "fabric/device_backend.h"
#include "fabric/dynamic_library.h"

namespace activekv::fabric {

enum class ApiCategory {
  device_allocation,
  async_allocation,
  pool_allocation,
  vmm_allocation,
  pinned_allocation,
  host_register,
  stream_synchronize,
  context_synchronize,
  event_synchronize,
  stream_capture,
};

const char* api_category_name(ApiCategory category);
// "cudaMalloc_v3020" -> "cudaMalloc", "cuStreamSynchronize_ptsz" -> "cuStreamSynchronize",
// "cuMemAlloc_v2" -> "cuMemAlloc": the API's name without version and per-thread suffixes.
std::string base_api_name(const std::string& callback_name);
// The category of a driver or runtime API callback name, or none when the rules ignore it.
std::optional<ApiCategory> classify_api(const std::string& callback_name);

enum class ApiDomain { driver = 1, runtime = 2 };  // CUPTI_CB_DOMAIN_DRIVER_API / _RUNTIME_API
inline const char* api_domain_name(ApiDomain domain) {
  return domain == ApiDomain::driver ? "driver" : "runtime";
}

class CuptiMonitor {
 public:
  static constexpr std::size_t kMaxPhases = 32;
  static constexpr std::size_t kMaxWatchedStreams = 64;

  struct Count {
    std::string phase;
    ApiDomain domain;
    std::uint32_t callback_id;
    std::string api;  // CUPTI's callback name
    ApiCategory category;
    bool runtime_stream;  // the call's stream is one of the watched (runtime) streams
    std::uint64_t calls;
  };
  struct Tracked {
    ApiDomain domain;
    std::uint32_t callback_id;
    std::string api;
    ApiCategory category;
  };

  // Loads libcupti from the first candidate that loads (LibraryLoadError otherwise), subscribes
  // and enables exactly the classified callbacks; counting starts in phase `first_phase`.
  CuptiMonitor(const std::vector<std::string>& library_candidates, const std::string& first_phase);
  ~CuptiMonitor();
  CuptiMonitor(const CuptiMonitor&) = delete;
  CuptiMonitor& operator=(const CuptiMonitor&) = delete;

  // Later calls count in the new phase (at most kMaxPhases phases).
  void set_phase(const std::string& name);
  const std::string& phase() const;
  // The runtime's streams: syncs and captures on them are split out.
  void watch_streams(const std::vector<StreamHandle>& streams);
  std::vector<Count> counts() const;
  const std::vector<Tracked>& tracked() const { return tracked_; }
  const std::string& library_path() const { return library_.path(); }
  std::uint32_t cupti_version() const { return version_; }

 private:
  struct Api;
  static void on_callback(void* userdata, int domain, std::uint32_t callback_id,
                          const void* data);
  void count(int domain, std::uint32_t callback_id, const void* data);
  bool is_watched(const void* stream) const;

  DynamicLibrary library_;
  std::unique_ptr<Api> api_;
  void* subscriber_ = nullptr;
  std::uint32_t version_ = 0;
  std::vector<Tracked> tracked_;
  // slot_of_[domain][callback id] = index into tracked_, or -1.
  std::vector<int> slot_of_[3];
  std::vector<std::string> phases_;
  std::atomic<std::size_t> phase_{0};
  std::atomic<std::size_t> watched_count_{0};
  std::atomic<const void*> watched_[kMaxWatchedStreams] = {};
  // counters_[(phase * tracked + slot) * 2 + runtime_stream]
  std::unique_ptr<std::atomic<std::uint64_t>[]> counters_;
};

}  // namespace activekv::fabric
