// softmax, log_softmax, layer_norm, dropout, embedding and scaled_dot_product_attention: one table
// of cases (tests/op_table.h) drives gradcheck and gradgradcheck on several layouts, the
// backward in ops (create_graph) against the kernels', the PyTorch golden values and gradients and
// the edge cases; then extreme inputs, the parallel paths, dropout's masks, attention at the GPT
// shape, with dropout and masks, every error message, and double backward where the table does
// not reach (dropout, masks, padding_idx, head_attention); forward mode where the table does not
// reach (dropout, head_attention, attention with dropout, the device) and second derivatives
// through the family's forward rules (forward over reverse, forward over forward).
#include <cmath>
#include <string>
#include <tuple>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "tests/edge_shapes.h"

using namespace ember;
using namespace ember::testing;

namespace {

// A 1-D Int64 index, on the row's device (tests/op_table.h).
Tensor ints(std::vector<int64_t> v) {
  const int64_t n = static_cast<int64_t>(v.size());
  return on_row_device(from_vector(std::move(v), {n}));
}

// One row per op case; tests/op_table.h says what the fields mean. After adding or changing a
// row, run /usr/bin/python3 tests/golden/gen_op_tables.py. The rows are laid out by hand as a
// table (one line each, two when long), out of clang-format's reach.
// clang-format off
const OpTable kNnFunctionalOps = {
    // softmax / log_softmax along every dim of a 3-D input, negative dims included
    {"softmax dim 0", "F.softmax(a, 0)", {{2, 3, 4}}, {}, [](auto& v) { return softmax(v[0], 0); }},
    {"softmax dim 1", "F.softmax(a, 1)", {{2, 3, 4}}, {}, [](auto& v) { return softmax(v[0], 1); }},
    {"softmax dim -1", "F.softmax(a, -1)", {{2, 3, 4}}, {},
     [](auto& v) { return v[0].softmax(-1); }},
    {"softmax dim -2", "F.softmax(a, -2)", {{2, 3, 4}}, {},
     [](auto& v) { return softmax(v[0], -2); }},
    {"log_softmax dim 0", "F.log_softmax(a, 0)", {{2, 3, 4}}, {},
     [](auto& v) { return log_softmax(v[0], 0); }},
    {"log_softmax dim 1", "F.log_softmax(a, 1)", {{2, 3, 4}}, {},
     [](auto& v) { return log_softmax(v[0], 1); }},
    {"log_softmax dim -1", "F.log_softmax(a, -1)", {{2, 3, 4}}, {},
     [](auto& v) { return v[0].log_softmax(-1); }},
    // 2-D, 1-D, 0-d and size-1 dims
    {"softmax 2-D dim -1", "F.softmax(a, -1)", {{3, 5}}, {},
     [](auto& v) { return softmax(v[0], -1); }},
    {"softmax 2-D dim 0", "F.softmax(a, 0)", {{3, 5}}, {}, [](auto& v) { return v[0].softmax(0); }},
    {"log_softmax 2-D dim -1", "F.log_softmax(a, -1)", {{3, 5}}, {},
     [](auto& v) { return log_softmax(v[0], -1); }},
    {"softmax 1-D", "F.softmax(a, 0)", {{7}}, {}, [](auto& v) { return softmax(v[0], 0); }},
    {"log_softmax 1-D", "F.log_softmax(a, -1)", {{7}}, {},
     [](auto& v) { return log_softmax(v[0], -1); }},
    {"softmax 0-d", "F.softmax(a, 0)", {{}}, {}, [](auto& v) { return softmax(v[0], 0); }},
    {"softmax size-1 dim", "F.softmax(a, 0)", {{1, 5}}, {},
     [](auto& v) { return softmax(v[0], 0); }},
    {"log_softmax size-1 softmax dim", "F.log_softmax(a, 1)", {{3, 1}}, {},
     [](auto& v) { return log_softmax(v[0], 1); }},
    // expanded (stride-0) inputs, and softmax feeding log_softmax
    {"expand then log_softmax", "F.log_softmax(a.expand(3, 4), -1)", {{1, 4}}, {},
     [](auto& v) { return log_softmax(v[0].expand({3, 4}), -1); }},
    {"expand then softmax along it", "F.softmax(a.expand(3, 4), 0)", {{1, 4}}, {},
     [](auto& v) { return softmax(v[0].expand({3, 4}), 0); }},
    {"softmax then log_softmax", "F.log_softmax(F.softmax(a, 1) * 3.0, 0)", {{3, 4}}, {},
     [](auto& v) { return log_softmax(softmax(v[0], 1) * 3.0, 0); }},
    // layer_norm: weight and bias are optional (undefined means none)
    {"layer_norm", "F.layer_norm(a, (4,), b, c)", {{3, 4}, {4}, {4}}, {},
     [](auto& v) { return layer_norm(v[0], {4}, v[1], v[2]); }, kOptionalInputs},
    {"layer_norm 2-D normalized_shape", "F.layer_norm(a, (3, 4), b, c)",
     {{2, 3, 4}, {3, 4}, {3, 4}}, {},
     [](auto& v) { return layer_norm(v[0], {3, 4}, v[1], v[2]); }, kOptionalInputs},
    {"layer_norm 3-D input", "F.layer_norm(a, (5,), b, c)", {{2, 2, 5}, {5}, {5}}, {},
     [](auto& v) { return layer_norm(v[0], {5}, v[1], v[2]); }, kOptionalInputs},
    {"layer_norm 1-D input", "F.layer_norm(a, (6,), b, c)", {{6}, {6}, {6}}, {},
     [](auto& v) { return layer_norm(v[0], {6}, v[1], v[2]); }, kOptionalInputs},
    {"layer_norm size-1 rows", "F.layer_norm(a, (2,), b, c)", {{1, 1, 2}, {2}, {2}}, {},
     [](auto& v) { return layer_norm(v[0], {2}, v[1], v[2]); }, kOptionalInputs},
    {"layer_norm no affine", "F.layer_norm(a, (6,), eps=1e-6)", {{5, 6}}, {},
     [](auto& v) { return layer_norm(v[0], {6}, {}, {}, 1e-6); }},
    {"layer_norm no affine method", "F.layer_norm(a, (5,))", {{2, 5}}, {},
     [](auto& v) { return v[0].layer_norm({5}); }},
    {"layer_norm weight only", "F.layer_norm(a, (3,), b)", {{4, 3}, {3}}, {},
     [](auto& v) { return layer_norm(v[0], {3}, v[1]); }, kOptionalInputs},
    {"layer_norm bias only", "F.layer_norm(a, (3,), None, b)", {{4, 3}, {3}}, {},
     [](auto& v) { return layer_norm(v[0], {3}, {}, v[1]); }, kOptionalInputs},
    {"expand then layer_norm", "F.layer_norm(a.expand(3, 4), (4,), b, c)", {{1, 4}, {4}, {4}}, {},
     [](auto& v) { return layer_norm(v[0].expand({3, 4}), {4}, v[1], v[2]); }, kOptionalInputs},
    // embedding: the input is the weight; constant indices, repeated
    {"embedding", "F.embedding(torch.tensor([[1, 4, 4], [10, 0, 1]]), a)", {{11, 3}}, {},
     [](auto& v) { return embedding(v[0], ints({1, 4, 4, 10, 0, 1}).reshape({2, 3})); }},
    {"embedding 1-D indices", "F.embedding(torch.tensor([3, 3, 0, 9]), a)", {{11, 3}}, {},
     [](auto& v) { return v[0].embedding(ints({3, 3, 0, 9})); }},
    {"embedding 0-d index", "F.embedding(torch.tensor(4), a)", {{11, 3}}, {},
     [](auto& v) { return embedding(v[0], ints({4}).reshape({})); }},
    {"embedding strided indices", "F.embedding(torch.tensor([[2, 0, 2], [2, 4, 1]]).t(), a)",
     {{5, 3}}, {},
     [](auto& v) {
       return embedding(v[0], ints({2, 0, 2, 2, 4, 1}).reshape({2, 3}).transpose(0, 1));
     }},
    // scaled_dot_product_attention against torch 2's formula, written out (python3-torch here is
    // 1.13): softmax(q kᵀ / sqrt(E) + mask) v. A Bool mask is true where a key takes part; a
    // query row with none gives zeros (torch >= 2.5's _safe_softmax: the where() below).
    // kOptionalInputs: an undefined mask means no mask.
    {"scaled_dot_product_attention", "torch.softmax(a @ b.transpose(-2, -1) / a.shape[-1] ** 0.5, -1) @ c",
     {{2, 3, 4}, {2, 5, 4}, {2, 5, 6}}, {},
     [](auto& v) { return scaled_dot_product_attention(v[0], v[1], v[2]); }},
    {"scaled_dot_product_attention 2-D", "torch.softmax(a @ b.t() / a.shape[-1] ** 0.5, -1) @ c",
     {{3, 4}, {5, 4}, {5, 2}}, {},
     [](auto& v) { return v[0].scaled_dot_product_attention(v[1], v[2]); }},
    {"scaled_dot_product_attention broadcast batch",
     "torch.softmax(a @ b.transpose(-2, -1) / a.shape[-1] ** 0.5, -1) @ c",
     {{2, 1, 3, 4}, {3, 5, 4}, {2, 3, 5, 2}}, {},
     [](auto& v) { return scaled_dot_product_attention(v[0], v[1], v[2]); }},
    {"scaled_dot_product_attention scale", "torch.softmax(a @ b.transpose(-2, -1) * 0.3, -1) @ c",
     {{2, 2, 3, 4}, {2, 2, 3, 4}, {2, 2, 3, 4}}, {},
     [](auto& v) { return scaled_dot_product_attention(v[0], v[1], v[2], {}, 0.0, false, 0.3); }},
    {"scaled_dot_product_attention float mask",
     "torch.softmax(a @ b.transpose(-2, -1) / a.shape[-1] ** 0.5 + d, -1) @ c",
     {{2, 3, 4}, {2, 5, 4}, {2, 5, 3}, {3, 5}}, {},
     [](auto& v) { return scaled_dot_product_attention(v[0], v[1], v[2], v[3]); }, kOptionalInputs},
    {"scaled_dot_product_attention float mask adds batch dims",
     "torch.softmax(a @ b.t() / a.shape[-1] ** 0.5 + d, -1) @ c",
     {{3, 4}, {5, 4}, {5, 2}, {2, 3, 5}}, {},
     [](auto& v) { return scaled_dot_product_attention(v[0], v[1], v[2], v[3]); }, kOptionalInputs},
    {"scaled_dot_product_attention bool mask",
     "torch.where(d.any(-1, keepdim=True), torch.softmax((a @ b.transpose(-2, -1) / a.shape[-1] ** 0.5)"
     ".masked_fill(~d, float('-inf')), -1), 0.0) @ c",
     {{2, 3, 4}, {2, 5, 4}, {2, 5, 3}, {2, 1, 5}}, {Real, Real, Real, Bool},
     [](auto& v) { return scaled_dot_product_attention(v[0], v[1], v[2], v[3]); }, kOptionalInputs},
    {"scaled_dot_product_attention bool mask per query",
     "torch.where(d.any(-1, keepdim=True), torch.softmax((a @ b.transpose(-2, -1) / a.shape[-1] ** 0.5)"
     ".masked_fill(~d, float('-inf')), -1), 0.0) @ c",
     {{2, 2, 4, 3}, {2, 2, 4, 3}, {2, 2, 4, 3}, {4, 4}}, {Real, Real, Real, Bool},
     [](auto& v) { return scaled_dot_product_attention(v[0], v[1], v[2], v[3]); }, kOptionalInputs},
    {"scaled_dot_product_attention causal",
     "torch.softmax((a @ b.transpose(-2, -1) / a.shape[-1] ** 0.5).masked_fill("
     "torch.ones(a.shape[-2], b.shape[-2], dtype=torch.bool).tril().logical_not(), float('-inf')), -1) @ c",
     {{2, 4, 3}, {2, 6, 3}, {2, 6, 2}}, {},
     [](auto& v) { return scaled_dot_product_attention(v[0], v[1], v[2], {}, 0.0, true); }},
    {"scaled_dot_product_attention causal more queries than keys",
     "torch.softmax((a @ b.transpose(-2, -1) / a.shape[-1] ** 0.5).masked_fill("
     "torch.ones(a.shape[-2], b.shape[-2], dtype=torch.bool).tril().logical_not(), float('-inf')), -1) @ c",
     {{1, 5, 2}, {1, 3, 2}, {1, 3, 4}}, {},
     [](auto& v) { return v[0].scaled_dot_product_attention(v[1], v[2], {}, 0.0, true); }},
};
// clang-format on

// y.backward(upstream) and the gradient of x.
Tensor grad_through(const std::function<Tensor(const Tensor&)>& f, const Tensor& x,
                    const Tensor& upstream) {
  Tensor leaf_x = x.detach().clone().requires_grad_();
  f(leaf_x).backward(upstream);
  return leaf_x.grad();
}

}  // namespace

BOOST_AUTO_TEST_SUITE(test_nn_functional)

BOOST_AUTO_TEST_CASE(table_gradcheck) { check_gradients(kNnFunctionalOps); }
BOOST_AUTO_TEST_CASE(table_gradgradcheck) { check_gradgradients(kNnFunctionalOps); }
BOOST_AUTO_TEST_CASE(table_forward_ad) { check_forward_gradients(kNnFunctionalOps); }
BOOST_AUTO_TEST_CASE(table_create_graph_gradients) {
  check_create_graph_gradients(kNnFunctionalOps);
}
BOOST_AUTO_TEST_CASE(table_golden) { check_golden(kNnFunctionalOps); }
BOOST_AUTO_TEST_CASE(table_edge_cases) { check_edge_cases(kNnFunctionalOps); }
BOOST_AUTO_TEST_CASE(table_edge_shapes) { check_edge_shapes(kNnFunctionalOps); }
BOOST_AUTO_TEST_CASE(table_anomaly) { check_anomaly(kNnFunctionalOps); }
// The table on the device, then forward mode there (skipped without one; ctest device_emulated
// runs it): each family op's rule on inputs that live on the device, including the paths that are
// the device's own (cross_entropy's row kernels, dropout's device mask, to(Device)).
void check_forward_ad_on_device();
BOOST_AUTO_TEST_CASE(table_on_device) {
  check_on_device(kNnFunctionalOps);
  check_forward_ad_on_device();
}

// --- softmax / log_softmax

BOOST_AUTO_TEST_CASE(softmax_extremes_stay_finite) {
  Golden g("ops.json");
  const Tensor big = g["sm_big"];  // rows with +-1e4, one masked with -1e9, one all -1e9
  for (DType dt : {kFloat64, kFloat32}) {
    const Tensor x = big.to(dt);
    const Tensor p = softmax(x, -1), lp = log_softmax(x, -1);
    for (double e : p.to_vector<double>()) BOOST_TEST(std::isfinite(e));
    for (double e : lp.to_vector<double>()) BOOST_TEST(std::isfinite(e));
    expect_close(p.to(kFloat64), g["softmax_big"], 1e-6, 1e-12, "softmax big");
    expect_close(lp.to(kFloat64), g["log_softmax_big"], 1e-6, 1e-6, "log_softmax big");
    // The backward stays finite too.
    Tensor leaf_x = x.detach().requires_grad_();
    log_softmax(leaf_x, -1).sum().backward();
    for (double e : leaf_x.grad().to_vector<double>()) BOOST_TEST(std::isfinite(e));
  }
  // Masked attention: -1e9 entries get probability 0, the rest normalise among themselves.
  const Tensor scores = from_vector(std::vector<double>{0.5, -1e9, 1.5, -1e9}, {1, 4});
  const std::vector<double> p = softmax(scores, 1).to_vector<double>();
  BOOST_TEST(p[1] == 0.0);
  BOOST_TEST(p[0] + p[2] == 1.0, boost::test_tools::tolerance(1e-6));
}

BOOST_AUTO_TEST_CASE(softmax_short_and_long_rows_agree) {
  // Contiguous rows shorter than 64 go block by block (rows of one to four whole vectors held in
  // registers), longer and strided ones row by row: both paths (dim -1 of x, dim 0 of its
  // transpose) must give the same values and gradients, Float32 and Float64, with rows spanning
  // several blocks and odd lengths (lane sums from 16, four ways from 64; 8 to 48 are one to four
  // vectors of AVX2 or AVX-512).
  // Seeded: the inputs do not depend on which tests ran before. The backward's atol is 1e-5 in
  // Float32: dY - p Σ dY cancels to ~0.02 from terms of ~1, and the two paths sum a row of 1000
  // in different orders (3e-6 apart on some seeds).
  manual_seed(7);
  for (DType dt : {kFloat32, kFloat64})
    for (int64_t n : {1, 3, 8, 10, 16, 17, 24, 32, 48, 63, 64, 100, 1000}) {
      const Tensor x = randn({301, n}, dt) * 4, up = randn({301, n}, dt);
      const std::string what = fmt::format("{} rows of {}", dt, n);
      expect_close(softmax(x, -1), softmax(x.transpose(0, 1), 0).transpose(0, 1), 1e-6, 1e-7,
                   "softmax " + what);
      expect_close(log_softmax(x, -1), log_softmax(x.transpose(0, 1), 0).transpose(0, 1), 1e-6,
                   1e-6, "log_softmax " + what);
      for (const bool log : {false, true}) {
        const auto rows = [log](const Tensor& t) {
          return log ? log_softmax(t, -1) : softmax(t, -1);
        };
        const auto columns = [log](const Tensor& t) {
          const Tensor c = t.transpose(0, 1);
          return (log ? log_softmax(c, 0) : softmax(c, 0)).transpose(0, 1);
        };
        expect_close(grad_through(rows, x, up), grad_through(columns, x, up), 1e-5,
                     dt == kFloat32 ? 1e-5 : 1e-6,
                     fmt::format("{} backward, {}", log ? "log_softmax" : "softmax", what));
      }
    }
}

BOOST_AUTO_TEST_CASE(softmax_parallel_paths_match_reference) {
  manual_seed(5);
  // Above the grain: the fast path (rows) and the strided path (dim 0 of a transposed view).
  const Tensor x = randn({300, 200}, kFloat64) * 4.0;
  const auto reference = [](const Tensor& t, int64_t dim) {
    const Tensor e = exp(t - max(t, dim, true).values);
    return e / e.sum({dim}, true);
  };
  expect_close(softmax(x, -1), reference(x, -1), 1e-12, 1e-14, "rows");
  const Tensor xt = x.transpose(0, 1);
  expect_close(softmax(xt, 0), reference(xt, 0), 1e-12, 1e-14, "strided");
  expect_close(log_softmax(x, 0), log(reference(x, 0)), 1e-10, 1e-12, "contiguous dim 0");
  // Backward above the grain agrees with the composed reference's backward.
  const Tensor up = randn({300, 200}, kFloat64);
  const Tensor ours = grad_through([](const Tensor& t) { return softmax(t, 1); }, x, up);
  const Tensor ref = grad_through([&](const Tensor& t) { return reference(t, 1); }, x, up);
  expect_close(ours, ref, 1e-9, 1e-12, "backward");
}

BOOST_AUTO_TEST_CASE(softmax_saves_output_not_graph) {
  const int64_t nodes = live_nodes(), impls = live_tensor_impls();
  {
    Tensor x = randn({4, 5}, kFloat64).requires_grad_();
    Tensor loss = (log_softmax(softmax(x, 1), 0) * 2.0).sum();
    loss.backward();
    BOOST_TEST(x.grad().defined());
  }
  BOOST_TEST(live_nodes() == nodes);
  BOOST_TEST(live_tensor_impls() == impls);
}

BOOST_AUTO_TEST_CASE(softmax_errors) {
  const Tensor ints = from_vector(std::vector<int64_t>{1, 2, 3}, {3});
  expect_error([&] { softmax(ints, 0); }, {"softmax", "Int64"});
  expect_error([&] { log_softmax(ints, 0); }, {"log_softmax", "Int64"});
  expect_error([&] { softmax(zeros({2, 3}), 2); }, {"softmax", "dim 2", "2 dims"});
  expect_error([&] { log_softmax(zeros({2, 3}), -3); }, {"log_softmax", "dim -3"});
}

// --- layer_norm

BOOST_AUTO_TEST_CASE(layer_norm_constant_row_and_parallel) {
  // A constant row has zero variance: the output is the bias, the gradient finite.
  Tensor x = full({2, 8}, 3.25, kFloat64).requires_grad_();
  Tensor w = ones({8}, kFloat64).requires_grad_(), b = full({8}, 0.5, kFloat64);
  const Tensor y = layer_norm(x, {8}, w, b);
  for (double e : y.to_vector<double>()) BOOST_TEST(e == 0.5);
  (y * arange(0, 16, 1, kFloat64).reshape({2, 8})).sum().backward();
  for (double e : x.grad().to_vector<double>()) BOOST_TEST(std::isfinite(e));
  // Large offsets do not cancel: values 1e4 + small noise in Float32.
  manual_seed(2);
  const Tensor noisy = randn({4, 64}, kFloat64) + 1e4;
  expect_close(layer_norm(noisy.to(kFloat32), {64}).to(kFloat64), layer_norm(noisy, {64}), 1e-2,
               2e-3, "offset");
  // Above the grain (parallel rows, per-thread dW/dB) matches the composed formula.
  const Tensor big = randn({200, 256}, kFloat64);
  const Tensor wt = randn({256}, kFloat64), bt = randn({256}, kFloat64);
  const Tensor mu = big.mean({-1}, true);
  const Tensor ref = (big - mu) / sqrt(big.var({-1}, false, true) + 1e-5) * wt + bt;
  expect_close(layer_norm(big, {256}, wt, bt), ref, 1e-9, 1e-10, "parallel");
  Tensor wl = wt.detach().requires_grad_(), bl = bt.detach().requires_grad_();
  const Tensor up = randn({200, 256}, kFloat64);
  layer_norm(big, {256}, wl, bl).backward(up);
  const Tensor xhat = (big - mu) / sqrt(big.var({-1}, false, true) + 1e-5);
  expect_close(wl.grad(), (up * xhat).sum({0}), 1e-9, 1e-9, "parallel dW");
  expect_close(bl.grad(), up.sum({0}), 1e-9, 1e-9, "parallel dB");
}

BOOST_AUTO_TEST_CASE(layer_norm_errors) {
  const Tensor x = zeros({2, 3, 5});
  expect_error(
      [&] {
        layer_norm(x, {3, 4});
      },
      {"layer_norm", "normalized_shape [3, 4]", "shape [2, 3, 5]"});
  expect_error([&] { layer_norm(x, {2, 2, 3, 5}); }, {"layer_norm", "[2, 2, 3, 5]"});
  expect_error([&] { layer_norm(x, {}); }, {"layer_norm", "at least one dim"});
  expect_error([&] { layer_norm(x, {5}, ones({4})); },
               {"layer_norm", "weight of shape [4]", "normalized_shape [5]"});
  expect_error(
      [&] {
        layer_norm(x, {5}, ones({5}), zeros({3, 5}));
      },
      {"layer_norm", "bias of shape [3, 5]"});
  expect_error([&] { layer_norm(x, {5}, ones({5}, kFloat64)); },
               {"layer_norm", "weight is Float64", "Float32"});
  expect_error([&] { layer_norm(zeros({2, 3}, kInt64), {3}); }, {"layer_norm", "Int64"});
}

// --- dropout

BOOST_AUTO_TEST_CASE(dropout_statistics_and_seed) {
  const Tensor x = ones({100000});
  manual_seed(123);
  const Tensor y = dropout(x, 0.3, true);
  const std::vector<float> v = y.to_vector<float>();
  int64_t zeros_count = 0, other = 0;
  for (float e : v) {
    zeros_count += e == 0;
    other += e != 0 && e != static_cast<float>(1.0 / 0.7);
  }
  BOOST_TEST(other == 0);
  BOOST_TEST(std::abs(zeros_count / 1e5 - 0.3) < 0.01);
  BOOST_TEST(std::abs(y.mean().item<double>() - 1.0) < 0.01);
  manual_seed(123);
  BOOST_TEST((dropout(x, 0.3, true).to_vector<float>() == v));
  BOOST_TEST((dropout(x, 0.3, true).to_vector<float>() != v));  // the generator moved on
  BOOST_TEST((x.dropout(0.3, true).shape() == x.shape()));
}

BOOST_AUTO_TEST_CASE(dropout_mask_as_defined) {
  // Note [Dropout masks], element by element: the call's key is one draw of the generator, and
  // pair j's counter_bits(key, j) decide element j (low half) and j + n/2 (high half), dropped
  // below p * 2^32; an odd n's last element takes the low half of pair n/2. Every seed of a
  // recorded run depends on these masks: a kernel may compute them faster, not differently.
  // counter_bits is SplitMix64: key 0's counters are its stream from seed 0.
  BOOST_TEST(counter_bits(0, 0) == 0xe220a8397b1dcdafull);
  BOOST_TEST(counter_bits(0, 1) == 0x6e789e6aa1b965f4ull);
  for (const int64_t n : {int64_t{1}, int64_t{7}, int64_t{513}, int64_t{70001}}) {
    const double p = 0.3;
    manual_seed(42);
    const uint64_t key = random_bits();
    manual_seed(42);
    const Tensor x = ones({n}).requires_grad_();
    const Tensor out = dropout(x, p, true);
    out.sum().backward();  // the backward's mask, saved by the forward, is the same mask
    const std::vector<float> y = out.to_vector<float>(), dx = x.grad().to_vector<float>();
    const auto threshold = static_cast<uint32_t>(std::ldexp(p, 32));
    const float scale = static_cast<float>(1.0 / (1.0 - p));
    const auto factor = [&](uint64_t word) {
      return static_cast<uint32_t>(word) < threshold ? 0.0f : scale;
    };
    const int64_t half = n / 2;
    std::vector<float> expected(static_cast<size_t>(n));
    for (int64_t j = 0; j < half; ++j) {
      const uint64_t bits = counter_bits(key, static_cast<uint64_t>(j));
      expected[static_cast<size_t>(j)] = factor(bits);
      expected[static_cast<size_t>(j + half)] = factor(bits >> 32);
    }
    if (n % 2 == 1) expected.back() = factor(counter_bits(key, static_cast<uint64_t>(half)));
    int64_t differ = 0, differ_dx = 0;
    for (size_t i = 0; i < expected.size(); ++i) differ += y[i] != expected[i];
    for (size_t i = 0; i < expected.size(); ++i) differ_dx += dx[i] != expected[i];
    BOOST_TEST(differ == 0, "n = " << n);
    BOOST_TEST(differ_dx == 0, "n = " << n);
  }
}

BOOST_AUTO_TEST_CASE(dropout_mask_independent_of_threads) {
  // Counter-based masks: one seed gives one mask on any thread count, odd sizes included,
  // and both halves of each draw are used (no element is dropped in lockstep with another).
  const Tensor x = ones({100001});
  const int threads = get_num_threads();
  set_num_threads(1);
  manual_seed(5);
  const std::vector<float> one = dropout(x, 0.5, true).to_vector<float>();
  set_num_threads(2);
  manual_seed(5);
  const std::vector<float> two = dropout(x, 0.5, true).to_vector<float>();
  set_num_threads(threads);
  BOOST_TEST((one == two));
  int64_t same_as_partner = 0;
  for (size_t j = 0; j < one.size() / 2; ++j) same_as_partner += one[j] == one[j + one.size() / 2];
  BOOST_TEST(std::abs(same_as_partner / 50000.0 - 0.5) < 0.02);
  // No pattern between neighbours, nor between consecutive calls (each keys its own stream):
  // both dropped as often as p^2 = 0.09 (p = 0.3; 5 binomial s.d. is about 0.005).
  const Tensor big = ones({200000});
  const std::vector<float> a = dropout(big, 0.3, true).to_vector<float>();
  const std::vector<float> b = dropout(big, 0.3, true).to_vector<float>();
  int64_t both_neighbours = 0, both_calls = 0;
  for (size_t j = 0; j + 1 < a.size(); ++j) both_neighbours += a[j] == 0 && a[j + 1] == 0;
  for (size_t j = 0; j < a.size(); ++j) both_calls += a[j] == 0 && b[j] == 0;
  BOOST_TEST(std::abs(both_neighbours / 200000.0 - 0.09) < 0.005);
  BOOST_TEST(std::abs(both_calls / 200000.0 - 0.09) < 0.005);
}

BOOST_AUTO_TEST_CASE(dropout_identity_backward_errors) {
  Tensor x = randn({3, 4}, kFloat64).requires_grad_();
  BOOST_TEST(dropout(x, 0.5, false).same(x));
  BOOST_TEST(dropout(x, 0.0, true).same(x));
  // Backward multiplies by the saved mask * scale: dX = y / x elementwise.
  manual_seed(9);
  const Tensor y = dropout(x, 0.4, true);
  y.sum().backward();
  const std::vector<double> g = x.grad().to_vector<double>(), out = y.to_vector<double>();
  for (size_t i = 0; i < g.size(); ++i)
    BOOST_TEST(g[i] == (out[i] == 0 ? 0.0 : 1.0 / 0.6), boost::test_tools::tolerance(1e-12));
  check_gradient(
      [](const auto& v) {
        manual_seed(4);  // the same mask on every call
        return dropout(v[0].transpose(0, 1), 0.5, true);
      },
      {x.detach().clone().requires_grad_()}, "dropout");
  expect_error([&] { dropout(x, 1.5, true); },
               {"dropout: probability has to be in [0, 1], got 1.5"});
  expect_error([&] { dropout(x, -0.1, false); }, {"dropout", "-0.1"});
  // p = 1 drops everything, as torch: zeros, and a zero gradient.
  const Tensor all = x.detach().clone().requires_grad_();
  const Tensor dropped = dropout(all, 1.0, true);
  BOOST_TEST((dropped.to_vector<double>() == std::vector<double>(x.numel(), 0.0)));
  dropped.sum().backward();
  BOOST_TEST((all.grad().to_vector<double>() == std::vector<double>(x.numel(), 0.0)));
  nn::Dropout drop_all(1.0);
  BOOST_TEST((drop_all(ones({3})).to_vector<float>() == std::vector<float>(3, 0.0f)));
  expect_error([&] { dropout(zeros({2}, kInt64), 0.5, true); }, {"dropout", "Int64"});
}

// --- embedding

BOOST_AUTO_TEST_CASE(embedding_parallel_gather) {
  manual_seed(8);
  const Tensor w = randn({50, 512});
  const Tensor idx = randint(0, 50, {200});
  const Tensor y = embedding(w, idx);
  const std::vector<int64_t> iv = idx.to_vector<int64_t>();
  for (int64_t k : {int64_t(0), int64_t(77), int64_t(199)})
    expect_close(y.narrow(0, k, 1), w.narrow(0, iv[k], 1), 0, 0, "row");
}

BOOST_AUTO_TEST_CASE(embedding_errors) {
  const Tensor w = zeros({11, 4});
  expect_error(
      [&] {
        embedding(w, from_vector(std::vector<int64_t>{1, 12}, {2}));
      },
      {"embedding: index 12 out of range for 11 rows"});
  expect_error([&] { embedding(w, from_vector(std::vector<int64_t>{-1}, {1})); },
               {"embedding: index -1 out of range for 11 rows"});
  expect_error([&] { embedding(w, from_vector(std::vector<int64_t>{11}, {1})); },
               {"embedding: index 11 out of range for 11 rows"});
  expect_error([&] { embedding(w, tensor({1, 2})); }, {"embedding", "Int64", "Float32"});
  expect_error([&] { embedding(zeros({11}), from_vector(std::vector<int64_t>{1}, {1})); },
               {"embedding", "2-D", "[11]"});
}

// --- scaled_dot_product_attention

namespace {

// The composed formula softmax(q kᵀ / sqrt(E) + mask) v, with a causal mask when asked and
// dropout of the weights as Ember's dropout draws it.
Tensor attention_reference(const Tensor& q, const Tensor& k, const Tensor& v, bool causal,
                           double dropout_p = 0.0) {
  Tensor scores = matmul(q, k.transpose(-2, -1)) / std::sqrt(static_cast<double>(q.size(-1)));
  if (causal)
    scores = scores.masked_fill(logical_not(ones({q.size(-2), k.size(-2)}).tril().to(kBool)),
                                -std::numeric_limits<double>::infinity());
  return matmul(dropout(softmax(scores, -1), dropout_p, dropout_p > 0), v);
}

}  // namespace

// The GPT-style causal shape (B 12, heads 4, T 64, head dim 32) in Float32, above every parallel
// grain, against the composed formula: values and the gradients of q, k and v.
BOOST_AUTO_TEST_CASE(attention_causal_large_matches_composed) {
  manual_seed(31);
  const Shape shape{12, 4, 64, 32};
  const Tensor q0 = randn(shape), k0 = randn(shape), v0 = randn(shape), up = randn(shape);
  for (bool causal : {true, false}) {
    Tensor q = q0.detach().requires_grad_(), k = k0.detach().requires_grad_(),
           v = v0.detach().requires_grad_();
    Tensor qr = q0.detach().requires_grad_(), kr = k0.detach().requires_grad_(),
           vr = v0.detach().requires_grad_();
    const Tensor out = scaled_dot_product_attention(q, k, v, {}, 0.0, causal);
    const Tensor ref = attention_reference(qr, kr, vr, causal);
    const std::string what = causal ? "causal" : "full";
    expect_close(out, ref, 1e-4, 1e-5, what);
    out.backward(up);
    ref.backward(up);
    expect_close(q.grad(), qr.grad(), 1e-3, 1e-4, what + " dq");
    expect_close(k.grad(), kr.grad(), 1e-3, 1e-4, what + " dk");
    expect_close(v.grad(), vr.grad(), 1e-3, 1e-4, what + " dv");
  }
  // The first query of a causal row sees only the first key: its output is v[..., 0, :].
  const Tensor first = scaled_dot_product_attention(q0, k0, v0, {}, 0.0, true).select(2, 0);
  expect_close(first, v0.select(2, 0), 1e-6, 1e-6, "causal row 0");
}

// Dropout of the attention weights: the same key as Ember's dropout draws, so one seed gives
// the formula's values and gradients exactly; p = 1 drops every weight.
BOOST_AUTO_TEST_CASE(attention_dropout_matches_composed) {
  manual_seed(32);
  const Tensor q0 = randn({2, 3, 5, 4}, kFloat64), k0 = randn({2, 3, 6, 4}, kFloat64),
               v0 = randn({2, 3, 6, 3}, kFloat64), up = randn({2, 3, 5, 3}, kFloat64);
  for (bool causal : {false, true}) {
    Tensor q = q0.detach().requires_grad_(), k = k0.detach().requires_grad_(),
           v = v0.detach().requires_grad_();
    Tensor qr = q0.detach().requires_grad_(), kr = k0.detach().requires_grad_(),
           vr = v0.detach().requires_grad_();
    manual_seed(77);
    const Tensor out = scaled_dot_product_attention(q, k, v, {}, 0.4, causal);
    manual_seed(77);
    const Tensor ref = attention_reference(qr, kr, vr, causal, 0.4);
    expect_close(out, ref, 1e-12, 1e-12, "dropout");
    out.backward(up);
    ref.backward(up);
    expect_close(q.grad(), qr.grad(), 1e-10, 1e-12, "dropout dq");
    expect_close(k.grad(), kr.grad(), 1e-10, 1e-12, "dropout dk");
    expect_close(v.grad(), vr.grad(), 1e-10, 1e-12, "dropout dv");
    // A different draw gives different weights.
    BOOST_TEST((scaled_dot_product_attention(q0, k0, v0, {}, 0.4, causal).to_vector<double>() !=
                out.to_vector<double>()));
  }
  manual_seed(78);
  check_gradient(
      [&](const std::vector<Tensor>& in) {
        manual_seed(78);  // one mask for every evaluation
        return scaled_dot_product_attention(in[0], in[1], in[2], {}, 0.3, true);
      },
      {leaf({2, 4, 3}), leaf({2, 4, 3}), leaf({2, 4, 2})}, "dropout gradcheck");
  const Tensor all = scaled_dot_product_attention(q0, k0, v0, {}, 1.0);
  for (double e : all.to_vector<double>()) BOOST_TEST(e == 0.0);
}

// Masks: Bool true takes part, the same as a float mask of 0 and -inf; a query with no key
// taking part gives zeros and a zero gradient; the mask may be shared across batch and heads.
BOOST_AUTO_TEST_CASE(attention_masks) {
  manual_seed(33);
  const Tensor q = randn({2, 2, 3, 4}, kFloat64), k = randn({2, 2, 5, 4}, kFloat64),
               v = randn({2, 2, 5, 2}, kFloat64);
  // Key padding as a PyTorch user writes it for nn.MultiheadAttention (true = pad) must be
  // inverted here: keep = !pad, broadcast (B, 1, 1, S).
  const Tensor pad =
      from_vector(std::vector<double>{0, 0, 0, 1, 1, 0, 0, 0, 0, 1}, {2, 1, 1, 5}, kBool);
  const Tensor keep = logical_not(pad);
  const Tensor additive =
      zeros({2, 1, 1, 5}, kFloat64).masked_fill(pad, -std::numeric_limits<double>::infinity());
  const Tensor with_bool = scaled_dot_product_attention(q, k, v, keep);
  expect_close(with_bool, scaled_dot_product_attention(q, k, v, additive), 1e-12, 1e-12,
               "bool vs additive");
  // Padded keys get no weight: changing their values changes nothing.
  const Tensor v2 = v.clone();
  v2.select(0, 0).narrow(-2, 3, 2).fill_(100.0);
  expect_close(scaled_dot_product_attention(q, k, v2, keep), with_bool, 1e-12, 1e-12, "padding");
  // The causal mask written as a Bool mask is is_causal.
  const Tensor tri = ones({3, 5}).tril().to(kBool);
  expect_close(scaled_dot_product_attention(q, k, v, tri),
               scaled_dot_product_attention(q, k, v, {}, 0.0, true), 1e-12, 1e-12, "tril mask");
  // A query row with no key: zeros, and no NaN in any gradient.
  Tensor qg = q.detach().requires_grad_(), kg = k.detach().requires_grad_(),
         vg = v.detach().requires_grad_();
  Tensor none = ones({3, 5}, kBool);
  none.select(0, 1).fill_(0.0);
  const Tensor out = scaled_dot_product_attention(qg, kg, vg, none);
  for (double e : out.select(2, 1).to_vector<double>()) BOOST_TEST(e == 0.0);
  out.sum().backward();
  for (const Tensor& g : {qg.grad(), kg.grad(), vg.grad()})
    for (double e : g.to_vector<double>()) BOOST_TEST(std::isfinite(e));
  for (double e : qg.grad().select(2, 1).to_vector<double>()) BOOST_TEST(e == 0.0);
  // A Float32 mask with Float64 inputs is converted; Float32 inputs work alike.
  expect_close(scaled_dot_product_attention(q, k, v, additive.to(kFloat32)), with_bool, 1e-12,
               1e-12, "mask dtype");
  expect_close(scaled_dot_product_attention(q.to(kFloat32), k.to(kFloat32), v.to(kFloat32), keep)
                   .to(kFloat64),
               with_bool, 1e-5, 1e-5, "Float32");
}

// gradcheck where the table does not reach: value's batch dims outgrow the scores' (their
// gradient is summed back), heads split from (B, T, h, d) as transposed views, as a
// transformer passes them, and a causal row of one key.
BOOST_AUTO_TEST_CASE(attention_gradcheck_broadcast_and_views) {
  manual_seed(34);
  check_gradient(
      [](const std::vector<Tensor>& v) { return scaled_dot_product_attention(v[0], v[1], v[2]); },
      {leaf({3, 4}), leaf({5, 4}), leaf({2, 5, 3})}, "value adds batch dims");
  check_gradient(
      [](const std::vector<Tensor>& v) {
        const auto heads = [](const Tensor& t) { return t.view({2, 4, 2, 3}).transpose(1, 2); };
        return scaled_dot_product_attention(heads(v[0]), heads(v[1]), heads(v[2]), {}, 0.0, true);
      },
      {leaf({2, 4, 6}), leaf({2, 4, 6}), leaf({2, 4, 6})}, "heads as transposed views");
  check_gradient(
      [](const std::vector<Tensor>& v) {
        return scaled_dot_product_attention(v[0], v[1], v[2], v[3].expand({2, 3, 4}));
      },
      {leaf({2, 3, 2}), leaf({2, 4, 2}), leaf({2, 4, 2}), leaf({1, 4})}, "expanded float mask");
}

BOOST_AUTO_TEST_CASE(attention_frees_graph_and_errors) {
  const int64_t nodes = live_nodes(), impls = live_tensor_impls();
  {
    Tensor q = randn({2, 3, 4}, kFloat64).requires_grad_();
    Tensor m = randn({3, 3}, kFloat64).requires_grad_();
    scaled_dot_product_attention(q, q, q, m, 0.2).sum().backward();
    BOOST_TEST(q.grad().defined());
    BOOST_TEST(m.grad().defined());
  }
  BOOST_TEST(live_nodes() == nodes);
  BOOST_TEST(live_tensor_impls() == impls);

  const Tensor q = zeros({2, 3, 4}), k = zeros({2, 5, 4}), v = zeros({2, 5, 6});
  const std::string op = "scaled_dot_product_attention";
  expect_error(
      [&] {
        scaled_dot_product_attention(q, k, v, ones({3, 5}, kBool), 0.0, true);
      },
      {op, "attn_mask and is_causal"});
  expect_error(
      [&] {
        scaled_dot_product_attention(q, zeros({2, 5, 3}), v);
      },
      {op, "[2, 3, 4]", "[2, 5, 3]", "last dim"});
  expect_error(
      [&] {
        scaled_dot_product_attention(q, k, zeros({2, 4, 6}));
      },
      {op, "[2, 5, 4]", "[2, 4, 6]", "keys"});
  expect_error([&] { scaled_dot_product_attention(q, k, v.to(kFloat64)); },
               {op, "Float32", "Float64"});
  expect_error([&] { scaled_dot_product_attention(zeros({4}), k, v); }, {op, "2 dims", "[4]"});
  expect_error(
      [&] {
        scaled_dot_product_attention(q, zeros({3, 5, 4}), zeros({3, 5, 6}));
      },
      {op, "broadcast"});
  expect_error(
      [&] {
        scaled_dot_product_attention(q, k, v, ones({3, 4}, kBool));
      },
      {op, "broadcast"});
  expect_error(
      [&] {
        scaled_dot_product_attention(q, k, v, ones({3, 5}, kInt64));
      },
      {op, "Bool or floating", "Int64"});
  // a (1, S) mask broadcasts over the queries
  BOOST_CHECK_NO_THROW(scaled_dot_product_attention(q, k, v, ones({1, 5})));
  expect_error([&] { scaled_dot_product_attention(q, k, v, {}, 1.5); }, {op, "dropout_p", "1.5"});
  expect_error([&] { scaled_dot_product_attention(q, k, zeros({5, 6}, kInt64)); }, {op, "Int64"});
  expect_error([&] { scaled_dot_product_attention(Tensor(), k, v); }, {op, "undefined"});
}

// --- double backward where the table does not reach

namespace {

void check_gradgrad(const std::function<Tensor(const std::vector<Tensor>&)>& f,
                    const std::vector<Tensor>& inputs, const std::string& what) {
  const GradcheckResult r = gradgradcheck(f, inputs);
  BOOST_TEST(r.ok, what << ": " << r.message);
}

}  // namespace

// Dropout and attention's dropout, each mask fixed by seeding the generator inside f; Bool masks
// and a constant float mask with a row where no key takes part (zeros, whose gradient is zero);
// embedding's padding row.
BOOST_AUTO_TEST_CASE(gradgradcheck_dropout_masks_padding) {
  manual_seed(41);
  check_gradgrad(
      [](const auto& v) {
        manual_seed(4);  // the same mask on every call
        return dropout(v[0].transpose(0, 1), 0.4, true);
      },
      {leaf({3, 4})}, "dropout");
  check_gradgrad([](const auto& v) { return dropout(v[0], 1.0, true); }, {leaf({3, 4})},
                 "dropout p 1");
  check_gradgrad(
      [](const auto& v) {
        manual_seed(6);
        return scaled_dot_product_attention(v[0], v[1], v[2], {}, 0.3, true);
      },
      {leaf({2, 4, 3}), leaf({2, 5, 3}), leaf({2, 5, 2})}, "attention with dropout, causal");
  Tensor keep = from_vector(std::vector<double>{1, 0, 1, 1, 0, 0, 0, 0, 1, 1, 0, 1}, {3, 4}, kBool);
  check_gradgrad(
      [&](const auto& v) { return scaled_dot_product_attention(v[0], v[1], v[2], keep); },
      {leaf({2, 3, 2}), leaf({2, 4, 2}), leaf({2, 4, 3})}, "attention, a row with no key");
  const double inf = std::numeric_limits<double>::infinity();
  const Tensor added =
      from_vector(std::vector<double>{0, -inf, 0.5, -inf, -inf, -inf}, {2, 3}, kFloat64);
  check_gradgrad(
      [&](const auto& v) { return scaled_dot_product_attention(v[0], v[1], v[2], added); },
      {leaf({2, 2, 2}), leaf({2, 3, 2}), leaf({2, 3, 2})}, "attention, -inf float mask");
  // Squared, so that the gradient depends on the weight; the padding row's does not (none
  // flows to it), in the first derivative and the second alike.
  for (const std::optional<int64_t> padding_idx :
       {std::optional<int64_t>(4), std::optional<int64_t>()})
    check_gradgrad(
        [&](const auto& v) {
          const Tensor e = embedding(v[0], ints({1, 4, 4, 2, 0, 4}).reshape({3, 2}), padding_idx);
          return e * e;
        },
        {leaf({5, 3})}, fmt::format("embedding padding_idx {}", padding_idx.value_or(-1)));
}

// head_attention (Note [Head attention]): two heads through a permuted k, a keep mask with a row
// where no key is kept (uniform weights), and three heads with dropout.
BOOST_AUTO_TEST_CASE(gradgradcheck_head_attention) {
  manual_seed(42);
  Tensor keep = from_vector(
      std::vector<double>{1, 1, 0, 1, 1, 1, 1, 1, 0, 0, 0, 0, 1, 0, 1, 1, 1, 1, 1, 1, 0, 1, 1, 0},
      {2, 3, 4}, kBool);
  const auto f = [&](const std::vector<Tensor>& in) {
    return head_attention(in[0], in[1].permute({2, 1, 0}), in[2], 2, keep).values;
  };
  check_gradgrad(f, {leaf({2, 3, 6}), leaf({6, 4, 2}), leaf({2, 4, 6})}, "head_attention");
  check_gradgrad(
      [](const std::vector<Tensor>& in) {
        manual_seed(3);  // the same dropout mask at every evaluation
        return head_attention(in[0], in[1], in[2], 3, Tensor(), 0.3).values;
      },
      {leaf({2, 3, 6}), leaf({2, 4, 6}), leaf({2, 4, 6})}, "head_attention with dropout");
  // The gradient under create_graph (in ops) is the first-order kernels' gradient.
  const Tensor q = leaf({2, 3, 6}), k = leaf({6, 4, 2}), v = leaf({2, 4, 6});
  const Tensor up = randn({2, 3, 6}, kFloat64);
  const std::vector<Tensor> first = autograd::grad({f({q, k, v})}, {q, k, v}, {up});
  const std::vector<Tensor> in_ops =
      autograd::grad({f({q, k, v})}, {q, k, v}, {up}, std::nullopt, true);
  for (size_t i = 0; i < 3; ++i)
    expect_close(in_ops[i], first[i], 1e-12, 1e-12, fmt::format("input {}", i));
}

// --- forward mode where the table does not reach

namespace fa = ember::autograd::forward_ad;

// Forward mode through dropout (the tangent through the forward's mask, also for an input that
// needs no gradient), head_attention with a keep mask and with dropout, and
// scaled_dot_product_attention with dropout: each input's Jacobian columns by dual passes
// against finite differences and the backward.
BOOST_AUTO_TEST_CASE(forward_ad_dropout_and_attention) {
  manual_seed(7);
  const Tensor x = randn({4, 5}, kFloat64), u = randn({4, 5}, kFloat64);
  {
    fa::DualLevel level;
    manual_seed(9);
    const Tensor y = dropout(fa::make_dual(x, u), 0.4, true);
    manual_seed(9);
    expect_close(fa::unpack_dual(y).tangent, dropout(u, 0.4, true), 0, 0, "dropout's tangent");
  }
  GradcheckOptions options;
  options.check_forward_ad = true;
  check_gradient(
      [](const std::vector<Tensor>& in) {
        manual_seed(5);  // the same mask at every evaluation
        return dropout(in[0] * in[0], 0.4, true);
      },
      {leaf({3, 5})}, "dropout", options);
  const Tensor keep = from_vector(
      std::vector<double>{1, 1, 0, 1, 1, 1, 1, 1, 0, 0, 0, 0, 1, 0, 1, 1, 1, 1, 1, 1, 0, 1, 1, 0},
      {2, 3, 4}, kBool);
  check_gradient(
      [&](const std::vector<Tensor>& in) {
        return head_attention(in[0], in[1].permute({2, 1, 0}), in[2], 2, keep).values;
      },
      {leaf({2, 3, 6}), leaf({6, 4, 2}), leaf({2, 4, 6})}, "head_attention with keep", options);
  check_gradient(
      [](const std::vector<Tensor>& in) {
        manual_seed(3);
        return head_attention(in[0], in[1], in[2], 3, Tensor(), 0.3).values;
      },
      {leaf({2, 3, 6}), leaf({2, 4, 6}), leaf({2, 4, 6})}, "head_attention with dropout", options);
  check_gradient(
      [](const std::vector<Tensor>& in) {
        manual_seed(4);
        return scaled_dot_product_attention(in[0], in[1], in[2], {}, 0.3, true);
      },
      {leaf({2, 4, 3}), leaf({2, 5, 3}), leaf({2, 5, 2})},
      "scaled_dot_product_attention causal with dropout", options);
}

// Second derivatives through the rules, with H the Hessian of ⟨up, f⟩, against reverse over
// reverse (H u as the gradient of Σ_i ⟨grad_i, u_i⟩):
//   - forward over reverse: inside a dual level whose inputs carry tangents u, the gradient a
//     backward under create_graph gives carries H u as its tangent (through the fused backward
//     ops' own rules: linear_backward, layer_norm_backward, head_attention_backward,
//     dropout_backward);
//   - forward over forward: inputs with tangents u at an outer level and w at an inner one; the
//     inner tangent of f carries ⟨up, f''[u, w]⟩ = ⟨w, H u⟩ as its outer tangent (the rules'
//     ops carry the outer level).
void expect_forward_over_reverse(const Fn& f, const std::vector<Tensor>& inputs,
                                 const std::string& what) {
  std::vector<Tensor> u;
  for (const Tensor& x : inputs) u.push_back(randn(x.shape(), kFloat64));
  const Tensor up = randn(f(inputs).shape(), kFloat64);
  const std::vector<Tensor> g = autograd::grad({f(inputs)}, inputs, {up}, std::nullopt, true, true);
  Tensor s = zeros({}, kFloat64);
  for (size_t i = 0; i < inputs.size(); ++i)
    if (g[i].defined()) s = s + (g[i] * u[i]).sum();
  const std::vector<Tensor> want = autograd::grad({s}, inputs, {}, std::nullopt, false, true);
  fa::DualLevel level;
  std::vector<Tensor> duals;
  for (size_t i = 0; i < inputs.size(); ++i) duals.push_back(fa::make_dual(inputs[i], u[i]));
  const std::vector<Tensor> got =
      autograd::grad({f(duals)}, inputs, {up}, std::nullopt, true, true);
  double want_uw = 0;
  std::vector<Tensor> w;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Tensor hu = want[i].defined() ? want[i] : zeros_like(inputs[i]);
    const Tensor tangent = got[i].defined() ? fa::unpack_dual(got[i]).tangent : Tensor();
    expect_close(tangent.defined() ? tangent : zeros_like(inputs[i]), hu, 1e-10, 1e-12,
                 fmt::format("{}: H u of input {} by forward over reverse", what, i));
    w.push_back(randn(inputs[i].shape(), kFloat64));
    want_uw += (hu * w[i]).sum().item<double>();
  }
  Tensor inner_tangent;
  {
    fa::DualLevel inner;
    std::vector<Tensor> twice;
    for (size_t i = 0; i < inputs.size(); ++i) twice.push_back(fa::make_dual(duals[i], w[i]));
    inner_tangent = fa::unpack_dual(f(twice)).tangent;
  }
  const Tensor second = inner_tangent.defined() ? fa::unpack_dual(inner_tangent).tangent : Tensor();
  const double got_uw = second.defined() ? (second * up).sum().item<double>() : 0.0;
  BOOST_TEST(std::abs(got_uw - want_uw) <= 1e-9 * (1 + std::abs(want_uw)),
             what << ": <w, H u> by forward over forward " << got_uw << ", by reverse " << want_uw);
}

BOOST_AUTO_TEST_CASE(forward_over_reverse_fused_backward_ops) {
  manual_seed(12);
  const Tensor keep = rand({2, 3, 4}, kFloat64) > 0.3;
  const Tensor classes = from_vector(std::vector<int64_t>{0, 3, 2, 1}, {4});
  const std::vector<std::tuple<std::string, Fn, std::vector<Tensor>>> cases = {
      {"matmul",
       [](const auto& v) { return matmul(v[0], v[1]) * matmul(v[0], v[1]); },
       {leaf({3, 4}), leaf({4, 5})}},
      {"bmm",
       [](const auto& v) { return tanh(bmm(v[0], v[1])); },
       {leaf({2, 3, 4}), leaf({2, 4, 5})}},
      {"linear",
       [](const auto& v) { return tanh(linear(v[0], v[1], v[2])); },
       {leaf({2, 3, 4}), leaf({5, 4}), leaf({5})}},
      {"linear of a transposed input, no bias",
       [](const auto& v) {
         return linear(v[0].transpose(0, 1), v[1]) * linear(v[0].transpose(0, 1), v[1]);
       },
       {leaf({4, 3}), leaf({2, 4})}},
      {"layer_norm",
       [](const auto& v) { return layer_norm(v[0], {4}, v[1], v[2]) * v[0]; },
       {leaf({3, 4}), leaf({4}), leaf({4})}},
      {"layer_norm 2-D normalized_shape, no affine",
       [](const auto& v) {
         return tanh(layer_norm(v[0], {2, 3}, {}, {}, 1e-3));
       },
       {leaf({4, 2, 3})}},
      {"dropout",
       [](const auto& v) {
         manual_seed(5);
         return dropout(v[0] * v[0], 0.4, true);
       },
       {leaf({3, 5})}},
      {"head_attention with keep",
       [&](const auto& v) { return tanh(head_attention(v[0], v[1], v[2], 2, keep).values); },
       {leaf({2, 3, 6}), leaf({2, 4, 6}), leaf({2, 4, 6})}},
      {"head_attention with dropout",
       [](const auto& v) {
         manual_seed(3);
         return head_attention(v[0], v[1], v[2], 3, Tensor(), 0.3).values * v[0];
       },
       {leaf({2, 3, 6}), leaf({2, 3, 6}), leaf({2, 3, 6})}},
      {"softmax", [](const auto& v) { return softmax(v[0], 1) * v[0]; }, {leaf({3, 4})}},
      {"log_softmax", [](const auto& v) { return tanh(log_softmax(v[0], 0)); }, {leaf({3, 4})}},
      {"scaled_dot_product_attention",
       [](const auto& v) { return tanh(scaled_dot_product_attention(v[0], v[1], v[2])); },
       {leaf({2, 3, 4}), leaf({2, 5, 4}), leaf({2, 5, 2})}},
      {"cross_entropy",
       [&](const auto& v) { return cross_entropy(v[0] * v[0], classes, Reduction::Mean, 2, 0.1); },
       {leaf({4, 5})}},
      {"nll_loss",
       [&](const auto& v) {
         return nll_loss(log_softmax(v[0], 1) * v[0], classes, Reduction::Sum);
       },
       {leaf({4, 5})}},
      {"mse_loss",
       [](const auto& v) { return mse_loss(tanh(v[0]), v[1]); },
       {leaf({3, 4}), leaf({3, 4})}},
      {"kl_div",
       [](const auto& v) { return kl_div(tanh(v[0]), exp(v[1]), Reduction::None); },
       {leaf({3, 4}), leaf({3, 4})}},
  };
  for (const auto& [name, f, inputs] : cases) {
    try {
      expect_forward_over_reverse(f, inputs, name);
    } catch (const std::exception& e) {
      BOOST_ERROR(name << ": " << e.what());
    }
  }
}

void check_forward_ad_on_device() {
  if (!cuda::is_available()) return;
  manual_seed(21);
  const auto on_device = [](const Shape& shape) {
    return leaf(shape).detach().to(kCUDA).requires_grad_();
  };
  const Tensor classes = from_vector(std::vector<int64_t>{0, 3, 2, 1}, {4}).to(kCUDA);
  const std::vector<std::tuple<std::string, Fn, std::vector<Tensor>>> cases = {
      {"matmul",
       [](const auto& v) { return matmul(v[0], v[1]); },
       {on_device({2, 3, 4}), on_device({4, 5})}},
      {"bmm",
       [](const auto& v) { return bmm(v[0], v[1]); },
       {on_device({2, 3, 4}), on_device({2, 4, 5})}},
      {"linear",
       [](const auto& v) { return linear(v[0], v[1], v[2]); },
       {on_device({2, 3, 4}), on_device({5, 4}), on_device({5})}},
      {"softmax", [](const auto& v) { return softmax(v[0], 1); }, {on_device({3, 4})}},
      {"log_softmax", [](const auto& v) { return log_softmax(v[0], 0); }, {on_device({3, 4})}},
      {"layer_norm",
       [](const auto& v) { return layer_norm(v[0], {4}, v[1], v[2]); },
       {on_device({3, 4}), on_device({4}), on_device({4})}},
      {"dropout",
       [](const auto& v) {
         manual_seed(5);
         return dropout(v[0], 0.4, true);
       },
       {on_device({3, 5})}},
      {"to(Device)",
       [](const auto& v) { return v[0].to(kCPU, kFloat64).to(kCUDA) * v[0]; },
       {on_device({2, 3})}},
      {"clone",
       [](const auto& v) { return v[0].transpose(0, 1).contiguous() * 2.0; },
       {on_device({2, 3})}},
      {"cross_entropy",
       [&](const auto& v) { return cross_entropy(v[0], classes, Reduction::Mean, 2, 0.1); },
       {on_device({4, 5})}},
      {"cross_entropy none",
       [&](const auto& v) { return cross_entropy(v[0], classes, Reduction::None); },
       {on_device({4, 5})}},
      {"scaled_dot_product_attention causal",
       [](const auto& v) { return scaled_dot_product_attention(v[0], v[1], v[2], {}, 0.0, true); },
       {on_device({2, 4, 3}), on_device({2, 5, 3}), on_device({2, 5, 2})}},
      {"head_attention",
       [](const auto& v) { return head_attention(v[0], v[1], v[2], 2).values; },
       {on_device({2, 3, 4}), on_device({2, 5, 4}), on_device({2, 5, 4})}},
  };
  GradcheckOptions options;
  options.check_forward_ad = true;
  for (const auto& [name, f, inputs] : cases) {
    try {
      check_gradient(f, inputs, name + " on the device", options);
    } catch (const std::exception& e) {
      BOOST_ERROR(name << " on the device: " << e.what());
    }
  }
}

BOOST_AUTO_TEST_SUITE_END()
