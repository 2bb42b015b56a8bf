// Reductions: one table of cases (tests/op_table.h) over dims lists, negative dims, keepdim and
// size-1 dims drives gradcheck on three layouts, forward mode (first order, forward over forward
// and forward over reverse from tests/forward_over_forward.h, and on the device), the PyTorch
// golden values and the edge cases; then max/argmax ties and indices, dtypes and errors.
#include <cmath>
#include <limits>

#include <boost/test/unit_test.hpp>

#include "tests/edge_shapes.h"
#include "tests/forward_over_forward.h"

using namespace ember;
using namespace ember::testing;

namespace {

// One row per op case; tests/op_table.h says what the fields mean. After adding or changing a
// row, run /usr/bin/python3 tests/golden/gen_op_tables.py. The rows are laid out by hand as a
// table (one line each, two when long), out of clang-format's reach.
// clang-format off
const OpTable kReduceOps = {
    {"sum all", "a.sum()", {{2, 3, 4}}, {}, [](auto& v) { return sum(v[0]); }},
    {"sum dim 0", "a.sum(0)", {{3, 4}}, {}, [](auto& v) { return sum(v[0], {0}); }},
    {"sum dim -1 keepdim", "a.sum(-1, keepdim=True)", {{2, 3, 4}}, {},
     [](auto& v) { return sum(v[0], {-1}, true); }},
    {"sum dims 0,2", "a.sum((0, 2))", {{2, 3, 4}}, {}, [](auto& v) { return v[0].sum({0, 2}); }},
    {"sum size-1 dim", "a.sum(1)", {{3, 1, 2}}, {}, [](auto& v) { return sum(v[0], {1}); }},
    {"mean all", "a.mean()", {{2, 3, 4}}, {}, [](auto& v) { return mean(v[0]); }},
    {"mean dim 1", "a.mean(1)", {{2, 3, 4}}, {}, [](auto& v) { return mean(v[0], {1}); }},
    {"mean dim -2", "a.mean(-2)", {{2, 3, 4}}, {}, [](auto& v) { return mean(v[0], {-2}); }},
    {"var unbiased", "a.var(-1)", {{2, 3, 4}}, {}, [](auto& v) { return var(v[0], {-1}); }},
    {"var biased keepdim", "a.var((0, 1), unbiased=False, keepdim=True)", {{2, 3, 4}}, {},
     [](auto& v) { return var(v[0], {0, 1}, false, true); }},
    {"std unbiased", "a.std(-1)", {{2, 3, 4}}, {}, [](auto& v) { return ember::std(v[0], {-1}); }},
    {"std biased keepdim", "a.std((0, 2), unbiased=False, keepdim=True)", {{2, 3, 4}}, {},
     [](auto& v) { return v[0].std({0, 2}, false, true); }},
    {"std all", "a.std((0, 1))", {{3, 4}}, {}, [](auto& v) { return v[0].std({}); }},
    {"logsumexp dim -1", "torch.logsumexp(a, -1)", {{2, 3, 4}}, {},
     [](auto& v) { return logsumexp(v[0], {-1}); }},
    {"logsumexp dims 0,2 keepdim", "a.logsumexp((0, 2), keepdim=True)", {{2, 3, 4}}, {},
     [](auto& v) { return v[0].logsumexp({0, 2}, true); }},
    {"logsumexp mul 1000", "torch.logsumexp(a * 1000.0, 1)", {{3, 4}}, {},
     [](auto& v) { return logsumexp(v[0] * 1000.0, {1}); }, kNoGradcheck},
    {"logsumexp 0-d", "torch.logsumexp(a, 0)", {{}}, {},
     [](auto& v) { return logsumexp(v[0], {0}); }},
    {"cumsum dim 0", "torch.cumsum(a, 0)", {{3, 4}}, {}, [](auto& v) { return cumsum(v[0], 0); }},
    {"cumsum dim -1", "a.cumsum(-1)", {{2, 3, 4}}, {}, [](auto& v) { return v[0].cumsum(-1); }},
    {"cumsum dim 1 of 3-D", "torch.cumsum(a, 1)", {{2, 3, 4}}, {},
     [](auto& v) { return cumsum(v[0], 1); }},
    {"cumsum 0-d", "torch.cumsum(a, -1)", {{}}, {}, [](auto& v) { return cumsum(v[0], -1); }},
    {"expand then sum dim 0", "a.expand(3, 4).sum(0)", {{1, 4}}, {},
     [](auto& v) { return sum(v[0].expand({3, 4}), {0}); }},
    {"max dim 1", "a.max(1).values", {{3, 4}}, {}, [](auto& v) { return max(v[0], 1).values; }},
    {"max dim 1 of 3-D", "a.max(1).values", {{2, 3, 4}}, {},
     [](auto& v) { return max(v[0], 1).values; }},
    {"max dim -1 keepdim", "a.max(-1, keepdim=True).values", {{2, 3, 4}}, {},
     [](auto& v) { return max(v[0], -1, true).values; }},
    {"max dim 0", "a.max(0).values", {{2, 3, 4}}, {}, [](auto& v) { return v[0].max(0).values; }},
    {"max all", "a.max()", {{2, 3, 4}}, {}, [](auto& v) { return max(v[0]); }},
    // indices: Int64 results without gradient
    {"max indices dim 1", "a.max(1).indices", {{2, 3, 4}}, {},
     [](auto& v) { return max(v[0], 1).indices; }, kNoGrad},
    {"argmax dim -1", "a.argmax(-1)", {{2, 3, 4}}, {},
     [](auto& v) { return argmax(v[0], -1); }, kNoGrad},
    {"argmax dim 0 keepdim", "a.argmax(0, keepdim=True)", {{3, 4}}, {},
     [](auto& v) { return v[0].argmax(0, true); }, kNoGrad},
};
// clang-format on

}  // namespace

BOOST_AUTO_TEST_SUITE(test_reduce)

// Sums over leading dims of a contiguous tensor take their own loop (columns in blocks of 64,
// split across threads): against the same sum over a permuted copy, which the strided loop
// takes, at widths around the block edge and in Int64.
BOOST_AUTO_TEST_CASE(sum_over_leading_dims) {
  manual_seed(31);
  for (const int64_t n : {1, 63, 64, 65, 200}) {
    const Tensor x = randn({300, n});
    const Tensor strided =
        x.transpose(0, 1).contiguous().transpose(0, 1);  // same values, column-major
    BOOST_TEST((n == 1 || !strided.is_contiguous()));
    expect_close(sum(x, {0}), sum(strided, {0}), 1e-6, 1e-6, fmt::format("(300, {})", n));
  }
  const Tensor y = randn({5, 7, 130}, kFloat64);
  expect_close(y.sum({0, 1}), y.permute({2, 0, 1}).contiguous().sum({1, 2}), 1e-12, 1e-12,
               "dims 0, 1");
  const Tensor i = randint(-50, 50, {40, 70});
  BOOST_TEST((sum(i, {0}).to_vector<int64_t>() ==
              sum(i.transpose(0, 1).contiguous().transpose(0, 1), {0}).to_vector<int64_t>()));
}

// Sums over leading and trailing dims around kept ones (a convolution's bias gradient, over N, H
// and W) take their own loop too: against the same sum over a copy with the kept dim first (the
// trailing dims' loop), with runs shorter and longer than its eight partial sums, in Float32,
// Float64 and Int64, one and two threads.
BOOST_AUTO_TEST_CASE(sum_around_kept_dims) {
  manual_seed(32);
  for (int threads : {1, 2}) {
    set_num_threads(threads);
    for (const Shape& shape : {Shape{5, 7, 9, 11}, Shape{3, 16, 2, 3}, Shape{128, 4, 28, 28}}) {
      const Tensor x = randn(shape);
      const Tensor kept_first = x.permute({1, 0, 2, 3}).contiguous();
      expect_close(sum(x, {0, 2, 3}), kept_first.sum({1, 2, 3}), 1e-6, 1e-6,
                   fmt::format("{}, {} threads", shape, threads));
      const Tensor d = x.to(kFloat64);
      expect_close(d.sum({0, -1}), d.permute({1, 2, 0, 3}).contiguous().sum({2, 3}), 1e-12, 1e-12,
                   fmt::format("{} dims 0, -1", shape));
    }
    const Tensor i = randint(-50, 50, {6, 5, 37});
    BOOST_TEST((sum(i, {0, 2}).to_vector<int64_t>() ==
                i.permute({1, 0, 2}).contiguous().sum({1, 2}).to_vector<int64_t>()));
  }
  set_num_threads(0);
}

BOOST_AUTO_TEST_CASE(table_gradcheck) { check_gradients(kReduceOps); }
BOOST_AUTO_TEST_CASE(table_gradgradcheck) { check_gradgradients(kReduceOps); }
BOOST_AUTO_TEST_CASE(table_forward_ad) { check_forward_gradients(kReduceOps); }
BOOST_AUTO_TEST_CASE(table_forward_over_forward) { check_forward_over_forward(kReduceOps); }
BOOST_AUTO_TEST_CASE(table_forward_over_reverse) { check_forward_over_reverse(kReduceOps); }
BOOST_AUTO_TEST_CASE(table_create_graph_gradients) { check_create_graph_gradients(kReduceOps); }
BOOST_AUTO_TEST_CASE(table_golden) { check_golden(kReduceOps); }
BOOST_AUTO_TEST_CASE(table_edge_cases) { check_edge_cases(kReduceOps); }
BOOST_AUTO_TEST_CASE(table_edge_shapes) { check_edge_shapes(kReduceOps); }
BOOST_AUTO_TEST_CASE(table_anomaly) { check_anomaly(kReduceOps); }
// The forward rules run there too: ctest device_emulated runs the table_on_device cases.
BOOST_AUTO_TEST_CASE(table_on_device) {
  check_on_device(kReduceOps);
  check_forward_on_device(kReduceOps);
}

BOOST_AUTO_TEST_CASE(values_and_dtypes) {
  const Tensor x = from_vector(std::vector<double>{1, 5, 3, 7, 2, 7}, {2, 3});
  const MaxResult m = x.max(1);
  BOOST_TEST((m.values.to_vector<float>() == std::vector<float>{5, 7}));
  BOOST_TEST((m.indices.to_vector<int64_t>() == std::vector<int64_t>{1, 0}));  // first of ties
  BOOST_TEST((x.max(0, true).values.shape() == Shape{1, 3}));
  BOOST_TEST(x.max().item<float>() == 7.0f);
  BOOST_TEST((sum(tensor({1, 0, 1}, kBool)).dtype() == kInt64));
  BOOST_TEST(sum(tensor({1, 0, 1}, kBool)).item<int64_t>() == 2);
  BOOST_TEST((sum(x, {}).shape() == Shape{}));  // empty dims list reduces everything, as torch
  // Large Float32 sums accumulate in double.
  BOOST_TEST(sum(ones({1 << 20})).item<double>() == double(1 << 20));
  BOOST_TEST(sum(ones({1000, 300}), {0}).to_vector<float>()[7] == 1000.0f);
  // max(all) splits the gradient among ties.
  Tensor t = tensor({1, 3, 3}, kFloat64).requires_grad_();
  t.max().backward();
  BOOST_TEST((t.grad().to_vector<double>() == std::vector<double>{0, 0.5, 0.5}));
  // sum_to reduces leading and size-1 dims.
  BOOST_TEST((sum_to(ones({2, 3, 4}), {3, 1}).to_vector<float>() == std::vector<float>{8, 8, 8}));
}

BOOST_AUTO_TEST_CASE(std_logsumexp_cumsum) {
  const double inf = std::numeric_limits<double>::infinity();
  // std is sqrt(var), and its gradient is 0 (not NaN) for a constant input, as torch.
  const Tensor r = randn({3, 5}, kFloat64);
  expect_close(ember::std(r, {1}), sqrt(var(r, {1})), 1e-15, 0, "std");
  expect_close(r.std({0}, false, true), sqrt(var(r, {0}, false, true)), 1e-15, 0, "biased std");
  Tensor c = full({4}, 2.0, kFloat64).requires_grad_();
  c.std({}).backward();
  BOOST_TEST((c.grad().to_vector<double>() == std::vector<double>{0, 0, 0, 0}));
  // logsumexp: stable where exp overflows; -inf rows give -inf, +inf gives +inf, no element -inf.
  const Tensor big = tensor({1000, 1000});
  BOOST_TEST(std::abs(logsumexp(big, {0}).item<double>() - (1000 + std::log(2.0))) < 1e-4);
  const Tensor rows = from_vector(std::vector<double>{-inf, -inf, inf, 1, -1000, -1000}, {3, 2});
  const std::vector<double> l = logsumexp(rows, {1}).to_vector<double>();
  BOOST_TEST((l[0] == -inf && l[1] == inf));
  BOOST_TEST(std::abs(l[2] - (-1000 + std::log(2.0))) < 1e-4);
  BOOST_TEST(
      (logsumexp(zeros({2, 0}), {1}).to_vector<double>() == std::vector<double>{-inf, -inf}));
  BOOST_TEST((logsumexp(zeros({0, 3}), {0}, true).shape() == Shape{1, 3}));
  BOOST_TEST((logsumexp(tensor({1, 2}, kInt64), {0}).dtype() == kFloat32));
  // cumsum: integral and Bool give Int64; the gradient is the reversed running sum.
  const Tensor b = cumsum(tensor({1, 1, 0, 1}, kBool), 0);
  BOOST_TEST((b.dtype() == kInt64));
  BOOST_TEST((b.to_vector<int64_t>() == std::vector<int64_t>{1, 2, 2, 3}));
  BOOST_TEST((cumsum(tensor({5, -2, 7}, kInt64), -1).to_vector<int64_t>() ==
              std::vector<int64_t>{5, 3, 10}));
  Tensor x = tensor({1, 2, 3}, kFloat64).requires_grad_();
  cumsum(x, 0).backward(tensor({1, 10, 100}, kFloat64));
  BOOST_TEST((x.grad().to_vector<double>() == std::vector<double>{111, 110, 100}));
  // Float32 sums accumulate in double, as torch's CPU kernel.
  const Tensor run = cumsum(full({1 << 17}, 0.1f), 0);
  BOOST_TEST(std::abs(run.to_vector<double>().back() - 0.1f * double(1 << 17)) < 1e-3);
}

// Double backward beyond the table: std's second derivatives stay finite (0) at a constant input;
// max's gradients in ops (create_graph) equal the fused ones at ties; the backward of cumsum (a
// reversed running sum) differentiated twice as a function of the grad_output.
BOOST_AUTO_TEST_CASE(double_backward) {
  const Tensor c = full({2, 4}, 2.0, kFloat64).requires_grad_();
  const Tensor gc = autograd::grad({c.std({1}).sum()}, {c}, {}, {}, true)[0];
  BOOST_TEST((gc.detach().to_vector<double>() == std::vector<double>(8, 0.0)));
  const Tensor hc = autograd::grad({(gc * gc.detach().add(1.0)).sum()}, {c})[0];
  BOOST_TEST((hc.to_vector<double>() == std::vector<double>(8, 0.0)));
  const Tensor t =
      tensor({1.0, 3.0, 3.0, 2.0, 2.0, 0.0}, kFloat64).reshape({2, 3}).requires_grad_();
  const std::vector<std::pair<std::string, std::function<Tensor()>>> ops = {
      {"max all", [&] { return t.max() * 5.0; }},
      {"max dim 1", [&] { return max(t, 1).values * 2.0; }},
      {"max dim 0 keepdim", [&] { return max(t, 0, true).values * 3.0; }}};
  for (const auto& [name, f] : ops) {
    const Tensor plain = autograd::grad({f().sum()}, {t})[0];
    const Tensor in_ops = autograd::grad({f().sum()}, {t}, {}, {}, true)[0];
    expect_close(in_ops.detach(), plain, 0, 0, name);
  }
  manual_seed(17);
  const Tensor x = leaf({3, 4});
  const auto backward_of_cumsum = [&](int64_t dim) {
    return [x, dim](const std::vector<Tensor>& in) {
      return autograd::grad({cumsum(x, dim)}, {x}, {in[0]}, {}, true)[0];
    };
  };
  for (const int64_t dim : {0, -1}) {
    const GradcheckResult r = gradgradcheck(backward_of_cumsum(dim), {leaf({3, 4})});
    BOOST_TEST(r.ok, "the backward of cumsum, dim " << dim << ": " << r.message);
  }
  BOOST_TEST(autograd::grad({cumsum(x, 1)}, {x}, {leaf({3, 4})}, {}, true)[0].grad_fn()->name() ==
             "ReverseCumsumBackward");
}

// Forward mode beyond the table: sum_to (the reduction of broadcasting's backward) over leading
// and size-1 dims, max's ties (the tangent of max(x) is the mean of the tied elements' tangents,
// as its backward splits the gradient; max along a dim takes the first of the ties), and std at
// a constant input (a zero tangent, as its zero gradient).
BOOST_AUTO_TEST_CASE(forward_ad_sum_to_ties_and_constants) {
  namespace fa = ember::autograd::forward_ad;
  manual_seed(18);
  GradcheckOptions forward;
  forward.check_forward_ad = true;
  check_gradient(
      [](const std::vector<Tensor>& v) {
        return sum_to(v[0], {3, 1});
      },
      {leaf({2, 3, 4})}, "sum_to [3, 1]", forward);
  check_gradient([](const std::vector<Tensor>& v) { return sum_to(v[0].transpose(0, 1), {4}); },
                 {leaf({4, 3})}, "sum_to [4] of a transposed input", forward);
  fa::DualLevel level;
  const Tensor t = tensor({1, 3, 3, 2}, kFloat64), u = tensor({10, 20, 40, 80}, kFloat64);
  const Tensor x = fa::make_dual(t, u);
  BOOST_TEST(fa::unpack_dual(x.max()).tangent.item<double>() == 30.0);
  BOOST_TEST(fa::unpack_dual(max(x, 0).values).tangent.item<double>() == 20.0);
  const Tensor c = fa::make_dual(full({4}, 2.0, kFloat64), u);
  BOOST_TEST(fa::unpack_dual(c.std({})).tangent.item<double>() == 0.0);
}

BOOST_AUTO_TEST_CASE(errors) {
  expect_error([] { sum(ones({2, 3}), {2}); }, {"sum", "dim 2", "2 dims"});
  expect_error([] { sum(ones({2, 3}), {1, -1}); }, {"sum", "more than once"});
  expect_error([] { mean(ones({2}, kInt64)); }, {"mean", "Int64"});
  expect_error([] { max(ones({2, 3}), -3); }, {"max", "dim -3"});
  expect_error([] { max(zeros({0})); }, {"max", "empty"});
  expect_error([] { cumsum(ones({2, 3}), 2); }, {"cumsum", "dim 2", "2 dims"});
  expect_error([] { cumsum(ones({2, 3}), -3); }, {"cumsum", "dim -3"});
  expect_error([] { logsumexp(ones({2}), {1}); }, {"logsumexp", "dim 1"});
  expect_error([] { logsumexp(ones({2, 3}), {0, -2}); }, {"logsumexp", "more than once"});
  expect_error([] { ember::std(ones({2}, kInt64), {}); }, {"std", "Int64"});
  expect_error([] { ember::std(ones({2, 3}), {1, 1}); }, {"std", "more than once"});
}

BOOST_AUTO_TEST_SUITE_END()
