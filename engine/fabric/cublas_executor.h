// The cuBLAS executor: the decode layer of decode_layer.h as NVIDIA library kernels only (one
// strided-batched GEMM for the token mixing, a copy for the residual, two GEMMs for the MLP).
// libcublas is loaded at run time from the candidates given (the nvidia-cublas wheel's file or a
// system soname). Its workspace comes from the arena (cublasSetWorkspace), so cuBLAS never
// allocates after warm-up; the handle itself is created in prepare(), during warm-up.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "fabric/decode_layer.h"
#include "fabric/dynamic_library.h"
#include "fabric/executor.h"

namespace activekv::fabric {

class CublasExecutor final : public Executor {
 public:
  static constexpr std::size_t kDefaultWorkspaceBytes = std::size_t{32} << 20;  // Hopper's advice
  // More than any GPU's memory; keeps the arena's size arithmetic far from wrapping around.
  static constexpr std::size_t kMaxWorkspaceBytes = std::size_t{1} << 40;
  // std::invalid_argument naming workspace_bytes when it is over kMaxWorkspaceBytes.
  static void check_workspace_bytes(std::size_t workspace_bytes);

  CublasExecutor(const std::vector<std::string>& library_candidates, const LayerShape& shape,
                 TokenMixing mixing, std::uint64_t weight_seed,
                 std::size_t workspace_bytes = kDefaultWorkspaceBytes);
  ~CublasExecutor() override;

  std::string name() const override;
  std::size_t input_bytes() const override { return shape_.activation_floats() * sizeof(float); }
  std::size_t output_bytes() const override { return input_bytes(); }
  void prepare(DeviceArena& arena, StreamManager& streams) override;
  void enqueue(const void* device_input, void* device_output, StreamHandle stream) override;

  const std::string& library_path() const { return library_.path(); }
  int library_version() const { return version_; }
  // Device bytes this executor reserves from the arena (weights, mixing, scratch, workspace).
  std::size_t arena_bytes() const;

 private:
  struct Api;
  void bind_stream(StreamHandle stream);

  DynamicLibrary library_;
  std::unique_ptr<Api> api_;
  LayerShape shape_;
  TokenMixing mixing_;
  std::uint64_t weight_seed_;
  std::size_t workspace_bytes_;
  void* handle_ = nullptr;
  int version_ = 0;
  StreamHandle bound_stream_ = nullptr;
  float* w1_ = nullptr;
  float* w2_ = nullptr;
  float* mixing_matrix_ = nullptr;  // batch copies of L, one per slot
  float* mixed_ = nullptr;   // C: [rows, hidden]
  float* units_ = nullptr;   // C · W1: [rows, ffn]
  void* workspace_ = nullptr;
};

}  // namespace activekv::fabric
