// torch.nn.utils.rnn's pad_sequence: a list of variable-length sequences as one padded tensor.
#pragma once

#include <vector>

#include "graph/tensor.h"

namespace ember::nn::utils::rnn {

// sequences (L_i, *...) with the same trailing shape and dtype -> (L, B, *...), or (B, L, *...)
// with batch_first, L = max L_i, padded with padding_value. Differentiable in the sequences.
Tensor pad_sequence(const std::vector<Tensor>& sequences, bool batch_first = false,
                    double padding_value = 0);

}  // namespace ember::nn::utils::rnn
