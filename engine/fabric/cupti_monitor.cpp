#include "fabric/cupti_monitor.h"

#include <cctype>
#include <stdexcept>
#include <string>
#include <utility>

#include "fabric/errors.h"

namespace activekv::fabric {

namespace {

// The few CUPTI declarations used, written out rather than taken from cupti.h: the hermetic
// build's NVIDIA compiler wheels carry no CUPTI headers, and libcupti is only reached through
// dlsym. Layouts and values are those of cupti_callbacks.h (CUDA 12 and 13).
using CuptiResult = int;
constexpr CuptiResult kCuptiSuccess = 0;
constexpr int kApiEnter = 0;  // CUPTI_API_ENTER
constexpr std::uint32_t kMaxCallbackId = 4096;
using CuptiCallback = void (*)(void* userdata, int domain, std::uint32_t callback_id,
                               const void* data);

struct CallbackData {  // CUpti_CallbackData
  int callback_site;
  const char* function_name;
  const void* function_params;
  void* function_return_value;
  const char* symbol_name;
  void* context;
  std::uint32_t context_uid;
  std::uint64_t* correlation_data;
  std::uint32_t correlation_id;
};

struct NamedCategory {
  const char* api;
  ApiCategory category;
};

constexpr NamedCategory kCategories[] = {
    {"cuMemAlloc", ApiCategory::device_allocation},
    {"cu64MemAlloc", ApiCategory::device_allocation},
    {"cuMemAllocPitch", ApiCategory::device_allocation},
    {"cu64MemAllocPitch", ApiCategory::device_allocation},
    {"cuMemAllocManaged", ApiCategory::device_allocation},
    {"cuArrayCreate", ApiCategory::device_allocation},
    {"cuArray3DCreate", ApiCategory::device_allocation},
    {"cuMipmappedArrayCreate", ApiCategory::device_allocation},
    {"cudaMalloc", ApiCategory::device_allocation},
    {"cudaMallocPitch", ApiCategory::device_allocation},
    {"cudaMallocArray", ApiCategory::device_allocation},
    {"cudaMalloc3D", ApiCategory::device_allocation},
    {"cudaMalloc3DArray", ApiCategory::device_allocation},
    {"cudaMallocMipmappedArray", ApiCategory::device_allocation},
    {"cudaMallocManaged", ApiCategory::device_allocation},
    {"cuMemAllocAsync", ApiCategory::async_allocation},
    {"cudaMallocAsync", ApiCategory::async_allocation},
    {"cuGraphAddMemAllocNode", ApiCategory::async_allocation},
    {"cudaGraphAddMemAllocNode", ApiCategory::async_allocation},
    {"cuMemAllocFromPoolAsync", ApiCategory::pool_allocation},
    {"cudaMallocFromPoolAsync", ApiCategory::pool_allocation},
    {"cuMemPoolCreate", ApiCategory::pool_allocation},
    {"cudaMemPoolCreate", ApiCategory::pool_allocation},
    {"cuMemCreate", ApiCategory::vmm_allocation},
    {"cuMemAllocHost", ApiCategory::pinned_allocation},
    {"cuMemHostAlloc", ApiCategory::pinned_allocation},
    {"cu64MemHostAlloc", ApiCategory::pinned_allocation},
    {"cudaMallocHost", ApiCategory::pinned_allocation},
    {"cudaHostAlloc", ApiCategory::pinned_allocation},
    {"cuMemHostRegister", ApiCategory::host_register},
    {"cudaHostRegister", ApiCategory::host_register},
    {"cuStreamSynchronize", ApiCategory::stream_synchronize},
    {"cudaStreamSynchronize", ApiCategory::stream_synchronize},
    {"cuCtxSynchronize", ApiCategory::context_synchronize},
    {"cudaDeviceSynchronize", ApiCategory::context_synchronize},
    {"cudaThreadSynchronize", ApiCategory::context_synchronize},
    {"cuEventSynchronize", ApiCategory::event_synchronize},
    {"cudaEventSynchronize", ApiCategory::event_synchronize},
    {"cuStreamBeginCapture", ApiCategory::stream_capture},
    {"cuStreamBeginCaptureToGraph", ApiCategory::stream_capture},
    {"cudaStreamBeginCapture", ApiCategory::stream_capture},
    {"cudaStreamBeginCaptureToGraph", ApiCategory::stream_capture},
};

bool ends_with(const std::string& text, const std::string& suffix) {
  return text.size() > suffix.size() &&
         text.compare(text.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Strips one trailing "_v<digits>" (an API or CUPTI version); false when there is none.
bool strip_version(std::string& name) {
  std::size_t end = name.size();
  while (end > 0 && std::isdigit(static_cast<unsigned char>(name[end - 1])) != 0) --end;
  if (end == name.size() || end < 2 || name.compare(end - 2, 2, "_v") != 0) return false;
  name.resize(end - 2);
  return true;
}

bool takes_stream_first(ApiCategory category) {
  // cudaStreamSynchronize(stream), cuStreamSynchronize(hStream), cudaStreamBeginCapture(stream,
  // mode), cuStreamBeginCapture(hStream, mode), ...ToGraph(stream, graph, ...): the stream is
  // the first member of each parameter struct.
  return category == ApiCategory::stream_synchronize || category == ApiCategory::stream_capture;
}

}  // namespace

const char* api_category_name(ApiCategory category) {
  switch (category) {
    case ApiCategory::device_allocation:
      return "device_allocation";
    case ApiCategory::async_allocation:
      return "async_allocation";
    case ApiCategory::pool_allocation:
      return "pool_allocation";
    case ApiCategory::vmm_allocation:
      return "vmm_allocation";
    case ApiCategory::pinned_allocation:
      return "pinned_allocation";
    case ApiCategory::host_register:
      return "host_register";
    case ApiCategory::stream_synchronize:
      return "stream_synchronize";
    case ApiCategory::context_synchronize:
      return "context_synchronize";
    case ApiCategory::event_synchronize:
      return "event_synchronize";
    case ApiCategory::stream_capture:
      break;
  }
  return "stream_capture";
}

std::string base_api_name(const std::string& callback_name) {
  std::string name = callback_name;
  for (bool changed = true; changed;) {
    changed = strip_version(name);
    for (const char* suffix : {"_ptsz", "_ptds"}) {
      if (ends_with(name, suffix)) {
        name.resize(name.size() - 5);
        changed = true;
      }
    }
  }
  return name;
}

std::optional<ApiCategory> classify_api(const std::string& callback_name) {
  const std::string base = base_api_name(callback_name);
  for (const NamedCategory& entry : kCategories) {
    if (base == entry.api) return entry.category;
  }
  return std::nullopt;
}

struct CuptiMonitor::Api {
  CuptiResult (*subscribe)(void** subscriber, CuptiCallback callback, void* userdata);
  CuptiResult (*unsubscribe)(void* subscriber);
  CuptiResult (*enable_callback)(std::uint32_t enable, void* subscriber, int domain,
                                 std::uint32_t callback_id);
  CuptiResult (*callback_name)(int domain, std::uint32_t callback_id, const char** name);
  CuptiResult (*result_string)(CuptiResult result, const char** text);
  CuptiResult (*get_version)(std::uint32_t* version);

  explicit Api(const DynamicLibrary& library)
      : subscribe(library.function<decltype(subscribe)>("cuptiSubscribe")),
        unsubscribe(library.function<decltype(unsubscribe)>("cuptiUnsubscribe")),
        enable_callback(library.function<decltype(enable_callback)>("cuptiEnableCallback")),
        callback_name(library.function<decltype(callback_name)>("cuptiGetCallbackName")),
        result_string(library.function<decltype(result_string)>("cuptiGetResultString")),
        get_version(library.function<decltype(get_version)>("cuptiGetVersion")) {}

  void check(CuptiResult result, const char* call) const {
    if (result == kCuptiSuccess) return;
    const char* text = nullptr;
    result_string(result, &text);
    throw LibraryCallError(std::string(call) + " failed: CUptiResult " + std::to_string(result) +
                           " (" + (text != nullptr ? text : "unknown") + ")");
  }
};

CuptiMonitor::CuptiMonitor(const std::vector<std::string>& library_candidates,
                           const std::string& first_phase)
    : library_(DynamicLibrary::open_first(library_candidates, "libcupti")),
      api_(std::make_unique<Api>(library_)),
      phases_{first_phase} {
  api_->check(api_->get_version(&version_), "cuptiGetVersion");
  for (ApiDomain domain : {ApiDomain::driver, ApiDomain::runtime}) {
    std::vector<int>& slots = slot_of_[static_cast<int>(domain)];
    slots.assign(kMaxCallbackId, -1);
    for (std::uint32_t id = 0; id < kMaxCallbackId; ++id) {
      const char* name = nullptr;
      if (api_->callback_name(static_cast<int>(domain), id, &name) != kCuptiSuccess ||
          name == nullptr) {
        continue;
      }
      if (const std::optional<ApiCategory> category = classify_api(name)) {
        slots[id] = static_cast<int>(tracked_.size());
        tracked_.push_back(Tracked{domain, id, name, *category});
      }
    }
  }
  // Every category must be found in both domains' names, or this CUPTI names its callbacks in a
  // way the classifier does not know and the monitor would silently miss calls.
  for (ApiCategory category :
       {ApiCategory::device_allocation, ApiCategory::pinned_allocation,
        ApiCategory::stream_synchronize, ApiCategory::stream_capture}) {
    for (ApiDomain domain : {ApiDomain::driver, ApiDomain::runtime}) {
      bool found = false;
      for (const Tracked& entry : tracked_) {
        found = found || (entry.category == category && entry.domain == domain);
      }
      if (!found) {
        throw LibraryCallError(std::string("libcupti at ") + library_.path() +
                               " names no " +
                               api_domain_name(domain) +
                               " API callback of category " + api_category_name(category) +
                               "; the monitor cannot classify this CUPTI's callbacks");
      }
    }
  }
  const std::size_t counter_count = kMaxPhases * tracked_.size() * 2;
  counters_ = std::make_unique<std::atomic<std::uint64_t>[]>(counter_count);
  for (std::size_t i = 0; i < counter_count; ++i) counters_[i].store(0);

  api_->check(api_->subscribe(&subscriber_, &CuptiMonitor::on_callback, this), "cuptiSubscribe");
  try {
    for (const Tracked& entry : tracked_) {
      api_->check(api_->enable_callback(1, subscriber_, static_cast<int>(entry.domain),
                                        entry.callback_id),
                  "cuptiEnableCallback");
    }
  } catch (...) {
    api_->unsubscribe(subscriber_);
    throw;
  }
}

CuptiMonitor::~CuptiMonitor() {
  if (subscriber_ != nullptr) api_->unsubscribe(subscriber_);
}

void CuptiMonitor::set_phase(const std::string& name) {
  if (phases_.size() >= kMaxPhases) {
    throw std::length_error("CUPTI monitor: at most " + std::to_string(kMaxPhases) +
                            " phases; cannot start '" + name + "'");
  }
  phases_.push_back(name);
  phase_.store(phases_.size() - 1);
}

const std::string& CuptiMonitor::phase() const { return phases_[phase_.load()]; }

void CuptiMonitor::watch_streams(const std::vector<StreamHandle>& streams) {
  if (streams.size() > kMaxWatchedStreams) {
    throw std::length_error("CUPTI monitor: at most " + std::to_string(kMaxWatchedStreams) +
                            " watched streams; got " + std::to_string(streams.size()));
  }
  watched_count_.store(0);
  for (std::size_t i = 0; i < streams.size(); ++i) watched_[i].store(streams[i]);
  watched_count_.store(streams.size());
}

bool CuptiMonitor::is_watched(const void* stream) const {
  const std::size_t count = watched_count_.load(std::memory_order_acquire);
  for (std::size_t i = 0; i < count; ++i) {
    if (watched_[i].load(std::memory_order_relaxed) == stream) return true;
  }
  return false;
}

void CuptiMonitor::on_callback(void* userdata, int domain, std::uint32_t callback_id,
                               const void* data) {
  static_cast<CuptiMonitor*>(userdata)->count(domain, callback_id, data);
}

void CuptiMonitor::count(int domain, std::uint32_t callback_id, const void* data) {
  if (domain < 1 || domain > 2 || callback_id >= kMaxCallbackId || data == nullptr) return;
  const auto* callback = static_cast<const CallbackData*>(data);
  if (callback->callback_site != kApiEnter) return;  // count each call once
  const int slot = slot_of_[domain][callback_id];
  if (slot < 0) return;
  bool on_runtime_stream = false;
  if (takes_stream_first(tracked_[static_cast<std::size_t>(slot)].category) &&
      callback->function_params != nullptr) {
    const void* stream = *static_cast<const void* const*>(callback->function_params);
    on_runtime_stream = is_watched(stream);
  }
  const std::size_t index =
      (phase_.load(std::memory_order_relaxed) * tracked_.size() + static_cast<std::size_t>(slot)) *
          2 +
      (on_runtime_stream ? 1 : 0);
  counters_[index].fetch_add(1, std::memory_order_relaxed);
}

std::vector<CuptiMonitor::Count> CuptiMonitor::counts() const {
  std::vector<Count> result;
  for (std::size_t phase = 0; phase < phases_.size(); ++phase) {
    for (std::size_t slot = 0; slot < tracked_.size(); ++slot) {
      for (int runtime_stream = 0; runtime_stream < 2; ++runtime_stream) {
        const std::size_t index =
            (phase * tracked_.size() + slot) * 2 + static_cast<std::size_t>(runtime_stream);
        const std::uint64_t calls = counters_[index].load();
        if (calls == 0) continue;
        const Tracked& entry = tracked_[slot];
        result.push_back(Count{phases_[phase], entry.domain, entry.callback_id, entry.api,
                               entry.category, runtime_stream == 1, calls});
      }
    }
  }
  return result;
}

}  // namespace activekv::fabric
