// Losses with torch semantics and Reduction::{None, Mean, Sum}. Each loss computes its
// per-element (or per-row) values and reduces them in double inside one op, with one fused
// backward Node: no chain of generic ops, nothing materialised that the backward does not read.
// Under create_graph each backward is written in ops instead, so that it can be differentiated
// again (Note [Double backward]).
#include "ops/loss.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include "graph/autograd.h"
#include "graph/creation.h"
#include "graph/device_backend.h"
#include "graph/profile.h"
#include "graph/strided.h"
#include "ops/common.h"
#include "ops/elementwise.h"
#include "ops/index.h"
#include "ops/kernels.h"
#include "ops/nn_functional.h"
#include "ops/reduce.h"
#include "ops/shape.h"

namespace ember {

namespace {

// Sum (or mean over `count`) of n values as a 0-d tensor of T.
template <class T, class V>
Tensor reduce_values(const V* values, int64_t n, Reduction reduction, double count) {
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += static_cast<double>(values[i]);
  if (reduction == Reduction::Mean) s /= count;
  return scalar_tensor(s, dtype_of<T>());
}

// The gradient of the reduced loss with respect to the loss of element (or row) n.
template <class T>
struct LossGrad {
  LossGrad(const Tensor& g, Reduction reduction, double count)
      : g_(reduction == Reduction::None ? g.contiguous() : g) {
    if (reduction == Reduction::None)
      per_element_ = g_.data<T>();
    else
      scale_ = static_cast<T>(g.item<double>() / (reduction == Reduction::Mean ? count : 1.0));
  }
  T operator()(int64_t n) const { return per_element_ ? per_element_[n] : scale_; }

  Tensor g_;
  const T* per_element_ = nullptr;  // dOut per element (None), else the one scale_
  T scale_ = 0;
};

// Note [Losses on a device]
// On a device other than the CPU a loss is composed of ops (gather for the picked classes,
// log_softmax, masked_fill for ignored targets, sum), so its gradient, and its gradient's
// gradient, follow through theirs; the fused CPU kernels and their Nodes are the CPU's. Targets
// are checked (and the ignored ones counted) on the host: one copy of the target per call.

// values reduced as `reduction` says, in ops; Mean divides by `count`.
Tensor reduce_in_ops(const Tensor& values, Reduction reduction, double count) {
  if (reduction == Reduction::None) return values;
  const Tensor total = sum(values);
  return reduction == Reduction::Mean ? div(total, count) : total;
}

// dL of one element's (row's) loss per unit of dOut: 1 / n for Mean over n of them, else 1.
double mean_scale(Reduction reduction, double n) {
  return reduction == Reduction::Mean ? 1.0 / n : 1.0;
}

// A pointwise loss l(input, target) over the broadcast shape, reduced.
template <class F>
Tensor pointwise_loss(const Tensor& input, const Tensor& target, Reduction reduction,
                      std::string_view op, F f) {
  return dispatch_float(input.dtype(), op, [&]<class T>() {
    Tensor losses = zip<T, T, T>(input, target, op, f);
    if (reduction == Reduction::None) return losses;
    return reduce_values<T>(losses.data<T>(), losses.numel(), reduction,
                            static_cast<double>(losses.numel()));
  });
}

// The gradient of a pointwise loss: d(a, b) * dLoss, over the broadcast shape (the engine
// reduces it to each input's shape). dLoss is dOut for None, dOut / numel for Mean.
template <class T, class D>
Tensor pointwise_grad(const Tensor& a, const Tensor& b, const Tensor& g, Reduction reduction, D d) {
  const Shape shape =
      a.shape() == b.shape() ? a.shape() : broadcast_shapes(a.shape(), b.shape(), "loss");
  Tensor out = empty(shape, a.dtype(), a.device());
  const T scale = reduction == Reduction::Mean
                      ? static_cast<T>(1.0 / static_cast<double>(shape_numel(shape)))
                      : T(1);
  ternary_into<T, T, T, T>(a, b, g, out, [=](T x, T y, T dl) { return d(x, y) * dl * scale; });
  return out;
}

}  // namespace

// --- mse_loss

namespace {

// l = (x - t)²:  dX = 2 (x - t) dL,  dT = -2 (x - t) dL (in ops under create_graph)
struct MseLossBackward final : Node {
  MseLossBackward(const Tensor& input, const Tensor& target, Reduction reduction)
      : reduction_(reduction) {
    save(input_, input), save(target_, target);
  }
  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    const Tensor &x = input_.get(), &t = target_.get();
    if (is_grad_enabled()) {  // create_graph
      const Tensor d = sub(x, t);
      const Tensor grad_x =
          mul(mul(d, grads[0]), 2.0 * mean_scale(reduction_, static_cast<double>(d.numel())));
      return {needs_grad(0) ? grad_x : Tensor(), needs_grad(1) ? neg(grad_x) : Tensor()};
    }
    return dispatch_float(x.dtype(), op(), [&]<class T>() {
      const Tensor grad_x =
          pointwise_grad<T>(x, t, grads[0], reduction_, [](T a, T b) { return 2 * (a - b); });
      return std::vector<Tensor>{needs_grad(0) ? grad_x : Tensor(),
                                 needs_grad(1) ? neg(grad_x) : Tensor()};
    });
  }
  bool differentiable_backward() const override { return true; }
  // Forward: dL = 2 (x - t)(dX - dT), reduced as the loss
  std::vector<Tensor> jvp(const std::vector<Tensor>& in, const std::vector<Tensor>& t,
                          const std::vector<Tensor>&) override {
    const Tensor dd = !t[1].defined() ? t[0] : !t[0].defined() ? neg(t[1]) : sub(t[0], t[1]);
    const Tensor values = mul(mul(sub(in[0], in[1]), dd), 2.0);  // the broadcast shape
    return {reduce_in_ops(values, reduction_, static_cast<double>(values.numel()))};
  }
  Reduction reduction_;
  SavedTensor input_, target_;
};

}  // namespace

Tensor mse_loss(const Tensor& input, const Tensor& target, Reduction reduction) {
  constexpr std::string_view op = "mse_loss";
  profile::Scope scope(op);
  const DType dtype = floating_type(input, target, op);
  const Tensor x = as_type(input, dtype), t = as_type(target, dtype);
  if (!x.device().is_cpu()) {  // Note [Losses on a device]
    const Tensor d = sub(x, t);
    return reduce_in_ops(mul(d, d), reduction, static_cast<double>(d.numel()));
  }
  Tensor out = pointwise_loss(x, t, reduction, op, [](auto a, auto b) {
    const auto d = a - b;
    return d * d;
  });
  return record<MseLossBackward>(op, out, {x, t}, x, t, reduction);
}

// --- kl_div

namespace {

// l = t (log t - x), 0 where t = 0 (torch's xlogy):  dX = -t dL,
// dT = (log t + 1 - x) dL where t > 0 (0 where t = 0, the limit of the one-sided subgradient);
// in ops under create_graph, log read at 1 where t <= 0 (so that no NaN reaches its gradient).
struct KlDivBackward final : Node {
  KlDivBackward(const Tensor& input, const Tensor& target, Reduction reduction)
      : reduction_(reduction) {
    save(input_, input), save(target_, target);
  }
  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    const Tensor& t = target_.get();
    if (is_grad_enabled()) {  // create_graph
      const Tensor &x = input_.get(), &g = grads[0];
      const Shape shape = broadcast_shapes(x.shape(), t.shape(), op());
      const double scale = mean_scale(reduction_, static_cast<double>(shape_numel(shape)));
      Tensor grad_x, grad_t;
      if (needs_grad(0)) grad_x = expand(mul(mul(neg(t), g), scale), shape);
      if (needs_grad(1)) {
        const Tensor off = le(t, 0.0);
        const Tensor slope = sub(add(log(masked_fill(t, off, 1.0)), 1.0), x);
        grad_t = mul(masked_fill(mul(slope, g), off, 0.0), scale);
      }
      return {grad_x, grad_t};
    }
    return dispatch_float(t.dtype(), op(), [&]<class T>() {
      Tensor grad_x, grad_t;
      if (needs_grad(0))
        grad_x =
            pointwise_grad<T>(t, input_.get(), grads[0], reduction_, [](T a, T) { return -a; });
      if (needs_grad(1))
        grad_t = pointwise_grad<T>(t, input_.get(), grads[0], reduction_,
                                   [](T a, T b) { return a > 0 ? std::log(a) + 1 - b : T(0); });
      return std::vector<Tensor>{grad_x, grad_t};
    });
  }
  bool differentiable_backward() const override { return true; }
  // Forward: dL = -t dX + (log t + 1 - x) dT where t > 0 (0 where t <= 0, as the backward),
  // over the broadcast shape, reduced as the loss
  std::vector<Tensor> jvp(const std::vector<Tensor>& in, const std::vector<Tensor>& t,
                          const std::vector<Tensor>&) override {
    const Tensor &x = in[0], &target = in[1];
    Tensor values;
    if (t[0].defined()) values = mul(neg(target), t[0]);
    if (t[1].defined()) {
      const Tensor off = le(target, 0.0);
      const Tensor slope = sub(add(log(masked_fill(target, off, 1.0)), 1.0), x);
      values = fwd::add_tangents(values, masked_fill(mul(slope, t[1]), off, 0.0));
    }
    const Shape shape = broadcast_shapes(x.shape(), target.shape(), op());
    return {reduce_in_ops(fwd::broadcast_tangent(values, shape), reduction_,
                          static_cast<double>(shape_numel(shape)))};
  }
  Reduction reduction_;
  SavedTensor input_, target_;
};

}  // namespace

Tensor kl_div(const Tensor& log_probs, const Tensor& target, Reduction reduction) {
  constexpr std::string_view op = "kl_div";
  profile::Scope scope(op);
  const DType dtype = floating_type(log_probs, target, op);
  const Tensor x = as_type(log_probs, dtype), t = as_type(target, dtype);
  if (!x.device().is_cpu()) {
    // Note [Losses on a device]: t (log t - x) where t > 0; elsewhere -t x plus 0 (t = 0) or NaN
    // (t < 0), t there a constant (the CPU's gradients: dX = -t, dT = 0 where t <= 0)
    const Tensor off = le(t, 0.0);
    const Tensor positive = mul(t, sub(log(masked_fill(t, off, 1.0)), x));
    const Tensor nan_below =
        masked_fill(zeros_like(t), lt(t, 0.0), std::numeric_limits<double>::quiet_NaN());
    const Tensor values = where(off, add(neg(mul(t.detach(), x)), nan_below), positive);
    return reduce_in_ops(values, reduction, static_cast<double>(values.numel()));
  }
  Tensor out = pointwise_loss(x, t, reduction, op, [](auto a, auto b) {
    using T = decltype(a);
    return b > 0 ? b * (std::log(b) - a) : b == 0 ? T(0) : std::numeric_limits<T>::quiet_NaN();
  });
  return record<KlDivBackward>(op, out, {x, t}, x, t, reduction);
}

// --- nll_loss and cross_entropy: one row of class scores per target

namespace {

// Note [Class rows]
// Scores (C), (N, C) or (N, C, d1, …, dK) hold one row of C class scores per target: the target
// is (), (N) or (N, d1, …, dK). The op works on the scores seen as (N, C, D), D = d1 ⋯ dK (a
// view when the trailing dims fold, else reshape's copy, whose gradient flows back as usual), and
// numbers the rows r = n D + j in the target's row-major order; row r starts at n sn + j sd and
// steps by sc from class to class. (C) is N = D = 1, (N, C) is D = 1.
struct ClassRows {
  Tensor scores;  // (C), (N, C) or (N, C, D)
  int64_t N, C, D, sn, sc, sd;
  Tensor target;     // contiguous, N D values
  Shape loss_shape;  // the target's shape: what reduction None returns
  double count;      // targets that are not ignored (on the CPU)
  // on a device: the words for a target out of range, "{}" for it (Note [Checks on the
  // device]); count is then device_count()'s
  std::string range;

  int64_t rows() const { return N * D; }
  int64_t start(int64_t r) const { return r / D * sn + r % D * sd; }
};

// The scores as (C), (N, C) or (N, C, D) and the target checked against them (Note [Class rows]).
ClassRows class_rows(const Tensor& scores, const Tensor& target, int64_t ignore_index,
                     std::string_view op) {
  check_defined(scores, op);
  check_defined(target, op);
  EMBER_CHECK(scores.dim() >= 1,
              "{}: expected input of shape (C), (N, C) or (N, C, d1, ...), got shape {}", op,
              scores.shape());
  check_floating(scores, op);
  check_same_device(scores, target, op);
  EMBER_CHECK(target.dtype() == kInt64, "{}: target must be Int64, got {} of shape {}", op,
              target.dtype(), target.shape());
  Shape expected = scores.shape();  // the scores' shape without the class dim
  expected.erase(expected.begin() + (scores.dim() == 1 ? 0 : 1));
  EMBER_CHECK(target.shape() == expected,
              "{}: target of shape {} does not match input of shape {} (expected target shape {})",
              op, target.shape(), scores.shape(), expected);
  const int64_t nd = scores.dim();
  int64_t D = 1;
  for (int64_t d = 2; d < nd; ++d) D *= scores.size(d);
  const Tensor x = nd > 3 ? reshape(scores, {scores.size(0), scores.size(1), D}) : scores;
  ClassRows rows{x,
                 nd == 1 ? 1 : x.size(0),
                 x.size(nd == 1 ? 0 : 1),
                 D,
                 nd == 1 ? 0 : x.stride(0),
                 x.stride(nd == 1 ? 0 : 1),
                 nd > 2 ? x.stride(2) : 0,
                 target.contiguous(),
                 expected,
                 0,
                 {}};
  if (!target.device().is_cpu()) {  // the kernel that picks the targets' scores checks them
    rows.range = fmt::format("{}: target {{}} out of range for {} classes (input of shape {})", op,
                             rows.C, scores.shape());
    return rows;
  }
  const int64_t* t = rows.target.data<int64_t>();
  for (int64_t r = 0; r < rows.rows(); ++r) {
    EMBER_CHECK(t[r] == ignore_index || (t[r] >= 0 && t[r] < rows.C),
                "{}: target {} out of range for {} classes (input of shape {})", op, t[r], rows.C,
                scores.shape());
    rows.count += t[r] != ignore_index;
  }
  return rows;
}

// The targets that are not ignored, counted on their device as a 0-d tensor of the scores'
// dtype (a Mean's divisor there: no wait for it).
Tensor device_count(const ClassRows& g, int64_t ignore_index) {
  return sum(ne(g.target, static_cast<double>(ignore_index))).to(g.scores.dtype());
}

// Note [Losses on a device]: -log p[r, t_r] per row, picked by gather from `log_p` (the scores
// or their log_softmax), (1 - eps) of it plus eps / C of the row's Σ_c -log p[r, c] with label
// smoothing, 0 for ignored rows, then reduced over the rows that are not.
Tensor class_loss_in_ops(const ClassRows& g, const Tensor& log_p, Reduction reduction,
                         int64_t ignore_index, double eps) {
  const Tensor lp = reshape(log_p, {g.N, g.C, g.D});
  const Tensor t = reshape(g.target, {g.N, 1, g.D});
  const Tensor ignored = eq(t, static_cast<double>(ignore_index));
  Tensor loss = neg(gather(lp, 1, masked_fill(t, ignored, 0.0), g.range));
  if (eps > 0)
    loss = add(mul(loss, 1 - eps), mul(neg(sum(lp, {1}, true)), eps / static_cast<double>(g.C)));
  loss = reshape(masked_fill(loss, ignored, 0.0), g.loss_shape);
  if (reduction == Reduction::Mean) return div(sum(loss), device_count(g, ignore_index));
  return reduce_in_ops(loss, reduction, g.count);
}

// Per-row losses (double) as the op's result: the target's shape for None, else reduced over the
// `count` rows that were not ignored (Mean) or summed.
template <class T>
Tensor row_losses_result(const std::vector<double>& losses, const ClassRows& g,
                         Reduction reduction) {
  if (reduction != Reduction::None)
    return reduce_values<T>(losses.data(), static_cast<int64_t>(losses.size()), reduction, g.count);
  Tensor out = empty(g.loss_shape, g.scores.dtype(), g.scores.device());
  std::transform(losses.begin(), losses.end(), out.data<T>(),
                 [](double v) { return static_cast<T>(v); });
  return out;
}

// The (N, C, D) geometry of a Node's saved input shape (Note [Class rows]).
struct RowShape {
  int64_t N, C, D;
};
RowShape row_shape(const Shape& shape) {
  if (shape.size() == 1) return {1, shape[0], 1};
  return {shape[0], shape[1], shape.size() > 2 ? shape[2] : 1};
}

// The scores' shape with the class dim 1 (Note [Class rows]): one element per row.
Shape row_factor_shape(const Shape& scores) {
  Shape s = scores;
  s[s.size() == 1 ? 0 : 1] = 1;
  return s;
}

// dOut (a loss per row for None, else one) as a factor on the scores' class rows.
Tensor per_row(const Tensor& g, Reduction reduction, const Shape& scores) {
  return reduction == Reduction::None ? reshape(g, row_factor_shape(scores)) : g;
}

// l_r = -x[n, t_r, j] (0 when t_r is ignored):  dX[n, t_r, j] = -dL_r, 0 elsewhere; under
// create_graph the product of dOut and a constant that is -1 there (-1 / count for Mean).
struct NllLossBackward final : Node {
  NllLossBackward(const Tensor& target, Reduction reduction, int64_t ignore_index, double count)
      : reduction_(reduction), ignore_index_(ignore_index), count_(count) {
    save(target_, target);
  }
  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    if (is_grad_enabled()) {  // create_graph
      Tensor picks = zeros(input_shapes[0], input_dtypes[0], grads[0].device());
      const RowShape rs = row_shape(input_shapes[0]);
      const int64_t* t = target_.get().data<int64_t>();
      dispatch_float(picks.dtype(), op(), [&]<class T>() {
        T* px = picks.data<T>();
        const T pick = static_cast<T>(-mean_scale(reduction_, count_));
        for (int64_t r = 0; r < rs.N * rs.D; ++r)
          if (t[r] != ignore_index_) px[(r / rs.D * rs.C + t[r]) * rs.D + r % rs.D] = pick;
      });
      return {mul(picks, per_row(grads[0], reduction_, input_shapes[0]))};
    }
    Tensor grad_x = zeros(input_shapes[0], input_dtypes[0], grads[0].device());
    const RowShape rs = row_shape(input_shapes[0]);
    const int64_t* t = target_.get().data<int64_t>();
    dispatch_float(grad_x.dtype(), op(), [&]<class T>() {
      const LossGrad<T> dl(grads[0], reduction_, count_);
      T* px = grad_x.data<T>();
      for (int64_t r = 0; r < rs.N * rs.D; ++r)
        if (t[r] != ignore_index_) px[(r / rs.D * rs.C + t[r]) * rs.D + r % rs.D] = -dl(r);
    });
    return {grad_x};
  }
  bool differentiable_backward() const override { return true; }
  // Forward: the loss is linear in the scores: dL = nll_loss(dX, target), reduced the same way
  std::vector<Tensor> jvp(const std::vector<Tensor>& in, const std::vector<Tensor>& t,
                          const std::vector<Tensor>& out) override {
    const Tensor& x = in[0];  // (C), (N, C) or (N, C, D)
    Shape rows = x.shape();
    rows.erase(rows.begin() + (x.dim() == 1 ? 0 : 1));
    const Tensor d = nll_loss(t[0], reshape(target_.get(), rows), reduction_, ignore_index_);
    return {reshape(d, out[0].shape())};
  }
  Reduction reduction_;
  int64_t ignore_index_;
  double count_;
  SavedTensor target_;
};

}  // namespace

Tensor nll_loss(const Tensor& log_probs, const Tensor& target, Reduction reduction,
                int64_t ignore_index) {
  constexpr std::string_view op = "nll_loss";
  profile::Scope scope(op);
  const ClassRows g = class_rows(log_probs, target, ignore_index, op);
  if (!g.scores.device().is_cpu())
    return class_loss_in_ops(g, g.scores, reduction, ignore_index, 0);
  const int64_t* pt = g.target.data<int64_t>();
  Tensor out = dispatch_float(g.scores.dtype(), op, [&]<class T>() {
    const T* x = g.scores.data<T>();
    std::vector<double> losses(g.rows(), 0.0);
    for (int64_t r = 0; r < g.rows(); ++r)
      if (pt[r] != ignore_index) losses[r] = -x[g.start(r) + pt[r] * g.sc];
    return row_losses_result<T>(losses, g, reduction);
  });
  return record<NllLossBackward>(op, out, {g.scores}, g.target, reduction, ignore_index, g.count);
}

namespace {

// One row of C logits x with stride s, target t, smoothing eps (torch's formula), with
// log p_c = (x_c - m) - log_s kept in two parts (their sum may round away log_s in Float32):
//   m = max x,  log_s = log Σ exp(x - m),  nll = -log p_t,  smooth = Σ_c -log p_c
//   loss = (1 - eps) nll + eps / C * smooth;  stats = (m, log_s) for the backward
template <class T>
inline double cross_entropy_row(const T* x, int64_t s, int64_t C, int64_t t, double eps, T* stats) {
  T m = -std::numeric_limits<T>::infinity();
  for (int64_t c = 0; c < C; ++c) m = std::max(m, x[c * s]);
  double sum_exp = 0, sum_gap = 0;
  for (int64_t c = 0; c < C; ++c) {
    sum_exp += std::exp(x[c * s] - m);
    sum_gap += m - x[c * s];
  }
  const double log_s = std::log(sum_exp);
  stats[0] = m;
  stats[1] = static_cast<T>(log_s);
  const double nll = (m - x[t * s]) + log_s;
  return eps == 0 ? nll : (1 - eps) * nll + eps / C * (sum_gap + C * log_s);
}

// l_r = (1 - eps) (-log p[r, t_r]) + eps / C Σ_c -log p[r, c],  p = softmax of row r:
//   dX[r, c] = dL_r (p[r, c] - (1 - eps) [c = t_r] - eps / C),  0 for ignored rows
// Saves the logits (an input) and per row (m, log_s), so p = exp((x - m) - log_s). Under
// create_graph the same in ops: (softmax(x) - q) dL_r with q the smoothed one-hot targets and
// the rows' factors (0 where ignored, 1 / count for Mean) constants.
struct CrossEntropyBackward final : Node {
  CrossEntropyBackward(const ClassRows& g, const Tensor& stats, Reduction reduction,
                       int64_t ignore_index, double eps)
      : rows_(g), reduction_(reduction), ignore_index_(ignore_index), eps_(eps) {
    save(logits_, g.scores), save(target_, g.target), save(stats_, stats);
    rows_.scores = rows_.target = Tensor();  // held by the saved slots, version-checked
  }
  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    if (is_grad_enabled()) return apply_in_ops(grads[0]);  // create_graph
    const Tensor& x = logits_.get();
    const ClassRows& g = rows_;
    const int64_t C = g.C, D = g.D;
    Tensor grad_x = empty(x.shape(), x.dtype(), x.device());
    const int64_t* t = target_.get().data<int64_t>();
    dispatch_float(x.dtype(), op(), [&]<class T>() {
      const LossGrad<T> dl(grads[0], reduction_, g.count);
      const T *px = x.data<T>(), *stats = stats_.get().data<T>();
      T* pg = grad_x.data<T>();
      const T keep = static_cast<T>(1 - eps_), spread = static_cast<T>(eps_ / C);
      parallel_for(
          g.rows(),
          [&](int64_t begin, int64_t end) {
            for (int64_t r = begin; r < end; ++r) {
              T* row = pg + r / D * C * D + r % D;  // grad_x is contiguous: class stride D
              if (t[r] == ignore_index_) {
                for (int64_t c = 0; c < C; ++c) row[c * D] = T(0);
                continue;
              }
              const T* xr = px + g.start(r);
              const T w = dl(r), m = stats[2 * r], log_s = stats[2 * r + 1];
              for (int64_t c = 0; c < C; ++c)
                row[c * D] = w * (std::exp((xr[c * g.sc] - m) - log_s) - spread);
              row[t[r] * D] -= w * keep;
            }
          },
          row_grain(C));
    });
    return {grad_x};
  }
  // The constants of the formulas in ops, for logits x: q (x's shape), the smoothed one-hot
  // targets, and the rows' factors w (0 where ignored, 1 / count for Mean, else 1), one per row.
  std::pair<Tensor, Tensor> targets_and_factors(const Tensor& x) const {
    const ClassRows& g = rows_;
    const int64_t C = g.C, D = g.D;
    Tensor q = empty(x.shape(), x.dtype(), x.device()),
           scale = empty(row_factor_shape(x.shape()), x.dtype(), x.device());
    const int64_t* t = target_.get().data<int64_t>();
    dispatch_float(x.dtype(), op(), [&]<class T>() {
      T *pq = q.data<T>(), *ps = scale.data<T>();
      for (int64_t r = 0; r < g.rows(); ++r) {
        const bool ignored = t[r] == ignore_index_;
        ps[r] = ignored ? T(0) : static_cast<T>(mean_scale(reduction_, g.count));
        T* row = pq + r / D * C * D + r % D;  // q is contiguous: class stride D
        for (int64_t c = 0; c < C; ++c) row[c * D] = static_cast<T>(eps_ / C);
        if (!ignored) row[t[r] * D] += static_cast<T>(1 - eps_);
      }
    });
    return {q, scale};
  }
  std::vector<Tensor> apply_in_ops(const Tensor& dout) {
    const Tensor& x = logits_.get();
    const auto [q, scale] = targets_and_factors(x);
    const Tensor p = softmax(x, x.dim() == 1 ? 0 : 1);
    return {mul(sub(p, q), mul(per_row(dout, reduction_, x.shape()), scale))};
  }
  bool differentiable_backward() const override { return true; }
  // Forward, through log_softmax's rule (d log p_c = dX_c - Σ_c' p_c' dX_c'):
  //   dL_r = w_r Σ_c (p[r, c] - q[r, c]) dX[r, c]
  // q the smoothed one-hot targets, w_r the row's factor (0 where ignored, 1 / count for Mean);
  // per row for None, summed over the rows else.
  std::vector<Tensor> jvp(const std::vector<Tensor>& in, const std::vector<Tensor>& t,
                          const std::vector<Tensor>& out) override {
    const Tensor& x = in[0];
    const int64_t classes = x.dim() == 1 ? 0 : 1;
    const auto [q, scale] = targets_and_factors(x);
    const Tensor rows =
        sum(mul(mul(sub(softmax(x, classes), q), t[0]), scale), {classes});  // one per row
    return {reduction_ == Reduction::None ? reshape(rows, out[0].shape()) : sum(rows)};
  }
  ClassRows rows_;  // the geometry; its tensors are in the saved slots
  Reduction reduction_;
  int64_t ignore_index_;
  double eps_;
  SavedTensor logits_, target_, stats_;
};

}  // namespace

namespace {

// Note [Cross-entropy on a device]: one row kernel forward (cuda/rows.h's CrossEntropy: each
// row's loss from its logits and target, the CPU's formula) and one backward (the row's softmax
// recomputed, so nothing but the logits is saved), the rows' losses reduced by ops. x is the
// logits seen as (N, C, D), t the targets as (N, 1, D). Under create_graph the backward is ops:
// (softmax(x) - q) w, q the smoothed one-hot targets, w the rows' dL (0 where ignored).
struct CrossEntropyRowsBackward final : Node {
  CrossEntropyRowsBackward(const Tensor& x, const Tensor& t, int64_t ignore_index, double eps)
      : ignore_index_(ignore_index), eps_(eps) {
    save(x_, x), save(t_, t);
  }
  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    const Tensor x = x_.get(), t = t_.get();
    if (is_grad_enabled()) {  // create_graph
      const Tensor ignored = eq(t, static_cast<double>(ignore_index_));
      return {mul(sub(softmax(x, 1), smoothed_targets(x, t)), masked_fill(grads[0], ignored, 0.0))};
    }
    Tensor grad_x = empty(x.shape(), x.dtype(), x.device());
    rows_on_device(cuda::kernels::RowOp::CrossEntropyBackward, x.dtype(), 1,
                   {x, ember::per_row(t, x.shape(), 1), ember::per_row(grads[0], x.shape(), 1)},
                   {grad_x}, op(), false, eps_, ignore_index_);
    return {grad_x};
  }
  bool differentiable_backward() const override { return true; }
  // Forward: dL_r = Σ_c (softmax(x)[r, c] - q[r, c]) dX[r, c], 0 where ignored (as
  // CrossEntropyBackward's)
  std::vector<Tensor> jvp(const std::vector<Tensor>& in, const std::vector<Tensor>& t,
                          const std::vector<Tensor>&) override {
    const Tensor &x = in[0], target = t_.get();
    const Tensor rows = sum(mul(sub(softmax(x, 1), smoothed_targets(x, target)), t[0]), {1}, true);
    return {masked_fill(rows, eq(target, static_cast<double>(ignore_index_)), 0.0)};
  }
  // q: the smoothed one-hot targets of t (N, 1, D) over x's classes (N, C, D), in ops.
  Tensor smoothed_targets(const Tensor& x, const Tensor& t) const {
    const int64_t C = x.size(1);
    const Tensor classes = arange(0, static_cast<double>(C), 1, kInt64, x.device());
    const Tensor hit = eq(reshape(classes, {1, C, 1}), t).to(x.dtype());
    return add(mul(hit, 1 - eps_), eps_ / static_cast<double>(C));
  }
  SavedTensor x_, t_;
  int64_t ignore_index_;
  double eps_;
};

// cross_entropy of class rows on a device (Note [Cross-entropy on a device]).
Tensor cross_entropy_on_device(const ClassRows& g, Reduction reduction, int64_t ignore_index,
                               double eps, std::string_view op) {
  const Tensor x = reshape(g.scores, {g.N, g.C, g.D}), t = reshape(g.target, {g.N, 1, g.D});
  Tensor losses = empty({g.N, 1, g.D}, x.dtype(), x.device());
  rows_on_device(cuda::kernels::RowOp::CrossEntropy, x.dtype(), 1,
                 {x, ember::per_row(t, x.shape(), 1)}, {ember::per_row(losses, x.shape(), 1)}, op,
                 false, eps, ignore_index, g.range);
  losses = reshape(record<CrossEntropyRowsBackward>(op, losses, {x}, x, t, ignore_index, eps),
                   g.loss_shape);
  if (reduction == Reduction::None) return losses;
  return reduction == Reduction::Mean ? div(sum(losses), device_count(g, ignore_index))
                                      : sum(losses);
}

}  // namespace

Tensor cross_entropy(const Tensor& logits, const Tensor& target, Reduction reduction,
                     int64_t ignore_index, double label_smoothing) {
  constexpr std::string_view op = "cross_entropy";
  profile::Scope scope(op);
  const ClassRows g = class_rows(logits, target, ignore_index, op);
  EMBER_CHECK(label_smoothing >= 0 && label_smoothing <= 1,
              "{}: label_smoothing must be in [0, 1], got {}", op, label_smoothing);
  if (!g.scores.device().is_cpu())
    return cross_entropy_on_device(g, reduction, ignore_index, label_smoothing, op);
  const int64_t* pt = g.target.data<int64_t>();
  Tensor stats = empty({g.rows(), 2}, g.scores.dtype(), g.scores.device());
  Tensor out = dispatch_float(g.scores.dtype(), op, [&]<class T>() {
    const T* x = g.scores.data<T>();
    T* ps = stats.data<T>();
    std::vector<double> losses(g.rows(), 0.0);
    parallel_for(
        g.rows(),
        [&](int64_t begin, int64_t end) {
          for (int64_t r = begin; r < end; ++r) {
            if (pt[r] == ignore_index) {
              ps[2 * r] = ps[2 * r + 1] = 0;
              continue;
            }
            losses[r] =
                cross_entropy_row(x + g.start(r), g.sc, g.C, pt[r], label_smoothing, ps + 2 * r);
          }
        },
        row_grain(g.C));
    return row_losses_result<T>(losses, g, reduction);
  });
  return record<CrossEntropyBackward>(op, out, {g.scores}, g, stats, reduction, ignore_index,
                                      label_smoothing);
}

}  // namespace ember
