// matmul, bmm, linear and gemm: one table of cases (tests/op_table.h: every rank combination of
// matmul, broadcast batches, transposed / narrowed / expanded operands, linear with and without
// bias) drives gradcheck on several layouts, the PyTorch golden values and gradients and the edge
// cases; then the BLAS layout paths against a reference, the threading paths and the errors.
#include <cmath>
#include <cstring>
#include <limits>

#include <boost/test/unit_test.hpp>

#include "ops/gemm_amx.h"
#include "tests/edge_shapes.h"

using namespace ember;
using namespace ember::testing;

namespace {

using Inputs = const std::vector<Tensor>&;

// One row per op case; tests/op_table.h says what the fields mean. After adding or changing a
// row, run /usr/bin/python3 tests/golden/gen_op_tables.py. The rows are laid out by hand as a
// table (one line each, two when long), out of clang-format's reach. Every rank combination of
// matmul; transposed and narrowed operands are the table's layouts (transposed_a,
// transposed_both and narrowed before it), the other views are rows.
// clang-format off
const OpTable kLinalgOps = {
    {"matmul dot", "a @ b", {{5}, {5}}, {}, [](auto& v) { return matmul(v[0], v[1]); }},
    {"matmul mm", "a @ b", {{3, 4}, {4, 5}}, {}, [](auto& v) { return matmul(v[0], v[1]); }},
    {"matmul vector-matrix", "a @ b", {{4}, {4, 5}}, {},
     [](auto& v) { return matmul(v[0], v[1]); }},
    {"matmul matrix-vector", "a @ b", {{3, 4}, {4}}, {},
     [](auto& v) { return matmul(v[0], v[1]); }},
    {"matmul batched-matrix", "a @ b", {{2, 3, 4}, {4, 5}}, {},
     [](auto& v) { return matmul(v[0], v[1]); }},
    {"matmul vector-batched", "a @ b", {{4}, {2, 4, 5}}, {},
     [](auto& v) { return matmul(v[0], v[1]); }},
    {"matmul batched-vector", "a @ b", {{2, 3, 4}, {4}}, {},
     [](auto& v) { return matmul(v[0], v[1]); }},
    {"matmul matrix-batched", "a @ b", {{3, 4}, {2, 4, 5}}, {},
     [](auto& v) { return matmul(v[0], v[1]); }},
    {"matmul batched", "torch.matmul(a, b)", {{2, 3, 4}, {2, 4, 5}}, {},
     [](auto& v) { return v[0].matmul(v[1]); }},
    {"matmul batch broadcast", "a @ b", {{2, 1, 3, 4}, {3, 4, 2}}, {},
     [](auto& v) { return matmul(v[0], v[1]); }},
    {"matmul size-1", "a @ b", {{1, 4}, {2, 4, 1}}, {}, [](auto& v) { return matmul(v[0], v[1]); }},
    {"matmul transpose attention", "a @ b.transpose(-2, -1)", {{2, 2, 3, 4}, {2, 2, 3, 4}}, {},
     [](auto& v) { return matmul(v[0], v[1].transpose(-2, -1)); }},
    {"matmul expand", "a @ b.expand(4, 5)", {{3, 4}, {4, 1}}, {},
     [](auto& v) { return matmul(v[0], v[1].expand({4, 5})); }},
    {"transpose then matmul permuted batch", "a.transpose(0, 1) @ b", {{3, 2, 4}, {4, 5}}, {},
     [](auto& v) { return matmul(v[0].transpose(0, 1), v[1]); }},
    {"matmul then sum", "(a @ b).sum(-1)", {{2, 3, 4}, {2, 4, 5}}, {},
     [](auto& v) { return matmul(v[0], v[1]).sum({-1}); }},
    {"bmm", "torch.bmm(a, b)", {{2, 3, 4}, {2, 4, 5}}, {}, [](auto& v) { return bmm(v[0], v[1]); }},
    {"bmm transpose", "torch.bmm(a.transpose(1, 2), b.transpose(1, 2))", {{2, 4, 3}, {2, 5, 4}},
     {}, [](auto& v) { return bmm(v[0].transpose(1, 2), v[1].transpose(1, 2)); }},
    // linear: the bias is optional (undefined means none)
    {"linear", "F.linear(a, b, c)", {{3, 4}, {5, 4}, {5}}, {},
     [](auto& v) { return linear(v[0], v[1], v[2]); }, kOptionalInputs},
    {"linear no bias", "F.linear(a, b)", {{3, 4}, {5, 4}}, {},
     [](auto& v) { return linear(v[0], v[1]); }},
    {"linear 3-D", "F.linear(a, b, c)", {{2, 3, 4}, {5, 4}, {5}}, {},
     [](auto& v) { return linear(v[0], v[1], v[2]); }, kOptionalInputs},
    {"linear 1-D", "F.linear(a, b, c)", {{4}, {5, 4}, {5}}, {},
     [](auto& v) { return linear(v[0], v[1], v[2]); }, kOptionalInputs},
    {"transpose then linear", "F.linear(a.transpose(0, 1), b, c)", {{3, 2, 4}, {5, 4}, {5}}, {},
     [](auto& v) { return linear(v[0].transpose(0, 1), v[1], v[2]); }, kOptionalInputs},
    {"linear transpose weight", "F.linear(a, b.t(), c)", {{3, 4}, {4, 5}, {5}}, {},
     [](auto& v) { return linear(v[0], v[1].transpose(0, 1), v[2]); }, kOptionalInputs},
};
// clang-format on

// matmul by broadcasting and summing, an independent reference: (..., m, k, 1) * (..., 1, k, n),
// with torch's unit dims for 1-D operands.
Tensor reference_matmul(const Tensor& a, const Tensor& b) {
  if (a.dim() == 1) return reference_matmul(a.unsqueeze(0), b).squeeze(-2);
  if (b.dim() == 1) return reference_matmul(a, b.unsqueeze(-1)).squeeze(-1);
  return (a.unsqueeze(-1) * b.unsqueeze(-3)).sum({-2});
}

// The products under test, or their references.
struct Products {
  std::function<Tensor(const Tensor&, const Tensor&)> matmul, bmm;
  std::function<Tensor(const Tensor&, const Tensor&, const Tensor&)> linear;
};
const Products ember_ops{
    [](const Tensor& a, const Tensor& b) { return matmul(a, b); },
    [](const Tensor& a, const Tensor& b) { return bmm(a, b); },
    [](const Tensor& x, const Tensor& w, const Tensor& b) { return linear(x, w, b); }};
const Products reference_ops{reference_matmul, reference_matmul,
                             [](const Tensor& x, const Tensor& w, const Tensor& b) {
                               return reference_matmul(x, w.transpose(0, 1)) + b;
                             }};

// Cases large enough (over 512 multiply-adds per matrix) to go through BLAS rather than the
// small-matrix loop: transpose flags, leading dims, copies of unreadable layouts, the fold of
// batched · 2-D into one gemm, gradients arriving transposed. Checked by gradcheck and against
// the reference products.
struct BlasCase {
  std::string name;
  std::vector<Shape> shapes;
  std::function<Tensor(Inputs, const Products&)> f;
};

const std::vector<BlasCase>& blas_cases() {
  using P = const Products&;
  static const std::vector<BlasCase> table = {
      {"mm", {{10, 12}, {12, 9}}, [](Inputs v, P p) { return p.matmul(v[0], v[1]); }},
      {"transposed_a",
       {{12, 10}, {12, 9}},
       [](Inputs v, P p) { return p.matmul(v[0].transpose(0, 1), v[1]); }},
      {"transposed_both",
       {{12, 10}, {9, 12}},
       [](Inputs v, P p) { return p.matmul(v[0].transpose(0, 1), v[1].transpose(0, 1)); }},
      {"narrowed_lda",
       {{10, 15}, {12, 20}},
       [](Inputs v, P p) { return p.matmul(v[0].narrow(1, 2, 12), v[1].narrow(1, 3, 9)); }},
      {"expanded_b_copied",
       {{10, 12}, {12, 1}},
       [](Inputs v, P p) {
         return p.matmul(v[0], v[1].expand({12, 9}));
       }},
      {"expanded_batch",
       {{10, 12}, {3, 12, 9}},
       [](Inputs v, P p) {
         return p.matmul(v[0].expand({3, 10, 12}), v[1]);
       }},
      {"attention",
       {{2, 2, 10, 8}, {2, 2, 10, 8}},
       [](Inputs v, P p) { return p.matmul(v[0], v[1].transpose(-2, -1)); }},
      {"attention_head_views",  // (B, T, h·d) -> (B, h, T, d): ld = h·d, no copies
       {{2, 10, 16}, {2, 10, 16}},
       [](Inputs v, P p) {
         const Tensor q = v[0].view({2, 10, 2, 8}).transpose(1, 2);
         const Tensor k = v[1].view({2, 10, 2, 8}).transpose(1, 2);
         return p.matmul(p.matmul(q, k.transpose(-2, -1)), q);
       }},
      {"batch_broadcast",
       {{2, 1, 10, 8}, {3, 8, 9}},
       [](Inputs v, P p) { return p.matmul(v[0], v[1]); }},
      {"mat_batched", {{10, 12}, {2, 12, 9}}, [](Inputs v, P p) { return p.matmul(v[0], v[1]); }},
      {"vec_batched", {{40}, {2, 40, 20}}, [](Inputs v, P p) { return p.matmul(v[0], v[1]); }},
      {"batched_vec", {{2, 20, 40}, {40}}, [](Inputs v, P p) { return p.matmul(v[0], v[1]); }},
      {"batched_mat_folded",
       {{2, 10, 12}, {12, 9}},
       [](Inputs v, P p) { return p.matmul(v[0], v[1]); }},
      {"permuted_batch",
       {{10, 2, 12}, {12, 9}},
       [](Inputs v, P p) { return p.matmul(v[0].transpose(0, 1), v[1]); }},
      {"grad_transposed",
       {{2, 10, 12}, {2, 12, 9}},
       [](Inputs v, P p) { return p.matmul(v[0], v[1]).transpose(-2, -1); }},
      {"bmm_transposed",
       {{2, 12, 10}, {2, 9, 12}},
       [](Inputs v, P p) { return p.bmm(v[0].transpose(1, 2), v[1].transpose(1, 2)); }},
      {"linear_3d",
       {{2, 10, 12}, {9, 12}, {9}},
       [](Inputs v, P p) { return p.linear(v[0], v[1], v[2]); }},
      {"linear_transposed_x",
       {{10, 2, 12}, {9, 12}, {9}},
       [](Inputs v, P p) { return p.linear(v[0].transpose(0, 1), v[1], v[2]); }},
      {"linear_transposed_w",
       {{20, 12}, {12, 9}, {9}},
       [](Inputs v, P p) { return p.linear(v[0], v[1].transpose(0, 1), v[2]); }},
      {"linear_grad_transposed",
       {{20, 12}, {9, 12}, {9}},
       [](Inputs v, P p) { return p.linear(v[0], v[1], v[2]).transpose(0, 1); }},
  };
  return table;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(test_linalg)

BOOST_AUTO_TEST_CASE(table_gradcheck) { check_gradients(kLinalgOps); }
BOOST_AUTO_TEST_CASE(table_gradgradcheck) { check_gradgradients(kLinalgOps); }
BOOST_AUTO_TEST_CASE(table_forward_ad) { check_forward_gradients(kLinalgOps); }
BOOST_AUTO_TEST_CASE(table_create_graph_gradients) { check_create_graph_gradients(kLinalgOps); }
BOOST_AUTO_TEST_CASE(table_golden) { check_golden(kLinalgOps); }
BOOST_AUTO_TEST_CASE(table_edge_cases) { check_edge_cases(kLinalgOps); }
BOOST_AUTO_TEST_CASE(table_edge_shapes) { check_edge_shapes(kLinalgOps); }
BOOST_AUTO_TEST_CASE(table_anomaly) { check_anomaly(kLinalgOps); }
BOOST_AUTO_TEST_CASE(table_on_device) { check_on_device(kLinalgOps); }

BOOST_AUTO_TEST_CASE(blas_cases_gradcheck_and_reference) {
  manual_seed(7);
  for (const BlasCase& c : blas_cases()) {
    std::vector<Tensor> inputs;
    for (const Shape& s : c.shapes) inputs.push_back(leaf(s));
    const auto f = [&](Inputs v) { return c.f(v, ember_ops); };
    check_gradient(f, inputs, c.name);
    expect_close(f(inputs), c.f(inputs, reference_ops), 1e-10, 1e-10, c.name + " vs reference");
    std::vector<Tensor> x32;
    for (const Tensor& x : inputs) x32.push_back(x.detach().to(kFloat32));
    expect_close(c.f(x32, ember_ops), f(inputs), 1e-5, 1e-5, c.name + " Float32");
  }
}

BOOST_AUTO_TEST_CASE(transposed_operand_equals_contiguous_copy) {
  manual_seed(3);
  for (DType dtype : {kFloat64, kFloat32}) {
    const Tensor a = randn({17, 15}, dtype), b = randn({16, 17}, dtype);
    const Tensor at = a.transpose(0, 1), bt = b.transpose(0, 1);
    BOOST_TEST(!at.is_contiguous());
    const Tensor want = matmul(at.contiguous(), bt.contiguous());
    expect_close(matmul(at, bt), want, 1e-6, 1e-6, "2-D, both transposed");
    expect_close(matmul(at, b.transpose(0, 1).contiguous()), want, 1e-6, 1e-6, "a transposed");
    // (B, h, T, d) @ (B, h, d, T) with k transposed, as in attention
    const Tensor q = randn({2, 3, 12, 16}, dtype), k = randn({2, 3, 12, 16}, dtype);
    const Tensor kt = k.transpose(-2, -1);
    expect_close(matmul(q, kt), matmul(q, kt.contiguous()), 1e-6, 1e-6, "batched kᵀ");
    expect_close(bmm(q.reshape({6, 12, 16}), kt.reshape({6, 16, 12})),
                 matmul(q, kt.contiguous()).reshape({6, 12, 12}), 1e-6, 1e-6, "bmm kᵀ");
    const Tensor w = randn({16, 10}, dtype);
    expect_close(linear(q, w.transpose(0, 1)), matmul(q, w), 1e-6, 1e-6, "linear with Wᵀ view");
  }
}

BOOST_AUTO_TEST_CASE(matches_reference_on_every_threading_path) {
  manual_seed(4);
  // many small matrices (plain loop, then BLAS, parallel over the batch), a large product
  // (BLAS threads), a 2-D operand broadcast over a batch that does not fold, an empty sum
  const std::vector<std::pair<Shape, Shape>> shapes = {{{64, 8, 8}, {64, 8, 8}},
                                                       {{64, 9, 10}, {64, 10, 8}},
                                                       {{2, 70, 80}, {2, 80, 60}},
                                                       {{3, 1, 6, 5}, {4, 5, 6}},
                                                       {{2, 3, 0}, {2, 0, 4}}};
  for (const auto& [sa, sb] : shapes) {
    const Tensor a = randn(sa, kFloat64), b = randn(sb, kFloat64);
    expect_close(matmul(a, b), reference_matmul(a, b), 1e-10, 1e-10,
                 fmt::format("{} @ {}", sa, sb));
  }
  // empty outputs
  BOOST_TEST((matmul(ones({4, 0, 3}), ones({3, 2})).shape() == Shape{4, 0, 2}));
  BOOST_TEST((matmul(ones({0, 2, 3}), ones({3, 4})).shape() == Shape{0, 2, 4}));
  BOOST_TEST((linear(ones({0, 3}), ones({2, 3}), ones({2})).shape() == Shape{0, 2}));
  const Tensor big = randn({300, 200}, kFloat32), small = randn({200, 100}, kFloat32);
  expect_close(matmul(big, small), reference_matmul(big.to(kFloat64), small.to(kFloat64)), 1e-4,
               1e-4, "Float32 300x200 @ 200x100");
}

BOOST_AUTO_TEST_CASE(plain_loop_layouts_match_reference) {
  // The plain loop (tiny products, and matrix-vector ones up to 65536 multiply-adds) has a dot
  // form (a's rows and b's columns contiguous), a row form (b's rows contiguous) and a general
  // one; each with alpha and beta, and matrix-vector products on both sides of the BLAS limit.
  // Then the narrow products' loop.
  manual_seed(8);
  const auto check = [](const Tensor& a, const Tensor& b, const std::string& what) {
    const Tensor c0 = randn({a.size(0), b.size(1)}, kFloat64);
    Tensor c = c0.clone();
    gemm(a, b, c, 1.5, -0.5);
    expect_close(c, reference_matmul(a, b) * 1.5 - c0 * 0.5, 1e-11, 1e-11, what);
    expect_close(matmul(a, b), reference_matmul(a, b), 1e-11, 1e-11, what + ", beta 0");
    Tensor column_major = zeros({b.size(1), a.size(0)}, kFloat64).transpose(0, 1);
    gemm(a, b, column_major);
    expect_close(column_major, reference_matmul(a, b), 1e-11, 1e-11, what + ", column-major");
  };
  // k = 1 is an outer product (bmm's backward of batched dots), looped along C's longer side.
  for (const auto& [m, k, n] :
       {std::tuple{3, 7, 5}, std::tuple{1, 999, 1}, std::tuple{1, 300, 200},
        std::tuple{200, 300, 1}, std::tuple{1, 400, 200}, std::tuple{4, 1, 6}, std::tuple{6, 1, 4},
        std::tuple{1, 1, 999}, std::tuple{999, 1, 1}}) {
    const std::string size = fmt::format("({}, {}) x ({}, {})", m, k, k, n);
    const Tensor a = randn({m, k}, kFloat64), at = randn({k, m}, kFloat64).transpose(0, 1);
    const Tensor b = randn({k, n}, kFloat64), bt = randn({n, k}, kFloat64).transpose(0, 1);
    check(a, bt, "dot form " + size);
    check(at, b, "row form " + size);
    check(at, bt, "general " + size);
  }
  // Narrow products (Note [Narrow products]): C of up to four vectors of columns, any operand
  // layout, rows past a block of four, k = 1; Float64's vectors hold 8, Float32's 16.
  for (const auto& [m, k, n] : {std::tuple{10, 16, 8}, std::tuple{13, 7, 9}, std::tuple{5, 30, 17},
                                std::tuple{9, 40, 32}, std::tuple{21, 1, 24}}) {
    const std::string size = fmt::format("narrow ({}, {}) x ({}, {})", m, k, k, n);
    const Tensor a = randn({m, k}, kFloat64), at = randn({k, m}, kFloat64).transpose(0, 1);
    const Tensor b = randn({k, n}, kFloat64), bt = randn({n, k}, kFloat64).transpose(0, 1);
    check(a, b, size + ", rows");
    check(a, bt, size + ", dot");
    check(at, bt, size + ", general");
  }
  for (const auto& [m, k, n] : {std::tuple{10, 16, 16}, std::tuple{6, 33, 17},
                                std::tuple{11, 20, 49}, std::tuple{4, 64, 64}}) {
    const std::string size = fmt::format("Float32 narrow ({}, {}) x ({}, {})", m, k, k, n);
    const Tensor a = randn({m, k}), bt = randn({n, k}).transpose(0, 1);
    expect_close(matmul(a, bt).to(kFloat64), reference_matmul(a.to(kFloat64), bt.to(kFloat64)),
                 1e-5, 1e-5, size);
    const Tensor batch = randn({3, m, k}), other = randn({3, k, n});
    expect_close(bmm(batch, other).to(kFloat64),
                 reference_matmul(batch.to(kFloat64), other.to(kFloat64)), 1e-5, 1e-5,
                 size + ", batched");
  }
  // Batched dot products, as attention pooling: (n, 1, k) x (n, k, 1), and their gradients
  // (outer products).
  const Tensor w = randn({50, 1, 49}, kFloat64).requires_grad_(),
               v = randn({50, 49, 1}, kFloat64).requires_grad_();
  expect_close(bmm(w, v), reference_matmul(w, v), 1e-12, 1e-12, "batched dots");
  const Tensor g = randn({50, 1, 1}, kFloat64);
  bmm(w, v).backward(g);
  expect_close(w.grad(), reference_matmul(g, v.detach().transpose(1, 2)), 1e-12, 1e-12, "dW");
  expect_close(v.grad(), reference_matmul(w.detach().transpose(1, 2), g), 1e-12, 1e-12, "dV");
}

BOOST_AUTO_TEST_CASE(mixed_float_dtypes_are_refused) {
  // As torch: no silent promotion of a Float32 operand to Float64 in a product.
  expect_error(
      [] {
        matmul(ones({2, 3}), ones({3, 2}, kFloat64));
      },
      {"matmul", "Float32", "Float64"});
  expect_error([] { bmm(ones({1, 2, 3}, kFloat64), ones({1, 3, 2})); }, {"bmm", "Float64"});
  expect_error([] { linear(ones({2, 3}), ones({4, 3}, kFloat64)); }, {"linear", "Float64"});
  expect_error(
      [] {
        linear(ones({2, 3}), ones({4, 3}), ones({4}, kFloat64));
      },
      {"linear", "bias", "Float64"});
  // Either order, every matmul form (1-D, batched, broadcast), and a Float64 input to linear.
  expect_error([] { matmul(ones({3}, kFloat64), ones({3, 2})); }, {"matmul", "Float64", "Float32"});
  expect_error([] { matmul(ones({3}), ones({3}, kFloat64)); }, {"matmul", "Float32", "Float64"});
  expect_error([] { matmul(ones({2, 2, 3}, kFloat64), ones({3, 4})); }, {"matmul", "Float64"});
  expect_error(
      [] {
        bmm(ones({1, 2, 3}), ones({1, 3, 2}, kFloat64));
      },
      {"bmm", "Float32", "Float64"});
  expect_error(
      [] {
        linear(ones({2, 3}, kFloat64), ones({4, 3}));
      },
      {"linear", "Float64", "Float32"});
  expect_error([] { ones({2, 3}).matmul(ones({3, 2}, kFloat64)); }, {"matmul", "Float64"});
  // Integral operands are refused too, as torch ("not implemented for 'Long'").
  expect_error([] { matmul(ones({2, 3}, kInt64), ones({3, 2}, kInt64)); }, {"matmul", "Int64"});
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
  // (m, k, n) for the plain loop and for BLAS, with a transposed a in the second
  for (const auto& [m, k, n] : {std::tuple{3, 4, 2}, std::tuple{12, 10, 9}}) {
    const Tensor a = randn({k, m}, kFloat64).transpose(0, 1), b = randn({k, n}, kFloat64);
    const Tensor c0 = randn({m, n}, kFloat64);
    Tensor c = c0.clone();
    gemm(a, b, c, 2.0, 0.5);  // c = 2 a b + 0.5 c
    expect_close(c, reference_matmul(a, b) * 2.0 + c0 * 0.5, 1e-12, 1e-12, "alpha, beta");
    Tensor storage = zeros({n, m}, kFloat64);
    gemm(a, b, storage.transpose(0, 1));  // a column-major output
    expect_close(storage.transpose(0, 1), reference_matmul(a, b), 1e-12, 1e-12, "column-major c");
  }
  const Tensor a = randn({3, 4}, kFloat64), b = randn({4, 2}, kFloat64);
  expect_error([&] { gemm(a, b, zeros({1, 3, 2}, kFloat64)); }, {"gemm", "expected 2-D"});
  expect_error(
      [&] {
        gemm(a, b, zeros({3, 1}, kFloat64).expand({3, 2}));
      },
      {"gemm", "neither row- nor column-major"});
  expect_error([&] { gemm(a, b, zeros({3, 2})); }, {"gemm", "Float64", "Float32"});
}

// Float32 values rounded to bfloat16 (to nearest, ties to even), as Float64: the operands the
// "medium" products multiply.
Tensor round_to_bfloat16(const Tensor& x) {
  Tensor out = x.to(kFloat32).contiguous().clone();
  float* p = out.data<float>();
  for (int64_t i = 0; i < out.numel(); ++i) {
    uint32_t u;
    std::memcpy(&u, p + i, 4);
    u = (u + 0x7FFFu + ((u >> 16) & 1u)) & 0xFFFF0000u;
    std::memcpy(p + i, &u, 4);
  }
  return out.to(kFloat64);
}

// Sets a matmul precision for one scope, then restores "highest".
struct PrecisionScope {
  explicit PrecisionScope(const std::string& p) { set_float32_matmul_precision(p); }
  ~PrecisionScope() { set_float32_matmul_precision("highest"); }
};

void medium_precision_products();
void linear_bias_products();

// Runs body once on Ember's bfloat16 kernel and, on a CPU with AMX-BF16, once more with the
// products large enough for it on AMX tiles (Note [bfloat16 products on AMX]).
template <class Body>
void on_each_bfloat16_kernel(Body body) {
  const bool amx = ember::detail::amx_products();
  for (const bool on : {false, true}) {
    if (on && !amx) break;
    ember::detail::set_amx_products(on);
    BOOST_TEST_CONTEXT("AMX " << (on ? "on" : "off")) { body(); }
  }
  ember::detail::set_amx_products(amx);
}

BOOST_AUTO_TEST_CASE(medium_precision_rounds_operands_to_bfloat16) {
  on_each_bfloat16_kernel(medium_precision_products);
}

BOOST_AUTO_TEST_CASE(amx_runs_the_large_bfloat16_products) {
  // where the CPU has AMX-BF16 the large "medium" products run there (a primitive per shape, and
  // per thread's block of it, in its cache), the small ones and those with AMX switched off on
  // Ember's kernel; elsewhere nothing is cached
  PrecisionScope medium("medium");
  const bool amx = ember::detail::amx_products() && float32_matmul_uses_bfloat16();
  const int64_t before = ember::detail::amx_cached_primitives();
  (void)matmul(randn({130, 140}), randn({140, 136}));  // 2^21 multiply-adds: to AMX
  BOOST_TEST((ember::detail::amx_cached_primitives() > before) == amx);
  // a product large enough for two threads (oneDNN's, on AMX): the same bits on one and on two
  const Tensor a = randn({300, 500}), b = randn({500, 700});
  set_num_threads(1);
  const Tensor one = matmul(a, b);
  set_num_threads(2);
  const Tensor two = matmul(a, b);
  set_num_threads(0);
  if (amx) BOOST_TEST((one - two).abs().max().item<double>() == 0.0);
  const int64_t made = ember::detail::amx_cached_primitives();
  const Tensor s = randn({40, 40});
  (void)matmul(s, s);  // 2^16: stays on Ember's kernel
  BOOST_TEST(ember::detail::amx_cached_primitives() == made);
  const bool was = ember::detail::amx_products();
  ember::detail::set_amx_products(false);
  BOOST_TEST(!ember::detail::amx_products());
  (void)matmul(randn({131, 140}), randn({140, 136}));
  BOOST_TEST(ember::detail::amx_cached_primitives() == made);
  ember::detail::set_amx_products(was);
  BOOST_TEST(ember::detail::amx_products() == was);
}

void medium_precision_products() {
  BOOST_TEST(get_float32_matmul_precision() == "highest");
  PrecisionScope medium("medium");
  BOOST_TEST(get_float32_matmul_precision() == "medium");
  manual_seed(11);
  // Both operand layouts of each side; sizes with edges in every block of the kernel (rows past a
  // 12-row strip and a 96-row block, columns past a 32-column strip and a 512-column block (and
  // past the narrow products that stay Float32, Note [Narrow products]), k
  // odd and past a 256 block), alpha and beta, a column-major output, one and two threads.
  for (const auto& [m, k, n] : {std::tuple{13, 7, 70}, std::tuple{200, 301, 70},
                                std::tuple{20, 300, 530}, std::tuple{96, 64, 32}}) {
    for (int layout = 0; layout < 4; ++layout) {
      const Tensor a = layout & 1 ? randn({k, m}).transpose(0, 1) : randn({m, k});
      const Tensor b = layout & 2 ? randn({n, k}).transpose(0, 1) : randn({k, n});
      const Tensor a64 = a.to(kFloat64), b64 = b.to(kFloat64);
      const Tensor exact = reference_matmul(round_to_bfloat16(a), round_to_bfloat16(b));
      // Float32 sums over k terms: bounded by k ulp-sized errors of sum |a| |b|
      const Tensor bound = reference_matmul(a64.abs(), b64.abs()) * (4e-8 * k) + 1e-30;
      const std::string what = fmt::format("({}, {}) x ({}, {}), layout {}", m, k, k, n, layout);
      for (int threads : {1, 2}) {
        set_num_threads(threads);
        const Tensor c = matmul(a, b).to(kFloat64);
        if (!float32_matmul_uses_bfloat16()) {  // a CPU without AVX512-BF16: Float32 products
          const Tensor medium_c = matmul(a, b);
          set_float32_matmul_precision("highest");
          BOOST_TEST((medium_c - matmul(a, b)).abs().max().item<double>() == 0.0);
          set_float32_matmul_precision("medium");
          continue;
        }
        BOOST_TEST(((c - exact).abs() / bound).max().item<double>() <= 1.0, what);
        // ... and not the Float32 product: the rounding is there
        const double off =
            ((c - reference_matmul(a64, b64)).abs() / bound).max().item<double>() * 4e-8 * k;
        BOOST_TEST(off > 1e-4, what << ": differs from Float32 by " << off);
        const Tensor c0 = randn({m, n});
        Tensor out = zeros({n, m}).transpose(0, 1);
        out.copy_(c0);
        gemm(a, b, out, 1.5, -0.5);
        BOOST_TEST(((out.to(kFloat64) - (exact * 1.5 - c0.to(kFloat64) * 0.5)).abs() /
                    (bound * 1.5 + c0.to(kFloat64).abs() * 1e-7))
                           .max()
                           .item<double>() <= 1.0,
                   what << ", alpha 1.5, beta -0.5, column-major");
      }
      set_num_threads(0);
    }
  }
  // NaN and infinity propagate as in Float32; Float64 products are untouched.
  const Tensor a = randn({20, 30}), b = randn({30, 40});
  a.data<float>()[3 * 30 + 5] = std::numeric_limits<float>::quiet_NaN();
  b.data<float>()[7 * 40 + 9] = std::numeric_limits<float>::infinity();
  const Tensor c = matmul(a, b);
  BOOST_TEST(std::isnan(c.data<float>()[3 * 40 + 9]));
  BOOST_TEST(isnan(c).sum().item<int64_t>() == 40);  // row 3
  for (int64_t i = 0; i < 20; ++i)                   // column 9, but for row 3: infinite
    BOOST_TEST((i == 3 || std::isinf(c.data<float>()[i * 40 + 9])), "row " << i);
  const Tensor x = randn({30, 40}, kFloat64), y = randn({40, 20}, kFloat64);
  expect_close(matmul(x, y), reference_matmul(x, y), 1e-12, 1e-12, "Float64 under medium");
}

BOOST_AUTO_TEST_CASE(linear_adds_its_bias_in_the_product) {
  on_each_bfloat16_kernel(linear_bias_products);
}

void linear_bias_products() {
  // linear's bias goes down into the product: copied into the rows of C each thread writes before
  // BLAS, or added by the bfloat16 kernel as it stores C (in its first block of k only). Rows and
  // columns split across threads, several blocks of k, a product below the threads' threshold.
  manual_seed(12);
  for (const auto& [rows, in, out] :
       {std::tuple{300, 80, 45}, std::tuple{40, 300, 530}, std::tuple{13, 7, 70}}) {
    const Tensor x = randn({rows, in}), w = randn({out, in}), bias = randn({out});
    for (const std::string precision : {"highest", "medium"}) {
      PrecisionScope scope(precision);
      const bool bf16 = float32_matmul_uses_bfloat16();
      const Tensor xr = bf16 ? round_to_bfloat16(x) : x.to(kFloat64);
      const Tensor wr = bf16 ? round_to_bfloat16(w) : w.to(kFloat64);
      const Tensor want = reference_matmul(xr, wr.transpose(0, 1)) + bias.to(kFloat64);
      const Tensor bound =
          reference_matmul(x.to(kFloat64).abs(), w.to(kFloat64).abs().transpose(0, 1)) *
              (4e-8 * in) +
          bias.to(kFloat64).abs() * 1e-7 + 1e-30;
      for (int threads : {1, 2}) {
        set_num_threads(threads);
        const Tensor y = linear(x, w, bias).to(kFloat64);
        BOOST_TEST(
            ((y - want).abs() / bound).max().item<double>() <= 1.0,
            fmt::format("({}, {}) -> {}, {}, {} threads", rows, in, out, precision, threads));
      }
      set_num_threads(0);
    }
  }
}

BOOST_AUTO_TEST_CASE(medium_precision_trains_like_float32) {
  // The products of backward round too; a small regression fitted both ways ends at about the
  // same loss, and the medium gradients are within bfloat16's precision of the Float32 ones.
  const auto fit = [](const std::string& precision) {
    PrecisionScope scope(precision);
    manual_seed(5);
    const Tensor x = randn({256, 64}), w_true = randn({64, 32}) * 0.2;
    const Tensor y = tanh(matmul(x, w_true));
    nn::Linear l1(64, 128), l2(128, 32);
    std::vector<Tensor> params = l1.parameters();
    for (const Tensor& p : l2.parameters()) params.push_back(p);
    optim::Adam opt(params, optim::AdamOptions{1e-2});
    Tensor first_grad;
    double loss_value = 0;
    for (int step = 0; step < 200; ++step) {
      opt.zero_grad();
      const Tensor d = l2.forward(tanh(l1.forward(x))) - y;
      const Tensor loss = (d * d).mean();
      loss.backward();
      if (step == 0) first_grad = l1.weight.grad().clone();
      loss_value = loss.item<double>();
      opt.step();
    }
    return std::pair{loss_value, first_grad};
  };
  const auto [loss32, grad32] = fit("highest");
  const auto [loss16, grad16] = fit("medium");
  BOOST_TEST_MESSAGE("final loss Float32 " << loss32 << ", medium " << loss16);
  BOOST_TEST(loss32 < 0.02);
  BOOST_TEST(loss16 < 1.5 * loss32);
  const double scale = grad32.abs().max().item<double>();
  BOOST_TEST((grad16 - grad32).abs().max().item<double>() < 2e-2 * scale);
}

BOOST_AUTO_TEST_CASE(matmul_precision_errors) {
  expect_error([] { set_float32_matmul_precision("bfloat16"); },
               {"set_float32_matmul_precision", "\"highest\"", "\"medium\"", "\"bfloat16\""});
  BOOST_TEST(get_float32_matmul_precision() == "highest");
}

BOOST_AUTO_TEST_CASE(graph_is_freed) {
  const int64_t nodes = live_nodes(), impls = live_tensor_impls();
  {
    Tensor x = randn({2, 3, 4}).requires_grad_(), w = randn({5, 4}).requires_grad_();
    Tensor b = randn({5}).requires_grad_(), m = randn({5, 6}).requires_grad_();
    Tensor loss = matmul(linear(x, w, b), m).sum() + bmm(x, x.transpose(1, 2)).sum();
    loss.backward();
    BOOST_TEST(live_nodes() > nodes);
  }
  BOOST_TEST(live_nodes() == nodes);
  BOOST_TEST(live_tensor_impls() == impls);
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
