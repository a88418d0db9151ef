// The decode layer both executors compute, and its reference. One layer of a transformer-like
// decode step, made of GEMMs only so that it runs as NVIDIA library kernels:
//   for each sequence slot b:  C_b = L · X_b          (token mixing: causal prefix mean, or none)
//                              Y   = X + (C · W1) · W2  (MLP with a residual)
// X and Y are [batch * slots, hidden] row-major float32; L is [slots, slots]. The mixing is what
// makes the tensor convention observable: packed tokens fed to a padded-convention layer mix
// tokens of neighbouring sequences.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace activekv::fabric {

enum class TokenMixing { causal_mean, none };

struct LayerShape {
  std::size_t batch;   // sequence slots per step
  std::size_t slots;   // tokens per slot (the padded sequence length)
  std::size_t hidden;
  std::size_t ffn;

  std::size_t rows() const { return batch * slots; }
  std::size_t activation_floats() const { return rows() * hidden; }
  void validate() const;  // std::invalid_argument naming the zero or overflowing field
};

struct LayerWeights {
  std::vector<float> w1;  // [hidden, ffn]
  std::vector<float> w2;  // [ffn, hidden]
  // Deterministic values in [-1, 1] / sqrt(fan-in): outputs stay of order one.
  static LayerWeights generate(const LayerShape& shape, std::uint64_t seed);
};

// A deterministic value in [-1, 1] for index `i` of stream `seed` (splitmix64).
float seeded_value(std::uint64_t seed, std::uint64_t i);

// L as [slots, slots] row-major: row t averages tokens 0..t (causal_mean) or is the identity.
std::vector<float> mixing_matrix(std::size_t slots, TokenMixing mixing);

// The layer applied to one sequence of `length` tokens ([length, hidden]), in double precision:
// the expected result, independent of any tensor layout.
std::vector<float> reference_sequence(const LayerShape& shape, const LayerWeights& weights,
                                      TokenMixing mixing, const float* tokens, std::size_t length);

// What an executor computes on a whole [batch * slots, hidden] buffer, on the host (the CPU
// executor of the tests).
std::vector<float> host_layer_forward(const LayerShape& shape, const LayerWeights& weights,
                                      TokenMixing mixing, const std::vector<float>& rows);

}  // namespace activekv::fabric
