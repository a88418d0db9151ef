// Error types of the fabric boundary: each rule has its own type, so a caller (and Python, through
// the bindings) can tell a refused sync from a missing library or a CUDA failure.
#pragma once

#include <stdexcept>

#include "fabric/arena_plan.h"  // ArenaSealedError, ArenaExhaustedError

namespace activekv::fabric {

// A stream rule was broken: a compute-stream sync, a capture on a runtime stream, or an enqueue
// onto a runtime stream that is capturing.
class StreamRuleError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The convention probe found both candidate conventions or neither: the worker must not start.
class ConventionProbeError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A CUDA runtime call failed (no driver, no device, a launch error); the message names the call.
class CudaError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A library loaded at run time (libcublas, libcupti) was not found or lacks a symbol.
class LibraryLoadError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A call into a library loaded at run time (cuBLAS, CUPTI, TensorRT) reported failure.
class LibraryCallError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace activekv::fabric
