// Optimizer base, SGD and Adam/AdamW. Each update is one raw loop over a parameter's data that
// reads its gradient and writes the parameter and its state in place: no temporaries.
#include "optim/optimizer.h"

#include <cmath>
#include <unordered_set>

#include "graph/autograd.h"
#include "graph/creation.h"
#include "graph/strided.h"

namespace ember::optim {

Optimizer::Optimizer(std::vector<Tensor> params, double lr, std::string_view op)
    : params_(std::move(params)), lr_(lr) {
  EMBER_CHECK(!params_.empty(), "{}: got an empty parameter list", op);
  EMBER_CHECK(lr >= 0, "{}: invalid learning rate {}", op, lr);
  std::unordered_set<const TensorImpl*> seen;
  for (size_t i = 0; i < params_.size(); ++i) {
    const Tensor& p = params_[i];
    EMBER_CHECK(p.defined(), "{}: parameter {} is undefined", op, i);
    EMBER_CHECK(is_floating(p.dtype()), "{}: parameter {} of shape {} is {}, not floating", op, i,
                p.shape(), p.dtype());
    EMBER_CHECK(p.is_leaf(), "{}: parameter {} of shape {} is not a leaf tensor", op, i, p.shape());
    EMBER_CHECK(seen.insert(p.impl()).second, "{}: parameter {} of shape {} appears twice", op, i,
                p.shape());
  }
}

Optimizer::~Optimizer() = default;

void Optimizer::zero_grad() {
  for (const Tensor& p : params_) p.set_grad(Tensor());
}

void Optimizer::set_lr(double lr) {
  EMBER_CHECK(lr >= 0 && std::isfinite(lr), "set_lr: invalid learning rate {}", lr);
  lr_ = lr;
}

namespace {

// Runs update<T>(p, g, n) on raw pointers to the contiguous data of parameter p and its gradient
// (p is updated through a contiguous copy when it is a non-contiguous view), then bumps p's
// version: an in-place write, see Note [Version counter].
template <class F>
void update_in_place(const Tensor& param, F update) {
  const Tensor g = param.grad().dtype() == param.dtype() ? param.grad().contiguous()
                                                         : param.grad().to(param.dtype());
  const Tensor p = param.is_contiguous() ? param : param.detach().contiguous();
  dispatch_float(p.dtype(), "step", [&]<class T>() {
    update.template operator()<T>(p.data<T>(), g.data<T>(), p.numel());
  });
  if (!p.same(param)) {
    NoGradGuard no_grad;
    Tensor(param).copy_(p);
  } else {
    param.impl()->storage->bump_version();
  }
}

}  // namespace

// --- SGD

SGD::SGD(std::vector<Tensor> params, SGDOptions options)
    : Optimizer(std::move(params), options.lr, "SGD"),
      options_(options),
      momentum_buffers_(params_.size()) {
  EMBER_CHECK(options.momentum >= 0, "SGD: invalid momentum {}", options.momentum);
  EMBER_CHECK(options.weight_decay >= 0, "SGD: invalid weight_decay {}", options.weight_decay);
  EMBER_CHECK(!options.nesterov || (options.momentum > 0 && options.dampening == 0),
              "SGD: nesterov needs momentum > 0 and dampening 0, got momentum {} dampening {}",
              options.momentum, options.dampening);
}

void SGD::step() {
  const SGDOptions& o = options_;
  for (size_t i = 0; i < params_.size(); ++i) {
    const Tensor& param = params_[i];
    if (!param.grad().defined()) continue;
    const bool first = !momentum_buffers_[i].defined();
    if (o.momentum != 0 && first) momentum_buffers_[i] = zeros(param.shape(), param.dtype());
    update_in_place(param, [&]<class T>(T* p, const T* g, int64_t n) {
      const T lr = T(lr_), wd = T(o.weight_decay), mu = T(o.momentum);
      const T keep = T(1 - o.dampening);
      // Scalars by value: GCC 12 vectorises no loop reading a by-reference capture.
      if (o.momentum == 0) {
        parallel_for(n, [=](int64_t begin, int64_t end) {
          for (int64_t j = begin; j < end; ++j) p[j] -= lr * (g[j] + wd * p[j]);
        });
        return;
      }
      T* b = momentum_buffers_[i].data<T>();
      const bool nesterov = o.nesterov;
      parallel_for(n, [=](int64_t begin, int64_t end) {
        for (int64_t j = begin; j < end; ++j) {
          const T d = g[j] + wd * p[j];
          b[j] = first ? d : mu * b[j] + keep * d;
          p[j] -= lr * (nesterov ? d + mu * b[j] : b[j]);
        }
      });
    });
  }
}

// --- Adam / AdamW

Adam::Adam(std::vector<Tensor> params, AdamOptions options)
    : Optimizer(std::move(params), options.lr, "Adam"),
      options_(options),
      steps_(params_.size(), 0),
      exp_avg_(params_.size()),
      exp_avg_sq_(params_.size()) {
  EMBER_CHECK(options.eps >= 0, "Adam: invalid eps {}", options.eps);
  EMBER_CHECK(options.beta1 >= 0 && options.beta1 < 1, "Adam: invalid beta1 {}", options.beta1);
  EMBER_CHECK(options.beta2 >= 0 && options.beta2 < 1, "Adam: invalid beta2 {}", options.beta2);
  EMBER_CHECK(options.weight_decay >= 0, "Adam: invalid weight_decay {}", options.weight_decay);
}

void Adam::step() {
  const AdamOptions& o = options_;
  for (size_t i = 0; i < params_.size(); ++i) {
    const Tensor& param = params_[i];
    if (!param.grad().defined()) continue;
    if (!exp_avg_[i].defined()) {
      exp_avg_[i] = zeros(param.shape(), param.dtype());
      exp_avg_sq_[i] = zeros(param.shape(), param.dtype());
    }
    const int64_t t = ++steps_[i];
    const double step_size = lr_ / (1 - std::pow(o.beta1, static_cast<double>(t)));
    const double bc2_sqrt = std::sqrt(1 - std::pow(o.beta2, static_cast<double>(t)));
    update_in_place(param, [&]<class T>(T* p, const T* g, int64_t n) {
      T* m = exp_avg_[i].data<T>();
      T* v = exp_avg_sq_[i].data<T>();
      const T l2 = T(o.decoupled_weight_decay ? 0 : o.weight_decay);
      const T decay = T(o.decoupled_weight_decay ? 1 - lr_ * o.weight_decay : 1);
      const T b1 = T(o.beta1), b2 = T(o.beta2), eps = T(o.eps);
      const T s = T(step_size), c2 = T(bc2_sqrt);
      // Scalars by value: GCC 12 vectorises no loop reading a by-reference capture.
      parallel_for(n, [=](int64_t begin, int64_t end) {
        for (int64_t j = begin; j < end; ++j) {
          const T gj = g[j] + l2 * p[j];
          p[j] *= decay;
          m[j] = m[j] * b1 + (1 - b1) * gj;
          v[j] = v[j] * b2 + (1 - b2) * gj * gj;
          p[j] -= s * m[j] / (std::sqrt(v[j]) / c2 + eps);
        }
      });
    });
  }
}

}  // namespace ember::optim
