// The optimizers' fused updates (ops/optimizer_step.h): the CPU's loops, a device's kernel.
#include "ops/optimizer_step.h"

#include <cmath>

#include "graph/autograd.h"
#include "graph/device_backend.h"
#include "graph/strided.h"

namespace ember {

namespace {

// The parameter's and its gradient's contiguous data (p a contiguous copy when the parameter
// is a non-contiguous view), and afterwards p written back, or the parameter's version bumped:
// an in-place write, see Note [Version counter].
struct InPlace {
  explicit InPlace(const Tensor& param)
      : param(param),
        p(param.is_contiguous() ? param : param.detach().contiguous()),
        g(param.grad().dtype() == param.dtype() ? param.grad().contiguous()
                                                : param.grad().to(param.dtype())) {}
  void finish() const {
    if (!p.same(param)) {
      NoGradGuard no_grad;
      Tensor(param).copy_(p);
    } else {
      param.impl()->storage->bump_version();
    }
  }
  const Tensor& param;
  Tensor p, g;
};

// On a device: cuda/optim.h's kernel over p, g and the state (m, v: on p's device, contiguous,
// of its shape, or undefined).
void launch_on_device(const InPlace& w, cuda::kernels::OptimStep step, const Tensor& m,
                      const Tensor& v) {
  for (const Tensor* state : {&m, &v})
    EMBER_CHECK(!state->defined() || state->device() == w.p.device(),
                "step: optimizer state on {} for a parameter on {}", state->device(), w.p.device());
  step.type = scalar_type_of(w.p.dtype());
  step.n = w.p.numel();
  step.p = w.p.data_bytes();
  step.g = w.g.data_bytes();
  step.m = m.defined() ? m.data_bytes() : nullptr;
  step.v = v.defined() ? v.data_bytes() : nullptr;
  cuda::detail::launch_optim(step, w.p.device(), "step");
}

}  // namespace

void sgd_step_(const Tensor& param, const Tensor& momentum_buffer, const SgdStep& s) {
  const InPlace w(param);
  if (!param.device().is_cpu()) {
    cuda::kernels::OptimStep k;
    k.kind = s.momentum == 0 ? cuda::kernels::Update::Sgd : cuda::kernels::Update::SgdMomentum;
    k.lr = s.lr, k.weight_decay = s.weight_decay, k.mu = s.momentum;
    k.keep = s.keep, k.first = s.first, k.nesterov = s.nesterov;
    launch_on_device(w, k, momentum_buffer, {});
    return w.finish();
  }
  dispatch_float(w.p.dtype(), "step", [&]<class T>() {
    T* p = w.p.data<T>();
    const T* g = w.g.data<T>();
    const int64_t n = w.p.numel();
    const T lr = T(s.lr), wd = T(s.weight_decay), mu = T(s.momentum), keep = T(s.keep);
    // Scalars by value: GCC 12 vectorises no loop reading a by-reference capture.
    if (s.momentum == 0) {
      parallel_for(n, [=](int64_t begin, int64_t end) {
        for (int64_t j = begin; j < end; ++j) p[j] -= lr * (g[j] + wd * p[j]);
      });
      return;
    }
    T* b = momentum_buffer.data<T>();
    const bool first = s.first, nesterov = s.nesterov;
    parallel_for(n, [=](int64_t begin, int64_t end) {
      for (int64_t j = begin; j < end; ++j) {
        const T d = g[j] + wd * p[j];
        b[j] = first ? d : mu * b[j] + keep * d;
        p[j] -= lr * (nesterov ? d + mu * b[j] : b[j]);
      }
    });
  });
  w.finish();
}

void adam_step_(const Tensor& param, const Tensor& exp_avg, const Tensor& exp_avg_sq,
                const AdamStep& s) {
  const InPlace w(param);
  if (!param.device().is_cpu()) {
    cuda::kernels::OptimStep k;
    k.kind = cuda::kernels::Update::Adam;
    k.l2 = s.l2, k.decay = s.decay, k.beta1 = s.beta1, k.beta2 = s.beta2, k.eps = s.eps;
    k.step_size = s.step_size, k.c2 = s.c2;
    launch_on_device(w, k, exp_avg, exp_avg_sq);
    return w.finish();
  }
  dispatch_float(w.p.dtype(), "step", [&]<class T>() {
    T* p = w.p.data<T>();
    const T* g = w.g.data<T>();
    const int64_t n = w.p.numel();
    T* m = exp_avg.data<T>();
    T* v = exp_avg_sq.data<T>();
    const T l2 = T(s.l2), decay = T(s.decay), b1 = T(s.beta1), b2 = T(s.beta2), eps = T(s.eps);
    const T size = T(s.step_size), c2 = T(s.c2);
    // Scalars by value: GCC 12 vectorises no loop reading a by-reference capture.
    parallel_for(n, [=](int64_t begin, int64_t end) {
      for (int64_t j = begin; j < end; ++j) {
        const T gj = g[j] + l2 * p[j];
        p[j] *= decay;
        m[j] = m[j] * b1 + (1 - b1) * gj;
        v[j] = v[j] * b2 + (1 - b2) * gj * gj;
        p[j] -= size * m[j] / (std::sqrt(v[j]) / c2 + eps);
      }
    });
  });
  w.finish();
}

}  // namespace ember
