// The Annotated Transformer's copy task: the parts of its training loop that belong to the task
// rather than to the library (nn/transformer.h holds Batch and LabelSmoothing). data_gen draws the
// random sequences; SimpleLossCompute applies the generator and the criterion and divides by the
// number of target tokens. Shared by examples/transformer_copy.cpp, bench/transformer_steps.cpp
// and tests/test_transformer.cpp.
#pragma once

#include <cstdint>
#include <vector>

#include "ember.h"

namespace copy_task {

// nbatches batches of the copy task: rows of 10 tokens from randint(1, V), the first set to 1,
// with tgt = src and pad 0 (no token is padding).
inline std::vector<ember::nn::Batch> data_gen(int64_t V, int64_t batch_size, int64_t nbatches) {
  EMBER_CHECK(V >= 2 && batch_size >= 1 && nbatches >= 0,
              "data_gen: need V >= 2, batch_size >= 1 and nbatches >= 0, got {}, {}, {}", V,
              batch_size, nbatches);
  std::vector<ember::nn::Batch> batches;
  batches.reserve(static_cast<size_t>(nbatches));
  for (int64_t i = 0; i < nbatches; ++i) {
    ember::Tensor data = ember::randint(1, V, {batch_size, 10});
    int64_t* d = data.data<int64_t>();
    for (int64_t b = 0; b < batch_size; ++b) d[b * 10] = 1;
    batches.emplace_back(data, data, 0);
  }
  return batches;
}

// generator then criterion over the flattened tokens, divided by norm (the batch's ntokens):
// returns the loss per token to differentiate and the summed loss (its value times norm).
struct LossOutput {
  double total;        // the original's `sloss.data * norm`
  ember::Tensor loss;  // the original's `sloss`
};
class SimpleLossCompute {
 public:
  SimpleLossCompute(ember::nn::Generator& generator, ember::nn::LabelSmoothing& criterion)
      : generator(generator), criterion(criterion) {}
  // x (B, T, D) decoder output, y (B, T) Int64 targets; norm is the batch's ntokens (divided by
  // the processes when each trains on a share of the batch: examples/data_parallel.h).
  LossOutput operator()(const ember::Tensor& x, const ember::Tensor& y, double norm) {
    const ember::Tensor logits = generator.forward(x);
    const ember::Tensor sloss =
        criterion(logits.contiguous().view({-1, logits.size(-1)}), y.contiguous().view({-1})) /
        norm;
    return {sloss.item<double>() * norm, sloss};
  }

  ember::nn::Generator& generator;
  ember::nn::LabelSmoothing& criterion;
};

}  // namespace copy_task
