// The basic layers: Linear, Embedding, LayerNorm, Dropout. Each registers and initialises its
// parameters as PyTorch does; forward is one call of the functional op.
#pragma once

#include <optional>
#include <string>

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
  // padding_idx (negative counts from the end): that row starts at zero and gets no gradient.
  Embedding(int64_t num_embeddings, int64_t embedding_dim,
            std::optional<int64_t> padding_idx = std::nullopt);
  Tensor forward(const Tensor& indices) const;

  int64_t num_embeddings, embedding_dim;
  std::optional<int64_t> padding_idx;  // wrapped to [0, num_embeddings)
  Tensor weight;

 private:
  friend Cloneable;  // the only copier; see Note [Modules are not copyable]
  Embedding(const Embedding&) = default;
};

// torch.nn.LayerNorm over the last dim: (x - mean) / sqrt(biased var + eps) * weight + bias,
// weight ones and bias zeros of shape (features); without elementwise_affine neither, without
// bias no bias (both then undefined).
class LayerNorm : public Cloneable<LayerNorm> {
 public:
  explicit LayerNorm(int64_t features, double eps = 1e-5, bool elementwise_affine = true,
                     bool bias = true);
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

// Activations as modules, for Sequential: torch.nn.ReLU, GELU(approximate), SiLU, Tanh.
class ReLU : public Cloneable<ReLU> {
 public:
  ReLU() = default;
  Tensor forward(const Tensor& x) const { return relu(x); }
  static constexpr bool kIsRelu = true;  // Sequential fuses it into a module's forward_relu

 private:
  friend Cloneable;
  ReLU(const ReLU&) = default;
};

class GELU : public Cloneable<GELU> {
 public:
  explicit GELU(std::string approximate = "none");
  Tensor forward(const Tensor& x) const { return gelu(x, approximate); }

  std::string approximate;

 private:
  friend Cloneable;
  GELU(const GELU&) = default;
};

class SiLU : public Cloneable<SiLU> {
 public:
  SiLU() = default;
  Tensor forward(const Tensor& x) const { return silu(x); }

 private:
  friend Cloneable;
  SiLU(const SiLU&) = default;
};

class Tanh : public Cloneable<Tanh> {
 public:
  Tanh() = default;
  Tensor forward(const Tensor& x) const { return tanh(x); }

 private:
  friend Cloneable;
  Tanh(const Tanh&) = default;
};

}  // namespace ember::nn
