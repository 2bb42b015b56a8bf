// Losses with torch semantics and Reduction::{None, Mean, Sum}.
#pragma once

#include "graph/tensor.h"

namespace ember {

// (input - target)², reduced.
Tensor mse_loss(const Tensor& input, const Tensor& target, Reduction reduction = Reduction::Mean);
// -log_probs[n, target[n]] for log_probs (N, C) or (C) and Int64 target (N) or (); targets equal
// to ignore_index count zero and are left out of the mean.
Tensor nll_loss(const Tensor& log_probs, const Tensor& target,
                Reduction reduction = Reduction::Mean, int64_t ignore_index = -100);
// nll_loss(log_softmax(logits, 1), target) fused, with torch's label smoothing.
Tensor cross_entropy(const Tensor& logits, const Tensor& target,
                     Reduction reduction = Reduction::Mean, int64_t ignore_index = -100,
                     double label_smoothing = 0.0);
// target * (log target - log_probs) pointwise (0 where target is 0), reduced; Mean divides by
// the number of elements, as torch.
Tensor kl_div(const Tensor& log_probs, const Tensor& target, Reduction reduction = Reduction::Mean);

}  // namespace ember
