#include "fabric/decode_layer.h"

#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>

namespace activekv::fabric {

void LayerShape::validate() const {
  const std::pair<const char*, std::size_t> fields[] = {
      {"batch", batch}, {"slots", slots}, {"hidden", hidden}, {"ffn", ffn}};
  for (const auto& [name, value] : fields) {
    if (value == 0) throw std::invalid_argument(std::string(name) + ": expected at least 1; got 0");
    // cuBLAS takes int dimensions.
    if (value > static_cast<std::size_t>(std::numeric_limits<int>::max() / 4)) {
      throw std::invalid_argument(std::string(name) + ": " + std::to_string(value) +
                                  " is too large for cuBLAS's int dimensions");
    }
  }
  // Each field is at most INT_MAX / 4, so these products fit a size_t.
  if (rows() > static_cast<std::size_t>(std::numeric_limits<int>::max() / 4)) {
    throw std::invalid_argument("batch * slots: too many rows for cuBLAS's int dimensions");
  }
  // The residual copy counts the activation's floats in an int (cublasScopy).
  if (activation_floats() > static_cast<std::size_t>(std::numeric_limits<int>::max())) {
    throw std::invalid_argument("batch * slots * hidden: " + std::to_string(activation_floats()) +
                                " floats is too many for cuBLAS's int counts");
  }
}

float seeded_value(std::uint64_t seed, std::uint64_t i) {
  std::uint64_t z = seed * 0x9E3779B97F4A7C15ull + i + 1;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  // 2001 evenly spaced values in [-1, 1]: exact in float, so both sides start from equal inputs.
  return static_cast<float>(static_cast<int>(z % 2001) - 1000) / 1000.0f;
}

LayerWeights LayerWeights::generate(const LayerShape& shape, std::uint64_t seed) {
  shape.validate();
  LayerWeights weights;
  weights.w1.resize(shape.hidden * shape.ffn);
  weights.w2.resize(shape.ffn * shape.hidden);
  const float scale1 = 1.0f / std::sqrt(static_cast<float>(shape.hidden));
  const float scale2 = 1.0f / std::sqrt(static_cast<float>(shape.ffn));
  for (std::size_t i = 0; i < weights.w1.size(); ++i) {
    weights.w1[i] = seeded_value(seed, i) * scale1;
  }
  for (std::size_t i = 0; i < weights.w2.size(); ++i) {
    weights.w2[i] = seeded_value(seed ^ 0x5EEDull, i) * scale2;
  }
  return weights;
}

std::vector<float> mixing_matrix(std::size_t slots, TokenMixing mixing) {
  std::vector<float> matrix(slots * slots, 0.0f);
  for (std::size_t t = 0; t < slots; ++t) {
    if (mixing == TokenMixing::none) {
      matrix[t * slots + t] = 1.0f;
    } else {
      for (std::size_t s = 0; s <= t; ++s) matrix[t * slots + s] = 1.0f / static_cast<float>(t + 1);
    }
  }
  return matrix;
}

namespace {

// Y rows of the MLP with residual for `count` mixed rows C (double accumulation).
void mlp_rows(const LayerShape& shape, const LayerWeights& weights, const float* inputs,
              const std::vector<double>& mixed, std::size_t count, float* outputs) {
  std::vector<double> hidden_units(shape.ffn);
  for (std::size_t r = 0; r < count; ++r) {
    const double* c = &mixed[r * shape.hidden];
    for (std::size_t f = 0; f < shape.ffn; ++f) hidden_units[f] = 0.0;
    for (std::size_t h = 0; h < shape.hidden; ++h) {
      const float* w1_row = &weights.w1[h * shape.ffn];
      for (std::size_t f = 0; f < shape.ffn; ++f) hidden_units[f] += c[h] * w1_row[f];
    }
    for (std::size_t h = 0; h < shape.hidden; ++h) {
      double sum = inputs[r * shape.hidden + h];
      for (std::size_t f = 0; f < shape.ffn; ++f) {
        sum += hidden_units[f] * weights.w2[f * shape.hidden + h];
      }
      outputs[r * shape.hidden + h] = static_cast<float>(sum);
    }
  }
}

// Mixed rows of one slot of `count` tokens (count <= slots).
std::vector<double> mix(const LayerShape& shape, TokenMixing mixing, const float* tokens,
                        std::size_t count) {
  std::vector<double> mixed(count * shape.hidden, 0.0);
  for (std::size_t t = 0; t < count; ++t) {
    const std::size_t first = mixing == TokenMixing::none ? t : 0;
    // The same float weights as mixing_matrix, so host and GPU use equal coefficients.
    const double weight =
        mixing == TokenMixing::none ? 1.0 : static_cast<double>(1.0f / static_cast<float>(t + 1));
    for (std::size_t s = first; s <= t; ++s) {
      for (std::size_t h = 0; h < shape.hidden; ++h) {
        mixed[t * shape.hidden + h] += weight * tokens[s * shape.hidden + h];
      }
    }
  }
  return mixed;
}

}  // namespace

std::vector<float> reference_sequence(const LayerShape& shape, const LayerWeights& weights,
                                      TokenMixing mixing, const float* tokens,
                                      std::size_t length) {
  std::vector<float> outputs(length * shape.hidden);
  mlp_rows(shape, weights, tokens, mix(shape, mixing, tokens, length), length, outputs.data());
  return outputs;
}

std::vector<float> host_layer_forward(const LayerShape& shape, const LayerWeights& weights,
                                      TokenMixing mixing, const std::vector<float>& rows) {
  if (rows.size() != shape.activation_floats()) {
    throw std::invalid_argument("rows: expected " + std::to_string(shape.activation_floats()) +
                                " floats; got " + std::to_string(rows.size()));
  }
  std::vector<float> outputs(rows.size());
  for (std::size_t b = 0; b < shape.batch; ++b) {
    const float* slot = &rows[b * shape.slots * shape.hidden];
    mlp_rows(shape, weights, slot, mix(shape, mixing, slot, shape.slots), shape.slots,
             &outputs[b * shape.slots * shape.hidden]);
  }
  return outputs;
}

}  // namespace activekv::fabric
