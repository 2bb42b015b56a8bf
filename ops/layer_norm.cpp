// layer_norm over the trailing dims: a fused kernel (mean and variance in one pass, llm.c style)
// and a hand-derived backward kernel. Under create_graph the backward kernel runs recorded as the
// op layer_norm_backward, whose own derivative is a kernel on the CPU and ops elsewhere, so that
// it can be differentiated again (Note [Double backward]); on a device, the row kernels of
// cuda/rows.h.
#include <algorithm>
#include <cmath>
#include <vector>

#include "graph/autograd.h"
#include "graph/creation.h"
#include "graph/device_backend.h"
#include "graph/profile.h"
#include "graph/strided.h"
#include "ops/common.h"
#include "ops/elementwise.h"
#include "ops/reduce.h"
#include "ops/vec_math.h"

namespace ember {

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

// The trailing k of x's dims (those layer_norm normalizes over).
std::vector<int64_t> trailing_dims(const Tensor& x, int64_t k) {
  std::vector<int64_t> dims;
  for (int64_t d = x.dim() - k; d < x.dim(); ++d) dims.push_back(d);
  return dims;
}

// x normalized over `dims` in ops (so that it differentiates again):
//   rstd = 1 / sqrt(mean((x - mean(x))²) + eps),  xhat = (x - mean(x)) * rstd
struct Normalized {
  Tensor xhat, rstd;
};
Normalized normalized_in_ops(const Tensor& x, const std::vector<int64_t>& dims, double eps) {
  const Tensor centred = sub(x, mean(x, dims, true));
  const Tensor rstd = pow(add(mean(mul(centred, centred), dims, true), eps), -0.5);
  return {mul(centred, rstd), rstd};
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
    const std::vector<int64_t> dims = trailing_dims(x, k_);
    const auto [xhat, rstd] = normalized_in_ops(x, dims, eps_);
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
  // Forward, with g = dY W, A = g - mean(g) - xhat mean(g xhat) (so dX = rstd A), tangents tdY,
  // tX, tW, in ops (xhat and rstd recomputed from x):
  //   txhat = rstd (tX - mean(tX) - xhat mean(tX xhat)),  trstd = -rstd² mean(xhat tX)
  //   tg = tdY W + dY tW,  tA = tg - mean(tg) - txhat mean(g xhat) - xhat mean(tg xhat + g txhat)
  //   d(dX) = trstd / rstd · dX + rstd tA,  d(dW) = Σ_rows (tdY xhat + dY txhat),  d(dB) = Σ_rows
  //   tdY
  std::vector<Tensor> jvp(const std::vector<Tensor>& in, const std::vector<Tensor>& t,
                          const std::vector<Tensor>& out) override {
    const Tensor &dy = in[0], &x = in[1], &w = in[2];
    const Tensor &tdy = t[0], &tx = t[1], &tw = t[2];
    const std::vector<int64_t> dims = trailing_dims(x, k_);
    const auto avg = [&](const Tensor& a) { return mean(a, dims, true); };
    const auto [xhat, rstd] = normalized_in_ops(x, dims, eps_);
    Tensor txhat, trstd_by_rstd;  // trstd / rstd = -rstd mean(xhat tX)
    if (tx.defined()) {
      const Tensor m = avg(mul(tx, xhat));
      txhat = mul(rstd, sub(sub(tx, avg(tx)), mul(xhat, m)));
      trstd_by_rstd = neg(mul(rstd, m));
    }
    Tensor ddx, ddw, ddb;
    if (out[0].defined()) {
      const Tensor g = w.defined() ? mul(dy, w) : dy;
      Tensor tg, ta;
      if (tdy.defined()) tg = w.defined() ? mul(tdy, w) : tdy;
      if (tw.defined()) tg = fwd::add_tangents(tg, mul(dy, tw));
      if (tg.defined()) ta = sub(sub(tg, avg(tg)), mul(xhat, avg(mul(tg, xhat))));
      if (txhat.defined())
        ta = fwd::add_tangents(
            ta, neg(add(mul(txhat, avg(mul(g, xhat))), mul(xhat, avg(mul(g, txhat))))));
      if (ta.defined()) ddx = mul(rstd, ta);
      if (trstd_by_rstd.defined()) ddx = fwd::add_tangents(ddx, mul(trstd_by_rstd, out[0]));
      ddx = fwd::broadcast_tangent(ddx, out[0].shape());
    }
    if (out[1].defined()) {
      Tensor s = tdy.defined() ? mul(tdy, xhat) : Tensor();
      if (txhat.defined()) s = fwd::add_tangents(s, mul(dy, txhat));
      if (s.defined()) ddw = sum_to(s, out[1].shape());
    }
    if (out[2].defined() && tdy.defined()) ddb = sum_to(tdy, out[2].shape());
    return {ddx, ddw, ddb};
  }
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
  // Forward, in ops (xhat and rstd recomputed from x):
  //   txhat = rstd (dX - mean(dX) - xhat mean(dX xhat)),  dY = txhat W + xhat dW + dB
  std::vector<Tensor> jvp(const std::vector<Tensor>& in, const std::vector<Tensor>& t,
                          const std::vector<Tensor>& out) override {
    const Tensor &x = in[0], &w = in[1];
    if (x_.get().device().is_cpu() && !records_graph({x, w, t[0], t[1], t[2]}))
      return {jvp_by_kernels(t[0], t[1], t[2])};
    Tensor d;
    if (t[0].defined() || t[1].defined()) {
      const std::vector<int64_t> dims = trailing_dims(x, k_);
      const auto [xhat, rstd] = normalized_in_ops(x, dims, eps_);
      if (const Tensor& tx = t[0]; tx.defined()) {
        const Tensor txhat = mul(
            rstd, sub(sub(tx, mean(tx, dims, true)), mul(xhat, mean(mul(tx, xhat), dims, true))));
        d = w.defined() ? mul(txhat, w) : txhat;
      }
      if (t[1].defined()) d = fwd::add_tangents(d, mul(xhat, t[1]));
    }
    d = fwd::add_tangents(d, t[2]);
    return {fwd::broadcast_tangent(d, out[0].shape())};
  }
  // The same tangent by the kernels, on the CPU where it needs no graph: txhat is the backward
  // kernel's dX for dY = tX without a weight (the same projection), and xhat tW + tB the forward
  // kernel's output for weight tW and bias tB (its statistics recomputed, bit for bit the same).
  Tensor jvp_by_kernels(const Tensor& tx, const Tensor& tw, const Tensor& tb) {
    const Tensor &x = x_.get(), &w = weight_.get();
    Tensor d;
    dispatch_float(x.dtype(), op(), [&]<class T>() {
      if (tw.defined()) {
        const Tensor tw_c = tw.contiguous(), tb_c = tb.defined() ? tb.contiguous() : Tensor();
        const Tensor stats = empty({2, M_}, x.dtype(), x.device());
        d = empty(x.shape(), x.dtype(), x.device());
        layer_norm_forward<T>(x.data<T>(), tw_c.data<T>(), data_or_null<T>(tb_c), d.data<T>(),
                              stats.data<T>(), stats.data<T>() + M_, M_, N_, eps_);
      } else if (tb.defined()) {
        d = tb;  // broadcast below
      }
      if (tx.defined()) {
        const Tensor g = tx.contiguous();
        Tensor txhat = empty(x.shape(), x.dtype(), x.device());
        layer_norm_backward<T>(g.data<T>(), x.data<T>(), nullptr, mean_.get().data<T>(),
                               rstd_.get().data<T>(), txhat.data<T>(), nullptr, nullptr, M_, N_);
        if (w.defined()) txhat = mul(txhat, w);
        d = d.defined() ? add(txhat, d) : txhat;
      }
    });
    return fwd::broadcast_tangent(d, x.shape());
  }
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

}  // namespace ember
