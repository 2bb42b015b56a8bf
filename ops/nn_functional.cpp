// Neural-network functions with fused kernels and hand-derived backwards: softmax and
// log_softmax (one pass for the max, one for the sum), layer_norm (mean and variance in one
// pass, llm.c style), inverted dropout, the embedding gather/scatter, and scaled dot-product
// attention (matmuls around a fused masked softmax).
// Under create_graph each backward is written in ops instead (the forward's pieces recomputed in
// ops where the kernels saved data), so that it can be differentiated again (Note [Double
// backward]); first-order backwards keep the kernels.
#include "ops/nn_functional.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <optional>
#include <vector>

#include <omp.h>

#include "graph/autograd.h"
#include "graph/copy.h"
#include "graph/creation.h"
#include "graph/device_backend.h"
#include "graph/profile.h"
#include "graph/random.h"
#include "ops/common.h"
#include "ops/elementwise.h"
#include "ops/index.h"
#include "ops/kernels.h"
#include "ops/loop_gemm.h"
#include "ops/reduce.h"
#include "ops/vec_math.h"

namespace ember {

namespace {

// The rows of a tensor along one dim: row r starts `start(r)` elements after data<T>() and
// steps by `stride`. Rows are numbered in row-major order of the other dims, so row r of a
// strided input and row r of its contiguous output are the same row. Contiguous tensors
// compute starts from (outer, inner); strided ones list them.
struct Rows {
  int64_t count = 1, n = 1, stride = 1, inner = 1;
  std::vector<int64_t> starts;

  int64_t start(int64_t r) const {
    return starts.empty() ? (r / inner) * n * inner + r % inner : starts[r];
  }
  bool parallel() const { return count > 1 && count * n >= costly_grain(); }
};

Rows rows_along(const Tensor& t, int64_t dim) {
  Rows rows;
  if (t.dim() == 0) return rows;
  rows.n = t.size(dim);
  rows.count = 1;
  for (int64_t d = 0; d < t.dim(); ++d)
    if (d != dim) rows.count *= t.size(d);
  if (t.is_contiguous()) {
    for (int64_t d = dim + 1; d < t.dim(); ++d) rows.inner *= t.size(d);
    rows.stride = rows.inner;
    return rows;
  }
  rows.stride = t.stride(dim);
  if (rows.count == 0) return rows;
  Shape outer = t.shape();
  outer[dim] = 1;
  rows.starts.reserve(rows.count);
  StridedLoop<1> loop(outer, {t.strides()});
  loop.run_serial([&](const auto& off, int64_t len, const auto& st) {
    for (int64_t i = 0; i < len; ++i) rows.starts.push_back(off[0] + i * st[0]);
  });
  return rows;
}

// Calls f(r) for every row, in parallel above the grain.
template <class F>
void for_each_row(const Rows& rows, F f) {
  parallel_for(
      rows.count,
      [&](int64_t begin, int64_t end) {
        for (int64_t r = begin; r < end; ++r) f(r);
      },
      row_grain(rows.n, costly_grain()));
}

// --- softmax and log_softmax

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

// Rows shorter than kShortRow run pass by pass over blocks of at most kShortRowBlock elements
// (softmax_short_rows).
constexpr int64_t kShortRow = 64, kShortRowBlock = 2048;

// The max, sum and dot product of contiguous rows: in lanes (Note [Lane sums]) from a vector's
// width on, below that in four independent chains (one chain's latency, not the arithmetic, is
// what such a row waits on; a SIMD loop would run in its scalar remainder).
template <class T>
EMBER_VEC_INLINE T row_max(const T* x, int64_t n) {
  using L = Lanes<T>;
  if (n >= L::kWidth) {
    L acc(x[0]);
    int64_t j = for_lanes<T>(
        n, [&](int64_t j, int u) EMBER_VEC_LAMBDA { acc.v[u] = L::max(acc.v[u], L::load(x + j)); });
    T m = acc.max_total();
    for (; j < n; ++j) m = std::max(m, x[j]);
    return m;
  }
  T m[4] = {x[0], x[0], x[0], x[0]};
  int64_t j = 0;
  for (; j + 4 <= n; j += 4)
    for (int l = 0; l < 4; ++l) m[l] = std::max(m[l], x[j + l]);
  for (; j < n; ++j) m[0] = std::max(m[0], x[j]);
  return std::max(std::max(m[0], m[1]), std::max(m[2], m[3]));
}

// Σ a[j] · b[j], or Σ a[j] when b is null.
template <class T>
EMBER_VEC_INLINE T row_dot(const T* a, const T* b, int64_t n) {
  using L = Lanes<T>;
  if (n >= L::kWidth) {
    L acc;
    int64_t j = for_lanes<T>(n, [&](int64_t j, int u) EMBER_VEC_LAMBDA {
      acc.v[u] += b ? L::load(a + j) * L::load(b + j) : L::load(a + j);
    });
    T s = acc.total();
    for (; j < n; ++j) s += b ? a[j] * b[j] : a[j];
    return s;
  }
  T s[4] = {0, 0, 0, 0};
  int64_t j = 0;
  for (; j + 4 <= n; j += 4)
    for (int l = 0; l < 4; ++l) s[l] += b ? a[j + l] * b[j + l] : a[j + l];
  for (; j < n; ++j) s[0] += b ? a[j] * b[j] : a[j];
  return (s[0] + s[1]) + (s[2] + s[3]);
}

template <class T>
EMBER_VEC_INLINE T row_sum(const T* x, int64_t n) {
  return row_dot<T>(x, nullptr, n);
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

// --- layer_norm

namespace {

// x, y are (M, N) contiguous; weight, bias (N) or null; mean, rstd (M). Per row, two passes
// over x in lanes of T (Note [Lane sums]): m = Σx / N, then the corrected two-pass variance,
// which does not cancel however large the offset (d = x - m; Σd is m's rounding error):
//   mean = m + Σd / N,  var = Σd² / N - (Σd / N)²,  rstd = 1 / sqrt(var + eps)
//   y = (x - mean) * rstd * weight + bias
template <class T>
void layer_norm_forward(const T* x, const T* weight, const T* bias, T* y, T* mean, T* rstd,
                        int64_t M, int64_t N, double eps) {
  using L = Lanes<T>;
  const double inv_n = 1.0 / static_cast<double>(N);
  parallel_for(
      M,
      [&](int64_t begin, int64_t end) {
        for (int64_t r = begin; r < end; ++r) {
          const T* xr = x + r * N;
          T* yr = y + r * N;
          L sums;
          int64_t j = for_lanes<T>(
              N, [&](int64_t j, int u) EMBER_VEC_LAMBDA { sums.v[u] += L::load(xr + j); });
          T sum = sums.total();
          for (; j < N; ++j) sum += xr[j];
          const T m = static_cast<T>(sum * inv_n);
          L d1, d2;
          j = for_lanes<T>(N, [&](int64_t j, int u) EMBER_VEC_LAMBDA {
            const auto d = L::load(xr + j) - m;
            d1.v[u] += d;
            d2.v[u] += d * d;
          });
          T s1 = d1.total(), s2 = d2.total();
          for (; j < N; ++j) {
            const T d = xr[j] - m;
            s1 += d;
            s2 += d * d;
          }
          const double c = s1 * inv_n, var = std::max(s2 * inv_n - c * c, 0.0);
          const T mu = static_cast<T>(m + c), rs = static_cast<T>(1.0 / std::sqrt(var + eps));
          mean[r] = mu;
          rstd[r] = rs;
#pragma omp simd
          for (j = 0; j < N; ++j) {
            T v = (xr[j] - mu) * rs;
            if (weight) v *= weight[j];
            if (bias) v += bias[j];
            yr[j] = v;
          }
        }
      },
      row_grain(N, costly_grain()));
}

// Backward of the forward above, g (M, N) contiguous; dx, dweight, dbias may be null:
//   xhat = (x - mean) * rstd,  dxhat = dY * weight
//   dX = rstd * (dxhat - mean_N(dxhat) - xhat * mean_N(dxhat * xhat))
//   dW = Σ_M dY * xhat,  dB = Σ_M dY
// Two passes over a row: the two sums (in lanes of T), then dX from them, xhat and dxhat
// recomputed rather than stored. dW and dB are summed per thread (in T over blocks of rows,
// then in double), then combined.
template <class T>
void layer_norm_backward(const T* g, const T* x, const T* weight, const T* mean, const T* rstd,
                         T* dx, T* dweight, T* dbias, int64_t M, int64_t N) {
  const bool parallel = M > 1 && M * N >= costly_grain();
  const bool param_grads = dweight || dbias;
  const int max_threads = parallel ? get_num_threads() : 1;
  std::vector<double> partial(param_grads ? 2 * N * max_threads : 0, 0.0);
  std::vector<T> unit_weight;
  if (!weight) unit_weight.assign(N, T(1));
  const T* w = weight ? weight : unit_weight.data();
  const T inv_n = T(1) / static_cast<T>(N);
  // One call per thread (a branch, not OpenMP's if-clause, which costs microseconds when false).
  const auto run = [=, &partial](int64_t t, int64_t threads) {
    // dW and dB summed in T over a block of up to kBlockRows rows (cheap, and within kBlockRows
    // roundings), added to the thread's double partials at the end of each block.
    constexpr int kBlockRows = 32;
    std::vector<T> block(param_grads ? 2 * N : 0, T(0));
    T* block_w = block.data();
    T* block_b = block_w + N;
    double* pw = param_grads ? partial.data() + 2 * N * t : nullptr;
    double* pb = param_grads ? pw + N : nullptr;
    int rows_in_block = 0;
    const auto flush = [&] {
      for (int64_t j = 0; j < N; ++j) {
        pw[j] += static_cast<double>(block_w[j]);
        pb[j] += static_cast<double>(block_b[j]);
        block_w[j] = block_b[j] = T(0);
      }
      rows_in_block = 0;
    };
    for (int64_t r = M * t / threads; r < M * (t + 1) / threads; ++r) {
      const T *gr = g + r * N, *xr = x + r * N;
      const T mu = mean[r], rs = rstd[r];
      if (dx) {
        // Σ dxhat and Σ dxhat · (x - mean), in lanes (Note [Lane sums])
        using L = Lanes<T>;
        L sums, dots;
        int64_t j = for_lanes<T>(N, [&](int64_t j, int u) EMBER_VEC_LAMBDA {
          const auto d = L::load(gr + j) * L::load(w + j);
          sums.v[u] += d;
          dots.v[u] += d * (L::load(xr + j) - mu);
        });
        T sum = sums.total(), dot = dots.total();
        for (; j < N; ++j) {
          const T d = gr[j] * w[j];
          sum += d;
          dot += d * (xr[j] - mu);
        }
        // xhat · mean(dxhat · xhat) = (x - mean) · c
        const T mean_dxhat = sum * inv_n, c = dot * rs * rs * inv_n;
        T* dxr = dx + r * N;
#pragma omp simd
        for (int64_t j = 0; j < N; ++j)
          dxr[j] = rs * (gr[j] * w[j] - mean_dxhat - (xr[j] - mu) * c);
      }
      if (pw) {
#pragma omp simd
        for (int64_t j = 0; j < N; ++j) {
          block_w[j] += gr[j] * ((xr[j] - mu) * rs);
          block_b[j] += gr[j];
        }
        if (++rows_in_block == kBlockRows) flush();
      }
    }
    if (pw && rows_in_block > 0) flush();
  };
  parallel_region(max_threads, run);
  if (!param_grads) return;
  for (int64_t j = 0; j < N; ++j) {
    double sw = 0, sb = 0;
    for (int t = 0; t < max_threads; ++t) {
      sw += partial[2 * N * t + j];
      sb += partial[2 * N * t + N + j];
    }
    if (dweight) dweight[j] = static_cast<T>(sw);
    if (dbias) dbias[j] = static_cast<T>(sb);
  }
}

// A contiguous copy (or t itself) for a kernel to read; the copy is data, not part of the graph.
Tensor contiguous_data(const Tensor& t) {
  if (!t.defined()) return t;
  NoGradGuard no_grad;
  return t.contiguous();
}

template <class T>
const T* data_or_null(const Tensor& t) {
  return t.defined() ? t.data<T>() : nullptr;
}

// A contiguous (M) t seen as an (M, 1) column.
Tensor column_of(const Tensor& t) {
  return make_view(t, {t.numel(), 1}, {1, 1}, t.storage_offset());
}

// A contiguous t seen as the (M, N) table of its rows.
Tensor table_of(const Tensor& t, int64_t M, int64_t N) {
  return make_view(t, {M, N}, {N, 1}, t.storage_offset());
}

// A contiguous (N) parameter seen along every one of M rows (stride 0 across them); undefined
// stays undefined (the row kernel's absent operand).
Tensor along_rows(const Tensor& p, int64_t M, int64_t N) {
  return p.defined() ? make_view(p, {M, N}, {0, 1}, p.storage_offset()) : Tensor();
}

// The derivative of layer_norm_backward (dX, dW, dB from dY, x, weight) given cotangents cX, cW,
// cB (any may be absent), per row with xhat = (x - mean) rstd, g = dY weight, a = mean(g),
// b = mean(g xhat), p = mean(cX), q = mean(cX xhat), N the row's length:
//   c_g    = rstd (cX - p - xhat q)                 (dX is symmetric in g and cX)
//   c_xhat = -rstd (b cX + g q) + cW dY
//   c_rstd = Σ cX (g - a - xhat b)                   (dX = rstd · that)
//   gdY = c_g weight + cW xhat + cB,   gW = Σ_rows c_g dY
//   gx  = rstd (c_xhat - mean(c_xhat) - xhat mean(c_xhat xhat)) - c_rstd rstd² xhat / N
// the last term rstd's own dependence on x (d rstd / dx = -rstd² xhat / N). Kernel: one pass per
// sum over a row in T, gW summed in T over blocks of 32 rows, then per thread in double (as
// layer_norm_backward); a null weight means ones, a null cotangent zeros.
template <class T>
void layer_norm_double_backward(const T* dy, const T* x, const T* weight, const T* mean,
                                const T* rstd, const T* cx, const T* cw, const T* cb, T* gdy, T* gx,
                                T* gw, int64_t M, int64_t N) {
  const bool parallel = M > 1 && M * N >= costly_grain();
  const int max_threads = parallel ? get_num_threads() : 1;
  std::vector<double> partial(gw ? N * max_threads : 0, 0.0);
  // Absent operands as rows of ones or zeros, so that every loop below is branch-free.
  const std::vector<T> ones(weight ? 0 : N, T(1)), zero(N, T(0));
  const T* w = weight ? weight : ones.data();
  const T *cwp = cw ? cw : zero.data(), *cbp = cb ? cb : zero.data();
  const T inv_n = T(1) / static_cast<T>(N);
  parallel_region(max_threads, [&](int64_t t, int64_t threads) {
    // Locals: GCC 12 reloads the closure's pointers after every store in the simd loops (a float
    // store could alias them) and gathers through them.
    const T *const w_ = w, *const cw_ = cwp, *const cb_ = cbp, *const zero_ = zero.data();
    double* const partial_ = partial.data();
    // per row: xhat, g, c_xhat, and gdY where it is not wanted; gW's sum over a block of rows
    std::vector<T> scratch(5 * N, T(0));
    T *xh = scratch.data(), *g = xh + N, *cxh = g + N, *no_gdy = cxh + N, *block = no_gdy + N;
    constexpr int kBlockRows = 32;
    int rows_in_block = 0;
    const auto flush = [&] {
      double* pw = partial_ + N * t;
      for (int64_t j = 0; j < N; ++j) pw[j] += static_cast<double>(block[j]), block[j] = T(0);
      rows_in_block = 0;
    };
    for (int64_t r = M * t / threads; r < M * (t + 1) / threads; ++r) {
      const T *dyr = dy + r * N, *xr = x + r * N, *cxr = cx ? cx + r * N : zero_;
      const T mu = mean[r], rs = rstd[r];
      T sum_g = 0, sum_gx = 0;
#pragma omp simd reduction(+ : sum_g, sum_gx)
      for (int64_t j = 0; j < N; ++j) {
        xh[j] = (xr[j] - mu) * rs;
        g[j] = dyr[j] * w_[j];
        sum_g += g[j];
        sum_gx += g[j] * xh[j];
      }
      const T a = sum_g * inv_n, b = sum_gx * inv_n;
      T p = 0, q = 0, c_rstd = 0;
#pragma omp simd reduction(+ : p, q, c_rstd)
      for (int64_t j = 0; j < N; ++j) {
        p += cxr[j];
        q += cxr[j] * xh[j];
        c_rstd += cxr[j] * (g[j] - a - xh[j] * b);
      }
      p *= inv_n, q *= inv_n;
      T sum_c = 0, sum_cx = 0;
      T* gdyr = gdy ? gdy + r * N : no_gdy;
#pragma omp simd reduction(+ : sum_c, sum_cx)
      for (int64_t j = 0; j < N; ++j) {
        const T cg = rs * (cxr[j] - p - xh[j] * q);
        const T c = cw_[j] * dyr[j] - rs * (b * cxr[j] + g[j] * q);
        cxh[j] = c;
        sum_c += c;
        sum_cx += c * xh[j];
        gdyr[j] = cg * w_[j] + cw_[j] * xh[j] + cb_[j];
        block[j] += cg * dyr[j];
      }
      if (gw && ++rows_in_block == kBlockRows) flush();
      if (gx) {
        const T m1 = sum_c * inv_n, m2 = sum_cx * inv_n, k = c_rstd * rs * rs * inv_n;
        T* gxr = gx + r * N;
#pragma omp simd
        for (int64_t j = 0; j < N; ++j) gxr[j] = rs * (cxh[j] - m1 - xh[j] * m2) - k * xh[j];
      }
    }
    if (gw && rows_in_block > 0) flush();
  });
  if (!gw) return;
  for (int64_t j = 0; j < N; ++j) {
    double sum = 0;
    for (int t = 0; t < max_threads; ++t) sum += partial[N * t + j];
    gw[j] = static_cast<T>(sum);
  }
}

// layer_norm_backward's Node: inputs dY, x, weight; outputs dX, dW, dB. On the CPU without
// create_graph, layer_norm_double_backward; else the same formulas in ops, xhat and rstd
// recomputed from x (so that they can be differentiated once more, and on any device).
struct LayerNormGradBackward final : Node {
  LayerNormGradBackward(const Tensor& dy, const Tensor& x, const Tensor& weight, const Tensor& xc,
                        const Tensor& wc, const Tensor& mean, const Tensor& rstd, int64_t k,
                        double eps)
      : M_(mean.numel()), N_(M_ == 0 ? 0 : xc.numel() / M_), k_(k), eps_(eps) {
    save(dy_, dy), save(x_, x), save(weight_, weight);
    save(xc_, xc), save(wc_, wc), save(mean_, mean), save(rstd_, rstd);
  }
  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    if (is_grad_enabled() || !xc_.get().device().is_cpu()) return apply_in_ops(grads);
    const Tensor dy = contiguous_data(dy_.get()), &x = xc_.get(), &w = wc_.get();
    const auto data = [](const Tensor& t) { return t.defined() ? t.contiguous() : t; };
    const Tensor cx = data(grads[0]), cw = data(grads[1]), cb = data(grads[2]);
    Tensor gdy, gx, gw;
    if (needs_grad(0)) gdy = empty(input_shapes[0], dy.dtype(), dy.device());
    if (needs_grad(1)) gx = empty(input_shapes[1], dy.dtype(), dy.device());
    if (needs_grad(2)) gw = zeros(input_shapes[2], dy.dtype(), dy.device());
    if (M_ == 0 || N_ == 0) return {gdy, gx, gw};
    dispatch_float(dy.dtype(), op(), [&]<class T>() {
      const auto ptr = [](const Tensor& t) { return t.defined() ? t.data<T>() : nullptr; };
      layer_norm_double_backward<T>(dy.data<T>(), x.data<T>(), ptr(w), mean_.get().data<T>(),
                                    rstd_.get().data<T>(), ptr(cx), ptr(cw), ptr(cb), ptr(gdy),
                                    ptr(gx), ptr(gw), M_, N_);
    });
    return {gdy, gx, gw};
  }
  std::vector<Tensor> apply_in_ops(const std::vector<Tensor>& grads) {
    const Tensor dy = dy_.get(), x = x_.get(), w = weight_.get();
    const Tensor &cx = grads[0], &cw = grads[1], &cb = grads[2];
    std::vector<int64_t> dims;
    for (int64_t d = x.dim() - k_; d < x.dim(); ++d) dims.push_back(d);
    const Tensor centred = sub(x, mean(x, dims, true));
    const Tensor rstd = pow(add(mean(mul(centred, centred), dims, true), eps_), -0.5);
    const Tensor xhat = mul(centred, rstd);
    const Tensor g = w.defined() ? mul(dy, w) : dy;
    Tensor c_g, c_xhat, c_rstd;
    if (cx.defined()) {
      const Tensor p = mean(cx, dims, true), q = mean(mul(cx, xhat), dims, true);
      const Tensor b = mean(mul(g, xhat), dims, true);
      c_g = mul(rstd, sub(sub(cx, p), mul(xhat, q)));
      c_xhat = neg(mul(rstd, add(mul(b, cx), mul(g, q))));
      c_rstd = sum(mul(cx, sub(sub(g, mean(g, dims, true)), mul(xhat, b))), dims, true);
    }
    if (cw.defined()) {
      const Tensor from_w = mul(cw, dy);
      c_xhat = c_xhat.defined() ? add(c_xhat, from_w) : from_w;
    }
    Tensor gdy, gx, gw;
    if (needs_grad(0)) {
      gdy = c_g.defined() ? (w.defined() ? mul(c_g, w) : c_g) : zeros_like(dy);
      if (cw.defined()) gdy = add(gdy, mul(cw, xhat));
      if (cb.defined()) gdy = add(gdy, cb);
    }
    if (needs_grad(1) && (c_xhat.defined() || c_rstd.defined())) {
      gx = c_xhat.defined() ? mul(rstd, sub(sub(c_xhat, mean(c_xhat, dims, true)),
                                            mul(xhat, mean(mul(c_xhat, xhat), dims, true))))
                            : zeros_like(x);
      if (c_rstd.defined()) {
        const double n = static_cast<double>(N_ == 0 ? 1 : N_);
        gx = sub(gx, mul(div(mul(c_rstd, mul(rstd, rstd)), n), xhat));
      }
    }
    if (needs_grad(2) && c_g.defined()) gw = sum_to(mul(c_g, dy), input_shapes[2]);
    return {gdy, gx, gw};
  }
  bool differentiable_backward() const override { return true; }
  int64_t M_, N_, k_;
  double eps_;
  SavedTensor dy_, x_, weight_;        // the op's inputs
  SavedTensor xc_, wc_, mean_, rstd_;  // the forward kernel's data
};

// y = (x - mean) * rstd * weight + bias over the trailing N elements of each of M rows; saves
// x, weight and the per-row mean and rstd (see layer_norm_backward for the derivative):
//   xhat = (x - mean(x)) / sqrt(mean((x - mean(x))²) + eps),  dxhat = dY * weight
//   dX = rstd (dxhat - mean(dxhat) - xhat mean(dxhat xhat)),  dW = Σ dY xhat,  dB = Σ dY
// Under create_graph the same kernels run, recorded as the op layer_norm_backward (inputs dY, x,
// weight; torch's native_layer_norm_backward), whose own derivative is LayerNormGradBackward.
struct LayerNormBackward final : Node {
  LayerNormBackward(const Tensor& input, const Tensor& weight_input, const Tensor& x,
                    const Tensor& weight, const Tensor& mean, const Tensor& rstd, int64_t k,
                    double eps)
      : M_(mean.numel()), N_(M_ == 0 ? 0 : x.numel() / M_), k_(k), eps_(eps) {
    save(x_, x), save(weight_, weight), save(mean_, mean), save(rstd_, rstd);
    save(input_, input), save(weight_input_, weight_input);
  }
  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    if (!is_grad_enabled()) return by_kernels(grads[0]);
    // create_graph: the kernels' values, recorded as layer_norm_backward of (dY, x, weight)
    std::vector<Tensor> out;
    {
      NoGradGuard no_grad;
      out = by_kernels(grads[0]);
    }
    const Tensor x = input_.get(), w = weight_input_.get();
    record<LayerNormGradBackward>("layer_norm_backward", {&out[0], &out[1], &out[2]},
                                  {grads[0], x, w}, grads[0], x, w, x_.get(), weight_.get(),
                                  mean_.get(), rstd_.get(), k_, eps_);
    return out;
  }
  std::vector<Tensor> by_kernels(const Tensor& dy) {
    if (!dy.device().is_cpu()) return apply_on_device(dy);
    const Tensor g = dy.contiguous();
    const Tensor& x = x_.get();
    Tensor grad_x, grad_w, grad_b;
    if (needs_grad(0)) grad_x = empty(x.shape(), x.dtype(), x.device());
    // No rows (M = 0): the kernel writes no dW, dB; they are sums of nothing.
    const auto make = [&](const Shape& s) {
      return M_ == 0 ? zeros(s, x.dtype(), x.device()) : empty(s, x.dtype(), x.device());
    };
    if (needs_grad(1)) grad_w = make(input_shapes[1]);
    if (needs_grad(2)) grad_b = make(input_shapes[2]);
    dispatch_float(x.dtype(), op(), [&]<class T>() {
      layer_norm_backward<T>(g.data<T>(), x.data<T>(), data_or_null<T>(weight_.get()),
                             mean_.get().data<T>(), rstd_.get().data<T>(),
                             grad_x.defined() ? grad_x.data<T>() : nullptr,
                             grad_w.defined() ? grad_w.data<T>() : nullptr,
                             grad_b.defined() ? grad_b.data<T>() : nullptr, M_, N_);
    });
    return {grad_x, grad_w, grad_b};
  }
  // On a device: dX by one row kernel (each row's mean and rstd recomputed there), dW and dB
  // as sums over the rows in ops, with the forward's mean and rstd.
  std::vector<Tensor> apply_on_device(const Tensor& dy) {
    const Tensor g = dy.contiguous(), &x = x_.get(), &w = weight_.get();
    Tensor grad_x, grad_w, grad_b;
    if (needs_grad(0)) {
      grad_x = empty(x.shape(), x.dtype(), x.device());
      if (M_ > 0 && N_ > 0)
        rows_on_device(cuda::kernels::RowOp::LayerNormBackward, x.dtype(), 1,
                       {table_of(g, M_, N_), table_of(x, M_, N_), along_rows(w, M_, N_)},
                       {table_of(grad_x, M_, N_)}, op(), false, eps_);
    }
    const auto make = [&](const Shape& s) {
      return M_ == 0 ? zeros(s, x.dtype(), x.device()) : empty(s, x.dtype(), x.device());
    };
    if (needs_grad(1)) grad_w = make(input_shapes[1]);
    if (needs_grad(2)) grad_b = make(input_shapes[2]);
    if ((grad_w.defined() || grad_b.defined()) && M_ > 0 && N_ > 0) {
      // one column of the tables a row of LayerNormParams (along dim 0)
      const auto per_column = [&](const Tensor& t) {
        return t.defined()
                   ? per_row(make_view(t, {1, N_}, {N_, 1}, t.storage_offset()), {M_, N_}, 0)
                   : Tensor();
      };
      const Tensor& mean = mean_.get();
      rows_on_device(cuda::kernels::RowOp::LayerNormParams, x.dtype(), 0,
                     {table_of(g, M_, N_), table_of(x, M_, N_),
                      make_view(mean, {M_, N_}, {1, 0}, mean.storage_offset())},
                     {per_column(grad_w), per_column(grad_b)}, op());
    }
    return {grad_x, grad_w, grad_b};
  }
  bool differentiable_backward() const override { return true; }
  int64_t M_, N_, k_;
  double eps_;
  SavedTensor x_, weight_, mean_, rstd_;  // the kernel's: contiguous data
  SavedTensor input_, weight_input_;      // the op's inputs, for layer_norm_backward's graph
};

void check_affine(const Tensor& x, const Tensor& p, const Shape& normalized_shape,
                  std::string_view what, std::string_view op) {
  if (!p.defined()) return;
  EMBER_CHECK(p.shape() == normalized_shape,
              "{}: {} of shape {} does not match normalized_shape {}", op, what, p.shape(),
              normalized_shape);
  EMBER_CHECK(p.dtype() == x.dtype(), "{}: {} is {} but the input is {}", op, what, p.dtype(),
              x.dtype());
}

}  // namespace

Tensor layer_norm(const Tensor& x, Shape normalized_shape, const Tensor& weight, const Tensor& bias,
                  double eps) {
  constexpr std::string_view op = "layer_norm";
  profile::Scope scope(op);
  check_floating(x, op);
  const int64_t k = static_cast<int64_t>(normalized_shape.size());
  EMBER_CHECK(k >= 1, "{}: normalized_shape must have at least one dim, got {}", op,
              normalized_shape);
  EMBER_CHECK(k <= x.dim() && Shape(x.shape().end() - k, x.shape().end()) == normalized_shape,
              "{}: normalized_shape {} does not match the trailing dims of the input of shape {}",
              op, normalized_shape, x.shape());
  check_affine(x, weight, normalized_shape, "weight", op);
  check_affine(x, bias, normalized_shape, "bias", op);
  EMBER_CHECK(eps >= 0, "{}: eps must be non-negative, got {}", op, eps);

  const int64_t N = shape_numel(normalized_shape), M = N == 0 ? 0 : x.numel() / N;
  const Tensor xc = contiguous_data(x), w = contiguous_data(weight), b = contiguous_data(bias);
  Tensor out = empty(x.shape(), x.dtype(), x.device());
  // mean and rstd in one (2, M) buffer: a device's LayerNormParams kernel reads both from mean's
  // address
  const Tensor stats = empty({2, M}, x.dtype(), x.device());
  const Tensor mean = stats.select(0, 0), rstd = stats.select(0, 1);
  if (!x.device().is_cpu()) {
    // A device: one row kernel writes each row's y, mean and rstd (no graph: the Node below
    // records the op)
    if (M > 0 && N > 0)
      rows_on_device(cuda::kernels::RowOp::LayerNorm, x.dtype(), 1,
                     {table_of(xc, M, N), along_rows(w, M, N), along_rows(b, M, N)},
                     {table_of(out, M, N), per_row(column_of(mean), {M, N}, 1),
                      per_row(column_of(rstd), {M, N}, 1)},
                     op, false, eps);
    return record<LayerNormBackward>(op, out, {x, weight, bias}, x, weight, xc, w, mean, rstd, k,
                                     eps);
  }
  dispatch_float(x.dtype(), op, [&]<class T>() {
    layer_norm_forward<T>(xc.data<T>(), data_or_null<T>(w), data_or_null<T>(b), out.data<T>(),
                          mean.data<T>(), rstd.data<T>(), M, N, eps);
  });
  return record<LayerNormBackward>(op, out, {x, weight, bias}, x, weight, xc, w, mean, rstd, k,
                                   eps);
}

// --- dropout

namespace {

// Note [Dropout masks]
// One draw of the global generator keys a counter-based stream (counter_bits): pair j's 64 bits
// decide element j by their low half and element j + n/2 by their high half, dropped when the half
// is below p * 2^32 (p to within 2^-32). The loop vectorises and splits across threads, and one
// seed gives one mask on any thread count. dropout's forward also writes the mask, a byte an
// element (as torch's bool mask), for its backward: recomputing it there cost as much as the
// forward (the hash is most of a pass; on AVX2, without a 64-bit lane multiply, twice the
// multiply), reading a byte a fraction of it. Attention's dropout of its weights (sdpa,
// head_attention) still recomputes the mask from the key in its backward, where the weights are
// few and saving nothing is worth more.
struct DropoutMask {
  uint64_t key;
  uint32_t threshold;  // p * 2^32, below 2^32 as p < 1
  double scale;        // 1 / (1 - p)
};

// A fresh mask for probability p in (0, 1): one draw of the global generator.
DropoutMask dropout_mask(double p) {
  return {random_bits(), static_cast<uint32_t>(std::ldexp(p, 32)), 1.0 / (1.0 - p)};
}

// out[i] = x[i] * (kept(i) ? scale : 0), for contiguous x and out of n elements, and kept(i) into
// keep[i] when keep is given. Blocks of pairs: the bits first, into 32-bit halves, then the
// multiply, so that both loops vectorise (GCC 12 does not vectorise one loop that mixes the 64-bit
// hash with 32-bit floats).
template <class T>
void apply_dropout_mask(const T* x, T* out, int64_t n, const DropoutMask& m, bool* keep = nullptr) {
  const int64_t half = n / 2;
  // keep's bytes written as bytes, 0 or 1: GCC 12 vectorises no loop that stores a bool.
  unsigned char* kept = reinterpret_cast<unsigned char*>(keep);
  parallel_for(
      half,
      [&, m, kept](int64_t begin, int64_t end) {
        // Locals by value: GCC 12 does not vectorise a loop that reads a by-reference capture.
        constexpr int64_t kBlock = 256;
        const uint64_t key = m.key;
        const uint32_t threshold = m.threshold;
        const T scale = static_cast<T>(m.scale);
        // And the pointers and half: a byte store could otherwise alias the closure's copies.
        const T* const xs = x;
        T* const ys = out;
        unsigned char* const ks = kept;
        const int64_t h = half;
        uint32_t lo[kBlock], hi[kBlock];
        for (int64_t b = begin; b < end; b += kBlock) {
          const int64_t len = std::min(kBlock, end - b);
          // counter_bits(key, b + j), the state stepped rather than multiplied out (on AVX2 a
          // 64-bit multiply is three 32-bit ones: this is a third of the hash's).
          uint64_t state = key + static_cast<uint64_t>(b + 1) * kCounterGamma;
          for (int64_t j = 0; j < len; ++j) {
            const uint64_t bits = counter_mix(state);
            state += kCounterGamma;
            lo[j] = static_cast<uint32_t>(bits);
            hi[j] = static_cast<uint32_t>(bits >> 32);
          }
          for (int64_t j = 0; j < len; ++j)
            ys[b + j] = xs[b + j] * (lo[j] < threshold ? T(0) : scale);
          for (int64_t j = 0; j < len; ++j)
            ys[b + h + j] = xs[b + h + j] * (hi[j] < threshold ? T(0) : scale);
          if (ks != nullptr) {
            for (int64_t j = 0; j < len; ++j) ks[b + j] = lo[j] >= threshold;
            for (int64_t j = 0; j < len; ++j) ks[b + h + j] = hi[j] >= threshold;
          }
        }
      },
      costly_grain() / 2);  // pairs: a hash each
  if (n % 2 == 1) {
    const auto bits = static_cast<uint32_t>(counter_bits(m.key, static_cast<uint64_t>(half)));
    out[n - 1] = x[n - 1] * (bits < m.threshold ? T(0) : static_cast<T>(m.scale));
    if (kept != nullptr) kept[n - 1] = bits >= m.threshold;
  }
}

// x with m applied (a new tensor of x's shape), and m's kept elements into keep (Bool, x.numel()
// elements, contiguous) when keep is given.
Tensor apply_dropout_mask(const Tensor& x, const DropoutMask& m, std::string_view op,
                          const Tensor& keep = {}) {
  const Tensor xc = x.contiguous();
  Tensor out = empty(x.shape(), x.dtype(), x.device());
  dispatch_float(x.dtype(), op, [&]<class T>() {
    apply_dropout_mask(xc.data<T>(), out.data<T>(), xc.numel(), m,
                       keep.defined() ? keep.data<bool>() : nullptr);
  });
  return out;
}

// y = x * mask * scale:  dX = dY * mask * scale, the forward's mask read back (Note [Dropout
// masks]). Under create_graph the same kernel, recorded as the op dropout_backward of dY, whose
// derivative is this Node again (dX is dY through the same mask: linear in dY).
struct DropoutBackward final : Node {
  DropoutBackward(Tensor keep, double scale) : keep_(std::move(keep)), scale_(scale) {}
  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    if (!is_grad_enabled()) return {masked(grads[0])};
    Tensor dx;
    {
      NoGradGuard no_grad;
      dx = masked(grads[0]);
    }
    return {record<DropoutBackward>("dropout_backward", dx, {grads[0]}, keep_, scale_)};
  }
  Tensor masked(const Tensor& dy) const {
    if (!dy.device().is_cpu()) {  // a device: one elementwise kernel
      Tensor dx = empty(dy.shape(), dy.dtype(), dy.device());
      elementwise_on_device(dx, cuda::kernels::Op::DropoutScale, dy.dtype(),
                            {dy, keep_.view(dy.shape())}, op(), scale_);
      return dx;
    }
    const Tensor g = dy.contiguous();
    Tensor dx = empty(g.shape(), g.dtype(), g.device());
    dispatch_float(g.dtype(), op(), [&]<class T>() {
      const T* pg = g.data<T>();
      const auto* kept = reinterpret_cast<const unsigned char*>(keep_.data<bool>());
      T* out = dx.data<T>();
      const T scale = static_cast<T>(scale_);
      parallel_for(g.numel(), [&](int64_t begin, int64_t end) {
        // Locals: GCC 12 leaves the loop scalar when it reads the closure's members, which its
        // float stores could alias (the scale) or which it reloads after each of them.
        const T* const gs = pg;
        const unsigned char* const ks = kept;
        T* const ys = out;
        const T sc = scale;
        for (int64_t i = begin; i < end; ++i) ys[i] = gs[i] * (ks[i] != 0 ? sc : T(0));
      });
    });
    return dx;
  }
  bool differentiable_backward() const override { return true; }
  Tensor keep_;  // Bool, one element for each of x's, contiguous
  double scale_;
};

}  // namespace

Tensor dropout(const Tensor& x, double p, bool training) {
  constexpr std::string_view op = "dropout";
  profile::Scope scope(op);
  check_defined(x, op);
  EMBER_CHECK(p >= 0 && p <= 1, "{}: probability has to be in [0, 1], got {}", op, p);
  if (!training || p == 0) return x;
  check_floating(x, op);
  if (p == 1) return mul(x, 0.0);  // all dropped, as torch (x * 0: a NaN stays NaN); no 1 / 0
  const DropoutMask mask = dropout_mask(p);
  if (!x.device().is_cpu()) {
    // A device: the same mask from the same key (cuda/random.h), then x * mask * scale in one
    // elementwise kernel
    const Tensor keep = empty({x.numel()}, kBool, x.device());
    cuda::kernels::DropoutMask m;
    m.key = mask.key, m.threshold = mask.threshold, m.n = x.numel();
    m.keep = static_cast<bool*>(keep.data_bytes());
    cuda::detail::launch_dropout_mask(m, x.device(), op);
    Tensor out = empty(x.shape(), x.dtype(), x.device());
    elementwise_on_device(out, cuda::kernels::Op::DropoutScale, x.dtype(),
                          {x, keep.view(x.shape())}, op, mask.scale);
    return record<DropoutBackward>(op, out, {x}, keep, mask.scale);
  }
  // The mask only where a backward will read it (where record makes the node).
  const Tensor keep = any_requires_grad({x}) ? empty({x.numel()}, kBool) : Tensor();
  return record<DropoutBackward>(op, apply_dropout_mask(x, mask, op, keep), {x}, keep, mask.scale);
}

// --- embedding

namespace {

// dW = embedding_backward(dOut) (below) adds row k of dOut into row indices[k] of zeros:
//   d(dOut)[k, :] = ddW[indices[k], :], zeros where indices[k] is the padding row
// which is embedding's forward again, of ddW with its padding row zeroed.
struct EmbeddingBackwardBackward final : Node {
  EmbeddingBackwardBackward(const Tensor& indices, int64_t padding_idx)
      : padding_idx_(padding_idx) {
    save(indices_, indices);
  }
  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    Tensor gg = grads[0];
    if (padding_idx_ >= 0) {  // a constant 0 on the padding row, 1 elsewhere
      Tensor rows = ones({gg.size(0), 1}, gg.dtype(), gg.device());
      rows.narrow(0, padding_idx_, 1).fill_(0.0);
      gg = mul(gg, rows);
    }
    return {embedding(gg, indices_.get())};
  }
  bool differentiable_backward() const override { return true; }
  SavedTensor indices_;
  int64_t padding_idx_;  // -1: none
};

// The gradient of embedding's weight (wshape) for dOut g: zeros with g's row k added into row
// indices[k] (repeats add up), except the padding row, which gets none (torch's padding_idx). An
// op of its own (recorded under create_graph), so that its gradient can be taken in turn.
Tensor embedding_backward(const Tensor& g, const Tensor& indices, const Shape& wshape,
                          int64_t padding_idx) {
  constexpr std::string_view op = "embedding_backward";
  const Tensor gc = contiguous_data(g);
  Tensor grad_w = zeros(wshape, g.dtype(), g.device());
  if (!g.device().is_cpu()) {
    // A device: g's row k added into row indices[k] by scatter_add, the padding row then zeroed
    const int64_t count = indices.numel(), dim = wshape[1];
    const Tensor rows = make_view(gc, {count, dim}, {dim, 1}, gc.storage_offset());
    const Tensor index = make_view(indices, {count, dim}, {1, 0}, indices.storage_offset());
    index_on_device(cuda::kernels::IndexOp::ScatterAdd, rows, grad_w, 0, index, op);
    if (padding_idx >= 0)
      copy_into(narrow_view(grad_w, 0, padding_idx, 1), zeros({}, g.dtype(), g.device()));
  } else {
    dispatch_float(g.dtype(), op, [&]<class T>() {
      const int64_t* idx = indices.data<int64_t>();
      const T* pg = gc.data<T>();
      T* pw = grad_w.data<T>();
      const int64_t dim = wshape[1], count = indices.numel();
      for (int64_t k = 0; k < count; ++k) {  // serial: repeated indices add into one row
        if (idx[k] == padding_idx) continue;
        T* row = pw + idx[k] * dim;
        const T* src = pg + k * dim;
        for (int64_t j = 0; j < dim; ++j) row[j] += src[j];
      }
    });
  }
  if (!is_grad_enabled()) return grad_w;  // a first-order backward: nothing to record or check
  return record<EmbeddingBackwardBackward>(op, grad_w, {g}, indices, padding_idx);
}

// out[k, :] = weight[indices[k], :]:  dWeight = embedding_backward(dOut)
struct EmbeddingBackward final : Node {
  EmbeddingBackward(const Tensor& indices, int64_t padding_idx) : padding_idx_(padding_idx) {
    save(indices_, indices);
  }
  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    return {embedding_backward(grads[0], indices_.get(), input_shapes[0], padding_idx_)};
  }
  bool differentiable_backward() const override { return true; }
  SavedTensor indices_;
  int64_t padding_idx_;  // -1: none
};

}  // namespace

Tensor embedding(const Tensor& weight, const Tensor& indices, std::optional<int64_t> padding_idx) {
  constexpr std::string_view op = "embedding";
  profile::Scope scope(op);
  check_defined(weight, op);
  check_defined(indices, op);
  EMBER_CHECK(weight.dim() == 2, "{}: weight must be 2-D (num_embeddings, dim), got shape {}", op,
              weight.shape());
  EMBER_CHECK(is_floating(weight.dtype()), "{}: weight must be Float32 or Float64, got {}", op,
              weight.dtype());
  EMBER_CHECK(indices.dtype() == kInt64, "{}: indices must be Int64, got {} of shape {}", op,
              indices.dtype(), indices.shape());
  const Tensor idx = indices.contiguous();
  const int64_t rows = weight.size(0), dim = weight.size(1), count = idx.numel();
  if (padding_idx) {
    EMBER_CHECK(*padding_idx >= -rows && *padding_idx < rows,
                "{}: padding_idx {} out of range for {} rows", op, *padding_idx, rows);
    if (*padding_idx < 0) *padding_idx += rows;
  }
  check_same_device(weight, indices, op);
  // an index out of range, "{}" for it; on a device the kernel checks the indices (Note [Checks
  // on the device])
  const auto range = [&] {
    return fmt::format("{}: index {{}} out of range for {} rows", op, rows);
  };
  const int64_t* pi = idx.device().is_cpu() ? idx.data<int64_t>() : nullptr;
  for (int64_t k = 0; pi != nullptr && k < count; ++k)
    EMBER_CHECK(pi[k] >= 0 && pi[k] < rows, "{}", fmt::format(fmt::runtime(range()), pi[k]));

  Shape shape = indices.shape();
  shape.push_back(dim);
  Tensor out = empty(shape, weight.dtype(), weight.device());
  if (!weight.device().is_cpu()) {
    // A device: out[k, :] = weight[indices[k], :] by gather
    index_on_device(cuda::kernels::IndexOp::Gather, make_view(out, {count, dim}, {dim, 1}, 0),
                    weight, 0, make_view(idx, {count, dim}, {1, 0}, idx.storage_offset()), op,
                    range());
    return record<EmbeddingBackward>(op, out, {weight}, idx, padding_idx.value_or(-1));
  }
  dispatch_float(weight.dtype(), op, [&]<class T>() {
    const T* pw = weight.data<T>();
    T* po = out.data<T>();
    const int64_t s0 = weight.stride(0), s1 = weight.stride(1);
    parallel_for(
        count,
        [&](int64_t begin, int64_t end) {
          for (int64_t k = begin; k < end; ++k) {
            const T* src = pw + pi[k] * s0;
            T* dst = po + k * dim;
            if (s1 == 1)
              std::memcpy(dst, src, dim * sizeof(T));
            else
              for (int64_t j = 0; j < dim; ++j) dst[j] = src[j * s1];
          }
        },
        row_grain(dim));
  });
  return record<EmbeddingBackward>(op, out, {weight}, idx, padding_idx.value_or(-1));
}

// --- scaled_dot_product_attention

namespace {

// Note [Attention kernel]
// scaled_dot_product_attention is one op over existing kernels: S = q kᵀ by matmul (a batched
// gemm; k's transpose is a BLAS flag), then one fused pass per row of S that scales it, applies
// the mask and turns it into softmax probabilities P in place (no scaled, masked or -inf-filled
// copy of S and no mask tensor is made), then out = dropout(P) v by matmul. With is_causal, row i
// keeps keys j <= i (torch's tril(ones(L, S)), aligned top-left): the pass computes exponentials
// there only and writes zeros beyond. A row where no key takes part gives zeros, as torch's math
// backend since 2.5 (_safe_softmax; 2.0 to 2.4 gave NaN). Saved for the backward: q, k, v (inputs)
// and P; dropout's mask is recomputed from its key (Note [Dropout masks]):
//   dV = P_dᵀ dO,  dP_d = dO vᵀ,  dP = dropout(dP_d),  dS = P ⊙ (dP − Σ_j dP ⊙ P),
//   dMask = dS (a floating mask),  dQ = scale · dS k,  dK = scale · dSᵀ q.

enum class MaskKind { None, Bool, Float };

// Query, key and value of one floating dtype.
void check_attention_dtypes(const Tensor& query, const Tensor& key, const Tensor& value,
                            std::string_view op) {
  check_floating(query, op);
  check_floating(key, op);
  check_floating(value, op);
  EMBER_CHECK(query.dtype() == key.dtype() && key.dtype() == value.dtype(),
              "{}: query, key and value are {}, {} and {}; convert them to one dtype with to()", op,
              query.dtype(), key.dtype(), value.dtype());
}

// Rows [begin, end) of P (S keys each; query i = row % L), in place, as softmax_short_rows: in
// blocks of at most kShortRowBlock elements, pass by pass, since attention rows are short and a
// row-at-a-time loop would run mostly in its SIMD prologue and remainder:
//  1. each row: scores · scale, the mask applied (Bool false: -inf; floating: added), the keys
//     past the causal prefix -inf, then the row's max subtracted (none when all are -inf);
//  2. the exponentials of the whole block in one loop: masked keys and the causal zeros are its
//     exp(-inf) = 0;
//  3. each row divided by its sum: a row where no key takes part sums to 0 and stays zeros; a
//     row with a NaN score is all NaN, as softmax's.
template <MaskKind Kind, class T, class M>
void attention_block(T* p, int64_t begin, int64_t end, int64_t L, int64_t S, T scale, bool causal,
                     const M* pm, const Rows& mr) {
  constexpr T neg_inf = -std::numeric_limits<T>::infinity();
  const int64_t block_rows = std::max<int64_t>(1, kShortRowBlock / S);
  bool nan_row[kShortRowBlock];
  for (int64_t b = begin; b < end; b += block_rows) {
    const int64_t rows = std::min(block_rows, end - b);
    T* xb = p + b * S;
    for (int64_t i = 0; i < rows; ++i) {
      const int64_t r = b + i, keep = causal ? std::min(r % L + 1, S) : S;
      T* x = xb + i * S;
      [[maybe_unused]] const M* m = pm == nullptr ? pm : pm + mr.start(r);
      [[maybe_unused]] const int64_t ms = mr.stride;
      T mx = neg_inf;
      int nan = 0;
#pragma omp simd reduction(max : mx) reduction(| : nan)
      for (int64_t j = 0; j < keep; ++j) {
        T v = x[j] * scale;
        if constexpr (Kind == MaskKind::Bool) {
          v = m[j * ms] ? v : neg_inf;
        } else if constexpr (Kind == MaskKind::Float) {
          v += m[j * ms];
        }
        mx = std::max(mx, v);
        nan |= v != v;
        x[j] = v;
      }
      std::fill(x + keep, x + S, neg_inf);
      nan_row[i] = nan != 0;
      const T shift = mx == neg_inf ? T(0) : mx;
#pragma omp simd
      for (int64_t j = 0; j < keep; ++j) x[j] -= shift;
    }
    const int64_t len = rows * S;
#pragma omp simd
    for (int64_t i = 0; i < len; ++i) xb[i] = vexp_nonpositive(xb[i]);
    for (int64_t i = 0; i < rows; ++i) {
      T* x = xb + i * S;
      if (nan_row[i]) {
        std::fill(x, x + S, std::numeric_limits<T>::quiet_NaN());
        continue;
      }
      const T sum = row_sum(x, S);
      const T inv = sum > 0 ? T(1) / sum : T(0);
#pragma omp simd
      for (int64_t j = 0; j < S; ++j) x[j] *= inv;
    }
  }
}

// The forward pass over every row of P (rows of S keys, query i = row % L), in place.
template <class T>
void attention_rows(const Tensor& p, int64_t L, T scale, bool causal, const Tensor& mask) {
  const int64_t S = p.size(-1), count = p.numel() / std::max<int64_t>(S, 1);
  T* pp = p.data<T>();
  const auto run = [&]<MaskKind Kind, class M>(const M* pm, const Rows& mr) {
    parallel_for(
        count,
        [&](int64_t begin, int64_t end) {
          attention_block<Kind>(pp, begin, end, L, S, scale, causal, pm, mr);
        },
        row_grain(S, costly_grain()));
  };
  if (!mask.defined()) {
    run.template operator()<MaskKind::None>(static_cast<const T*>(nullptr), Rows{});
    return;
  }
  // The mask seen as P's shape (stride 0 where it broadcasts), read row by row.
  const Tensor mv =
      make_view(mask, p.shape(), broadcast_strides(mask, p.shape()), mask.storage_offset());
  const Rows mr = rows_along(mv, p.dim() - 1);
  if (mask.dtype() == kBool)
    run.template operator()<MaskKind::Bool>(mv.data<bool>(), mr);
  else
    run.template operator()<MaskKind::Float>(mv.data<T>(), mr);
}

// The backward of the softmax rows, in place in dp: dS = P ⊙ (dP − Σ_j dP ⊙ P) · factor over the
// first keep entries of each row, zeros after (P is zero there).
template <class T>
void attention_rows_backward(const Tensor& p, const Tensor& dp, int64_t L, bool causal, T factor) {
  const int64_t S = p.size(-1), count = p.numel() / std::max<int64_t>(S, 1);
  const T* pp = p.data<T>();
  T* pd = dp.data<T>();
  parallel_for(
      count,
      [&](int64_t begin, int64_t end) {
        for (int64_t r = begin; r < end; ++r) {
          const int64_t keep = causal ? std::min(r % L + 1, S) : S;
          const T* y = pp + r * S;
          T* g = pd + r * S;
          double acc = 0;
#pragma omp simd reduction(+ : acc)
          for (int64_t j = 0; j < keep; ++j) acc += g[j] * y[j];
          const T dot = static_cast<T>(acc);
#pragma omp simd
          for (int64_t j = 0; j < keep; ++j) g[j] = y[j] * (g[j] - dot) * factor;
          std::fill(g + keep, g + S, T(0));
        }
      },
      row_grain(S, costly_grain()));
}

// How dropout was applied to P: not at all, with a mask key, or every element dropped (p = 1).
struct AttentionDropout {
  enum { None, Mask, All } kind = None;
  DropoutMask mask{};
};

// The dropout of attention weights with probability p in [0, 1], as dropout()'s.
AttentionDropout attention_dropout(double p) {
  if (p == 1) return {AttentionDropout::All, {}};  // every weight dropped, as torch; no 1 / 0
  if (p == 0) return {};
  return {AttentionDropout::Mask, dropout_mask(p)};
}

Tensor apply_attention_dropout(const Tensor& t, const AttentionDropout& d, std::string_view op) {
  switch (d.kind) {
    case AttentionDropout::Mask:
      return apply_dropout_mask(t, d.mask, op);
    case AttentionDropout::All:
      return mul(t, 0.0);
    default:
      return t;
  }
}

// True when the Bool tensor t holds a true element.
bool any_true(const Tensor& t) {
  const Tensor c = contiguous_data(t);
  const bool* b = c.data<bool>();
  return std::any_of(b, b + c.numel(), [](bool e) { return e; });
}

// The last two dims swapped, a view (no autograd: used where grad mode is off).
Tensor swap_last(const Tensor& t) { return transpose(t, -2, -1); }

// The dropout of a weights tensor of `shape` as a constant factor: 0 where dropped, the scale
// elsewhere (apply_attention_dropout(t) is t times it); undefined without dropout.
Tensor attention_dropout_factor(const Shape& shape, DType dtype, const AttentionDropout& d,
                                std::string_view op) {
  if (d.kind == AttentionDropout::None) return {};
  NoGradGuard no_grad;
  return apply_attention_dropout(ones(shape, dtype), d, op);
}

// out = dropout(softmax(q kᵀ · scale + mask)) v (Note [Attention kernel]); inputs q, k, v and a
// floating mask (undefined when Bool or absent). Under create_graph P is recomputed in ops from
// q, k and the mask (the kernel's P is data; it tells the rows where no key takes part, zeros):
//   S = q kᵀ · scale + mask, -inf where a key is left out,  P = softmax(S) (0 in those rows)
// and the formulas of Note [Attention kernel] follow in ops.
struct ScaledDotProductAttentionBackward final : Node {
  ScaledDotProductAttentionBackward(const Tensor& q, const Tensor& k, const Tensor& v,
                                    const Tensor& float_mask, Tensor bool_mask, const Tensor& p,
                                    AttentionDropout dropout, double scale, bool causal)
      : bool_mask_(std::move(bool_mask)), dropout_(dropout), scale_(scale), causal_(causal) {
    save(q_, q), save(k_, k), save(v_, v), save(p_, p), save(mask_, float_mask);
  }
  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    if (is_grad_enabled()) return apply_in_ops(grads[0]);  // create_graph
    const Tensor& g = grads[0];
    const Tensor &q = q_.get(), &k = k_.get(), &v = v_.get(), &p = p_.get();
    Tensor grad_q, grad_k, grad_v, grad_mask;
    if (needs_grad(2)) grad_v = matmul(swap_last(apply_attention_dropout(p, dropout_, op())), g);
    if (!needs_grad(0) && !needs_grad(1) && !needs_grad(3)) return {grad_q, grad_k, grad_v, {}};
    Tensor dp = matmul(g, swap_last(v));  // over out's batch dims, which may outgrow P's
    if (dp.shape() != p.shape()) dp = sum_to(dp, p.shape());
    dp = apply_attention_dropout(dp, dropout_, op()).contiguous();  // fresh: written in place
    const bool scaled_in_place = !needs_grad(3);
    dispatch_float(p.dtype(), op(), [&]<class T>() {
      attention_rows_backward<T>(p, dp, q.size(-2), causal_,
                                 static_cast<T>(scaled_in_place ? scale_ : 1.0));
    });
    Tensor ds = dp;
    if (!scaled_in_place) {
      grad_mask = dp;
      ds = mul(dp, scale_);
    }
    if (needs_grad(0)) grad_q = matmul(ds, k);
    if (needs_grad(1)) grad_k = matmul(swap_last(ds), q);
    return {grad_q, grad_k, grad_v, grad_mask};
  }
  std::vector<Tensor> apply_in_ops(const Tensor& g) {
    const Tensor &q = q_.get(), &k = k_.get(), &v = v_.get(), &p_data = p_.get();
    const Shape& shape = p_data.shape();
    const int64_t L = shape.end()[-2], S = shape.end()[-1];
    Tensor s = mul(matmul(q, transpose(k, -2, -1)), scale_);
    if (mask_.defined()) s = add(s, mask_.get());
    if (s.shape() != shape) s = expand(s, shape);
    Tensor left_out;  // Bool: true where a key takes no part
    if (bool_mask_.defined()) left_out = logical_not(bool_mask_);
    if (causal_)  // key j > query i
      left_out = gt(arange(0, static_cast<double>(S), 1, kInt64).view({1, S}),
                    arange(0, static_cast<double>(L), 1, kInt64).view({L, 1}));
    if (left_out.defined()) s = masked_fill(s, left_out, -std::numeric_limits<double>::infinity());
    // Rows where no key takes part (the kernel's P sums to 0 there): S 0, so that softmax gives
    // no NaN, and P 0.
    const Tensor empty_rows = eq(sum(p_data, {-1}, true), 0.0);
    const bool any_empty = any_true(empty_rows);
    if (any_empty) s = masked_fill(s, empty_rows, 0.0);
    Tensor p = softmax(s, -1);
    if (any_empty) p = masked_fill(p, empty_rows, 0.0);
    const Tensor drop = attention_dropout_factor(shape, p.dtype(), dropout_, op());
    const auto dropped = [&](const Tensor& t) { return drop.defined() ? mul(t, drop) : t; };
    Tensor grad_q, grad_k, grad_v, grad_mask;
    if (needs_grad(2)) grad_v = matmul(transpose(dropped(p), -2, -1), g);
    if (!needs_grad(0) && !needs_grad(1) && !needs_grad(3)) return {grad_q, grad_k, grad_v, {}};
    Tensor dp = matmul(g, transpose(v, -2, -1));
    if (dp.shape() != shape) dp = sum_to(dp, shape);
    dp = dropped(dp);
    const Tensor ds = mul(p, sub(dp, sum(mul(dp, p), {-1}, true)));
    if (needs_grad(3)) grad_mask = ds;
    if (needs_grad(0)) grad_q = mul(matmul(ds, k), scale_);
    if (needs_grad(1)) grad_k = mul(matmul(transpose(ds, -2, -1), q), scale_);
    return {grad_q, grad_k, grad_v, grad_mask};
  }
  bool differentiable_backward() const override { return true; }
  Tensor bool_mask_;  // the Bool attn_mask, or undefined
  AttentionDropout dropout_;
  double scale_;
  bool causal_;
  SavedTensor q_, k_, v_, p_, mask_;
};

}  // namespace

namespace {

// scaled_dot_product_attention on a device other than the CPU, in ops (its gradient follows
// through them): S = q kᵀ · scale (+ a float mask), -inf where a Bool or the causal mask drops a
// key, P = softmax(S) with rows where no key takes part (all -inf) made zeros, as the CPU's,
// then dropout(P) v.
Tensor attention_in_ops(const Tensor& query, const Tensor& key, const Tensor& value,
                        const Tensor& mask, double dropout_p, bool is_causal, double scale,
                        std::string_view op) {
  check_same_device(query, key, op);
  check_same_device(query, value, op);
  if (mask.defined()) check_same_device(query, mask, op);
  const int64_t L = query.size(-2), S = key.size(-2);
  Tensor s = mul(matmul(query, swap_last(key)), scale);
  if (mask.defined() && mask.dtype() != kBool) s = add(s, mask);
  Tensor keep;
  if (is_causal) keep = tril(ones({L, S}, kBool, query.device()));
  if (mask.defined() && mask.dtype() == kBool) keep = mask;
  if (keep.defined())
    s = masked_fill(s, logical_not(keep), -std::numeric_limits<double>::infinity());
  Tensor p = softmax(s, -1);
  if (S > 0) {
    const Tensor dead =
        eq(max(s.detach(), -1, true).values, -std::numeric_limits<double>::infinity());
    p = masked_fill(p, dead, 0.0);
  }
  if (dropout_p > 0) p = dropout(p, dropout_p, true);
  return matmul(p, value);
}

}  // namespace

Tensor scaled_dot_product_attention(const Tensor& query, const Tensor& key, const Tensor& value,
                                    const Tensor& attn_mask, double dropout_p, bool is_causal,
                                    std::optional<double> scale) {
  constexpr std::string_view op = "scaled_dot_product_attention";
  profile::Scope scope(op);
  check_attention_dtypes(query, key, value, op);
  EMBER_CHECK(query.dim() >= 2 && key.dim() >= 2 && value.dim() >= 2,
              "{}: query {}, key {} and value {} need at least 2 dims: (..., L, E), (..., S, E), "
              "(..., S, Ev)",
              op, query.shape(), key.shape(), value.shape());
  const int64_t L = query.size(-2), E = query.size(-1), S = key.size(-2);
  EMBER_CHECK(key.size(-1) == E, "{}: query {} and key {} differ in their last dim (E: {} vs {})",
              op, query.shape(), key.shape(), E, key.size(-1));
  EMBER_CHECK(value.size(-2) == S,
              "{}: key {} and value {} differ in their number of keys (dim -2: {} vs {})", op,
              key.shape(), value.shape(), S, value.size(-2));
  EMBER_CHECK(dropout_p >= 0 && dropout_p <= 1, "{}: dropout_p has to be in [0, 1], got {}", op,
              dropout_p);
  EMBER_CHECK(!(is_causal && attn_mask.defined()),
              "{}: attn_mask and is_causal cannot both be set, as in torch (fold the causal mask "
              "into attn_mask)",
              op);
  // The scores' shape: q's and k's batch dims broadcast (the mask's too), then (L, S).
  Shape attn_shape = broadcast_shapes(Shape(query.shape().begin(), query.shape().end() - 2),
                                      Shape(key.shape().begin(), key.shape().end() - 2), op);
  attn_shape.push_back(L);
  attn_shape.push_back(S);
  Tensor mask = attn_mask;
  if (mask.defined()) {
    EMBER_CHECK(mask.dtype() == kBool || is_floating(mask.dtype()),
                "{}: attn_mask must be Bool or floating, got {} of shape {}", op, mask.dtype(),
                mask.shape());
    const Shape shape = broadcast_shapes(attn_shape, mask.shape(), op);
    EMBER_CHECK(shape.end()[-2] == L && shape.end()[-1] == S,
                "{}: attn_mask of shape {} does not broadcast to the scores' (..., L, S) = {}", op,
                mask.shape(), attn_shape);
    attn_shape = shape;
    if (mask.dtype() != kBool) mask = as_type(mask, query.dtype());
  }
  const double sc = scale ? *scale : 1.0 / std::sqrt(static_cast<double>(E));
  if (!query.device().is_cpu())
    return attention_in_ops(query, key, value, mask, dropout_p, is_causal, sc, op);
  const AttentionDropout drop = attention_dropout(dropout_p);
  Tensor p, out;
  {
    NoGradGuard no_grad;                // the kernels below, no graph; this op records its own Node
    p = matmul(query, swap_last(key));  // a fresh contiguous tensor, overwritten by P in place
    if (p.shape() != attn_shape) p = expand(p, attn_shape).contiguous();  // the mask adds dims
    if (p.numel() > 0)
      dispatch_float(p.dtype(), op, [&]<class T>() {
        attention_rows<T>(p, L, static_cast<T>(sc), is_causal, mask);
      });
    out = matmul(apply_attention_dropout(p, drop, op), value);
  }
  const Tensor float_mask = mask.defined() && mask.dtype() != kBool ? mask : Tensor();
  const Tensor bool_mask = mask.defined() && mask.dtype() == kBool ? mask : Tensor();
  return record<ScaledDotProductAttentionBackward>(op, out, {query, key, value, float_mask}, query,
                                                   key, value, float_mask, bool_mask, p, drop, sc,
                                                   is_causal);
}

// --- head_attention

namespace {

// Note [Head attention]
// nn::MultiHeadedAttention's h heads of d_k features each, for batch row b and head hh, with Q, K
// and V the head's d_k columns of q, k and v, read where the projections wrote them (no split
// into (B, h, T, d_k) and no merging copy after):
//   S = Q Kᵀ / sqrt(d_k),  S[i, j] = -1e9 where keep[b, i, j] is false,  P = softmax(S),
//   P_d = dropout(P),  values[b, :, hh·d_k : (hh+1)·d_k] = P_d V,
// the Annotated Transformer's attention() value for value (its masked_fill and division, not
// sdpa's -inf and multiplied scale). Each head's products are a few thousand multiply-adds: as
// the composite's batched matmuls they spent most of their time in per-product set-up, and its
// division, masked_fill, softmax and dropout each made a pass over (B, h, Tq, Tk) of their own.
// Here one pass over the heads runs both products of a head on its thread (detail::loop_gemm)
// and the masked softmax between them while its scores are in L1; with dropout, P_d is one
// vectorised pass over all heads between the two (the mask of dropout(P), Note [Dropout masks]),
// so the pass splits in two. Saved for the backward: q, k, v, P and P_d:
//   dV = P_dᵀ dO,  dP = dropout(dO Vᵀ),  dS = P ⊙ (dP − Σ_j dP ⊙ P) / sqrt(d_k), 0 where masked,
//   dQ = dS K,  dK = dSᵀ Q,
// where the zeros where masked are masked_fill's backward (they matter in a row with no key kept,
// whose P is uniform).

// The geometry of one call: B batch rows, h heads of dk features, Tq queries, Tk keys, rows of
// D = h·dk features.
struct Heads {
  int64_t B, h, dk, Tq, Tk, D;
  int64_t count() const { return B * h; }
  // Q, K, V, the output and their gradients: head n's block of a (B, T, D) tensor.
  template <class T>
  T* block(T* x, int64_t n, int64_t T_len) const {
    return x + (n / h) * T_len * D + (n % h) * dk;
  }
};

// Runs body(begin, end) over the heads [0, count), split across threads when they are several
// and their products add up to parallel_grain() multiply-adds (as batched_gemm's).
template <class F>
void over_heads(const Heads& g, F&& body) {
  if (g.count() > 1 && g.count() * g.Tq * g.Tk * g.dk >= parallel_grain())
    parallel_for(g.count(), body, 2);
  else
    body(int64_t{0}, g.count());
}

// The max (sum) of a short row, in four interleaved partial results: one running result would
// chain every element's compare (add) on the one before.
template <class T, class Op>
T short_row_reduce(const T* x, int64_t n, T init, Op op) {
  T acc[4] = {init, init, init, init};
  int64_t j = 0;
  for (; j + 4 <= n; j += 4)
    for (int u = 0; u < 4; ++u) acc[u] = op(acc[u], x[j + u]);
  for (; j < n; ++j) acc[0] = op(acc[0], x[j]);
  return op(op(acc[0], acc[1]), op(acc[2], acc[3]));
}

// A head's rows of scores (rows x n, contiguous; keep, when given, the same layout) in place:
// divided by div, -1e9 where keep is false, then softmax; a row with a NaN score is all NaN, as
// softmax's. Rows are short (a few to a few dozen keys), so the division and mask, and the
// exponentials, each run over the whole block in one vectorised loop, and only the max and the
// sum row by row.
template <class T>
void masked_softmax_rows(T* x, const bool* keep, int64_t rows, int64_t n, T div) {
  constexpr T kFill = T(-1e9);
  const int64_t len = rows * n;
  int nan = 0;
  if (keep == nullptr) {
#pragma omp simd reduction(| : nan)
    for (int64_t e = 0; e < len; ++e) {
      x[e] /= div;
      nan |= x[e] != x[e];
    }
  } else {
    // keep's bytes read as bytes and every score divided: GCC 12 vectorises no loop that
    // branches on a bool load.
    const auto* kept = reinterpret_cast<const unsigned char*>(keep);
#pragma omp simd reduction(| : nan)
    for (int64_t e = 0; e < len; ++e) {
      const T v = x[e] / div;
      x[e] = kept[e] != 0 ? v : kFill;
      nan |= v != v;
    }
  }
  std::vector<char> nan_rows;  // rare: the rows that hold a NaN score, made NaN at the end
  if (nan != 0) {
    nan_rows.resize(static_cast<size_t>(rows));
    for (int64_t i = 0; i < rows; ++i)
      nan_rows[i] = std::any_of(x + i * n, x + (i + 1) * n, [](T v) { return v != v; });
  }
  const auto max = [](T a, T b) { return b > a ? b : a; };  // never NaN
  for (int64_t i = 0; i < rows; ++i) {
    T* xi = x + i * n;
    const T mx = short_row_reduce(xi, n, -std::numeric_limits<T>::infinity(), max);
    for (int64_t j = 0; j < n; ++j) xi[j] -= mx;
  }
#pragma omp simd
  for (int64_t e = 0; e < len; ++e) x[e] = vexp_nonpositive(x[e]);
  for (int64_t i = 0; i < rows; ++i) {
    T* xi = x + i * n;
    const T inv = T(1) / short_row_reduce(xi, n, T(0), std::plus<T>());
    for (int64_t j = 0; j < n; ++j) xi[j] *= inv;
  }
  for (size_t i = 0; i < nan_rows.size(); ++i)
    if (nan_rows[i]) std::fill(x + i * n, x + (i + 1) * n, std::numeric_limits<T>::quiet_NaN());
}

// The forward of heads [begin, end): P (B, h, Tq, Tk) from q and k.
template <class T>
void head_weights(const Heads& g, const T* q, const T* k, const bool* keep, T* p, int64_t begin,
                  int64_t end) {
  const T div = static_cast<T>(std::sqrt(static_cast<double>(g.dk)));
  for (int64_t n = begin; n < end; ++n) {
    T* ph = p + n * g.Tq * g.Tk;
    detail::loop_gemm<T>(g.Tq, g.Tk, g.dk, T(1), {g.block(q, n, g.Tq), g.D, 1},
                         {g.block(k, n, g.Tk), 1, g.D}, T(0), {ph, g.Tk, 1});
    masked_softmax_rows(ph, keep == nullptr ? keep : keep + (n / g.h) * g.Tq * g.Tk, g.Tq, g.Tk,
                        div);
  }
}

// values = P_d V for heads [begin, end).
template <class T>
void head_values(const Heads& g, const T* pd, const T* v, T* out, int64_t begin, int64_t end) {
  for (int64_t n = begin; n < end; ++n)
    detail::loop_gemm<T>(g.Tq, g.dk, g.Tk, T(1), {pd + n * g.Tq * g.Tk, g.Tk, 1},
                         {g.block(v, n, g.Tk), g.D, 1}, T(0), {g.block(out, n, g.Tq), g.D, 1});
}

// dV = P_dᵀ dO (when dv is given) and dP_d = dO Vᵀ into dp, for heads [begin, end).
template <class T>
void head_backward_values(const Heads& g, const T* pd, const T* v, const T* dout, T* dv, T* dp,
                          int64_t begin, int64_t end) {
  for (int64_t n = begin; n < end; ++n) {
    const T* pdh = pd + n * g.Tq * g.Tk;
    const T* doh = g.block(dout, n, g.Tq);
    if (dv != nullptr)
      detail::loop_gemm<T>(g.Tk, g.dk, g.Tq, T(1), {pdh, 1, g.Tk}, {doh, g.D, 1}, T(0),
                           {g.block(dv, n, g.Tk), g.D, 1});
    detail::loop_gemm<T>(g.Tq, g.Tk, g.dk, T(1), {doh, g.D, 1}, {g.block(v, n, g.Tk), 1, g.D}, T(0),
                         {dp + n * g.Tq * g.Tk, g.Tk, 1});
  }
}

// dS from dP (the softmax's, masked_fill's and the division's backward; ds may be dp), then
// dQ = dS K and dK = dSᵀ Q (each when given), for heads [begin, end).
template <class T>
void head_backward_scores(const Heads& g, const T* p, const bool* keep, const T* q, const T* k,
                          const T* dp, T* ds, T* dq, T* dk, int64_t begin, int64_t end) {
  const T div = static_cast<T>(std::sqrt(static_cast<double>(g.dk)));
  for (int64_t n = begin; n < end; ++n) {
    T* dsh = ds + n * g.Tq * g.Tk;
    const T* ph = p + n * g.Tq * g.Tk;
    const bool* kb = keep == nullptr ? nullptr : keep + (n / g.h) * g.Tq * g.Tk;
    for (int64_t i = 0; i < g.Tq; ++i) {
      const T* x = dp + (n * g.Tq + i) * g.Tk;
      T* d = dsh + i * g.Tk;
      const T* y = ph + i * g.Tk;
      T part[4] = {};  // four interleaved partial sums, as short_row_reduce
      int64_t j = 0;
      for (; j + 4 <= g.Tk; j += 4)
        for (int u = 0; u < 4; ++u) part[u] += x[j + u] * y[j + u];
      for (; j < g.Tk; ++j) part[0] += x[j] * y[j];
      const T dot = (part[0] + part[1]) + (part[2] + part[3]);
      for (j = 0; j < g.Tk; ++j) d[j] = y[j] * (x[j] - dot) / div;
      if (kb != nullptr) {
        const auto* m = reinterpret_cast<const unsigned char*>(kb + i * g.Tk);
        for (j = 0; j < g.Tk; ++j) d[j] = m[j] != 0 ? d[j] : T(0);
      }
    }
    if (dq != nullptr)
      detail::loop_gemm<T>(g.Tq, g.dk, g.Tk, T(1), {dsh, g.Tk, 1}, {g.block(k, n, g.Tk), g.D, 1},
                           T(0), {g.block(dq, n, g.Tq), g.D, 1});
    if (dk != nullptr)
      detail::loop_gemm<T>(g.Tk, g.dk, g.Tq, T(1), {dsh, 1, g.Tk}, {g.block(q, n, g.Tq), g.D, 1},
                           T(0), {g.block(dk, n, g.Tk), g.D, 1});
  }
}

// The pointers of head_attention_backward's derivative (HeadAttentionGradBackward): inputs q, k,
// v, dO (B, T, D), P (B, h, Tq, Tk), the keep mask (B, Tq, Tk) and the dropout factor (as P) or
// null; dP (after dropout) and dS (as P) as the first-order kernel left them; cotangents cQ, cK,
// cV or null; results gQ, gK, gV, gdO (each written in full) or null.
template <class T>
struct HeadGradGrad {
  const T *q, *k, *v, *dout, *p, *drop, *dp, *ds, *cq, *ck, *cv;
  const bool* keep;
  T *gq, *gk, *gv, *gdo;
};

// A head's products, for the short rows of attention (Tq, Tk of tens, d_k of a few vectors), two
// of them summed into one result that is written once (no zeros first, no result reloaded), in
// lanes along a contiguous row with the sums in registers (no packing, no dispatch). A pair whose
// A is null is left out; with none, the result is zeros. A's and B's rows are ld apart:
//   head_abt: C (m, n) = A1 B1ᵀ + A2 B2ᵀ, A's (m, kd), B's (n, kd), C contiguous; each B first
//     transposed into bt (kd rows of n rounded up to whole vectors, zero-padded; kept by the
//     caller across the calls of one n and kd);
//   head_ab:  C (m, kd) = A1 B1 + A2 B2, A's (m, n) contiguous, B's (n, kd), C's rows ld apart;
//   head_atb: C (n, kd) = A1ᵀ B1 + A2ᵀ B2, A's (m, n) contiguous, B's (m, kd), likewise.
template <class T>
struct HeadPairs {
  const T* a[2];
  const T* b[2];
  int64_t count;  // the pairs whose A is given, first
  HeadPairs(const T* a1, const T* b1, const T* a2 = nullptr, const T* b2 = nullptr)
      : a{a1, a2}, b{b1, b2}, count(0) {
    if (a1 == nullptr) a[0] = a2, b[0] = b2, a[1] = nullptr;
    count = (a[0] != nullptr) + (a[1] != nullptr);
  }
};

// The first `bytes` (fewer than 2 Chunk) of src into dst, in copies of constant sizes: a loop of
// a variable count is made a call of memmove.
template <size_t Chunk>
EMBER_VEC_INLINE void copy_prefix(char* dst, const char* src, size_t bytes) {
  if constexpr (Chunk > 0) {
    if (bytes & Chunk) std::memcpy(dst, src, Chunk), dst += Chunk, src += Chunk;
    copy_prefix<Chunk / 2>(dst, src, bytes);
  }
}

template <class T>
void head_abt(int64_t m, int64_t n, int64_t kd, const HeadPairs<T>& x, int64_t ld, T* c,
              std::vector<T>& bt) {
  using L = Lanes<T>;
  using V = typename L::V;
  constexpr int64_t W = L::kWidth, R = 4;  // R rows at a time: R independent sums
  if (x.count == 0) return std::fill(c, c + m * n, T(0));
  const int64_t np = (n + W - 1) / W * W, block = kd * np;
  // the padding columns stay zero from the first call (every call of a pass has the same n, kd)
  if (bt.size() < static_cast<size_t>(2 * block)) bt.assign(static_cast<size_t>(2 * block), T(0));
  for (int64_t p = 0; p < x.count; ++p)
    for (int64_t j = 0; j < n; ++j)
      for (int64_t l = 0; l < kd; ++l) bt[p * block + l * np + j] = x.b[p][j * ld + l];
  for (int64_t i0 = 0; i0 < m; i0 += R) {
    const int64_t rows = std::min(R, m - i0);
    const T* ar[2][R];
    for (int64_t p = 0; p < x.count; ++p)
      for (int64_t r = 0; r < R; ++r)
        ar[p][r] = x.a[p] + (i0 + std::min(r, rows - 1)) * ld;  // past m: reread
    for (int64_t j0 = 0; j0 < n; j0 += W) {
      V acc[R] = {};
      for (int64_t p = 0; p < x.count; ++p)
        for (int64_t l = 0; l < kd; ++l) {
          const V bl = L::load(bt.data() + p * block + l * np + j0);
          for (int64_t r = 0; r < R; ++r) acc[r] += ar[p][r][l] * bl;
        }
      const size_t bytes = std::min(W, n - j0) * sizeof(T);
      for (int64_t r = 0; r < rows; ++r)
        copy_prefix<sizeof(V)>(reinterpret_cast<char*>(c + (i0 + r) * n + j0),
                               reinterpret_cast<const char*>(&acc[r]), bytes);
    }
  }
}
// C (rows, kd) = Σ_p Σ_j A_p(row, j) B_p,j: rows of the B's (ldb apart) weighted by the A's
// entries (a_at(p, row, j)), R rows of C at a time (R independent sums, each B vector loaded once
// for them).
template <class T, class A>
void head_weighted_rows(int64_t rows, int64_t n, int64_t kd, const HeadPairs<T>& x, A a_at,
                        int64_t ldb, T* c, int64_t ldc) {
  using L = Lanes<T>;
  using V = typename L::V;
  constexpr int64_t W = L::kWidth, R = 4;
  for (int64_t i0 = 0; i0 < rows; i0 += R) {
    const int64_t live = std::min(R, rows - i0);
    int64_t row[R];
    for (int64_t r = 0; r < R; ++r) row[r] = i0 + std::min(r, live - 1);  // past rows: reread
    int64_t l = 0;
    for (; l + W <= kd; l += W) {
      V acc[R] = {};
      for (int64_t p = 0; p < x.count; ++p)
        for (int64_t j = 0; j < n; ++j) {
          const V bj = L::load(x.b[p] + j * ldb + l);
          for (int64_t r = 0; r < R; ++r) acc[r] += a_at(x.a[p], row[r], j) * bj;
        }
      for (int64_t r = 0; r < live; ++r) std::memcpy(c + (i0 + r) * ldc + l, &acc[r], sizeof(V));
    }
    for (; l < kd; ++l)
      for (int64_t r = 0; r < live; ++r) {
        T acc = 0;
        for (int64_t p = 0; p < x.count; ++p)
          for (int64_t j = 0; j < n; ++j) acc += a_at(x.a[p], i0 + r, j) * x.b[p][j * ldb + l];
        c[(i0 + r) * ldc + l] = acc;
      }
  }
}
template <class T>
void head_ab(int64_t m, int64_t n, int64_t kd, const HeadPairs<T>& x, int64_t ld, T* c) {
  head_weighted_rows<T>(
      m, n, kd, x, [n](const T* a, int64_t i, int64_t j) { return a[i * n + j]; }, ld, c, ld);
}
template <class T>
void head_atb(int64_t m, int64_t n, int64_t kd, const HeadPairs<T>& x, int64_t ld, T* c) {
  head_weighted_rows<T>(
      n, m, kd, x, [n](const T* a, int64_t j, int64_t i) { return a[i * n + j]; }, ld, c, ld);
}

// HeadAttentionGradBackward's formulas for heads [begin, end): each head's products on its blocks
// (head_abt, head_ab, head_atb), every result block written once; its (Tq, Tk) intermediates in
// a scratch of tables, with the mask and 1/√d_k as one table of factors per batch row.
template <class T>
void head_grad_grad(const Heads& g, const HeadGradGrad<T>& a, int64_t begin, int64_t end) {
  const int64_t tt = g.Tq * g.Tk, D = g.D, Tq = g.Tq, Tk = g.Tk, dk = g.dk;
  const T inv_div = T(1) / static_cast<T>(std::sqrt(static_cast<double>(dk)));
  std::vector<T> scratch(6 * tt + 3 * Tq), bt;  // bt: head_abt's transposed B's
  T *scale = scratch.data(), *u = scale + tt, *cp = u + tt, *cdpd = cp + tt, *cs = cdpd + tt;
  T *pdv = cs + tt, *r = pdv + tt, *ru = r + Tq, *rc = ru + Tq;
  // scale: 1/√d_k where a key is kept, 0 where it is left out
  if (a.keep == nullptr) std::fill(scale, scale + tt, inv_div);
  int64_t scale_row = -1;
  const auto scaled = [&](T* x) {
#pragma omp simd
    for (int64_t e = 0; e < tt; ++e) x[e] = scale[e] != T(0) ? x[e] * scale[e] : T(0);
  };
  const auto row_dots = [&](const T* x, const T* y, T* out) {  // Σ_j x_ij y_ij for each row i
    for (int64_t i = 0; i < Tq; ++i) {
      const T *xi = x + i * Tk, *yi = y + i * Tk;
      T part[4] = {};  // four interleaved partial sums, as short_row_reduce
      int64_t j = 0;
      for (; j + 4 <= Tk; j += 4)
        for (int w = 0; w < 4; ++w) part[w] += xi[j + w] * yi[j + w];
      for (; j < Tk; ++j) part[0] += xi[j] * yi[j];
      out[i] = (part[0] + part[1]) + (part[2] + part[3]);
    }
  };
  const bool scores = a.cq != nullptr || a.ck != nullptr;  // a cotangent on dQ or dK: c_dS
  for (int64_t n = begin; n < end; ++n) {
    if (a.keep != nullptr && n / g.h != scale_row) {
      scale_row = n / g.h;
      const auto* kept = reinterpret_cast<const unsigned char*>(a.keep + scale_row * tt);
#pragma omp simd
      for (int64_t e = 0; e < tt; ++e) scale[e] = kept[e] != 0 ? inv_div : T(0);
    }
    const T *ph = a.p + n * tt, *dh = a.drop ? a.drop + n * tt : nullptr;
    const T *dpv = a.dp + n * tt, *dsv = a.ds + n * tt;
    const T *qh = g.block(a.q, n, Tq), *kh = g.block(a.k, n, Tk), *vh = g.block(a.v, n, Tk);
    const T* doh = g.block(a.dout, n, Tq);
    const T* cqh = a.cq ? g.block(a.cq, n, Tq) : nullptr;
    const T* ckh = a.ck ? g.block(a.ck, n, Tk) : nullptr;
    const T* cvh = a.cv ? g.block(a.cv, n, Tk) : nullptr;
    // the first-order kernel's dP = (dO Vᵀ) D and dS = P (dP - r) / √d_k; r = rowsum(dP P)
    if (scores) {
      // u = c_dS / √d_k (0 where masked), c_dS = cQ Kᵀ + Q cKᵀ; ru = rowsum(u P);
      // c_P = u (dP - r) - ru dP, c_dPd = P (u - ru) D
      head_abt<T>(Tq, Tk, dk, {cqh, kh, ckh ? qh : nullptr, ckh}, D, u, bt);
      scaled(u);
      row_dots(dpv, ph, r);
      row_dots(u, ph, ru);
      for (int64_t i = 0; i < Tq; ++i) {
        const T ri = r[i], rui = ru[i];
#pragma omp simd
        for (int64_t e = i * Tk; e < (i + 1) * Tk; ++e) {
          cp[e] = u[e] * (dpv[e] - ri) - rui * dpv[e];
          cdpd[e] = ph[e] * (u[e] - rui);
        }
      }
      if (dh != nullptr)
#pragma omp simd
        for (int64_t e = 0; e < tt; ++e) cdpd[e] *= dh[e];
    }
    const T* pd = ph;  // P_d = P D
    if (cvh != nullptr) {
      // c_P += (dO cVᵀ) D
      head_abt<T>(Tq, Tk, dk, {doh, cvh}, D, cs, bt);
      if (dh != nullptr) {
#pragma omp simd
        for (int64_t e = 0; e < tt; ++e) pdv[e] = ph[e] * dh[e], cs[e] *= dh[e];
        pd = pdv;
      }
      if (scores)
#pragma omp simd
        for (int64_t e = 0; e < tt; ++e) cp[e] += cs[e];
      else
        std::copy(cs, cs + tt, cp);
    }
    const bool c_s = (scores || cvh != nullptr) && (a.gq || a.gk);
    if (c_s) {
      // c_S = P (c_P - rowsum(c_P P)) / √d_k (0 where masked)
      row_dots(cp, ph, rc);
      for (int64_t i = 0; i < Tq; ++i) {
        const T rci = rc[i];
#pragma omp simd
        for (int64_t e = i * Tk; e < (i + 1) * Tk; ++e) cs[e] = ph[e] * (cp[e] - rci);
      }
      scaled(cs);
    }
    // gQ = dS cK + c_S K, gK = dSᵀ cQ + c_Sᵀ Q, gdO = c_dPd V + P_d cV, gV = c_dPdᵀ dO
    if (a.gq)
      head_ab<T>(Tq, Tk, dk, {ckh ? dsv : nullptr, ckh, c_s ? cs : nullptr, kh}, D,
                 g.block(a.gq, n, Tq));
    if (a.gk)
      head_atb<T>(Tq, Tk, dk, {cqh ? dsv : nullptr, cqh, c_s ? cs : nullptr, qh}, D,
                  g.block(a.gk, n, Tk));
    if (a.gdo)
      head_ab<T>(Tq, Tk, dk, {scores ? cdpd : nullptr, vh, cvh ? pd : nullptr, cvh}, D,
                 g.block(a.gdo, n, Tq));
    if (a.gv) head_atb<T>(Tq, Tk, dk, {scores ? cdpd : nullptr, doh}, D, g.block(a.gv, n, Tk));
  }
}
// head_attention_backward's Node (Note [Head attention]): inputs q, k, v and dO, outputs dQ, dK,
// dV, all (B, T, D); cotangents cQ, cK, cV. Per head, with S = Q Kᵀ / √d_k (masked), P =
// softmax(S), D the dropout factor (mask · scale, or 1), P_d = P D, dP = (dO Vᵀ) D,
// r = rowsum(dP P), dS = P (dP - r) / √d_k (0 where masked), dQ = dS K, dK = dSᵀ Q, dV = P_dᵀ dO:
//   c_dS = cQ Kᵀ + Q cKᵀ (0 where masked),  u = c_dS / √d_k,  ru = rowsum(u P)
//   gQ  = dS cK + c_S K,   gK = dSᵀ cQ + c_Sᵀ Q
//   c_dP = P (u - ru),  gdO = (c_dP D) V + P_d cV,  gV = (c_dP D)ᵀ dO
//   c_P = u (dP - r) - ru dP + (dO cVᵀ) D,  c_S = P (c_P - rowsum(c_P P)) / √d_k (0 where masked)
// On the CPU, head_grad_grad per head, from the P, dP, dS and dropout factor the first-order
// kernels used (saved as data by HeadAttentionBackward); under create_graph (or on a device) the
// same in batched products over the (B, h, T, d_k) views, P and dP recomputed in ops from q, k,
// v and dO so that they can be differentiated once more.
struct HeadAttentionGradBackward final : Node {
  HeadAttentionGradBackward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& dout,
                            const Tensor& p, const Tensor& dp, const Tensor& ds, Tensor drop,
                            Tensor keep, AttentionDropout dropout, Heads heads)
      : drop_(std::move(drop)), keep_(std::move(keep)), dropout_(dropout), heads_(heads) {
    save(q_, q), save(k_, k), save(v_, v), save(dout_, dout), save(p_, p), save(dp_, dp);
    save(ds_, ds);
  }
  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    if (!is_grad_enabled() && q_.get().device().is_cpu()) return by_kernels(grads);
    return apply_in_ops(grads);
  }
  // head_grad_grad over the heads, which writes every block of the results.
  std::vector<Tensor> by_kernels(const std::vector<Tensor>& grads) {
    const Heads& g = heads_;
    const Tensor &q = q_.get(), &k = k_.get(), &v = v_.get(), &p = p_.get();
    const Tensor dout = contiguous_data(dout_.get());
    const Tensor& drop = drop_;
    std::vector<Tensor> c(3), out(4);
    for (size_t i = 0; i < 3; ++i) c[i] = contiguous_data(grads[i]);
    for (size_t i = 0; i < 4; ++i)
      if (needs_grad(i)) out[i] = empty(input_shapes[i], q.dtype(), q.device());
    dispatch_float(q.dtype(), op(), [&]<class T>() {
      const auto ptr = [](const Tensor& t) { return t.defined() ? t.data<T>() : nullptr; };
      const HeadGradGrad<T> a{
          q.data<T>(), k.data<T>(), v.data<T>(),    dout.data<T>(),
          p.data<T>(), ptr(drop),   ptr(dp_.get()), ptr(ds_.get()),
          ptr(c[0]),   ptr(c[1]),   ptr(c[2]),      keep_.defined() ? keep_.data<bool>() : nullptr,
          ptr(out[0]), ptr(out[1]), ptr(out[2]),    ptr(out[3])};
      over_heads(g, [&](int64_t begin, int64_t end) { head_grad_grad<T>(g, a, begin, end); });
    });
    return out;
  }
  std::vector<Tensor> apply_in_ops(const std::vector<Tensor>& grads) {
    const Heads& g = heads_;
    const auto split = [&](const Tensor& t) {  // (B, T, D) -> (B, h, T, d_k)
      return transpose(reshape(t, {g.B, t.size(1), g.h, g.dk}), 1, 2);
    };
    const auto merge = [&](const Tensor& t) {  // (B, h, T, d_k) -> (B, T, D)
      return t.defined() ? reshape(transpose(t, 1, 2), {g.B, t.size(2), g.D}) : t;
    };
    const auto mT = [](const Tensor& t) { return transpose(t, -2, -1); };
    const auto plus = [](Tensor& acc, const Tensor& t) { acc = acc.defined() ? add(acc, t) : t; };
    const Tensor q = split(q_.get()), k = split(k_.get()), v = split(v_.get());
    const Tensor d_o = split(dout_.get());
    const double div_by = std::sqrt(static_cast<double>(g.dk));
    const Tensor left_out = keep_.defined() ? unsqueeze(logical_not(keep_), 1) : Tensor();
    const auto masked = [&](const Tensor& t) {
      return left_out.defined() ? masked_fill(t, left_out, 0.0) : t;
    };
    Tensor s = div(matmul(q, mT(k)), div_by);  // P as a function of q and k
    if (left_out.defined()) s = masked_fill(s, left_out, -1e9);
    const Tensor p = softmax(s, -1);
    const Tensor& drop = drop_;
    const auto dropped = [&](const Tensor& t) { return drop.defined() ? mul(t, drop) : t; };
    const Tensor dp = dropped(matmul(d_o, mT(v)));
    const Tensor r = sum(mul(dp, p), {-1}, true);
    Tensor gq, gk, gv, gdo, c_ds, c_p;
    if (grads[0].defined() || grads[1].defined()) {
      const Tensor ds = masked(div(mul(p, sub(dp, r)), div_by));
      if (grads[0].defined()) {
        const Tensor cq = split(grads[0]);
        plus(c_ds, matmul(cq, mT(k)));
        if (needs_grad(1)) plus(gk, matmul(mT(ds), cq));
      }
      if (grads[1].defined()) {
        const Tensor ck = split(grads[1]);
        plus(c_ds, matmul(q, mT(ck)));
        if (needs_grad(0)) plus(gq, matmul(ds, ck));
      }
      const Tensor u = div(masked(c_ds), div_by);
      const Tensor ru = sum(mul(u, p), {-1}, true);
      c_p = sub(mul(u, sub(dp, r)), mul(ru, dp));
      const Tensor c_dpd = dropped(mul(p, sub(u, ru)));
      if (needs_grad(3)) plus(gdo, matmul(c_dpd, v));
      if (needs_grad(2)) plus(gv, matmul(mT(c_dpd), d_o));
    }
    if (grads[2].defined()) {
      const Tensor cv = split(grads[2]);
      if (needs_grad(3)) plus(gdo, matmul(dropped(p), cv));
      plus(c_p, dropped(matmul(d_o, mT(cv))));
    }
    if (c_p.defined() && (needs_grad(0) || needs_grad(1))) {
      const Tensor c_s = div(masked(mul(p, sub(c_p, sum(mul(c_p, p), {-1}, true)))), div_by);
      if (needs_grad(0)) plus(gq, matmul(c_s, k));
      if (needs_grad(1)) plus(gk, matmul(mT(c_s), q));
    }
    return {merge(gq), merge(gk), merge(gv), merge(gdo)};
  }
  bool differentiable_backward() const override { return true; }
  Tensor drop_;  // the dropout factor (mask · scale, as P), or undefined
  Tensor keep_;  // Bool (B, Tq, Tk), contiguous, or undefined
  AttentionDropout dropout_;
  Heads heads_;
  SavedTensor q_, k_, v_, dout_, p_;
  SavedTensor dp_, ds_;  // the first-order kernel's dP and dS (data), or undefined
};

// Note [Head attention]; inputs q, k, v. Under create_graph the same kernels, recorded as the op
// head_attention_backward of (q, k, v, dO), whose derivative is HeadAttentionGradBackward.
struct HeadAttentionBackward final : Node {
  HeadAttentionBackward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& p,
                        const Tensor& pd, Tensor keep, AttentionDropout dropout, Heads heads)
      : keep_(std::move(keep)), dropout_(dropout), heads_(heads) {
    save(q_, q), save(k_, k), save(v_, v), save(p_, p), save(pd_, pd);
  }
  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    if (!is_grad_enabled()) return by_kernels(grads[0]);
    // create_graph: the kernels' values, recorded as head_attention_backward of (q, k, v, dO);
    // its derivative reads the dropout factor, dP and dS the kernels used (no second mask, no
    // second dO Vᵀ)
    std::vector<Tensor> out;
    Tensor drop, dp, ds;
    {
      NoGradGuard no_grad;
      drop = attention_dropout_factor(p_.get().shape(), p_.get().dtype(), dropout_, op());
      out = by_kernels(grads[0], drop, &dp, &ds);
    }
    const Tensor q = q_.get(), k = k_.get(), v = v_.get();
    record<HeadAttentionGradBackward>("head_attention_backward", {&out[0], &out[1], &out[2]},
                                      {q, k, v, grads[0]}, q, k, v, grads[0], p_.get(), dp, ds,
                                      drop, keep_, dropout_, heads_);
    return out;
  }
  // dQ, dK, dV by the kernels; with `drop` (the dropout factor) dP is multiplied by it instead of
  // the mask being regenerated; dP (after dropout) and dS into *dp_out and *ds_out when given.
  std::vector<Tensor> by_kernels(const Tensor& grad, const Tensor& drop = {},
                                 Tensor* dp_out = nullptr, Tensor* ds_out = nullptr) {
    const Tensor dout = grad.contiguous();
    const Tensor &q = q_.get(), &k = k_.get(), &v = v_.get(), &p = p_.get(), &pd = pd_.get();
    const Heads& g = heads_;
    Tensor dq = needs_grad(0) ? empty(q.shape(), q.dtype(), q.device()) : Tensor();
    Tensor dk = needs_grad(1) ? empty(k.shape(), k.dtype(), k.device()) : Tensor();
    Tensor dv = needs_grad(2) ? empty(v.shape(), v.dtype(), v.device()) : Tensor();
    Tensor dp = empty(p.shape(), p.dtype(), p.device());
    Tensor ds = dp;  // dS over dP, unless dP is kept
    const bool* keep = keep_.defined() ? keep_.data<bool>() : nullptr;
    dispatch_float(q.dtype(), op(), [&]<class T>() {
      const auto ptr = [](const Tensor& t) { return t.defined() ? t.data<T>() : nullptr; };
      const auto values = [&](int64_t begin, int64_t end) {
        head_backward_values<T>(g, pd.data<T>(), v.data<T>(), dout.data<T>(), ptr(dv), ptr(dp),
                                begin, end);
      };
      const auto scores = [&](int64_t begin, int64_t end) {
        head_backward_scores<T>(g, p.data<T>(), keep, q.data<T>(), k.data<T>(), dp.data<T>(),
                                ds.data<T>(), ptr(dq), ptr(dk), begin, end);
      };
      if (dropout_.kind == AttentionDropout::None && dp_out == nullptr) {
        over_heads(g, [&](int64_t begin, int64_t end) { values(begin, end), scores(begin, end); });
        return;
      }
      over_heads(g, values);
      if (drop.defined())
        dp.mul_(drop);
      else if (dropout_.kind != AttentionDropout::None)
        dp = apply_attention_dropout(dp, dropout_, op());
      ds = dp;
      if (dp_out != nullptr) *dp_out = dp, ds = empty(p.shape(), p.dtype(), p.device());
      over_heads(g, scores);
    });
    if (ds_out != nullptr) *ds_out = ds;
    return {dq, dk, dv};
  }
  bool differentiable_backward() const override { return true; }
  Tensor keep_;  // Bool (B, Tq, Tk), contiguous, or undefined
  AttentionDropout dropout_;
  Heads heads_;
  SavedTensor q_, k_, v_, p_, pd_;
};

}  // namespace

namespace {

// head_attention on a device other than the CPU, in ops (its gradient follows through them):
// the heads as (B, h, T, d_k) views, S = Q Kᵀ / sqrt(d_k), -1e9 where keep is false, P =
// softmax(S), P_d = dropout(P) (the CPU's mask for the same key), values = P_d V merged back.
HeadAttention head_attention_in_ops(const Tensor& query, const Tensor& key, const Tensor& value,
                                    const Heads& g, const Tensor& keep, double dropout_p,
                                    std::string_view op) {
  check_same_device(query, key, op);
  check_same_device(query, value, op);
  if (keep.defined()) check_same_device(query, keep, op);
  const auto split = [&](const Tensor& t, int64_t T) {
    return transpose(reshape(t, {g.B, T, g.h, g.dk}), 1, 2);
  };
  Tensor s = div(matmul(split(query, g.Tq), transpose(split(key, g.Tk), -2, -1)),
                 std::sqrt(static_cast<double>(g.dk)));
  if (keep.defined()) {
    Tensor dropped = eq(keep, 0.0);  // (B, Tq, Tk) or a broadcast of it, then a dim for the heads
    while (dropped.dim() < 3) dropped = unsqueeze(dropped, 0);
    s = masked_fill(s, unsqueeze(dropped, 1), -1e9);
  }
  Tensor p = softmax(s, -1);
  if (dropout_p > 0) p = dropout(p, dropout_p, true);
  const Tensor values = reshape(transpose(matmul(p, split(value, g.Tk)), 1, 2), {g.B, g.Tq, g.D});
  return {values, p.detach()};
}

}  // namespace

HeadAttention head_attention(const Tensor& query, const Tensor& key, const Tensor& value,
                             int64_t heads, const Tensor& keep, double dropout_p) {
  constexpr std::string_view op = "head_attention";
  profile::Scope scope(op);
  check_attention_dtypes(query, key, value, op);
  EMBER_CHECK(query.dim() == 3 && key.dim() == 3 && value.dim() == 3 &&
                  key.size(0) == query.size(0) && value.size(0) == query.size(0) &&
                  key.size(2) == query.size(2) && value.size(2) == query.size(2) &&
                  value.size(1) == key.size(1),
              "{}: q {}, k {} and v {} must be (B, Tq, D), (B, Tk, D) and (B, Tk, D)", op,
              query.shape(), key.shape(), value.shape());
  const int64_t D = query.size(2);
  EMBER_CHECK(heads > 0 && D % heads == 0,
              "{}: {} features (q {}) do not split into {} heads; heads must divide them", op, D,
              query.shape(), heads);
  EMBER_CHECK(dropout_p >= 0 && dropout_p <= 1, "{}: dropout_p has to be in [0, 1], got {}", op,
              dropout_p);
  const Heads g{query.size(0), heads, D / heads, query.size(1), key.size(1), D};
  if (!query.device().is_cpu())
    return head_attention_in_ops(query, key, value, g, keep, dropout_p, op);
  Tensor kept;  // Bool (B, Tq, Tk), contiguous
  if (keep.defined()) {
    const Shape shape{g.B, g.Tq, g.Tk};
    bool fits = keep.dim() <= 3;
    for (int64_t d = 1; fits && d <= keep.dim(); ++d)
      fits = keep.size(-d) == 1 || keep.size(-d) == shape.end()[-d];
    EMBER_CHECK(fits, "{}: keep of shape {} does not broadcast to (B, Tq, Tk) = {}", op,
                keep.shape(), shape);
    NoGradGuard no_grad;
    kept = expand(ne(keep, 0.0), shape).contiguous();
  }
  const Tensor q = query.contiguous(), k = key.contiguous(), v = value.contiguous();
  const AttentionDropout drop = attention_dropout(dropout_p);
  Tensor p = empty({g.B, g.h, g.Tq, g.Tk}, q.dtype(), q.device()), pd = p;
  Tensor out = empty(q.shape(), q.dtype(), q.device());
  const bool* kp = kept.defined() ? kept.data<bool>() : nullptr;
  dispatch_float(q.dtype(), op, [&]<class T>() {
    const auto weights = [&](int64_t begin, int64_t end) {
      head_weights<T>(g, q.data<T>(), k.data<T>(), kp, p.data<T>(), begin, end);
    };
    const auto values = [&](int64_t begin, int64_t end) {
      head_values<T>(g, pd.data<T>(), v.data<T>(), out.data<T>(), begin, end);
    };
    if (drop.kind == AttentionDropout::None) {
      over_heads(g, [&](int64_t begin, int64_t end) { weights(begin, end), values(begin, end); });
      return;
    }
    over_heads(g, weights);
    pd = apply_attention_dropout(p, drop, op);
    over_heads(g, values);
  });
  out = record<HeadAttentionBackward>(op, out, {query, key, value}, q, k, v, p, pd, kept, drop, g);
  return {out, pd};
}

}  // namespace ember
