// The convention probe: at warm-up one micro-batch of sequences of different lengths runs through
// the executor twice, laid out under each candidate tensor convention, and each result is compared
// with the expected per-token result. Exactly one convention must match; if both match (the
// micro-batch cannot tell them apart) or neither does (the executor computes something else), the
// worker refuses to start with ConventionProbeError.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "fabric/decode_layer.h"

namespace activekv::fabric {

enum class TensorConvention {
  packed_tokens,  // [tokens, hidden]: sequences back to back, unused rows at the end
  padded_batch,   // [batch, slots, hidden]: sequence b in slot b, padded with zero rows
};

const char* convention_name(TensorConvention convention);

struct ProbeBatch {
  std::vector<std::size_t> lengths;  // one per slot, each in [1, slots]
  std::vector<float> tokens;         // packed [sum(lengths), hidden]
  std::size_t token_count() const;
};

// Distinct lengths where the shape allows (one of them 1, one of them the full slot), so that a
// layer mixing tokens within a slot gives different answers under the two conventions.
ProbeBatch make_probe_batch(const LayerShape& shape, std::uint64_t seed);

// The [batch * slots, hidden] buffer holding `batch` under `convention`, zeros elsewhere.
std::vector<float> lay_out(const ProbeBatch& batch, const LayerShape& shape,
                           TensorConvention convention);
// The per-token rows of `rows` read back under `convention`: packed [sum(lengths), hidden].
std::vector<float> gather_tokens(const ProbeBatch& batch, const LayerShape& shape,
                                 TensorConvention convention, const std::vector<float>& rows);

// The expected per-token outputs of the model (reference_sequence of every sequence), packed.
std::vector<float> expected_tokens(const ProbeBatch& batch, const LayerShape& shape,
                                   const LayerWeights& weights, TokenMixing mixing);

// max |got - expected| / (1 + |expected|) over expected.size() elements of `got`; a NaN counts
// as the worst error (infinity).
double max_relative_error(const float* got, const std::vector<float>& expected);

struct ConventionResult {
  TensorConvention convention;
  bool matches;
  double max_error;  // max |got - expected| / (1 + |expected|)
};

struct ProbeReport {
  ConventionResult packed;
  ConventionResult padded;
  double tolerance;
};

// Runs one [batch * slots, hidden] buffer through the executor and returns its output buffer.
using RunRows = std::function<std::vector<float>(const std::vector<float>&)>;

ProbeReport run_convention_probe(const ProbeBatch& batch, const LayerShape& shape,
                                 const std::vector<float>& expected, const RunRows& run,
                                 double tolerance);

// The one matching convention; ConventionProbeError (naming both errors) when both or neither
// match. Pure decision logic.
TensorConvention decide_convention(const ProbeReport& report);

}  // namespace activekv::fabric
