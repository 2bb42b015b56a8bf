// Gather/scatter ops (ops/index.cpp): one table of cases (tests/op_table.h) drives gradcheck,
// gradgradcheck and forward mode (first order, forward over forward and forward over reverse from
// tests/forward_over_forward.h, and on the device), the PyTorch golden values and gradients and
// the edge cases; then gradcheck (with forward mode) and gradgradcheck through views and edge
// shapes, embedding in forward mode with its padding row, the backwards recorded as ops under
// create_graph, sort's NaN order, other dtypes, and every error path.
#include <limits>

#include <boost/test/unit_test.hpp>

#include "tests/edge_shapes.h"
#include "tests/forward_over_forward.h"

using namespace ember;
using namespace ember::testing;

namespace {

using Inputs = std::vector<Tensor>;

// A 1-D Int64 index.
Tensor ints(std::vector<int64_t> v) {
  const int64_t n = static_cast<int64_t>(v.size());
  return on_row_device(from_vector(std::move(v), {n}));
}

// One row per op case; tests/op_table.h says what the fields mean. After adding or changing a
// row, run /usr/bin/python3 tests/golden/gen_op_tables.py. The rows are laid out by hand as a
// table (one line each, two when long), out of clang-format's reach. Index inputs are constants
// inside the row (ints() here, torch.tensor() in the expression).
// clang-format off
const OpTable kIndexOps = {
    {"repeat", "a.repeat(2, 1, 3)", {{2, 3}}, {}, [](auto& v) { return repeat(v[0], {2, 1, 3}); }},
    {"repeat size-1 dim", "a.repeat(4, 1)", {{1, 3}}, {},
     [](auto& v) { return v[0].repeat({4, 1}); }},
    {"repeat_interleave", "a.repeat_interleave(2)", {{2, 3}}, {},
     [](auto& v) { return repeat_interleave(v[0], 2); }},
    {"repeat_interleave dim -1", "a.repeat_interleave(3, dim=-1)", {{2, 3}}, {},
     [](auto& v) { return v[0].repeat_interleave(3, -1); }},
    {"repeat_interleave dim 0", "a.repeat_interleave(2, dim=0)", {{2, 3}}, {},
     [](auto& v) { return v[0].repeat_interleave(2, 0); }},
    // D2L: x_test.repeat_interleave(n_train).reshape(-1, n_train)
    {"repeat_interleave then reshape", "a.repeat_interleave(4).reshape(-1, 4)", {{5}}, {},
     [](auto& v) { return v[0].repeat_interleave(4).reshape({-1, 4}); }},
    {"cat dim -1", "torch.cat([a, b, c], dim=-1)", {{2, 3}, {2, 1}, {2, 2}}, {},
     [](auto& v) { return cat({v[0], v[1], v[2]}, -1); }},
    {"cat dim 0", "torch.cat([a, b])", {{1, 3}, {2, 3}}, {}, [](auto& v) { return cat(v); }},
    {"stack dim 1", "torch.stack([a, b, c], dim=1)", {{2, 3}, {2, 3}, {2, 3}}, {},
     [](auto& v) { return stack(v, 1); }},
    {"stack dim -1", "torch.stack([a, b], dim=-1)", {{2, 3}, {2, 3}}, {},
     [](auto& v) { return stack({v[0], v[1]}, -1); }},
    {"index_select", "a.index_select(0, torch.tensor([3, 0, 3, 1]))", {{4, 3}}, {},
     [](auto& v) { return index_select(v[0], 0, ints({3, 0, 3, 1})); }},
    {"index_select dim -1", "a.index_select(-1, torch.tensor([2, 2, 0]))", {{2, 3, 4}}, {},
     [](auto& v) { return v[0].index_select(-1, ints({2, 2, 0})); }},
    {"gather dim 1", "torch.gather(a, 1, torch.tensor([[0, 2, 2], [1, 0, 3], [3, 3, 0]]))",
     {{3, 4}}, {},
     [](auto& v) { return gather(v[0], 1, on_row_device(from_vector(std::vector<int64_t>{0, 2, 2, 1, 0, 3, 3, 3, 0}, {3, 3}))); }},
    // index longer than the input along dim 0 (repeats add up), narrower along dim 1
    {"gather dim 0 repeated", "a.gather(0, torch.tensor([[1, 0], [1, 1], [0, 1]]))", {{2, 3}}, {},
     [](auto& v) { return v[0].gather(0, on_row_device(from_vector(std::vector<int64_t>{1, 0, 1, 1, 0, 1}, {3, 2}))); }},
    {"gather dim -1 3-D", "a.gather(-1, torch.tensor([[[3], [0]], [[1], [1]]]))", {{2, 2, 4}}, {},
     [](auto& v) { return gather(v[0], -1, on_row_device(from_vector(std::vector<int64_t>{3, 0, 1, 1}, {2, 2, 1}))); }},
    {"scatter_add dim 1", "a.scatter_add(1, torch.tensor([[0, 1, 0], [2, 2, 2]]), b)",
     {{2, 4}, {2, 3}}, {},
     [](auto& v) { return scatter_add(v[0], 1, on_row_device(from_vector(std::vector<int64_t>{0, 1, 0, 2, 2, 2}, {2, 3})), v[1]); }},
    {"scatter_add dim 0", "torch.scatter_add(a, 0, torch.tensor([[2, 0], [2, 1]]), b)",
     {{3, 2}, {2, 2}}, {},
     [](auto& v) { return v[0].scatter_add(0, on_row_device(from_vector(std::vector<int64_t>{2, 0, 2, 1}, {2, 2})), v[1]); }},
    // index narrower than the input in the other dim
    {"scatter_add dim -1 narrow index", "a.scatter_add(-1, torch.tensor([[4, 0, 4]]), b)",
     {{2, 5}, {1, 3}}, {},
     [](auto& v) { return v[0].scatter_add(-1, on_row_device(from_vector(std::vector<int64_t>{4, 0, 4}, {1, 3})), v[1]); }},
    {"masked_select", "torch.masked_select(a, b)", {{3, 4}, {3, 4}}, {Real, Bool},
     [](auto& v) { return masked_select(v[0], v[1]); }},
    {"masked_select broadcast mask", "torch.masked_select(a, b)", {{3, 4}, {4}}, {Real, Bool},
     [](auto& v) { return v[0].masked_select(v[1]); }},
    {"masked_select broadcast input", "torch.masked_select(a, b)", {{3, 1}, {3, 4}}, {Real, Bool},
     [](auto& v) { return masked_select(v[0], v[1]); }},
    // D2L leave-one-out keys: X_tile[(1 - eye(n)).bool()].reshape(n, -1). kEdgeDiffers: torch's
    // x[mask] needs the mask's shape, masked_select broadcasts (a of shape [1] passes).
    {"repeat then masked_select", "a.repeat(5, 1)[(1 - torch.eye(5)).bool()].reshape(5, -1)",
     {{5}}, {},
     [](auto& v) {
       const Tensor keep = (1.0 - on_row_device(eye(5))).to(kBool);
       return v[0].repeat({5, 1}).masked_select(keep).reshape({5, -1});
     },
     kEdgeDiffers},
    {"triu", "torch.triu(a)", {{2, 3, 4}}, {}, [](auto& v) { return triu(v[0]); }},
    {"triu 1", "torch.triu(a, 1)", {{2, 3, 4}}, {}, [](auto& v) { return v[0].triu(1); }},
    {"triu -1", "torch.triu(a, -1)", {{2, 3, 4}}, {}, [](auto& v) { return triu(v[0], -1); }},
    {"tril", "torch.tril(a)", {{2, 3, 4}}, {}, [](auto& v) { return tril(v[0]); }},
    {"tril -2", "torch.tril(a, -2)", {{4, 3}}, {}, [](auto& v) { return v[0].tril(-2); }},
    {"tril 2", "torch.tril(a, 2)", {{4, 3}}, {}, [](auto& v) { return tril(v[0], 2); }},
    {"sort", "torch.sort(a).values", {{3, 6}}, {}, [](auto& v) { return sort(v[0]).values; }},
    {"sort descending", "torch.sort(a, descending=True).values", {{3, 6}}, {},
     [](auto& v) { return sort(v[0], -1, true).values; }},
    {"sort dim 0", "torch.sort(a, dim=0).values", {{3, 6}}, {},
     [](auto& v) { return v[0].sort(0).values; }},
    // longer than the insertion-sort cutoff
    {"sort long descending", "torch.sort(a, descending=True).values", {{40}}, {},
     [](auto& v) { return sort(v[0], 0, true).values; }},
    // ties: stable, as torch's stable=True; finite differences would split the tie
    {"sort ties", "torch.sort(a, stable=True).values", {{3, 6}}, {Integer},
     [](auto& v) { return sort(v[0]).values; }, kNoGradcheck},
    {"sort ties long descending", "torch.sort(a, descending=True, stable=True).values", {{40}},
     {Integer}, [](auto& v) { return sort(v[0], 0, true).values; }, kNoGradcheck},
    {"sort indices ties", "torch.sort(a, stable=True).indices", {{3, 6}}, {Integer},
     [](auto& v) { return sort(v[0]).indices; }, kNoGrad},
    {"sort indices ties descending", "torch.sort(a, descending=True, stable=True).indices",
     {{3, 6}}, {Integer}, [](auto& v) { return sort(v[0], -1, true).indices; }, kNoGrad},
    {"sort indices ties dim 0", "torch.sort(a, dim=0, stable=True).indices", {{3, 6}}, {Integer},
     [](auto& v) { return v[0].sort(0).indices; }, kNoGrad},
    {"sort indices ties long descending", "torch.sort(a, descending=True, stable=True).indices",
     {{40}}, {Integer}, [](auto& v) { return sort(v[0], 0, true).indices; }, kNoGrad},
    {"topk", "torch.topk(a, 3).values", {{3, 6}}, {}, [](auto& v) { return topk(v[0], 3).values; }},
    {"topk smallest dim 0", "torch.topk(a, 2, dim=0, largest=False).values", {{4, 3}}, {},
     [](auto& v) { return v[0].topk(2, 0, false).values; }},
    // k * 64 <= n: torch's partial_sort path
    {"topk long row", "torch.topk(a, 2).values", {{2, 130}}, {},
     [](auto& v) { return topk(v[0], 2).values; }},
    // ties: the gradient goes where torch's indices point; finite differences would split them
    {"topk ties", "torch.topk(a, 3).values", {{3, 8}}, {Integer},
     [](auto& v) { return topk(v[0], 3).values; }, kNoGradcheck | kDeviceTieOrder},
    {"topk indices ties", "torch.topk(a, 3).indices", {{3, 8}}, {Integer},
     [](auto& v) { return topk(v[0], 3).indices; }, kNoGrad | kDeviceTieOrder},
    {"topk indices ties smallest", "torch.topk(a, 4, largest=False).indices", {{2, 9}}, {Integer},
     [](auto& v) { return topk(v[0], 4, -1, false).indices; }, kNoGrad | kDeviceTieOrder},
    {"topk indices ties dim 0", "torch.topk(a, 5, dim=0).indices", {{7, 3}}, {Integer},
     [](auto& v) { return v[0].topk(5, 0).indices; }, kNoGrad | kDeviceTieOrder},
    {"topk indices ties long row", "torch.topk(a, 1).indices", {{2, 70}}, {Integer},
     [](auto& v) { return topk(v[0], 1).indices; }, kNoGrad | kDeviceTieOrder},
    {"topk indices ties unsorted", "torch.topk(a, 3, sorted=False).indices", {{3, 8}}, {Integer},
     [](auto& v) { return topk(v[0], 3, -1, true, false).indices; }, kNoGrad | kDeviceTieOrder},
};
// clang-format on

}  // namespace

BOOST_AUTO_TEST_SUITE(test_index)

BOOST_AUTO_TEST_CASE(table_gradcheck) { check_gradients(kIndexOps); }
BOOST_AUTO_TEST_CASE(table_gradgradcheck) { check_gradgradients(kIndexOps); }
BOOST_AUTO_TEST_CASE(table_forward_ad) { check_forward_gradients(kIndexOps); }
BOOST_AUTO_TEST_CASE(table_forward_over_forward) { check_forward_over_forward(kIndexOps); }
BOOST_AUTO_TEST_CASE(table_forward_over_reverse) { check_forward_over_reverse(kIndexOps); }
BOOST_AUTO_TEST_CASE(table_create_graph_gradients) { check_create_graph_gradients(kIndexOps); }
BOOST_AUTO_TEST_CASE(table_golden) { check_golden(kIndexOps); }
BOOST_AUTO_TEST_CASE(table_edge_cases) { check_edge_cases(kIndexOps); }
BOOST_AUTO_TEST_CASE(table_edge_shapes) { check_edge_shapes(kIndexOps); }
BOOST_AUTO_TEST_CASE(table_anomaly) { check_anomaly(kIndexOps); }
// The forward rules run there too: ctest device_emulated runs the table_on_device cases.
BOOST_AUTO_TEST_CASE(table_on_device) {
  check_on_device(kIndexOps);
  check_forward_on_device(kIndexOps);
}

namespace {

// Non-contiguous (transposed, expanded, narrowed) inputs, size-1 and 0-d shapes, negative dims:
// functions of leaves of shapes (2, 3, 4), (3, 1) and (2, 37).
std::vector<std::pair<std::string, Fn>> views_and_edge_shapes() {
  const Tensor idx = from_vector(std::vector<int64_t>{1, 1, 0, 2, 1}, {5});
  const Tensor mask = from_vector(std::vector<double>{1, 0, 1, 1}, {4, 1}, kBool);
  const std::vector<std::pair<std::string, Fn>> fs = {
      {"repeat 0-d",
       [](const Inputs& v) {
         return repeat(v[0].sum(), {3, 2});
       }},
      {"repeat permuted",
       [](const Inputs& v) {
         return v[0].permute({2, 0, 1}).repeat({2, 1, 1, 2});
       }},
      {"repeat expanded",
       [](const Inputs& v) {
         return v[1].expand({3, 4}).repeat({1, 2});
       }},
      {"repeat_interleave 0-d", [](const Inputs& v) { return repeat_interleave(v[0].sum(), 3); }},
      {"repeat_interleave size-1",
       [](const Inputs& v) { return v[1].repeat_interleave(2, 0).repeat_interleave(3, -1); }},
      {"repeat_interleave permuted",
       [](const Inputs& v) {
         return v[0].permute({1, 2, 0}).repeat_interleave(2, 1);
       }},
      {"cat views",
       [](const Inputs& v) {
         return cat({v[0].narrow(0, 0, 1).squeeze(0), v[1].expand({3, 4}).narrow(1, 1, 3),
                     v[0].transpose(0, 1).narrow(1, 1, 1).squeeze(1)},
                    -1);
       }},
      {"cat transposed narrowed",
       [](const Inputs& v) {
         return cat({v[0].transpose(1, 2).narrow(1, 0, 3), v[0]}, 2);
       }},
      {"stack views",
       [](const Inputs& v) {
         return stack({v[1].expand({3, 2}), v[0].narrow(2, 1, 2).narrow(0, 1, 1).squeeze(0)}, 0);
       }},
      {"stack single size-1", [](const Inputs& v) { return stack({v[1]}, -1); }},
      {"stack 0-d",
       [](const Inputs& v) {
         return stack({v[0].sum(), v[1].mean(), v[0].sum()});
       }},
      {"index_select transposed",
       [=](const Inputs& v) { return v[0].transpose(0, 2).index_select(1, idx.narrow(0, 2, 3)); }},
      {"index_select repeated dim 0",
       [=](const Inputs& v) { return index_select(v[0], -3, idx.narrow(0, 0, 2)); }},
      {"index_select 0-d index",
       [](const Inputs& v) {
         return index_select(v[1], 1, from_vector(std::vector<int64_t>{0}, {}));
       }},
      {"masked_select transposed broadcast",
       [=](const Inputs& v) { return masked_select(v[0].transpose(1, 2), mask); }},
      {"masked_select both broadcast",
       [=](const Inputs& v) { return masked_select(v[1].squeeze(1).unsqueeze(0), mask); }},
      {"triu permuted",
       [](const Inputs& v) {
         return triu(v[0].permute({2, 0, 1}), 1);
       }},
      {"tril transposed", [](const Inputs& v) { return tril(v[0].transpose(-1, -2), -1); }},
      {"tril size-1 dims", [](const Inputs& v) { return tril(v[1].unsqueeze(0), 0); }},
      {"sort transposed dim 0",
       [](const Inputs& v) { return sort(v[0].transpose(0, 2), 0).values; }},
      {"sort dim 1 descending", [](const Inputs& v) { return v[0].sort(1, true).values; }},
      {"sort expanded",
       [](const Inputs& v) {
         return (sort(v[1].expand({3, 5}), 0).values * 1.5).sum({0});
       }},
      {"sort long row", [](const Inputs& v) { return sort(v[2]).values; }},
  };
  return fs;
}

}  // namespace

// With the forward rules' columns (check_forward_ad) against the same finite differences.
BOOST_AUTO_TEST_CASE(gradcheck_views_and_edge_shapes) {
  manual_seed(12);
  Inputs inputs = {leaf({2, 3, 4}), leaf({3, 1}), leaf({2, 37})};
  GradcheckOptions forward;
  forward.check_forward_ad = true;
  for (const auto& [name, f] : views_and_edge_shapes()) check_gradient(f, inputs, name, forward);
}

// Second derivatives beyond the table: the views and edge shapes above; 0-d gather and
// scatter_add, a src larger than its index, topk unsorted; and products of these ops, whose
// second derivatives in the input are not zero.
BOOST_AUTO_TEST_CASE(gradgradcheck_views_edge_shapes_and_products) {
  manual_seed(13);
  Inputs inputs = {leaf({2, 3, 4}), leaf({3, 1}), leaf({2, 37})};
  for (const auto& [name, f] : views_and_edge_shapes()) {
    const GradcheckResult r = gradgradcheck(f, inputs);
    BOOST_TEST(r.ok, name << ": " << r.message);
  }
  const Tensor idx = from_vector(std::vector<int64_t>{2, 0, 0, 1, 1, 1}, {2, 3});
  const Tensor i0 = from_vector(std::vector<int64_t>{0}, {});
  const Tensor mask = from_vector(std::vector<double>{1, 0, 1, 1}, {1, 4}, kBool);
  const Tensor constant = randn({3, 3}, kFloat64);
  const std::vector<std::pair<std::string, Fn>> fs = {
      {"gather 0-d", [=](const Inputs& v) { return gather(v[0].sum(), 0, i0) * v[0].sum(); }},
      {"scatter_add 0-d",
       [=](const Inputs& v) { return scatter_add(v[0].sum(), -1, i0, v[1].mean()); }},
      {"scatter_add src larger than index",
       [=](const Inputs& v) { return scatter_add(v[0], 1, idx.narrow(1, 0, 2), v[1] * v[1]); }},
      {"scatter_add src only",
       [=](const Inputs& v) { return scatter_add(constant, 0, idx, v[1].narrow(0, 0, 2)); }},
      {"gather times input",
       [=](const Inputs& v) { return gather(v[1] * v[0], 1, idx) * gather(v[0], 1, idx); }},
      {"index_select squared",
       [](const Inputs& v) {
         return index_select(v[1].transpose(0, 1), 0, ints({3, 3, 0})).pow(2.0);
       }},
      {"masked_select product",
       [=](const Inputs& v) {
         return masked_select(v[0], mask) * masked_select(v[0] * 2.0, mask);
       }},
      {"repeat times repeat_interleave",
       [](const Inputs& v) {
         return repeat(v[0], {2, 1}) * repeat_interleave(v[1], 2, 0);
       }},
      {"triu times tril", [](const Inputs& v) { return triu(v[0], 1) * tril(v[0], 2); }},
      {"sort squared", [](const Inputs& v) { return sort(v[0], 0, true).values.pow(2.0); }},
      {"topk unsorted of a product",
       [](const Inputs& v) { return topk(v[0] * v[0].sum(), 2, -1, false, false).values; }},
  };
  Inputs in = {leaf({3, 4}), leaf({3, 4})};
  for (const auto& [name, f] : fs) {
    const GradcheckResult r = gradgradcheck(f, in);
    BOOST_TEST(r.ok, name << ": " << r.message);
  }
}

// Under create_graph the backwards are recorded as ops (index_select's as an index_add of its
// own, whose backward is index_select again; masked_select's likewise); without, nothing is.
BOOST_AUTO_TEST_CASE(double_backward_records_ops) {
  const Tensor x = tensor({1, 2, 3}, kFloat64).requires_grad_();
  const Tensor g = tensor({10, 20, 30}, kFloat64).requires_grad_();
  const Tensor y = index_select(x, 0, from_vector(std::vector<int64_t>{2, 2, 0}, {3}));
  const Tensor dx = autograd::grad({y}, {x}, {g}, std::nullopt, true)[0];
  BOOST_TEST((dx.to_vector<double>() == std::vector<double>{30, 0, 30}));
  BOOST_TEST(dx.grad_fn()->name() == "IndexAddBackward");
  const Tensor dg = autograd::grad({dx}, {g}, {tensor({1, 2, 3}, kFloat64)})[0];
  BOOST_TEST((dg.to_vector<double>() == std::vector<double>{3, 3, 1}));
  BOOST_TEST(!autograd::grad({y}, {x}, {g})[0].requires_grad());

  const Tensor mask = from_vector(std::vector<double>{0, 1, 1}, {3}, kBool);
  const Tensor z = masked_select(x, mask);
  const Tensor h = tensor({5, 7}, kFloat64).requires_grad_();
  const Tensor dxz = autograd::grad({z}, {x}, {h}, std::nullopt, true)[0];
  BOOST_TEST((dxz.to_vector<double>() == std::vector<double>{0, 5, 7}));
  BOOST_TEST(dxz.grad_fn()->name() == "MaskedScatterBackward");
  const Tensor dh = autograd::grad({dxz}, {h}, {tensor({1, 2, 3}, kFloat64)})[0];
  BOOST_TEST((dh.to_vector<double>() == std::vector<double>{2, 3}));

  const Tensor w = tensor({4, 1, 3}, kFloat64).requires_grad_();
  const Tensor dw = autograd::grad({topk(w, 2).values}, {w}, {h}, std::nullopt, true)[0];
  BOOST_TEST((dw.to_vector<double>() == std::vector<double>{5, 0, 7}));
  BOOST_TEST(dw.grad_fn()->name() == "ScatterAddBackward");
}

// embedding in forward mode (its table rows are test_nn_functional's): the padding row's
// tangent is held at zero, as the backward gives that row no gradient, so forward and reverse
// agree; with and without a padding row, forward over forward and forward over reverse
// (embedding_backward's rule), and on the device.
BOOST_AUTO_TEST_CASE(forward_ad_embedding) {
  namespace fa = ember::autograd::forward_ad;
  manual_seed(14);
  const Tensor w = randn({5, 3}, kFloat64), u = randn({5, 3}, kFloat64);
  const Tensor idx = from_vector(std::vector<int64_t>{1, 4, 4, 2, 0, 4}, {3, 2});
  {
    fa::DualLevel level;
    const Tensor t = fa::unpack_dual(embedding(fa::make_dual(w, u), idx, 4)).tangent;
    Tensor held = u.clone();
    held.narrow(0, 4, 1).fill_(0.0);
    expect_close(t, embedding(held, idx), 0, 0, "tangent with padding row 4");
    expect_close(fa::unpack_dual(embedding(fa::make_dual(w, u), idx)).tangent, embedding(u, idx), 0,
                 0, "tangent without a padding row");
  }
  // Squared, so that the second derivatives are not zero.
  // clang-format off
  const std::vector<OpCase> rows = {
      {"embedding padding_idx 4", "", {{5, 3}}, {},
       [](auto& v) { return pow(embedding(v[0], ints({1, 4, 4, 2, 0, 4}).reshape({3, 2}), 4), 2.0); }},
      {"embedding", "", {{5, 3}}, {},
       [](auto& v) { return pow(embedding(v[0], ints({1, 4, 4, 2, 0, 4}).reshape({3, 2})), 2.0); }},
  };
  // clang-format on
  check_forward_over_forward(rows);
  check_forward_over_reverse(rows);
  check_forward_gradients({rows[1]});  // finite differences see the padding row move
  check_forward_on_device({rows[1]});
}

// Float64 values through the same graph twice: a repeated index and a repeated tile both add up.
BOOST_AUTO_TEST_CASE(gradients_accumulate) {
  Tensor x = tensor({1, 2, 3}, kFloat64).requires_grad_();
  index_select(x, 0, from_vector(std::vector<int64_t>{2, 2, 0, 2}, {4})).sum().backward();
  BOOST_TEST((x.grad().to_vector<double>() == std::vector<double>{1, 0, 3}));
  Tensor y = tensor({1, 2}, kFloat64).requires_grad_();
  repeat(y, {3, 2}).sum().backward();
  BOOST_TEST((y.grad().to_vector<double>() == std::vector<double>{6, 6}));
  Tensor z = tensor({1, 2}, kFloat64).requires_grad_();
  repeat_interleave(z, 3).sum().backward();
  BOOST_TEST((z.grad().to_vector<double>() == std::vector<double>{3, 3}));
}

// gather and scatter_add beyond the table: 0-d inputs, other dtypes, empty indices, a src larger
// than its index (its other elements get a zero gradient; torch 1.13's backward refuses it).
BOOST_AUTO_TEST_CASE(gather_scatter_add_shapes_and_dtypes) {
  const Tensor ints = from_vector(std::vector<int64_t>{1, 2, 3, 4, 5, 6}, {2, 3});
  BOOST_TEST(
      (gather(ints, 1, from_vector(std::vector<int64_t>{2, 0}, {2, 1})).to_vector<int64_t>() ==
       std::vector<int64_t>{3, 4}));
  BOOST_TEST((scatter_add(ints, 0, from_vector(std::vector<int64_t>{1, 1}, {1, 2}),
                          from_vector(std::vector<int64_t>{10, 20}, {1, 2}))
                  .to_vector<int64_t>() == std::vector<int64_t>{1, 2, 3, 14, 25, 6}));
  const Tensor five = scalar_tensor(5.0, kFloat64);
  BOOST_TEST((gather(five, 0, from_vector(std::vector<int64_t>{0, 0}, {2})).to_vector<double>() ==
              std::vector<double>{5, 5}));
  BOOST_TEST((gather(five, -1, from_vector(std::vector<int64_t>{0}, {})).shape() == Shape{}));
  BOOST_TEST(
      scatter_add(five, 0, from_vector(std::vector<int64_t>{0}, {}), scalar_tensor(2.0, kFloat64))
          .item<double>() == 7.0);
  BOOST_TEST((gather(zeros({2, 3}), 1, zeros({3, 0}, kInt64)).shape() == Shape{3, 0}));
  BOOST_TEST(
      (scatter_add(ones({2, 3}), 1, zeros({3, 0}, kInt64), ones({1, 1})).to_vector<float>() ==
       std::vector<float>(6, 1.0f)));

  Tensor x = zeros({2, 3}, kFloat64).requires_grad_();
  Tensor src = ones({2, 4}, kFloat64).requires_grad_();
  Tensor y = scatter_add(x, 1, from_vector(std::vector<int64_t>{0, 1, 2, 2}, {2, 2}), src);
  BOOST_TEST((y.to_vector<double>() == std::vector<double>{1, 1, 0, 0, 0, 2}));
  y.backward(arange(0, 6, 1, kFloat64).reshape({2, 3}));
  BOOST_TEST((x.grad().to_vector<double>() == std::vector<double>{0, 1, 2, 3, 4, 5}));
  BOOST_TEST((src.grad().to_vector<double>() == std::vector<double>{0, 1, 0, 0, 5, 5, 0, 0}));
  const Inputs in = {leaf({2, 3}), leaf({3, 4})};
  const Tensor idx = from_vector(std::vector<int64_t>{2, 0, 0, 1, 1, 1}, {2, 3});
  check_gradient([&](const Inputs& v) { return scatter_add(v[0], 1, idx.narrow(1, 0, 2), v[1]); },
                 in, "scatter_add src larger than index");
  check_gradient([&](const Inputs& v) { return gather(v[1].transpose(0, 1), 0, idx); }, in,
                 "gather transposed");
}

BOOST_AUTO_TEST_CASE(sort_nan_order_indices_and_dtypes) {
  const double nan = std::nan("");
  const Tensor x = from_vector(std::vector<double>{1, nan, 0, 1}, {4}, kFloat64);
  SortResult asc = sort(x);
  const std::vector<double> va = asc.values.to_vector<double>();
  BOOST_TEST(va[0] == 0.0);
  BOOST_TEST(va[1] == 1.0);
  BOOST_TEST(va[2] == 1.0);
  BOOST_TEST(std::isnan(va[3]));
  BOOST_TEST((asc.indices.to_vector<int64_t>() == std::vector<int64_t>{2, 0, 3, 1}));
  BOOST_TEST((asc.indices.dtype() == kInt64));
  SortResult desc = x.to(kFloat32).sort(0, true);
  BOOST_TEST(std::isnan(desc.values.to_vector<double>()[0]));
  BOOST_TEST((desc.indices.to_vector<int64_t>() == std::vector<int64_t>{1, 0, 3, 2}));

  const Tensor ints = from_vector(std::vector<int64_t>{3, -1, 2, 2}, {2, 2});
  BOOST_TEST((sort(ints, 0).values.to_vector<int64_t>() == std::vector<int64_t>{2, -1, 3, 2}));
  const SortResult s0 = sort(scalar_tensor(4.0));
  BOOST_TEST(s0.values.item<double>() == 4.0);
  BOOST_TEST(s0.indices.item<int64_t>() == 0);
}

BOOST_AUTO_TEST_CASE(topk_nan_dtypes_and_shapes) {
  const double nan = std::nan("");
  const Tensor x = from_vector(std::vector<double>{1, nan, 0, 3}, {4}, kFloat64);
  const TopkResult top = topk(x, 2);  // NaN counts as the largest, as torch
  BOOST_TEST(std::isnan(top.values.to_vector<double>()[0]));
  BOOST_TEST((top.indices.to_vector<int64_t>() == std::vector<int64_t>{1, 3}));
  BOOST_TEST((topk(x, 2, 0, false).indices.to_vector<int64_t>() == std::vector<int64_t>{2, 0}));
  const Tensor ints = from_vector(std::vector<int64_t>{3, -1, 2, 7}, {2, 2});
  BOOST_TEST((topk(ints, 1).values.to_vector<int64_t>() == std::vector<int64_t>{3, 7}));
  BOOST_TEST((topk(ints, 1).indices.dtype() == kInt64));
  BOOST_TEST((topk(ints, 0).values.shape() == Shape{2, 0}));
  const TopkResult scalar = topk(scalar_tensor(4.0), 1);
  BOOST_TEST(scalar.values.item<double>() == 4.0);
  BOOST_TEST(scalar.indices.item<int64_t>() == 0);
  BOOST_TEST((topk(zeros({0, 3}), 2).values.shape() == Shape{0, 2}));
  // The values' gradient lands where they came from.
  Tensor w = tensor({1, 5, 3, 4}, kFloat64).requires_grad_();
  (topk(w, 2).values * tensor({10, 1}, kFloat64)).sum().backward();
  BOOST_TEST((w.grad().to_vector<double>() == std::vector<double>{0, 10, 0, 1}));
}

namespace {

// Pearson's chi-square statistic of observed counts against expected ones (cells with an
// expectation of 0 must be empty and add nothing).
double chi_square(const std::vector<double>& observed, const std::vector<double>& expected) {
  double chi2 = 0;
  for (size_t i = 0; i < observed.size(); ++i) {
    if (expected[i] == 0) {
      BOOST_TEST(observed[i] == 0.0, "a category of probability 0 was drawn: cell " << i);
      continue;
    }
    chi2 += (observed[i] - expected[i]) * (observed[i] - expected[i]) / expected[i];
  }
  return chi2;
}

}  // namespace

// Note [Chi-square bounds]
// A correct sampler's statistic follows (for these counts, closely) a chi-square law with k =
// (cells of non-zero probability - 1) degrees of freedom. Each bound below is exceeded with
// probability about 1e-8 for its largest k (40 for k = 3, 37 for k = 2, 60 for k = 11; a
// smaller k only makes it safer), so a correct sampler passes on any seed, while a probability
// off by a few percent fails by far at these counts. The seed is fixed: a run is reproducible.
BOOST_AUTO_TEST_CASE(multinomial_statistics) {
  manual_seed(2024);
  // With replacement, 1-D: 200000 draws over weights 1, 2, 3, 4 and a zero.
  {
    const int64_t n = 200000;
    const Tensor draws = multinomial(tensor({1, 2, 0, 3, 4}), n, true);
    BOOST_TEST((draws.shape() == Shape{n}));
    BOOST_TEST((draws.dtype() == kInt64));
    std::vector<double> counts(5, 0.0), expected;
    for (int64_t c : draws.to_vector<int64_t>()) counts.at(c) += 1;
    for (double w : {1, 2, 0, 3, 4}) expected.push_back(n * w / 10);
    BOOST_TEST(chi_square(counts, expected) < 40.0);
  }
  // With replacement, 2-D: each row its own distribution (Float64, a transposed view).
  {
    const int64_t n = 100000;
    const Tensor w = from_vector(std::vector<double>{1, 0, 1, 5, 1, 1}, {3, 2}, kFloat64);
    const Tensor draws = multinomial(w.transpose(0, 1), n, true);  // rows (1, 1, 1), (0, 5, 1)
    BOOST_TEST((draws.shape() == Shape{2, n}));
    const std::vector<int64_t> all = draws.to_vector<int64_t>();
    const std::vector<std::vector<double>> probs = {{1.0 / 3, 1.0 / 3, 1.0 / 3},
                                                    {0, 5.0 / 6, 1.0 / 6}};
    for (int64_t r = 0; r < 2; ++r) {
      std::vector<double> counts(3, 0.0), expected;
      for (int64_t i = 0; i < n; ++i) counts.at(all[r * n + i]) += 1;
      for (double p : probs[r]) expected.push_back(n * p);
      BOOST_TEST(chi_square(counts, expected) < 40.0, "row " << r);
    }
  }
  // Without replacement: ordered pairs (i, j) have P = w_i / W · w_j / (W - w_i), one row each
  // of an expanded (n, 4) weight tensor.
  {
    const int64_t n = 60000;
    const std::vector<double> w = {1, 2, 3, 4};
    const Tensor draws = multinomial(tensor({1, 2, 3, 4}).expand({n, 4}), 2);
    BOOST_TEST((draws.shape() == Shape{n, 2}));
    const std::vector<int64_t> all = draws.to_vector<int64_t>();
    std::vector<double> counts(16, 0.0), expected(16, 0.0);
    for (int64_t r = 0; r < n; ++r) {
      BOOST_TEST_REQUIRE(all[2 * r] != all[2 * r + 1], "a category drawn twice in row " << r);
      counts.at(all[2 * r] * 4 + all[2 * r + 1]) += 1;
    }
    for (int i = 0; i < 4; ++i)
      for (int j = 0; j < 4; ++j)
        if (i != j) expected[i * 4 + j] = n * w[i] / 10 * w[j] / (10 - w[i]);
    BOOST_TEST(chi_square(counts, expected) < 60.0);
  }
  // Without replacement, one draw (the inverse-transform path): the weights' law.
  {
    const int64_t n = 50000;
    const Tensor draws = multinomial(tensor({3, 0, 1}).expand({n, 3}), 1);
    std::vector<double> counts(3, 0.0);
    for (int64_t c : draws.to_vector<int64_t>()) counts.at(c) += 1;
    BOOST_TEST(chi_square(counts, {n * 0.75, 0, n * 0.25}) < 37.0);
  }
}

BOOST_AUTO_TEST_CASE(multinomial_permutations_and_seeding) {
  manual_seed(3);
  // num_samples = C without replacement: a permutation in every row.
  const std::vector<int64_t> perm = multinomial(ones({50, 6}), 6).to_vector<int64_t>();
  for (int64_t r = 0; r < 50; ++r) {
    std::vector<int64_t> row(perm.begin() + r * 6, perm.begin() + r * 6 + 6);
    std::sort(row.begin(), row.end());
    BOOST_TEST((row == std::vector<int64_t>{0, 1, 2, 3, 4, 5}));
  }
  // Zero-weight categories come after the positive ones, lowest index first.
  for (int i = 0; i < 20; ++i) {
    const std::vector<int64_t> d = multinomial(tensor({0, 1, 0, 2, 0}), 5).to_vector<int64_t>();
    BOOST_TEST(((d[0] == 1 && d[1] == 3) || (d[0] == 3 && d[1] == 1)));
    BOOST_TEST((std::vector<int64_t>(d.begin() + 2, d.end()) == std::vector<int64_t>{0, 2, 4}));
  }
  BOOST_TEST((multinomial(zeros({0, 3}), 2).shape() == Shape{0, 2}));
  BOOST_TEST((multinomial(tensor({0, 0, 1}), 4, true).to_vector<int64_t>() ==
              std::vector<int64_t>{2, 2, 2, 2}));

  // The global generator: one seed, one sequence; the state saves and restores.
  const Tensor w = rand({4, 10}) + 0.1;
  manual_seed(11);
  const std::vector<int64_t> a = w.multinomial(3).to_vector<int64_t>();
  const std::vector<int64_t> a2 = w.multinomial(20, true).to_vector<int64_t>();
  manual_seed(11);
  BOOST_TEST((w.multinomial(3).to_vector<int64_t>() == a));
  const Tensor state = get_rng_state();
  BOOST_TEST((w.multinomial(20, true).to_vector<int64_t>() == a2));
  set_rng_state(state);
  BOOST_TEST((multinomial(w, 20, true).to_vector<int64_t>() == a2));
  manual_seed(12);
  BOOST_TEST((multinomial(w, 20, true).to_vector<int64_t>() != a2));
}

BOOST_AUTO_TEST_CASE(other_dtypes_and_empty_shapes) {
  const Tensor b = from_vector(std::vector<double>{1, 0, 0, 1}, {2, 2}, kBool);
  BOOST_TEST((cat({b, b}, 1).shape() == Shape{2, 4}));
  BOOST_TEST((triu(b).to_vector<int64_t>() == std::vector<int64_t>{1, 0, 0, 1}));
  const Tensor ints = from_vector(std::vector<int64_t>{1, 2, 3, 4}, {2, 2});
  BOOST_TEST(
      (index_select(ints, 1, from_vector(std::vector<int64_t>{1}, {1})).to_vector<int64_t>() ==
       std::vector<int64_t>{2, 4}));
  BOOST_TEST((masked_select(ints, b).to_vector<int64_t>() == std::vector<int64_t>{1, 4}));
  BOOST_TEST((stack({ints, ints}, 2).to_vector<int64_t>() ==
              std::vector<int64_t>{1, 1, 2, 2, 3, 3, 4, 4}));
  BOOST_TEST((repeat(ints, {1, 0}).shape() == Shape{2, 0}));
  BOOST_TEST((repeat_interleave(ints, 0, 1).shape() == Shape{2, 0}));
  BOOST_TEST((cat({zeros({2, 0}), ones({2, 3})}, 1).shape() == Shape{2, 3}));
  BOOST_TEST(masked_select(ones({2, 2}), zeros({2, 2}).to(kBool)).numel() == 0);
  BOOST_TEST(index_select(scalar_tensor(5.0), 0, from_vector(std::vector<int64_t>{0}, {1}))
                 .item<double>() == 5.0);
}

BOOST_AUTO_TEST_CASE(graph_is_freed) {
  const int64_t nodes = live_nodes();
  {
    Tensor x = randn({3, 4}, kFloat64).requires_grad_();
    Tensor y = cat({repeat(x, {2, 1}), triu(x)}, 0);
    Tensor z = sort(index_select(y, 0, from_vector(std::vector<int64_t>{0, 8, 8}, {3})), -1).values;
    masked_select(stack({z, z}), gt(z, 0.0)).sum().backward();
    BOOST_TEST(x.grad().defined());
  }
  BOOST_TEST(live_nodes() == nodes);
}

BOOST_AUTO_TEST_CASE(errors) {
  expect_error(
      [] {
        repeat(zeros({2, 3}), {2});
      },
      {"repeat: number of repeats (1) can not be smaller than number of dims (2)"});
  expect_error([] { repeat(zeros({2}), {-1}); }, {"repeat", "non-negative", "[-1]"});
  expect_error([] { repeat_interleave(zeros({2}), -2, 0); }, {"repeat_interleave", "-2"});
  expect_error([] { repeat_interleave(zeros({2}), 2, 1); }, {"repeat_interleave", "dim 1"});

  expect_error(
      [] {
        cat({zeros({2, 3}), zeros({2, 3}), zeros({3, 4})}, 1);
      },
      {"cat", "tensor 2", "[3, 4]", "[2, 3]"});
  expect_error(
      [] {
        cat({zeros({2, 3}), zeros({2, 3, 1})});
      },
      {"cat", "tensor 1", "[2, 3, 1]", "[2, 3]"});
  expect_error(
      [] {
        cat({zeros({2, 3}), zeros({2, 3}, kFloat64)});
      },
      {"cat", "tensor 1", "Float64", "Float32", "[2, 3]"});
  expect_error([] { cat({}); }, {"cat", "empty"});
  expect_error([] { cat({zeros({2}), zeros({2})}, 1); }, {"cat", "dim 1"});
  expect_error([] { cat({scalar_tensor(1.0)}); }, {"cat", "zero-dimensional"});
  expect_error(
      [] {
        stack({zeros({2, 3}), zeros({3, 2})});
      },
      {"stack", "tensor 1", "[3, 2]", "[2, 3]"});
  expect_error([] { stack({}); }, {"stack", "empty"});
  expect_error([] { stack({zeros({2}), zeros({2})}, 2); }, {"stack", "dim 2"});

  const Tensor x = zeros({3, 2});
  expect_error(
      [&] {
        index_select(x, 0, from_vector(std::vector<int64_t>{0, 5}, {2}));
      },
      {"index_select", "index 5", "size 3"});
  expect_error([&] { index_select(x, 1, from_vector(std::vector<int64_t>{-1}, {1})); },
               {"index_select", "index -1", "size 2"});
  expect_error([&] { index_select(x, 0, tensor({0, 1})); }, {"index_select", "Int64", "Float32"});
  expect_error(
      [&] {
        index_select(x, 0, zeros({2, 2}, kInt64));
      },
      {"index_select", "1-D", "[2, 2]"});
  expect_error([&] { index_select(x, 2, zeros({1}, kInt64)); }, {"index_select", "dim 2"});

  expect_error(
      [&] {
        masked_select(zeros({2, 3}), zeros({4}, kBool));
      },
      {"masked_select", "[2, 3]", "[4]"});
  expect_error([&] { masked_select(x, zeros({3, 2})); }, {"masked_select", "Bool", "Float32"});

  const Tensor i22 = from_vector(std::vector<int64_t>{0, 1, 1, 0}, {2, 2});
  expect_error(
      [&] {
        gather(x, 1, from_vector(std::vector<int64_t>{0, 2}, {1, 2}));
      },
      {"gather", "index 2", "out of bounds", "dim 1", "size 2"});
  expect_error(
      [&] {
        gather(x, 0, from_vector(std::vector<int64_t>{-1}, {1, 1}));
      },
      {"gather", "index -1", "size 3"});
  expect_error([&] { gather(x, 1, i22.to(kFloat32)); }, {"gather", "Int64", "Float32"});
  expect_error(
      [&] {
        gather(x, 1, from_vector(std::vector<int64_t>{0, 1}, {2}));
      },
      {"gather", "[2]", "[3, 2]", "dims"});
  expect_error(
      [&] {
        gather(x, 0, zeros({2, 3}, kInt64));
      },
      {"gather", "[2, 3]", "[3, 2]", "dim 1"});
  expect_error([&] { gather(x, 2, i22); }, {"gather", "dim 2"});
  expect_error(
      [&] {
        scatter_add(x, 0, from_vector(std::vector<int64_t>{3, 0}, {1, 2}), ones({1, 2}));
      },
      {"scatter_add", "index 3", "out of bounds", "dim 0", "size 3"});
  expect_error(
      [&] {
        scatter_add(x, 0, i22, ones({2, 1}));
      },
      {"scatter_add", "src", "[2, 1]", "dim 1"});
  expect_error(
      [&] {
        scatter_add(x, 0, i22, ones({2, 2}, kFloat64));
      },
      {"scatter_add", "Float64", "Float32"});
  expect_error([&] { scatter_add(x, 0, i22, ones({4})); }, {"scatter_add", "src", "[4]", "dims"});
  expect_error([] { topk(zeros({2, 3}), 4); }, {"topk", "k 4", "size 3"});
  expect_error([] { topk(zeros({2, 3}), -1, 0); }, {"topk", "k -1", "size 2"});
  expect_error([] { topk(zeros({2, 3}), 1, 2); }, {"topk", "dim 2"});
  expect_error([] { topk(zeros({2}, kBool), 1); }, {"topk", "Bool"});
  expect_error(
      [] {
        multinomial(tensor({1, -1, 2}), 1);
      },
      {"multinomial", "non-negative", "-1", "category 1"});
  expect_error(
      [] {
        multinomial(tensor({1, std::numeric_limits<double>::infinity()}), 1);
      },
      {"multinomial", "finite", "inf"});
  expect_error(
      [] {
        multinomial(tensor({std::nan(""), 1}).reshape({1, 2}), 1, true);
      },
      {"multinomial", "finite", "nan", "row 0"});
  expect_error(
      [] {
        multinomial(tensor({1, 1, 0, 0}).reshape({2, 2}), 1);
      },
      {"multinomial", "row 1", "sum to 0"});
  expect_error([] { multinomial(tensor({0, 0}), 1, true); }, {"multinomial", "sum to 0"});
  expect_error(
      [] {
        multinomial(tensor({1, 1, 1}), 4);
      },
      {"multinomial", "4 samples", "3 categories", "without replacement"});
  expect_error([] { multinomial(tensor({1, 1}), 0); }, {"multinomial", "num_samples", "0"});
  expect_error([] { multinomial(ones({2, 2, 2}), 1); }, {"multinomial", "1-D or 2-D", "[2, 2, 2]"});
  expect_error([] { multinomial(scalar_tensor(1.0), 1); }, {"multinomial", "1-D or 2-D", "[]"});
  expect_error([] { multinomial(ones({3}, kInt64), 1); }, {"multinomial", "Int64"});
  expect_error([] { multinomial(Tensor(), 1); }, {"multinomial", "undefined"});
  expect_error([] { triu(zeros({3})); }, {"triu", "[3]"});
  expect_error([] { tril(scalar_tensor(1.0)); }, {"tril", "2 dims"});
  expect_error([] { sort(zeros({2, 2}), 2); }, {"sort", "dim 2"});
}

BOOST_AUTO_TEST_SUITE_END()
