// Gradients of gradients (issue 34): Tensor::backward(create_graph), autograd::grad with torch's
// semantics (returned, not accumulated; unused inputs; retain_graph), gradgradcheck over the ops
// whose backward is written in ops (broadcast, non-contiguous, negative dims, empty), a network's
// derivatives with respect to its input differentiated again (as a physics-informed loss does),
// and the Error for a Node whose backward is still raw kernels.
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "tests/helpers.h"

using namespace ember;
using namespace ember::testing;

BOOST_AUTO_TEST_SUITE(test_double_backward)

namespace {

using Fn = std::function<Tensor(const std::vector<Tensor>&)>;

void check_gradgrad(const Fn& f, const std::vector<Tensor>& inputs, const std::string& what) {
  const GradcheckResult r = gradgradcheck(f, inputs);
  BOOST_TEST(r.ok, what << ": " << r.message);
}

// A non-contiguous Float64 leaf: a transposed view of a leaf of the reversed shape.
Tensor transposed_leaf(const Shape& shape) {
  Shape reversed(shape.rbegin(), shape.rend());
  Tensor t = leaf(reversed);
  std::vector<int64_t> dims(shape.size());
  for (size_t i = 0; i < dims.size(); ++i) dims[i] = static_cast<int64_t>(dims.size() - 1 - i);
  return permute(t, dims).detach().requires_grad_();
}

// A Float64 leaf of `shape` with values in [lo, lo + 1).
Tensor positive_leaf(const Shape& shape, double lo = 0.5) {
  return (rand(shape, kFloat64) + lo).detach().requires_grad_();
}

}  // namespace

BOOST_AUTO_TEST_CASE(third_derivative_of_a_cube) {
  const Tensor x = tensor({-1.5, 0.5, 2.0}, kFloat64).requires_grad_();
  const Tensor y = (x * x * x).sum();
  const Tensor dy = autograd::grad({y}, {x}, {}, std::nullopt, true)[0];  // 3x²
  expect_close(dy, x.detach() * x.detach() * 3.0, 1e-12, 1e-12, "dy");
  BOOST_TEST(dy.requires_grad());
  const Tensor d2y = autograd::grad({dy.sum()}, {x}, {}, std::nullopt, true)[0];  // 6x
  expect_close(d2y, x.detach() * 6.0, 1e-12, 1e-12, "d2y");
  const Tensor d3y = autograd::grad({d2y.sum()}, {x})[0];  // 6
  expect_close(d3y, full({3}, 6.0, kFloat64), 1e-12, 1e-12, "d3y");
  BOOST_TEST(!x.grad().defined());  // grad returns, never accumulates
}

BOOST_AUTO_TEST_CASE(backward_with_create_graph_keeps_grad_differentiable) {
  const Tensor x = tensor({0.3, -0.7}, kFloat64).requires_grad_();
  tanh(x).sum().backward({}, false, true);  // .grad = 1 - tanh²(x), with its graph
  const Tensor g = x.grad();
  BOOST_TEST(g.requires_grad());
  const Tensor t = tanh(x.detach());
  expect_close(g.detach(), 1.0 - t * t, 1e-12, 1e-12, "grad");
  const Tensor h = autograd::grad({g.sum()}, {x})[0];  // -2 tanh (1 - tanh²)
  expect_close(h, t * (1.0 - t * t) * -2.0, 1e-12, 1e-12, "second derivative");
  // A second backward with create_graph sums into .grad out of place, keeping both graphs.
  tanh(x).sum().backward({}, false, true);
  expect_close(x.grad().detach(), (1.0 - t * t) * 2.0, 1e-12, 1e-12, "accumulated");
  BOOST_TEST(x.grad().requires_grad());
  // .grad's graph saved x itself: a cycle through the leaf (torch warns of the same), broken by
  // resetting .grad.
  x.set_grad({});
}

BOOST_AUTO_TEST_CASE(grad_semantics_and_errors) {
  const Tensor x = tensor({1.0, 2.0}, kFloat64).requires_grad_();
  const Tensor w = tensor({3.0, 4.0}, kFloat64).requires_grad_();
  const Tensor unused = tensor({5.0}, kFloat64).requires_grad_();
  const Tensor y = (x * w).sum();
  // Several inputs, one output; interior tensors as inputs too; nothing accumulates.
  const Tensor xw = x * w;
  const Tensor z = (xw * xw).sum();
  const std::vector<Tensor> g = autograd::grad({z}, {xw, x}, {}, true);
  expect_close(g[0], xw.detach() * 2.0, 0, 0, "dz/dxw");
  expect_close(g[1], xw.detach() * w.detach() * 2.0, 0, 0, "dz/dx");
  BOOST_TEST(!x.grad().defined());
  BOOST_TEST(!w.grad().defined());
  // grad_outputs weight each output; several outputs sum.
  const Tensor v = tensor({10.0, 100.0}, kFloat64);
  const std::vector<Tensor> gw = autograd::grad({x * w, y}, {w}, {v, Tensor()}, true);
  expect_close(gw.at(0), x.detach() * v + x.detach(), 0, 0, "weighted");
  // An input the outputs do not reach: an Error naming it, or undefined with allow_unused.
  expect_error(
      [&] {
        autograd::grad({y}, {x, unused}, {}, true);
      },
      {"autograd::grad", "input 1", "[1]", "allow_unused"});
  const std::vector<Tensor> some = autograd::grad({y}, {x, unused}, {}, true, false, true);
  BOOST_TEST(some[0].defined());
  BOOST_TEST(!some[1].defined());
  expect_error([&] { autograd::grad({y}, {tensor({1.0}, kFloat64)}); },
               {"autograd::grad", "input 0", "does not require grad"});
  expect_error([&] { autograd::grad({x * w}, {x}); }, {"autograd::grad", "one-element", "[2]"});
  expect_error([&] { autograd::grad({y}, {x}, {ones({3}, kFloat64)}); },
               {"autograd::grad", "[3]", "output 0"});
  // retain_graph defaults to create_graph (false): a second pass through a freed graph throws.
  const Tensor q = (x * x).sum();
  autograd::grad({q}, {x});
  expect_error([&] { autograd::grad({q}, {x}); }, {"backward", "MulBackward", "retain_graph"});
}

// The ops whose backward is written in ops: gradgradcheck in Float64 on broadcast,
// non-contiguous (transposed, narrowed), negative-dim, size-1 and empty inputs.
BOOST_AUTO_TEST_CASE(gradgradcheck_elementwise) {
  manual_seed(34);
  const Tensor a = leaf({3, 4}), b = leaf({4}), p = positive_leaf({3, 4});
  const Tensor at = transposed_leaf({3, 4}),
               bn = leaf({3, 6}).narrow(-1, 1, 4).detach().requires_grad_();
  for (const auto& [name, f] : std::vector<std::pair<std::string, Fn>>{
           {"add", [](auto& v) { return v[0] + v[1]; }},
           {"sub", [](auto& v) { return v[0] - v[1]; }},
           {"add alpha", [](auto& v) { return add(v[0], v[1], 2.5); }},
           {"mul", [](auto& v) { return v[0] * v[1]; }},
           {"mul twice", [](auto& v) { return v[0] * v[1] * v[0]; }}}) {
    check_gradgrad(f, {a, b}, name + " broadcast");
    check_gradgrad(f, {at, bn}, name + " non-contiguous");
  }
  check_gradgrad([](auto& v) { return v[0] / v[1]; }, {a, p}, "div");
  check_gradgrad([](auto& v) { return v[0] / v[1]; }, {at, positive_leaf({4})}, "div broadcast");
  check_gradgrad([](auto& v) { return rdiv(v[0], 2.0); }, {p}, "rdiv");
  check_gradgrad([](auto& v) { return (v[0] * 3.0 - 1.0) / 2.0; }, {a}, "scalar ops");
  check_gradgrad([](auto& v) { return -v[0]; }, {at}, "neg");
  const Tensor x = leaf({2, 5}, 0.8), xt = transposed_leaf({2, 5});
  for (const auto& [name, f] :
       std::vector<std::pair<std::string, Fn>>{{"exp", [](auto& v) { return exp(v[0]); }},
                                               {"sin", [](auto& v) { return sin(v[0]); }},
                                               {"cos", [](auto& v) { return cos(v[0]); }},
                                               {"tanh", [](auto& v) { return tanh(v[0]); }},
                                               {"sigmoid", [](auto& v) { return sigmoid(v[0]); }},
                                               {"silu", [](auto& v) { return silu(v[0]); }},
                                               {"pow 3", [](auto& v) { return pow(v[0], 3.0); }},
                                               {"pow 2", [](auto& v) { return pow(v[0], 2.0); }},
                                               {"relu", [](auto& v) { return relu(v[0]) * v[0]; }},
                                               {"abs", [](auto& v) { return abs(v[0]) * v[0]; }}}) {
    check_gradgrad(f, {x}, name);
    check_gradgrad(f, {xt}, name + " non-contiguous");
  }
  check_gradgrad([](auto& v) { return log(v[0]); }, {p}, "log");
  check_gradgrad([](auto& v) { return sqrt(v[0]); }, {p}, "sqrt");
  check_gradgrad([](auto& v) { return pow(v[0], 2.5); }, {p}, "pow 2.5");
  check_gradgrad([](auto& v) { return v[0] * v[1]; }, {leaf({0, 3}), leaf({3})}, "mul empty");
  check_gradgrad([](auto& v) { return tanh(v[0]); }, {leaf({})}, "tanh 0-d");
}

BOOST_AUTO_TEST_CASE(gradgradcheck_shapes_reductions_products) {
  manual_seed(35);
  const Tensor x = leaf({2, 3, 4}), xt = transposed_leaf({2, 3, 4});
  for (const auto& [name, f] : std::vector<std::pair<std::string, Fn>>{
           {"sum dims",
            [](auto& v) {
              return sum(v[0] * v[0], {-1, 0});
            }},
           {"sum keepdim", [](auto& v) { return sum(v[0] * v[0], {1}, true); }},
           {"sum all", [](auto& v) { return sum(v[0] * v[0]); }},
           {"mean", [](auto& v) { return mean(v[0] * v[0], {-2}); }},
           {"reshape",
            [](auto& v) {
              return reshape(v[0] * v[0], {6, -1});
            }},
           {"permute",
            [](auto& v) {
              return permute(v[0] * v[0], {2, 0, 1});
            }},
           {"transpose", [](auto& v) { return transpose(v[0] * v[0], -1, 0); }},
           {"expand",
            [](auto& v) { return expand(unsqueeze(v[0], 1) * v[0].sum(), {2, 2, 3, 4}); }},
           {"narrow", [](auto& v) { return narrow(v[0] * v[0], -1, 1, 2); }},
           {"select", [](auto& v) { return select(v[0] * v[0], 1, -1); }},
           {"split", [](auto& v) { return v[0].split(2, -1)[1] * v[0].split(2, -1)[0]; }},
           {"cat", [](auto& v) { return cat({v[0] * v[0], v[0]}, -2); }},
           {"stack", [](auto& v) {
              return stack({v[0] * v[0], v[0]}, 1);
            }}}) {
    check_gradgrad(f, {x}, name);
    check_gradgrad(f, {xt}, name + " non-contiguous");
  }
  const Tensor a = leaf({3, 4}), b = leaf({4, 2}), bt = transposed_leaf({4, 2});
  check_gradgrad([](auto& v) { return matmul(v[0], v[1]) * matmul(v[0], v[1]); }, {a, b}, "mm");
  check_gradgrad([](auto& v) { return tanh(matmul(v[0], v[1])); }, {a, bt}, "mm transposed");
  check_gradgrad([](auto& v) { return tanh(matmul(v[0], v[1])); }, {leaf({2, 3, 4}), b},
                 "matmul batched by 2-D");
  check_gradgrad([](auto& v) { return tanh(matmul(v[0], v[1])); }, {leaf({4}), b}, "vector mm");
  check_gradgrad([](auto& v) { return tanh(matmul(v[0], v[1])); }, {a, leaf({4})}, "mm vector");
  check_gradgrad([](auto& v) { return tanh(matmul(v[0], v[1])); }, {leaf({4}), leaf({4})}, "dot");
  check_gradgrad([](auto& v) { return tanh(bmm(v[0], v[1])); }, {leaf({2, 3, 4}), leaf({2, 4, 2})},
                 "bmm");
  const Tensor w = leaf({5, 4}), bias = leaf({5});
  check_gradgrad([](auto& v) { return tanh(linear(v[0], v[1], v[2])); }, {leaf({2, 3, 4}), w, bias},
                 "linear 3-D input");
  check_gradgrad([](auto& v) { return tanh(linear(v[0], v[1])); },
                 {transposed_leaf({4, 3}), leaf({5, 3})}, "linear non-contiguous, no bias");
}

// A physics-informed loss: u(x) a tanh MLP, its derivatives u_x and u_xx with respect to the
// input by autograd::grad(create_graph), the residual differentiated with respect to the
// parameters; gradcheck compares that with finite differences.
BOOST_AUTO_TEST_CASE(pinn_residual_gradcheck) {
  manual_seed(36);
  const Tensor w1 = leaf({8, 2}), b1 = leaf({8}), w2 = leaf({1, 8}, 0.5), b2 = leaf({1});
  const Tensor points = rand({5, 2}, kFloat64);
  const Fn residual = [&](const std::vector<Tensor>& p) {
    GradModeScope grad_mode(true);  // gradcheck's finite differences run under NoGradGuard
    const Tensor xt = points.detach().requires_grad_();
    const Tensor u = linear(tanh(linear(xt, p[0], p[1])), p[2], p[3]);
    const Tensor du = autograd::grad({u.sum()}, {xt}, {}, std::nullopt, true)[0];
    const Tensor u_x = du.narrow(1, 0, 1), u_t = du.narrow(1, 1, 1);
    const Tensor u_xx =
        autograd::grad({u_x.sum()}, {xt}, {}, std::nullopt, true)[0].narrow(1, 0, 1);
    const Tensor f = u_t + u * u_x - u_xx * 0.01;
    return (f * f).mean();
  };
  check_gradient(residual, {w1, b1, w2, b2}, "Burgers residual");
  // And the Hessian-vector product of that loss (third derivatives of the network).
  check_gradgrad(residual, {w1, b1, w2, b2}, "Burgers residual, second order");
}

namespace {

// A user's op whose backward is raw (computed without recording, as a kernel would): y = 3x,
// dX = 3 dY. It keeps Node's differentiable_backward() false.
struct TripleBackward final : Node {
  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    NoGradGuard raw;
    return {grads[0].detach() * 3.0};
  }
};

Tensor triple(const Tensor& x) {
  Tensor out;
  {
    NoGradGuard no_grad;
    out = x * 3.0;
  }
  return record<TripleBackward>("triple", out, {x});
}

}  // namespace

BOOST_AUTO_TEST_CASE(raw_backward_refuses_a_second_one) {
  const Tensor x = tensor({0.5, -1.0}, kFloat64).requires_grad_();
  const Tensor g = autograd::grad({(triple(x) * x).sum()}, {x}, {}, std::nullopt, true)[0];
  expect_close(g.detach(), x.detach() * 6.0, 1e-15, 0, "first derivative");
  BOOST_TEST(g.requires_grad());
  expect_error([&] { autograd::grad({g.sum()}, {x}); },
               {"TripleBackward", "cannot be differentiated again"});
  // Every op of the library is differentiable twice: no Node of theirs refuses.
  BOOST_TEST(autograd::grad({autograd::grad({gelu(x).sum()}, {x}, {}, std::nullopt, true)[0].sum()},
                            {x})[0]
                 .defined());
}

// tanh and sigmoid differentiate under create_graph through one fused op (tanh_backward,
// sigmoid_backward) whose own backward is a fused op too (affine_product): their third and
// fourth derivatives, by value and by gradgradcheck of the second derivative.
BOOST_AUTO_TEST_CASE(fused_derivatives_to_fourth_order) {
  const Tensor x = tensor({-1.3, -0.2, 0.4, 2.1}, kFloat64).requires_grad_();
  const auto nth = [&](const Tensor& y, int n) {
    Tensor d = y;
    for (int i = 0; i < n; ++i) d = autograd::grad({d.sum()}, {x}, {}, std::nullopt, true)[0];
    return d.detach();
  };
  const Tensor t = tanh(x.detach()), s = sigmoid(x.detach());
  const Tensor u = 1.0 - t * t, w = s * (1.0 - s);
  // tanh: d3 = -2u(1 - 3t²), d4 = 8tu(2 - 3t²) with u = 1 - t²; sigmoid: d3 = w(1 - 6w)
  expect_close(nth(tanh(x), 3), u * (1.0 - t * t * 3.0) * -2.0, 1e-12, 1e-13, "tanh d3");
  expect_close(nth(tanh(x), 4), t * u * (2.0 - t * t * 3.0) * 8.0, 1e-12, 1e-13, "tanh d4");
  expect_close(nth(sigmoid(x), 3), w * (1.0 - w * 6.0), 1e-12, 1e-13, "sigmoid d3");
  using Unary = std::function<Tensor(const Tensor&)>;
  for (const Unary& f : {Unary([](const Tensor& v) { return tanh(v); }),
                         Unary([](const Tensor& v) { return sigmoid(v); })}) {
    const Fn second = [&](const std::vector<Tensor>& in) {
      GradModeScope grad_mode(true);
      const Tensor d =
          autograd::grad({(f(in[0]) * in[1]).sum()}, {in[0]}, {}, std::nullopt, true)[0];
      return autograd::grad({(d * d).sum()}, {in[0]}, {}, std::nullopt, true)[0];
    };
    check_gradgrad(second, {leaf({3, 2}), leaf({3, 2})}, "second derivative, twice more");
  }
  // relu's derivative is piecewise constant: its second derivative is zero, not undefined.
  BOOST_TEST(nth(relu(x) * x, 2).abs().sum().item<double>() == 4.0);
}

// linear, layer_norm, dropout and head_attention differentiate under create_graph through one
// fused op each (linear_backward, layer_norm_backward, dropout_backward, head_attention_backward)
// whose own backward is raw products and kernels, or, under create_graph again, the same formulas
// in ops. Both give the same second derivatives; the ops' differentiate once more (a third
// derivative, by gradgradcheck of the second).
BOOST_AUTO_TEST_CASE(fused_backward_ops_to_third_order) {
  manual_seed(11);
  const Tensor keep = rand({2, 3, 4}, kFloat64) > 0.3;
  struct Case {
    std::string name;
    Fn f;
    std::vector<Tensor> inputs;
  };
  const std::vector<Case> cases = {
      {"linear",
       [](const auto& v) { return tanh(linear(v[0], v[1], v[2])); },
       {leaf({2, 3, 4}), leaf({5, 4}), leaf({5})}},
      {"linear of a transposed input, no bias",
       [](const auto& v) { return linear(v[0], v[1]) * linear(v[0], v[1]); },
       {transposed_leaf({3, 4}), leaf({2, 4})}},
      {"layer_norm",
       [](const auto& v) { return layer_norm(v[0], {4}, v[1], v[2]) * v[0]; },
       {leaf({3, 4}), leaf({4}), leaf({4})}},
      {"layer_norm 2-D normalized_shape, no affine",
       [](const auto& v) {
         return tanh(layer_norm(v[0], {2, 3}, {}, {}, 1e-3));
       },
       {transposed_leaf({4, 2, 3})}},
      {"dropout",
       [](const auto& v) {
         manual_seed(5);
         return dropout(v[0] * v[0], 0.4, true);
       },
       {leaf({3, 5})}},
      {"head_attention with keep",
       [&](const auto& v) {
         return tanh(head_attention(v[0], v[1].permute({2, 1, 0}), v[2], 2, keep).values);
       },
       {leaf({2, 3, 6}), leaf({6, 4, 2}), leaf({2, 4, 6})}},
      {"head_attention with dropout",
       [](const auto& v) {
         manual_seed(3);
         return head_attention(v[0], v[1], v[2], 3, Tensor(), 0.3).values * v[0];
       },
       {leaf({2, 3, 6}), leaf({2, 3, 6}), leaf({2, 3, 6})}},
  };
  for (const Case& c : cases) {
    std::vector<Tensor> up;
    for (const Tensor& in : c.inputs) up.push_back(randn(in.shape(), kFloat64));
    // x -> the gradient of Σ f'(x)·up, with or without create_graph, flattened into one tensor
    const auto second = [&](const std::vector<Tensor>& in, bool create_graph) {
      GradModeScope grad_mode(true);
      const std::vector<Tensor> d =
          autograd::grad({c.f(in).sum()}, in, {}, std::nullopt, true, true);
      Tensor s = zeros({}, kFloat64);
      for (size_t i = 0; i < in.size(); ++i)
        if (d[i].defined()) s = s + (d[i] * up[i]).sum();
      const std::vector<Tensor> dd = autograd::grad({s}, in, {}, std::nullopt, create_graph, true);
      std::vector<Tensor> flat;
      for (size_t i = 0; i < in.size(); ++i)
        flat.push_back((dd[i].defined() ? dd[i] : zeros_like(in[i])).reshape({-1}));
      return cat(flat, 0);
    };
    expect_close(second(c.inputs, true), second(c.inputs, false), 1e-10, 1e-12,
                 c.name + ": second derivatives in ops and by kernels");
    check_gradgrad([&](const std::vector<Tensor>& in) { return second(in, true); }, c.inputs,
                   c.name + ": third derivatives");
  }
}

BOOST_AUTO_TEST_CASE(div_of_mixed_dtypes) {
  const Tensor a = tensor({1.0, 2.0}).requires_grad_();
  const Tensor b = tensor({4.0, 8.0}, kFloat64).requires_grad_();
  (a / b).sum().backward();
  expect_close(a.grad().to(kFloat64), tensor({0.25, 0.125}, kFloat64), 1e-7, 0, "da");
  expect_close(b.grad(), tensor({-1.0 / 16, -2.0 / 64}, kFloat64), 1e-7, 0, "db");
  BOOST_TEST(a.grad().dtype() == kFloat32);
  BOOST_TEST(b.grad().dtype() == kFloat64);
}

BOOST_AUTO_TEST_CASE(double_backward_graph_is_freed) {
  const int64_t nodes = live_nodes();
  {
    const Tensor x = leaf({3, 2});
    const Tensor y = tanh(x * x).sum();
    const Tensor g = autograd::grad({y}, {x}, {}, std::nullopt, true)[0];
    autograd::grad({(g * g).sum()}, {x});
    x.grad();
  }
  BOOST_TEST(live_nodes() == nodes);
}

BOOST_AUTO_TEST_SUITE_END()
