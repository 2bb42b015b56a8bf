// View ops: one table of cases (tests/op_table.h) drives gradcheck through views on three layouts,
// the PyTorch golden values and the edge cases; then storage sharing, strides and errors.
#include <boost/test/unit_test.hpp>

#include "tests/edge_shapes.h"

using namespace ember;
using namespace ember::testing;

namespace {

// One row per op case; tests/op_table.h says what the fields mean. After adding or changing a
// row, run /usr/bin/python3 tests/golden/gen_op_tables.py. The rows are laid out by hand as a
// table (one line each, two when long), out of clang-format's reach.
// clang-format off
const OpTable kShapeOps = {
    {"reshape", "a.reshape(-1, 2) * 2.0", {{3, 4}}, {},
     [](auto& v) { return v[0].reshape({-1, 2}) * 2.0; }},
    {"contiguous then view", "a.contiguous().view(4, 3).exp()", {{3, 4}}, {},
     [](auto& v) { return v[0].contiguous().view({4, 3}).exp(); }},
    {"flatten", "a.flatten(1).sin()", {{2, 3, 4}}, {},
     [](auto& v) { return v[0].flatten(1).sin(); }},
    {"transpose", "a.transpose(0, 2)", {{2, 3, 4}}, {},
     [](auto& v) { return transpose(v[0], 0, 2); }},
    {"transpose negative dim then mul", "a.transpose(-1, 0) * b", {{3, 4}, {4, 3}}, {},
     [](auto& v) { return v[0].transpose(-1, 0) * v[1]; }},
    {"transpose then reshape", "a.transpose(0, 1).reshape(-1, 2)", {{2, 3, 4}}, {},
     [](auto& v) { return v[0].transpose(0, 1).reshape({-1, 2}); }},
    {"permute", "a.permute(2, 0, 1).tanh()", {{2, 3, 4}}, {},
     [](auto& v) { return v[0].permute({2, 0, 1}).tanh(); }},
    {"unsqueeze then squeeze", "a.unsqueeze(1).squeeze(1).unsqueeze(-1) * 3.0", {{3, 4}}, {},
     [](auto& v) { return v[0].unsqueeze(1).squeeze(1).unsqueeze(-1) * 3.0; }},
    {"expand", "a.expand(2, 3, 4).sin()", {{3, 1}}, {},
     [](auto& v) { return v[0].expand({2, 3, 4}).sin(); }},
    {"narrow", "a.narrow(-1, 1, 2).exp()", {{3, 4}}, {},
     [](auto& v) { return v[0].narrow(-1, 1, 2).exp(); }},
    {"narrow dim 2", "a.narrow(2, 1, 2)", {{2, 3, 4}}, {},
     [](auto& v) { return narrow(v[0], 2, 1, 2); }},
};
// clang-format on

}  // namespace

BOOST_AUTO_TEST_SUITE(test_shape)

BOOST_AUTO_TEST_CASE(table_gradcheck) { check_gradients(kShapeOps); }
BOOST_AUTO_TEST_CASE(table_golden) { check_golden(kShapeOps); }
BOOST_AUTO_TEST_CASE(table_edge_cases) { check_edge_cases(kShapeOps); }
BOOST_AUTO_TEST_CASE(table_edge_shapes) { check_edge_shapes(kShapeOps); }
BOOST_AUTO_TEST_CASE(table_anomaly) { check_anomaly(kShapeOps); }

BOOST_AUTO_TEST_CASE(views_share_storage) {
  Tensor x = arange(0, 6).reshape({2, 3});
  Tensor t = x.transpose(0, 1);
  BOOST_TEST((t.shape() == Shape{3, 2}));
  BOOST_TEST((t.strides() == Shape{1, 3}));
  BOOST_TEST(!t.is_contiguous());
  BOOST_TEST((t.contiguous().to_vector<float>() == std::vector<float>{0, 3, 1, 4, 2, 5}));
  t.narrow(0, 1, 1).fill_(9.0);  // writes through to x
  BOOST_TEST((x.to_vector<float>() == std::vector<float>{0, 9, 2, 3, 9, 5}));
  BOOST_TEST((x.unsqueeze(0).shape() == Shape{1, 2, 3}));
  BOOST_TEST((x.unsqueeze(-1).shape() == Shape{2, 3, 1}));
  BOOST_TEST((x.unsqueeze(0).squeeze(0).shape() == Shape{2, 3}));
  BOOST_TEST((x.squeeze(0).shape() == Shape{2, 3}));  // size 2: unchanged, as torch
  BOOST_TEST((x.view({-1}).shape() == Shape{6}));
  BOOST_TEST((x.flatten().shape() == Shape{6}));
  BOOST_TEST((x.permute({1, 0}).strides() == Shape{1, 3}));
  BOOST_TEST((x.expand({4, 2, 3}).strides() == Shape{0, 3, 1}));
  BOOST_TEST((tensor({1, 2}).reshape({2, 1}).expand({2, 3}).contiguous().to_vector<float>() ==
              std::vector<float>{1, 1, 1, 2, 2, 2}));
  // A transposed (B, T, h, d) view reshaped as the transformer does: needs a copy.
  Tensor b = arange(0, 24).reshape({2, 3, 4}).transpose(1, 2);
  BOOST_TEST((b.reshape({2, 12}).shape() == Shape{2, 12}));
  BOOST_TEST(b.reshape({2, 12}).to_vector<float>()[1] == 4.0f);
  // A view of a narrowed tensor keeps its offset.
  BOOST_TEST(arange(0, 12).reshape({3, 4}).narrow(0, 1, 2).view({8}).to_vector<float>()[0] == 4.0f);
}

BOOST_AUTO_TEST_CASE(errors) {
  expect_error([] { ones({2, 3}).view({4, 2}); }, {"view", "[4, 2]", "size 6"});
  expect_error([] { ones({2, 3}).reshape({-1, -1}); }, {"reshape", "-1"});
  expect_error([] { ones({2, 3}).transpose(0, 1).view({6}); }, {"view", "reshape"});
  expect_error([] { ones({2, 3}).transpose(0, 2); }, {"transpose", "dim 2"});
  expect_error([] { ones({2, 3}).permute({0, 0}); }, {"permute", "repeats"});
  expect_error([] { ones({2, 3}).expand({4, 3, 2}); }, {"expand", "[2, 3]"});
  expect_error([] { ones({2, 3}).narrow(1, 2, 2); }, {"narrow", "size 3"});
  expect_error([] { ones({2, 3}).item<float>(); }, {"item", "[2, 3]"});
  expect_error([] { ones({2}, kInt64).requires_grad_(); }, {"requires_grad_", "Int64"});
}

BOOST_AUTO_TEST_SUITE_END()
