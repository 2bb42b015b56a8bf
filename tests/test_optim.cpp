// Optimizers against torch.optim trajectories (golden/optim.json, Float64), schedules, clipping,
// and the optimizer's bookkeeping: skipped parameters, zero_grad, versions, bad options.
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

// Replays a golden trajectory in `dtype`; returns the parameters after every step.
void replay(const std::string& name, DType dtype, double rtol, double atol) {
  const Golden golden("optim.json");
  std::vector<Tensor> params;
  for (int i = 0; i < 2; ++i)
    params.push_back(golden[fmt::format("{}.p{}.init", name, i)].to(dtype).requires_grad_());
  auto opt = configs().at(name)(params);
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

BOOST_AUTO_TEST_CASE(noam_rate) {
  // The Annotated Transformer: rate(step) = factor * d^-0.5 * min(step^-0.5, step * warmup^-1.5)
  const auto expected = [](double step, double d, double factor, double warmup) {
    return factor * std::pow(d, -0.5) *
           std::min(std::pow(step, -0.5), step * std::pow(warmup, -1.5));
  };
  BOOST_TEST(optim::rate(0, 512, 1.0, 4000) == optim::rate(1, 512, 1.0, 4000));
  BOOST_TEST(optim::rate(1, 512, 1.0, 4000) == expected(1, 512, 1.0, 4000));
  BOOST_TEST(optim::rate(100, 512, 2.0, 400) == expected(100, 512, 2.0, 400));
  BOOST_TEST(optim::rate(4000, 512, 1.0, 4000) == expected(4000, 512, 1.0, 4000));
  // rises linearly during warmup, peaks at step == warmup, then decays as step^-0.5
  BOOST_TEST(optim::rate(200, 512, 1, 400) < optim::rate(400, 512, 1, 400));
  BOOST_TEST(optim::rate(800, 512, 1, 400) < optim::rate(400, 512, 1, 400));
  BOOST_TEST(optim::rate(800, 512, 1, 400) == std::pow(512, -0.5) * std::pow(800, -0.5),
             boost::test_tools::tolerance(1e-12));
  expect_error([] { optim::rate(1, 512, 1, 0); }, {"rate", "warmup", "0"});
  expect_error([] { optim::rate(-1, 512, 1, 10); }, {"rate", "step", "-1"});
}

BOOST_AUTO_TEST_CASE(lambda_lr_as_pytorch) {
  Tensor w = ones({2}).requires_grad_();
  SGD opt({w}, {.lr = 2.0});
  optim::LambdaLR scheduler(opt, [](int64_t k) { return optim::rate(k, 16, 1.0, 3); });
  BOOST_TEST(scheduler.base_lr() == 2.0);
  BOOST_TEST(opt.lr() == 2.0 * optim::rate(0, 16, 1.0, 3));  // f(0) applied at construction
  for (int64_t k = 1; k <= 6; ++k) {
    scheduler.step();
    BOOST_TEST(scheduler.last_epoch() == k);
    BOOST_TEST(opt.lr() == 2.0 * optim::rate(k, 16, 1.0, 3));
    BOOST_TEST(scheduler.get_last_lr() == opt.lr());
  }
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
