// Helpers every C++ test file uses (after including doctest).
#pragma once

#include <string>

namespace activekv::testing {

// The message of the `Error` that `call` throws; fails a check when it throws nothing.
template <typename Error, typename Call>
std::string error_message(Call&& call) {
  try {
    call();
  } catch (const Error& error) {
    return error.what();
  }
  FAIL_CHECK("expected an exception");
  return "<no exception>";
}

inline bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

}  // namespace activekv::testing
