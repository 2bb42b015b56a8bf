// D2L's attention scoring, line for line on Ember's ops: masked_softmax (d2l's sequence_mask
// with value -1e6, then softmax), AdditiveAttention and DotProductAttention. Every step is a
// differentiable op, so each differentiates again and runs where its inputs are.
#include "nn/attention.h"

#include <cmath>

#include "graph/creation.h"
#include "ops/elementwise.h"
#include "ops/linalg.h"
#include "ops/nn_functional.h"
#include "ops/shape.h"

namespace ember::nn {

Tensor masked_softmax(const Tensor& X, const Tensor& valid_lens) {
  EMBER_CHECK(X.defined(), "masked_softmax: X is undefined");
  if (!valid_lens.defined()) return softmax(X, -1);
  EMBER_CHECK(X.dim() == 3,
              "masked_softmax: X must be (batch, queries, keys) with valid_lens, got {}",
              X.shape());
  const DType lens_dtype = valid_lens.dtype();
  EMBER_CHECK(lens_dtype == kInt64 || is_floating(lens_dtype),
              "masked_softmax: valid_lens must be Int64 or floating, got {}",
              dtype_info(lens_dtype).name);
  const int64_t B = X.size(0), Q = X.size(1), K = X.size(2);
  // lens: (B, 1, 1), one length for all of a row's queries, or (B, Q, 1), one per query
  Tensor lens;
  if (valid_lens.dim() == 1) {
    EMBER_CHECK(valid_lens.size(0) == B,
                "masked_softmax: 1-D valid_lens {} must have one length per batch row of X {}",
                valid_lens.shape(), X.shape());
    lens = valid_lens.reshape({B, 1, 1});
  } else {
    EMBER_CHECK(valid_lens.dim() == 2 && valid_lens.size(0) == B && valid_lens.size(1) == Q,
                "masked_softmax: valid_lens {} must be (batch) or (batch, queries) of X {}",
                valid_lens.shape(), X.shape());
    lens = valid_lens.reshape({B, Q, 1});
  }
  lens = lens.to(X.device());
  // d2l's sequence_mask: position p of a row is kept when p < its valid length
  const Tensor positions = arange(0, static_cast<double>(K), 1, lens_dtype, X.device());
  const Tensor masked = ge(positions.reshape({1, 1, K}), lens);  // (B, 1 or Q, K)
  return softmax(masked_fill(X, masked, -1e6), -1);
}

namespace {

// queries (B, Q, ·), keys (B, K, ·) and values (B, K, V), as both scorings take them.
void check_qkv(const char* op, const Tensor& queries, const Tensor& keys, const Tensor& values) {
  for (const auto& [name, t] :
       {std::pair{"queries", &queries}, {"keys", &keys}, {"values", &values}})
    EMBER_CHECK(t->defined(), "{}: {} is undefined", op, name);
  EMBER_CHECK(queries.dim() == 3 && keys.dim() == 3 && values.dim() == 3,
              "{}: queries {}, keys {} and values {} must be 3-D (batch, steps, features)", op,
              queries.shape(), keys.shape(), values.shape());
  EMBER_CHECK(queries.size(0) == keys.size(0) && keys.size(0) == values.size(0),
              "{}: queries {}, keys {} and values {} must have the same batch size", op,
              queries.shape(), keys.shape(), values.shape());
  EMBER_CHECK(keys.size(1) == values.size(1),
              "{}: keys {} and values {} must have as many steps (key-value pairs)", op,
              keys.shape(), values.shape());
}

}  // namespace

// --- AdditiveAttention

AdditiveAttention::AdditiveAttention(int64_t key_size, int64_t query_size, int64_t num_hiddens,
                                     double dropout_p) {
  EMBER_CHECK(key_size > 0 && query_size > 0 && num_hiddens > 0,
              "AdditiveAttention: key_size {}, query_size {} and num_hiddens {} must be positive",
              key_size, query_size, num_hiddens);
  register_module("W_k", W_k, std::make_shared<Linear>(key_size, num_hiddens, false));
  register_module("W_q", W_q, std::make_shared<Linear>(query_size, num_hiddens, false));
  register_module("w_v", w_v, std::make_shared<Linear>(num_hiddens, 1, false));
  register_module("dropout", dropout, std::make_shared<Dropout>(dropout_p));
}

Tensor AdditiveAttention::forward(const Tensor& queries, const Tensor& keys, const Tensor& values,
                                  const Tensor& valid_lens) {
  check_qkv("AdditiveAttention", queries, keys, values);
  EMBER_CHECK(queries.size(2) == W_q->in_features && keys.size(2) == W_k->in_features,
              "AdditiveAttention: queries {} and keys {} must have query_size {} and key_size {} "
              "features",
              queries.shape(), keys.shape(), W_q->in_features, W_k->in_features);
  const Tensor q = W_q->forward(queries), k = W_k->forward(keys);
  // After unsqueezing, q is (B, Q, 1, H) and k (B, 1, K, H): they broadcast to (B, Q, K, H)
  const Tensor features = tanh(q.unsqueeze(2) + k.unsqueeze(1));
  // w_v has one output: its last dim goes, leaving the scores (B, Q, K)
  const Tensor scores = w_v->forward(features).squeeze(-1);
  const Tensor weights = masked_softmax(scores, valid_lens);
  attention_weights = weights.detach();
  // values (B, K, V)
  return bmm(dropout->forward(weights), values);
}

void AdditiveAttention::rebind(const CloneMap&) {
  if (attention_weights.defined()) attention_weights = attention_weights.clone();
}

// --- DotProductAttention

DotProductAttention::DotProductAttention(double dropout_p) {
  register_module("dropout", dropout, std::make_shared<Dropout>(dropout_p));
}

Tensor DotProductAttention::forward(const Tensor& queries, const Tensor& keys, const Tensor& values,
                                    const Tensor& valid_lens) {
  check_qkv("DotProductAttention", queries, keys, values);
  EMBER_CHECK(queries.size(2) == keys.size(2),
              "DotProductAttention: queries {} and keys {} must have the same feature size d",
              queries.shape(), keys.shape());
  const double d = static_cast<double>(queries.size(2));
  // queries (B, Q, d), keys transposed (B, d, K): scores (B, Q, K)
  const Tensor scores = bmm(queries, keys.transpose(1, 2)) / std::sqrt(d);
  const Tensor weights = masked_softmax(scores, valid_lens);
  attention_weights = weights.detach();
  return bmm(dropout->forward(weights), values);
}

void DotProductAttention::rebind(const CloneMap&) {
  if (attention_weights.defined()) attention_weights = attention_weights.clone();
}

}  // namespace ember::nn
