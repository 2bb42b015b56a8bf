// pad_sequence: each sequence concatenated with a block of padding, then stacked.
// pack_padded_sequence and pad_packed_sequence: one index_select each, whose index lists the
// source row of every destination row (the sort by length folded in), so both are
// differentiable and run on any device.
#include "nn/rnn_utils.h"

#include <algorithm>
#include <numeric>

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

namespace {

// The (T · B, *) view of a (T, B, *) tensor: its first two dims as one.
Shape merged_shape(const Tensor& t) {
  Shape shape(t.shape().begin() + 1, t.shape().end());
  shape[0] *= t.size(0);
  return shape;
}

std::vector<int64_t> int_values(const Tensor& t) {
  return t.to(kCPU).to(kInt64).to_vector<int64_t>();
}

}  // namespace

PackedSequence pack_padded_sequence(const Tensor& input, const Tensor& lengths, bool batch_first,
                                    bool enforce_sorted) {
  constexpr std::string_view op = "pack_padded_sequence";
  EMBER_CHECK(input.defined() && input.dim() >= 2,
              "{}: input should be (T, B, *) (or (B, T, *) with batch_first), got {}", op,
              input.defined() ? fmt::format("shape {}", input.shape()) : "an undefined tensor");
  EMBER_CHECK(lengths.defined() && lengths.dim() == 1 && !is_floating(lengths.dtype()),
              "{}: lengths should be a 1-D integer tensor, got {}", op,
              lengths.defined() ? fmt::format("{} of shape {}", lengths.dtype(), lengths.shape())
                                : "an undefined tensor");
  const int64_t T = input.size(batch_first ? 1 : 0), B = input.size(batch_first ? 0 : 1);
  EMBER_CHECK(lengths.size(0) == B && B > 0,
              "{}: lengths has {} entries but the input (shape {}, batch_first {}) has a batch of "
              "{}; both must be positive and equal",
              op, lengths.size(0), input.shape(), batch_first, B);
  const std::vector<int64_t> len = int_values(lengths);
  for (int64_t i = 0; i < B; ++i)
    EMBER_CHECK(len[i] > 0 && len[i] <= T,
                "{}: lengths[{}] is {}, outside [1, {}] (the steps of the input of shape {})", op,
                i, len[i], T, input.shape());
  std::vector<int64_t> order(static_cast<size_t>(B));
  std::iota(order.begin(), order.end(), int64_t{0});
  if (enforce_sorted) {
    for (int64_t i = 1; i < B; ++i)
      EMBER_CHECK(len[i] <= len[i - 1],
                  "{}: lengths must be sorted in decreasing order when enforce_sorted is true, got "
                  "[{}]; pass enforce_sorted = false to sort them",
                  op, fmt::join(len, ", "));
  } else {
    std::stable_sort(order.begin(), order.end(),
                     [&](int64_t a, int64_t b) { return len[a] > len[b]; });
  }
  const int64_t steps = len[order[0]];
  std::vector<int64_t> batch_sizes(static_cast<size_t>(steps)), rows;
  for (int64_t t = 0; t < steps; ++t) {
    for (int64_t b = 0; b < B && len[order[b]] > t; ++b) {
      rows.push_back(batch_first ? order[b] * T + t : t * B + order[b]);
      ++batch_sizes[t];
    }
  }
  const Tensor source = input.reshape(merged_shape(input));
  PackedSequence out;
  out.data = source.index_select(
      0, from_vector(rows, {static_cast<int64_t>(rows.size())}, input.device()));
  out.batch_sizes = from_vector(batch_sizes, {steps});
  if (!enforce_sorted) {
    std::vector<int64_t> inverse(order.size());
    for (int64_t b = 0; b < B; ++b) inverse[order[b]] = b;
    out.sorted_indices = from_vector(order, {B}, input.device());
    out.unsorted_indices = from_vector(inverse, {B}, input.device());
  }
  return out;
}

PaddedSequence pad_packed_sequence(const PackedSequence& sequence, bool batch_first,
                                   double padding_value, std::optional<int64_t> total_length) {
  constexpr std::string_view op = "pad_packed_sequence";
  const Tensor& data = sequence.data;
  EMBER_CHECK(data.defined() && data.dim() >= 1 && sequence.batch_sizes.defined() &&
                  sequence.batch_sizes.dim() == 1,
              "{}: expected a PackedSequence with data (N, *) and 1-D batch_sizes, got data {} and "
              "batch_sizes {}",
              op, data.defined() ? fmt::format("{}", data.shape()) : "undefined",
              sequence.batch_sizes.defined() ? fmt::format("{}", sequence.batch_sizes.shape())
                                             : "undefined");
  const std::vector<int64_t> bs = int_values(sequence.batch_sizes);
  const int64_t T = static_cast<int64_t>(bs.size()), B = T > 0 ? bs[0] : 0;
  int64_t N = 0;
  std::vector<int64_t> offset(bs.size());
  for (int64_t t = 0; t < T; ++t) {
    EMBER_CHECK(bs[t] > 0 && (t == 0 || bs[t] <= bs[t - 1]),
                "{}: batch_sizes must be positive and non-increasing, got [{}]", op,
                fmt::join(bs, ", "));
    offset[t] = N;
    N += bs[t];
  }
  EMBER_CHECK(N == data.size(0), "{}: batch_sizes [{}] sum to {} but data has {} rows (shape {})",
              op, fmt::join(bs, ", "), N, data.size(0), data.shape());
  const int64_t L = total_length.value_or(T);
  EMBER_CHECK(L >= T,
              "{}: total_length {} is less than the longest sequence's length {} (batch_sizes "
              "[{}])",
              op, L, T, fmt::join(bs, ", "));
  // position[j]: where batch entry j sits among the sorted sequences
  std::vector<int64_t> position(static_cast<size_t>(B));
  std::iota(position.begin(), position.end(), int64_t{0});
  if (sequence.unsorted_indices.defined()) {
    position = int_values(sequence.unsorted_indices);
    EMBER_CHECK(static_cast<int64_t>(position.size()) == B,
                "{}: unsorted_indices has {} entries for a batch of {}", op, position.size(), B);
  }
  std::vector<int64_t> sorted_length(static_cast<size_t>(B), 0);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t b = 0; b < bs[t]; ++b) ++sorted_length[b];
  std::vector<int64_t> rows(static_cast<size_t>(L * B)), lengths(static_cast<size_t>(B));
  for (int64_t j = 0; j < B; ++j) {
    const int64_t b = position[j];
    EMBER_CHECK(b >= 0 && b < B, "{}: unsorted_indices holds {} for a batch of {}", op, b, B);
    lengths[j] = sorted_length[b];
    for (int64_t t = 0; t < L; ++t)
      rows[batch_first ? j * L + t : t * B + j] = t < T && b < bs[t] ? offset[t] + b : N;
  }
  Shape pad_shape = data.shape(), shape = data.shape();
  pad_shape[0] = 1;
  shape[0] = batch_first ? L : B;
  shape.insert(shape.begin(), batch_first ? B : L);
  const Tensor with_pad =
      cat({data, full(pad_shape, padding_value, data.dtype(), data.device())}, 0);
  const Tensor index = from_vector(rows, {L * B}, data.device());
  return {with_pad.index_select(0, index).reshape(shape), from_vector(lengths, {B})};
}

}  // namespace ember::nn::utils::rnn
