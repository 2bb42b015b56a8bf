// Reductions: one table of cases (tests/op_table.h) over dims lists, negative dims, keepdim and
// size-1 dims drives gradcheck on three layouts, the PyTorch golden values and the edge cases;
// then max/argmax ties and indices, dtypes and errors.
#include <boost/test/unit_test.hpp>

#include "tests/edge_shapes.h"

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

BOOST_AUTO_TEST_CASE(table_gradcheck) { check_gradients(kReduceOps); }
BOOST_AUTO_TEST_CASE(table_golden) { check_golden(kReduceOps); }
BOOST_AUTO_TEST_CASE(table_edge_cases) { check_edge_cases(kReduceOps); }
BOOST_AUTO_TEST_CASE(table_edge_shapes) { check_edge_shapes(kReduceOps); }

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
