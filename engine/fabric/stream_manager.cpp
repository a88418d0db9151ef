#include "fabric/stream_manager.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "fabric/errors.h"

namespace activekv::fabric {

const char* stream_role_name(StreamRole role) {
  switch (role) {
    case StreamRole::compute:
      return "compute";
    case StreamRole::copy:
      return "copy";
    case StreamRole::aux:
      return "aux";
    case StreamRole::foreign:
      break;
  }
  return "foreign";
}

StreamManager::StreamManager(DeviceBackend& backend, std::size_t aux_streams,
                             std::size_t completion_events)
    : backend_(backend) {
  if (completion_events == 0) {
    throw std::invalid_argument("completion_events: expected at least 1; got 0");
  }
  try {
    compute_ = backend_.create_stream();
    copy_ = backend_.create_stream();
    for (std::size_t i = 0; i < aux_streams; ++i) aux_.push_back(backend_.create_stream());
    for (std::size_t i = 0; i < completion_events; ++i) events_.push_back(backend_.create_event());
  } catch (...) {
    destroy();
    throw;
  }
}

StreamManager::~StreamManager() { destroy(); }

void StreamManager::destroy() noexcept {
  for (EventHandle event : events_) backend_.destroy_event(event);
  events_.clear();
  for (StreamHandle stream : aux_) backend_.destroy_stream(stream);
  aux_.clear();
  if (copy_ != nullptr) backend_.destroy_stream(copy_);
  if (compute_ != nullptr) backend_.destroy_stream(compute_);
  copy_ = compute_ = nullptr;
}

std::vector<StreamHandle> StreamManager::runtime_streams() const {
  std::vector<StreamHandle> streams{compute_, copy_};
  streams.insert(streams.end(), aux_.begin(), aux_.end());
  return streams;
}

StreamRole StreamManager::role(StreamHandle stream) const {
  if (stream == nullptr) return StreamRole::foreign;  // the legacy default stream is not ours
  if (stream == compute_) return StreamRole::compute;
  if (stream == copy_) return StreamRole::copy;
  if (std::find(aux_.begin(), aux_.end(), stream) != aux_.end()) return StreamRole::aux;
  return StreamRole::foreign;
}

void StreamManager::synchronize(StreamHandle stream) {
  const StreamRole kind = role(stream);
  if (kind == StreamRole::foreign) {
    throw std::invalid_argument("synchronize: the stream is not one of this runtime's streams");
  }
  if (kind != StreamRole::copy) {
    ++refused_syncs_;
    throw StreamRuleError(std::string("synchronising the ") + stream_role_name(kind) +
                          " stream is refused: completion is observed through events "
                          "(record_completion/wait), never by blocking a compute stream");
  }
  backend_.synchronize_stream(stream);
}

void StreamManager::begin_capture(StreamHandle stream) {
  const StreamRole kind = role(stream);
  if (kind == StreamRole::foreign) {
    throw std::invalid_argument("begin_capture: the stream is not one of this runtime's streams");
  }
  ++refused_captures_;
  throw StreamRuleError(std::string("CUDA-graph capture on the runtime's ") +
                        stream_role_name(kind) +
                        " stream is refused: the runtime's streams are never captured");
}

void StreamManager::check_enqueue(StreamHandle stream) {
  const StreamRole kind = role(stream);
  if (kind == StreamRole::foreign) {
    throw std::invalid_argument("enqueue: the stream is not one of this runtime's streams");
  }
  if (backend_.is_capturing(stream)) {
    ++refused_enqueues_;
    throw StreamRuleError(std::string("enqueue refused: the runtime's ") + stream_role_name(kind) +
                          " stream is being captured into a CUDA graph by someone else");
  }
}

EventHandle StreamManager::record_completion(StreamHandle stream) {
  check_enqueue(stream);
  EventHandle event = events_[next_event_];
  next_event_ = (next_event_ + 1) % events_.size();
  backend_.record_event(event, stream);
  return event;
}

void StreamManager::wait(EventHandle event) { backend_.wait_event(event); }

}  // namespace activekv::fabric
