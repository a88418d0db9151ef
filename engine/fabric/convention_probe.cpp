#include "fabric/convention_probe.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <sstream>
#include <stdexcept>

#include "fabric/errors.h"

namespace activekv::fabric {

const char* convention_name(TensorConvention convention) {
  return convention == TensorConvention::packed_tokens ? "packed [tokens, hidden]"
                                                       : "padded [batch, seq, hidden]";
}

std::size_t ProbeBatch::token_count() const {
  return std::accumulate(lengths.begin(), lengths.end(), std::size_t{0});
}

ProbeBatch make_probe_batch(const LayerShape& shape, std::uint64_t seed) {
  shape.validate();
  ProbeBatch batch;
  for (std::size_t b = 0; b < shape.batch; ++b) {
    // 1, slots, then lengths cycling through the rest: short and full sequences side by side.
    std::size_t length = b == 0 ? 1 : b == 1 ? shape.slots : 1 + (b * 7 + 3) % shape.slots;
    batch.lengths.push_back(std::min(length, shape.slots));
  }
  batch.tokens.resize(batch.token_count() * shape.hidden);
  for (std::size_t i = 0; i < batch.tokens.size(); ++i) batch.tokens[i] = seeded_value(seed, i);
  return batch;
}

namespace {

void check_batch(const ProbeBatch& batch, const LayerShape& shape) {
  if (batch.lengths.size() != shape.batch) {
    throw std::invalid_argument("probe batch: expected " + std::to_string(shape.batch) +
                                " sequences; got " + std::to_string(batch.lengths.size()));
  }
  for (std::size_t length : batch.lengths) {
    if (length == 0 || length > shape.slots) {
      throw std::invalid_argument("probe batch: sequence length " + std::to_string(length) +
                                  " outside [1, " + std::to_string(shape.slots) + "]");
    }
  }
  if (batch.tokens.size() != batch.token_count() * shape.hidden) {
    throw std::invalid_argument("probe batch: tokens hold " + std::to_string(batch.tokens.size()) +
                                " floats; expected sum(lengths) * hidden");
  }
}

// Row of token t of sequence b under `convention`.
std::size_t row_of(const LayerShape& shape, TensorConvention convention, std::size_t b,
                   std::size_t packed_offset, std::size_t t) {
  return convention == TensorConvention::packed_tokens ? packed_offset + t : b * shape.slots + t;
}

}  // namespace

std::vector<float> lay_out(const ProbeBatch& batch, const LayerShape& shape,
                           TensorConvention convention) {
  check_batch(batch, shape);
  std::vector<float> rows(shape.activation_floats(), 0.0f);
  std::size_t offset = 0;
  for (std::size_t b = 0; b < shape.batch; ++b) {
    for (std::size_t t = 0; t < batch.lengths[b]; ++t) {
      const std::size_t row = row_of(shape, convention, b, offset, t);
      std::copy_n(&batch.tokens[(offset + t) * shape.hidden], shape.hidden,
                  &rows[row * shape.hidden]);
    }
    offset += batch.lengths[b];
  }
  return rows;
}

std::vector<float> gather_tokens(const ProbeBatch& batch, const LayerShape& shape,
                                 TensorConvention convention, const std::vector<float>& rows) {
  check_batch(batch, shape);
  if (rows.size() != shape.activation_floats()) {
    throw std::invalid_argument("executor output: expected " +
                                std::to_string(shape.activation_floats()) + " floats; got " +
                                std::to_string(rows.size()));
  }
  std::vector<float> tokens(batch.token_count() * shape.hidden);
  std::size_t offset = 0;
  for (std::size_t b = 0; b < shape.batch; ++b) {
    for (std::size_t t = 0; t < batch.lengths[b]; ++t) {
      const std::size_t row = row_of(shape, convention, b, offset, t);
      std::copy_n(&rows[row * shape.hidden], shape.hidden, &tokens[(offset + t) * shape.hidden]);
    }
    offset += batch.lengths[b];
  }
  return tokens;
}

std::vector<float> expected_tokens(const ProbeBatch& batch, const LayerShape& shape,
                                   const LayerWeights& weights, TokenMixing mixing) {
  check_batch(batch, shape);
  std::vector<float> expected;
  expected.reserve(batch.tokens.size());
  std::size_t offset = 0;
  for (std::size_t length : batch.lengths) {
    const std::vector<float> sequence = reference_sequence(
        shape, weights, mixing, &batch.tokens[offset * shape.hidden], length);
    expected.insert(expected.end(), sequence.begin(), sequence.end());
    offset += length;
  }
  return expected;
}

double max_relative_error(const float* got, const std::vector<float>& expected) {
  double max_error = 0.0;
  for (std::size_t i = 0; i < expected.size(); ++i) {
    const double error = std::fabs(static_cast<double>(got[i]) - expected[i]) /
                         (1.0 + std::fabs(static_cast<double>(expected[i])));
    // A NaN never compares greater: count it as the worst error.
    max_error = std::isnan(error) ? INFINITY : std::max(max_error, error);
  }
  return max_error;
}

namespace {

ConventionResult compare(TensorConvention convention, const std::vector<float>& got,
                         const std::vector<float>& expected, double tolerance) {
  const double max_error = max_relative_error(got.data(), expected);
  return ConventionResult{convention, max_error <= tolerance, max_error};
}

}  // namespace

ProbeReport run_convention_probe(const ProbeBatch& batch, const LayerShape& shape,
                                 const std::vector<float>& expected, const RunRows& run,
                                 double tolerance) {
  if (expected.size() != batch.token_count() * shape.hidden) {
    throw std::invalid_argument("expected: " + std::to_string(expected.size()) +
                                " floats; expected sum(lengths) * hidden");
  }
  ProbeReport report{{TensorConvention::packed_tokens, false, 0.0},
                     {TensorConvention::padded_batch, false, 0.0},
                     tolerance};
  for (ConventionResult* result : {&report.packed, &report.padded}) {
    const std::vector<float> output = run(lay_out(batch, shape, result->convention));
    *result = compare(result->convention,
                      gather_tokens(batch, shape, result->convention, output), expected,
                      tolerance);
  }
  return report;
}

TensorConvention decide_convention(const ProbeReport& report) {
  if (report.packed.matches != report.padded.matches) {
    return report.packed.matches ? report.packed.convention : report.padded.convention;
  }
  std::ostringstream message;
  message << "convention probe: " << (report.packed.matches ? "both" : "neither")
          << " of the candidate tensor conventions matched the expected result (packed "
          << "[tokens, hidden]: max error " << report.packed.max_error << "; padded "
          << "[batch, seq, hidden]: max error " << report.padded.max_error << "; tolerance "
          << report.tolerance << "); the worker refuses to start: "
          << (report.packed.matches
                  ? "the probe batch cannot tell the conventions apart"
                  : "the executor computes something other than the expected layer");
  throw ConventionProbeError(message.str());
}

}  // namespace activekv::fabric
