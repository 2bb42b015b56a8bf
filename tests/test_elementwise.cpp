// Elementwise ops: gradcheck (contiguous, transposed, narrowed, broadcast, size-1 inputs),
// PyTorch golden values in Float64 and Float32, dtype rules, in-place ops and errors.
#include <boost/test/unit_test.hpp>

#include "tests/helpers.h"

using namespace ember;
using namespace ember::testing;

BOOST_AUTO_TEST_SUITE(test_elementwise)

BOOST_AUTO_TEST_CASE(gradcheck_binary) {
  manual_seed(1);
  const auto pos = [](const Tensor& x) { return x * x + 0.5; };  // keeps divisors away from 0
  check_variants("add", [](auto& v) { return v[0] + v[1]; }, {{3, 4}, {3, 4}});
  check_variants("sub", [](auto& v) { return v[0] - v[1]; }, {{3, 4}, {3, 4}});
  check_variants("mul", [](auto& v) { return v[0] * v[1]; }, {{3, 4}, {3, 4}});
  check_variants("div", [&](auto& v) { return v[0] / pos(v[1]); }, {{3, 4}, {3, 4}});
  check_variants("add broadcast row", [](auto& v) { return v[0] + v[1]; }, {{3, 4}, {4}});
  check_variants("mul broadcast col", [](auto& v) { return v[0] * v[1]; }, {{3, 4}, {3, 1}});
  check_variants("div broadcast both", [&](auto& v) { return v[0] / pos(v[1]); }, {{3, 1}, {1, 4}});
  check_variants("sub 0-d", [](auto& v) { return v[0] - v[1]; }, {{2, 3}, {}});
  check_variants("mul size-1 dims", [](auto& v) { return v[0] * v[1]; }, {{1, 3, 1}, {2, 1, 4}});
  check_variants("same input twice", [](auto& v) { return v[0] * v[0] + v[0]; }, {{2, 3}});
}

BOOST_AUTO_TEST_CASE(gradcheck_scalar_and_unary) {
  manual_seed(2);
  const auto pos = [](const Tensor& x) { return x * x + 0.5; };
  check_variants("add scalar", [](auto& v) { return v[0] + 2.0; }, {{3, 4}});
  check_variants("rsub", [](auto& v) { return 1.0 - v[0]; }, {{3, 4}});
  check_variants("mul scalar", [](auto& v) { return 3.0 * v[0]; }, {{3, 4}});
  check_variants("div scalar", [](auto& v) { return v[0] / 4.0; }, {{3, 4}});
  check_variants("rdiv", [&](auto& v) { return 2.0 / pos(v[0]); }, {{3, 4}});
  check_variants("neg", [](auto& v) { return -v[0]; }, {{3, 4}});
  check_variants("pow 0.8", [&](auto& v) { return pow(pos(v[0]), 0.8); }, {{3, 4}});
  check_variants("pow 2", [](auto& v) { return pow(v[0], 2); }, {{3, 4}});
  check_variants("pow -1.5", [&](auto& v) { return pow(pos(v[0]), -1.5); }, {{2, 3}});
  check_variants("exp", [](auto& v) { return exp(v[0]); }, {{3, 4}});
  check_variants("log", [&](auto& v) { return log(pos(v[0])); }, {{3, 4}});
  check_variants("sqrt", [&](auto& v) { return sqrt(pos(v[0])); }, {{3, 4}});
  check_variants("sin", [](auto& v) { return sin(v[0]); }, {{3, 4}});
  check_variants("cos", [](auto& v) { return cos(v[0]); }, {{3, 4}});
  check_variants("tanh", [](auto& v) { return tanh(v[0]); }, {{3, 4}});
  check_variants("sigmoid", [](auto& v) { return sigmoid(v[0]); }, {{3, 4}});
  check_variants("relu", [](auto& v) { return relu(v[0]); }, {{3, 4}});
  check_variants("abs", [](auto& v) { return abs(v[0]); }, {{3, 4}});
}

BOOST_AUTO_TEST_CASE(gradcheck_where_masked_fill) {
  manual_seed(3);
  check_variants("where", [](auto& v) { return where(v[0] > 0.0, v[0], v[1]); }, {{3, 4}, {3, 4}});
  check_variants("where broadcast", [](auto& v) { return where(v[1] > 0.0, v[0], v[1] * 2.0); },
                 {{3, 4}, {4}});
  check_variants("masked_fill", [](auto& v) { return masked_fill(v[0], v[0] < 0.0, -5.0); },
                 {{3, 4}});
  const Tensor mask = tensor({1, 0, 0, 1}, kBool);
  check_variants("masked_fill broadcast mask", [&](auto& v) { return v[0].masked_fill(mask, 0); },
                 {{3, 4}});
}

BOOST_AUTO_TEST_CASE(golden_values) {
  const Golden g("core.json");
  check_golden(
      g, "add", [](auto& v) { return v[0] + v[1]; }, 2);
  check_golden(
      g, "add_broadcast", [](auto& v) { return v[0] + v[1]; }, 2);
  check_golden(
      g, "sub_broadcast", [](auto& v) { return v[0] - v[1]; }, 2);
  check_golden(
      g, "mul_broadcast", [](auto& v) { return v[0] * v[1]; }, 2);
  check_golden(
      g, "div", [](auto& v) { return v[0] / v[1]; }, 2);
  check_golden(
      g, "neg", [](auto& v) { return -v[0]; }, 1);
  check_golden(
      g, "pow", [](auto& v) { return pow(v[0], 0.8); }, 1);
  check_golden(
      g, "pow2", [](auto& v) { return pow(v[0], 2); }, 1);
  check_golden(
      g, "exp", [](auto& v) { return exp(v[0]); }, 1);
  check_golden(
      g, "log", [](auto& v) { return log(v[0]); }, 1);
  check_golden(
      g, "sqrt", [](auto& v) { return sqrt(v[0]); }, 1);
  check_golden(
      g, "sin", [](auto& v) { return sin(v[0]); }, 1);
  check_golden(
      g, "cos", [](auto& v) { return cos(v[0]); }, 1);
  check_golden(
      g, "tanh", [](auto& v) { return tanh(v[0]); }, 1);
  check_golden(
      g, "sigmoid", [](auto& v) { return sigmoid(v[0]); }, 1);
  check_golden(
      g, "relu", [](auto& v) { return relu(v[0]); }, 1);
  check_golden(
      g, "abs", [](auto& v) { return abs(v[0]); }, 1);
  check_golden(
      g, "rsub", [](auto& v) { return 1.0 - v[0]; }, 1);
  check_golden(
      g, "rdiv", [](auto& v) { return 2.0 / v[0]; }, 1);
  check_golden(
      g, "where", [](auto& v) { return where(v[0] > 0.0, v[0], v[1]); }, 2);
  check_golden(
      g, "masked_fill", [](auto& v) { return v[0].masked_fill(v[0] < 0.0, -1e9); }, 1);
  check_golden(
      g, "lt", [](auto& v) { return lt(v[0], v[1]); }, 2);
  check_golden(
      g, "ge_scalar", [](auto& v) { return v[0].ge(0.5); }, 1);
}

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
}

BOOST_AUTO_TEST_CASE(errors) {
  expect_error([] { add(ones({2, 3}), ones({4, 5})); }, {"add", "[2, 3]", "[4, 5]"});
  expect_error([] { mul(ones({2}), ones({3})); }, {"mul", "[2]", "[3]"});
  expect_error([] { where(ones({2}), ones({2}), ones({2})); }, {"where", "Bool"});
  expect_error([] { masked_fill(ones({2, 3}), ones({2, 3}), 0); }, {"masked_fill", "Bool"});
  expect_error(
      [] {
        masked_fill(ones({2, 3}), ones({3, 3}, kBool), 0);
      },
      {"masked_fill", "[3, 3]", "[2, 3]"});
  expect_error([] { ones({2, 3}).add_(ones({4, 3})); }, {"add_", "[4, 3]", "[2, 3]"});
  expect_error(
      [] {
        Tensor x = ones({2}).requires_grad_();
        x.mul_(2.0);
      },
      {"mul_", "leaf", "requires grad"});
  expect_error([] { exp(Tensor()); }, {"exp", "undefined"});
}

BOOST_AUTO_TEST_SUITE_END()
