#include "fabric/cublas_executor.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "fabric/errors.h"

namespace activekv::fabric {

namespace {

// The few cuBLAS declarations used, written out rather than taken from cublas_api.h: the
// hermetic build's NVIDIA compiler wheels carry no cuBLAS headers, and the library is only ever
// reached through dlsym. Values are those of cublas_api.h (CUDA 12 and 13).
using CublasHandle = void*;
using CublasStatus = int;
constexpr CublasStatus kCublasSuccess = 0;
constexpr int kCublasOpN = 0;           // CUBLAS_OP_N
constexpr int kCublasPedanticMath = 2;  // CUBLAS_PEDANTIC_MATH: true fp32, no TF32

void check(CublasStatus status, const char* call) {
  if (status != kCublasSuccess) {
    throw LibraryCallError(std::string(call) + " failed: cublasStatus_t " +
                           std::to_string(status));
  }
}

int as_int(std::size_t value) { return static_cast<int>(value); }  // checked by validate()

}  // namespace

struct CublasExecutor::Api {
  CublasStatus (*create)(CublasHandle*);
  CublasStatus (*destroy)(CublasHandle);
  CublasStatus (*get_version)(CublasHandle, int*);
  CublasStatus (*set_stream)(CublasHandle, void*);
  CublasStatus (*set_workspace)(CublasHandle, void*, std::size_t);
  CublasStatus (*set_math_mode)(CublasHandle, int);
  CublasStatus (*sgemm)(CublasHandle, int, int, int, int, int, const float*, const float*, int,
                        const float*, int, const float*, float*, int);
  CublasStatus (*sgemm_strided_batched)(CublasHandle, int, int, int, int, int, const float*,
                                        const float*, int, long long, const float*, int,
                                        long long, const float*, float*, int, long long, int);
  CublasStatus (*scopy)(CublasHandle, int, const float*, int, float*, int);

  explicit Api(const DynamicLibrary& library)
      : create(library.function<decltype(create)>("cublasCreate_v2")),
        destroy(library.function<decltype(destroy)>("cublasDestroy_v2")),
        get_version(library.function<decltype(get_version)>("cublasGetVersion_v2")),
        set_stream(library.function<decltype(set_stream)>("cublasSetStream_v2")),
        set_workspace(library.function<decltype(set_workspace)>("cublasSetWorkspace_v2")),
        set_math_mode(library.function<decltype(set_math_mode)>("cublasSetMathMode")),
        sgemm(library.function<decltype(sgemm)>("cublasSgemm_v2")),
        sgemm_strided_batched(
            library.function<decltype(sgemm_strided_batched)>("cublasSgemmStridedBatched")),
        scopy(library.function<decltype(scopy)>("cublasScopy_v2")) {}
};

CublasExecutor::CublasExecutor(const std::vector<std::string>& library_candidates,
                               const LayerShape& shape, TokenMixing mixing,
                               std::uint64_t weight_seed, std::size_t workspace_bytes)
    : library_(DynamicLibrary::open_first(library_candidates, "libcublas")),
      api_(std::make_unique<Api>(library_)),
      shape_(shape),
      mixing_(mixing),
      weight_seed_(weight_seed),
      workspace_bytes_(workspace_bytes) {
  shape_.validate();
  check_workspace_bytes(workspace_bytes_);
}

void CublasExecutor::check_workspace_bytes(std::size_t workspace_bytes) {
  if (workspace_bytes > kMaxWorkspaceBytes) {
    throw std::invalid_argument("workspace_bytes: expected at most " +
                                std::to_string(kMaxWorkspaceBytes) + " (1 TiB); got " +
                                std::to_string(workspace_bytes));
  }
}

CublasExecutor::~CublasExecutor() {
  if (handle_ != nullptr) api_->destroy(handle_);
}

std::string CublasExecutor::name() const {
  return std::string("cublas(") + (mixing_ == TokenMixing::causal_mean ? "causal" : "token-wise") +
         " layer, batch " + std::to_string(shape_.batch) + " x slots " +
         std::to_string(shape_.slots) + ", hidden " + std::to_string(shape_.hidden) + ", ffn " +
         std::to_string(shape_.ffn) + ")";
}

std::size_t CublasExecutor::arena_bytes() const {
  const std::size_t floats = 2 * shape_.hidden * shape_.ffn +
                             shape_.batch * shape_.slots * shape_.slots +
                             shape_.rows() * shape_.hidden + shape_.rows() * shape_.ffn;
  return floats * sizeof(float) + workspace_bytes_ + 6 * 256;  // alignment padding
}

void CublasExecutor::prepare(DeviceArena& arena, StreamManager& streams) {
  if (handle_ != nullptr) throw std::logic_error("CublasExecutor::prepare called twice");
  const std::size_t matrix_floats = shape_.hidden * shape_.ffn;
  const std::size_t mixing_floats = shape_.batch * shape_.slots * shape_.slots;
  w1_ = static_cast<float*>(
      arena.allocate(MemoryKind::device, "cublas.w1", matrix_floats * sizeof(float)));
  w2_ = static_cast<float*>(
      arena.allocate(MemoryKind::device, "cublas.w2", matrix_floats * sizeof(float)));
  mixing_matrix_ = static_cast<float*>(
      arena.allocate(MemoryKind::device, "cublas.mixing", mixing_floats * sizeof(float)));
  mixed_ = static_cast<float*>(arena.allocate(MemoryKind::device, "cublas.mixed",
                                              shape_.rows() * shape_.hidden * sizeof(float)));
  units_ = static_cast<float*>(arena.allocate(MemoryKind::device, "cublas.units",
                                              shape_.rows() * shape_.ffn * sizeof(float)));
  workspace_ = arena.allocate(MemoryKind::device, "cublas.workspace", workspace_bytes_);

  // Parameters go up once through the copy stream, which warm-up may drain.
  const LayerWeights weights = LayerWeights::generate(shape_, weight_seed_);
  const std::vector<float> one = mixing_matrix(shape_.slots, mixing_);
  std::vector<float> all(mixing_floats);
  for (std::size_t b = 0; b < shape_.batch; ++b) {
    std::copy(one.begin(), one.end(), all.begin() + static_cast<std::ptrdiff_t>(b * one.size()));
  }
  DeviceBackend& backend = streams.backend();
  backend.copy_async(w1_, weights.w1.data(), weights.w1.size() * sizeof(float), streams.copy());
  backend.copy_async(w2_, weights.w2.data(), weights.w2.size() * sizeof(float), streams.copy());
  backend.copy_async(mixing_matrix_, all.data(), all.size() * sizeof(float), streams.copy());
  streams.synchronize(streams.copy());  // the host vectors die at the end of this scope

  check(api_->create(&handle_), "cublasCreate");
  check(api_->get_version(handle_, &version_), "cublasGetVersion");
  check(api_->set_math_mode(handle_, kCublasPedanticMath), "cublasSetMathMode");
  bind_stream(streams.compute());
}

void CublasExecutor::bind_stream(StreamHandle stream) {
  // cublasSetStream resets the workspace to cuBLAS's own pool: set the arena's again after it.
  check(api_->set_stream(handle_, stream), "cublasSetStream");
  check(api_->set_workspace(handle_, workspace_, workspace_bytes_), "cublasSetWorkspace");
  bound_stream_ = stream;
}

void CublasExecutor::enqueue(const void* device_input, void* device_output, StreamHandle stream) {
  if (handle_ == nullptr) throw std::logic_error("CublasExecutor::enqueue before prepare");
  if (stream != bound_stream_) bind_stream(stream);
  const float one = 1.0f;
  const float zero = 0.0f;
  const auto* x = static_cast<const float*>(device_input);
  auto* y = static_cast<float*>(device_output);
  const int hidden = as_int(shape_.hidden);
  const int ffn = as_int(shape_.ffn);
  const int slots = as_int(shape_.slots);
  const int rows = as_int(shape_.rows());
  const long long slot_floats = static_cast<long long>(shape_.slots * shape_.hidden);
  const long long mixing_floats = static_cast<long long>(shape_.slots * shape_.slots);
  // Row-major M = A · B is column-major Mᵀ = Bᵀ · Aᵀ: every call below passes B first.
  // C_b = L · X_b for every slot b.
  check(api_->sgemm_strided_batched(handle_, kCublasOpN, kCublasOpN, hidden, slots, slots, &one,
                                    x, hidden, slot_floats, mixing_matrix_, slots, mixing_floats,
                                    &zero, mixed_, hidden, slot_floats, as_int(shape_.batch)),
        "cublasSgemmStridedBatched (token mixing)");
  // U = C · W1.
  check(api_->sgemm(handle_, kCublasOpN, kCublasOpN, ffn, rows, hidden, &one, w1_, ffn, mixed_,
                    hidden, &zero, units_, ffn),
        "cublasSgemm (W1)");
  // Y = X, then Y += U · W2.
  check(api_->scopy(handle_, rows * hidden, x, 1, y, 1), "cublasScopy (residual)");
  check(api_->sgemm(handle_, kCublasOpN, kCublasOpN, hidden, rows, ffn, &one, w2_, hidden, units_,
                    ffn, &one, y, hidden),
        "cublasSgemm (W2)");
}

}  // namespace activekv::fabric
