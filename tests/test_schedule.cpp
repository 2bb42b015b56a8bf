// Learning-rate schedules: the Noam rate, and every LRScheduler against torch's values per
// epoch (golden/sched.json, two parameter groups; OneCycleLR's momentum too), resumed from state
// dicts, their state dicts' names and mismatches, and bad arguments.
#include <cmath>
#include <functional>
#include <memory>

#include "helpers.h"

using namespace ember;
using namespace ember::testing;
using namespace ember::optim;

namespace {

using SchedulerFactory = std::function<std::shared_ptr<LRScheduler>(Optimizer&)>;

struct Case {
  std::string name;
  bool adam;  // else SGD
  SchedulerFactory make;
  int steps;
};

// gen_sched.py's optimizers: groups with lr 0.1 and 0.02.
std::unique_ptr<Optimizer> make_optimizer(bool adam) {
  Tensor a = zeros({2}).requires_grad_(), b = zeros({3}).requires_grad_();
  if (adam)
    return std::make_unique<Adam>(std::vector<ParamGroup<AdamOptions>>{
        {{a}, {.lr = 0.1}}, {{b}, {.lr = 0.02, .beta1 = 0.8, .beta2 = 0.99}}});
  return std::make_unique<SGD>(std::vector<ParamGroup<SGDOptions>>{
      {{a}, {.lr = 0.1, .momentum = 0.9}}, {{b}, {.lr = 0.02}}});
}

template <class S, class... Args>
SchedulerFactory make(Args... args) {
  return [=](Optimizer& o) { return std::make_shared<S>(o, args...); };
}

// gen_sched.py's CONFIGS, same names and arguments.
const std::vector<Case>& cases() {
  static const std::vector<Case> table = {
      {"lambda", false,
       [](Optimizer& o) {
         return std::make_shared<LambdaLR>(o, [](int64_t k) {
           return std::pow(0.95, static_cast<double>(k)) * static_cast<double>(1 + k % 3);
         });
       },
       20},
      {"step", false, make<StepLR>(int64_t{3}, 0.5), 20},
      {"step_default", false, make<StepLR>(int64_t{4}), 20},
      {"cosine", false, make<CosineAnnealingLR>(int64_t{8}, 0.001), 20},
      {"cosine_default", false, make<CosineAnnealingLR>(int64_t{10}), 20},
      {"linear", false, make<LinearLR>(0.25, 1.0, int64_t{6}), 20},
      {"linear_default", false, make<LinearLR>(), 20},
      {"linear_down", false, make<LinearLR>(1.0, 0.1, int64_t{10}), 20},
      {"onecycle_adam", true, make<OneCycleLR>(0.5, int64_t{20}), 20},
      {"onecycle_sgd", false, make<OneCycleLR>(0.3, int64_t{16}, 0.25, 10.0, 100.0), 16},
      {"sequential", false,
       [](Optimizer& o) {
         return std::make_shared<SequentialLR>(
             o,
             std::vector<std::shared_ptr<LRScheduler>>{
                 std::make_shared<LinearLR>(o, 0.1, 1.0, 4),
                 std::make_shared<CosineAnnealingLR>(o, 10, 0.001)},
             std::vector<int64_t>{5});
       },
       20},
      {"sequential3", false,
       [](Optimizer& o) {
         return std::make_shared<SequentialLR>(
             o,
             std::vector<std::shared_ptr<LRScheduler>>{std::make_shared<LinearLR>(o, 0.5, 1.0, 3),
                                                       std::make_shared<StepLR>(o, 2, 0.5),
                                                       std::make_shared<CosineAnnealingLR>(o, 6)},
             std::vector<int64_t>{4, 10});
       },
       20},
  };
  return table;
}

// The optimizer's lrs (and OneCycleLR's momentum) at `epoch` are torch's.
void expect_epoch(const Case& c, const Golden& golden, const Optimizer& opt,
                  const LRScheduler& scheduler, int epoch, const std::string& when = "") {
  const std::string what = fmt::format("{} epoch {}{}", c.name, epoch, when);
  BOOST_TEST(scheduler.last_epoch() == epoch, what);
  for (size_t g = 0; g < 2; ++g) {
    const double expected = golden[fmt::format("{}.lr{}", c.name, g)].to_vector<double>()[epoch];
    BOOST_TEST(opt.lr(g) == expected,
               what << " group " << g << boost::test_tools::tolerance(1e-12));
    BOOST_TEST(scheduler.get_last_lr()[g] == opt.lr(g), what);
    const std::string momentum = fmt::format("{}.momentum{}", c.name, g);
    if (golden.contains(momentum))
      BOOST_TEST(opt.momentum(g) == golden[momentum].to_vector<double>()[epoch],
                 what << " momentum " << g << boost::test_tools::tolerance(1e-12));
  }
}

std::map<std::string, std::vector<double>> contents(const StateDict& state) {
  std::map<std::string, std::vector<double>> out;
  for (const auto& [name, t] : state) out[name] = t.to_vector<double>();
  return out;
}

std::vector<std::string> names(const StateDict& state) {
  std::vector<std::string> out;
  for (const auto& [name, t] : state) out.push_back(name);
  return out;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(test_schedule)

BOOST_AUTO_TEST_CASE(noam_rate) {
  // The Annotated Transformer: rate(step) = factor * d^-0.5 * min(step^-0.5, step * warmup^-1.5)
  const auto expected = [](double step, double d, double factor, double warmup) {
    return factor * std::pow(d, -0.5) *
           std::min(std::pow(step, -0.5), step * std::pow(warmup, -1.5));
  };
  BOOST_TEST(rate(0, 512, 1.0, 4000) == rate(1, 512, 1.0, 4000));
  BOOST_TEST(rate(1, 512, 1.0, 4000) == expected(1, 512, 1.0, 4000));
  BOOST_TEST(rate(100, 512, 2.0, 400) == expected(100, 512, 2.0, 400));
  BOOST_TEST(rate(4000, 512, 1.0, 4000) == expected(4000, 512, 1.0, 4000));
  // rises linearly during warmup, peaks at step == warmup, then decays as step^-0.5
  BOOST_TEST(rate(200, 512, 1, 400) < rate(400, 512, 1, 400));
  BOOST_TEST(rate(800, 512, 1, 400) < rate(400, 512, 1, 400));
  BOOST_TEST(rate(800, 512, 1, 400) == std::pow(512, -0.5) * std::pow(800, -0.5),
             boost::test_tools::tolerance(1e-12));
  expect_error([] { rate(1, 512, 1, 0); }, {"rate", "warmup", "0"});
  expect_error([] { rate(-1, 512, 1, 10); }, {"rate", "step", "-1"});
}

BOOST_AUTO_TEST_CASE(lambda_lr_as_pytorch) {
  Tensor w = ones({2}).requires_grad_();
  SGD opt({w}, {.lr = 2.0});
  LambdaLR scheduler(opt, [](int64_t k) { return rate(k, 16, 1.0, 3); });
  BOOST_TEST(scheduler.base_lr() == 2.0);
  BOOST_TEST(opt.lr() == 2.0 * rate(0, 16, 1.0, 3));  // f(0) applied at construction
  for (int64_t k = 1; k <= 6; ++k) {
    scheduler.step();
    BOOST_TEST(scheduler.last_epoch() == k);
    BOOST_TEST(opt.lr() == 2.0 * rate(k, 16, 1.0, 3));
    BOOST_TEST((scheduler.get_last_lr() == std::vector<double>{opt.lr()}));
  }
}

BOOST_AUTO_TEST_CASE(schedules_match_pytorch) {
  const Golden golden("sched.json");
  for (const Case& c : cases()) {
    auto opt = make_optimizer(c.adam);
    auto scheduler = c.make(*opt);
    for (int epoch = 0; epoch <= c.steps; ++epoch) {
      if (epoch > 0) {
        opt->step();
        scheduler->step();
      }
      expect_epoch(c, golden, *opt, *scheduler, epoch);
    }
  }
}

BOOST_AUTO_TEST_CASE(resumed_from_state_dicts_as_uninterrupted) {
  // A new optimizer and scheduler (whose construction set other lrs and momenta) load the old
  // ones' state dicts and go on with torch's values.
  const Golden golden("sched.json");
  for (const Case& c : cases())
    for (int at : {1, 4, 5, 9}) {
      auto opt = make_optimizer(c.adam);
      auto scheduler = c.make(*opt);
      for (int epoch = 1; epoch <= at; ++epoch) scheduler->step();
      const StateDict opt_state = opt->state_dict(), state = scheduler->state_dict();
      opt = make_optimizer(c.adam);
      scheduler = c.make(*opt);
      opt->load_state_dict(opt_state);
      scheduler->load_state_dict(state);
      expect_epoch(c, golden, *opt, *scheduler, at, fmt::format(" (resumed at {})", at));
      for (int epoch = at + 1; epoch <= c.steps; ++epoch) {
        scheduler->step();
        expect_epoch(c, golden, *opt, *scheduler, epoch, fmt::format(" (resumed at {})", at));
      }
    }
}

BOOST_AUTO_TEST_CASE(state_dict_names) {
  auto opt = make_optimizer(false);
  StepLR step(*opt, 3, 0.5);
  step.step();
  const StateDict state = step.state_dict();
  BOOST_TEST((names(state) == std::vector<std::string>{"base_lrs", "last_epoch", "_last_lr",
                                                       "step_size", "gamma"}));
  BOOST_TEST(state[0].second.dtype() == kFloat64);
  BOOST_TEST((state[0].second.shape() == Shape{2}));
  BOOST_TEST(state[1].second.dtype() == kInt64);
  BOOST_TEST(state[1].second.dim() == 0);
  BOOST_TEST(state[1].second.item<int64_t>() == 1);
  BOOST_TEST((state[2].second.to_vector<double>() == step.get_last_lr()));

  auto opt2 = make_optimizer(false);
  SequentialLR seq(*opt2, {std::make_shared<LinearLR>(*opt2), std::make_shared<StepLR>(*opt2, 2)},
                   {3});
  const auto all = contents(seq.state_dict());
  for (const std::string name :
       {"last_epoch", "_milestones", "_schedulers.0.last_epoch", "_schedulers.0.start_factor",
        "_schedulers.1.base_lrs", "_schedulers.1.gamma"})
    BOOST_TEST(all.contains(name), name);
  BOOST_TEST((all.at("_milestones") == std::vector<double>{3}));
}

BOOST_AUTO_TEST_CASE(load_state_dict_mismatches) {
  auto opt = make_optimizer(false);
  StepLR saved(*opt, 3, 0.5);
  for (int i = 0; i < 4; ++i) saved.step();
  const StateDict good = saved.state_dict();

  auto opt2 = make_optimizer(false);
  StepLR target(*opt2, 3, 0.5);
  const auto before = contents(target.state_dict());
  const auto refused = [&](const StateDict& state, std::initializer_list<std::string> parts,
                           LRScheduler& s) {
    const auto was = contents(s.state_dict());
    expect_error([&] { s.check_state_dict(state); }, parts);
    expect_error([&] { s.load_state_dict(state); }, parts);
    BOOST_TEST((contents(s.state_dict()) == was));
  };
  const auto with = [&](const std::string& name, const Tensor& value) {
    StateDict state = good;
    for (auto& [key, t] : state)
      if (key == name) t = value;
    return state;
  };
  refused(with("gamma", state_number(0.1)),
          {"StepLR::load_state_dict", "'gamma' is 0.1", "this StepLR has 0.5"}, target);
  refused(with("last_epoch", state_integer(-3)), {"'last_epoch' is -3"}, target);
  refused(with("last_epoch", state_number(4)), {"'last_epoch' is Float64", "Int64"}, target);
  refused(with("base_lrs", state_numbers({0.1})), {"'base_lrs'", "shape [1]", "shape [2]"}, target);
  StateDict extra = good;
  extra.emplace_back("T_max", state_integer(3));
  refused(extra, {"unexpected T_max"}, target);
  CosineAnnealingLR cosine(*opt2, 3);
  refused(good,
          {"CosineAnnealingLR::load_state_dict", "missing T_max, eta_min",
           "unexpected gamma, step_size"},
          cosine);
  StepLR other(*opt2, 2, 0.5);
  refused(good, {"'step_size' is 3, this StepLR has 2"}, other);
  BOOST_TEST((contents(target.state_dict()) == before));
  target.load_state_dict(good);
  BOOST_TEST((contents(target.state_dict()) == contents(good)));
  BOOST_TEST(target.last_epoch() == 4);
}

BOOST_AUTO_TEST_CASE(bad_arguments) {
  auto opt = make_optimizer(false);
  auto other = make_optimizer(false);
  expect_error([&] { StepLR(*opt, 0); }, {"StepLR", "step_size", "0"});
  expect_error([&] { CosineAnnealingLR(*opt, -1); }, {"CosineAnnealingLR", "T_max", "-1"});
  expect_error([&] { LinearLR(*opt, 0.0); }, {"LinearLR", "start_factor"});
  expect_error([&] { LinearLR(*opt, 0.5, 1.5); }, {"LinearLR", "end_factor", "1.5"});
  expect_error([&] { LinearLR(*opt, 0.5, 1.0, 0); }, {"LinearLR", "total_iters"});
  expect_error([&] { OneCycleLR(*opt, 0.1, 0); }, {"OneCycleLR", "total_steps"});
  expect_error([&] { OneCycleLR(*opt, 0.1, 10, 1.5); }, {"OneCycleLR", "pct_start", "1.5"});
  expect_error([&] { LambdaLR(*opt, nullptr); }, {"LambdaLR", "empty"});
  auto a = std::make_shared<StepLR>(*opt, 2), b = std::make_shared<StepLR>(*opt, 3);
  expect_error([&] { SequentialLR(*opt, {a, b}, {}); }, {"SequentialLR", "2 schedulers", "1"});
  expect_error([&] { SequentialLR(*opt, {a, nullptr}, {2}); }, {"SequentialLR", "1 is null"});
  expect_error([&] { SequentialLR(*other, {a, b}, {2}); }, {"SequentialLR", "another optimizer"});
  expect_error([&] { SequentialLR(*opt, {a, b, a}, {4, 2}); }, {"SequentialLR", "increasing"});

  // As torch, OneCycleLR refuses to step past total_steps; the failed step changes nothing.
  OneCycleLR cycle(*opt, 0.1, 3);
  for (int i = 0; i < 3; ++i) cycle.step();
  const double lr = opt->lr(1);
  expect_error([&] { cycle.step(); }, {"OneCycleLR", "tried to step 5 times", "total steps is 3"});
  BOOST_TEST(cycle.last_epoch() == 3);
  BOOST_TEST(opt->lr(1) == lr);
}

BOOST_AUTO_TEST_SUITE_END()
