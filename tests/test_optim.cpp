// Optimizers against torch.optim trajectories (golden/optim.json, Float64), parameter groups,
// state dicts (torch's names and values, resuming, every mismatch), clipping, and the
// optimizer's bookkeeping: skipped parameters, zero_grad, versions, bad options.
#include <cmath>
#include <functional>
#include <map>

#include "helpers.h"

using namespace ember;
using namespace ember::testing;
using optim::Adam;
using optim::AdamOptions;
using optim::SGD;
using optim::SGDOptions;

namespace {

using Factory = std::function<std::unique_ptr<optim::Optimizer>(std::vector<Tensor>)>;

template <class O, class Options>
Factory make(Options options) {
  return
      [=](std::vector<Tensor> params) { return std::make_unique<O>(std::move(params), options); };
}

// The configurations of gen_optim.py, same names and options.
const std::map<std::string, Factory>& configs() {
  static const std::map<std::string, Factory> table = {
      {"sgd", make<SGD>(SGDOptions{.lr = 0.1})},
      {"sgd_wd", make<SGD>(SGDOptions{.lr = 0.1, .weight_decay = 0.05})},
      {"sgd_momentum", make<SGD>(SGDOptions{.lr = 0.1, .momentum = 0.9})},
      {"sgd_dampening", make<SGD>(SGDOptions{.lr = 0.1, .momentum = 0.9, .dampening = 0.3})},
      {"sgd_nesterov", make<SGD>(SGDOptions{.lr = 0.1, .momentum = 0.8, .nesterov = true})},
      {"sgd_all",
       make<SGD>(SGDOptions{.lr = 0.05, .momentum = 0.7, .dampening = 0.1, .weight_decay = 0.02})},
      {"sgd_nesterov_wd",
       make<SGD>(SGDOptions{.lr = 0.05, .momentum = 0.9, .weight_decay = 0.1, .nesterov = true})},
      {"adam", make<Adam>(AdamOptions{.lr = 0.01})},
      {"adam_betas", make<Adam>(AdamOptions{.lr = 0.02, .beta1 = 0.8, .beta2 = 0.95, .eps = 1e-6})},
      {"adam_wd", make<Adam>(AdamOptions{.lr = 0.01, .weight_decay = 0.1})},
      {"adamw",
       make<Adam>(AdamOptions{.lr = 0.01, .weight_decay = 0.1, .decoupled_weight_decay = true})},
      {"adamw_betas", make<Adam>(AdamOptions{.lr = 0.03,
                                             .beta1 = 0.5,
                                             .beta2 = 0.9,
                                             .eps = 1e-4,
                                             .weight_decay = 0.5,
                                             .decoupled_weight_decay = true})},
  };
  return table;
}

constexpr int kSteps = 5;

// Replays a golden trajectory in `dtype` with the optimizer `factory` makes (by default the
// one of configs()), checking the parameters after every step.
void replay(const std::string& name, DType dtype, double rtol, double atol,
            const Factory& factory = {}) {
  const Golden golden("optim.json");
  std::vector<Tensor> params;
  for (int i = 0; i < 2; ++i)
    params.push_back(golden[fmt::format("{}.p{}.init", name, i)].to(dtype).requires_grad_());
  auto opt = factory ? factory(params) : configs().at(name)(params);
  for (int step = 0; step < kSteps; ++step) {
    opt->zero_grad();
    for (int i = 0; i < 2; ++i) {
      const std::string key = fmt::format("{}.p{}.grad{}", name, i, step);
      if (golden.contains(key)) params[i].set_grad(golden[key].to(dtype));
    }
    opt->step();
    for (int i = 0; i < 2; ++i)
      expect_close(params[i], golden[fmt::format("{}.p{}.after{}", name, i, step)].to(dtype), rtol,
                   atol, fmt::format("{} p{} step {}", name, i, step));
  }
}

// The two-group configurations of gen_optim.py (GROUP_CONFIGS): group 0 holds parameter 0, group
// 1 parameters 1 and 2. groups_adamw's group 0 takes AdamW's default weight_decay, as torch's.
const std::map<std::string, Factory>& group_configs() {
  using optim::ParamGroup;
  static const std::map<std::string, Factory> table = {
      {"groups_sgd",
       [](std::vector<Tensor> p) {
         return std::make_unique<SGD>(std::vector<ParamGroup<SGDOptions>>{
             {{p[0]}, {.lr = 0.1, .momentum = 0.9}},
             {{p[1], p[2]}, {.lr = 0.05, .momentum = 0.5, .weight_decay = 0.1, .nesterov = true}}});
       }},
      {"groups_adam",
       [](std::vector<Tensor> p) {
         return std::make_unique<Adam>(std::vector<ParamGroup<AdamOptions>>{
             {{p[0]}, {.lr = 0.01}},
             {{p[1], p[2]},
              {.lr = 0.03, .beta1 = 0.8, .beta2 = 0.95, .eps = 1e-6, .weight_decay = 0.1}}});
       }},
      {"groups_adamw",
       [](std::vector<Tensor> p) {
         return std::make_unique<optim::AdamW>(std::vector<ParamGroup<optim::AdamWOptions>>{
             {{p[0]}, {.lr = 0.01}},
             {{p[1], p[2]}, {.lr = 0.02, .beta1 = 0.5, .beta2 = 0.9, .weight_decay = 0.3}}});
       }},
  };
  return table;
}

constexpr int kGroupSteps = 4;

// The optimizer's state dict holds exactly torch's entries (gen_optim.py's flat_state_dict):
// the same names, dtypes and values.
void expect_optim_state_dict(const std::string& name, const optim::Optimizer& opt) {
  expect_torch_state_dict(Golden("optim.json"), name + ".state_dict.", opt.state_dict(), 1e-12,
                          name);
}

// Replays a grouped golden trajectory in Float64. With resume_at = k the optimizer is replaced
// before step k by a new one, on copies of the parameters and with another lr, that loads the
// old one's state dict: the trajectory must not notice.
void replay_groups(const std::string& name, int resume_at = -1) {
  const Golden golden("optim.json");
  const Factory& factory = group_configs().at(name);
  std::vector<Tensor> params;
  for (int i = 0; i < 3; ++i)
    params.push_back(golden[fmt::format("{}.p{}.init", name, i)].requires_grad_());
  auto opt = factory(params);
  for (int step = 0; step < kGroupSteps; ++step) {
    if (step == resume_at) {
      const optim::StateDict state = opt->state_dict();
      for (Tensor& p : params) p = p.detach().clone().requires_grad_();
      opt = factory(params);
      opt->set_lr(0.5);
      opt->load_state_dict(state);
    }
    opt->zero_grad();
    for (int i = 0; i < 3; ++i) {
      const std::string key = fmt::format("{}.p{}.grad{}", name, i, step);
      if (golden.contains(key)) params[i].set_grad(golden[key]);
    }
    opt->step();
    for (int i = 0; i < 3; ++i)
      expect_close(params[i], golden[fmt::format("{}.p{}.after{}", name, i, step)], 1e-12, 1e-12,
                   fmt::format("{} p{} step {} (resumed at {})", name, i, step, resume_at));
  }
  expect_optim_state_dict(name, *opt);
}

// The entries of a state dict, compared by name and value.
std::map<std::string, std::vector<double>> contents(const optim::StateDict& state) {
  std::map<std::string, std::vector<double>> out;
  for (const auto& [name, t] : state) out[name] = t.to_vector<double>();
  return out;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(test_optim)

BOOST_AUTO_TEST_CASE(trajectories_match_pytorch_float64) {
  for (const auto& [name, factory] : configs()) replay(name, kFloat64, 1e-6, 1e-6);
}

BOOST_AUTO_TEST_CASE(trajectories_float32_agree) {
  for (const auto& [name, factory] : configs()) replay(name, kFloat32, 1e-4, 1e-5);
}

BOOST_AUTO_TEST_CASE(skipped_parameter_keeps_value_and_state) {
  // Golden step 2 gives p1 no gradient: it must not move (checked against torch in replay);
  // here directly, for both optimizers with momentum-like state.
  for (const std::string name : {"sgd_momentum", "adam"}) {
    manual_seed(1);
    Tensor a = randn({4}, kFloat64).requires_grad_(), b = randn({4}, kFloat64).requires_grad_();
    auto opt = configs().at(name)({a, b});
    a.set_grad(ones({4}, kFloat64));
    opt->step();
    const std::vector<double> before = b.to_vector<double>();
    BOOST_TEST(b.grad().defined() == false);
    opt->step();
    BOOST_TEST((b.to_vector<double>() == before), name);
  }
}

BOOST_AUTO_TEST_CASE(zero_grad_makes_grads_undefined) {
  Tensor w = ones({2, 2}).requires_grad_();
  (w * w).sum().backward();
  BOOST_TEST(w.grad().defined());
  SGD opt({w}, {.lr = 0.1});
  opt.zero_grad();
  BOOST_TEST(!w.grad().defined());
  opt.step();  // no gradient: nothing happens
  BOOST_TEST(w.sum().item<double>() == 4.0);
}

BOOST_AUTO_TEST_CASE(lr_and_set_lr) {
  Tensor w = ones({3}, kFloat64).requires_grad_();
  SGD opt({w}, {.lr = 0.5});
  BOOST_TEST(opt.lr() == 0.5);
  opt.set_lr(0.25);
  BOOST_TEST(opt.lr() == 0.25);
  w.set_grad(full({3}, 2.0, kFloat64));
  opt.step();
  BOOST_TEST(w.to_vector<double>()[0] == 0.5);
  expect_error([&] { opt.set_lr(-1); }, {"set_lr", "-1"});
}

BOOST_AUTO_TEST_CASE(step_bumps_the_version) {
  // A graph that saved w cannot run backward after the optimizer changed w.
  Tensor w = full({3}, 2.0, kFloat64).requires_grad_();
  Tensor loss = (w * w).sum();
  w.set_grad(ones({3}, kFloat64));
  Adam opt({w});
  opt.step();
  expect_error([&] { loss.backward(); }, {"MulBackward"});
}

BOOST_AUTO_TEST_CASE(non_contiguous_parameter) {
  // A transposed leaf updates exactly as its contiguous twin.
  manual_seed(2);
  Tensor base = randn({3, 2}, kFloat64);
  Tensor view = base.transpose(0, 1).detach().requires_grad_();
  Tensor twin = base.transpose(0, 1).contiguous().detach().requires_grad_();
  BOOST_TEST(!view.is_contiguous());
  Tensor g = randn({2, 3}, kFloat64);
  Adam a({view}, {.lr = 0.1, .weight_decay = 0.1});
  Adam b({twin}, {.lr = 0.1, .weight_decay = 0.1});
  for (int i = 0; i < 3; ++i) {
    view.set_grad(g);
    twin.set_grad(g);
    a.step();
    b.step();
  }
  expect_close(view, twin, 0, 0);
  expect_close(base.transpose(0, 1), twin, 0, 0);  // the view wrote through to its base
}

BOOST_AUTO_TEST_CASE(bad_options) {
  Tensor w = ones({2}).requires_grad_();
  expect_error([&] { SGD({}, {.lr = 0.1}); }, {"SGD", "empty parameter list"});
  expect_error([&] { SGD({w}, {.lr = -0.1}); }, {"SGD", "learning rate", "-0.1"});
  expect_error([&] { SGD({w}, {.lr = 0.1, .nesterov = true}); }, {"SGD", "nesterov"});
  expect_error([&] { SGD({w, w}, {.lr = 0.1}); }, {"SGD", "appears twice"});
  expect_error([&] { SGD({w * 2}, {.lr = 0.1}); }, {"SGD", "not a leaf", "[2]"});
  expect_error([&] { Adam({zeros({2}, kInt64)}); }, {"Adam", "Int64"});
  expect_error([&] { Adam({w}, {.beta1 = 1.0}); }, {"Adam", "beta1"});
  expect_error([&] { Adam({w}, {.beta2 = -0.5}); }, {"Adam", "beta2"});
}

BOOST_AUTO_TEST_CASE(param_groups_match_pytorch) {
  for (const auto& [name, factory] : group_configs()) replay_groups(name);
}

BOOST_AUTO_TEST_CASE(resumed_from_state_dict_as_uninterrupted) {
  for (const auto& [name, factory] : group_configs())
    for (int at : {1, 2, 3}) replay_groups(name, at);
}

BOOST_AUTO_TEST_CASE(param_groups_lr) {
  Tensor a = ones({2}, kFloat64).requires_grad_(), b = ones({3}, kFloat64).requires_grad_(),
         c = ones({1}, kFloat64).requires_grad_();
  SGD opt({{{a}, {.lr = 0.1}}, {{b, c}, {.lr = 0.2, .momentum = 0.5}}});
  BOOST_TEST(opt.num_param_groups() == 2u);
  BOOST_TEST(opt.params().size() == 3u);
  BOOST_TEST(opt.params()[2].same(c));
  BOOST_TEST(opt.lr() == 0.1);
  BOOST_TEST(opt.lr(1) == 0.2);
  BOOST_TEST(opt.options(1).momentum == 0.5);
  opt.set_lr(1, 0.3);
  BOOST_TEST(opt.lr(0) == 0.1);
  BOOST_TEST(opt.options(1).lr == 0.3);
  for (const Tensor& p : {a, b, c}) p.set_grad(ones_like(p));
  opt.step();  // each group with its own lr
  BOOST_TEST(a.to_vector<double>()[0] == 1 - 0.1);
  BOOST_TEST(c.to_vector<double>()[0] == 1 - 0.3);
  opt.set_lr(0.05);
  BOOST_TEST(opt.lr(0) == 0.05);
  BOOST_TEST(opt.lr(1) == 0.05);
  expect_error([&] { opt.lr(2); }, {"lr", "group 2", "2 parameter groups"});
  expect_error([&] { opt.set_lr(2, 0.1); }, {"set_lr", "group 2"});
  expect_error([&] { opt.set_lr(1, NAN); }, {"set_lr", "nan"});
  expect_error([&] { SGD({{{a}, {.lr = 0.1}}, {{b, a}, {.lr = 0.1}}}); }, {"SGD", "appears twice"});
  using Groups = std::vector<optim::ParamGroup<AdamOptions>>;
  expect_error(
      [&] {
        Adam(Groups{{{a}, {}}, {{}, {}}});
      },
      {"Adam", "empty parameter list", "group 1"});
  expect_error([&] { Adam({{{a}, {}}, {{b}, {.beta2 = 1}}}); }, {"Adam", "beta2", "group 1"});
}

BOOST_AUTO_TEST_CASE(adamw_defaults_and_trajectories) {
  Tensor w = ones({2}).requires_grad_();
  const AdamOptions defaults = optim::AdamW({w}).options();
  BOOST_TEST(defaults.lr == 1e-3);
  BOOST_TEST(defaults.weight_decay == 1e-2);  // torch.optim.AdamW's default
  BOOST_TEST(defaults.decoupled_weight_decay);
  BOOST_TEST(optim::AdamW({w}, {.lr = 0.01}).options().weight_decay == 1e-2);
  // An AdamOptions value is taken as given, but AdamW always decouples.
  const AdamOptions given = optim::AdamW({w}, AdamOptions{.lr = 0.01}).options();
  BOOST_TEST(given.weight_decay == 0.0);
  BOOST_TEST(given.decoupled_weight_decay);
  const std::vector<optim::ParamGroup<AdamOptions>> groups = {{{w}, {.weight_decay = 0.2}}};
  BOOST_TEST(optim::AdamW(groups).options().decoupled_weight_decay);
  // The golden AdamW trajectories, now through the AdamW class.
  replay("adamw", kFloat64, 1e-6, 1e-6,
         make<optim::AdamW>(optim::AdamWOptions{.lr = 0.01, .weight_decay = 0.1}));
  replay("adamw_betas", kFloat64, 1e-6, 1e-6,
         make<optim::AdamW>(AdamOptions{
             .lr = 0.03, .beta1 = 0.5, .beta2 = 0.9, .eps = 1e-4, .weight_decay = 0.5}));
}

BOOST_AUTO_TEST_CASE(state_appears_with_the_first_step) {
  // As torch: a parameter never stepped has no state entries; loading a state without them
  // clears that parameter's state.
  Tensor a = ones({2}, kFloat64).requires_grad_(), b = ones({3}, kFloat64).requires_grad_();
  for (const std::string name : {"sgd_momentum", "adam"}) {
    auto opt = configs().at(name)({a, b});
    const optim::StateDict fresh = opt->state_dict();
    for (const auto& [key, t] : fresh) BOOST_TEST(key.starts_with("param_groups.0."), key);
    a.set_grad(ones({2}, kFloat64));
    opt->step();
    const auto stepped = contents(opt->state_dict());
    BOOST_TEST(stepped.contains(name == "adam" ? "state.0.exp_avg" : "state.0.momentum_buffer"));
    if (name == "adam") BOOST_TEST(stepped.at("state.0.step") == std::vector<double>{1});
    for (const auto& [key, v] : stepped) BOOST_TEST(!key.starts_with("state.1."), key);
    opt->load_state_dict(fresh);
    BOOST_TEST((contents(opt->state_dict()) == contents(fresh)));
  }
}

BOOST_AUTO_TEST_CASE(load_state_dict_mismatches) {
  const auto leaves = [] {
    return std::vector<Tensor>{zeros({2, 3}, kFloat64).requires_grad_(),
                               zeros({3}, kFloat64).requires_grad_(),
                               zeros({4}, kFloat64).requires_grad_()};
  };
  const auto adam = [](const std::vector<Tensor>& p) {
    return Adam({{{p[0]}, {.lr = 0.01}}, {{p[1], p[2]}, {.lr = 0.02}}});
  };
  std::vector<Tensor> p = leaves();
  Adam source = adam(p);
  for (const Tensor& t : p) t.set_grad(ones_like(t));
  source.step();
  const optim::StateDict good = source.state_dict();

  std::vector<Tensor> q = leaves();
  Adam target = adam(q);
  q[0].set_grad(ones_like(q[0]));
  target.step();
  const auto before = contents(target.state_dict());
  // Each edit of the good state dict must be refused naming what, leaving target unchanged.
  const auto refused = [&](const std::function<void(optim::StateDict&)>& edit,
                           std::initializer_list<std::string> parts, optim::Optimizer& opt) {
    optim::StateDict state = good;
    edit(state);
    const auto was = contents(opt.state_dict());
    expect_error([&] { opt.check_state_dict(state); }, parts);
    expect_error([&] { opt.load_state_dict(state); }, parts);
    BOOST_TEST((contents(opt.state_dict()) == was));
  };
  const auto erase = [](const std::string& name) {
    return [=](optim::StateDict& s) {
      std::erase_if(s, [&](const auto& entry) { return entry.first == name; });
    };
  };
  const auto set = [](const std::string& name, Tensor value) {
    return [=](optim::StateDict& s) {
      for (auto& [key, t] : s)
        if (key == name) t = value;
    };
  };
  const auto add = [](const std::string& name, Tensor value) {
    return [=](optim::StateDict& s) { s.emplace_back(name, value); };
  };
  refused(erase("state.1.exp_avg"), {"Adam::load_state_dict", "missing state.1.exp_avg"}, target);
  refused(erase("param_groups.1.eps"), {"missing param_groups.1.eps"}, target);
  refused(add("state.3.exp_avg", zeros({1}, kFloat64)), {"unexpected state.3.exp_avg"}, target);
  refused(add("state.0.step", optim::state_integer(1)), {"'state.0.step' appears twice"}, target);
  refused(set("state.0.exp_avg", zeros({3, 2}, kFloat64)),
          {"'state.0.exp_avg'", "[3, 2]", "expected Float64 of shape [2, 3]"}, target);
  refused(set("state.2.exp_avg_sq", zeros({4})), {"'state.2.exp_avg_sq' is Float32"}, target);
  refused(set("state.0.step", optim::state_number(1)), {"'state.0.step' is Float64", "Int64"},
          target);
  refused(set("state.0.step", optim::state_integer(0)), {"'state.0.step' is 0"}, target);
  refused(set("param_groups.1.lr", optim::state_number(-1)), {"param_groups.1.lr", "-1"}, target);
  refused(set("param_groups.0.betas", optim::state_numbers({1.5, 0.9})), {"group 0", "beta1 1.5"},
          target);
  refused(set("param_groups.0.betas", optim::state_number(0.9)), {"'param_groups.0.betas'"},
          target);
  refused(set("param_groups.1.params", optim::state_integers({2, 1})),
          {"'param_groups.1.params' is [2, 1]", "indices 1 to 2"}, target);
  refused(set("param_groups.0.decoupled_weight_decay", optim::state_flag(true)),
          {"decoupled_weight_decay' is true, this Adam has false"}, target);
  BOOST_TEST((contents(target.state_dict()) == before));

  // Other group layouts: sizes, count.
  std::vector<Tensor> r = leaves();
  Adam regrouped({{{r[0], r[1]}, {}}, {{r[2]}, {}}});
  refused([](optim::StateDict&) {}, {"'param_groups.0.params' is Int64 of shape [1]", "[2]"},
          regrouped);
  Adam one_group(leaves());
  refused([](optim::StateDict&) {}, {"more than the optimizer's 1 parameter groups"}, one_group);
  std::vector<Tensor> w = leaves();
  SGD sgd({{{w[0]}, {.lr = 0.1}}, {{w[1], w[2]}, {.lr = 0.1}}});
  refused([](optim::StateDict&) {},
          {"SGD::load_state_dict", "missing param_groups.0.momentum",
           "unexpected param_groups.0.betas"},
          sgd);
  optim::AdamW adamw({{{w[0]}, {}}, {{w[1], w[2]}, {}}});
  refused([](optim::StateDict&) {}, {"AdamW::load_state_dict", "is false, this AdamW has true"},
          adamw);

  target.check_state_dict(good);
  BOOST_TEST((contents(target.state_dict()) == before));
  target.load_state_dict(good);
  BOOST_TEST((contents(target.state_dict()) == contents(good)));
  // The loaded state is a copy: stepping the source does not move the target's.
  source.step();
  BOOST_TEST((contents(target.state_dict()) != contents(source.state_dict())));
}

BOOST_AUTO_TEST_CASE(custom_optimizer_gets_the_base_state_dict) {
  // An optimizer derived outside the library needs only step(): its state dict holds the
  // groups' lr and params, and it has no momentum to cycle.
  struct Plain : optim::Optimizer {
    explicit Plain(std::vector<Tensor> params) : Optimizer(std::move(params), 0.1, "Plain") {}
    void step() override {}
  };
  Tensor w = ones({2}).requires_grad_();
  Plain opt({w});
  const optim::StateDict state = opt.state_dict();
  BOOST_TEST(state.size() == 2u);
  BOOST_TEST(state[0].first == "param_groups.0.lr");
  BOOST_TEST(state[1].first == "param_groups.0.params");
  opt.set_lr(0.7);
  opt.load_state_dict(state);
  BOOST_TEST(opt.lr() == 0.1);
  expect_error([&] { opt.load_state_dict({}); }, {"Plain::load_state_dict", "missing"});
  expect_error([&] { opt.momentum(0); }, {"Plain", "no momentum"});
  expect_error([&] { optim::OneCycleLR(opt, 0.1, 10); }, {"Plain", "no momentum"});
}

BOOST_AUTO_TEST_CASE(clip_grad_norm_matches_pytorch) {
  const Golden golden("optim.json");
  for (int k = 0; k < 2; ++k) {
    std::vector<Tensor> params = {zeros({3, 4}, kFloat64).requires_grad_(),
                                  zeros({5}, kFloat64).requires_grad_(),
                                  zeros({2}, kFloat64).requires_grad_()};  // no grad: skipped
    for (int i = 0; i < 2; ++i) params[i].set_grad(golden[fmt::format("clip{}.grad{}", k, i)]);
    const double max_norm = golden[fmt::format("clip{}.max_norm", k)].item<double>();
    const double total = optim::clip_grad_norm_(params, max_norm);
    BOOST_TEST(total == golden[fmt::format("clip{}.total", k)].item<double>(),
               boost::test_tools::tolerance(1e-12));
    for (int i = 0; i < 2; ++i)
      expect_close(params[i].grad(), golden[fmt::format("clip{}.clipped{}", k, i)], 1e-12, 1e-12);
    BOOST_TEST(!params[2].grad().defined());
  }
  // after clipping, the norm is max_norm (up to the 1e-6 guard)
  Tensor w = zeros({4}).requires_grad_();
  w.set_grad(tensor({3, 4, 0, 0}));
  BOOST_TEST(optim::clip_grad_norm_({w}, 1.0) == 5.0, boost::test_tools::tolerance(1e-6));
  BOOST_TEST(w.grad().pow(2).sum().sqrt().item<double>() == 1.0,
             boost::test_tools::tolerance(1e-5));
  expect_error([&] { optim::clip_grad_norm_({w}, -1.0); }, {"clip_grad_norm_", "-1"});
}

BOOST_AUTO_TEST_CASE(clip_grad_norm_orders_and_nonfinite_gradients) {
  Tensor a = zeros({3}, kFloat64).requires_grad_(), b = zeros({2}, kFloat64).requires_grad_();
  a.set_grad(tensor({1, -4, 2}, kFloat64));
  b.set_grad(tensor({-3, 0}, kFloat64));
  BOOST_TEST(optim::clip_grad_norm_({a, b}, 100.0, INFINITY) == 4.0);
  const double p3 = std::cbrt(1.0 + 64 + 8 + 27);
  BOOST_TEST(optim::clip_grad_norm_({a, b}, 100.0, 3.0) == p3, boost::test_tools::tolerance(1e-12));
  // As torch: a NaN gradient makes the total NaN and every gradient NaN (nothing silently
  // unscaled), and error_if_nonfinite refuses it.
  b.set_grad(tensor({NAN, 0}, kFloat64));
  expect_error(
      [&] {
        optim::clip_grad_norm_({a, b}, 1.0, 2.0, true);
      },
      {"clip_grad_norm_", "nan", "error_if_nonfinite"});
  BOOST_TEST(std::isnan(optim::clip_grad_norm_({a, b}, 1.0)));
  for (double v : a.grad().to_vector<double>()) BOOST_TEST(std::isnan(v));
}

BOOST_AUTO_TEST_SUITE_END()
