// Optimizers: the Optimizer base (parameter groups, learning rates, zero_grad, state dicts), SGD
// and Adam/AdamW with exactly PyTorch's update rules. Per-parameter state lives in vectors
// parallel to the parameters (all groups' parameters in order); a parameter without a gradient
// is skipped (its state does not advance).
//
// State dicts follow torch's optimizer.state_dict(), flattened: "state.<i>.<name>" for parameter
// i's state (absent until its first update, as in torch) and "param_groups.<g>.<option>" for
// each group's options, with "param_groups.<g>.params" the Int64 indices of its parameters.
// load_state_dict checks every name, dtype and shape, the group count and sizes, and the
// options' values before it changes anything; it restores the options too (a scheduler's lr).
#pragma once

#include <concepts>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "graph/tensor.h"
#include "optim/state_dict.h"

namespace ember::optim {

// A list of parameters and the options they are updated with.
template <class Options>
struct ParamGroup {
  std::vector<Tensor> params;
  Options options;
};

class Optimizer {
 public:
  virtual ~Optimizer();
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  // One update of every parameter that has a gradient.
  virtual void step() = 0;
  // Gradients become undefined (PyTorch's set_to_none).
  void zero_grad();

  size_t num_param_groups() const { return lr_.size(); }
  double lr() const { return lr(0); }  // group 0's
  double lr(size_t group) const;
  void set_lr(double lr);  // every group's
  void set_lr(size_t group, double lr);
  // Every parameter, group after group: a parameter's index here is its index in state names.
  const std::vector<Tensor>& params() const { return params_; }
  // The coefficient OneCycleLR cycles, as torch's: SGD's momentum, Adam's beta1. The base
  // versions throw (an optimizer without one).
  virtual double momentum(size_t group) const;
  virtual void set_momentum(size_t group, double value);

  // The state as torch's optimizer.state_dict(), flattened; its tensors alias the optimizer's
  // state (as torch's do), and loading copies. The base versions hold the groups' lr and params.
  virtual StateDict state_dict() const;
  virtual void load_state_dict(const StateDict& state);
  // Throws exactly as load_state_dict(state) would, and changes nothing.
  virtual void check_state_dict(const StateDict& state) const;

 protected:
  // One group: params with learning rate lr. op names the optimizer in messages.
  Optimizer(std::vector<Tensor> params, double lr, std::string_view op);
  // groups[g] are group g's parameters, lrs[g] its learning rate.
  Optimizer(std::vector<std::vector<Tensor>> groups, std::vector<double> lrs, std::string_view op);
  size_t group_begin(size_t group) const { return group_begin_[group]; }
  size_t group_end(size_t group) const { return group_begin_[group + 1]; }
  void check_group(size_t group, std::string_view op) const;
  // Group g's "param_groups.<g>.lr", then its `options` (names without the prefix), then
  // "param_groups.<g>.params", in torch's order. Reading checks the indices (and, after the last
  // group, that the state has no more groups) and returns the lr.
  void save_group(StateDict& out, size_t group, const StateDict& options = {}) const;
  double read_group(StateReader& in, size_t group) const;

  std::string op_;
  std::vector<Tensor> params_;
  std::vector<size_t> group_begin_;  // group g holds params_[group_begin_[g], group_begin_[g + 1])
  std::vector<double> lr_;           // per group; the options' lr fields are not read after
                                     // construction

 private:
  friend class LRScheduler;
  // torch's param_group['initial_lr']: set by the first scheduler, read by later ones.
  std::vector<std::optional<double>> initial_lr_;
};

struct SGDOptions {
  double lr;
  double momentum = 0, dampening = 0, weight_decay = 0;
  bool nesterov = false;
};

// torch.optim.SGD:  g += wd p;  b = g on the first step, else b = momentum b + (1 - dampening) g;
// g = nesterov ? g + momentum b : b;  p -= lr g.
// State: "state.<i>.momentum_buffer" (once stepped with momentum); groups: lr, momentum,
// dampening, weight_decay, nesterov (Bool), params.
class SGD : public Optimizer {
 public:
  SGD(std::vector<Tensor> params, SGDOptions options);
  explicit SGD(std::vector<ParamGroup<SGDOptions>> groups);
  void step() override;
  SGDOptions options(size_t group = 0) const;
  double momentum(size_t group) const override;
  void set_momentum(size_t group, double value) override;

  StateDict state_dict() const override;
  void load_state_dict(const StateDict& state) override;
  void check_state_dict(const StateDict& state) const override;

 private:
  struct State {
    std::vector<double> lr;
    std::vector<SGDOptions> options;       // per group
    std::vector<Tensor> momentum_buffers;  // per parameter; undefined until its first step
  };
  State read(const StateDict& state) const;

  std::vector<SGDOptions> options_;
  std::vector<Tensor> momentum_buffers_;
};

struct AdamOptions {
  double lr = 1e-3;
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0;
  bool decoupled_weight_decay = false;  // true = AdamW
};

// torch.optim.Adam (L2: g += wd p) and AdamW (decoupled: p *= 1 - lr wd), then
//   m = lerp(m, g, 1 - beta1);  v = beta2 v + (1 - beta2) g²;
//   p -= lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
// fused in one pass over each parameter.
// State: "state.<i>.step" (Int64), "state.<i>.exp_avg", "state.<i>.exp_avg_sq"; groups: lr,
// betas ([2]), eps, weight_decay, decoupled_weight_decay (Bool; must match on load), params.
class Adam : public Optimizer {
 public:
  explicit Adam(std::vector<Tensor> params, AdamOptions options = {});
  explicit Adam(std::vector<ParamGroup<AdamOptions>> groups);
  void step() override;
  AdamOptions options(size_t group = 0) const;
  double momentum(size_t group) const override;  // beta1
  void set_momentum(size_t group, double value) override;

  StateDict state_dict() const override;
  void load_state_dict(const StateDict& state) override;
  void check_state_dict(const StateDict& state) const override;

 protected:
  Adam(std::vector<ParamGroup<AdamOptions>> groups, std::string_view op);

 private:
  struct State {
    std::vector<double> lr;
    std::vector<AdamOptions> options;  // per group
    std::vector<int64_t> steps;        // per parameter, as torch's state['step']
    std::vector<Tensor> exp_avg, exp_avg_sq;
  };
  State read(const StateDict& state) const;

  std::vector<AdamOptions> options_;
  std::vector<int64_t> steps_;
  std::vector<Tensor> exp_avg_, exp_avg_sq_;
};

// AdamOptions without decoupled_weight_decay (AdamW always decouples) and with torch.optim.AdamW's
// default weight_decay 1e-2, so that AdamW(params, {.lr = 0.01}) decays as torch's
// AdamW(params, lr=0.01).
struct AdamWOptions {
  double lr = 1e-3;
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 1e-2;
};

// torch.optim.AdamW: Adam with decoupled weight decay. Braced options ({.lr = …}) are
// AdamWOptions; an AdamOptions value is used as given (its weight_decay default is Adam's 0)
// except that its decay is always decoupled.
class AdamW : public Adam {
 public:
  explicit AdamW(std::vector<Tensor> params, AdamWOptions options = {});
  explicit AdamW(std::vector<ParamGroup<AdamWOptions>> groups);
  // Templates, so that a braced list never picks them (it cannot deduce O or G).
  template <std::same_as<AdamOptions> O>
  AdamW(std::vector<Tensor> params, const O& options)
      : Adam(decoupled({{std::move(params), options}}), "AdamW") {}
  template <std::same_as<ParamGroup<AdamOptions>> G>
  explicit AdamW(std::vector<G> groups) : Adam(decoupled(std::move(groups)), "AdamW") {}

 private:
  static std::vector<ParamGroup<AdamOptions>> decoupled(std::vector<ParamGroup<AdamOptions>> g);
};

}  // namespace ember::optim
