// Elementwise ops: one table of cases (tests/op_table.h) drives gradcheck on three layouts, the
// PyTorch golden values and the edge cases; then dtype rules, in-place ops and errors.
#include <cmath>
#include <limits>

#include <boost/test/unit_test.hpp>

#include "tests/edge_shapes.h"

using namespace ember;
using namespace ember::testing;

namespace {

// One row per op case; tests/op_table.h says what the fields mean. After adding or changing a
// row, run /usr/bin/python3 tests/golden/gen_op_tables.py. The rows are laid out by hand as a
// table (one line each, two when long), out of clang-format's reach.
// clang-format off
const OpTable kElementwiseOps = {
    // binary, broadcasting
    {"add", "torch.add(a, b)", {{3, 4}, {3, 4}}, {}, [](auto& v) { return add(v[0], v[1]); }},
    {"sub", "torch.sub(a, b)", {{3, 4}, {3, 4}}, {}, [](auto& v) { return sub(v[0], v[1]); }},
    {"add alpha broadcast", "torch.add(a, b, alpha=2.5)", {{3, 4}, {4}}, {},
     [](auto& v) { return add(v[0], v[1], 2.5); }},
    {"sub alpha", "torch.sub(a, b, alpha=-0.75)", {{2, 3}, {2, 3}}, {},
     [](auto& v) { return v[0].sub(v[1], -0.75); }},
    {"mul", "torch.mul(a, b)", {{3, 4}, {3, 4}}, {}, [](auto& v) { return mul(v[0], v[1]); }},
    {"div", "a / b", {{3, 4}, {3, 4}}, {Real, Positive}, [](auto& v) { return v[0] / v[1]; }},
    {"add broadcast row", "a + b", {{3, 4}, {4}}, {}, [](auto& v) { return v[0] + v[1]; }},
    {"sub broadcast col", "a - b", {{3, 1}, {3, 4}}, {}, [](auto& v) { return v[0] - v[1]; }},
    {"mul broadcast col", "a * b", {{3, 4}, {3, 1}}, {}, [](auto& v) { return v[0] * v[1]; }},
    {"div broadcast both", "torch.div(a, b)", {{3, 1}, {1, 4}}, {Real, Positive},
     [](auto& v) { return div(v[0], v[1]); }},
    {"sub 0-d", "a - b", {{2, 3}, {}}, {}, [](auto& v) { return v[0] - v[1]; }},
    {"mul size-1 dims", "a * b", {{1, 3, 1}, {2, 1, 4}}, {}, [](auto& v) { return v[0] * v[1]; }},
    {"mul same input twice", "a * a + a", {{2, 3}}, {}, [](auto& v) { return v[0] * v[0] + v[0]; }},
    // with a scalar
    {"add scalar", "a + 2.0", {{3, 4}}, {}, [](auto& v) { return v[0] + 2.0; }},
    {"sub scalar", "a - 0.5", {{3, 4}}, {}, [](auto& v) { return sub(v[0], 0.5); }},
    {"rsub", "1.0 - a", {{3, 4}}, {}, [](auto& v) { return 1.0 - v[0]; }},
    {"mul scalar", "3.0 * a", {{3, 4}}, {}, [](auto& v) { return 3.0 * v[0]; }},
    // div(Tensor, double) and rdiv read the dtype of an undefined input before checking it.
    {"div scalar", "a / 4.0", {{3, 4}}, {}, [](auto& v) { return v[0] / 4.0; }},
    {"rdiv", "2.0 / a", {{3, 4}}, {Positive}, [](auto& v) { return 2.0 / v[0]; }},
    {"neg", "-a", {{3, 4}}, {}, [](auto& v) { return -v[0]; }},
    // unary
    {"pow 0.8", "torch.pow(a, 0.8)", {{3, 4}}, {Positive}, [](auto& v) { return pow(v[0], 0.8); }},
    {"pow 2", "torch.pow(a, 2)", {{3, 4}}, {}, [](auto& v) { return pow(v[0], 2); }},
    {"pow -1.5", "a.pow(-1.5)", {{2, 3}}, {Positive}, [](auto& v) { return v[0].pow(-1.5); }},
    {"exp", "torch.exp(a)", {{3, 4}}, {}, [](auto& v) { return exp(v[0]); }},
    {"gelu", "F.gelu(a)", {{3, 4}}, {}, [](auto& v) { return gelu(v[0]); }},
    {"gelu tanh", "F.gelu(a, approximate='tanh')", {{3, 4}}, {}, [](auto& v) { return v[0].gelu("tanh"); }},
    {"silu", "F.silu(a)", {{3, 4}}, {}, [](auto& v) { return silu(v[0]); }},
    {"log", "torch.log(a)", {{3, 4}}, {Positive}, [](auto& v) { return log(v[0]); }},
    {"sqrt", "torch.sqrt(a)", {{3, 4}}, {Positive}, [](auto& v) { return sqrt(v[0]); }},
    {"sin", "torch.sin(a)", {{3, 4}}, {}, [](auto& v) { return sin(v[0]); }},
    {"cos", "torch.cos(a)", {{3, 4}}, {}, [](auto& v) { return cos(v[0]); }},
    {"tanh", "torch.tanh(a)", {{3, 4}}, {}, [](auto& v) { return tanh(v[0]); }},
    {"sigmoid", "torch.sigmoid(a)", {{3, 4}}, {}, [](auto& v) { return sigmoid(v[0]); }},
    {"relu", "torch.relu(a)", {{3, 4}}, {}, [](auto& v) { return relu(v[0]); }},
    {"abs", "torch.abs(a)", {{3, 4}}, {}, [](auto& v) { return abs(v[0]); }},
    // clamp, minimum, maximum: Integer inputs put values on the bounds and make ties, where
    // finite differences straddle the kink (golden gradients only)
    {"clamp", "torch.clamp(a, -0.5, 0.5)", {{3, 4}}, {},
     [](auto& v) { return clamp(v[0], -0.5, 0.5); }},
    {"clamp min only", "torch.clamp(a, min=-0.3)", {{3, 4}}, {},
     [](auto& v) { return v[0].clamp(-0.3); }},
    {"clamp max only", "a.clamp(max=0.2)", {{2, 3, 4}}, {},
     [](auto& v) { return clamp(v[0], std::nullopt, 0.2); }},
    {"clamp min above max", "torch.clamp(a, 0.5, -0.5)", {{3, 4}}, {},
     [](auto& v) { return clamp(v[0], 0.5, -0.5); }},
    {"clamp on the bounds", "torch.clamp(a, -1.0, 2.0)", {{3, 4}}, {Integer},
     [](auto& v) { return clamp(v[0], -1.0, 2.0); }, kNoGradcheck},
    {"maximum", "torch.maximum(a, b)", {{3, 4}, {3, 4}}, {},
     [](auto& v) { return maximum(v[0], v[1]); }},
    {"minimum", "torch.minimum(a, b)", {{3, 4}, {3, 4}}, {},
     [](auto& v) { return v[0].minimum(v[1]); }},
    {"maximum broadcast both", "torch.maximum(a, b)", {{3, 1}, {1, 4}}, {},
     [](auto& v) { return maximum(v[0], v[1]); }},
    {"minimum broadcast 0-d", "torch.minimum(a, b)", {{2, 3}, {}}, {},
     [](auto& v) { return minimum(v[0], v[1]); }},
    {"maximum ties", "torch.maximum(a, b)", {{3, 4}, {3, 4}}, {Integer, Integer},
     [](auto& v) { return maximum(v[0], v[1]); }, kNoGradcheck},
    {"minimum ties broadcast", "torch.minimum(a, b)", {{3, 4}, {4}}, {Integer, Integer},
     [](auto& v) { return minimum(v[0], v[1]); }, kNoGradcheck},
    // NaN and infinity tests: log of negative numbers is NaN, 1 / 0 is inf
    {"isnan log", "torch.isnan(torch.log(a))", {{3, 4}}, {},
     [](auto& v) { return isnan(log(v[0])); }, kNoGrad},
    {"isfinite rdiv", "torch.isfinite(1.0 / a)", {{3, 4}}, {Integer},
     [](auto& v) { return (1.0 / v[0]).isfinite(); }, kNoGrad},
    // selection by a mask
    {"where", "torch.where(a, b, c)", {{3, 4}, {3, 4}, {3, 4}}, {Bool},
     [](auto& v) { return where(v[0], v[1], v[2]); }},
    {"where broadcast", "torch.where(a, b, c)", {{4}, {3, 4}, {4}}, {Bool},
     [](auto& v) { return where(v[0], v[1], v[2]); }},
    {"masked_fill", "a.masked_fill(b, -5.0)", {{3, 4}, {3, 4}}, {Real, Bool},
     [](auto& v) { return masked_fill(v[0], v[1], -5.0); }},
    {"masked_fill -1e9", "a.masked_fill(b, -1e9)", {{3, 4}, {3, 4}}, {Real, Bool},
     [](auto& v) { return masked_fill(v[0], v[1], -1e9); }, kNoGradcheck},
    {"masked_fill broadcast mask", "a.masked_fill(b, 0.0)", {{3, 4}, {4}}, {Real, Bool},
     [](auto& v) { return v[0].masked_fill(v[1], 0.0); }},
    // comparisons and logic: Bool results without gradient; Integer inputs make ties
    {"lt", "torch.lt(a, b)", {{3, 4}, {3, 4}}, {}, [](auto& v) { return lt(v[0], v[1]); }, kNoGrad},
    {"ge scalar", "a >= 0.5", {{3, 4}}, {}, [](auto& v) { return v[0].ge(0.5); }, kNoGrad},
    {"ge", "a >= b", {{3, 4}, {3, 4}}, {Integer, Integer},
     [](auto& v) { return ge(v[0], v[1]); }, kNoGrad},
    {"eq", "a == b", {{3, 4}, {3, 4}}, {Integer, Integer},
     [](auto& v) { return eq(v[0], v[1]); }, kNoGrad},
    {"eq scalar", "a == 0.0", {{3, 4}}, {Integer}, [](auto& v) { return v[0].eq(0.0); }, kNoGrad},
    {"ne broadcast", "a != b", {{3, 4}, {4}}, {Integer, Integer},
     [](auto& v) { return ne(v[0], v[1]); }, kNoGrad},
    {"le broadcast both", "a <= b", {{3, 1}, {1, 4}}, {Integer, Integer},
     [](auto& v) { return le(v[0], v[1]); }, kNoGrad},
    {"gt scalar", "a > 1.0", {{3, 4}}, {Integer}, [](auto& v) { return v[0] > 1.0; }, kNoGrad},
    {"logical_not", "torch.logical_not(a)", {{3, 4}}, {Bool}, [](auto& v) { return !v[0]; },
     kNoGrad},
    {"logical_and", "torch.logical_and(a, b)", {{3, 4}, {4}}, {Bool, Bool},
     [](auto& v) { return v[0] & v[1]; }, kNoGrad},
    {"logical_or", "torch.logical_or(a, b)", {{3, 4}, {3, 4}}, {Bool, Bool},
     [](auto& v) { return logical_or(v[0], v[1]); }, kNoGrad},
};
// clang-format on

}  // namespace

BOOST_AUTO_TEST_SUITE(test_elementwise)

BOOST_AUTO_TEST_CASE(table_gradcheck) { check_gradients(kElementwiseOps); }
BOOST_AUTO_TEST_CASE(table_gradgradcheck) { check_gradgradients(kElementwiseOps); }
BOOST_AUTO_TEST_CASE(table_forward_ad) { check_forward_gradients(kElementwiseOps); }
BOOST_AUTO_TEST_CASE(table_create_graph_gradients) {
  check_create_graph_gradients(kElementwiseOps);
}
BOOST_AUTO_TEST_CASE(table_golden) { check_golden(kElementwiseOps); }
BOOST_AUTO_TEST_CASE(table_edge_cases) { check_edge_cases(kElementwiseOps); }
BOOST_AUTO_TEST_CASE(table_edge_shapes) { check_edge_shapes(kElementwiseOps); }
BOOST_AUTO_TEST_CASE(table_anomaly) { check_anomaly(kElementwiseOps); }
BOOST_AUTO_TEST_CASE(table_on_device) { check_on_device(kElementwiseOps); }

BOOST_AUTO_TEST_CASE(dtypes_and_logic) {
  const Tensor i = tensor({1, 2, 3}, kInt64);
  BOOST_TEST(((i + 1.0).dtype() == kInt64));
  BOOST_TEST(((i * 0.5).dtype() == kFloat32));
  BOOST_TEST(((i / 2.0).dtype() == kFloat32));
  BOOST_TEST(((i + tensor({0.5, 0.5, 0.5}, kFloat64)).dtype() == kFloat64));
  BOOST_TEST(((tensor({1.0}) + tensor({1.0}, kFloat64)).dtype() == kFloat64));
  BOOST_TEST((exp(i).dtype() == kFloat32));
  const Tensor a = tensor({1, 0, 1, 0}, kBool), b = tensor({1, 1, 0, 0}, kBool);
  BOOST_TEST(((a & b).to_vector<int64_t>() == std::vector<int64_t>{1, 0, 0, 0}));
  BOOST_TEST(((a | b).to_vector<int64_t>() == std::vector<int64_t>{1, 1, 1, 0}));
  BOOST_TEST(((!a).to_vector<int64_t>() == std::vector<int64_t>{0, 1, 0, 1}));
  // The seed's mask: (1 - eye(n)).bool() via ne(…, 0).
  const Tensor mask = (1.0 - eye(3)).ne(0.0);
  BOOST_TEST((mask.dtype() == kBool));
  BOOST_TEST(sum(mask).item<int64_t>() == 6);
  BOOST_TEST((eq(tensor({0.1f}), 0.1).item<bool>()));  // scalar cast to the tensor's dtype
  // alpha as torch: integral results keep integral (a whole alpha), Bool's alpha 1 is `or`
  BOOST_TEST((add(i, i, 3.0).to_vector<int64_t>() == std::vector<int64_t>{4, 8, 12}));
  BOOST_TEST((sub(i, i, -2.0).to_vector<int64_t>() == std::vector<int64_t>{3, 6, 9}));
  BOOST_TEST((add(i, tensor({1.0, 1.0, 1.0}), 0.5).to_vector<float>() ==
              std::vector<float>{1.5, 2.5, 3.5}));
  BOOST_TEST((add(a, b, 1.0).to_vector<int64_t>() == std::vector<int64_t>{1, 1, 1, 0}));
}

BOOST_AUTO_TEST_CASE(clamp_minimum_maximum_and_nan_tests) {
  const double nan = std::nan(""), inf = std::numeric_limits<double>::infinity();
  // clamp's dtype, as torch: integral stays Int64 for whole bounds, else Float32; Bool too.
  const Tensor i = tensor({1, 2, 3}, kInt64);
  BOOST_TEST((clamp(i, 1.0, 2.0).dtype() == kInt64));
  BOOST_TEST((clamp(i, 1.0, 2.0).to_vector<int64_t>() == std::vector<int64_t>{1, 2, 2}));
  BOOST_TEST((clamp(i, 1.5).dtype() == kFloat32));
  BOOST_TEST((clamp(i, 1.5).to_vector<float>() == std::vector<float>{1.5f, 2, 3}));
  BOOST_TEST((clamp(i, std::nullopt, inf).dtype() == kFloat32));
  BOOST_TEST((clamp(tensor({1, 0}, kBool), 0.0, 1.0).dtype() == kInt64));
  BOOST_TEST((clamp(tensor({1.0}, kFloat64), 0.0).dtype() == kFloat64));
  // NaN passes through; min > max gives max; the gradient is 0 at NaN and outside the bounds.
  Tensor x = from_vector(std::vector<double>{1, nan, 5, 2, 3}, {5}, kFloat64).requires_grad_();
  const Tensor c = clamp(x, 3.0, 2.0);
  const std::vector<double> cv = c.to_vector<double>();
  BOOST_TEST((cv[0] == 2 && std::isnan(cv[1]) && cv[2] == 2 && cv[3] == 2 && cv[4] == 2));
  clamp(x, 2.0, 3.0).sum().backward();
  BOOST_TEST((x.grad().to_vector<double>() == std::vector<double>{0, 0, 0, 1, 1}));
  // relu as torch's: NaN stays NaN and passes its gradient, -0 and negatives give 0.
  Tensor r = tensor({nan, -1, -0.0, 2}, kFloat64).requires_grad_();
  const Tensor ry = relu(r);
  ry.sum().backward();
  const std::vector<double> rv = ry.to_vector<double>();
  BOOST_TEST((std::isnan(rv[0]) && rv[1] == 0 && rv[2] == 0 && rv[3] == 2));
  BOOST_TEST((r.grad().to_vector<double>() == std::vector<double>{1, 0, 0, 1}));
  BOOST_TEST(std::isnan(relu(tensor({nan})).item<double>()));  // Float32
  // maximum/minimum: NaN wins; ties split the gradient; NaN gives both operands the gradient.
  Tensor a = tensor({1, 2, nan, 3}, kFloat64).requires_grad_();
  Tensor b = tensor({1, 3, 1, nan}, kFloat64).requires_grad_();
  const Tensor m = maximum(a, b);
  const std::vector<double> mv = m.to_vector<double>();
  BOOST_TEST((mv[0] == 1 && mv[1] == 3 && std::isnan(mv[2]) && std::isnan(mv[3])));
  m.backward(ones({4}, kFloat64));
  BOOST_TEST((a.grad().to_vector<double>() == std::vector<double>{0.5, 0, 1, 1}));
  BOOST_TEST((b.grad().to_vector<double>() == std::vector<double>{0.5, 1, 1, 1}));
  BOOST_TEST(std::isnan(minimum(a, b).to_vector<double>()[3]));
  BOOST_TEST((minimum(a, b).to_vector<double>()[1] == 2));
  // Promotion as the arithmetic ops: Int64 with Float32 is Float32, Bool with Bool stays Bool.
  const Tensor mixed = maximum(tensor({1, 2}, kInt64), tensor({1.5, 0.5}));
  BOOST_TEST((mixed.dtype() == kFloat32));
  BOOST_TEST((mixed.to_vector<float>() == std::vector<float>{1.5f, 2}));
  const Tensor bools = maximum(tensor({1, 0}, kBool), tensor({0, 0}, kBool));
  BOOST_TEST((bools.dtype() == kBool));
  BOOST_TEST((bools.to_vector<int64_t>() == std::vector<int64_t>{1, 0}));
  BOOST_TEST((minimum(tensor({4, -2}, kInt64), tensor({3}, kInt64)).to_vector<int64_t>() ==
              std::vector<int64_t>{3, -2}));
  // isnan / isfinite on every dtype; no gradient.
  const Tensor v = tensor({nan, inf, -inf, 1.0, -0.0}, kFloat64).requires_grad_();
  BOOST_TEST((isnan(v).dtype() == kBool));
  BOOST_TEST(!isnan(v).requires_grad());
  BOOST_TEST((isnan(v).to_vector<int64_t>() == std::vector<int64_t>{1, 0, 0, 0, 0}));
  BOOST_TEST((v.isfinite().to_vector<int64_t>() == std::vector<int64_t>{0, 0, 0, 1, 1}));
  BOOST_TEST((isnan(v.to(kFloat32)).to_vector<int64_t>() == std::vector<int64_t>{1, 0, 0, 0, 0}));
  BOOST_TEST((isnan(i).to_vector<int64_t>() == std::vector<int64_t>{0, 0, 0}));
  BOOST_TEST((isfinite(tensor({1}, kBool)).to_vector<int64_t>() == std::vector<int64_t>{1}));
}

BOOST_AUTO_TEST_CASE(mixed_dtype_gradients) {
  // Float32 with Float64 computes in Float64; each gradient comes back in its input's dtype, with
  // the values of the all-Float64 computation (DivBackward read its saved operands in the
  // result's dtype since 279b289; before it, Float32 / Float64 threw in backward).
  manual_seed(3);
  const Tensor x0 = randn({2, 3}), y0 = randn({3}, kFloat64) + 3.0;
  const std::vector<std::pair<std::string, std::function<Tensor(const Tensor&, const Tensor&)>>>
      ops = {{"add", [](auto& a, auto& b) { return add(a, b, 2.0); }},
             {"sub", [](auto& a, auto& b) { return a - b; }},
             {"mul", [](auto& a, auto& b) { return a * b; }},
             {"div", [](auto& a, auto& b) { return a / b; }},
             {"div reversed", [](auto& a, auto& b) { return b / (a + 5.0); }}};
  for (const auto& [name, f] : ops) {
    Tensor x = x0.clone().requires_grad_(), y = y0.clone().requires_grad_();
    Tensor x64 = x0.to(kFloat64).requires_grad_(), y64 = y0.clone().requires_grad_();
    f(x, y).sum().backward();
    f(x64, y64).sum().backward();
    BOOST_TEST((x.grad().dtype() == kFloat32), name);
    BOOST_TEST((y.grad().dtype() == kFloat64), name);
    expect_close(x.grad().to(kFloat64), x64.grad(), 1e-6, 1e-6, name + " dx");
    expect_close(y.grad(), y64.grad(), 1e-6, 1e-6, name + " dy");
  }
}

// Under create_graph the backwards of gelu, clamp, maximum/minimum, where and masked_fill are
// written in ops: the same gradients as the fused kernels at kinks, ties and NaN, and second
// derivatives beyond the table (gelu's against the formula, its third by finite differences).
BOOST_AUTO_TEST_CASE(double_backward_at_kinks_and_ties) {
  const double nan = std::nan("");
  const Tensor x = tensor({-1.0, 0.5, 1.0, 2.0, nan, 3.0}, kFloat64).requires_grad_();
  const Tensor y = tensor({-1.0, 1.0, 1.0, -2.0, 0.0, nan}, kFloat64).requires_grad_();
  const Tensor mask = tensor({1, 0, 1, 0, 0, 1}, kBool);
  const Tensor gy = tensor({1.0, 2.0, 3.0, 4.0, 5.0, 6.0}, kFloat64).requires_grad_();
  const std::vector<std::pair<std::string, std::function<Tensor()>>> ops = {
      {"clamp", [&] { return clamp(x, -1.0, 1.0); }},
      {"maximum", [&] { return maximum(x, y); }},
      {"minimum", [&] { return minimum(x, y); }},
      {"where", [&] { return where(mask, x, y); }},
      {"masked_fill", [&] { return masked_fill(x, mask, 2.0); }}};
  for (const auto& [name, f] : ops) {
    const std::vector<Tensor> plain = autograd::grad({f()}, {x, y}, {gy}, {}, false, true);
    const std::vector<Tensor> in_ops = autograd::grad({f()}, {x, y}, {gy}, {}, true, true);
    for (size_t i = 0; i < 2; ++i) {
      BOOST_TEST(plain[i].defined() == in_ops[i].defined(), name);
      if (!plain[i].defined()) continue;
      BOOST_TEST(in_ops[i].requires_grad(), name);
      expect_close(in_ops[i].detach(), plain[i], 0, 0, fmt::format("{} grad {}", name, i));
    }
  }
  // gelu: d²/dx² x Φ(x) = φ(x) (2 - x²); the tanh form against finite differences of its first.
  const Tensor v = tensor({-2.5, -0.3, 0.0, 0.7, 3.0}, kFloat64).requires_grad_();
  const Tensor g = autograd::grad({gelu(v).sum()}, {v}, {}, {}, true)[0];
  const Tensor d2 = autograd::grad({g.sum()}, {v})[0];
  const Tensor u = v.detach();
  expect_close(d2, exp(u * u * -0.5) * (1.0 / std::sqrt(2 * M_PI)) * (2.0 - u * u), 1e-12, 1e-14,
               "gelu second derivative");
  const auto first = [](std::string_view approximate) {
    return [approximate](const std::vector<Tensor>& in) {
      return autograd::grad({gelu(in[0], approximate).sum()}, {in[0]}, {}, {}, true)[0];
    };
  };
  for (std::string_view approximate : {"none", "tanh"}) {
    const GradcheckResult r = gradgradcheck(first(approximate), {v});
    BOOST_TEST(r.ok, "gelu " << approximate << " third derivative: " << r.message);
  }
}

BOOST_AUTO_TEST_CASE(in_place) {
  Tensor x = ones({2, 3});
  x.add_(tensor({1, 2, 3})).mul_(2.0);
  BOOST_TEST((x.to_vector<float>() == std::vector<float>{4, 6, 8, 4, 6, 8}));
  x.masked_fill_(x > 5.0, 0.0);
  BOOST_TEST((x.to_vector<float>() == std::vector<float>{4, 0, 0, 4, 0, 0}));
  Tensor col = x.narrow(1, 0, 1);  // a view: writes reach x
  col.fill_(7.0);
  BOOST_TEST(x.to_vector<float>()[3] == 7.0f);
  x.copy_(tensor({1, 2, 3}, kFloat64));  // broadcasts and converts
  BOOST_TEST((x.to_vector<float>() == std::vector<float>{1, 2, 3, 1, 2, 3}));
  x.zero_();
  BOOST_TEST(x.sum().item<double>() == 0.0);
  // torch's add_(other, alpha=): one pass, broadcast, the dtype kept
  x.add_(tensor({1, 2, 3}), -2.5);
  BOOST_TEST((x.to_vector<float>() == std::vector<float>{-2.5, -5, -7.5, -2.5, -5, -7.5}));
  Tensor i = tensor({1, 2}, kInt64);
  i.add_(tensor({5, 7}, kInt64), 3.0);
  BOOST_TEST((i.to_vector<int64_t>() == std::vector<int64_t>{16, 23}));
  Tensor b = tensor({1, 0}, kBool);
  b.add_(tensor({0, 0}, kBool), 1.0);
  BOOST_TEST((b.to_vector<bool>() == std::vector<bool>{true, false}));
}

BOOST_AUTO_TEST_CASE(errors) {
  expect_error([] { gelu(ones({2}), "fast"); }, {"gelu", "approximate", "fast"});
  expect_error([] { add(ones({2, 3}), ones({4, 5})); }, {"add", "[2, 3]", "[4, 5]"});
  expect_error([] { add(ones({2}), ones({3}), 2.0); }, {"add", "[2]", "[3]"});
  expect_error([] { add(ones({2}, kInt64), ones({2}, kInt64), 0.5); },
               {"add", "alpha 0.5", "Int64", "whole"});
  expect_error([] { sub(ones({2}, kInt64), ones({2}, kInt64), 1.5); }, {"sub", "alpha 1.5"});
  expect_error([] { add(ones({2}, kBool), ones({2}, kBool), 2.0); }, {"add", "alpha 2", "Bool"});
  expect_error([] { clamp(ones({2}), std::nullopt, std::nullopt); }, {"clamp", "at least one"});
  expect_error([] { maximum(ones({2, 3}), ones({4})); }, {"maximum", "[2, 3]", "[4]"});
  expect_error([] { minimum(ones({2}), ones({3})); }, {"minimum", "[2]", "[3]"});
  expect_error([] { mul(ones({2}), ones({3})); }, {"mul", "[2]", "[3]"});
  expect_error([] { where(ones({2}), ones({2}), ones({2})); }, {"where", "Bool"});
  expect_error([] { masked_fill(ones({2, 3}), ones({2, 3}), 0); }, {"masked_fill", "Bool"});
  expect_error(
      [] {
        masked_fill(ones({2, 3}), ones({3, 3}, kBool), 0);
      },
      {"masked_fill", "[3, 3]", "[2, 3]"});
  expect_error([] { ones({2, 3}).add_(ones({4, 3})); }, {"add_", "[4, 3]", "[2, 3]"});
  expect_error([] { ones({2, 3}).add_(ones({4, 3}), 2.0); }, {"add_", "[4, 3]", "[2, 3]"});
  expect_error([] { ones({2}, kInt64).add_(ones({2}, kInt64), 0.5); },
               {"add_", "alpha 0.5", "Int64", "whole"});
  expect_error([] { ones({2}, kInt64).add_(ones({2}), 1.0); }, {"add_", "Float32", "Int64"});
  expect_error([] { ones({2}).add_(Tensor(), 1.0); }, {"add_"});
  expect_error(
      [] {
        Tensor x = ones({2}).requires_grad_();
        x.mul_(2.0);
      },
      {"mul_", "leaf", "requires grad"});
}

BOOST_AUTO_TEST_SUITE_END()
