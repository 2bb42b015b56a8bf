// pad_sequence: each sequence concatenated with a block of padding, then stacked.
#include "nn/rnn_utils.h"

#include <algorithm>

#include "graph/creation.h"
#include "graph/error.h"
#include "ops/index.h"

namespace ember::nn::utils::rnn {

Tensor pad_sequence(const std::vector<Tensor>& sequences, bool batch_first, double padding_value) {
  EMBER_CHECK(!sequences.empty(), "pad_sequence: received an empty list of sequences");
  const Tensor& first = sequences.front();
  EMBER_CHECK(first.defined() && first.dim() >= 1,
              "pad_sequence: sequences need at least 1 dim, got {}",
              first.defined() ? fmt::format("shape {}", first.shape()) : "an undefined tensor");
  const Shape trailing(first.shape().begin() + 1, first.shape().end());
  int64_t L = 0;
  for (size_t i = 0; i < sequences.size(); ++i) {
    const Tensor& s = sequences[i];
    EMBER_CHECK(s.defined() && s.dim() == first.dim() && s.dtype() == first.dtype() &&
                    Shape(s.shape().begin() + 1, s.shape().end()) == trailing,
                "pad_sequence: sequence {} ({}) does not match sequence 0 ({} of shape {}) in "
                "dtype or trailing shape",
                i, s.defined() ? fmt::format("{} of shape {}", s.dtype(), s.shape()) : "undefined",
                first.dtype(), first.shape());
    L = std::max(L, s.size(0));
  }
  std::vector<Tensor> padded;
  padded.reserve(sequences.size());
  for (const Tensor& s : sequences) {
    if (s.size(0) == L) {
      padded.push_back(s);
      continue;
    }
    Shape block = trailing;
    block.insert(block.begin(), L - s.size(0));
    padded.push_back(cat({s, full(block, padding_value, s.dtype(), s.device())}, 0));
  }
  return stack(padded, batch_first ? 0 : 1);
}

}  // namespace ember::nn::utils::rnn
