// batch_norm and group_norm. On the CPU, fused kernels: the statistics of a channel (batch_norm)
// or a group (group_norm) by the corrected two-pass sums of layer_norm, then normalisation and
// the affine map in one pass as x · alpha + beta (torch's order: alpha = rstd · weight,
// beta = bias - mean · alpha), parallel over channels or groups; first-order backwards as
// kernels too. Under create_graph the backwards are the same formulas in ops, the statistics
// recomputed from x, so that they differentiate again (Note [Double backward] in
// graph/autograd.h). On a device both ops are composed of ops (mean, sum, elementwise), their
// gradients following through them. Forward mode's rules are in ops too (normalised_tangent):
// the derivative through the statistics (the running statistics are not differentiated).
#include "ops/norm.h"

// Note [Fused batch_norm and relu]
// batch_norm_relu(x) is relu(batch_norm(x)) with the same values and gradients, for the pair every
// CNN layer repeats. In training on the CPU the forward kernel writes relu(x · alpha + beta)
// directly, so the normalised values are never stored and read back by a separate relu, and the
// backward kernel needs no relu backward before it: it reads the same g (the relu's output's
// gradient) and x as batch_norm's backward does, and recomputes the relu's mask as it goes, from
// x and the alpha and beta the forward saved, by the same expression (affine_value, masked_grad),
// so the mask is the forward's bit for bit. Per pair that moves two activation-sized tensors fewer
// forward (the relu's read and write) and three fewer backward (its read of g and y, its write).
// Under create_graph, on a device, in eval and forward mode, it is batch_norm's formulas in ops
// followed by relu's (threshold_backward), so it differentiates again as the pair does.

#include <algorithm>
#include <cmath>
#include <vector>

#include "graph/autograd.h"
#include "graph/creation.h"
#include "graph/profile.h"
#include "graph/strided.h"
#include "ops/common.h"
#include "ops/elementwise.h"
#include "ops/reduce.h"

namespace ember {

namespace {

// x (N, C, *) seen as (N, C, S), S the product of the dims after C.
struct Channels {
  int64_t N = 0, C = 0, S = 1;
};
Channels channels_of(const Tensor& x) {
  Channels ch{x.size(0), x.size(1), 1};
  for (int64_t d = 2; d < x.dim(); ++d) ch.S *= x.size(d);
  return ch;
}

// Every dim of a `dim`-D input but the channels' (dim 1).
std::vector<int64_t> non_channel_dims(int64_t dim) {
  std::vector<int64_t> dims{0};
  for (int64_t d = 2; d < dim; ++d) dims.push_back(d);
  return dims;
}

// A (C) tensor as (1, C, 1, …) against an input of `dim` dims (a differentiable view);
// undefined stays undefined.
Tensor per_channel(const Tensor& p, int64_t dim) {
  if (!p.defined()) return p;
  Shape shape(static_cast<size_t>(dim), 1);
  shape[1] = p.numel();
  return p.reshape(shape);
}

template <class T>
const T* data_or_null(const Tensor& t) {
  return t.defined() ? t.data<T>() : nullptr;
}
template <class T>
T* data_or_null(Tensor& t) {
  return t.defined() ? t.data<T>() : nullptr;
}

// --- kernels

// Σ x[i] over n contiguous elements: blocks of 256 summed in T (vectorised), the blocks in
// double, so that long runs of Float32 keep their digits.
template <class T>
double run_sum(const T* x, int64_t n) {
  double total = 0;
  for (int64_t b = 0; b < n; b += 256) {
    const int64_t e = std::min(n, b + 256);
    T s = 0;
#pragma omp simd reduction(+ : s)
    for (int64_t i = b; i < e; ++i) s += x[i];
    total += static_cast<double>(s);
  }
  return total;
}

// Σ fa(i) and Σ fb(i) over i in [0, n), added to a and b, in one pass (as run_sum).
template <class T, class FA, class FB>
void run_sums(int64_t n, FA fa, FB fb, double& a, double& b) {
  for (int64_t s = 0; s < n; s += 256) {
    const int64_t e = std::min(n, s + 256);
    T u = 0, v = 0;
#pragma omp simd reduction(+ : u, v)
    for (int64_t i = s; i < e; ++i) u += fa(i), v += fb(i);
    a += static_cast<double>(u), b += static_cast<double>(v);
  }
}

struct Moments {
  double mean = 0, var = 0;  // the biased variance
};

// Mean and biased variance of `runs` runs of `len` contiguous elements, run i at x + i · step,
// M = runs · len > 0 elements: m = Σx / M, then the corrected two-pass sums of d = x - m, which
// do not cancel however large the offset (Σd is m's rounding error):
//   mean = m + Σd / M,  var = Σd² / M - (Σd / M)²
template <class T>
Moments moments(const T* x, int64_t runs, int64_t step, int64_t len) {
  const double M = static_cast<double>(runs * len);
  double sum = 0;
  for (int64_t r = 0; r < runs; ++r) sum += run_sum(x + r * step, len);
  const T m = static_cast<T>(sum / M);
  double s1 = 0, s2 = 0;
  for (int64_t r = 0; r < runs; ++r) {
    const T* xr = x + r * step;
    run_sums<T>(
        len, [xr, m](int64_t i) { return xr[i] - m; },
        [xr, m](int64_t i) { return (xr[i] - m) * (xr[i] - m); }, s1, s2);
  }
  const double c = s1 / M;
  return {static_cast<double>(m) + c, std::max(s2 / M - c * c, 0.0)};
}

// x · alpha + beta, then with Relu the relu of it as relu's kernel (NaN stays NaN). The fused
// backward recomputes it by this same expression from the same alpha and beta, so that its mask
// is the forward's (Note [Fused batch_norm and relu]).
template <bool Relu, class T>
inline T affine_value(T x, T alpha, T beta) {
  const T v = x * alpha + beta;
  if constexpr (Relu) return !(v <= 0) ? v : T(0);
  return v;
}

// g where the relu of x · alpha + beta passes it (not <= 0), else 0; g itself without Relu.
template <bool Relu, class T>
inline T masked_grad(T g, T x, T alpha, T beta) {
  if constexpr (Relu) return !(x * alpha + beta <= 0) ? g : T(0);
  return g;
}

// y = x · alpha + beta over n contiguous elements (its relu with Relu).
template <bool Relu = false, class T>
void affine_run(const T* x, T* y, int64_t n, T alpha, T beta) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) y[i] = affine_value<Relu>(x[i], alpha, beta);
}

// batch_norm_forward (below) for S = 1, x (N, C) with a channel a column: the same sums in
// double, taken along the rows for a block of channels [c0, c1) at a time, so that the inner
// loops run over contiguous channels.
template <bool Relu, class T>
void batch_norm_forward_columns(const T* x, const T* weight, const T* bias, T* y, T* mean, T* rstd,
                                T* alpha_out, T* beta_out, double* mean_d, double* var, int64_t N,
                                int64_t C, double eps) {
  parallel_for(
      C,
      [&](int64_t c0, int64_t c1) {
        const int64_t w = c1 - c0;
        std::vector<double> sum(w, 0.0), s1(w, 0.0), s2(w, 0.0);
        std::vector<T> m(w), alpha(w), beta(w);
        for (int64_t n = 0; n < N; ++n) {
          const T* xr = x + n * C + c0;
#pragma omp simd
          for (int64_t c = 0; c < w; ++c) sum[c] += static_cast<double>(xr[c]);
        }
        for (int64_t c = 0; c < w; ++c) m[c] = static_cast<T>(sum[c] / static_cast<double>(N));
        for (int64_t n = 0; n < N; ++n) {
          const T* xr = x + n * C + c0;
#pragma omp simd
          for (int64_t c = 0; c < w; ++c) {
            const double d = static_cast<double>(xr[c] - m[c]);
            s1[c] += d, s2[c] += d * d;
          }
        }
        for (int64_t c = 0; c < w; ++c) {
          const double k = s1[c] / static_cast<double>(N);
          const double v = std::max(s2[c] / static_cast<double>(N) - k * k, 0.0);
          const T mu = static_cast<T>(static_cast<double>(m[c]) + k);
          const T rs = static_cast<T>(1.0 / std::sqrt(v + eps));
          mean[c0 + c] = mu, rstd[c0 + c] = rs;
          mean_d[c0 + c] = static_cast<double>(m[c]) + k, var[c0 + c] = v;
          alpha[c] = weight ? rs * weight[c0 + c] : rs;
          beta[c] = (bias ? bias[c0 + c] : T(0)) - mu * alpha[c];
          if (alpha_out) alpha_out[c0 + c] = alpha[c], beta_out[c0 + c] = beta[c];
        }
        for (int64_t n = 0; n < N; ++n) {
          const T* xr = x + n * C + c0;
          T* yr = y + n * C + c0;
#pragma omp simd
          for (int64_t c = 0; c < w; ++c) yr[c] = affine_value<Relu>(xr[c], alpha[c], beta[c]);
        }
      },
      row_grain(3 * N, costly_grain()));
}

// batch_norm_backward (below) for S = 1, by blocks of channels as batch_norm_forward_columns.
template <bool Relu, class T>
void batch_norm_backward_columns(const T* g, const T* x, const T* weight, const T* mean,
                                 const T* rstd, const T* alpha, const T* beta, T* dx, T* dweight,
                                 T* dbias, int64_t N, int64_t C) {
  const T inv_m = T(1) / static_cast<T>(N);
  parallel_for(
      C,
      [&](int64_t c0, int64_t c1) {
        const int64_t w = c1 - c0;
        std::vector<double> sg(w, 0.0), sgx(w, 0.0);
        const T *mu = mean + c0, *rs = rstd + c0;
        const T *al = Relu ? alpha + c0 : nullptr, *be = Relu ? beta + c0 : nullptr;
        for (int64_t n = 0; n < N; ++n) {
          const T *gr = g + n * C + c0, *xr = x + n * C + c0;
#pragma omp simd
          for (int64_t c = 0; c < w; ++c) {
            const T gc = Relu ? masked_grad<Relu>(gr[c], xr[c], al[c], be[c]) : gr[c];
            sg[c] += static_cast<double>(gc);
            sgx[c] += static_cast<double>(gc * (xr[c] - mu[c]));
          }
        }
        for (int64_t c = 0; c < w; ++c) {
          if (dweight) dweight[c0 + c] = static_cast<T>(sgx[c] * static_cast<double>(rs[c]));
          if (dbias) dbias[c0 + c] = static_cast<T>(sg[c]);
        }
        if (!dx) return;
        std::vector<T> k1(w), k2(w), f(w);
        for (int64_t c = 0; c < w; ++c) {
          k1[c] = static_cast<T>(sg[c]) * inv_m;
          k2[c] = static_cast<T>(sgx[c]) * rs[c] * rs[c] * inv_m;
          f[c] = weight ? rs[c] * weight[c0 + c] : rs[c];
        }
        for (int64_t n = 0; n < N; ++n) {
          const T *gr = g + n * C + c0, *xr = x + n * C + c0;
          T* dxr = dx + n * C + c0;
#pragma omp simd
          for (int64_t c = 0; c < w; ++c) {
            const T gc = Relu ? masked_grad<Relu>(gr[c], xr[c], al[c], be[c]) : gr[c];
            dxr[c] = (gc - k1[c] - (xr[c] - mu[c]) * k2[c]) * f[c];
          }
        }
      },
      row_grain(3 * N, costly_grain()));
}

// x, y (N, C, S) contiguous; weight, bias (C) or null. Per channel c, over its N runs of S:
// mean and var (biased; both also in double, mean_d and var, for the running update) and rstd = 1 /
// sqrt(var + eps), then
//   y = x · alpha + beta,  alpha = rstd · weight[c],  beta = bias[c] - mean · alpha
//
// With Relu, y is relu of that, and alpha_out, beta_out (C) receive alpha and beta for the fused
// backward (both may be null otherwise).
template <bool Relu = false, class T>
void batch_norm_forward(const T* x, const T* weight, const T* bias, T* y, T* mean, T* rstd,
                        T* alpha_out, T* beta_out, double* mean_d, double* var, Channels ch,
                        double eps) {
  const int64_t N = ch.N, C = ch.C, S = ch.S;
  if (S == 1)
    return batch_norm_forward_columns<Relu>(x, weight, bias, y, mean, rstd, alpha_out, beta_out,
                                            mean_d, var, N, C, eps);
  parallel_for(
      C,
      [&](int64_t begin, int64_t end) {
        for (int64_t c = begin; c < end; ++c) {
          const Moments mo = moments(x + c * S, N, C * S, S);
          const T mu = static_cast<T>(mo.mean), rs = static_cast<T>(1.0 / std::sqrt(mo.var + eps));
          mean[c] = mu, rstd[c] = rs, mean_d[c] = mo.mean, var[c] = mo.var;
          const T alpha = weight ? rs * weight[c] : rs;
          const T beta = (bias ? bias[c] : T(0)) - mu * alpha;
          if (alpha_out) alpha_out[c] = alpha, beta_out[c] = beta;
          for (int64_t n = 0; n < N; ++n)
            affine_run<Relu>(x + (n * C + c) * S, y + (n * C + c) * S, S, alpha, beta);
        }
      },
      row_grain(N * S, costly_grain()));
}

// Backward of the forward above, g (N, C, S) contiguous; dx, dweight, dbias may be null. Per
// channel, with M = N S, xhat = (x - mean) rstd and sums over the channel's N runs:
//   dX = weight rstd (g - Σg / M - xhat Σ(g xhat) / M),  dW = Σ g xhat,  dB = Σ g
// With Relu, g is the gradient of the forward's relu, masked where x · alpha + beta (alpha,
// beta (C) the forward's) is <= 0 on the fly. Two passes in memory order, run after run (a run:
// the S values of one sample and channel): the first takes each run's Σg and Σg (x - mean) (in
// double, each run's alone), which are then added per channel in sample order; the second writes
// dX. A channel at a time instead (its N runs C · S apart, for the sums then again for dX) ran at
// a third of the memory's speed on the AMX Xeon with x and g out of cache, as a training step has
// them: 5.7 ms for (128, 32, 28, 28).
template <bool Relu = false, class T>
void batch_norm_backward(const T* g, const T* x, const T* weight, const T* mean, const T* rstd,
                         const T* alpha, const T* beta, T* dx, T* dweight, T* dbias, Channels ch) {
  const int64_t N = ch.N, C = ch.C, S = ch.S;
  if (S == 1)
    return batch_norm_backward_columns<Relu>(g, x, weight, mean, rstd, alpha, beta, dx, dweight,
                                             dbias, N, C);
  const int64_t R = N * C;
  std::vector<double> run_g(static_cast<size_t>(R)), run_gx(static_cast<size_t>(R));
  parallel_for(
      R,
      [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
          const int64_t c = r % C;
          const T mu = mean[c], al = Relu ? alpha[c] : T(0), be = Relu ? beta[c] : T(0);
          const T *gr = g + r * S, *xr = x + r * S;
          double a = 0, b = 0;
          run_sums<T>(
              S, [gr, xr, al, be](int64_t i) { return masked_grad<Relu>(gr[i], xr[i], al, be); },
              [gr, xr, mu, al, be](int64_t i) {
                return masked_grad<Relu>(gr[i], xr[i], al, be) * (xr[i] - mu);
              },
              a, b);
          run_g[r] = a, run_gx[r] = b;
        }
      },
      row_grain(2 * S, costly_grain()));
  const T inv_m = T(1) / static_cast<T>(N * S);
  std::vector<T> k1(C), k2(C), f(C);
  for (int64_t c = 0; c < C; ++c) {
    double sg = 0, sgx = 0;
    for (int64_t n = 0; n < N; ++n) sg += run_g[n * C + c], sgx += run_gx[n * C + c];
    const T rs = rstd[c];
    if (dweight) dweight[c] = static_cast<T>(sgx * rs);
    if (dbias) dbias[c] = static_cast<T>(sg);
    k1[c] = static_cast<T>(sg) * inv_m, k2[c] = static_cast<T>(sgx) * rs * rs * inv_m;
    f[c] = weight ? rs * weight[c] : rs;
  }
  if (!dx) return;
  parallel_for(
      R,
      [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
          const int64_t c = r % C;
          const T mu = mean[c], al = Relu ? alpha[c] : T(0), be = Relu ? beta[c] : T(0);
          const T ka = k1[c], kb = k2[c], fc = f[c];
          const T *gr = g + r * S, *xr = x + r * S;
          T* dxr = dx + r * S;
#pragma omp simd
          for (int64_t s = 0; s < S; ++s)
            dxr[s] = (masked_grad<Relu>(gr[s], xr[s], al, be) - ka - (xr[s] - mu) * kb) * fc;
        }
      },
      row_grain(3 * S));
}

// x, y (N, C, S) contiguous in G groups of D = C / G channels: row r = n G + j holds the
// K = D S contiguous elements of group j of sample n. weight, bias (C) or null; mean, rstd
// (N G). Per row: mean and rstd = 1 / sqrt(var + eps), then for each channel c of the group
//   y = x · alpha + beta,  alpha = rstd · weight[c],  beta = bias[c] - mean · alpha
template <class T>
void group_norm_forward(const T* x, const T* weight, const T* bias, T* y, T* mean, T* rstd,
                        Channels ch, int64_t G, double eps) {
  const int64_t D = ch.C / G, S = ch.S, K = D * S;
  parallel_for(
      ch.N * G,
      [&](int64_t begin, int64_t end) {
        for (int64_t r = begin; r < end; ++r) {
          const Moments mo = moments(x + r * K, 1, K, K);
          const T mu = static_cast<T>(mo.mean), rs = static_cast<T>(1.0 / std::sqrt(mo.var + eps));
          mean[r] = mu, rstd[r] = rs;
          for (int64_t d = 0; d < D; ++d) {
            const int64_t c = (r % G) * D + d;
            const T alpha = weight ? rs * weight[c] : rs;
            const T beta = (bias ? bias[c] : T(0)) - mu * alpha;
            affine_run(x + r * K + d * S, y + r * K + d * S, S, alpha, beta);
          }
        }
      },
      row_grain(K, costly_grain()));
}

// Backward of the forward above, g (N, C, S) contiguous; dx, dweight, dbias may be null. Per
// row (K elements), with xhat = (x - mean) rstd and dxhat = g weight[c]:
//   dX = rstd (dxhat - Σdxhat / K - xhat Σ(dxhat xhat) / K)
//   dW[c] = Σ_n Σ_s g xhat,  dB[c] = Σ_n Σ_s g
// Each row's channels' Σg and Σg (x - mean) go to (N, C) partials (dW, dB summed over N after),
// and make the row's two sums; then a pass for dX.
template <class T>
void group_norm_backward(const T* g, const T* x, const T* weight, const T* mean, const T* rstd,
                         T* dx, T* dweight, T* dbias, Channels ch, int64_t G) {
  const int64_t N = ch.N, C = ch.C, S = ch.S;
  const int64_t D = C / G, K = D * S;
  std::vector<double> pg(static_cast<size_t>(N * C)), pgx(static_cast<size_t>(N * C));
  const T inv_k = T(1) / static_cast<T>(K);
  parallel_for(
      N * G,
      [&](int64_t begin, int64_t end) {
        for (int64_t r = begin; r < end; ++r) {
          const int64_t n = r / G, c0 = (r % G) * D;
          const T mu = mean[r], rs = rstd[r];
          double s1 = 0, s2 = 0;  // Σ dxhat, Σ dxhat (x - mean)
          for (int64_t d = 0; d < D; ++d) {
            const T *gr = g + r * K + d * S, *xr = x + r * K + d * S;
            double a = 0, b = 0;
            run_sums<T>(
                S, [gr](int64_t i) { return gr[i]; },
                [gr, xr, mu](int64_t i) { return gr[i] * (xr[i] - mu); }, a, b);
            pg[n * C + c0 + d] = a, pgx[n * C + c0 + d] = b;
            const double w = weight ? static_cast<double>(weight[c0 + d]) : 1.0;
            s1 += w * a, s2 += w * b;
          }
          if (!dx) continue;
          const T k1 = static_cast<T>(s1) * inv_k, k2 = static_cast<T>(s2) * rs * rs * inv_k;
          for (int64_t d = 0; d < D; ++d) {
            const T w = weight ? weight[c0 + d] : T(1);
            const T *gr = g + r * K + d * S, *xr = x + r * K + d * S;
            T* dxr = dx + r * K + d * S;
#pragma omp simd
            for (int64_t s = 0; s < S; ++s) dxr[s] = rs * (gr[s] * w - k1 - (xr[s] - mu) * k2);
          }
        }
      },
      row_grain(2 * K, costly_grain()));
  for (int64_t c = 0; c < C; ++c) {
    double sw = 0, sb = 0;
    for (int64_t n = 0; n < N; ++n) {
      sw += pgx[n * C + c] * static_cast<double>(rstd[n * G + c / D]);
      sb += pg[n * C + c];
    }
    if (dweight) dweight[c] = static_cast<T>(sw);
    if (dbias) dbias[c] = static_cast<T>(sb);
  }
}

// --- backwards in ops (create_graph), and the forwards in ops (devices)

// batch_norm's training backward in ops of (g, x, weight), the statistics recomputed from x
// (the formulas of batch_norm_backward): {dX, dW, dB}, dW and dB of shape (C).
std::vector<Tensor> batch_norm_backward_in_ops(const Tensor& g, const Tensor& x, const Tensor& w,
                                               double eps) {
  const std::vector<int64_t> dims = non_channel_dims(x.dim());
  const int64_t C = x.size(1);
  const double M = static_cast<double>(x.numel() / std::max<int64_t>(C, 1));
  const Tensor mu = mean(x, dims, true), xc = sub(x, mu);
  const Tensor rstd = pow(add(mean(mul(xc, xc), dims, true), eps), -0.5);
  const Tensor xhat = mul(xc, rstd);
  const Tensor db = sum(g, dims, true), dw = sum(mul(g, xhat), dims, true);
  const Tensor f = w.defined() ? mul(rstd, per_channel(w, x.dim())) : rstd;
  const Tensor dx = mul(sub(sub(g, div(db, M)), mul(xhat, div(dw, M))), f);
  return {dx, dw.reshape({C}), db.reshape({C})};
}

// group_norm in ops: xhat of shape (N, G, K) with its rstd, from x.
struct GroupStats {
  Tensor xhat, rstd;
};
GroupStats group_stats(const Tensor& x, int64_t G, double eps) {
  const Channels ch = channels_of(x);
  const Tensor xg = x.reshape({ch.N, G, ch.C / G * ch.S});
  const Tensor xc = sub(xg, mean(xg, {2}, true));
  const Tensor rstd = pow(add(mean(mul(xc, xc), {2}, true), eps), -0.5);
  return {mul(xc, rstd), rstd};
}

// group_norm's backward in ops of (g, x, weight) (the formulas of group_norm_backward).
std::vector<Tensor> group_norm_backward_in_ops(const Tensor& g, const Tensor& x, const Tensor& w,
                                               int64_t G, double eps) {
  const Channels ch = channels_of(x);
  const GroupStats st = group_stats(x, G, eps);
  const Tensor dxhat =
      (w.defined() ? mul(g, per_channel(w, x.dim())) : g).reshape({ch.N, G, ch.C / G * ch.S});
  const Tensor dx = mul(st.rstd, sub(sub(dxhat, mean(dxhat, {2}, true)),
                                     mul(st.xhat, mean(mul(dxhat, st.xhat), {2}, true))));
  const std::vector<int64_t> dims = non_channel_dims(x.dim());
  return {dx.reshape(x.shape()), sum(mul(g, st.xhat.reshape(x.shape())), dims), sum(g, dims)};
}

// The affine map of the normalised xhat (x's shape) with optional weight and bias.
Tensor affine_in_ops(Tensor y, const Tensor& weight, const Tensor& bias) {
  if (weight.defined()) y = mul(y, per_channel(weight, y.dim()));
  if (bias.defined()) y = add(y, per_channel(bias, y.dim()));
  return y;
}

// Gradients of an empty input: dX empty, dW and dB sums of nothing.
std::vector<Tensor> empty_input_grads(const Node& node, const Tensor& x) {
  std::vector<Tensor> out(3);
  if (node.needs_grad(0)) out[0] = zeros(node.input_shapes[0], x.dtype(), x.device());
  for (size_t i = 1; i < 3; ++i)
    if (node.needs_grad(i)) out[i] = zeros(node.input_shapes[i], x.dtype(), x.device());
  return out;
}

// The tangent of a normalisation y = xhat · w + b, xhat = (x - mean) · rstd over the last dim of
// the (…, K) views xg (of x) and dxg (of its tangent), the statistics recomputed in ops so that
// the tangent carries the outer levels' (Note [Forward grads] in graph/forward_ad.h):
//   dxhat = rstd (dx - mean(dx) - xhat mean(xhat dx)),  dY = dxhat w + xhat dW + dB
// w, dW, dB per channel (undefined: none). Returns dY of x's shape, undefined where zero.
Tensor normalised_tangent(const Tensor& x, const Tensor& xg, const Tensor& dxg, const Tensor& w,
                          const Tensor& dw, const Tensor& db, const std::vector<int64_t>& dims,
                          double eps) {
  const Tensor xc = sub(xg, mean(xg, dims, true));
  const Tensor rstd = pow(add(mean(mul(xc, xc), dims, true), eps), -0.5);
  const Tensor xhat = mul(xc, rstd);
  Tensor d;
  if (dxg.defined()) {
    const Tensor centred = sub(dxg, mean(dxg, dims, true));
    const Tensor dxhat =
        mul(rstd, sub(centred, mul(xhat, mean(mul(xhat, dxg), dims, true)))).reshape(x.shape());
    d = w.defined() ? mul(dxhat, per_channel(w, x.dim())) : dxhat;
  }
  if (dw.defined())
    d = fwd::add_tangents(d, mul(xhat.reshape(x.shape()), per_channel(dw, x.dim())));
  if (db.defined()) d = fwd::add_tangents(d, per_channel(db, x.dim()));
  return fwd::broadcast_tangent(d, x.shape());
}

// batch_norm in training (see batch_norm_backward for the derivative), and batch_norm_relu's
// (Note [Fused batch_norm and relu]) when `out`, the relu's output, is defined. Saves x and
// weight (the op's inputs, for the backward in ops), the kernel's data: contiguous x and weight,
// and stats (2, C): mean and rstd, or with the relu (4, C): also the forward's alpha and beta;
// and with the relu its output.
struct BatchNormBackward final : Node {
  BatchNormBackward(const Tensor& x, const Tensor& weight, const Tensor& xc, const Tensor& wc,
                    const Tensor& stats, double eps, const Tensor& out = {})
      : eps_(eps), relu_(out.defined()) {
    save(x_, x), save(weight_, weight), save(xc_, xc), save(wc_, wc), save(stats_, stats);
    if (relu_) save_output(out_, out);
  }
  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    const Tensor& x = xc_.get();
    if (x.numel() == 0) return empty_input_grads(*this, x);
    if (is_grad_enabled() || !grads[0].device().is_cpu()) {
      const Tensor g = relu_ ? threshold_backward(grads[0], out_.get()) : grads[0];
      std::vector<Tensor> out = batch_norm_backward_in_ops(g, x_.get(), weight_.get(), eps_);
      for (size_t i = 0; i < 3; ++i)
        if (!needs_grad(i)) out[i] = Tensor();
      return out;
    }
    const Tensor gc = grads[0].contiguous();
    const Tensor stats = stats_.get();
    Tensor dx, dw, db;
    if (needs_grad(0)) dx = empty(x.shape(), x.dtype(), x.device());
    if (needs_grad(1)) dw = empty(input_shapes[1], x.dtype(), x.device());
    if (needs_grad(2)) db = empty(input_shapes[2], x.dtype(), x.device());
    dispatch_float(x.dtype(), op(), [&]<class T>() {
      const T* st = stats.data<T>();
      const int64_t C = stats.size(1);
      const auto run = [&]<bool Relu>() {
        batch_norm_backward<Relu, T>(gc.data<T>(), x.data<T>(), data_or_null<T>(wc_.get()), st,
                                     st + C, Relu ? st + 2 * C : nullptr,
                                     Relu ? st + 3 * C : nullptr, data_or_null<T>(dx),
                                     data_or_null<T>(dw), data_or_null<T>(db), channels_of(x));
      };
      relu_ ? run.template operator()<true>() : run.template operator()<false>();
    });
    return {dx, dw, db};
  }
  bool differentiable_backward() const override { return true; }
  // Forward: through the batch statistics (normalised_tangent over every dim but C), then the
  // relu's derivative where there is one
  std::vector<Tensor> jvp(const std::vector<Tensor>& in, const std::vector<Tensor>& t,
                          const std::vector<Tensor>& out) override {
    const Tensor& x = in[0];
    if (x.numel() == 0) return {Tensor()};
    Tensor d = normalised_tangent(x, x, t[0], in[1], t[1], t[2], non_channel_dims(x.dim()), eps_);
    if (relu_ && d.defined()) d = threshold_backward(d, out[0]);
    return {d};
  }
  double eps_;
  bool relu_;
  SavedTensor x_, weight_;       // the op's inputs
  SavedTensor xc_, wc_, stats_;  // the kernel's data
  SavedTensor out_;              // the relu's output (batch_norm_relu)
};

// group_norm (see group_norm_backward for the derivative); saves as BatchNormBackward.
struct GroupNormBackward final : Node {
  GroupNormBackward(const Tensor& x, const Tensor& weight, const Tensor& xc, const Tensor& wc,
                    const Tensor& mean, const Tensor& rstd, int64_t groups, double eps)
      : groups_(groups), eps_(eps) {
    save(x_, x), save(weight_, weight), save(xc_, xc), save(wc_, wc);
    save(mean_, mean), save(rstd_, rstd);
  }
  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    const Tensor& g = grads[0];
    const Tensor& x = xc_.get();
    if (x.numel() == 0) return empty_input_grads(*this, x);
    if (is_grad_enabled() || !g.device().is_cpu()) {
      std::vector<Tensor> out =
          group_norm_backward_in_ops(g, x_.get(), weight_.get(), groups_, eps_);
      for (size_t i = 0; i < 3; ++i)
        if (!needs_grad(i)) out[i] = Tensor();
      return out;
    }
    const Tensor gc = g.contiguous();
    Tensor dx, dw, db;
    if (needs_grad(0)) dx = empty(x.shape(), x.dtype(), x.device());
    if (needs_grad(1)) dw = empty(input_shapes[1], x.dtype(), x.device());
    if (needs_grad(2)) db = empty(input_shapes[2], x.dtype(), x.device());
    dispatch_float(x.dtype(), op(), [&]<class T>() {
      group_norm_backward<T>(gc.data<T>(), x.data<T>(), data_or_null<T>(wc_.get()),
                             mean_.get().data<T>(), rstd_.get().data<T>(), data_or_null<T>(dx),
                             data_or_null<T>(dw), data_or_null<T>(db), channels_of(x), groups_);
    });
    return {dx, dw, db};
  }
  bool differentiable_backward() const override { return true; }
  // Forward: through the group statistics (normalised_tangent over (N, G, C/G·S) views)
  std::vector<Tensor> jvp(const std::vector<Tensor>& in, const std::vector<Tensor>& t,
                          const std::vector<Tensor>&) override {
    const Tensor& x = in[0];
    if (x.numel() == 0) return {Tensor()};
    const Channels ch = channels_of(x);
    const Shape grouped{ch.N, groups_, ch.C / groups_ * ch.S};
    return {normalised_tangent(x, x.reshape(grouped),
                               t[0].defined() ? t[0].reshape(grouped) : Tensor(), in[1], t[1], t[2],
                               {2}, eps_)};
  }
  int64_t groups_;
  double eps_;
  SavedTensor x_, weight_;
  SavedTensor xc_, wc_, mean_, rstd_;
};

// y = x · alpha + beta per channel of x (N, C, *), alpha and beta (C): batch_norm in eval.
//   dX = g alpha,  dAlpha = Σ g x,  dBeta = Σ g   (sums over every dim but C), in ops
struct ChannelAffineBackward final : Node {
  ChannelAffineBackward(const Tensor& x, const Tensor& alpha) { save(x_, x), save(alpha_, alpha); }
  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    const Tensor& g = grads[0];
    const Tensor x = x_.get();
    const std::vector<int64_t> dims = non_channel_dims(x.dim());
    Tensor dx, dalpha, dbeta;
    if (needs_grad(0)) dx = mul(g, per_channel(alpha_.get(), x.dim()));
    if (needs_grad(1)) dalpha = sum(mul(g, x), dims);
    if (needs_grad(2)) dbeta = sum(g, dims);
    return {dx, dalpha, dbeta};
  }
  bool differentiable_backward() const override { return true; }
  // Forward: dY = dX alpha + x dAlpha + dBeta (per channel)
  std::vector<Tensor> jvp(const std::vector<Tensor>& in, const std::vector<Tensor>& t,
                          const std::vector<Tensor>& out) override {
    const int64_t dim = in[0].dim();
    Tensor d;
    if (t[0].defined()) d = mul(t[0], per_channel(in[1], dim));
    if (t[1].defined()) d = fwd::add_tangents(d, mul(in[0], per_channel(t[1], dim)));
    if (t[2].defined()) d = fwd::add_tangents(d, per_channel(t[2], dim));
    return {fwd::broadcast_tangent(d, out[0].shape())};
  }
  SavedTensor x_, alpha_;
};

Tensor channel_affine(const Tensor& x, const Tensor& alpha, const Tensor& beta,
                      std::string_view op) {
  if (!x.device().is_cpu())
    return add(mul(x, per_channel(alpha, x.dim())), per_channel(beta, x.dim()));
  const Tensor xc = contiguous_data(x), ac = contiguous_data(alpha), bc = contiguous_data(beta);
  Tensor out = empty(x.shape(), x.dtype(), x.device());
  const Channels ch = channels_of(x);
  dispatch_float(x.dtype(), op, [&]<class T>() {
    const T *px = xc.data<T>(), *pa = ac.data<T>(), *pb = bc.data<T>();
    T* py = out.data<T>();
    parallel_for(
        ch.N * ch.C,
        [&](int64_t begin, int64_t end) {
          for (int64_t r = begin; r < end; ++r)
            affine_run(px + r * ch.S, py + r * ch.S, ch.S, pa[r % ch.C], pb[r % ch.C]);
        },
        row_grain(ch.S));
  });
  return record<ChannelAffineBackward>(op, out, {x, alpha, beta}, x, alpha);
}

// A per-channel argument of a norm op: undefined, or (C) of x's dtype and device.
void check_per_channel(const Tensor& x, const Tensor& p, std::string_view what,
                       std::string_view op) {
  if (!p.defined()) return;
  EMBER_CHECK(p.dim() == 1 && p.size(0) == x.size(1),
              "{}: {} should have the input's {} channels, got shape {} for an input of shape {}",
              op, what, x.size(1), p.shape(), x.shape());
  EMBER_CHECK(p.dtype() == x.dtype(), "{}: {} is {} but the input is {}", op, what, p.dtype(),
              x.dtype());
  check_same_device(x, p, op);
}

void check_norm_input(const Tensor& x, std::string_view op) {
  check_floating(x, op);
  EMBER_CHECK(x.dim() >= 2, "{}: expected an input of at least 2 dims (N, C, …), got shape {}", op,
              x.shape());
}

// running = (1 - momentum) · running + momentum · statistic, in place without grad, for the
// (C) statistics mean and var (the biased variance, made unbiased here over M values), in
// double as torch.
void update_running(const Tensor& running_mean, const Tensor& running_var,
                    const std::vector<double>& mean, const std::vector<double>& var, int64_t M,
                    double momentum) {
  const int64_t C = static_cast<int64_t>(mean.size());
  const double unbias = static_cast<double>(M) / static_cast<double>(M - 1);
  NoGradGuard no_grad;
  if (running_mean.defined()) {
    std::vector<double> rm = running_mean.to_vector<double>();
    for (int64_t c = 0; c < C; ++c) rm[c] = momentum * mean[c] + (1 - momentum) * rm[c];
    Tensor(running_mean).copy_(from_vector(rm, {C}, running_mean.dtype()));
  }
  if (running_var.defined()) {
    std::vector<double> rv = running_var.to_vector<double>();
    for (int64_t c = 0; c < C; ++c) rv[c] = momentum * var[c] * unbias + (1 - momentum) * rv[c];
    Tensor(running_var).copy_(from_vector(rv, {C}, running_var.dtype()));
  }
}

// batch_norm in training on a device: the statistics and the result in ops, the running
// statistics updated by in-place ops.
Tensor batch_norm_train_in_ops(const Tensor& x, const Tensor& running_mean,
                               const Tensor& running_var, const Tensor& weight, const Tensor& bias,
                               double momentum, double eps) {
  const std::vector<int64_t> dims = non_channel_dims(x.dim());
  const int64_t C = x.size(1), M = x.numel() / std::max<int64_t>(C, 1);
  const Tensor mu = mean(x, dims, true), xc = sub(x, mu);
  const Tensor var = mean(mul(xc, xc), dims, true);
  const Tensor y = affine_in_ops(mul(xc, pow(add(var, eps), -0.5)), weight, bias);
  NoGradGuard no_grad;
  if (running_mean.defined())
    Tensor(running_mean).mul_(1 - momentum).add_(mu.detach().reshape({C}), momentum);
  if (running_var.defined()) {
    const double unbias = static_cast<double>(M) / static_cast<double>(M - 1);
    Tensor(running_var).mul_(1 - momentum).add_(var.detach().reshape({C}), momentum * unbias);
  }
  return y;
}

}  // namespace

namespace {

// batch_norm, or with relu batch_norm_relu (the name its profile scope, errors and Node carry):
// the checks, then the fused kernels in training on the CPU; otherwise ops (and the relu after
// them).
Tensor batch_norm_or_relu(const Tensor& x, const Tensor& running_mean, const Tensor& running_var,
                          const Tensor& weight, const Tensor& bias, bool training, double momentum,
                          double eps, bool relu) {
  const std::string_view op = relu ? "batch_norm_relu" : "batch_norm";
  profile::Scope scope(op);
  check_norm_input(x, op);
  check_per_channel(x, running_mean, "running_mean", op);
  check_per_channel(x, running_var, "running_var", op);
  check_per_channel(x, weight, "weight", op);
  check_per_channel(x, bias, "bias", op);
  EMBER_CHECK(eps >= 0, "{}: eps must be non-negative, got {}", op, eps);
  const Channels ch = channels_of(x);
  const auto finish = [relu](const Tensor& y) { return relu ? ember::relu(y) : y; };
  if (!training) {
    EMBER_CHECK(running_mean.defined() && running_var.defined(),
                "{}: running_mean and running_var must be defined in eval mode (training = "
                "false), got {} and {}",
                op, running_mean.defined() ? "one" : "none",
                running_var.defined() ? "one" : "none");
    // alpha = weight / sqrt(running_var + eps), beta = bias - running_mean · alpha (C values)
    const Tensor rstd = pow(add(running_var, eps), -0.5);
    const Tensor alpha = weight.defined() ? mul(weight, rstd) : rstd;
    const Tensor shift = mul(running_mean, alpha);
    const Tensor beta = bias.defined() ? sub(bias, shift) : neg(shift);
    return finish(channel_affine(x, alpha, beta, op));
  }
  EMBER_CHECK(ch.N * ch.S != 1,
              "{}: expected more than 1 value per channel when training, got input of shape {}", op,
              x.shape());
  const int64_t M = ch.N * ch.S;
  if (!x.device().is_cpu() && x.numel() > 0)
    return finish(
        batch_norm_train_in_ops(x, running_mean, running_var, weight, bias, momentum, eps));

  const Tensor xc = contiguous_data(x), w = contiguous_data(weight), b = contiguous_data(bias);
  Tensor out = empty(x.shape(), x.dtype(), x.device());
  // mean, rstd; with the relu also alpha and beta, which its backward recomputes the mask from
  const Tensor stats = empty({relu ? 4 : 2, ch.C}, x.dtype(), x.device());
  if (x.numel() > 0) {
    std::vector<double> mean_d(static_cast<size_t>(ch.C)), var(static_cast<size_t>(ch.C));
    dispatch_float(x.dtype(), op, [&]<class T>() {
      T* st = stats.data<T>();
      const int64_t C = ch.C;
      const auto run = [&]<bool Relu>() {
        batch_norm_forward<Relu, T>(xc.data<T>(), data_or_null<T>(w), data_or_null<T>(b),
                                    out.data<T>(), st, st + C, Relu ? st + 2 * C : nullptr,
                                    Relu ? st + 3 * C : nullptr, mean_d.data(), var.data(), ch,
                                    eps);
      };
      relu ? run.template operator()<true>() : run.template operator()<false>();
    });
    if (running_mean.defined() || running_var.defined())
      update_running(running_mean, running_var, mean_d, var, M, momentum);
  }
  return record<BatchNormBackward>(op, out, {x, weight, bias}, x, weight, xc, w, stats, eps,
                                   relu ? out : Tensor());
}

}  // namespace

Tensor batch_norm(const Tensor& x, const Tensor& running_mean, const Tensor& running_var,
                  const Tensor& weight, const Tensor& bias, bool training, double momentum,
                  double eps) {
  return batch_norm_or_relu(x, running_mean, running_var, weight, bias, training, momentum, eps,
                            false);
}

Tensor batch_norm_relu(const Tensor& x, const Tensor& running_mean, const Tensor& running_var,
                       const Tensor& weight, const Tensor& bias, bool training, double momentum,
                       double eps) {
  return batch_norm_or_relu(x, running_mean, running_var, weight, bias, training, momentum, eps,
                            true);
}

Tensor group_norm(const Tensor& x, int64_t num_groups, const Tensor& weight, const Tensor& bias,
                  double eps) {
  constexpr std::string_view op = "group_norm";
  profile::Scope scope(op);
  check_norm_input(x, op);
  EMBER_CHECK(num_groups > 0, "{}: num_groups must be positive, got {}", op, num_groups);
  const Channels ch = channels_of(x);
  EMBER_CHECK(ch.C % num_groups == 0,
              "{}: the input's {} channels (shape {}) are not divisible by num_groups {}", op, ch.C,
              x.shape(), num_groups);
  check_per_channel(x, weight, "weight", op);
  check_per_channel(x, bias, "bias", op);
  EMBER_CHECK(eps >= 0, "{}: eps must be non-negative, got {}", op, eps);
  // torch's check (F.group_norm's _verify_batch_size): N · C / G · S values in all must not be 1
  EMBER_CHECK(ch.N * (ch.C / num_groups) * ch.S != 1,
              "{}: expected more than 1 value per group, got input of shape {} and num_groups {}",
              op, x.shape(), num_groups);
  if (!x.device().is_cpu() && x.numel() > 0)
    return affine_in_ops(group_stats(x, num_groups, eps).xhat.reshape(x.shape()), weight, bias);

  const Tensor xc = contiguous_data(x), w = contiguous_data(weight), b = contiguous_data(bias);
  Tensor out = empty(x.shape(), x.dtype(), x.device());
  const Tensor stats = empty({2, ch.N * num_groups}, x.dtype(), x.device());
  const Tensor mean = stats.select(0, 0), rstd = stats.select(0, 1);
  if (x.numel() > 0)
    dispatch_float(x.dtype(), op, [&]<class T>() {
      group_norm_forward<T>(xc.data<T>(), data_or_null<T>(w), data_or_null<T>(b), out.data<T>(),
                            mean.data<T>(), rstd.data<T>(), ch, num_groups, eps);
    });
  return record<GroupNormBackward>(op, out, {x, weight, bias}, x, weight, xc, w, mean, rstd,
                                   num_groups, eps);
}

}  // namespace ember
