// Batch, data_gen, LabelSmoothing and SimpleLossCompute of the Annotated Transformer's copy task.
#include "nn/copy_task.h"

#include "graph/creation.h"
#include "graph/random.h"
#include "ops/elementwise.h"
#include "ops/loss.h"

namespace ember::nn {

Batch::Batch(Tensor src_, const Tensor& tgt_, int64_t pad) : src(std::move(src_)) {
  EMBER_CHECK(src.defined() && src.dim() == 2 && src.dtype() == kInt64,
              "Batch: src must be Int64 (batch, len), got {}",
              src.defined() ? fmt::format("{} of shape {}", src.dtype(), src.shape()) : "none");
  src_mask = src.ne(static_cast<double>(pad)).unsqueeze(-2);
  if (!tgt_.defined()) return;
  EMBER_CHECK(
      tgt_.dim() == 2 && tgt_.dtype() == kInt64 && tgt_.size(1) >= 2 && tgt_.size(0) == src.size(0),
      "Batch: tgt must be Int64 (batch {}, len >= 2), got {} of shape {}", src.size(0),
      tgt_.dtype(), tgt_.shape());
  const int64_t T = tgt_.size(1) - 1;
  tgt = tgt_.narrow(1, 0, T);
  tgt_y = tgt_.narrow(1, 1, T);
  tgt_mask = make_std_mask(tgt, pad);
  ntokens = 0;
  for (int64_t token : tgt_y.to_vector<int64_t>()) ntokens += token != pad;
}

Tensor Batch::make_std_mask(const Tensor& tgt, int64_t pad) {
  return logical_and(tgt.ne(static_cast<double>(pad)).unsqueeze(-2), subsequent_mask(tgt.size(-1)));
}

std::vector<Batch> data_gen(int64_t V, int64_t batch_size, int64_t nbatches) {
  EMBER_CHECK(V >= 2 && batch_size >= 1 && nbatches >= 0,
              "data_gen: need V >= 2, batch_size >= 1 and nbatches >= 0, got {}, {}, {}", V,
              batch_size, nbatches);
  std::vector<Batch> batches;
  batches.reserve(static_cast<size_t>(nbatches));
  for (int64_t i = 0; i < nbatches; ++i) {
    Tensor data = randint(1, V, {batch_size, 10});
    int64_t* d = data.data<int64_t>();
    for (int64_t b = 0; b < batch_size; ++b) d[b * 10] = 1;
    batches.emplace_back(data, data, 0);
  }
  return batches;
}

LabelSmoothing::LabelSmoothing(int64_t size, int64_t padding_idx, double smoothing)
    : size(size), padding_idx(padding_idx), confidence(1.0 - smoothing), smoothing(smoothing) {
  EMBER_CHECK(size > 2 && padding_idx >= 0 && padding_idx < size,
              "LabelSmoothing: need size > 2 and 0 <= padding_idx < size, got {} and {}", size,
              padding_idx);
  EMBER_CHECK(smoothing >= 0 && smoothing <= 1,
              "LabelSmoothing: smoothing must be in [0, 1], got {}", smoothing);
}

Tensor LabelSmoothing::forward(const Tensor& x, const Tensor& target) {
  EMBER_CHECK(x.dim() == 2 && x.size(1) == size,
              "LabelSmoothing: input {} must be (N, {}) log-probabilities", x.shape(), size);
  EMBER_CHECK(target.dtype() == kInt64 && target.shape() == Shape{x.size(0)},
              "LabelSmoothing: target {} of shape {} must be Int64 ({})", target.dtype(),
              target.shape(), x.size(0));
  // true_dist (N, size): smoothing / (size - 2) everywhere, confidence at the target, 0 in the
  // padding column and in rows whose target is padding.
  const int64_t N = x.size(0);
  true_dist = full({N, size}, smoothing / static_cast<double>(size - 2), x.dtype());
  const std::vector<int64_t> t = target.to_vector<int64_t>();
  dispatch_float(x.dtype(), "LabelSmoothing", [&]<class T>() {
    T* d = true_dist.data<T>();
    for (int64_t n = 0; n < N; ++n) {
      EMBER_CHECK(t[n] >= 0 && t[n] < size, "LabelSmoothing: target {} out of range for {} classes",
                  t[n], size);
      T* row = d + n * size;
      row[t[n]] = static_cast<T>(confidence);
      row[padding_idx] = T(0);
      if (t[n] == padding_idx)
        for (int64_t c = 0; c < size; ++c) row[c] = T(0);
    }
  });
  return kl_div(x, true_dist, Reduction::Sum);
}

LossOutput SimpleLossCompute::operator()(const Tensor& x, const Tensor& y, int64_t norm) {
  const Tensor logits = generator.forward(x);
  const Tensor sloss =
      criterion(logits.contiguous().view({-1, logits.size(-1)}), y.contiguous().view({-1})) /
      static_cast<double>(norm);
  return {sloss.item<double>() * static_cast<double>(norm), sloss};
}

}  // namespace ember::nn
