// The vLLM releases the connector serves (docs/vllm.md, "Supported vLLM releases"): vLLM >=0.32,
// <0.34, the two whose lines the shim cites. Any other vLLM is refused at plugin load and when a
// connector is made, naming the range, before anything is registered or built.
#pragma once

#include <nanobind/nanobind.h>

#include <algorithm>
#include <cstddef>
#include <regex>
#include <stdexcept>
#include <string>
#include <vector>

namespace activekv::bindings::connector {

namespace nb = nanobind;

// As PEP 440 writes it, and the release segments of its bounds (major, minor).
constexpr const char* kSupportedVllm = ">=0.32,<0.34";
constexpr long kOldestVllm[] = {0, 32};
constexpr long kFirstUnsupportedVllm[] = {0, 34};

// A vLLM this connector does not serve (Python: RuntimeError); the message is one line.
class UnsupportedVllmError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// -1, 0 or 1 as `release` is below, equal to or above `bound`, missing segments read as 0
// (PEP 440: 0.32 == 0.32.0).
inline int compare_release(const std::vector<long>& release, const long (&bound)[2]) {
  for (std::size_t i = 0; i < std::max<std::size_t>(release.size(), 2); ++i) {
    const long ours = i < release.size() ? release[i] : 0;
    const long theirs = i < 2 ? bound[i] : 0;
    if (ours != theirs) return ours < theirs ? -1 : 1;
  }
  return 0;
}

// Whether `version` (vllm.__version__, PEP 440, any local label such as "+cpu") is in
// kSupportedVllm as PEP 440 reads a specifier: a pre- or dev release of 0.32 is below it, and
// every release of 0.34 (its pre-releases too) is outside. Text that is no PEP 440 version is
// not supported.
inline bool vllm_version_supported(const std::string& version) {
  static const std::regex pep440(
      R"(\s*v?([0-9]+(?:\.[0-9]+)*))"
      R"((?:[-_.]?(a|b|c|rc|alpha|beta|pre|preview)[-_.]?[0-9]*)?)"
      R"((-[0-9]+|[-_.]?(?:post|rev|r)[-_.]?[0-9]*)?)"
      R"((?:[-_.]?(dev)[-_.]?[0-9]*)?)"
      R"((?:\+[a-z0-9]+(?:[-_.][a-z0-9]+)*)?\s*)",
      std::regex::icase);
  std::smatch match;
  if (!std::regex_match(version, match, pep440)) return false;
  std::vector<long> release;
  const std::string segments = match[1].str();
  for (std::size_t start = 0; start <= segments.size();) {
    const std::size_t dot = std::min(segments.find('.', start), segments.size());
    const std::string digits = segments.substr(start, dot - start);
    if (digits.size() > 9) return false;  // no vLLM release segment is that long
    release.push_back(std::stol(digits));
    start = dot + 1;
  }
  // 0.32.0.dev1 is below 0.32.0; 0.32.0.post1.dev1 is not (it precedes only 0.32.0.post1).
  const bool prerelease = match[2].matched || (match[4].matched && !match[3].matched);
  const int low = compare_release(release, kOldestVllm);
  if (low < 0 || (low == 0 && prerelease)) return false;
  return compare_release(release, kFirstUnsupportedVllm) < 0;
}

// UnsupportedVllmError unless the imported vLLM is a supported release.
inline void require_supported_vllm() {
  nb::object found = nb::getattr(nb::module_::import_("vllm"), "__version__", nb::none());
  std::string version;
  if (!nb::try_cast<std::string>(found, version, false) || !vllm_version_supported(version)) {
    const std::string got =
        version.empty() ? "vllm.__version__ " + std::string(nb::repr(found).c_str()) : version;
    throw UnsupportedVllmError(std::string("activekv's ActiveKVConnector supports vLLM ") +
                               kSupportedVllm + " (0.32.x and 0.33.x); this is vLLM " + got);
  }
}

}  // namespace activekv::bindings::connector
