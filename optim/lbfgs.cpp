// LBFGS: torch.optim.LBFGS's step (the two-loop recursion, the stopping tests) and its strong
// Wolfe line search with cubic interpolation, in the same order of operations as torch's
// lbfgs.py. Vectors are 1-D tensors over every parameter's elements in the parameters' dtype T
// and on their device, computed with ops; no vector is changed in place once stored, so the
// state may share them (see Note [LBFGS state]).
#include "optim/lbfgs.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <utility>

#include "graph/autograd.h"
#include "graph/creation.h"
#include "ops/elementwise.h"
#include "ops/index.h"

namespace ember::optim {

// Note [LBFGS state]
// torch keeps d, prev_flat_grad and the history as tensors it never writes in place after
// storing them (prev_flat_grad.copy_ aside, which aliases nothing). Here every vector is a fresh
// tensor, so the state, the history and state_dict()'s entries may alias each other freely.
// A step works on copies of the state and commits them when it returns: a closure that throws
// leaves the state as it was (the parameters may have moved).

namespace {

// The vector arithmetic is ops, as torch's lbfgs.py is tensor arithmetic, so the vectors live
// on the parameters' device and L-BFGS runs wherever they are; a scalar comes back to the host
// (a synchronisation on a GPU) only where the algorithm branches on it, as torch's .item()s.

// a · b, in T (torch's a.dot(b)): a product and a sum, not matmul, which "medium" matmul
// precision would round to bfloat16 (torch's dot is not a matrix product either).
template <class T>
T dot(const Tensor& a, const Tensor& b) {
  return sum(mul(a, b)).template item<T>();
}

// max_j |scale · v_j| (torch's v.mul(scale).abs().max()); 0 for an empty vector.
template <class T>
T max_abs(const Tensor& v, T scale = T(1)) {
  if (v.numel() == 0) return T(0);
  return (scale == T(1) ? abs(v) : abs(v * double(scale))).max().template item<T>();
}

// torch's _cubic_interpolate: the minimiser of the cubic through (x1, f1) and (x2, f2) with
// slopes g1, g2, clamped to [lo, hi] (by default the interval between x1 and x2); the middle of
// the bounds when the cubic has no minimum.
double cubic_interpolate(double x1, double f1, double g1, double x2, double f2, double g2,
                         std::optional<std::pair<double, double>> bounds = std::nullopt) {
  const auto [lo, hi] = bounds ? *bounds : x1 <= x2 ? std::pair(x1, x2) : std::pair(x2, x1);
  const double d1 = g1 + g2 - 3 * (f1 - f2) / (x1 - x2);
  const double d2_square = d1 * d1 - g1 * g2;
  if (d2_square < 0) return (lo + hi) / 2.;
  const double d2 = std::sqrt(d2_square);
  const double min_pos = x1 <= x2 ? x2 - (x2 - x1) * ((g2 + d2 - d1) / (g2 - g1 + 2 * d2))
                                  : x1 - (x1 - x2) * ((g1 + d2 - d1) / (g1 - g2 + 2 * d2));
  return std::min(std::max(min_pos, lo), hi);
}

// One evaluation along the search direction: the loss and flat gradient at x + t d.
struct Point {
  double f;
  Tensor g;
};

struct LineSearchResult {
  double f;
  Tensor g;
  double t;
  int64_t evals;
};

// torch's _strong_wolfe (ported there from minFunc's lswolfe.lua): find t along d with
// f(t) <= f + c1 t gtd and |g(t)·d| <= -c2 gtd. First bracket such a t by extrapolating with
// cubic steps, then zoom into the bracket. obj(t) evaluates the closure at x + t d. The scalars
// are doubles; the gradients' dot products are taken in T.
template <class T>
LineSearchResult strong_wolfe(const std::function<Point(double)>& obj, double t, const Tensor& d,
                              double f, const Tensor& g, double gtd, double tolerance_change) {
  constexpr double c1 = 1e-4, c2 = 0.9;
  constexpr int64_t max_ls = 25;
  const double d_norm = double(max_abs<T>(d));
  Point next = obj(t);
  int64_t evals = 1;
  double gtd_new = double(dot<T>(next.g, d));

  // bracket[0..n): steps with their losses, gradients and slopes
  double bracket[2] = {0, 0}, bracket_f[2] = {0, 0}, bracket_gtd[2] = {0, 0};
  Tensor bracket_g[2];
  int n = 0;
  bool done = false;
  double t_prev = 0, f_prev = f, gtd_prev = gtd;
  Tensor g_prev = g;
  int64_t ls_iter = 0;
  // the two-point bracket [t_prev, t], as torch's
  const auto bracket_pair = [&] {
    bracket[0] = t_prev, bracket_f[0] = f_prev, bracket_g[0] = g_prev, bracket_gtd[0] = gtd_prev;
    bracket[1] = t, bracket_f[1] = next.f, bracket_g[1] = next.g, bracket_gtd[1] = gtd_new;
    n = 2;
  };
  while (ls_iter < max_ls) {
    if (next.f > f + c1 * t * gtd || (ls_iter > 1 && next.f >= f_prev)) {
      bracket_pair();  // no sufficient decrease: a minimum lies before t
      break;
    }
    if (std::abs(gtd_new) <= -c2 * gtd) {  // both conditions hold at t
      bracket[0] = t, bracket_f[0] = next.f, bracket_g[0] = next.g, n = 1, done = true;
      break;
    }
    if (gtd_new >= 0) {
      bracket_pair();  // the slope turned: a minimum lies before t
      break;
    }
    // extrapolate: a cubic step in [t + 0.01 (t - t_prev), 10 t]
    const double min_step = t + 0.01 * (t - t_prev), max_step = t * 10;
    const double tmp = t;
    t = cubic_interpolate(t_prev, f_prev, gtd_prev, t, next.f, gtd_new, {{min_step, max_step}});
    t_prev = tmp, f_prev = next.f, g_prev = next.g, gtd_prev = gtd_new;
    next = obj(t);
    ++evals;
    gtd_new = double(dot<T>(next.g, d));
    ++ls_iter;
  }
  if (ls_iter == max_ls) {  // no bracket found: take the better of 0 and the last step
    bracket[0] = 0, bracket_f[0] = f, bracket_g[0] = g;
    bracket[1] = t, bracket_f[1] = next.f, bracket_g[1] = next.g;
    n = 2;
  }

  // zoom: shrink the bracket until a point meets both conditions
  bool insuf_progress = false;
  int low = bracket_f[0] <= bracket_f[n - 1] ? 0 : 1, high = 1 - low;
  while (!done && ls_iter < max_ls) {
    if (std::abs(bracket[1] - bracket[0]) * d_norm < tolerance_change) break;
    t = cubic_interpolate(bracket[0], bracket_f[0], bracket_gtd[0], bracket[1], bracket_f[1],
                          bracket_gtd[1]);
    // A trial within 10% of the bracket's length from an end makes little progress: the second
    // time in a row, or at or past an end, move it to 10% from the nearer end.
    const double b_max = std::max(bracket[0], bracket[1]), b_min = std::min(bracket[0], bracket[1]);
    const double eps = 0.1 * (b_max - b_min);
    if (std::min(b_max - t, t - b_min) < eps) {
      if (insuf_progress || t >= b_max || t <= b_min) {
        t = std::abs(t - b_max) < std::abs(t - b_min) ? b_max - eps : b_min + eps;
        insuf_progress = false;
      } else {
        insuf_progress = true;
      }
    } else {
      insuf_progress = false;
    }
    next = obj(t);
    ++evals;
    gtd_new = double(dot<T>(next.g, d));
    ++ls_iter;
    if (next.f > f + c1 * t * gtd || next.f >= bracket_f[low]) {
      // no sufficient decrease, or not below the low end: t becomes the high end
      bracket[high] = t, bracket_f[high] = next.f, bracket_g[high] = next.g;
      bracket_gtd[high] = gtd_new;
      low = bracket_f[0] <= bracket_f[1] ? 0 : 1, high = 1 - low;
    } else {
      if (std::abs(gtd_new) <= -c2 * gtd) {
        done = true;
      } else if (gtd_new * (bracket[high] - bracket[low]) >= 0) {
        // the old low end becomes the high end
        bracket[high] = bracket[low], bracket_f[high] = bracket_f[low];
        bracket_g[high] = bracket_g[low], bracket_gtd[high] = bracket_gtd[low];
      }
      bracket[low] = t, bracket_f[low] = next.f, bracket_g[low] = next.g;
      bracket_gtd[low] = gtd_new;
    }
  }
  return {bracket_f[low], bracket_g[low], bracket[low], evals};
}

// What is wrong with the options ("" when nothing), for the constructor and loading alike.
std::string invalid(double lr, const LBFGSOptions& o) {
  if (!(lr > 0 && std::isfinite(lr))) return fmt::format("invalid lr {} (must be > 0)", lr);
  if (o.max_iter < 1) return fmt::format("invalid max_iter {} (must be >= 1)", o.max_iter);
  if (o.max_eval && *o.max_eval < 1)
    return fmt::format("invalid max_eval {} (must be >= 1)", *o.max_eval);
  if (o.history_size < 1)
    return fmt::format("invalid history_size {} (must be >= 1)", o.history_size);
  if (!(o.tolerance_grad >= 0)) return fmt::format("invalid tolerance_grad {}", o.tolerance_grad);
  if (!(o.tolerance_change >= 0))
    return fmt::format("invalid tolerance_change {}", o.tolerance_change);
  if (!(o.curvature_eps >= 0 && std::isfinite(o.curvature_eps)))
    return fmt::format("invalid curvature_eps {} (must be >= 0)", o.curvature_eps);
  if (o.line_search_fn && *o.line_search_fn != "strong_wolfe")
    return fmt::format("unknown line_search_fn '{}' (only \"strong_wolfe\" or none)",
                       *o.line_search_fn);
  return "";
}

ParamGroup<LBFGSOptions>& only_group(std::vector<ParamGroup<LBFGSOptions>>& groups) {
  EMBER_CHECK(groups.size() == 1,
              "LBFGS: supports exactly one parameter group (torch's LBFGS has no per-parameter "
              "options), got {}",
              groups.size());
  return groups[0];
}

// The closure's loss, checked: a defined one-element tensor. Gradients are on while it runs,
// as torch's step runs its closure under enable_grad.
Tensor evaluate(const std::function<Tensor()>& closure) {
  Tensor loss;
  {
    GradModeScope grad_mode(true);
    loss = closure();
  }
  EMBER_CHECK(loss.defined(), "LBFGS: the closure returned an undefined tensor, not the loss");
  EMBER_CHECK(loss.numel() == 1, "LBFGS: the closure returned a tensor of shape {}, not a scalar",
              loss.shape());
  return loss;
}

}  // namespace

LBFGS::LBFGS(std::vector<Tensor> params, LBFGSOptions options)
    : LBFGS(std::vector<ParamGroup<LBFGSOptions>>{{std::move(params), std::move(options)}}) {}

LBFGS::LBFGS(std::vector<ParamGroup<LBFGSOptions>> groups)
    : Optimizer(std::move(only_group(groups).params), only_group(groups).options.lr, "LBFGS"),
      dtype_(params_[0].dtype()) {
  LBFGSOptions& o = groups[0].options;
  const std::string problem = invalid(o.lr, o);
  EMBER_CHECK(problem.empty(), "LBFGS: {}", problem);
  if (!o.max_eval) o.max_eval = o.max_iter * 5 / 4;
  state_.options = o;
  for (size_t i = 0; i < params_.size(); ++i) {
    const Tensor& p = params_[i];
    EMBER_CHECK(p.requires_grad(), "LBFGS: parameter {} of shape {} does not require grad", i,
                p.shape());
    EMBER_CHECK(p.dtype() == dtype_,
                "LBFGS: parameter {} is {} and parameter 0 {}: the parameters must share one dtype",
                i, p.dtype(), dtype_);
    EMBER_CHECK(p.device() == params_[0].device(),
                "LBFGS: parameter {} is on {} and parameter 0 on {}: the parameters must share "
                "one device",
                i, p.device(), params_[0].device());
    numel_ += p.numel();
  }
}

LBFGSOptions LBFGS::options() const {
  LBFGSOptions o = state_.options;
  o.lr = lr_[0];
  return o;
}

void LBFGS::step() {
  throw Error(
      "LBFGS: step() needs a closure that re-evaluates the loss: call step(closure), which "
      "zeroes the gradients, computes the loss, calls backward and returns the loss");
}

Tensor LBFGS::step(const std::function<Tensor()>& closure) {
  EMBER_CHECK(bool(closure), "LBFGS: step(closure) got an empty closure");
  return dispatch_float(dtype_, "LBFGS", [&]<class T>() { return run<T>(closure); });
}

// Every parameter's gradient (zeros where it has none), flattened into one vector on the
// parameters' device (torch's _gather_flat_grad).
Tensor LBFGS::flat_grad() const {
  NoGradGuard no_grad;
  std::vector<Tensor> views;
  for (const Tensor& p : params_) {
    const Tensor g = p.grad();
    views.push_back(g.defined() ? g.to(dtype_).reshape({p.numel()})
                                : zeros({p.numel()}, dtype_, p.device()));
  }
  return cat(views, 0);
}

// params += step_size · direction, each parameter its slice of the flat vector (torch's
// _add_grad): an in-place write under no_grad, so it bumps the version (Note [Version counter]).
void LBFGS::add_to_params(double step_size, const Tensor& direction) {
  NoGradGuard no_grad;
  int64_t offset = 0;
  for (const Tensor& param : params_) {
    Tensor(param).add_(direction.narrow(0, offset, param.numel()).view(param.shape()), step_size);
    offset += param.numel();
  }
}

template <class T>
Tensor LBFGS::run(const std::function<Tensor()>& closure) {
  State s = state_;  // committed on return (Note [LBFGS state])
  const LBFGSOptions& o = s.options;
  const double lr = lr_[0];
  const T tolerance_grad = T(o.tolerance_grad), tolerance_change = T(o.tolerance_change);

  const Tensor orig_loss = evaluate(closure);
  double loss = orig_loss.item<double>();
  int64_t current_evals = 1;
  ++s.func_evals;
  Tensor g = flat_grad();
  bool opt_cond = max_abs<T>(g) <= tolerance_grad;
  if (opt_cond) {
    state_ = std::move(s);
    return orig_loss;
  }

  for (int64_t n_iter = 1; n_iter <= o.max_iter; ++n_iter) {
    ++s.n_iter;
    // the direction d
    if (s.n_iter == 1) {
      s.d = -g;
      s.old_dirs.clear(), s.old_stps.clear(), s.ro.clear();
      s.h_diag = 1;
    } else {
      // the curvature pair of the last step, kept when y·s > curvature_eps (torch: 1e-10)
      Tensor y = g - s.prev_flat_grad;
      Tensor step = s.d * s.t;
      const T ys = dot<T>(y, step);
      if (ys > T(o.curvature_eps)) {
        if (int64_t(s.old_dirs.size()) == o.history_size) {
          s.old_dirs.erase(s.old_dirs.begin());
          s.old_stps.erase(s.old_stps.begin());
          s.ro.erase(s.ro.begin());
        }
        s.h_diag = double(ys / dot<T>(y, y));
        s.old_dirs.push_back(std::move(y));
        s.old_stps.push_back(std::move(step));
        s.ro.push_back(double(T(1) / ys));
      }
      // two-loop recursion: d = -H g with H the L-BFGS inverse Hessian, H0 = h_diag I
      const size_t num_old = s.old_dirs.size();
      std::vector<T> al(num_old);
      Tensor q = -g;
      for (size_t i = num_old; i-- > 0;) {
        al[i] = dot<T>(s.old_stps[i], q) * T(s.ro[i]);
        q.add_(s.old_dirs[i], double(-al[i]));
      }
      Tensor r = q * s.h_diag;
      for (size_t i = 0; i < num_old; ++i) {
        const T be_i = dot<T>(s.old_dirs[i], r) * T(s.ro[i]);
        r.add_(s.old_stps[i], double(al[i] - be_i));
      }
      s.d = std::move(r);
    }
    s.prev_flat_grad = g;
    s.prev_loss = loss;

    // the step length: min(1, 1/|g|_1) lr on the very first iteration (in T, as torch's tensor
    // arithmetic there), lr after
    if (s.n_iter == 1) {
      const T abs_sum = abs(g).sum().template item<T>();
      const T inv = T(1) / abs_sum;
      s.t = inv < T(1) ? double(inv * T(lr)) : lr;
    } else {
      s.t = lr;
    }
    const T gtd = dot<T>(g, s.d);
    if (gtd > -tolerance_change) break;  // not a descent direction any more

    int64_t ls_func_evals = 0;
    if (o.line_search_fn) {
      std::vector<Tensor> x_init;
      for (const Tensor& p : params_) x_init.push_back(p.detach().clone());
      const auto obj = [&](double t) {
        add_to_params(t, s.d);
        const double f = evaluate(closure).item<double>();
        Point out{f, flat_grad()};
        NoGradGuard no_grad;
        for (size_t i = 0; i < params_.size(); ++i) Tensor(params_[i]).copy_(x_init[i]);
        return out;
      };
      LineSearchResult ls =
          strong_wolfe<T>(obj, s.t, s.d, loss, g, double(gtd), o.tolerance_change);
      loss = ls.f, g = std::move(ls.g), s.t = ls.t, ls_func_evals = ls.evals;
      add_to_params(s.t, s.d);
      opt_cond = max_abs<T>(g) <= tolerance_grad;
    } else {
      add_to_params(s.t, s.d);
      if (n_iter != o.max_iter) {  // the last iteration's loss is the next call's first
        loss = evaluate(closure).item<double>();
        g = flat_grad();
        opt_cond = max_abs<T>(g) <= tolerance_grad;
        ls_func_evals = 1;
      }
    }
    current_evals += ls_func_evals;
    s.func_evals += ls_func_evals;

    if (n_iter == o.max_iter || current_evals >= *o.max_eval || opt_cond) break;
    if (max_abs<T>(s.d, T(s.t)) <= tolerance_change) break;        // the step is tiny
    if (std::abs(loss - s.prev_loss) < o.tolerance_change) break;  // the loss stalls
  }
  state_ = std::move(s);
  return orig_loss;
}

// --- state dicts

StateDict LBFGS::state_dict() const {
  StateDict out;
  const State& s = state_;
  if (s.func_evals > 0) {
    out.emplace_back("state.0.func_evals", state_integer(s.func_evals));
    out.emplace_back("state.0.n_iter", state_integer(s.n_iter));
  }
  if (s.d.defined()) {
    const auto scalar = [&](double v) { return scalar_tensor(v, dtype_); };
    out.emplace_back("state.0.d", s.d);
    out.emplace_back("state.0.t", state_number(s.t));
    for (size_t k = 0; k < s.old_dirs.size(); ++k)
      out.emplace_back(fmt::format("state.0.old_dirs.{}", k), s.old_dirs[k]);
    for (size_t k = 0; k < s.old_stps.size(); ++k)
      out.emplace_back(fmt::format("state.0.old_stps.{}", k), s.old_stps[k]);
    for (size_t k = 0; k < s.ro.size(); ++k)
      out.emplace_back(fmt::format("state.0.ro.{}", k), scalar(s.ro[k]));
    out.emplace_back("state.0.H_diag", scalar(s.h_diag));
    out.emplace_back("state.0.prev_flat_grad", s.prev_flat_grad);
    out.emplace_back("state.0.prev_loss", state_number(s.prev_loss));
  }
  const LBFGSOptions& o = s.options;
  save_group(out, 0,
             {{"max_iter", state_integer(o.max_iter)},
              {"max_eval", state_integer(*o.max_eval)},
              {"tolerance_grad", state_number(o.tolerance_grad)},
              {"tolerance_change", state_number(o.tolerance_change)},
              {"history_size", state_integer(o.history_size)},
              {"line_search_fn", state_flag(o.line_search_fn.has_value())}});
  return out;
}

LBFGS::State LBFGS::read(const StateDict& state) const {
  StateReader in(state, "LBFGS::load_state_dict");
  State s;
  LBFGSOptions& o = s.options;
  s.lr = read_group(in, 0);
  o.max_iter = in.integer("param_groups.0.max_iter");
  o.max_eval = in.integer("param_groups.0.max_eval");
  o.tolerance_grad = in.number("param_groups.0.tolerance_grad");
  o.tolerance_change = in.number("param_groups.0.tolerance_change");
  o.history_size = in.integer("param_groups.0.history_size");
  if (in.flag("param_groups.0.line_search_fn")) o.line_search_fn = "strong_wolfe";
  o.curvature_eps = state_.options.curvature_eps;  // not in the state dict: this optimizer's
  if (const std::string problem = invalid(s.lr, o); !problem.empty()) in.fail(problem);

  if (in.contains("state.0.func_evals") || in.contains("state.0.n_iter")) {
    s.func_evals = in.integer("state.0.func_evals");
    s.n_iter = in.integer("state.0.n_iter");
    if (s.func_evals < 1 || s.n_iter < 0)
      in.fail(
          fmt::format("'state.0.func_evals' {} and 'state.0.n_iter' {}: a stepped optimizer "
                      "has evaluated at least once",
                      s.func_evals, s.n_iter));
  }
  if (s.n_iter > 0 || in.contains("state.0.d")) {  // an iteration ran
    const Shape vec{numel_};
    const Device device = params_[0].device();  // the vectors live with the parameters
    const auto scalar = [&](const std::string& name) {
      const Tensor t = in.tensor(name, {}, dtype_);
      return t.defined() ? t.item<double>() : 0.0;
    };
    s.d = in.tensor("state.0.d", vec, dtype_, device);
    s.t = in.number("state.0.t");
    for (size_t k = 0; in.contains(fmt::format("state.0.old_dirs.{}", k)); ++k) {
      s.old_dirs.push_back(in.tensor(fmt::format("state.0.old_dirs.{}", k), vec, dtype_, device));
      s.old_stps.push_back(in.tensor(fmt::format("state.0.old_stps.{}", k), vec, dtype_, device));
      s.ro.push_back(scalar(fmt::format("state.0.ro.{}", k)));
    }
    if (int64_t(s.old_dirs.size()) > o.history_size)
      in.fail(fmt::format("its history holds {} pairs, more than history_size {}",
                          s.old_dirs.size(), o.history_size));
    s.h_diag = scalar("state.0.H_diag");
    s.prev_flat_grad = in.tensor("state.0.prev_flat_grad", vec, dtype_, device);
    s.prev_loss = in.number("state.0.prev_loss");
    if (s.n_iter < 1)
      in.fail(fmt::format("'state.0.n_iter' is {} but the iteration state is there", s.n_iter));
  }
  in.finish();
  return s;
}

void LBFGS::load_state_dict(const StateDict& state) {
  State s = read(state);
  lr_[0] = s.lr;
  state_ = std::move(s);
}

void LBFGS::check_state_dict(const StateDict& state) const { read(state); }

}  // namespace ember::optim
