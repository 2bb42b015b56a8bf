// Linear, Embedding, LayerNorm and Dropout: registration and PyTorch's default initialisation.
#include "nn/layers.h"

#include <cmath>

#include "graph/autograd.h"
#include "graph/creation.h"
#include "nn/init.h"
#include "ops/linalg.h"
#include "ops/nn_functional.h"

namespace ember::nn {

Linear::Linear(int64_t in, int64_t out, bool with_bias) : in_features(in), out_features(out) {
  EMBER_CHECK(in >= 0 && out >= 0,
              "Linear: in_features {} and out_features {} must be non-negative", in, out);
  // torch: kaiming_uniform_(a=sqrt(5)) for the weight, which is U(-1/sqrt(in), 1/sqrt(in)), and
  // the bias in the same bound, 0 when in is 0 (no input features: a constant bias of 0).
  const double bound = in > 0 ? 1.0 / std::sqrt(static_cast<double>(in)) : 0.0;
  register_parameter("weight", weight, empty({out, in}));
  init::uniform_(weight, -bound, bound);
  if (with_bias) {
    register_parameter("bias", bias, empty({out}));
    init::uniform_(bias, -bound, bound);
  }
}

Tensor Linear::forward(const Tensor& x) const { return linear(x, weight, bias); }

Embedding::Embedding(int64_t num, int64_t dim, std::optional<int64_t> padding)
    : num_embeddings(num), embedding_dim(dim), padding_idx(padding) {
  EMBER_CHECK(num > 0 && dim > 0,
              "Embedding: num_embeddings {} and embedding_dim {} must be positive", num, dim);
  if (padding_idx) {
    EMBER_CHECK(*padding_idx >= -num && *padding_idx < num,
                "Embedding: padding_idx {} out of range for {} embeddings", *padding_idx, num);
    if (*padding_idx < 0) *padding_idx += num;
  }
  register_parameter("weight", weight, empty({num, dim}));
  init::normal_(weight, 0.0, 1.0);
  if (padding_idx) {
    NoGradGuard no_grad;
    weight.narrow(0, *padding_idx, 1).zero_();
  }
}

Tensor Embedding::forward(const Tensor& indices) const {
  return embedding(weight, indices, padding_idx);
}

LayerNorm::LayerNorm(int64_t features, double eps, bool elementwise_affine, bool with_bias)
    : features(features), eps(eps) {
  EMBER_CHECK(features > 0, "LayerNorm: features must be positive, got {}", features);
  EMBER_CHECK(eps >= 0, "LayerNorm: eps must be non-negative, got {}", eps);
  if (!elementwise_affine) return;
  register_parameter("weight", weight, ones({features}));
  if (with_bias) register_parameter("bias", bias, zeros({features}));
}

Tensor LayerNorm::forward(const Tensor& x) const {
  return layer_norm(x, {features}, weight, bias, eps);
}

GELU::GELU(std::string approx) : approximate(std::move(approx)) {
  EMBER_CHECK(approximate == "none" || approximate == "tanh",
              "GELU: approximate must be \"none\" or \"tanh\", got \"{}\"", approximate);
}

Dropout::Dropout(double p) : p(p) {
  EMBER_CHECK(p >= 0 && p <= 1, "Dropout: probability must be in [0, 1], got {}", p);
}

Tensor Dropout::forward(const Tensor& x) const { return dropout(x, p, is_training()); }

}  // namespace ember::nn
