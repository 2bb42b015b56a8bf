// The optimizers' updates on the CUDA backend, one parameter tensor per launch, an element per
// thread, with the CPU's formulas in the parameter's type (optim/optimizer.cpp), written once as
// host-and-device code as cuda/elementwise.h.
#pragma once

#include "cuda/elementwise.h"

namespace ember::cuda::kernels {

enum class Update : int32_t { Sgd, SgdMomentum, Adam };

struct OptimStep {
  Update kind = Update::Sgd;
  ScalarType type = ScalarType::Float32;  // of p, g, m, v
  int64_t n = 0;
  void* p = nullptr;        // the parameter, contiguous, updated in place
  const void* g = nullptr;  // its gradient, contiguous
  void* m = nullptr;        // SGD's momentum buffer, or Adam's first moment
  void* v = nullptr;        // Adam's second moment
  // SGD: lr, weight decay, momentum mu, 1 - dampening, first step, nesterov.
  // Adam: l2 (coupled weight decay), decay (1 - lr · decoupled decay), beta1, beta2, eps,
  // step_size = lr / (1 - beta1^t), c2 = sqrt(1 - beta2^t).
  double lr = 0, weight_decay = 0, mu = 0, keep = 1;
  bool first = false, nesterov = false;
  double l2 = 0, decay = 1, beta1 = 0, beta2 = 0, eps = 0, step_size = 0, c2 = 1;
};

namespace detail {

template <class T>
EMBER_HD void optim_element(const OptimStep& s, int64_t j) {
  T* p = static_cast<T*>(s.p);
  const T* g = static_cast<const T*>(s.g);
  T* m = static_cast<T*>(s.m);
  T* v = static_cast<T*>(s.v);
  switch (s.kind) {
    case Update::Sgd:
      p[j] -= T(s.lr) * (g[j] + T(s.weight_decay) * p[j]);
      return;
    case Update::SgdMomentum: {
      const T d = g[j] + T(s.weight_decay) * p[j];
      m[j] = s.first ? d : T(s.mu) * m[j] + T(s.keep) * d;
      p[j] -= T(s.lr) * (s.nesterov ? d + T(s.mu) * m[j] : m[j]);
      return;
    }
    case Update::Adam: {
      const T b1 = T(s.beta1), b2 = T(s.beta2);
      const T gj = g[j] + T(s.l2) * p[j];
      p[j] *= T(s.decay);
      m[j] = m[j] * b1 + (1 - b1) * gj;
      v[j] = v[j] * b2 + (1 - b2) * gj * gj;
#if defined(__CUDA_ARCH__)
      p[j] -= T(s.step_size) * m[j] / (::sqrt(v[j]) / T(s.c2) + T(s.eps));
#else
      p[j] -= T(s.step_size) * m[j] / (std::sqrt(v[j]) / T(s.c2) + T(s.eps));
#endif
      return;
    }
  }
}

}  // namespace detail

EMBER_HD inline void optim_element(const OptimStep& s, int64_t j) {
  if (s.type == ScalarType::Float32)
    detail::optim_element<float>(s, j);
  else if (s.type == ScalarType::Float64)
    detail::optim_element<double>(s, j);
}

}  // namespace ember::cuda::kernels
