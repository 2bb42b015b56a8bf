// The basic layers: Linear, Embedding, LayerNorm, Dropout. Each registers and initialises its
// parameters as PyTorch does; forward is one call of the functional op.
#pragma once

#include "nn/module.h"

namespace ember::nn {

// y = x @ weight^T + bias; weight (out, in) and bias (out) ~ U(-1/sqrt(in), 1/sqrt(in)).
class Linear : public Cloneable<Linear> {
 public:
  Linear(int64_t in_features, int64_t out_features, bool bias = true);
  Tensor forward(const Tensor& x) const;

  int64_t in_features, out_features;
  Tensor weight, bias;  // bias is undefined without one

 private:
  friend Cloneable;  // the only copier; see Note [Modules are not copyable]
  Linear(const Linear&) = default;
};

// Rows of weight (num_embeddings, embedding_dim) ~ N(0, 1) picked by Int64 indices.
class Embedding : public Cloneable<Embedding> {
 public:
  Embedding(int64_t num_embeddings, int64_t embedding_dim);
  Tensor forward(const Tensor& indices) const;

  int64_t num_embeddings, embedding_dim;
  Tensor weight;

 private:
  friend Cloneable;  // the only copier; see Note [Modules are not copyable]
  Embedding(const Embedding&) = default;
};

// torch.nn.LayerNorm over the last dim: (x - mean) / sqrt(biased var + eps) * weight + bias,
// weight ones and bias zeros of shape (features).
class LayerNorm : public Cloneable<LayerNorm> {
 public:
  explicit LayerNorm(int64_t features, double eps = 1e-5);
  Tensor forward(const Tensor& x) const;

  int64_t features;
  double eps;
  Tensor weight, bias;

 private:
  friend Cloneable;  // the only copier; see Note [Modules are not copyable]
  LayerNorm(const LayerNorm&) = default;
};

// Inverted dropout with probability p while training; the identity in eval().
class Dropout : public Cloneable<Dropout> {
 public:
  explicit Dropout(double p = 0.5);
  Tensor forward(const Tensor& x) const;

  double p;

 private:
  friend Cloneable;  // the only copier; see Note [Modules are not copyable]
  Dropout(const Dropout&) = default;
};

}  // namespace ember::nn
