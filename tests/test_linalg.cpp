// matmul, bmm, linear and gemm: a table of cases (every rank combination of matmul, broadcast
// batches, transposed / narrowed / expanded operands, linear with and without bias) drives
// gradcheck, the PyTorch golden comparison (tests/golden/gen_linalg.py) and Float32-vs-Float64
// agreement; then the BLAS layout paths, the threading paths and the error messages.
#include <boost/test/unit_test.hpp>

#include "helpers.h"

using namespace ember;
using namespace ember::testing;

namespace {

using Inputs = const std::vector<Tensor>&;

struct Case {
  std::string name;
  std::vector<Shape> shapes;
  std::function<Tensor(Inputs)> f;
};

// Mirrors CASES in tests/golden/gen_linalg.py.
const std::vector<Case>& cases() {
  static const std::vector<Case> table = {
      {"dot", {{5}, {5}}, [](Inputs v) { return matmul(v[0], v[1]); }},
      {"mm", {{3, 4}, {4, 5}}, [](Inputs v) { return matmul(v[0], v[1]); }},
      {"vec_mat", {{4}, {4, 5}}, [](Inputs v) { return matmul(v[0], v[1]); }},
      {"mat_vec", {{3, 4}, {4}}, [](Inputs v) { return matmul(v[0], v[1]); }},
      {"batched_mat", {{2, 3, 4}, {4, 5}}, [](Inputs v) { return matmul(v[0], v[1]); }},
      {"vec_batched", {{4}, {2, 4, 5}}, [](Inputs v) { return matmul(v[0], v[1]); }},
      {"batched_vec", {{2, 3, 4}, {4}}, [](Inputs v) { return matmul(v[0], v[1]); }},
      {"mat_batched", {{3, 4}, {2, 4, 5}}, [](Inputs v) { return matmul(v[0], v[1]); }},
      {"batched_same", {{2, 3, 4}, {2, 4, 5}}, [](Inputs v) { return matmul(v[0], v[1]); }},
      {"batch_broadcast", {{2, 1, 3, 4}, {3, 4, 2}}, [](Inputs v) { return matmul(v[0], v[1]); }},
      {"size_one", {{1, 4}, {2, 4, 1}}, [](Inputs v) { return matmul(v[0], v[1]); }},
      {"attention",
       {{2, 2, 3, 4}, {2, 2, 3, 4}},
       [](Inputs v) { return matmul(v[0], v[1].transpose(-2, -1)); }},
      {"transposed_a",
       {{4, 3}, {4, 5}},
       [](Inputs v) { return matmul(v[0].transpose(0, 1), v[1]); }},
      {"transposed_both",
       {{4, 3}, {5, 4}},
       [](Inputs v) { return matmul(v[0].transpose(0, 1), v[1].transpose(0, 1)); }},
      {"narrowed", {{3, 6}, {4, 5}}, [](Inputs v) { return matmul(v[0].narrow(1, 1, 4), v[1]); }},
      {"expanded_b",
       {{3, 4}, {4, 1}},
       [](Inputs v) {
         return matmul(v[0], v[1].expand({4, 5}));
       }},
      {"permuted_batch",
       {{3, 2, 4}, {4, 5}},
       [](Inputs v) { return matmul(v[0].transpose(0, 1), v[1]); }},
      {"grad_expanded",
       {{2, 3, 4}, {2, 4, 5}},
       [](Inputs v) { return matmul(v[0], v[1]).sum({-1}); }},
      {"bmm", {{2, 3, 4}, {2, 4, 5}}, [](Inputs v) { return bmm(v[0], v[1]); }},
      {"bmm_transposed",
       {{2, 4, 3}, {2, 5, 4}},
       [](Inputs v) { return bmm(v[0].transpose(1, 2), v[1].transpose(1, 2)); }},
      {"linear", {{3, 4}, {5, 4}, {5}}, [](Inputs v) { return linear(v[0], v[1], v[2]); }},
      {"linear_nobias", {{3, 4}, {5, 4}}, [](Inputs v) { return linear(v[0], v[1]); }},
      {"linear_3d", {{2, 3, 4}, {5, 4}, {5}}, [](Inputs v) { return linear(v[0], v[1], v[2]); }},
      {"linear_1d", {{4}, {5, 4}, {5}}, [](Inputs v) { return linear(v[0], v[1], v[2]); }},
      {"linear_transposed_x",
       {{3, 2, 4}, {5, 4}, {5}},
       [](Inputs v) { return linear(v[0].transpose(0, 1), v[1], v[2]); }},
      {"linear_transposed_w",
       {{3, 4}, {4, 5}, {5}},
       [](Inputs v) { return linear(v[0], v[1].transpose(0, 1), v[2]); }},
  };
  return table;
}

// matmul by broadcasting and summing, an independent reference: (..., m, k, 1) * (..., 1, k, n).
Tensor reference_matmul(const Tensor& a, const Tensor& b) {
  return (a.unsqueeze(-1) * b.unsqueeze(-3)).sum({-2});
}

}  // namespace

BOOST_AUTO_TEST_SUITE(test_linalg)

BOOST_AUTO_TEST_CASE(gradcheck_cases) {
  manual_seed(1);
  for (const Case& c : cases()) {
    std::vector<Tensor> inputs;
    for (const Shape& s : c.shapes) inputs.push_back(leaf(s));
    check_gradient(c.f, inputs, c.name);
  }
}

BOOST_AUTO_TEST_CASE(gradcheck_one_input_needs_grad) {
  manual_seed(2);
  for (const Case& c : cases()) {
    for (size_t skip = 0; skip < c.shapes.size(); ++skip) {
      std::vector<Tensor> inputs;
      for (size_t i = 0; i < c.shapes.size(); ++i)
        inputs.push_back(i == skip ? randn(c.shapes[i], kFloat64) : leaf(c.shapes[i]));
      if (c.shapes.size() > 1) check_gradient(c.f, inputs, c.name + " without input grad");
    }
  }
}

BOOST_AUTO_TEST_CASE(pytorch_golden) {
  const Golden golden("linalg.json");
  for (const Case& c : cases()) {
    std::vector<Tensor> inputs;
    for (size_t i = 0; i < c.shapes.size(); ++i)
      inputs.push_back(golden[c.name + ".in" + std::to_string(i)].requires_grad_());
    const Tensor out = c.f(inputs);
    expect_close(out, golden[c.name + ".out"], 1e-10, 1e-12, c.name + " forward");
    out.backward(golden[c.name + ".grad_out"]);
    for (size_t i = 0; i < inputs.size(); ++i)
      expect_close(inputs[i].grad(), golden[c.name + ".grad" + std::to_string(i)], 1e-10, 1e-12,
                   c.name + " grad of input " + std::to_string(i));
  }
}

BOOST_AUTO_TEST_CASE(float32_agrees_with_float64) {
  const Golden golden("linalg.json");
  for (const Case& c : cases()) {
    std::vector<Tensor> x64, x32;
    for (size_t i = 0; i < c.shapes.size(); ++i) {
      x64.push_back(golden[c.name + ".in" + std::to_string(i)]);
      x32.push_back(x64.back().to(kFloat32));
    }
    const Tensor y32 = c.f(x32);
    BOOST_TEST(y32.dtype() == kFloat32);
    expect_close(y32, c.f(x64), 1e-5, 1e-5, c.name + " Float32");
  }
}

BOOST_AUTO_TEST_CASE(transposed_operand_equals_contiguous_copy) {
  manual_seed(3);
  for (DType dtype : {kFloat64, kFloat32}) {
    const Tensor a = randn({7, 5}, dtype), b = randn({6, 7}, dtype);
    const Tensor at = a.transpose(0, 1), bt = b.transpose(0, 1);
    BOOST_TEST(!at.is_contiguous());
    const Tensor want = matmul(at.contiguous(), bt.contiguous());
    expect_close(matmul(at, bt), want, 1e-6, 1e-6, "2-D, both transposed");
    expect_close(matmul(at, b.transpose(0, 1).contiguous()), want, 1e-6, 1e-6, "a transposed");
    // (B, h, T, d) @ (B, h, d, T) with k transposed, as in attention
    const Tensor q = randn({2, 3, 4, 8}, dtype), k = randn({2, 3, 4, 8}, dtype);
    const Tensor kt = k.transpose(-2, -1);
    expect_close(matmul(q, kt), matmul(q, kt.contiguous()), 1e-6, 1e-6, "batched kᵀ");
    expect_close(bmm(q.reshape({6, 4, 8}), kt.reshape({6, 8, 4})),
                 matmul(q, kt.contiguous()).reshape({6, 4, 4}), 1e-6, 1e-6, "bmm kᵀ");
    const Tensor w = randn({8, 5}, dtype);
    expect_close(linear(q, w.transpose(0, 1)), matmul(q, w), 1e-6, 1e-6, "linear with Wᵀ view");
  }
}

BOOST_AUTO_TEST_CASE(matches_reference_on_every_threading_path) {
  manual_seed(4);
  // many small matrices (parallel over the batch), a large product (BLAS threads), a 2-D
  // operand broadcast over a batch that does not fold, and empty dims
  const std::vector<std::pair<Shape, Shape>> shapes = {
      {{64, 8, 9}, {64, 9, 7}}, {{2, 70, 80}, {2, 80, 60}}, {{3, 1, 6, 5}, {4, 5, 6}},
      {{4, 0, 3}, {3, 2}},      {{2, 3, 0}, {2, 0, 4}},     {{0, 2, 3}, {3, 4}}};
  for (const auto& [sa, sb] : shapes) {
    const Tensor a = randn(sa, kFloat64), b = randn(sb, kFloat64);
    expect_close(matmul(a, b), reference_matmul(a, b), 1e-10, 1e-10,
                 fmt::format("{} @ {}", sa, sb));
  }
  const Tensor big = randn({300, 200}, kFloat32), small = randn({200, 100}, kFloat32);
  expect_close(matmul(big, small), reference_matmul(big.to(kFloat64), small.to(kFloat64)), 1e-4,
               1e-4, "Float32 300x200 @ 200x100");
}

BOOST_AUTO_TEST_CASE(mixed_dtypes_promote) {
  manual_seed(5);
  Tensor a = randn({3, 4}, kFloat32).requires_grad_();
  Tensor b = randn({4, 2}, kFloat64).requires_grad_();
  const Tensor c = matmul(a, b);
  BOOST_TEST(c.dtype() == kFloat64);
  expect_close(c, matmul(a.detach().to(kFloat64), b.detach()), 1e-12, 1e-12, "mixed");
  c.sum().backward();
  BOOST_TEST(a.grad().dtype() == kFloat32);
  BOOST_TEST(b.grad().dtype() == kFloat64);
  const Tensor y = linear(randn({2, 4}, kFloat32), randn({3, 4}, kFloat32), randn({3}, kFloat64));
  BOOST_TEST(y.dtype() == kFloat64);
}

BOOST_AUTO_TEST_CASE(shapes_follow_torch) {
  BOOST_TEST(matmul(ones({5}), ones({5})).dim() == 0);
  BOOST_TEST(matmul(ones({5}), ones({5})).item<float>() == 5.0f);
  BOOST_TEST((matmul(ones({4}), ones({2, 4, 5})).shape() == Shape{2, 5}));
  BOOST_TEST((matmul(ones({2, 3, 4}), ones({4})).shape() == Shape{2, 3}));
  BOOST_TEST((matmul(ones({2, 1, 3, 4}), ones({5, 4, 2})).shape() == Shape{2, 5, 3, 2}));
  BOOST_TEST((linear(ones({2, 3, 4}), ones({5, 4})).shape() == Shape{2, 3, 5}));
  BOOST_TEST((ones({2, 3}).matmul(ones({3, 1})).shape() == Shape{2, 1}));
  BOOST_TEST((ones({2, 2, 3}).bmm(ones({2, 3, 1})).shape() == Shape{2, 2, 1}));
  // a 1·k by k·1 product with k = 0 is an empty sum
  BOOST_TEST(matmul(ones({0}), ones({0})).item<float>() == 0.0f);
  BOOST_TEST(linear(ones({2, 0}), ones({3, 0}), full({3}, 2.0)).sum().item<float>() == 12.0f);
}

BOOST_AUTO_TEST_CASE(gemm_accumulates_and_writes_column_major) {
  manual_seed(6);
  const Tensor a = randn({3, 4}, kFloat64), b = randn({4, 2}, kFloat64);
  const Tensor c0 = randn({3, 2}, kFloat64);
  Tensor c = c0.clone();
  gemm(a, b, c, 2.0, 0.5);  // c = 2 a b + 0.5 c
  expect_close(c, matmul(a, b) * 2.0 + c0 * 0.5, 1e-12, 1e-12, "alpha, beta");
  Tensor storage = zeros({2, 3}, kFloat64);
  gemm(a, b, storage.transpose(0, 1));  // a column-major output
  expect_close(storage.transpose(0, 1), matmul(a, b), 1e-12, 1e-12, "column-major c");
  expect_error([&] { gemm(a, b, zeros({1, 3, 2}, kFloat64)); }, {"gemm", "expected 2-D"});
  expect_error(
      [&] {
        gemm(a, b, zeros({3, 1}, kFloat64).expand({3, 2}));
      },
      {"gemm", "neither row- nor column-major"});
  expect_error([&] { gemm(a, b, zeros({3, 2})); }, {"gemm", "Float64", "Float32"});
}

BOOST_AUTO_TEST_CASE(backward_refuses_modified_input) {
  Tensor a = ones({2, 3}, kFloat64).requires_grad_();
  Tensor b = ones({3, 2}, kFloat64);
  const Tensor c = matmul(a, b);
  b.add_(1.0);
  expect_error([&] { c.sum().backward(); }, {"MatmulBackward", "in-place"});
  NoGradGuard no_grad;
  BOOST_TEST(!matmul(a, b).requires_grad());
}

BOOST_AUTO_TEST_CASE(errors) {
  expect_error(
      [] {
        matmul(ones({2, 3}), ones({4, 5}));
      },
      {"matmul: shapes [2, 3] and [4, 5] cannot be multiplied (3 != 4)"});
  expect_error([] { matmul(ones({3}), ones({4})); }, {"matmul", "[3] and [4]", "(3 != 4)"});
  expect_error([] { matmul(ones({2, 3, 4}), ones({5})); }, {"matmul", "[2, 3, 4] and [5]"});
  expect_error(
      [] {
        matmul(ones({2, 3, 4}), ones({3, 4, 5}));
      },
      {"matmul: batch dims", "[2, 3, 4] and [3, 4, 5]", "(2 vs 3)"});
  expect_error([] { matmul(scalar_tensor(1.0), ones({3})); },
               {"matmul", "at least 1 dim", "[] and [3]"});
  expect_error(
      [] {
        matmul(arange(0, 4, 1, kInt64).reshape({2, 2}), ones({2, 2}));
      },
      {"matmul: expected Float32 or Float64", "Int64"});
  expect_error([] { matmul(ones({2}), Tensor()); }, {"matmul", "undefined"});
  expect_error([] { bmm(ones({3, 4}), ones({2, 4, 5})); }, {"bmm", "3-D", "[3, 4] and [2, 4, 5]"});
  expect_error(
      [] {
        bmm(ones({2, 3, 4}), ones({3, 4, 5}));
      },
      {"bmm", "batch", "[2, 3, 4] and [3, 4, 5]", "(2 != 3)"});
  expect_error(
      [] {
        bmm(ones({2, 3, 4}), ones({2, 5, 6}));
      },
      {"bmm", "cannot be multiplied", "(4 != 5)"});
  expect_error([] { bmm(ones({2, 3, 4}, kBool), ones({2, 4, 5})); }, {"bmm", "Bool"});
  expect_error(
      [] {
        linear(ones({2, 3}), ones({5, 4}));
      },
      {"linear", "[2, 3]", "3 features", "[5, 4]", "expects 4"});
  expect_error(
      [] {
        linear(ones({2, 4}), ones({5, 4}), ones({4}));
      },
      {"linear", "bias of shape [4]", "5 output features"});
  expect_error([] { linear(ones({2, 4}), ones({4})); }, {"linear", "weight must be 2-D", "[4]"});
  expect_error(
      [] {
        linear(scalar_tensor(1.0), ones({5, 1}));
      },
      {"linear", "at least 1 dim", "[]"});
}

BOOST_AUTO_TEST_SUITE_END()
