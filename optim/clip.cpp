// clip_grad_norm_: one pass to sum squares over every gradient, one to scale them.
#include "optim/clip.h"

#include <cmath>

#include "graph/autograd.h"

namespace ember::optim {

double clip_grad_norm_(const std::vector<Tensor>& params, double max_norm) {
  EMBER_CHECK(max_norm >= 0, "clip_grad_norm_: max_norm must be non-negative, got {}", max_norm);
  std::vector<Tensor> grads;
  for (const Tensor& p : params)
    if (p.defined() && p.grad().defined()) grads.push_back(p.grad());
  double sum_sq = 0;
  for (const Tensor& g : grads) {
    const Tensor c = g.contiguous();
    dispatch_float(c.dtype(), "clip_grad_norm_", [&]<class T>() {
      const T* d = c.data<T>();
      double s = 0;
      for (int64_t i = 0; i < c.numel(); ++i) s += double(d[i]) * double(d[i]);
      sum_sq += s;
    });
  }
  const double total = std::sqrt(sum_sq);
  const double coef = max_norm / (total + 1e-6);
  if (coef < 1) {
    NoGradGuard no_grad;
    for (Tensor& g : grads) g.mul_(coef);
  }
  return total;
}

}  // namespace ember::optim
