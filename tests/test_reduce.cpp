// Reductions: gradcheck over dims lists, negative dims, keepdim and non-contiguous inputs;
// PyTorch golden values; max/argmax indices; errors.
#include <boost/test/unit_test.hpp>

#include "tests/helpers.h"

using namespace ember;
using namespace ember::testing;

BOOST_AUTO_TEST_SUITE(test_reduce)

BOOST_AUTO_TEST_CASE(gradcheck_sum_mean_var) {
  manual_seed(10);
  check_variants("sum all", [](auto& v) { return sum(v[0]); }, {{3, 4}});
  check_variants("sum dim 0", [](auto& v) { return sum(v[0], {0}); }, {{3, 4}});
  check_variants("sum dim -1 keepdim", [](auto& v) { return sum(v[0], {-1}, true); }, {{3, 4}});
  check_variants("sum dims 0,2", [](auto& v) { return sum(v[0], {0, 2}); }, {{2, 3, 4}});
  check_variants("sum size-1 dim", [](auto& v) { return sum(v[0], {1}); }, {{3, 1, 2}});
  check_variants("mean all", [](auto& v) { return mean(v[0]); }, {{3, 4}});
  check_variants("mean dim -2", [](auto& v) { return mean(v[0], {-2}); }, {{2, 3, 4}});
  check_variants("var unbiased", [](auto& v) { return var(v[0], {-1}); }, {{3, 4}});
  check_variants("var biased keepdim",
                 [](auto& v) {
                   return var(v[0], {0, 1}, false, true);
                 },
                 {{2, 3, 4}});
  check_variants("sum of expanded",
                 [](auto& v) {
                   return sum(v[0].expand({3, 4}), {0});
                 },
                 {{1, 4}});
}

BOOST_AUTO_TEST_CASE(gradcheck_max) {
  manual_seed(11);
  check_variants("max dim", [](auto& v) { return max(v[0], 1).values; }, {{3, 4}});
  check_variants("max dim -1 keepdim", [](auto& v) { return max(v[0], -1, true).values; },
                 {{2, 3, 4}});
  check_variants("max dim 0", [](auto& v) { return max(v[0], 0).values; }, {{2, 3, 4}});
  check_variants("max all", [](auto& v) { return max(v[0]); }, {{3, 4}});
}

BOOST_AUTO_TEST_CASE(golden_values) {
  const Golden g("core.json");
  check_golden(
      g, "sum_all", [](auto& v) { return sum(v[0]); }, 1);
  check_golden(
      g, "sum_dims",
      [](auto& v) {
        return sum(v[0], {0, 2});
      },
      1);
  check_golden(
      g, "sum_neg_keepdim", [](auto& v) { return sum(v[0], {-1}, true); }, 1);
  check_golden(
      g, "mean_dim", [](auto& v) { return mean(v[0], {1}); }, 1);
  check_golden(
      g, "mean_all", [](auto& v) { return mean(v[0]); }, 1);
  check_golden(
      g, "var_unbiased", [](auto& v) { return var(v[0], {-1}); }, 1);
  check_golden(
      g, "var_biased_keepdim",
      [](auto& v) {
        return var(v[0], {0, 1}, false, true);
      },
      1);
  check_golden(
      g, "max_dim", [](auto& v) { return max(v[0], 1).values; }, 1);
  check_golden(
      g, "max_dim_indices", [](auto& v) { return max(v[0], 1).indices; }, 1);
  check_golden(
      g, "argmax_neg", [](auto& v) { return argmax(v[0], -1); }, 1);
  check_golden(
      g, "max_all", [](auto& v) { return max(v[0]); }, 1);
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

BOOST_AUTO_TEST_CASE(errors) {
  expect_error([] { sum(ones({2, 3}), {2}); }, {"sum", "dim 2", "2 dims"});
  expect_error([] { sum(ones({2, 3}), {1, -1}); }, {"sum", "more than once"});
  expect_error([] { mean(ones({2}, kInt64)); }, {"mean", "Int64"});
  expect_error([] { max(ones({2, 3}), -3); }, {"max", "dim -3"});
  expect_error([] { max(zeros({0})); }, {"max", "empty"});
}

BOOST_AUTO_TEST_SUITE_END()
