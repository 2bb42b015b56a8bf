// The Annotated Transformer's training pieces for its synthetic copy task: Batch (masks and the
// shifted target), data_gen (random sequences starting with 1), LabelSmoothing (the KL criterion)
// and SimpleLossCompute (generator + criterion, divided by the number of target tokens).
#pragma once

#include <cstdint>
#include <vector>

#include "nn/transformer.h"

namespace ember::nn {

// One batch of Int64 src (B, S) and tgt (B, T + 1) with padding `pad`:
//   src_mask (B, 1, S)  true at non-pad source tokens;
//   tgt      (B, T)     tgt without its last token (the decoder input, shifted right);
//   tgt_y    (B, T)     tgt without its first token (what the decoder predicts);
//   tgt_mask (B, T, T)  non-pad target tokens that are not in the future;
//   ntokens             non-pad tokens of tgt_y.
// Without tgt, only src and src_mask are set.
struct Batch {
  explicit Batch(Tensor src, const Tensor& tgt = {}, int64_t pad = 2);
  // (tgt != pad).unsqueeze(-2) & subsequent_mask(T).
  static Tensor make_std_mask(const Tensor& tgt, int64_t pad);

  Tensor src, src_mask, tgt, tgt_y, tgt_mask;
  int64_t ntokens = 0;
};

// nbatches batches of the copy task: rows of 10 tokens from randint(1, V), the first set to 1,
// with tgt = src and pad 0 (no token is padding).
std::vector<Batch> data_gen(int64_t V, int64_t batch_size, int64_t nbatches);

// KL divergence (summed) of log-probabilities x (N, size) against the smoothed target
// distribution: `confidence` = 1 - smoothing on the target class, smoothing / (size - 2) on each
// other class but padding_idx, and an all-zero row where the target is padding_idx.
class LabelSmoothing {
 public:
  LabelSmoothing(int64_t size, int64_t padding_idx, double smoothing = 0.0);
  // x (N, size) log-probabilities, target (N) Int64 -> scalar loss.
  Tensor forward(const Tensor& x, const Tensor& target);
  Tensor operator()(const Tensor& x, const Tensor& target) { return forward(x, target); }

  int64_t size, padding_idx;
  double confidence, smoothing;
  Tensor true_dist;  // the last target distribution (N, size)
};

// generator then criterion over the flattened tokens, divided by norm (the batch's ntokens):
// returns the loss per token to differentiate and the summed loss (its value times norm).
struct LossOutput {
  double total;  // the original's `sloss.data * norm`
  Tensor loss;   // the original's `sloss`
};
class SimpleLossCompute {
 public:
  SimpleLossCompute(Generator& generator, LabelSmoothing& criterion)
      : generator(generator), criterion(criterion) {}
  // x (B, T, D) decoder output, y (B, T) Int64 targets.
  LossOutput operator()(const Tensor& x, const Tensor& y, int64_t norm);

  Generator& generator;
  LabelSmoothing& criterion;
};

}  // namespace ember::nn
