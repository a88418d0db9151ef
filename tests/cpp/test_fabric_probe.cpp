// The convention probe (layouts, decision, its three outcomes through a real decode step on the
// host backend), the CUPTI callback classifier and the run-time library loader.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include "test_support.h"

#include <vector>

#include "fabric/arena.h"
#include "fabric/convention_probe.h"
#include "fabric/cupti_monitor.h"
#include "fabric/decode_step.h"
#include "fabric/dynamic_library.h"
#include "fabric/errors.h"
#include "fabric/stream_manager.h"
#include "test_fabric_fakes.h"

namespace fabric = activekv::fabric;
using activekv::testing::contains;
using activekv::testing::error_message;
using fabric::ApiCategory;
using fabric::ConventionProbeError;
using fabric::LayerShape;
using fabric::ProbeReport;
using fabric::TensorConvention;
using fabric::TokenMixing;

namespace {

ProbeReport report(bool packed, bool padded) {
  return ProbeReport{{TensorConvention::packed_tokens, packed, packed ? 1e-7 : 0.5},
                     {TensorConvention::padded_batch, padded, padded ? 2e-7 : 0.25},
                     1e-3};
}

// The whole warm-up path on the host backend: executor, arena, decode step, probe, decision.
TensorConvention probe_with(TokenMixing executor_mixing, std::uint64_t executor_seed,
                            TokenMixing model_mixing, std::uint64_t model_seed,
                            ProbeReport* out = nullptr) {
  activekv::testing::FakeBackend backend;
  const LayerShape shape{4, 6, 8, 12};
  activekv::testing::HostExecutor executor(shape, executor_mixing, executor_seed);
  fabric::DeviceArena arena(backend, 1 << 16, 1 << 16);
  fabric::StreamManager streams(backend, 0, 2);
  fabric::DecodeStep step(arena, streams, executor);
  const fabric::ProbeBatch batch = fabric::make_probe_batch(shape, 11);
  const auto model = fabric::LayerWeights::generate(shape, model_seed);
  const ProbeReport result = fabric::run_convention_probe(
      batch, shape, fabric::expected_tokens(batch, shape, model, model_mixing),
      [&](const std::vector<float>& rows) { return step.run(rows); },
      1e-4);
  if (out != nullptr) *out = result;
  CHECK(executor.steps == 2);  // one micro-batch under each convention
  return fabric::decide_convention(result);
}

}  // namespace

TEST_CASE("exactly one match decides the convention") {
  CHECK(fabric::decide_convention(report(false, true)) == TensorConvention::padded_batch);
  CHECK(fabric::decide_convention(report(true, false)) == TensorConvention::packed_tokens);
}

TEST_CASE("both matching refuses to start") {
  const std::string message =
      error_message<ConventionProbeError>([] { fabric::decide_convention(report(true, true)); });
  CHECK(contains(message, "both of the candidate tensor conventions matched"));
  CHECK(contains(message, "cannot tell the conventions apart"));
  CHECK(contains(message, "refuses to start"));
}

TEST_CASE("neither matching refuses to start") {
  const std::string message = error_message<ConventionProbeError>(
      [] { fabric::decide_convention(report(false, false)); });
  CHECK(contains(message, "neither of the candidate tensor conventions matched"));
  CHECK(contains(message, "max error 0.5"));
  CHECK(contains(message, "max error 0.25"));
}

TEST_CASE("probe batch lengths differ and the layouts place tokens as named") {
  const LayerShape shape{3, 4, 2, 2};
  const fabric::ProbeBatch batch = fabric::make_probe_batch(shape, 5);
  REQUIRE(batch.lengths.size() == 3);
  CHECK(batch.lengths[0] == 1);
  CHECK(batch.lengths[1] == 4);
  const std::size_t tokens = batch.token_count();
  const auto packed = fabric::lay_out(batch, shape, TensorConvention::packed_tokens);
  const auto padded = fabric::lay_out(batch, shape, TensorConvention::padded_batch);
  // Token 1 (the first of sequence 1) is row 1 when packed and row 4 (slot 1) when padded.
  CHECK(packed[1 * 2] == batch.tokens[1 * 2]);
  CHECK(padded[4 * 2] == batch.tokens[1 * 2]);
  CHECK(padded[1 * 2] == 0.0f);  // padding
  for (TensorConvention c : {TensorConvention::packed_tokens, TensorConvention::padded_batch}) {
    CHECK(fabric::gather_tokens(batch, shape, c, fabric::lay_out(batch, shape, c)) ==
          batch.tokens);
  }
  CHECK(tokens * 2 == batch.tokens.size());
  CHECK(error_message<std::invalid_argument>([&] {
          fabric::gather_tokens(batch, shape, TensorConvention::packed_tokens, {1.0f});
        }) != "");
}

TEST_CASE("probe outcome one: a causal layer matches only the padded convention") {
  ProbeReport result{};
  CHECK(probe_with(TokenMixing::causal_mean, 1, TokenMixing::causal_mean, 1, &result) ==
        TensorConvention::padded_batch);
  CHECK(result.padded.max_error < 1e-6);
  CHECK(result.packed.max_error > 1e-2);  // tokens of neighbouring sequences were mixed
}

TEST_CASE("probe outcome both: a token-wise layer cannot tell the conventions apart") {
  const std::string message = error_message<ConventionProbeError>(
      [] { probe_with(TokenMixing::none, 1, TokenMixing::none, 1); });
  CHECK(contains(message, "both"));
}

TEST_CASE("probe outcome neither: an executor with other weights matches nothing") {
  const std::string message = error_message<ConventionProbeError>(
      [] { probe_with(TokenMixing::causal_mean, 2, TokenMixing::causal_mean, 1); });
  CHECK(contains(message, "neither"));
}

TEST_CASE("CUPTI callback names are classified by their base API name") {
  CHECK(fabric::base_api_name("cudaMalloc_v3020") == "cudaMalloc");
  CHECK(fabric::base_api_name("cuStreamSynchronize_ptsz") == "cuStreamSynchronize");
  CHECK(fabric::base_api_name("cudaStreamBeginCapture_ptsz_v10000") == "cudaStreamBeginCapture");
  CHECK(fabric::base_api_name("cuMemAlloc_v2") == "cuMemAlloc");
  CHECK(fabric::base_api_name("cuStreamBeginCapture_v2_ptsz") == "cuStreamBeginCapture");
  CHECK(fabric::base_api_name("cuInit") == "cuInit");

  struct Case {
    const char* name;
    ApiCategory category;
  };
  const Case cases[] = {
      {"cudaMalloc_v3020", ApiCategory::device_allocation},
      {"cuMemAlloc_v2", ApiCategory::device_allocation},
      {"cudaMallocAsync_ptsz_v11020", ApiCategory::async_allocation},
      {"cuMemAllocAsync", ApiCategory::async_allocation},
      {"cudaMallocFromPoolAsync_v11020", ApiCategory::pool_allocation},
      {"cuMemAllocFromPoolAsync_ptsz", ApiCategory::pool_allocation},
      {"cuMemCreate", ApiCategory::vmm_allocation},
      {"cuMemHostAlloc_v2", ApiCategory::pinned_allocation},
      {"cudaHostAlloc_v3020", ApiCategory::pinned_allocation},
      {"cudaMallocHost_v3020", ApiCategory::pinned_allocation},
      {"cuMemAllocHost_v2", ApiCategory::pinned_allocation},
      {"cuMemHostRegister_v2", ApiCategory::host_register},
      {"cudaHostRegister_v4000", ApiCategory::host_register},
      {"cudaStreamSynchronize_v3020", ApiCategory::stream_synchronize},
      {"cuCtxSynchronize_v2", ApiCategory::context_synchronize},
      {"cudaDeviceSynchronize_v3020", ApiCategory::context_synchronize},
      {"cudaEventSynchronize_v3020", ApiCategory::event_synchronize},
      {"cuStreamBeginCaptureToGraph_ptsz", ApiCategory::stream_capture},
      {"cudaStreamBeginCapture_v10000", ApiCategory::stream_capture},
  };
  for (const Case& c : cases) {
    CAPTURE(c.name);
    const auto category = fabric::classify_api(c.name);
    REQUIRE(category.has_value());
    CHECK(*category == c.category);
  }
  for (const char* ignored : {"cudaFree_v3020", "cuMemFree_v2", "cudaStreamIsCapturing_v10000",
                              "cudaStreamEndCapture_v10000", "cudaMemcpyAsync_v3020",
                              "cuMemPoolTrimTo", "cudaMallocator"}) {
    CAPTURE(ignored);
    CHECK_FALSE(fabric::classify_api(ignored).has_value());
  }
}

TEST_CASE("a missing library is named with every candidate tried") {
  const std::string message = error_message<fabric::LibraryLoadError>([] {
    fabric::DynamicLibrary::open_first({"/nonexistent/libcublas.so.13", "libno-such-cublas.so"},
                                       "libcublas");
  });
  CHECK(contains(message, "libcublas could not be loaded; tried 2 candidate(s)"));
  CHECK(contains(message, "/nonexistent/libcublas.so.13"));
  CHECK(contains(message, "libno-such-cublas.so"));
  CHECK(contains(error_message<fabric::LibraryLoadError>(
                     [] { fabric::DynamicLibrary::open_first({}, "libcupti"); }),
                 "none given"));
}

TEST_CASE("a missing symbol is named with the library") {
  const auto library = fabric::DynamicLibrary::open_first({"libc.so.6"}, "libc");
  CHECK(library.symbol("malloc") != nullptr);
  const std::string message =
      error_message<fabric::LibraryLoadError>([&] { library.symbol("cublasNoSuchFunction"); });
  CHECK(contains(message, "libc at libc.so.6 lacks the symbol cublasNoSuchFunction"));
}
