// Violations planted by the GPU gate's negative controls: raw CUDA runtime calls that bypass the
// fabric's rules on purpose, so the CUPTI monitor must see them and flip the verdict. Nothing in
// the runtime calls these.
#pragma once

#include "fabric/device_backend.h"

namespace activekv::fabric::planted {

// cudaMalloc of `bytes` then cudaFree, outside the arena.
void device_allocation(unsigned long bytes);
// cudaStreamSynchronize on `stream`, bypassing StreamManager::synchronize.
void stream_synchronize(StreamHandle stream);
// cudaStreamBeginCapture (relaxed mode) on `stream`, bypassing StreamManager::begin_capture.
void begin_capture(StreamHandle stream);
// Ends the capture begun by begin_capture and destroys the (empty) graph.
void end_capture(StreamHandle stream);

}  // namespace activekv::fabric::planted
