// D2L's parametric attention pooling (Nadaraya-Watson kernel regression with a learnable kernel
// width): each query attends to its row of keys with a Gaussian kernel scaled by w and returns
// the attention-weighted average of the values.
#pragma once

#include "nn/module.h"

namespace ember::nn {

// f(q_i) = sum_j softmax_j(-((q_i - k_ij) w)^2 / 2) v_ij, with one learnable scalar w (shape
// (1), U[0, 1) as torch.rand). queries (n), keys and values (n, m): query i pools row i.
class NWKernelRegression : public Cloneable<NWKernelRegression> {
 public:
  NWKernelRegression();
  // Returns (n) predictions and keeps the (n, m) weights, detached, in attention_weights.
  Tensor forward(const Tensor& queries, const Tensor& keys, const Tensor& values);

  Tensor w;
  Tensor attention_weights;  // of the last forward, for show_heatmaps; undefined before one

 protected:
  void rebind(const CloneMap& map) override;  // a copy owns its attention_weights too

 private:
  friend Cloneable;  // the only copier; see Note [Modules are not copyable]
  NWKernelRegression(const NWKernelRegression&) = default;
};

}  // namespace ember::nn
