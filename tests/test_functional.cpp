// torch.autograd.grad to third order and torch.autograd.functional (vjp, jvp, hvp, vhp,
// jacobian, hessian) against PyTorch's values (golden/functional.json, from
// golden/gen_functional.py); their semantics (caller's tensors untouched, zeros for unused
// inputs, detached results unless create_graph) and errors.
#include <vector>

#include <boost/test/unit_test.hpp>

#include "tests/helpers.h"

using namespace ember;
using namespace ember::testing;
namespace F = ember::autograd::functional;

namespace {

const Golden& golden() {
  static const Golden g("functional.json");
  return g;
}

Tensor f(const std::vector<Tensor>& in) {  // (3, 2)
  return tanh(matmul(in[0], in[1])) * in[0].sum();
}

Tensor scalar(const std::vector<Tensor>& in) {  // one element
  const Tensor xw = matmul(in[0], in[1]);
  return pow(tanh(xw), 2).sum() + (sin(in[0]) * in[0]).sum() + exp(xw).mean();
}

Tensor s(const Tensor& x) {
  const Tensor& w = golden()["w"];
  return pow(x, 3).sum() * sin(x).sum() + pow(tanh(matmul(x, w)), 2).sum();
}

constexpr double kRtol = 1e-11, kAtol = 1e-12;

}  // namespace

BOOST_AUTO_TEST_SUITE(test_functional)

BOOST_AUTO_TEST_CASE(grad_to_third_order_matches_pytorch) {
  const Golden& g = golden();
  const Tensor x = g["x"].requires_grad_(), w = g["w"].requires_grad_();
  const Tensor y = scalar({x, w});
  const std::vector<Tensor> first = autograd::grad({y}, {x, w}, {}, std::nullopt, true);
  expect_close(first[0], g["grad.gx"], kRtol, kAtol, "gx");
  expect_close(first[1], g["grad.gw"], kRtol, kAtol, "gw");
  // A gradient penalty: the first derivatives' squared norm, differentiated again.
  const Tensor penalty = (first[0] * first[0]).sum() + (first[1] * first[1]).sum();
  const std::vector<Tensor> second = autograd::grad({penalty}, {x, w}, {}, std::nullopt, true);
  expect_close(second[0], g["grad.penalty_x"], kRtol, kAtol, "penalty x");
  expect_close(second[1], g["grad.penalty_w"], kRtol, kAtol, "penalty w");
  const Tensor third = autograd::grad({sin(second[0]).sum()}, {w})[0];
  expect_close(third, g["grad.third_w"], kRtol, kAtol, "third");
  BOOST_TEST(!third.requires_grad());
  BOOST_TEST(!x.grad().defined());
  BOOST_TEST(!w.grad().defined());
}

BOOST_AUTO_TEST_CASE(functional_matches_pytorch) {
  const Golden& g = golden();
  const Tensor x = g["x"], w = g["w"], vx = g["vx"], vw = g["vw"];
  const F::VJP a = F::vjp(f, {x, w}, g["v_out"]);
  expect_close(a.output, g["vjp.out"], kRtol, kAtol, "vjp output");
  expect_close(a.vjp[0], g["vjp.x"], kRtol, kAtol, "vjp x");
  expect_close(a.vjp[1], g["vjp.w"], kRtol, kAtol, "vjp w");
  const F::JVP b = F::jvp(f, {x, w}, {vx, vw});
  expect_close(b.output, g["jvp.out"], kRtol, kAtol, "jvp output");
  expect_close(b.jvp, g["jvp.jvp"], kRtol, kAtol, "jvp");
  const F::HVP c = F::hvp(scalar, {x, w}, {vx, vw});
  expect_close(c.output, g["hvp.out"], kRtol, kAtol, "hvp output");
  expect_close(c.hvp[0], g["hvp.x"], kRtol, kAtol, "hvp x");
  expect_close(c.hvp[1], g["hvp.w"], kRtol, kAtol, "hvp w");
  const F::HVP d = F::vhp(scalar, {x, w}, {vx, vw});
  expect_close(d.hvp[0], g["vhp.x"], kRtol, kAtol, "vhp x");
  expect_close(d.hvp[1], g["vhp.w"], kRtol, kAtol, "vhp w");
  const Tensor A = g["A"];
  const Tensor jac = F::jacobian(
      [&](const Tensor& x) {
        return tanh(matmul(x.transpose(0, 1), A)) * x.sum({0}, true).transpose(0, 1);
      },
      x);
  BOOST_TEST((jac.shape() == Shape{4, 5, 3, 4}));
  expect_close(jac, g["jacobian"], kRtol, kAtol, "jacobian");
  const Tensor hess = F::hessian(s, x);
  BOOST_TEST((hess.shape() == Shape{3, 4, 3, 4}));
  expect_close(hess, g["hessian"], kRtol, kAtol, "hessian");
  for (const Tensor& t : {a.output, a.vjp[0], b.jvp, c.hvp[1], jac, hess})
    BOOST_TEST(!t.requires_grad(), "results are detached without create_graph");
}

BOOST_AUTO_TEST_CASE(create_graph_results_differentiate_again) {
  const Golden& g = golden();
  const Tensor x = g["x"].requires_grad_();
  const F::HVP h =
      F::hvp([](const std::vector<Tensor>& in) { return s(in[0]); }, {x}, {g["vx"]}, true);
  BOOST_TEST(h.hvp[0].requires_grad());
  expect_close(autograd::grad({pow(h.hvp[0], 2).sum()}, {x})[0], g["hvp_create_graph.dx"], kRtol,
               kAtol, "d|Hv|²/dx");
  const Tensor w = g["w"];
  const Tensor jac = F::jacobian([&](const Tensor& z) { return tanh(matmul(z, w)); }, x, true);
  expect_close(autograd::grad({(jac * jac).sum()}, {x})[0], g["jacobian_create_graph.dx"], kRtol,
               kAtol, "d|J|²/dx");
  BOOST_TEST(!x.grad().defined());
}

BOOST_AUTO_TEST_CASE(semantics) {
  // The caller's tensors, requiring grad or not, keep their values, .grad and graph.
  const Tensor x = tensor({0.5, -1.0, 2.0}, kFloat64).requires_grad_();
  const Tensor unused = tensor({1.0, 2.0}, kFloat64);
  const auto cube = [](const std::vector<Tensor>& in) { return pow(in[0], 3).sum(); };
  const F::HVP h = F::hvp(cube, {x, unused}, {ones({3}, kFloat64), ones({2}, kFloat64)});
  expect_close(h.hvp[0], x.detach() * 6.0, 1e-15, 0, "H v of a cube");
  expect_close(h.hvp[1], zeros({2}, kFloat64), 0, 0, "unused input: zeros");
  BOOST_TEST(!x.grad().defined());
  BOOST_TEST(!unused.requires_grad());
  // An output that does not depend on the inputs: zeros everywhere.
  const auto constant = [](const std::vector<Tensor>& in) { return ones_like(in[0]).sum(); };
  BOOST_TEST(F::vjp(constant, {x}).vjp[0].abs().sum().item<double>() == 0.0);
  BOOST_TEST(F::jvp(constant, {x}, {x.detach()}).jvp.item<double>() == 0.0);
  BOOST_TEST(
      F::hessian([](const Tensor& z) { return z.sum() * 2.0; }, x).abs().sum().item<double>() ==
      0.0);
  // 0-d in and out; hvp equals vhp.
  const Tensor t = scalar_tensor(0.3, kFloat64);
  expect_close(F::jacobian([](const Tensor& z) { return sin(z); }, t), cos(t), 1e-15, 0, "0-d");
  BOOST_TEST(F::jacobian([](const Tensor& z) { return sin(z); }, t).dim() == 0);
  const std::vector<Tensor> in{tensor({0.2, 0.4}, kFloat64), tensor({1.5, -0.5}, kFloat64)};
  const std::vector<Tensor> v{tensor({1.0, -2.0}, kFloat64), tensor({0.5, 3.0}, kFloat64)};
  const auto mixed = [](const std::vector<Tensor>& z) { return (exp(z[0] * z[1]) * z[0]).sum(); };
  const F::HVP hv = F::hvp(mixed, in, v), vh = F::vhp(mixed, in, v);
  for (size_t i = 0; i < 2; ++i) expect_close(hv.hvp[i], vh.hvp[i], 1e-15, 1e-15, "hvp = vhp");
  // The Jacobian of a linear map is its matrix.
  const Tensor M = randn({2, 3}, kFloat64);
  expect_close(F::jacobian([&](const Tensor& z) { return matmul(M, z); }, randn({3}, kFloat64)), M,
               0, 0, "linear map");
}

BOOST_AUTO_TEST_CASE(errors) {
  const Tensor x = randn({3}, kFloat64);
  const auto identity = [](const std::vector<Tensor>& in) { return in[0] * 2.0; };
  expect_error([&] { F::vjp(identity, {x}); }, {"vjp:", "one element", "[3]"});
  expect_error([&] { F::vjp(identity, {x}, ones({2}, kFloat64)); },
               {"vjp:", "v has shape [2]", "[3]"});
  expect_error([&] { F::jvp(identity, {x}, {}); }, {"jvp:", "0 vectors v for 1 inputs"});
  expect_error([&] { F::jvp(identity, {x}, {ones({4}, kFloat64)}); },
               {"jvp:", "v 0 has shape [4]", "input 0 has [3]"});
  expect_error([&] { F::hvp(identity, {x}, {x}); }, {"hvp:", "one element", "[3]"});
  expect_error([&] { F::vhp(identity, {x}, {x}); }, {"vhp:", "one element"});
  expect_error([&] { F::vjp(identity, {Tensor()}); }, {"vjp:", "input 0 is undefined"});
  expect_error([&] { F::vjp(identity, {arange(0, 3, 1, kInt64)}); }, {"vjp:", "Int64", "floating"});
  expect_error([&] { F::vjp([](const std::vector<Tensor>&) { return Tensor(); }, {x}); },
               {"vjp:", "undefined"});
  expect_error([&] { F::hessian([](const Tensor& z) { return z; }, x); },
               {"hessian:", "one element", "[3]"});
  expect_error([&] { F::jacobian([](const Tensor& z) { return z > 0.0; }, x); },
               {"jacobian:", "Bool", "floating"});
}

BOOST_AUTO_TEST_SUITE_END()
