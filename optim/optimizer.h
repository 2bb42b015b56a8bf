// Optimizers: the Optimizer base (parameters, learning rate, zero_grad), SGD and Adam/AdamW with
// exactly PyTorch's update rules. Per-parameter state lives in vectors parallel to the
// parameters; a parameter without a gradient is skipped (its state does not advance).
#pragma once

#include <vector>

#include "graph/tensor.h"

namespace ember::optim {

class Optimizer {
 public:
  Optimizer(std::vector<Tensor> params, double lr, std::string_view op);
  virtual ~Optimizer();
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  // One update of every parameter that has a gradient.
  virtual void step() = 0;
  // Gradients become undefined (PyTorch's set_to_none).
  void zero_grad();
  double lr() const { return lr_; }
  void set_lr(double lr);
  const std::vector<Tensor>& params() const { return params_; }

 protected:
  std::vector<Tensor> params_;
  double lr_;
};

struct SGDOptions {
  double lr;
  double momentum = 0, dampening = 0, weight_decay = 0;
  bool nesterov = false;
};

// torch.optim.SGD:  g += wd p;  b = g on the first step, else b = momentum b + (1 - dampening) g;
// g = nesterov ? g + momentum b : b;  p -= lr g.
class SGD : public Optimizer {
 public:
  SGD(std::vector<Tensor> params, SGDOptions options);
  void step() override;
  const SGDOptions& options() const { return options_; }

 private:
  SGDOptions options_;
  std::vector<Tensor> momentum_buffers_;  // undefined until a parameter's first step
};

struct AdamOptions {
  double lr = 1e-3;
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0;
  bool decoupled_weight_decay = false;  // true = AdamW
};

// torch.optim.Adam (L2: g += wd p) and AdamW (decoupled: p *= 1 - lr wd), then
//   m = lerp(m, g, 1 - beta1);  v = beta2 v + (1 - beta2) g²;
//   p -= lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
// fused in one pass over each parameter.
class Adam : public Optimizer {
 public:
  explicit Adam(std::vector<Tensor> params, AdamOptions options = {});
  void step() override;
  const AdamOptions& options() const { return options_; }

 private:
  AdamOptions options_;
  std::vector<int64_t> steps_;  // per parameter, as torch's state['step']
  std::vector<Tensor> exp_avg_, exp_avg_sq_;
};

}  // namespace ember::optim
