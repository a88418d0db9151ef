// The C interface of the CUDA objects. Every check holds on a GPU machine (the kernel must give
// the exact sum) and on one without a driver or device (a clean 35/100 error, never a crash).
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>
#include <vector>

#include "cuda/probe.h"

namespace {

constexpr int kSuccess = static_cast<int>(cudaSuccess);
constexpr int kInsufficientDriver = static_cast<int>(cudaErrorInsufficientDriver);  // 35
constexpr int kNoDevice = static_cast<int>(cudaErrorNoDevice);                      // 100
static_assert(kInsufficientDriver == 35 && kNoDevice == 100, "cudaError_t codes changed");

struct DeviceCount {
  int status;
  int count;
};

DeviceCount device_count() {
  int count = -1;
  const int status = akv_cuda_device_count(&count);
  return DeviceCount{status, count};
}

// doctest prints a const char* as a pointer: turn the runtime's messages into strings.
std::string error_text(int status) { return akv_cuda_error_string(status); }

bool is_no_gpu_status(int status) { return status == kInsufficientDriver || status == kNoDevice; }

// Runs the checksum of `words` and checks it against the host sum, or against the no-GPU error.
void check_checksum(const std::vector<std::uint32_t>& words) {
  std::uint64_t expected = 0;
  for (const std::uint32_t word : words) expected += word;

  const DeviceCount devices = device_count();
  std::uint64_t sum = 0xDEADBEEFCAFEF00Dull;  // the function must overwrite it on every path
  const int status = akv_cuda_checksum(words.data(), words.size(), &sum);
  CAPTURE(words.size());
  const std::string status_text = error_text(status);
  CAPTURE(status_text);
  if (devices.status == kSuccess) {
    REQUIRE(status == kSuccess);
    CHECK(sum == expected);
  } else {
    CHECK(status == devices.status);
    CHECK(sum == 0);
  }
}

}  // namespace

TEST_CASE("compiled runtime version is CUDART_VERSION") {
  CHECK(akv_cuda_compiled_runtime_version() == CUDART_VERSION);
  // CUDART_VERSION is 1000 * major + 10 * minor; this toolkit line is CUDA 12 or newer.
  CHECK(akv_cuda_compiled_runtime_version() >= 12000);
  CHECK(akv_cuda_compiled_runtime_version() % 10 == 0);
}

TEST_CASE("device count is a success with devices or a clean no-GPU error") {
  const DeviceCount devices = device_count();
  const std::string status_text = error_text(devices.status);
  CAPTURE(devices.status);
  CAPTURE(status_text);
  if (devices.status == kSuccess) {
    MESSAGE("CUDA devices: " << devices.count);
    CHECK(devices.count > 0);
  } else {
    MESSAGE("no usable GPU: " << devices.status << " " << status_text);
    CHECK(is_no_gpu_status(devices.status));
    CHECK(devices.count == 0);
  }
  // Asking again gives the same answer (no state left behind by the first call).
  const DeviceCount again = device_count();
  CHECK(again.status == devices.status);
  CHECK(again.count == devices.count);
}

TEST_CASE("error strings are the runtime's messages") {
  for (const int code : {kSuccess, kInsufficientDriver, kNoDevice, device_count().status}) {
    CAPTURE(code);
    const char* message = akv_cuda_error_string(code);
    REQUIRE(message != nullptr);
    CHECK_FALSE(std::string(message).empty());
    CHECK(std::string(message) == cudaGetErrorString(static_cast<cudaError_t>(code)));
  }
  // Known codes have their own text, not the runtime's fallback for unknown codes.
  const std::string unknown = akv_cuda_error_string(987654);
  CHECK(std::string(akv_cuda_error_string(kInsufficientDriver)) != unknown);
  CHECK(std::string(akv_cuda_error_string(kNoDevice)) != unknown);
  CHECK(std::string(akv_cuda_error_string(kInsufficientDriver)) !=
        akv_cuda_error_string(kNoDevice));
}

TEST_CASE("checksum of a small array") {
  std::vector<std::uint32_t> words(1000);
  for (std::size_t i = 0; i < words.size(); ++i) words[i] = static_cast<std::uint32_t>(i * 7 + 3);
  check_checksum(words);  // 3496500 on a GPU
}

TEST_CASE("checksum accumulates past 32 bits") {
  // 100000 words over many blocks and grid strides; the total needs more than 32 bits.
  std::vector<std::uint32_t> words(100000, 0xFFFFFFFFu);
  words[0] = 1;
  words[99999] = 12345;
  check_checksum(words);
}

TEST_CASE("checksum of an empty array") {
  const std::vector<std::uint32_t> none;
  check_checksum(none);
}
