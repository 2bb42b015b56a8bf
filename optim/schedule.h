// Learning-rate schedules: the Annotated Transformer's `rate`, and torch.optim.lr_scheduler's
// LRScheduler with LambdaLR, StepLR, CosineAnnealingLR, LinearLR, OneCycleLR and SequentialLR.
//
// As torch: a scheduler sets every parameter group's lr from the group's base lr (its lr when
// the optimizer's first scheduler was built); construction applies epoch 0 and step() moves to
// the next epoch. StepLR, CosineAnnealingLR and LinearLR use torch's recursive ("chainable")
// forms, which read the group's current lr, so their values are torch's to the last bit;
// SequentialLR restarts a scheduler at its milestone with the closed form at epoch 0, as torch.
//
// State dicts hold torch's attribute names: "base_lrs", "last_epoch", "_last_lr" (the progress,
// restored by load_state_dict), then the scheduler's settings ("step_size", "gamma", …), which
// must equal this scheduler's: a state saved with other settings is an error, not adopted.
// SequentialLR nests its schedulers' states under "_schedulers.<k>.".
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <variant>
#include <vector>

#include "optim/optimizer.h"

namespace ember::optim {

// factor * model_size^-0.5 * min(step^-0.5, step * warmup^-1.5), step 0 counted as 1.
double rate(int64_t step, int64_t model_size, double factor, int64_t warmup);

class LRScheduler {
 public:
  virtual ~LRScheduler();
  LRScheduler(const LRScheduler&) = delete;
  LRScheduler& operator=(const LRScheduler&) = delete;

  // The next epoch: every group's lr from the schedule. A step that throws changes nothing.
  virtual void step();
  int64_t last_epoch() const { return last_epoch_; }
  // The lr of every group as this scheduler last set it.
  std::vector<double> get_last_lr() const { return last_lr_; }
  const std::vector<double>& base_lrs() const { return base_lrs_; }
  Optimizer& optimizer() const { return optimizer_; }

  StateDict state_dict() const;
  void load_state_dict(const StateDict& state);
  // Throws exactly as load_state_dict(state) would, and changes nothing.
  void check_state_dict(const StateDict& state) const;

 protected:
  // A setting saved in the state dict and checked on load.
  using Setting = std::variant<int64_t, double, std::vector<int64_t>, std::vector<double>>;

  // name is the class's, for messages. Derived constructors end with initial_step().
  LRScheduler(Optimizer& optimizer, std::string name);
  // torch's _initial_step: the step to epoch 0.
  void initial_step() { step(); }
  // The lrs at last_epoch_ (torch's get_lr, the recursive form where torch has one).
  virtual std::vector<double> get_lr() const = 0;
  // The lrs at last_epoch_ from base_lrs_ alone (torch's _get_closed_form_lr).
  virtual std::vector<double> closed_form_lr() const { return get_lr(); }
  virtual std::vector<std::pair<std::string, Setting>> settings() const { return {}; }
  virtual std::vector<LRScheduler*> children() const { return {}; }
  // Every group's lr as the optimizer has it now, for the recursive forms.
  std::vector<double> current_lrs() const;
  // Overrides the optimizer's record of group g's initial lr (OneCycleLR's, as torch's).
  void set_initial_lr(size_t group, double lr);

  Optimizer& optimizer_;
  std::string name_;
  std::vector<double> base_lrs_;
  int64_t last_epoch_ = -1;
  std::vector<double> last_lr_;

 private:
  friend class SequentialLR;
  struct Progress {
    std::vector<double> base_lrs;
    int64_t last_epoch;
    std::vector<double> last_lr;
  };
  // torch's step(epoch): jump to `epoch` with the closed form.
  void step_to(int64_t epoch);
  void apply(const std::vector<double>& lrs);
  void save(StateDict& out, const std::string& prefix) const;
  void read(StateReader& in, const std::string& prefix, std::vector<Progress>& out) const;
  void restore(const std::vector<Progress>& progress, size_t& at);
};

// torch.optim.lr_scheduler.LambdaLR: lr = base_lr * f(0) at construction and base_lr * f(k)
// after k calls of step(). No settings are saved (f is code).
class LambdaLR : public LRScheduler {
 public:
  LambdaLR(Optimizer& optimizer, std::function<double(int64_t)> lr_lambda);
  double base_lr() const { return base_lrs_[0]; }  // group 0's

 private:
  std::vector<double> get_lr() const override;
  std::function<double(int64_t)> lr_lambda_;
};

// torch's StepLR: lr *= gamma every step_size epochs. Settings: step_size, gamma.
class StepLR : public LRScheduler {
 public:
  StepLR(Optimizer& optimizer, int64_t step_size, double gamma = 0.1);

 private:
  std::vector<double> get_lr() const override;
  std::vector<double> closed_form_lr() const override;
  std::vector<std::pair<std::string, Setting>> settings() const override;
  int64_t step_size_;
  double gamma_;
};

// torch's CosineAnnealingLR: eta_min + (base_lr - eta_min) (1 + cos(pi t / T_max)) / 2, by
// torch's recursion (which keeps rising past T_max, as torch's). Settings: T_max, eta_min.
class CosineAnnealingLR : public LRScheduler {
 public:
  CosineAnnealingLR(Optimizer& optimizer, int64_t T_max, double eta_min = 0);

 private:
  std::vector<double> get_lr() const override;
  std::vector<double> closed_form_lr() const override;
  std::vector<std::pair<std::string, Setting>> settings() const override;
  int64_t T_max_;
  double eta_min_;
};

// torch's LinearLR: the factor on base_lr goes linearly from start_factor to end_factor over
// total_iters epochs, then stays. Settings: start_factor, end_factor, total_iters.
class LinearLR : public LRScheduler {
 public:
  explicit LinearLR(Optimizer& optimizer, double start_factor = 1.0 / 3, double end_factor = 1.0,
                    int64_t total_iters = 5);

 private:
  std::vector<double> get_lr() const override;
  std::vector<double> closed_form_lr() const override;
  std::vector<std::pair<std::string, Setting>> settings() const override;
  double start_factor_, end_factor_;
  int64_t total_iters_;
};

// torch's OneCycleLR (anneal_strategy "cos", three_phase false, cycle_momentum true): over the
// first pct_start of total_steps the lr rises from max_lr / div_factor to max_lr while the
// momentum (SGD's momentum, Adam's beta1) falls from 0.95 to 0.85; then the lr falls to
// max_lr / div_factor / final_div_factor and the momentum rises back. Stepping past total_steps
// throws, as torch. Settings: total_steps, _schedule_phases.<0|1>.end_step, max_lrs, min_lrs,
// base_momentum, max_momentum.
class OneCycleLR : public LRScheduler {
 public:
  OneCycleLR(Optimizer& optimizer, double max_lr, int64_t total_steps, double pct_start = 0.3,
             double div_factor = 25, double final_div_factor = 1e4);

 private:
  std::vector<double> get_lr() const override;
  std::vector<std::pair<std::string, Setting>> settings() const override;
  int64_t total_steps_;
  double phase_end_[2];  // the last step of the rise and of the fall
  std::vector<double> max_lrs_, min_lrs_;
  double base_momentum_ = 0.85, max_momentum_ = 0.95;
};

// torch's SequentialLR: schedulers[k] drives the lr from milestones[k - 1] on (restarted there
// at its epoch 0); schedulers[0] until milestones[0]. Every scheduler must drive `optimizer`.
// Settings: _milestones; the schedulers' states under "_schedulers.<k>.".
class SequentialLR : public LRScheduler {
 public:
  SequentialLR(Optimizer& optimizer, std::vector<std::shared_ptr<LRScheduler>> schedulers,
               std::vector<int64_t> milestones);
  void step() override;

 private:
  std::vector<double> get_lr() const override { return last_lr_; }  // unused: step() is its own
  std::vector<std::pair<std::string, Setting>> settings() const override;
  std::vector<LRScheduler*> children() const override;
  std::vector<std::shared_ptr<LRScheduler>> schedulers_;
  std::vector<int64_t> milestones_;
};

}  // namespace ember::optim
