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
    {"select", "a.select(1, 2).exp()", {{3, 4}}, {},
     [](auto& v) { return select(v[0], 1, 2).exp(); }},
    {"select negative dim and index", "a.select(-1, -3) * 2.0", {{2, 3, 4}}, {},
     [](auto& v) { return v[0].select(-1, -3) * 2.0; }},
    {"slice step 2", "a[:, 1::2]", {{3, 5}}, {},
     [](auto& v) { return slice(v[0], 1, 1, std::nullopt, 2); }},
    // negative bounds count from the end; -10 clamps to 0, 100 to the size
    {"slice negative bounds", "a[-10:-1].sin()", {{4, 3}}, {},
     [](auto& v) { return v[0].slice(0, -10, -1).sin(); }},
    {"slice step 3 past the end", "a[..., 1:100:3]", {{2, 3, 7}}, {},
     [](auto& v) { return v[0].slice(-1, 1, 100, 3); }},
    {"slice empty", "a[:, 3:1]", {{2, 4}}, {}, [](auto& v) { return v[0].slice(1, 3, 1); }},
    // every piece weighted differently, so each one's gradient is checked
    {"split uneven", "sum(p.sum(1) * (i + 1) for i, p in enumerate(a.split(2, 1)))", {{3, 5}},
     {},
     [](auto& v) {
       Tensor acc;
       const std::vector<Tensor> pieces = split(v[0], 2, 1);
       for (size_t i = 0; i < pieces.size(); ++i) {
         const Tensor term = pieces[i].sum({1}) * static_cast<double>(i + 1);
         acc = acc.defined() ? acc + term : term;
       }
       return acc;
     }},
    {"split dim -1 larger than the dim", "a.split(9, -1)[0].exp()", {{2, 3, 4}}, {},
     [](auto& v) { return v[0].split(9, -1)[0].exp(); }},
    // 6 rows in 4 chunks: three chunks of 2, as torch.chunk
    {"chunk fewer than asked",
     "torch.cat([p * (i + 1) for i, p in enumerate(a.chunk(4))])", {{6, 2}}, {},
     [](auto& v) {
       std::vector<Tensor> pieces = chunk(v[0], 4);
       for (size_t i = 0; i < pieces.size(); ++i) pieces[i] = pieces[i] * static_cast<double>(i + 1);
       return cat(pieces);
     }},
    {"chunk dim 1", "torch.cat([p * (i + 1) for i, p in enumerate(a.chunk(2, 1))], 1)",
     {{2, 5}}, {},
     [](auto& v) {
       std::vector<Tensor> pieces = v[0].chunk(2, 1);
       for (size_t i = 0; i < pieces.size(); ++i) pieces[i] = pieces[i] * static_cast<double>(i + 1);
       return cat(pieces, 1);
     }},
};
// clang-format on

}  // namespace

BOOST_AUTO_TEST_SUITE(test_shape)

BOOST_AUTO_TEST_CASE(table_gradcheck) { check_gradients(kShapeOps); }
BOOST_AUTO_TEST_CASE(table_gradgradcheck) { check_gradgradients(kShapeOps); }
BOOST_AUTO_TEST_CASE(table_forward_ad) { check_forward_gradients(kShapeOps); }
BOOST_AUTO_TEST_CASE(table_create_graph_gradients) { check_create_graph_gradients(kShapeOps); }
BOOST_AUTO_TEST_CASE(table_golden) { check_golden(kShapeOps); }
BOOST_AUTO_TEST_CASE(table_edge_cases) { check_edge_cases(kShapeOps); }
BOOST_AUTO_TEST_CASE(table_edge_shapes) { check_edge_shapes(kShapeOps); }
BOOST_AUTO_TEST_CASE(table_anomaly) { check_anomaly(kShapeOps); }
BOOST_AUTO_TEST_CASE(table_on_device) { check_on_device(kShapeOps); }

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

// select, slice, split and chunk are views: they share x's storage and write through to it.
BOOST_AUTO_TEST_CASE(select_slice_split_chunk_are_views) {
  Tensor x = arange(0, 12).reshape({3, 4});
  Tensor row = x.select(0, -1);
  BOOST_TEST((row.shape() == Shape{4}));
  BOOST_TEST((row.to_vector<float>() == std::vector<float>{8, 9, 10, 11}));
  Tensor col = select(x, 1, 2);
  BOOST_TEST((col.strides() == Shape{4}));
  BOOST_TEST((col.to_vector<float>() == std::vector<float>{2, 6, 10}));
  Tensor odd = x.slice(1, 1, std::nullopt, 2);
  BOOST_TEST((odd.shape() == Shape{3, 2}));
  BOOST_TEST((odd.strides() == Shape{4, 2}));
  BOOST_TEST((odd.to_vector<float>() == std::vector<float>{1, 3, 5, 7, 9, 11}));
  BOOST_TEST((x.slice(0, -100, 100).shape() == Shape{3, 4}));  // clamped, as Python
  BOOST_TEST((x.slice(0, 2, 1).shape() == Shape{0, 4}));
  BOOST_TEST((x.slice(1, -1).to_vector<float>() == std::vector<float>{3, 7, 11}));
  BOOST_TEST((x.slice(1, std::nullopt, -2).shape() == Shape{3, 2}));
  BOOST_TEST((x.slice(0, 1, 2, 5).shape() == Shape{1, 4}));

  const auto shapes = [](const std::vector<Tensor>& pieces) {
    std::vector<Shape> out;
    for (const Tensor& p : pieces) out.push_back(p.shape());
    return out;
  };
  BOOST_TEST((shapes(x.split(3, 1)) == std::vector<Shape>{{3, 3}, {3, 1}}));
  BOOST_TEST((shapes(x.split(5, 1)) == std::vector<Shape>{{3, 4}}));
  BOOST_TEST((shapes(split(zeros({0, 2}), 3)) == std::vector<Shape>{{0, 2}}));
  BOOST_TEST((shapes(split(zeros({0, 2}), 0)) == std::vector<Shape>{{0, 2}}));
  // torch.chunk: ceil(6 / 4) = 2 per chunk, so 3 chunks; 5 in 3 is 2 + 2 + 1
  BOOST_TEST((shapes(chunk(zeros({6}), 4)) == std::vector<Shape>{{2}, {2}, {2}}));
  BOOST_TEST((shapes(chunk(zeros({5}), 3)) == std::vector<Shape>{{2}, {2}, {1}}));
  BOOST_TEST((shapes(chunk(zeros({2}), 5)) == std::vector<Shape>{{1}, {1}}));
  BOOST_TEST((shapes(chunk(zeros({0, 2}), 3)) == std::vector<Shape>{{0, 2}, {0, 2}, {0, 2}}));
  BOOST_TEST((shapes(chunk(zeros({3, 4}), 2, -1)) == std::vector<Shape>{{3, 2}, {3, 2}}));

  // Writes through every kind of view reach x.
  row.fill_(-1.0);
  odd.select(0, 0).fill_(-2.0);
  x.split(3, 1)[1].mul_(10.0);
  x.chunk(3, 0)[1].select(1, 0).fill_(-3.0);
  BOOST_TEST(
      (x.to_vector<float>() == std::vector<float>{0, -2, 2, -20, -3, 5, 6, 70, -1, -1, -1, -10}));
}

// Gradients flow back through the views into the base, and add up where views overlap.
BOOST_AUTO_TEST_CASE(view_gradients) {
  Tensor x = arange(0, 6, 1, kFloat64).reshape({2, 3}).requires_grad_();
  const std::vector<Tensor> halves = x.chunk(2, 1);
  Tensor y = x.select(0, 1) * 2.0 +
             x.slice(1, std::nullopt, std::nullopt, 2).sum({0}).repeat({2}).slice(0, 0, 3) +
             halves[0].sum({1}).sum() + halves[1].sum() * 0.0 + x.split(1, 0)[0].squeeze(0);
  y.sum().backward();
  // select: row 1 gets 2 each; slice of columns 0 and 2: column 0 twice (outputs 0 and 2),
  // column 2 once; chunk: the first two columns 3 times (3 outputs); split: row 0 once.
  BOOST_TEST((x.grad().to_vector<double>() == std::vector<double>{6, 4, 2, 7, 5, 3}));
  // The pieces of one split are the outputs of one Node, whose backward writes their gradients
  // side by side (zeros for a piece that got none: the second row above).
  BOOST_TEST(halves[0].grad_fn() == halves[1].grad_fn());
  BOOST_TEST(halves[0].grad_fn()->name() == "ChunkBackward");
}

// slice's backward under create_graph is an op of its own (slice_backward: zeros with the
// gradient written into the slice), whose backward is slice again: checked as a function of the
// grad_output, twice.
BOOST_AUTO_TEST_CASE(slice_double_backward) {
  manual_seed(23);
  const Tensor x = leaf({4, 7});
  const auto backward_of_slice = [x](const std::vector<Tensor>& in) {
    return autograd::grad({x.slice(1, 1, std::nullopt, 3)}, {x}, {in[0]}, {}, true)[0];
  };
  const Tensor g = leaf({4, 2});
  const GradcheckResult r = gradgradcheck(backward_of_slice, {g});
  BOOST_TEST(r.ok, r.message);
  const Tensor dx = backward_of_slice({g});
  BOOST_TEST(dx.grad_fn()->name() == "SliceBackwardBackward");
  expect_close(dx.detach().slice(1, 1, std::nullopt, 3), g.detach(), 0, 0, "the slice");
  BOOST_TEST(dx.detach().sum().item<double>() == g.detach().sum().item<double>());
}

// The backwards of narrow, select and split under create_graph are ops of the views' own
// (slice_backward, split_backward), not cat: checked as functions of the grad_outputs, twice,
// with a piece of the split that gets no gradient (zeros there).
BOOST_AUTO_TEST_CASE(view_backwards_double_backward) {
  manual_seed(29);
  const Tensor x = leaf({4, 7});
  const auto narrowed = [x](const std::vector<Tensor>& in) {
    return autograd::grad({x.narrow(1, 2, 3)}, {x}, in, {}, true)[0];
  };
  const auto selected = [x](const std::vector<Tensor>& in) {
    return autograd::grad({x.select(1, 5)}, {x}, in, {}, true)[0];
  };
  const auto split = [x](const std::vector<Tensor>& in) {  // pieces of 3, 3 and 1 columns
    const std::vector<Tensor> pieces = x.split(3, 1);
    return autograd::grad({pieces[0], pieces[1]}, {x}, in, {}, true)[0];
  };
  const Tensor gn = leaf({4, 3}), gs = leaf({4}), g0 = leaf({4, 3}), g1 = leaf({4, 3});
  GradcheckResult r = gradgradcheck(narrowed, {gn});
  BOOST_TEST(r.ok, "narrow: " << r.message);
  r = gradgradcheck(selected, {gs});
  BOOST_TEST(r.ok, "select: " << r.message);
  r = gradgradcheck(split, {g0, g1});
  BOOST_TEST(r.ok, "split: " << r.message);
  BOOST_TEST(narrowed({gn}).grad_fn()->name() == "SliceBackwardBackward");
  BOOST_TEST(selected({gs}).grad_fn()->name() == "SliceBackwardBackward");
  const Tensor dx = split({g0, g1});
  BOOST_TEST(dx.grad_fn()->name() == "SplitBackwardBackward");
  expect_close(dx.detach().narrow(1, 0, 3), g0.detach(), 0, 0, "the first piece");
  expect_close(dx.detach().narrow(1, 3, 3), g1.detach(), 0, 0, "the second piece");
  expect_close(dx.detach().narrow(1, 6, 1), zeros({4, 1}, kFloat64), 0, 0, "the third piece");
}

BOOST_AUTO_TEST_CASE(errors) {
  expect_error([] { ones({2, 3}).view({4, 2}); }, {"view", "[4, 2]", "size 6"});
  expect_error([] { ones({2, 3}).reshape({-1, -1}); }, {"reshape", "-1"});
  expect_error([] { ones({2, 3}).transpose(0, 1).view({6}); }, {"view", "reshape"});
  expect_error([] { ones({2, 3}).transpose(0, 2); }, {"transpose", "dim 2"});
  expect_error([] { ones({2, 3}).permute({0, 0}); }, {"permute", "repeats"});
  expect_error([] { ones({2, 3}).expand({4, 3, 2}); }, {"expand", "[2, 3]"});
  expect_error([] { ones({2, 3}).narrow(1, 2, 2); }, {"narrow", "size 3"});
  expect_error([] { ones({2, 3}).select(1, 3); }, {"select", "index 3", "size 3"});
  expect_error([] { ones({2, 3}).select(0, -3); }, {"select", "index -3", "size 2"});
  expect_error([] { scalar_tensor(1.0).select(0, 0); }, {"select", "0-d"});
  expect_error([] { ones({2, 3}).select(2, 0); }, {"select", "dim 2"});
  expect_error([] { ones({2, 3}).slice(1, 0, 2, 0); }, {"slice", "step", "0"});
  expect_error([] { ones({2, 3}).slice(1, 2, 0, -1); }, {"slice", "step", "-1"});
  expect_error([] { scalar_tensor(1.0).slice(0); }, {"slice", "0-d"});
  expect_error([] { ones({2, 3}).slice(-3); }, {"slice", "dim -3"});
  expect_error([] { ones({2, 3}).split(-1); }, {"split", "non-negative", "-1"});
  expect_error([] { ones({2, 3}).split(0, 1); }, {"split", "0", "size 3"});
  expect_error([] { scalar_tensor(1.0).split(1); }, {"split", "0-d"});
  expect_error([] { ones({2, 3}).chunk(0); }, {"chunk", "positive", "0"});
  expect_error([] { ones({2, 3}).chunk(2, 2); }, {"chunk", "dim 2"});
  expect_error([] { ones({2, 3}).item<float>(); }, {"item", "[2, 3]"});
  expect_error([] { ones({2}, kInt64).requires_grad_(); }, {"requires_grad_", "Int64"});
}

BOOST_AUTO_TEST_SUITE_END()
