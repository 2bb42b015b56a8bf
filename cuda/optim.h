// The optimizers' updates on the CUDA backend, several parameter tensors per launch (torch's
// multi-tensor "foreach" path): the tensors' pointers travel in the kernel's arguments and one
// grid-stride loop runs over all their elements, with the CPU's formulas in the parameters' type
// (ops/optimizer_step.cpp), written once as host-and-device code as cuda/elementwise.h.
#pragma once

#include "cuda/elementwise.h"

namespace ember::cuda::kernels {

enum class Update : int32_t { Sgd, SgdMomentum, Adam };

// Tensors per launch: their pointers and offsets take about 1.7 KB of the 4 KB of a kernel's
// arguments.
inline constexpr int32_t kMaxOptimTensors = 40;

struct OptimStep {
  Update kind = Update::Sgd;
  ScalarType type = ScalarType::Float32;  // of every p, g, m, v
  int32_t count = 0;                      // tensors in this launch
  // offset[i]: the elements of tensors 0 … i-1; offset[count]: of all of them
  int64_t offset[kMaxOptimTensors + 1] = {};
  // per tensor: the parameter (contiguous, updated in place), its gradient (contiguous), SGD's
  // momentum buffer or Adam's first moment, Adam's second moment (null where unused)
  void* p[kMaxOptimTensors] = {};
  const void* g[kMaxOptimTensors] = {};
  void* m[kMaxOptimTensors] = {};
  void* v[kMaxOptimTensors] = {};
  // SGD: lr, weight decay, momentum mu, 1 - dampening, first step, nesterov.
  // Adam: l2 (coupled weight decay), decay (1 - lr · decoupled decay), beta1, beta2, eps,
  // step_size = lr / (1 - beta1^t), c2 = sqrt(1 - beta2^t).
  double lr = 0, weight_decay = 0, mu = 0, keep = 1;
  bool first = false, nesterov = false;
  double l2 = 0, decay = 1, beta1 = 0, beta2 = 0, eps = 0, step_size = 0, c2 = 1;

  // Appends a tensor of n elements; false when the launch is full.
  bool add(void* param, const void* grad, void* state_m, void* state_v, int64_t n) {
    if (count == kMaxOptimTensors) return false;
    p[count] = param, g[count] = grad, m[count] = state_m, v[count] = state_v;
    offset[count + 1] = offset[count] + n;
    ++count;
    return true;
  }
  EMBER_HD int64_t numel() const { return offset[count]; }
};

namespace detail {

// Element j of tensor t.
template <class T>
EMBER_HD void optim_element(const OptimStep& s, int32_t t, int64_t j) {
  T* p = static_cast<T*>(s.p[t]);
  const T* g = static_cast<const T*>(s.g[t]);
  T* m = static_cast<T*>(s.m[t]);
  T* v = static_cast<T*>(s.v[t]);
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

template <class T>
EMBER_HD void optim_elements(const OptimStep& s, int64_t first, int64_t stride) {
  int32_t t = 0;  // the tensor of element i: i only grows, so t only moves on
  for (int64_t i = first; i < s.numel(); i += stride) {
    while (i >= s.offset[t + 1]) ++t;
    optim_element<T>(s, t, i - s.offset[t]);
  }
}

}  // namespace detail

// Elements first, first + stride, … of the launch's tensors taken end to end: a GPU thread's
// share of a grid-stride loop, or all of them (0, 1) on the host.
EMBER_HD inline void optim_elements(const OptimStep& s, int64_t first, int64_t stride) {
  dispatch(s.type, [&](auto t) {
    if constexpr (std::is_floating_point_v<decltype(t)>)
      detail::optim_elements<decltype(t)>(s, first, stride);
  });
}

}  // namespace ember::cuda::kernels
