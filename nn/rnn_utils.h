// torch.nn.utils.rnn: pad_sequence (a list of variable-length sequences as one padded tensor),
// and packed sequences: pack_padded_sequence and pad_packed_sequence, each one index_select
// (differentiable, on any device), as torch's.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "graph/tensor.h"

namespace ember::nn::utils::rnn {

// sequences (L_i, *...) with the same trailing shape and dtype -> (L, B, *...), or (B, L, *...)
// with batch_first, L = max L_i, padded with padding_value. Differentiable in the sequences.
Tensor pad_sequence(const std::vector<Tensor>& sequences, bool batch_first = false,
                    double padding_value = 0);

// As torch's PackedSequence: data (N, *) holds step t's batch_sizes[t] sequences in turn, longest
// first; batch_sizes (Int64, one per step of the longest sequence) is non-increasing;
// sorted_indices[i] is the batch index of the i-th longest sequence and unsorted_indices its
// inverse (both undefined when the batch was sorted already, enforce_sorted).
struct PackedSequence {
  Tensor data, batch_sizes, sorted_indices, unsorted_indices;
};

// input (T, B, *) (or (B, T, *) with batch_first) and lengths (B) of Int64 in [1, T] -> the valid
// steps packed. enforce_sorted: lengths must be non-increasing (else an Error); otherwise the
// sequences are sorted by decreasing length (ties in batch order). Differentiable in input.
PackedSequence pack_padded_sequence(const Tensor& input, const Tensor& lengths,
                                    bool batch_first = false, bool enforce_sorted = true);

struct PaddedSequence {
  Tensor padded, lengths;  // padded (L, B, *) or (B, L, *); lengths (B) Int64, in batch order
};

// The inverse of pack_padded_sequence: steps past a sequence's length hold padding_value;
// L = total_length when given (at least the longest length), else the longest length.
PaddedSequence pad_packed_sequence(const PackedSequence& sequence, bool batch_first = false,
                                   double padding_value = 0,
                                   std::optional<int64_t> total_length = {});

}  // namespace ember::nn::utils::rnn
