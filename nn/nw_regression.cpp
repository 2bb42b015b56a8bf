// NWKernelRegression: D2L's forward (section "Attention Pooling: Nadaraya-Watson Kernel
// Regression"), line for line, on Ember's ops.
#include "nn/nw_regression.h"

#include "graph/random.h"
#include "ops/elementwise.h"
#include "ops/index.h"
#include "ops/linalg.h"
#include "ops/nn_functional.h"
#include "ops/shape.h"

namespace ember::nn {

NWKernelRegression::NWKernelRegression() { register_parameter("w", w, rand({1})); }

Tensor NWKernelRegression::forward(const Tensor& queries, const Tensor& keys,
                                   const Tensor& values) {
  EMBER_CHECK(keys.dim() == 2, "NWKernelRegression: keys must be (queries, pairs), got {}",
              keys.shape());
  EMBER_CHECK(values.shape() == keys.shape(),
              "NWKernelRegression: values {} must have the keys' shape {}", values.shape(),
              keys.shape());
  EMBER_CHECK(queries.numel() == keys.size(0),
              "NWKernelRegression: {} queries {} for {} rows of keys {}", queries.numel(),
              queries.shape(), keys.size(0), keys.shape());
  // queries and attention_weights: (number of queries, number of key-value pairs)
  const Tensor q = queries.repeat_interleave(keys.size(1)).reshape({-1, keys.size(1)});
  const Tensor weights = softmax(-((q - keys) * w).pow(2) / 2, 1);
  attention_weights = weights.detach();
  // values: (number of queries, number of key-value pairs)
  return bmm(weights.unsqueeze(1), values.unsqueeze(-1)).reshape({-1});
}

void NWKernelRegression::rebind(const CloneMap&) {
  // Not registered (it is a by-product of forward), but a deep copy owns its own data too.
  if (attention_weights.defined()) attention_weights = attention_weights.clone();
}

}  // namespace ember::nn
