// D2L's attention scoring (chapter "Attention Mechanisms", section "Attention Scoring
// Functions"): masked_softmax, AdditiveAttention and DotProductAttention, with d2l's names and
// d2l's numbers. Built from differentiable ops, so they differentiate twice and run on any
// device. The transformer's multi-head attention lives in nn/transformer.h.
#pragma once

#include <memory>

#include "nn/layers.h"
#include "nn/module.h"

namespace ember::nn {

// softmax over the last dim of X (B, Q, K) with the scores at key positions >= the valid length
// set to -1e6 first, as d2l.masked_softmax. valid_lens is 1-D (B), one length for each batch row
// (all its queries), or 2-D (B, Q), one for each query; Int64, or floating as d2l allows (a
// position p is kept when p < valid_len). An undefined valid_lens is plain softmax over X of any
// shape. A length of 0 masks the whole row, which then weighs its keys evenly, as d2l's.
Tensor masked_softmax(const Tensor& X, const Tensor& valid_lens);

// Additive attention: score(q, k) = w_v · tanh(W_q q + W_k k). queries (B, Q, query_size), keys
// (B, K, key_size), values (B, K, V) -> (B, Q, V). Parameters W_k.weight (num_hiddens, key_size),
// W_q.weight (num_hiddens, query_size), w_v.weight (1, num_hiddens), as d2l's
// nn.Linear(bias=False).
class AdditiveAttention : public Cloneable<AdditiveAttention> {
 public:
  AdditiveAttention(int64_t key_size, int64_t query_size, int64_t num_hiddens, double dropout);
  Tensor forward(const Tensor& queries, const Tensor& keys, const Tensor& values,
                 const Tensor& valid_lens = {});

  std::shared_ptr<Linear> W_k, W_q, w_v;
  std::shared_ptr<Dropout> dropout;
  // (B, Q, K) of the last forward, detached (for show_heatmaps); undefined before one.
  Tensor attention_weights;

 protected:
  void rebind(const CloneMap& map) override;  // a copy owns its attention_weights too

 private:
  friend Cloneable;  // the only copier; see Note [Modules are not copyable]
  AdditiveAttention(const AdditiveAttention&) = default;
};

// Scaled dot-product attention: score(q, k) = q · k / sqrt(d). queries (B, Q, d), keys (B, K, d),
// values (B, K, V) -> (B, Q, V). No parameters.
class DotProductAttention : public Cloneable<DotProductAttention> {
 public:
  explicit DotProductAttention(double dropout);
  Tensor forward(const Tensor& queries, const Tensor& keys, const Tensor& values,
                 const Tensor& valid_lens = {});

  std::shared_ptr<Dropout> dropout;
  Tensor attention_weights;  // (B, Q, K) of the last forward, detached; undefined before one

 protected:
  void rebind(const CloneMap& map) override;

 private:
  friend Cloneable;
  DotProductAttention(const DotProductAttention&) = default;
};

}  // namespace ember::nn
