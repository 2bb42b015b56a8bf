// The Noam rate, the LRScheduler base (stepping, state dicts) and torch's schedulers. Each
// get_lr transcribes torch 1.13's expression in the same order of operations, so the values
// agree to the last bit.
#include "optim/schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace ember::optim {

double rate(int64_t step, int64_t model_size, double factor, int64_t warmup) {
  EMBER_CHECK(step >= 0, "rate: step must be non-negative, got {}", step);
  EMBER_CHECK(model_size > 0, "rate: model_size must be positive, got {}", model_size);
  EMBER_CHECK(warmup > 0, "rate: warmup must be positive, got {}", warmup);
  const double s = static_cast<double>(std::max<int64_t>(step, 1));
  return factor * (std::pow(static_cast<double>(model_size), -0.5) *
                   std::min(std::pow(s, -0.5), s * std::pow(static_cast<double>(warmup), -1.5)));
}

// --- LRScheduler

LRScheduler::LRScheduler(Optimizer& optimizer, std::string name)
    : optimizer_(optimizer), name_(std::move(name)) {
  // torch: group.setdefault('initial_lr', group['lr']); base_lrs = the initial lrs.
  for (size_t g = 0; g < optimizer.num_param_groups(); ++g) {
    std::optional<double>& initial = optimizer.initial_lr_[g];
    if (!initial) initial = optimizer.lr(g);
    base_lrs_.push_back(*initial);
  }
}

LRScheduler::~LRScheduler() = default;

void LRScheduler::step() {
  ++last_epoch_;
  try {
    apply(get_lr());
  } catch (...) {
    --last_epoch_;
    throw;
  }
}

void LRScheduler::step_to(int64_t epoch) {
  const int64_t last = last_epoch_;
  last_epoch_ = epoch;
  try {
    apply(closed_form_lr());
  } catch (...) {
    last_epoch_ = last;
    throw;
  }
}

void LRScheduler::apply(const std::vector<double>& lrs) {
  for (size_t g = 0; g < lrs.size(); ++g)
    EMBER_CHECK(lrs[g] >= 0 && std::isfinite(lrs[g]),
                "{}: epoch {} gives group {} the invalid learning rate {}", name_, last_epoch_, g,
                lrs[g]);
  for (size_t g = 0; g < lrs.size(); ++g) optimizer_.set_lr(g, lrs[g]);
  last_lr_ = lrs;
}

std::vector<double> LRScheduler::current_lrs() const {
  std::vector<double> out;
  for (size_t g = 0; g < optimizer_.num_param_groups(); ++g) out.push_back(optimizer_.lr(g));
  return out;
}

void LRScheduler::set_initial_lr(size_t group, double lr) {
  optimizer_.initial_lr_[group] = lr;
  base_lrs_[group] = lr;
}

// Note [Scheduler state]
// A scheduler's state is its progress (base_lrs, last_epoch, _last_lr), restored on load, and its
// settings, which only have to match; a SequentialLR's children follow under their prefix. Load
// reads the whole tree into Progress values, checks, and only then restores them in the same
// (pre-)order.

StateDict LRScheduler::state_dict() const {
  StateDict out;
  save(out, "");
  return out;
}

void LRScheduler::save(StateDict& out, const std::string& prefix) const {
  out.emplace_back(prefix + "base_lrs", state_numbers(base_lrs_));
  out.emplace_back(prefix + "last_epoch", state_integer(last_epoch_));
  out.emplace_back(prefix + "_last_lr", state_numbers(last_lr_));
  for (const auto& [name, value] : settings()) {
    const Tensor t = std::visit(
        [](const auto& v) -> Tensor {
          using V = std::decay_t<decltype(v)>;
          if constexpr (std::is_same_v<V, int64_t>)
            return state_integer(v);
          else if constexpr (std::is_same_v<V, double>)
            return state_number(v);
          else if constexpr (std::is_same_v<V, std::vector<int64_t>>)
            return state_integers(v);
          else
            return state_numbers(v);
        },
        value);
    out.emplace_back(prefix + name, t);
  }
  const std::vector<LRScheduler*> kids = children();
  for (size_t k = 0; k < kids.size(); ++k)
    kids[k]->save(out, fmt::format("{}_schedulers.{}.", prefix, k));
}

void LRScheduler::read(StateReader& in, const std::string& prefix,
                       std::vector<Progress>& out) const {
  const size_t groups = base_lrs_.size();
  Progress p{in.numbers(prefix + "base_lrs", groups), in.integer(prefix + "last_epoch"),
             in.numbers(prefix + "_last_lr", groups)};
  // -1: a SequentialLR's scheduler that has not started
  if (p.last_epoch < -1 && in.contains(prefix + "last_epoch"))
    in.fail(
        fmt::format("'{}last_epoch' is {}, a scheduler's is at least -1", prefix, p.last_epoch));
  out.push_back(std::move(p));
  for (const auto& [name, value] : settings()) {
    const std::string key = prefix + name;
    const Setting saved = std::visit(
        [&](const auto& v) -> Setting {
          using V = std::decay_t<decltype(v)>;
          if constexpr (std::is_same_v<V, int64_t>)
            return in.integer(key);
          else if constexpr (std::is_same_v<V, double>)
            return in.number(key);
          else if constexpr (std::is_same_v<V, std::vector<int64_t>>)
            return in.integers(key, v.size());
          else
            return in.numbers(key, v.size());
        },
        value);
    if (saved != value && in.contains(key))
      in.fail(std::visit(
          [&](const auto& s, const auto& v) {
            return fmt::format("'{}' is {}, this {} has {}", key, s, name_, v);
          },
          saved, value));
  }
  const std::vector<LRScheduler*> kids = children();
  for (size_t k = 0; k < kids.size(); ++k)
    kids[k]->read(in, fmt::format("{}_schedulers.{}.", prefix, k), out);
}

void LRScheduler::restore(const std::vector<Progress>& progress, size_t& at) {
  const Progress& p = progress[at++];
  base_lrs_ = p.base_lrs;
  last_epoch_ = p.last_epoch;
  last_lr_ = p.last_lr;
  for (LRScheduler* kid : children()) kid->restore(progress, at);
}

void LRScheduler::check_state_dict(const StateDict& state) const {
  StateReader in(state, name_ + "::load_state_dict");
  std::vector<Progress> progress;
  read(in, "", progress);
  in.finish();
}

void LRScheduler::load_state_dict(const StateDict& state) {
  StateReader in(state, name_ + "::load_state_dict");
  std::vector<Progress> progress;
  read(in, "", progress);
  in.finish();
  size_t at = 0;
  restore(progress, at);
}

// --- LambdaLR

LambdaLR::LambdaLR(Optimizer& optimizer, std::function<double(int64_t)> lr_lambda)
    : LRScheduler(optimizer, "LambdaLR"), lr_lambda_(std::move(lr_lambda)) {
  EMBER_CHECK(lr_lambda_ != nullptr, "LambdaLR: lr_lambda is empty");
  initial_step();
}

std::vector<double> LambdaLR::get_lr() const {
  const double factor = lr_lambda_(last_epoch_);
  std::vector<double> out;
  for (double base : base_lrs_) out.push_back(base * factor);
  return out;
}

// --- StepLR

StepLR::StepLR(Optimizer& optimizer, int64_t step_size, double gamma)
    : LRScheduler(optimizer, "StepLR"), step_size_(step_size), gamma_(gamma) {
  EMBER_CHECK(step_size > 0, "StepLR: step_size must be positive, got {}", step_size);
  initial_step();
}

std::vector<double> StepLR::get_lr() const {
  std::vector<double> lrs = current_lrs();
  if (last_epoch_ == 0 || last_epoch_ % step_size_ != 0) return lrs;
  for (double& lr : lrs) lr *= gamma_;
  return lrs;
}

std::vector<double> StepLR::closed_form_lr() const {
  std::vector<double> out;
  for (double base : base_lrs_)
    out.push_back(base * std::pow(gamma_, static_cast<double>(last_epoch_ / step_size_)));
  return out;
}

std::vector<std::pair<std::string, LRScheduler::Setting>> StepLR::settings() const {
  return {{"step_size", step_size_}, {"gamma", gamma_}};
}

// --- CosineAnnealingLR

CosineAnnealingLR::CosineAnnealingLR(Optimizer& optimizer, int64_t T_max, double eta_min)
    : LRScheduler(optimizer, "CosineAnnealingLR"), T_max_(T_max), eta_min_(eta_min) {
  EMBER_CHECK(T_max > 0, "CosineAnnealingLR: T_max must be positive, got {}", T_max);
  initial_step();
}

std::vector<double> CosineAnnealingLR::get_lr() const {
  constexpr double pi = std::numbers::pi;
  const double e = static_cast<double>(last_epoch_), T = static_cast<double>(T_max_);
  std::vector<double> lrs = current_lrs();
  if (last_epoch_ == 0) return lrs;
  if ((last_epoch_ - 1 - T_max_) % (2 * T_max_) == 0) {
    // past a trough: the step back up that the closed form would take
    for (size_t g = 0; g < lrs.size(); ++g)
      lrs[g] = lrs[g] + (base_lrs_[g] - eta_min_) * (1 - std::cos(pi / T)) / 2;
    return lrs;
  }
  for (double& lr : lrs)
    lr = (1 + std::cos(pi * e / T)) / (1 + std::cos(pi * (e - 1) / T)) * (lr - eta_min_) + eta_min_;
  return lrs;
}

std::vector<double> CosineAnnealingLR::closed_form_lr() const {
  constexpr double pi = std::numbers::pi;
  const double e = static_cast<double>(last_epoch_), T = static_cast<double>(T_max_);
  std::vector<double> out;
  for (double base : base_lrs_)
    out.push_back(eta_min_ + (base - eta_min_) * (1 + std::cos(pi * e / T)) / 2);
  return out;
}

std::vector<std::pair<std::string, LRScheduler::Setting>> CosineAnnealingLR::settings() const {
  return {{"T_max", T_max_}, {"eta_min", eta_min_}};
}

// --- LinearLR

LinearLR::LinearLR(Optimizer& optimizer, double start_factor, double end_factor,
                   int64_t total_iters)
    : LRScheduler(optimizer, "LinearLR"),
      start_factor_(start_factor),
      end_factor_(end_factor),
      total_iters_(total_iters) {
  EMBER_CHECK(start_factor > 0 && start_factor <= 1,
              "LinearLR: start_factor must be in (0, 1], got {}", start_factor);
  EMBER_CHECK(end_factor >= 0 && end_factor <= 1, "LinearLR: end_factor must be in [0, 1], got {}",
              end_factor);
  EMBER_CHECK(total_iters > 0, "LinearLR: total_iters must be positive, got {}", total_iters);
  initial_step();
}

std::vector<double> LinearLR::get_lr() const {
  std::vector<double> lrs = current_lrs();
  if (last_epoch_ == 0) {
    for (double& lr : lrs) lr *= start_factor_;
    return lrs;
  }
  if (last_epoch_ > total_iters_) return lrs;
  const double d = end_factor_ - start_factor_;
  for (double& lr : lrs)
    lr = lr * (1. + d / (static_cast<double>(total_iters_) * start_factor_ +
                         static_cast<double>(last_epoch_ - 1) * d));
  return lrs;
}

std::vector<double> LinearLR::closed_form_lr() const {
  const double d = end_factor_ - start_factor_;
  const double t = static_cast<double>(std::min(total_iters_, last_epoch_));
  std::vector<double> out;
  for (double base : base_lrs_)
    out.push_back(base * (start_factor_ + d * t / static_cast<double>(total_iters_)));
  return out;
}

std::vector<std::pair<std::string, LRScheduler::Setting>> LinearLR::settings() const {
  return {
      {"start_factor", start_factor_}, {"end_factor", end_factor_}, {"total_iters", total_iters_}};
}

// --- OneCycleLR

OneCycleLR::OneCycleLR(Optimizer& optimizer, double max_lr, int64_t total_steps, double pct_start,
                       double div_factor, double final_div_factor)
    : LRScheduler(optimizer, "OneCycleLR"), total_steps_(total_steps) {
  EMBER_CHECK(total_steps > 0, "OneCycleLR: total_steps must be positive, got {}", total_steps);
  EMBER_CHECK(pct_start >= 0 && pct_start <= 1, "OneCycleLR: pct_start must be in [0, 1], got {}",
              pct_start);
  EMBER_CHECK(max_lr >= 0 && std::isfinite(max_lr), "OneCycleLR: invalid max_lr {}", max_lr);
  EMBER_CHECK(div_factor > 0 && final_div_factor > 0,
              "OneCycleLR: div_factor and final_div_factor must be positive, got {} and {}",
              div_factor, final_div_factor);
  phase_end_[0] = pct_start * static_cast<double>(total_steps) - 1;
  phase_end_[1] = static_cast<double>(total_steps - 1);
  for (size_t g = 0; g < optimizer.num_param_groups(); ++g) {
    const double initial_lr = max_lr / div_factor;
    set_initial_lr(g, initial_lr);
    max_lrs_.push_back(max_lr);
    min_lrs_.push_back(initial_lr / final_div_factor);
    optimizer.set_momentum(g, max_momentum_);
  }
  initial_step();
}

namespace {

// torch's _annealing_cos: from start to end as pct goes from 0 to 1.
double annealing_cos(double start, double end, double pct) {
  const double cos_out = std::cos(std::numbers::pi * pct) + 1;
  return end + (start - end) / 2.0 * cos_out;
}

}  // namespace

std::vector<double> OneCycleLR::get_lr() const {
  EMBER_CHECK(last_epoch_ <= total_steps_,
              "OneCycleLR: tried to step {} times; the specified number of total steps is {}",
              last_epoch_ + 1, total_steps_);
  const double step_num = static_cast<double>(last_epoch_);
  // phase 0 rises (lr initial -> max, momentum max -> base), phase 1 falls (the reverse, to min)
  const int phase = step_num <= phase_end_[0] ? 0 : 1;
  const double start_step = phase == 0 ? 0.0 : phase_end_[0];
  const double pct = (step_num - start_step) / (phase_end_[phase] - start_step);
  std::vector<double> lrs;
  for (size_t g = 0; g < base_lrs_.size(); ++g) {
    const double lr = phase == 0 ? annealing_cos(base_lrs_[g], max_lrs_[g], pct)
                                 : annealing_cos(max_lrs_[g], min_lrs_[g], pct);
    const double momentum = phase == 0 ? annealing_cos(max_momentum_, base_momentum_, pct)
                                       : annealing_cos(base_momentum_, max_momentum_, pct);
    optimizer_.set_momentum(g, momentum);
    lrs.push_back(lr);
  }
  return lrs;
}

std::vector<std::pair<std::string, LRScheduler::Setting>> OneCycleLR::settings() const {
  return {{"total_steps", total_steps_},
          {"_schedule_phases.0.end_step", phase_end_[0]},
          {"_schedule_phases.1.end_step", phase_end_[1]},
          {"max_lrs", max_lrs_},
          {"min_lrs", min_lrs_},
          {"base_momentum", base_momentum_},
          {"max_momentum", max_momentum_}};
}

// --- SequentialLR

SequentialLR::SequentialLR(Optimizer& optimizer,
                           std::vector<std::shared_ptr<LRScheduler>> schedulers,
                           std::vector<int64_t> milestones)
    : LRScheduler(optimizer, "SequentialLR"),
      schedulers_(std::move(schedulers)),
      milestones_(std::move(milestones)) {
  EMBER_CHECK(!schedulers_.empty(), "SequentialLR: got no schedulers");
  for (size_t k = 0; k < schedulers_.size(); ++k) {
    EMBER_CHECK(schedulers_[k] != nullptr, "SequentialLR: scheduler {} is null", k);
    EMBER_CHECK(&schedulers_[k]->optimizer_ == &optimizer,
                "SequentialLR: scheduler {} ({}) drives another optimizer", k,
                schedulers_[k]->name_);
  }
  EMBER_CHECK(milestones_.size() + 1 == schedulers_.size(),
              "SequentialLR: {} schedulers need {} milestones, got {}", schedulers_.size(),
              schedulers_.size() - 1, milestones_.size());
  EMBER_CHECK(std::is_sorted(milestones_.begin(), milestones_.end()),
              "SequentialLR: milestones {} are not in increasing order", milestones_);
  // torch: back to the initial lrs, undo the schedulers' own first steps, start the first one.
  for (size_t g = 0; g < base_lrs_.size(); ++g) optimizer.set_lr(g, base_lrs_[g]);
  for (const auto& s : schedulers_) --s->last_epoch_;
  schedulers_[0]->initial_step();
  last_epoch_ = 0;
  last_lr_ = schedulers_[0]->get_last_lr();
}

void SequentialLR::step() {
  const int64_t epoch = last_epoch_ + 1;
  const auto k = static_cast<size_t>(
      std::upper_bound(milestones_.begin(), milestones_.end(), epoch) - milestones_.begin());
  LRScheduler& s = *schedulers_[k];
  if (k > 0 && milestones_[k - 1] == epoch)
    s.step_to(0);
  else
    s.step();
  last_epoch_ = epoch;
  last_lr_ = s.get_last_lr();
}

std::vector<std::pair<std::string, LRScheduler::Setting>> SequentialLR::settings() const {
  return {{"_milestones", milestones_}};
}

std::vector<LRScheduler*> SequentialLR::children() const {
  std::vector<LRScheduler*> out;
  for (const auto& s : schedulers_) out.push_back(s.get());
  return out;
}

}  // namespace ember::optim
