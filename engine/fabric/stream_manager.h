// The stream manager owns the runtime's streams: one compute stream, one copy stream and any aux
// streams (TensorRT's), all created at warm-up, plus a ring of completion events. Completion is
// observed through events only. The rules it enforces at run time:
//  * synchronising a compute or aux stream is refused (StreamRuleError, counted);
//  * starting a CUDA-graph capture on any stream it owns is refused (counted);
//  * an enqueue onto one of its streams that is capturing (cudaStreamIsCapturing) is refused.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "fabric/device_backend.h"

namespace activekv::fabric {

enum class StreamRole { compute, copy, aux, foreign };

class StreamManager {
 public:
  StreamManager(DeviceBackend& backend, std::size_t aux_streams, std::size_t completion_events);
  ~StreamManager();
  StreamManager(const StreamManager&) = delete;
  StreamManager& operator=(const StreamManager&) = delete;

  StreamHandle compute() const { return compute_; }
  StreamHandle copy() const { return copy_; }
  const std::vector<StreamHandle>& aux() const { return aux_; }
  // Every stream the runtime owns (compute, copy, aux), for the CUPTI monitor.
  std::vector<StreamHandle> runtime_streams() const;
  StreamRole role(StreamHandle stream) const;

  // Refused for compute and aux streams; the copy stream may be drained (e.g. at shutdown).
  void synchronize(StreamHandle stream);
  // Always refused for a stream the runtime owns; a foreign stream is not the manager's business
  // and is rejected as an argument error.
  void begin_capture(StreamHandle stream);
  // Called before every enqueue onto a runtime stream.
  void check_enqueue(StreamHandle stream);

  // Records the next event of the ring on `stream` and returns it.
  EventHandle record_completion(StreamHandle stream);
  void wait(EventHandle event);
  DeviceBackend& backend() { return backend_; }

  std::uint64_t refused_syncs() const { return refused_syncs_; }
  std::uint64_t refused_captures() const { return refused_captures_; }
  std::uint64_t refused_enqueues() const { return refused_enqueues_; }

 private:
  void destroy() noexcept;

  DeviceBackend& backend_;
  StreamHandle compute_ = nullptr;
  StreamHandle copy_ = nullptr;
  std::vector<StreamHandle> aux_;
  std::vector<EventHandle> events_;
  std::size_t next_event_ = 0;
  std::uint64_t refused_syncs_ = 0;
  std::uint64_t refused_captures_ = 0;
  std::uint64_t refused_enqueues_ = 0;
};

const char* stream_role_name(StreamRole role);

}  // namespace activekv::fabric
