// Optimizer base, SGD and Adam/AdamW. Each update is one raw loop over a parameter's data that
// reads its gradient and writes the parameter and its state in place: no temporaries. State
// dicts are read whole into a State value (every check passed) before it replaces the old one.
#include "optim/optimizer.h"

#include <cmath>
#include <map>
#include <unordered_set>

#include "graph/autograd.h"
#include "graph/creation.h"
#include "ops/optimizer_step.h"

namespace ember::optim {

Optimizer::Optimizer(std::vector<std::vector<Tensor>> groups, std::vector<double> lrs,
                     std::string_view op)
    : op_(op), lr_(std::move(lrs)), initial_lr_(groups.size()) {
  EMBER_CHECK(!groups.empty(), "{}: got an empty list of parameter groups", op);
  std::unordered_set<const TensorImpl*> seen;
  group_begin_.push_back(0);
  for (size_t g = 0; g < groups.size(); ++g) {
    EMBER_CHECK(!groups[g].empty(), "{}: got an empty parameter list (group {})", op, g);
    EMBER_CHECK(lr_[g] >= 0 && std::isfinite(lr_[g]), "{}: invalid learning rate {} (group {})", op,
                lr_[g], g);
    for (Tensor& p : groups[g]) {
      const size_t i = params_.size();
      EMBER_CHECK(p.defined(), "{}: parameter {} is undefined", op, i);
      EMBER_CHECK(is_floating(p.dtype()), "{}: parameter {} of shape {} is {}, not floating", op, i,
                  p.shape(), p.dtype());
      EMBER_CHECK(p.is_leaf(), "{}: parameter {} of shape {} is not a leaf tensor", op, i,
                  p.shape());
      EMBER_CHECK(seen.insert(p.impl()).second, "{}: parameter {} of shape {} appears twice", op, i,
                  p.shape());
      params_.push_back(std::move(p));
    }
    group_begin_.push_back(params_.size());
  }
}

Optimizer::Optimizer(std::vector<Tensor> params, double lr, std::string_view op)
    : Optimizer(std::vector<std::vector<Tensor>>{std::move(params)}, {lr}, op) {}

Optimizer::~Optimizer() = default;

void Optimizer::zero_grad() {
  for (const Tensor& p : params_) p.set_grad(Tensor());
}

void Optimizer::check_group(size_t group, std::string_view op) const {
  EMBER_CHECK(group < num_param_groups(), "{}: group {} out of range for {} parameter groups", op,
              group, num_param_groups());
}

double Optimizer::lr(size_t group) const {
  check_group(group, "lr");
  return lr_[group];
}

void Optimizer::set_lr(double lr) {
  for (size_t g = 0; g < num_param_groups(); ++g) set_lr(g, lr);
}

void Optimizer::set_lr(size_t group, double lr) {
  check_group(group, "set_lr");
  EMBER_CHECK(lr >= 0 && std::isfinite(lr), "set_lr: invalid learning rate {}", lr);
  lr_[group] = lr;
}

double Optimizer::momentum(size_t) const {
  throw Error(
      fmt::format("{}: has no momentum (OneCycleLR cycles SGD's momentum, Adam's beta1)", op_));
}

void Optimizer::set_momentum(size_t, double) { momentum(0); }

namespace {

// Reads a learning rate and records it when it is invalid.
double read_lr(StateReader& in, const std::string& name) {
  const double lr = in.number(name);
  if (!(lr >= 0 && std::isfinite(lr))) in.fail(fmt::format("'{}' is an invalid lr {}", name, lr));
  return lr;
}

}  // namespace

void Optimizer::save_group(StateDict& out, size_t group, const StateDict& options) const {
  const std::string prefix = fmt::format("param_groups.{}.", group);
  out.emplace_back(prefix + "lr", state_number(lr_[group]));
  for (const auto& [name, t] : options) out.emplace_back(prefix + name, t);
  std::vector<int64_t> indices;
  for (size_t i = group_begin(group); i < group_end(group); ++i) indices.push_back(int64_t(i));
  out.emplace_back(prefix + "params", state_integers(indices));
}

double Optimizer::read_group(StateReader& in, size_t group) const {
  const std::string name = fmt::format("param_groups.{}.params", group);
  const size_t n = group_end(group) - group_begin(group);
  const std::vector<int64_t> indices = in.integers(name, n);
  for (size_t k = 0; k < n; ++k)
    if (indices[k] != int64_t(group_begin(group) + k) && in.contains(name)) {
      in.fail(fmt::format("'{}' is {}, expected the indices {} to {}", name, indices,
                          group_begin(group), group_end(group) - 1));
      break;
    }
  if (group + 1 == num_param_groups() &&
      in.contains(fmt::format("param_groups.{}.params", group + 1)))
    in.fail(
        fmt::format("it has more than the optimizer's {} parameter groups", num_param_groups()));
  return read_lr(in, fmt::format("param_groups.{}.lr", group));
}

StateDict Optimizer::state_dict() const {
  StateDict out;
  for (size_t g = 0; g < num_param_groups(); ++g) save_group(out, g);
  return out;
}

void Optimizer::check_state_dict(const StateDict& state) const {
  StateReader in(state, op_ + "::load_state_dict");
  for (size_t g = 0; g < num_param_groups(); ++g) read_group(in, g);
  in.finish();
}

void Optimizer::load_state_dict(const StateDict& state) {
  StateReader in(state, op_ + "::load_state_dict");
  std::vector<double> lrs;
  for (size_t g = 0; g < num_param_groups(); ++g) lrs.push_back(read_group(in, g));
  in.finish();
  lr_ = std::move(lrs);
}

namespace {

template <class Options>
std::vector<std::vector<Tensor>> group_params(const std::vector<ParamGroup<Options>>& groups) {
  std::vector<std::vector<Tensor>> out;
  for (const auto& g : groups) out.push_back(g.params);
  return out;
}

template <class Options>
std::vector<double> group_lrs(const std::vector<ParamGroup<Options>>& groups) {
  std::vector<double> out;
  for (const auto& g : groups) out.push_back(g.options.lr);
  return out;
}

template <class Options>
std::vector<Options> group_options(const std::vector<ParamGroup<Options>>& groups) {
  std::vector<Options> out;
  for (const auto& g : groups) out.push_back(g.options);
  return out;
}

// What is wrong with a group's options ("" when nothing), for constructors and loading alike.
std::string invalid(const SGDOptions& o) {
  if (!(o.momentum >= 0)) return fmt::format("invalid momentum {}", o.momentum);
  if (!(o.weight_decay >= 0)) return fmt::format("invalid weight_decay {}", o.weight_decay);
  if (o.nesterov && !(o.momentum > 0 && o.dampening == 0))
    return fmt::format("nesterov needs momentum > 0 and dampening 0, got momentum {} dampening {}",
                       o.momentum, o.dampening);
  return "";
}

std::string invalid(const AdamOptions& o) {
  if (!(o.eps >= 0)) return fmt::format("invalid eps {}", o.eps);
  if (!(o.beta1 >= 0 && o.beta1 < 1)) return fmt::format("invalid beta1 {}", o.beta1);
  if (!(o.beta2 >= 0 && o.beta2 < 1)) return fmt::format("invalid beta2 {}", o.beta2);
  if (!(o.weight_decay >= 0)) return fmt::format("invalid weight_decay {}", o.weight_decay);
  return "";
}

template <class Options>
void check_options(const std::vector<Options>& options, std::string_view op) {
  for (size_t g = 0; g < options.size(); ++g) {
    const std::string problem = invalid(options[g]);
    EMBER_CHECK(problem.empty(), "{}: {}{}", op, problem,
                options.size() > 1 ? fmt::format(" (group {})", g) : "");
  }
}

}  // namespace

// --- SGD

SGD::SGD(std::vector<Tensor> params, SGDOptions options)
    : SGD(std::vector<ParamGroup<SGDOptions>>{{std::move(params), options}}) {}

SGD::SGD(std::vector<ParamGroup<SGDOptions>> groups)
    : Optimizer(group_params(groups), group_lrs(groups), "SGD"),
      options_(group_options(groups)),
      momentum_buffers_(params_.size()) {
  check_options(options_, "SGD");
}

SGDOptions SGD::options(size_t group) const {
  check_group(group, "SGD::options");
  SGDOptions o = options_[group];
  o.lr = lr_[group];
  return o;
}

double SGD::momentum(size_t group) const {
  check_group(group, "SGD::momentum");
  return options_[group].momentum;
}

void SGD::set_momentum(size_t group, double value) {
  check_group(group, "SGD::set_momentum");
  SGDOptions o = options_[group];
  o.momentum = value;
  const std::string problem = invalid(o);
  EMBER_CHECK(problem.empty(), "SGD::set_momentum: {}", problem);
  options_[group] = o;
}

void SGD::step() {
  for (size_t group = 0; group < num_param_groups(); ++group) {
    const SGDOptions& o = options_[group];
    const double group_lr = lr_[group];
    // the parameters with gradients, by whether this is their momentum buffer's first step: one
    // update of each kind (several parameters a launch on a device)
    std::vector<Tensor> params[2], buffers[2];
    for (size_t i = group_begin(group); i < group_end(group); ++i) {
      const Tensor& param = params_[i];
      if (!param.grad().defined()) continue;
      const bool first = !momentum_buffers_[i].defined();
      if (o.momentum != 0 && first) momentum_buffers_[i] = zeros_like(param);
      params[first].push_back(param);
      buffers[first].push_back(momentum_buffers_[i]);
    }
    for (const bool first : {false, true})
      if (!params[first].empty())
        sgd_step_(params[first], buffers[first],
                  {.lr = group_lr,
                   .weight_decay = o.weight_decay,
                   .momentum = o.momentum,
                   .keep = 1 - o.dampening,
                   .first = first,
                   .nesterov = o.nesterov});
  }
}

StateDict SGD::state_dict() const {
  StateDict out;
  for (size_t i = 0; i < params_.size(); ++i)
    if (momentum_buffers_[i].defined())
      out.emplace_back(fmt::format("state.{}.momentum_buffer", i), momentum_buffers_[i]);
  for (size_t g = 0; g < num_param_groups(); ++g) {
    const SGDOptions& o = options_[g];
    save_group(out, g,
               {{"momentum", state_number(o.momentum)},
                {"dampening", state_number(o.dampening)},
                {"weight_decay", state_number(o.weight_decay)},
                {"nesterov", state_flag(o.nesterov)}});
  }
  return out;
}

SGD::State SGD::read(const StateDict& state) const {
  StateReader in(state, op_ + "::load_state_dict");
  State s{lr_, options_, std::vector<Tensor>(params_.size())};
  for (size_t i = 0; i < params_.size(); ++i) {
    const std::string name = fmt::format("state.{}.momentum_buffer", i);
    if (in.contains(name))
      s.momentum_buffers[i] =
          in.tensor(name, params_[i].shape(), params_[i].dtype(), params_[i].device());
  }
  for (size_t g = 0; g < num_param_groups(); ++g) {
    const std::string p = fmt::format("param_groups.{}.", g);
    SGDOptions& o = s.options[g];
    s.lr[g] = read_group(in, g);
    o.momentum = in.number(p + "momentum");
    o.dampening = in.number(p + "dampening");
    o.weight_decay = in.number(p + "weight_decay");
    o.nesterov = in.flag(p + "nesterov");
    if (const std::string problem = invalid(o); !problem.empty())
      in.fail(fmt::format("group {}: {}", g, problem));
  }
  in.finish();
  return s;
}

void SGD::load_state_dict(const StateDict& state) {
  State s = read(state);
  lr_ = std::move(s.lr);
  options_ = std::move(s.options);
  momentum_buffers_ = std::move(s.momentum_buffers);
}

void SGD::check_state_dict(const StateDict& state) const { read(state); }

// --- Adam / AdamW

Adam::Adam(std::vector<Tensor> params, AdamOptions options)
    : Adam(std::vector<ParamGroup<AdamOptions>>{{std::move(params), options}}, "Adam") {}

Adam::Adam(std::vector<ParamGroup<AdamOptions>> groups) : Adam(std::move(groups), "Adam") {}

Adam::Adam(std::vector<ParamGroup<AdamOptions>> groups, std::string_view op)
    : Optimizer(group_params(groups), group_lrs(groups), op),
      options_(group_options(groups)),
      steps_(params_.size(), 0),
      exp_avg_(params_.size()),
      exp_avg_sq_(params_.size()) {
  check_options(options_, op);
}

AdamOptions Adam::options(size_t group) const {
  check_group(group, op_ + "::options");
  AdamOptions o = options_[group];
  o.lr = lr_[group];
  return o;
}

double Adam::momentum(size_t group) const {
  check_group(group, op_ + "::momentum");
  return options_[group].beta1;
}

void Adam::set_momentum(size_t group, double value) {
  check_group(group, op_ + "::set_momentum");
  EMBER_CHECK(value >= 0 && value < 1, "{}::set_momentum: invalid beta1 {}", op_, value);
  options_[group].beta1 = value;
}

void Adam::step() {
  for (size_t group = 0; group < num_param_groups(); ++group) {
    const AdamOptions& o = options_[group];
    const double lr = lr_[group];
    // the parameters with gradients, by their step count (the same for all of them unless some
    // had no gradient at some step): one update per count, several parameters a launch on a
    // device
    struct Same {
      std::vector<Tensor> params, exp_avg, exp_avg_sq;
    };
    std::map<int64_t, Same> by_step;
    for (size_t i = group_begin(group); i < group_end(group); ++i) {
      const Tensor& param = params_[i];
      if (!param.grad().defined()) continue;
      if (!exp_avg_[i].defined()) {
        exp_avg_[i] = zeros_like(param);
        exp_avg_sq_[i] = zeros_like(param);
      }
      Same& same = by_step[++steps_[i]];
      same.params.push_back(param);
      same.exp_avg.push_back(exp_avg_[i]);
      same.exp_avg_sq.push_back(exp_avg_sq_[i]);
    }
    for (const auto& [t, same] : by_step) {
      const double step_size = lr / (1 - std::pow(o.beta1, static_cast<double>(t)));
      const double bc2_sqrt = std::sqrt(1 - std::pow(o.beta2, static_cast<double>(t)));
      adam_step_(same.params, same.exp_avg, same.exp_avg_sq,
                 {.l2 = o.decoupled_weight_decay ? 0 : o.weight_decay,
                  .decay = o.decoupled_weight_decay ? 1 - lr * o.weight_decay : 1,
                  .beta1 = o.beta1,
                  .beta2 = o.beta2,
                  .eps = o.eps,
                  .step_size = step_size,
                  .c2 = bc2_sqrt});
    }
  }
}

StateDict Adam::state_dict() const {
  StateDict out;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (!exp_avg_[i].defined()) continue;
    const std::string p = fmt::format("state.{}.", i);
    out.emplace_back(p + "step", state_integer(steps_[i]));
    out.emplace_back(p + "exp_avg", exp_avg_[i]);
    out.emplace_back(p + "exp_avg_sq", exp_avg_sq_[i]);
  }
  for (size_t g = 0; g < num_param_groups(); ++g) {
    const AdamOptions& o = options_[g];
    save_group(out, g,
               {{"betas", state_numbers({o.beta1, o.beta2})},
                {"eps", state_number(o.eps)},
                {"weight_decay", state_number(o.weight_decay)},
                {"decoupled_weight_decay", state_flag(o.decoupled_weight_decay)}});
  }
  return out;
}

Adam::State Adam::read(const StateDict& state) const {
  StateReader in(state, op_ + "::load_state_dict");
  const size_t n = params_.size();
  State s{lr_, options_, std::vector<int64_t>(n, 0), std::vector<Tensor>(n),
          std::vector<Tensor>(n)};
  for (size_t i = 0; i < n; ++i) {
    const std::string p = fmt::format("state.{}.", i);
    if (!in.contains(p + "step") && !in.contains(p + "exp_avg") && !in.contains(p + "exp_avg_sq"))
      continue;  // never stepped
    s.steps[i] = in.integer(p + "step");
    if (s.steps[i] < 1 && in.contains(p + "step"))
      in.fail(
          fmt::format("'{}step' is {}, a stepped parameter's count is at least 1", p, s.steps[i]));
    s.exp_avg[i] =
        in.tensor(p + "exp_avg", params_[i].shape(), params_[i].dtype(), params_[i].device());
    s.exp_avg_sq[i] =
        in.tensor(p + "exp_avg_sq", params_[i].shape(), params_[i].dtype(), params_[i].device());
  }
  for (size_t g = 0; g < num_param_groups(); ++g) {
    const std::string p = fmt::format("param_groups.{}.", g);
    AdamOptions& o = s.options[g];
    s.lr[g] = read_group(in, g);
    const std::vector<double> betas = in.numbers(p + "betas", 2);
    o.beta1 = betas[0];
    o.beta2 = betas[1];
    o.eps = in.number(p + "eps");
    o.weight_decay = in.number(p + "weight_decay");
    const bool decoupled = in.flag(p + "decoupled_weight_decay");
    if (decoupled != o.decoupled_weight_decay && in.contains(p + "decoupled_weight_decay"))
      in.fail(fmt::format("'{}decoupled_weight_decay' is {}, this {} has {}", p, decoupled, op_,
                          o.decoupled_weight_decay));
    if (const std::string problem = invalid(o); !problem.empty())
      in.fail(fmt::format("group {}: {}", g, problem));
  }
  in.finish();
  return s;
}

void Adam::load_state_dict(const StateDict& state) {
  State s = read(state);
  lr_ = std::move(s.lr);
  options_ = std::move(s.options);
  steps_ = std::move(s.steps);
  exp_avg_ = std::move(s.exp_avg);
  exp_avg_sq_ = std::move(s.exp_avg_sq);
}

void Adam::check_state_dict(const StateDict& state) const { read(state); }

AdamW::AdamW(std::vector<Tensor> params, AdamWOptions options)
    : AdamW(std::vector<ParamGroup<AdamWOptions>>{{std::move(params), options}}) {}

AdamW::AdamW(std::vector<ParamGroup<AdamWOptions>> groups)
    : Adam(
          [&] {
            std::vector<ParamGroup<AdamOptions>> out;
            for (auto& [params, o] : groups)
              out.push_back(
                  {std::move(params), {o.lr, o.beta1, o.beta2, o.eps, o.weight_decay, true}});
            return out;
          }(),
          "AdamW") {}

std::vector<ParamGroup<AdamOptions>> AdamW::decoupled(std::vector<ParamGroup<AdamOptions>> g) {
  for (auto& group : g) group.options.decoupled_weight_decay = true;
  return g;
}

}  // namespace ember::optim
