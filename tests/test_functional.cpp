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

// A user's op y = x · w (elementwise) whose Node notes, each time it runs, which of its inputs'
// gradients the engine marked as wanted for their graph alone (Node::value_unused); its
// gradients are ops, so it differentiates again.
std::vector<std::vector<bool>> g_probe_marks;
struct ProbeBackward final : Node {
  ProbeBackward(const Tensor& x, const Tensor& w) { save(x_, x), save(w_, w); }
  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    g_probe_marks.push_back({value_unused(0), value_unused(1)});
    return {mul(grads[0], w_.get()), mul(grads[0], x_.get())};
  }
  bool differentiable_backward() const override { return true; }
  SavedTensor x_, w_;
};

Tensor probe(const Tensor& x, const Tensor& w) {
  Tensor out;
  {
    NoGradGuard no_grad;
    out = mul(x, w);
  }
  return record<ProbeBackward>("probe", out, {x, w}, x, w);
}

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
  const F::HVP fr = F::hvp_forward_over_reverse(scalar, {x, w}, {vx, vw});
  expect_close(fr.output, g["hvp.out"], kRtol, kAtol, "forward-over-reverse hvp output");
  expect_close(fr.hvp[0], g["hvp.x"], kRtol, kAtol, "forward-over-reverse hvp x");
  expect_close(fr.hvp[1], g["hvp.w"], kRtol, kAtol, "forward-over-reverse hvp w");
  BOOST_TEST(!fr.hvp[0].requires_grad());
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
  const Tensor jac_fwd = F::jacfwd(
      [&](const Tensor& x) {
        return tanh(matmul(x.transpose(0, 1), A)) * x.sum({0}, true).transpose(0, 1);
      },
      x);
  BOOST_TEST((jac_fwd.shape() == Shape{4, 5, 3, 4}));
  expect_close(jac_fwd, g["jacfwd"], kRtol, kAtol, "jacfwd");
  const Tensor hess = F::hessian(s, x);
  BOOST_TEST((hess.shape() == Shape{3, 4, 3, 4}));
  expect_close(hess, g["hessian"], kRtol, kAtol, "hessian");
  for (const Tensor& t : {a.output, a.vjp[0], b.jvp, c.hvp[1], jac, jac_fwd, hess})
    BOOST_TEST(!t.requires_grad(), "results are detached without create_graph");
}

// Forward over reverse through linear layers at constant points (linear_backward then has no
// input gradient and saves no weight), against reverse over reverse.
BOOST_AUTO_TEST_CASE(hvp_forward_over_reverse_of_parameters) {
  manual_seed(12);
  const Tensor points = randn({5, 2}, kFloat64);
  const std::vector<Tensor> p = {randn({4, 2}, kFloat64), randn({4}, kFloat64),
                                 randn({1, 4}, kFloat64), randn({1}, kFloat64)};
  std::vector<Tensor> v;
  for (const Tensor& t : p) v.push_back(randn(t.shape(), kFloat64));
  const auto loss = [&](const std::vector<Tensor>& q) {
    return pow(linear(tanh(linear(points, q[0], q[1])), q[2], q[3]), 2.0).mean();
  };
  const F::HVP a = F::hvp(loss, p, v), b = F::hvp_forward_over_reverse(loss, p, v);
  for (size_t i = 0; i < p.size(); ++i) expect_close(b.hvp[i], a.hvp[i], 1e-12, 1e-13, "H v");
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

// Note [Results for their graph alone]: vhp, hvp, jvp and hessian take their first gradient only to
// differentiate it, and a Node may then leave a result's value as zeros (linear's weight and bias
// gradients do). Which inputs the engine marks, and that the transforms' values are those of
// autograd::grad taken twice, with linear layers (a weight used twice too), in Float64.
BOOST_AUTO_TEST_CASE(first_gradient_for_its_graph_alone) {
  const Tensor x = tensor({0.3, -0.8, 1.1}, kFloat64), w = tensor({1.5, 0.4, -0.7}, kFloat64);
  const Tensor vx = tensor({0.2, 1.0, -0.5}, kFloat64), vw = tensor({-1.2, 0.3, 0.9}, kFloat64);
  const auto fp = [](const std::vector<Tensor>& in) {
    return pow(probe(tanh(in[0]), in[1]), 2).sum();
  };
  g_probe_marks.clear();
  const F::HVP h = F::vhp(fp, {x, w}, {vx, vw});
  // the first gradient: input 0 feeds tanh's Node (it runs), input 1 is a result; the second
  // gradient's values are read
  BOOST_TEST_REQUIRE(g_probe_marks.size() == 2u);
  BOOST_TEST(g_probe_marks[0] == (std::vector<bool>{false, true}));
  BOOST_TEST(g_probe_marks[1] == (std::vector<bool>{false, false}));
  g_probe_marks.clear();
  const Tensor xl = x.detach().requires_grad_(), wl = w.detach().requires_grad_();
  const std::vector<Tensor> g = autograd::grad({fp({xl, wl})}, {xl, wl}, {}, std::nullopt, true);
  BOOST_TEST(g_probe_marks[0] == (std::vector<bool>{false, false}));  // autograd::grad: never
  expect_close(g[1].detach(), pow(tanh(x), 2) * w * 2.0, 1e-14, 0, "dw, read");
  const std::vector<Tensor> gg = autograd::grad(g, {xl, wl}, {vx, vw});
  for (size_t i = 0; i < 2; ++i) expect_close(h.hvp[i], gg[i], 1e-14, 1e-15, "vhp of the probe");

  // linear layers, a weight used twice and made by a layer (W Wᵀ, whose gradient is read: the
  // layer's derivative saves it), a bias: vhp, hvp and jvp against autograd::grad twice
  const Tensor in = tensor({0.5, -1.0, 0.25, 1.5, 0.75, -0.5}, kFloat64).reshape({2, 3});
  const Tensor W =
      tensor({0.3, -0.2, 0.8, -0.6, 0.9, 0.1, 0.4, 0.5, -0.7}, kFloat64).reshape({3, 3});
  const Tensor b = tensor({0.1, -0.3, 0.2}, kFloat64);
  const Tensor vW =
      tensor({1.0, 0.5, -0.25, 0.0, -1.5, 0.75, 0.5, 0.25, 1.0}, kFloat64).reshape({3, 3});
  const Tensor vb = tensor({-0.5, 1.0, 0.25}, kFloat64), vin = in * -0.5 + 0.125;
  const auto net = [](const std::vector<Tensor>& p) {
    const Tensor hidden = tanh(linear(p[0], p[1], p[2]));
    return pow(linear(hidden, linear(p[1], p[1])), 2).sum();  // a weight made by a layer
  };
  const std::vector<Tensor> p = {in.detach().requires_grad_(), W.detach().requires_grad_(),
                                 b.detach().requires_grad_()};
  const std::vector<Tensor> v = {vin, vW, vb};
  const std::vector<Tensor> first = autograd::grad({net(p)}, p, {}, std::nullopt, true);
  const std::vector<Tensor> twice = autograd::grad(first, p, v);
  const F::HVP vhp = F::vhp(net, {in, W, b}, v), hvp = F::hvp(net, {in, W, b}, v);
  for (size_t i = 0; i < 3; ++i) {
    expect_close(vhp.hvp[i], twice[i], 1e-13, 1e-14, "vhp of the linear layers");
    expect_close(hvp.hvp[i], twice[i], 1e-13, 1e-14, "hvp of the linear layers");
  }
  // jvp = J v, J of the layers' output (2, 3) by the inputs; the same products by autograd
  const auto layers = [](const std::vector<Tensor>& q) {
    return linear(tanh(linear(q[0], q[1], q[2])), q[1]);
  };
  const F::JVP j = F::jvp(layers, {in, W, b}, v);
  const Tensor u = zeros({2, 3}, kFloat64).requires_grad_();
  const std::vector<Tensor> vjp_u = autograd::grad({layers(p)}, p, {u}, std::nullopt, true);
  const Tensor jv = autograd::grad(vjp_u, {u}, v)[0];
  expect_close(j.jvp, jv, 1e-13, 1e-14, "jvp of the linear layers");
  // hessian in the weight alone, contracted with vW: H vW of autograd::grad twice
  const auto of_weight = [&](const Tensor& weight) { return net({in, weight, b}); };
  const Tensor hess = F::hessian(of_weight, W);  // (3, 3, 3, 3)
  const Tensor wl2 = W.detach().requires_grad_();
  const Tensor gw = autograd::grad({of_weight(wl2)}, {wl2}, {}, std::nullopt, true)[0];
  expect_close((hess * vW).sum({2, 3}), autograd::grad({gw}, {wl2}, {vW})[0], 1e-13, 1e-14,
               "hessian of the linear layers");
}

BOOST_AUTO_TEST_SUITE_END()
