// Neural-network functions with fused kernels: softmax, log_softmax, layer_norm, dropout and
// embedding.
#pragma once

#include "graph/tensor.h"

namespace ember {

Tensor softmax(const Tensor& x, int64_t dim);      // exp(x - max) / sum, along dim
Tensor log_softmax(const Tensor& x, int64_t dim);  // x - max - log(sum(exp(x - max)))
// (x - mean) / sqrt(biased var + eps) * weight + bias over the trailing normalized_shape dims;
// weight and bias are optional (undefined).
Tensor layer_norm(const Tensor& x, Shape normalized_shape, const Tensor& weight = {},
                  const Tensor& bias = {}, double eps = 1e-5);
// Inverted dropout: zeroes with probability p and scales the rest by 1/(1-p) when training.
Tensor dropout(const Tensor& x, double p, bool training);
// Rows of weight (num, dim) picked by Int64 indices of any shape -> (*indices.shape, dim).
Tensor embedding(const Tensor& weight, const Tensor& indices);

}  // namespace ember
