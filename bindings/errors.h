// How each module's C++ errors reach Python: CUDA runtime errors as RuntimeError naming the call,
// and the standard exceptions translated by the module itself (each carries its own C++ runtime).
#pragma once

#include <nanobind/nanobind.h>

#include <exception>
#include <new>
#include <stdexcept>
#include <string>

#include "cuda/probe.h"

namespace activekv::bindings {

namespace nb = nanobind;

// Raised to Python (as RuntimeError) when the CUDA runtime reports an error.
inline void throw_on_cuda_error(int code, const char* what) {
  if (code != 0) {
    throw std::runtime_error(std::string(what) + ": CUDA error " + std::to_string(code) + " (" +
                             akv_cuda_error_string(code) + ")");
  }
}

// Each module carries its own copy of the C++ runtime (zig's libc++, linked in), so its exceptions
// match only its own type_info: nanobind's built-in translator, which lives in whichever module
// was imported first, cannot catch another module's std::invalid_argument (Python then sees
// "exception could not be translated"). Every module translates its own standard exceptions,
// as nanobind would; called first in NB_MODULE, so the module's specific ones are tried before.
inline void translate_standard_exceptions() {
  nb::register_exception_translator([](const std::exception_ptr& raised, void*) {
    try {
      std::rethrow_exception(raised);
    } catch (const std::bad_alloc& error) {
      PyErr_SetString(PyExc_MemoryError, error.what());
    } catch (const std::out_of_range& error) {
      PyErr_SetString(PyExc_IndexError, error.what());
    } catch (const std::overflow_error& error) {
      PyErr_SetString(PyExc_OverflowError, error.what());
    } catch (const std::invalid_argument& error) {
      PyErr_SetString(PyExc_ValueError, error.what());
    } catch (const std::domain_error& error) {
      PyErr_SetString(PyExc_ValueError, error.what());
    } catch (const std::length_error& error) {
      PyErr_SetString(PyExc_ValueError, error.what());
    } catch (const std::range_error& error) {
      PyErr_SetString(PyExc_ValueError, error.what());
    } catch (const std::exception& error) {
      PyErr_SetString(PyExc_RuntimeError, error.what());
    }
  });
}

}  // namespace activekv::bindings
