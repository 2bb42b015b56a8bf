// clip_grad_norm_: one pass for the norm over every gradient, one to scale them.
#include "optim/clip.h"

#include <cmath>
#include <limits>

#include "graph/autograd.h"
#include "ops/elementwise.h"
#include "ops/reduce.h"

namespace ember::optim {

double clip_grad_norm_(const std::vector<Tensor>& params, double max_norm, double norm_type,
                       bool error_if_nonfinite) {
  EMBER_CHECK(max_norm >= 0, "clip_grad_norm_: max_norm must be non-negative, got {}", max_norm);
  EMBER_CHECK(norm_type > 0, "clip_grad_norm_: norm_type must be positive (or inf), got {}",
              norm_type);
  std::vector<Tensor> grads;
  for (const Tensor& p : params)
    if (p.defined() && p.grad().defined()) grads.push_back(p.grad());
  const bool inf_norm = std::isinf(norm_type);
  double acc = 0;  // max |g| for inf, else sum |g|^p
  for (const Tensor& g : grads) {
    if (!g.device().is_cpu()) {
      // A device: the gradient's part of the norm by its kernels, read back (one sync each)
      NoGradGuard no_grad;
      const Tensor a = abs(g.detach().to(kFloat64));
      if (inf_norm) {
        const double m = g.numel() == 0 ? 0.0 : max(a).item<double>();
        acc = std::isnan(m) || m > acc ? m : acc;
      } else {
        acc += sum(norm_type == 2.0 ? mul(a, a) : pow(a, norm_type)).item<double>();
      }
      continue;
    }
    const Tensor c = g.contiguous();
    dispatch_float(c.dtype(), "clip_grad_norm_", [&]<class T>() {
      const T* d = c.data<T>();
      const int64_t n = c.numel();
      if (inf_norm) {
        for (int64_t i = 0; i < n; ++i) {
          const double a = std::abs(double(d[i]));
          acc = std::isnan(a) || a > acc ? a : acc;  // NaN propagates, as torch's max
        }
      } else if (norm_type == 2.0) {
        double s = 0;
        for (int64_t i = 0; i < n; ++i) s += double(d[i]) * double(d[i]);
        acc += s;
      } else {
        double s = 0;
        for (int64_t i = 0; i < n; ++i) s += std::pow(std::abs(double(d[i])), norm_type);
        acc += s;
      }
    });
  }
  const double total = inf_norm           ? acc
                       : norm_type == 2.0 ? std::sqrt(acc)
                                          : std::pow(acc, 1.0 / norm_type);
  EMBER_CHECK(!error_if_nonfinite || std::isfinite(total),
              "clip_grad_norm_: the total norm of order {} of the gradients is {}, so they "
              "cannot be clipped (error_if_nonfinite=true)",
              norm_type, total);
  // torch: coef = clamp(max_norm / (total + 1e-6), max=1), then every gradient *= coef. A NaN
  // total makes every gradient NaN, so the step is visibly bad instead of silently unscaled.
  const double coef = max_norm / (total + 1e-6);
  if (!(coef >= 1)) {
    NoGradGuard no_grad;
    for (Tensor& g : grads) g.mul_(coef);
  }
  return total;
}

}  // namespace ember::optim
