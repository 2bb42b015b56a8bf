// The optimizers' fused updates (ops/optimizer_step.h): the CPU's loops, a device's
// multi-tensor kernel.
#include "ops/optimizer_step.h"

#include <cmath>
#include <vector>

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

// The device parameters of a step, in launches of up to kMaxOptimTensors of one device and
// dtype (cuda/optim.h): `step` holds the update and its hyperparameters, m and v the state
// (parallel to params; undefined where unused). CPU parameters are left to the caller.
void launch_on_devices(std::span<const Tensor> params, std::span<const Tensor> m,
                       std::span<const Tensor> v, const cuda::kernels::OptimStep& step) {
  std::vector<InPlace> work;  // alive until every launch is queued, then written back
  work.reserve(params.size());
  cuda::kernels::OptimStep k;
  Device device = kCPU;
  const auto flush = [&] {
    if (k.count > 0) cuda::detail::launch_optim(k, device, "step");
    k = step;
  };
  k = step;
  for (size_t i = 0; i < params.size(); ++i) {
    if (params[i].device().is_cpu()) continue;
    const InPlace& w = work.emplace_back(params[i]);
    for (const Tensor* state : {&m[i], &v[i]})
      EMBER_CHECK(!state->defined() || state->device() == w.p.device(),
                  "step: optimizer state on {} for a parameter on {}", state->device(),
                  w.p.device());
    if (k.count > 0 && (w.p.device() != device || scalar_type_of(w.p.dtype()) != k.type)) flush();
    if (k.count == cuda::kernels::kMaxOptimTensors) flush();
    device = w.p.device();
    k.type = scalar_type_of(w.p.dtype());
    k.add(w.p.data_bytes(), w.g.data_bytes(), m[i].defined() ? m[i].data_bytes() : nullptr,
          v[i].defined() ? v[i].data_bytes() : nullptr, w.p.numel());
  }
  flush();
  for (const InPlace& w : work) w.finish();
}

// f.template operator()<T>(w, i) on each CPU parameter i (T its dtype's type), then the write.
template <class F>
void on_cpu(std::span<const Tensor> params, F f) {
  for (size_t i = 0; i < params.size(); ++i) {
    if (!params[i].device().is_cpu()) continue;
    const InPlace w(params[i]);
    dispatch_float(w.p.dtype(), "step", [&]<class T>() { f.template operator()<T>(w, i); });
    w.finish();
  }
}

}  // namespace

void sgd_step_(std::span<const Tensor> params, std::span<const Tensor> momentum_buffers,
               const SgdStep& s) {
  cuda::kernels::OptimStep k;
  k.kind = s.momentum == 0 ? cuda::kernels::Update::Sgd : cuda::kernels::Update::SgdMomentum;
  k.lr = s.lr, k.weight_decay = s.weight_decay, k.mu = s.momentum;
  k.keep = s.keep, k.first = s.first, k.nesterov = s.nesterov;
  launch_on_devices(params, momentum_buffers, momentum_buffers, k);
  on_cpu(params, [&]<class T>(const InPlace& w, size_t i) {
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
    T* b = momentum_buffers[i].data<T>();
    const bool first = s.first, nesterov = s.nesterov;
    parallel_for(n, [=](int64_t begin, int64_t end) {
      for (int64_t j = begin; j < end; ++j) {
        const T d = g[j] + wd * p[j];
        b[j] = first ? d : mu * b[j] + keep * d;
        p[j] -= lr * (nesterov ? d + mu * b[j] : b[j]);
      }
    });
  });
}

void adam_step_(std::span<const Tensor> params, std::span<const Tensor> exp_avgs,
                std::span<const Tensor> exp_avg_sqs, const AdamStep& s) {
  cuda::kernels::OptimStep k;
  k.kind = cuda::kernels::Update::Adam;
  k.l2 = s.l2, k.decay = s.decay, k.beta1 = s.beta1, k.beta2 = s.beta2, k.eps = s.eps;
  k.step_size = s.step_size, k.c2 = s.c2;
  launch_on_devices(params, exp_avgs, exp_avg_sqs, k);
  on_cpu(params, [&]<class T>(const InPlace& w, size_t i) {
    T* p = w.p.data<T>();
    const T* g = w.g.data<T>();
    const int64_t n = w.p.numel();
    T* m = exp_avgs[i].data<T>();
    T* v = exp_avg_sqs[i].data<T>();
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
}

}  // namespace ember
