// optim::LBFGS: torch.optim.LBFGS, limited-memory BFGS over all parameters flattened into one
// vector, with a fixed step or torch's strong Wolfe line search. Each step(closure) runs up to
// max_iter iterations and max_eval evaluations of the closure.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "optim/optimizer.h"

namespace ember::optim {

struct LBFGSOptions {
  double lr = 1;
  int64_t max_iter = 20;
  std::optional<int64_t> max_eval =
      std::nullopt;  // default max_iter * 5 / 4 (integer division, as torch)
  double tolerance_grad = 1e-7, tolerance_change = 1e-9;
  int64_t history_size = 100;
  std::optional<std::string> line_search_fn = std::nullopt;  // "strong_wolfe" or none
  // Ember's addition (not in torch, not in the state dict): a curvature pair is kept when
  // y·s > curvature_eps. torch's fixed 1e-10 by default. The threshold is absolute, so a loss
  // far below 1 (a PINN's 1e-6) has y·s below it: L-BFGS then keeps no new pair and crawls
  // along stale curvature. 0 keeps every pair of positive curvature (SciPy's L-BFGS-B skips
  // only y·s <= machine epsilon · y·y), and so is the same for any scale of the loss.
  double curvature_eps = 1e-10;
};

// torch.optim.LBFGS. One iteration: g is the flat gradient; the direction d is -g on the very
// first iteration, else the two-loop recursion over the last history_size pairs (y = g - g_prev,
// s = t d_prev), a pair kept only when y·s > curvature_eps (torch: 1e-10), with initial Hessian
// H_diag = y·s / y·y of the last pair kept. The
// step t is min(1, 1/|g|_1) lr on the first iteration, lr after; with strong_wolfe a line search
// (c1 = 1e-4, c2 = 0.9, at most 25 evaluations, cubic interpolation) picks t along d. The loop
// stops at max_iter, max_eval, max |g| <= tolerance_grad, g·d > -tolerance_change,
// max |t d| <= tolerance_change or |loss - prev_loss| < tolerance_change. The direction, history
// and their dot products are in the parameters' dtype (all parameters share one floating dtype);
// t and the losses are doubles.
//
// State (torch keeps it under the first parameter): "state.0.func_evals", "state.0.n_iter"
// (Int64; there once step() ran), then, once an iteration ran, "state.0.d", "state.0.t"
// (Float64), "state.0.old_dirs.<k>", "state.0.old_stps.<k>" (the history's y and s, oldest
// first, k = 0 … size - 1), "state.0.ro.<k>" (0-d, 1 / y·s), "state.0.H_diag" (0-d),
// "state.0.prev_flat_grad", "state.0.prev_loss" (Float64). Vectors and 0-d entries other than t
// and prev_loss are in the parameters' dtype; torch's scratch list "al" is not state. Group 0:
// lr, max_iter, max_eval, tolerance_grad, tolerance_change, history_size, line_search_fn (Bool:
// true for "strong_wolfe"; a state dict holds only tensors), params.
class LBFGS : public Optimizer {
 public:
  explicit LBFGS(std::vector<Tensor> params, LBFGSOptions options = {});
  // torch's LBFGS has a single group: more than one is an Error.
  explicit LBFGS(std::vector<ParamGroup<LBFGSOptions>> groups);

  // closure: zero the gradients, compute the loss, backward, return the loss (a one-element
  // tensor). Runs with gradients enabled, as torch's. Returns the closure's first loss.
  Tensor step(const std::function<Tensor()>& closure);
  void step() override;          // an Error: L-BFGS needs a closure
  LBFGSOptions options() const;  // max_eval resolved, lr the current one
  // torch's state["func_evals"] and state["n_iter"]: over all step() calls so far.
  int64_t func_evals() const { return state_.func_evals; }
  int64_t n_iter() const { return state_.n_iter; }

  StateDict state_dict() const override;
  void load_state_dict(const StateDict& state) override;
  void check_state_dict(const StateDict& state) const override;

 private:
  struct State {
    double lr = 1;         // as read from a state dict; the optimizer's own is lr_[0]
    LBFGSOptions options;  // max_eval resolved
    int64_t func_evals = 0, n_iter = 0;
    Tensor d, prev_flat_grad;  // 1-D over every parameter's elements; defined iff n_iter > 0
    double t = 0, prev_loss = 0, h_diag = 1;
    std::vector<Tensor> old_dirs, old_stps;  // the history's y and s, oldest first
    std::vector<double> ro;                  // 1 / y·s, values of the parameters' dtype
  };
  template <class T>
  Tensor run(const std::function<Tensor()>& closure);
  Tensor flat_grad() const;
  void add_to_params(double step_size, const Tensor& direction);
  State read(const StateDict& state) const;

  DType dtype_;
  int64_t numel_ = 0;
  State state_;
};

}  // namespace ember::optim
