// build_info(): what was compiled, by what, for which GPUs, against which CUDA runtime.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <cuda_runtime_api.h>

#include <sstream>
#include <string>
#include <vector>

#include "common/build_info.h"
#include "cuda/probe.h"

using activekv::build_info;
using activekv::BuildInfo;

namespace {

std::vector<std::string> split(const std::string& text, char separator) {
  std::vector<std::string> parts;
  std::stringstream stream(text);
  std::string part;
  while (std::getline(stream, part, separator)) parts.push_back(part);
  return parts;
}

}  // namespace

TEST_CASE("fields are filled in") {
  const BuildInfo info = build_info();
  CHECK_FALSE(info.version.empty());
  CHECK_FALSE(info.cxx_compiler.empty());
  CHECK_FALSE(info.cuda_architectures.empty());
  CHECK(info.cuda_runtime_version > 0);
}

TEST_CASE("version is the configured project version") {
  const BuildInfo info = build_info();
  CHECK(info.version == EXPECTED_VERSION);
  // major.minor.patch, digits only in the first three parts.
  const std::vector<std::string> parts = split(info.version, '.');
  REQUIRE(parts.size() >= 3);
  for (int i = 0; i < 3; ++i) {
    CAPTURE(i);
    CHECK_FALSE(parts[static_cast<std::size_t>(i)].empty());
    CHECK(parts[static_cast<std::size_t>(i)].find_first_not_of("0123456789") == std::string::npos);
  }
}

TEST_CASE("compiler is the one that built these objects") {
  const BuildInfo info = build_info();
  CHECK(info.cxx_compiler == std::string(EXPECTED_CXX_COMPILER_ID) + " " +
                                 EXPECTED_CXX_COMPILER_VERSION);
#if defined(__clang__)
  const std::string id = "Clang";
  const int major = __clang_major__;
#elif defined(__GNUC__)
  const std::string id = "GNU";
  const int major = __GNUC__;
#endif
#if defined(__clang__) || defined(__GNUC__)
  // The test is compiled by the same compiler as the engine library.
  CHECK(info.cxx_compiler.rfind(id + " " + std::to_string(major) + ".", 0) == 0);
#endif
}

TEST_CASE("architectures are the declared SASS targets plus PTX of the newest") {
  const BuildInfo info = build_info();
  const std::vector<std::string> declared = split(DECLARED_CUDA_ARCHITECTURES, ',');
  REQUIRE_FALSE(declared.empty());
  std::vector<std::string> expected;
  for (const std::string& arch : declared) expected.push_back(arch + "-real");
  expected.push_back(declared.back() + "-virtual");
  CHECK(split(info.cuda_architectures, ',') == expected);
}

TEST_CASE("runtime version matches the CUDA objects") {
  const BuildInfo info = build_info();
  CHECK(info.cuda_runtime_version == akv_cuda_compiled_runtime_version());
  CHECK(info.cuda_runtime_version == CUDART_VERSION);
}
