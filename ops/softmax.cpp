// softmax and log_softmax along a dim: a fused kernel per row (one pass for the max, one for the
// sum; short rows a block at a time) and a hand-derived backward kernel. Under create_graph the
// backward is written in ops instead, through the saved output, so that it can be differentiated
// again (Note [Double backward]); on a device, the row kernels of cuda/rows.h.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <utility>

#include "graph/autograd.h"
#include "graph/creation.h"
#include "graph/device_backend.h"
#include "graph/profile.h"
#include "ops/common.h"
#include "ops/elementwise.h"
#include "ops/reduce.h"
#include "ops/rows.h"
#include "ops/vec_math.h"

namespace ember {

namespace {

// One row of n elements, x with stride sx, y with stride sy:
//   m = max(x);  s = Σ exp(x - m);  y = exp(x - m) / s   or   y = (x - m) - log(s)
template <bool Log, class T>
inline void softmax_row(const T* x, int64_t sx, T* y, int64_t sy, int64_t n) {
  T m = -std::numeric_limits<T>::infinity();
#pragma omp simd reduction(max : m)
  for (int64_t j = 0; j < n; ++j) m = std::max(m, x[j * sx]);
  double s = 0;
  if constexpr (Log) {
#pragma omp simd reduction(+ : s)
    for (int64_t j = 0; j < n; ++j) s += vexp_nonpositive(x[j * sx] - m);
    const T log_s = static_cast<T>(std::log(s));  // kept apart from m: m + log_s may round
#pragma omp simd
    for (int64_t j = 0; j < n; ++j) y[j * sy] = (x[j * sx] - m) - log_s;
  } else {
#pragma omp simd reduction(+ : s)
    for (int64_t j = 0; j < n; ++j) {
      const T e = vexp_nonpositive(x[j * sx] - m);
      y[j * sy] = e;
      s += e;
    }
    const T inv = static_cast<T>(1.0 / s);
#pragma omp simd
    for (int64_t j = 0; j < n; ++j) y[j * sy] *= inv;
  }
}

// Contiguous rows of n < kShortRow elements (attention over a few positions): the per-row loops
// of softmax_row would run in their scalar remainders, so a block of rows goes pass by pass
// instead: each row's max and shift, then the exponentials as one long loop over the block, then
// each row's sum and scale. Same arithmetic as softmax_row.
//
// Rows of one to four whole vectors (16, 32 or 48 floats with AVX-512) take softmax_vector_rows,
// where each row's max and sum are its vectors' in registers, reduced once, and no pass is a loop
// over n: per row, a loop's set-up and its tail cost more than the row's arithmetic.
// f(std::integral_constant<int, NV>{}) when a row of n elements is NV = 1 to 4 whole vectors of
// T (softmax_vector_rows, and the backward's rows with n a constant); false, calling nothing, else.
template <class T, class F>
bool with_row_vectors(int64_t n, F&& f) {
  constexpr int64_t W = Lanes<T>::kWidth;
  return [&]<int... NV>(std::integer_sequence<int, NV...>) {
    return ((n == NV * W && (f(std::integral_constant<int, NV>{}), true)) || ...);
  }
  (std::integer_sequence<int, 1, 2, 3, 4>{});
}

template <int NV, bool Log, class T>
EMBER_VEC_INLINE void softmax_vector_rows(const T* xb, T* yb, T* exps, int64_t count) {
  using L = Lanes<T>;
  using V = typename L::V;
  constexpr int64_t W = L::kWidth, n = NV * W;
  for (int64_t r = 0; r < count; ++r) {
    V v[NV];
    for (int u = 0; u < NV; ++u) v[u] = L::load(xb + r * n + u * W);
    V m = v[0];
    for (int u = 1; u < NV; ++u) m = L::max(m, v[u]);
    const T shift = L::max_of(m);
    for (int u = 0; u < NV; ++u) {
      const V d = v[u] - shift;
      std::memcpy(yb + r * n + u * W, &d, sizeof d);
    }
  }
  T* e = Log ? exps : yb;
  for (int64_t i = 0; i < count * n; ++i) e[i] = vexp_nonpositive(yb[i]);
  for (int64_t r = 0; r < count; ++r) {
    V v[NV];
    V s = {};
    for (int u = 0; u < NV; ++u) s += v[u] = L::load(e + r * n + u * W);
    const T sum = L::sum_of(s);
    const T log_s = Log ? static_cast<T>(std::log(sum)) : T(0), inv = static_cast<T>(1.0 / sum);
    for (int u = 0; u < NV; ++u) {
      const V out = Log ? L::load(yb + r * n + u * W) - log_s : v[u] * inv;
      std::memcpy(yb + r * n + u * W, &out, sizeof out);
    }
  }
}

template <bool Log, class T>
void softmax_short_rows(const T* x, T* y, int64_t rows, int64_t n) {
  const int64_t block_rows = std::max<int64_t>(1, kShortRowBlock / n);
  parallel_for(
      rows,
      [&, n, block_rows](int64_t begin, int64_t end) {
        T exps[kShortRowBlock + kShortRow];
        for (int64_t b = begin; b < end; b += block_rows) {
          const int64_t count = std::min(block_rows, end - b), len = count * n;
          const T* xb = x + b * n;
          T* yb = y + b * n;
          if (with_row_vectors<T>(n, [&]<int NV>(std::integral_constant<int, NV>) {
                softmax_vector_rows<NV, Log>(xb, yb, exps, count);
              }))
            continue;
          for (int64_t at = 0; at < len; at += n) {
            const T m = row_max(xb + at, n);
            for (int64_t j = 0; j < n; ++j) yb[at + j] = xb[at + j] - m;
          }
          T* e = Log ? exps : yb;
          for (int64_t i = 0; i < len; ++i) e[i] = vexp_nonpositive(yb[i]);
          for (int64_t at = 0; at < len; at += n) {
            const T s = row_sum(e + at, n);
            if constexpr (Log) {
              const T log_s = static_cast<T>(std::log(s));
              for (int64_t j = 0; j < n; ++j) yb[at + j] -= log_s;
            } else {
              const T inv = static_cast<T>(1.0 / s);
              for (int64_t j = 0; j < n; ++j) yb[at + j] *= inv;
            }
          }
        }
      },
      row_grain(n, costly_grain()));
}

// softmax_row on a contiguous row, pass by pass: the max and the sum in lanes, the exponentials
// (written to y, then scaled or replaced) as a loop of their own.
template <bool Log, class T>
void softmax_contiguous_row(const T* x, T* y, int64_t n) {
  const T m = row_max(x, n);
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) y[j] = vexp_nonpositive(x[j] - m);
  const T s = row_sum(y, n);
  if constexpr (Log) {
    const T log_s = std::log(s);  // kept apart from m: m + log_s may round
#pragma omp simd
    for (int64_t j = 0; j < n; ++j) y[j] = (x[j] - m) - log_s;
  } else {
    const T inv = T(1) / s;
#pragma omp simd
    for (int64_t j = 0; j < n; ++j) y[j] *= inv;
  }
}

// x and y share a shape; xr and yr are their rows along the softmax dim.
template <bool Log, class T>
void softmax_forward(const T* x, const Rows& xr, T* y, const Rows& yr) {
  const int64_t n = xr.n, sx = xr.stride, sy = yr.stride;
  if (sx == 1 && sy == 1 && xr.starts.empty() && yr.starts.empty() && n < kShortRow) {
    softmax_short_rows<Log>(x, y, xr.count, n);
    return;
  }
  for_each_row(xr, [&](int64_t r) {
    if (sx == 1 && sy == 1)  // the fast path: contiguous rows along the last dim
      softmax_contiguous_row<Log>(x + xr.start(r), y + yr.start(r), n);
    else
      softmax_row<Log>(x + xr.start(r), sx, y + yr.start(r), sy, n);
  });
}

// One row of the backward, every operand with stride s:
//   softmax:      dX = y * (dY - Σ dY * y)
//   log_softmax:  dX = dY - exp(y) * Σ dY
template <bool Log, class T>
inline void softmax_backward_row(const T* g, const T* y, T* dx, int64_t s, int64_t n) {
  double acc = 0;
  if constexpr (Log) {
#pragma omp simd reduction(+ : acc)
    for (int64_t j = 0; j < n; ++j) acc += g[j * s];
    const T sum = static_cast<T>(acc);
#pragma omp simd
    for (int64_t j = 0; j < n; ++j) dx[j * s] = g[j * s] - vexp_nonpositive(y[j * s]) * sum;
  } else {
#pragma omp simd reduction(+ : acc)
    for (int64_t j = 0; j < n; ++j) acc += g[j * s] * y[j * s];
    const T dot = static_cast<T>(acc);
#pragma omp simd
    for (int64_t j = 0; j < n; ++j) dx[j * s] = y[j * s] * (g[j * s] - dot);
  }
}

// softmax_backward_row on contiguous rows, the sum in lanes; inlined, so that a constant n (rows
// of whole vectors, SoftmaxBackward) leaves no loop.
template <bool Log, class T>
EMBER_VEC_INLINE void softmax_backward_contiguous_row(const T* g, const T* y, T* dx, int64_t n) {
  if constexpr (Log) {
    const T sum = row_sum(g, n);
#pragma omp simd
    for (int64_t j = 0; j < n; ++j) dx[j] = g[j] - vexp_nonpositive(y[j]) * sum;
  } else {
    const T dot = row_dot(g, y, n);
#pragma omp simd
    for (int64_t j = 0; j < n; ++j) dx[j] = y[j] * (g[j] - dot);
  }
}

// y = softmax(x) or log_softmax(x) along dim_; saves the output y as data (Note [Saved outputs]).
//   softmax:      dX = y * (dY - Σ_dim dY * y)
//   log_softmax:  dX = dY - exp(y) * Σ_dim dY
// Under create_graph the same formulas in ops, through y as this Node's output.
template <bool Log>
struct SoftmaxBackward final : Node {
  SoftmaxBackward(int64_t dim, const Tensor& y) : dim_(dim) { save_output(y_, y); }
  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    if (is_grad_enabled()) {  // create_graph
      const Tensor &dy = grads[0], y = y_.get();
      if constexpr (Log) return {sub(dy, mul(exp(y), sum(dy, {dim_}, true)))};
      return {mul(y, sub(dy, sum(mul(dy, y), {dim_}, true)))};
    }
    const Tensor g = grads[0].contiguous();
    const Tensor& y = y_.get();
    Tensor grad_x = empty(y.shape(), y.dtype(), y.device());
    if (y.numel() == 0) return {grad_x};
    if (!y.device().is_cpu()) {
      using cuda::kernels::RowOp;
      rows_on_device(Log ? RowOp::LogSoftmaxBackward : RowOp::SoftmaxBackward, y.dtype(), dim_,
                     {g, y}, {grad_x}, name());
      return {grad_x};
    }
    const Rows rows = rows_along(y, dim_);
    dispatch_float(y.dtype(), name(), [&]<class T>() {
      const T *pg = g.data<T>(), *py = y.data<T>();
      T* px = grad_x.data<T>();
      const int64_t s = rows.stride, n = rows.n;
      // Contiguous rows of one to four whole vectors with n a constant (as softmax_vector_rows).
      if (s == 1 && with_row_vectors<T>(n, [&]<int NV>(std::integral_constant<int, NV>) {
            for_each_row(rows, [&](int64_t r) {
              const int64_t at = rows.start(r);
              softmax_backward_contiguous_row<Log>(pg + at, py + at, px + at,
                                                   NV * Lanes<T>::kWidth);
            });
          }))
        return;
      for_each_row(rows, [&](int64_t r) {
        const int64_t at = rows.start(r);
        if (s == 1)
          softmax_backward_contiguous_row<Log>(pg + at, py + at, px + at, n);
        else
          softmax_backward_row<Log>(pg + at, py + at, px + at, s, n);
      });
    });
    return {grad_x};
  }
  bool differentiable_backward() const override { return true; }
  // Forward: softmax:      dY = y * (dX - Σ_dim y * dX)
  //          log_softmax:  dY = dX - Σ_dim exp(y) * dX
  std::vector<Tensor> jvp(const std::vector<Tensor>&, const std::vector<Tensor>& t,
                          const std::vector<Tensor>& out) override {
    const Tensor &dx = t[0], &y = out[0];
    if constexpr (Log) return {sub(dx, sum(mul(exp(y), dx), {dim_}, true))};
    return {mul(y, sub(dx, sum(mul(y, dx), {dim_}, true)))};
  }
  int64_t dim_;
  SavedTensor y_;
};

// Op `op`: softmax or (Log) log_softmax.
template <bool Log>
Tensor softmax_op(const Tensor& x, int64_t dim, std::string_view op) {
  profile::Scope scope(op);
  check_defined(x, op);
  const int64_t d = wrap_dim(dim, x.dim(), op);
  check_floating(x, op);
  Tensor out = empty(x.shape(), x.dtype(), x.device());
  if (x.numel() > 0 && !x.device().is_cpu())
    rows_on_device(Log ? cuda::kernels::RowOp::LogSoftmax : cuda::kernels::RowOp::Softmax,
                   x.dtype(), d, {x}, {out}, op);
  else if (x.numel() > 0)  // rows of 0 elements, or none: no kernel (it divides by the row length)
    dispatch_float(x.dtype(), op, [&]<class T>() {
      softmax_forward<Log>(x.data<T>(), rows_along(x, d), out.data<T>(), rows_along(out, d));
    });
  return record<SoftmaxBackward<Log>>(op, out, {x}, d, out);
}

}  // namespace

Tensor softmax(const Tensor& x, int64_t dim) { return softmax_op<false>(x, dim, "softmax"); }
Tensor log_softmax(const Tensor& x, int64_t dim) { return softmax_op<true>(x, dim, "log_softmax"); }

}  // namespace ember
