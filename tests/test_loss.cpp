// Losses: one table of cases (tests/op_table.h) drives, for every reduction, gradcheck and
// gradgradcheck on several layouts, the backward in ops (create_graph) against the kernels', the
// PyTorch golden values and gradients and the edge cases (ignored targets, label smoothing,
// broadcast, size-1 and 0-d inputs); then zero targets of kl_div, consistency between the fused
// and composed forms, and every error message.
#include <boost/test/unit_test.hpp>

#include "tests/edge_shapes.h"

using namespace ember;
using namespace ember::testing;

namespace {

using enum Reduction;

const std::vector<std::pair<std::string, Reduction>> kReductions = {
    {"none", None}, {"mean", Mean}, {"sum", Sum}};

// Int64 targets, on the row's device (tests/op_table.h): 1-D, or one 0-d.
Tensor targets(std::vector<int64_t> v) {
  const int64_t n = static_cast<int64_t>(v.size());
  return on_row_device(from_vector(std::move(v), {n}));
}
Tensor target(int64_t t) { return on_row_device(from_vector(std::vector<int64_t>{t}, {})); }
// Int64 targets of any shape (K-dim losses), row-major.
Tensor targets(std::vector<int64_t> v, Shape shape) {
  return on_row_device(from_vector(std::move(v), shape));
}

// One row per op case; tests/op_table.h says what the fields mean. After adding or changing a
// row, run /usr/bin/python3 tests/golden/gen_op_tables.py. The rows are laid out by hand as a
// table (one line each, more when long), out of clang-format's reach. Targets are constants
// inside the row (targets() here, torch.tensor() in the expression); Reduction's enumerators
// are in scope.
// clang-format off
const OpTable kLossOps = {
    // mse_loss: same shapes, a broadcast target, size-1 dims, 0-d
    {"mse_loss none", "F.mse_loss(a, b, reduction='none')",
     {{3, 4}, {3, 4}}, {}, [](auto& v) { return mse_loss(v[0], v[1], None); }},
    {"mse_loss mean", "F.mse_loss(a, b)",
     {{3, 4}, {3, 4}}, {}, [](auto& v) { return mse_loss(v[0], v[1], Mean); }},
    {"mse_loss sum", "F.mse_loss(a, b, reduction='sum')",
     {{3, 4}, {3, 4}}, {}, [](auto& v) { return mse_loss(v[0], v[1], Sum); }},
    {"mse_loss broadcast target none", "F.mse_loss(a, b, reduction='none')",
     {{3, 4}, {4}}, {}, [](auto& v) { return mse_loss(v[0], v[1], None); }},
    {"mse_loss broadcast target mean", "F.mse_loss(a, b)",
     {{3, 4}, {4}}, {}, [](auto& v) { return mse_loss(v[0], v[1], Mean); }},
    {"mse_loss broadcast target sum", "F.mse_loss(a, b, reduction='sum')",
     {{3, 4}, {4}}, {}, [](auto& v) { return mse_loss(v[0], v[1], Sum); }},
    {"mse_loss size-1 dims none", "F.mse_loss(a, b, reduction='none')",
     {{1, 4}, {3, 1}}, {}, [](auto& v) { return mse_loss(v[0], v[1], None); }},
    {"mse_loss size-1 dims mean", "F.mse_loss(a, b)",
     {{1, 4}, {3, 1}}, {}, [](auto& v) { return mse_loss(v[0], v[1], Mean); }},
    {"mse_loss size-1 dims sum", "F.mse_loss(a, b, reduction='sum')",
     {{1, 4}, {3, 1}}, {}, [](auto& v) { return mse_loss(v[0], v[1], Sum); }},
    {"mse_loss 0-d none", "F.mse_loss(a, b, reduction='none')",
     {{}, {}}, {}, [](auto& v) { return mse_loss(v[0], v[1], None); }},
    {"mse_loss 0-d mean", "F.mse_loss(a, b)",
     {{}, {}}, {}, [](auto& v) { return mse_loss(v[0], v[1], Mean); }},
    {"mse_loss 0-d sum", "F.mse_loss(a, b, reduction='sum')",
     {{}, {}}, {}, [](auto& v) { return mse_loss(v[0], v[1], Sum); }},
    // nll_loss: ignored targets (-100, then 7), a 1-D input with a 0-d target
    {"nll_loss none", "F.nll_loss(a, torch.tensor([1, 0, -100, 3, 1]), reduction='none')",
     {{5, 4}}, {}, [](auto& v) { return nll_loss(v[0], targets({1, 0, -100, 3, 1}), None); }},
    {"nll_loss mean", "F.nll_loss(a, torch.tensor([1, 0, -100, 3, 1]))",
     {{5, 4}}, {}, [](auto& v) { return nll_loss(v[0], targets({1, 0, -100, 3, 1}), Mean); }},
    {"nll_loss sum", "F.nll_loss(a, torch.tensor([1, 0, -100, 3, 1]), reduction='sum')",
     {{5, 4}}, {}, [](auto& v) { return nll_loss(v[0], targets({1, 0, -100, 3, 1}), Sum); }},
    {"nll_loss ignore_index 7 none", "F.nll_loss(a, torch.tensor([2, 7, 2]), reduction='none', "
     "ignore_index=7)",
     {{3, 4}}, {}, [](auto& v) { return nll_loss(v[0], targets({2, 7, 2}), None, 7); }},
    {"nll_loss ignore_index 7 mean", "F.nll_loss(a, torch.tensor([2, 7, 2]), ignore_index=7)",
     {{3, 4}}, {}, [](auto& v) { return nll_loss(v[0], targets({2, 7, 2}), Mean, 7); }},
    {"nll_loss ignore_index 7 sum", "F.nll_loss(a, torch.tensor([2, 7, 2]), reduction='sum', "
     "ignore_index=7)",
     {{3, 4}}, {}, [](auto& v) { return nll_loss(v[0], targets({2, 7, 2}), Sum, 7); }},
    {"nll_loss 1-D none", "F.nll_loss(a, torch.tensor(2), reduction='none')",
     {{4}}, {}, [](auto& v) { return nll_loss(v[0], target(2), None); }},
    {"nll_loss 1-D mean", "F.nll_loss(a, torch.tensor(2))",
     {{4}}, {}, [](auto& v) { return nll_loss(v[0], target(2), Mean); }},
    {"nll_loss 1-D sum", "F.nll_loss(a, torch.tensor(2), reduction='sum')",
     {{4}}, {}, [](auto& v) { return nll_loss(v[0], target(2), Sum); }},
    // cross_entropy: ignore_index 2 with label smoothing 0, 0.1 and 1; a 1-D input; one class
    {"cross_entropy none", "F.cross_entropy(a, torch.tensor([0, 4, 2, 1, 3, 2]), reduction='none')",
     {{6, 5}}, {}, [](auto& v) { return cross_entropy(v[0], targets({0, 4, 2, 1, 3, 2}), None); }},
    {"cross_entropy mean", "F.cross_entropy(a, torch.tensor([0, 4, 2, 1, 3, 2]))",
     {{6, 5}}, {}, [](auto& v) { return cross_entropy(v[0], targets({0, 4, 2, 1, 3, 2}), Mean); }},
    {"cross_entropy sum", "F.cross_entropy(a, torch.tensor([0, 4, 2, 1, 3, 2]), reduction='sum')",
     {{6, 5}}, {}, [](auto& v) { return cross_entropy(v[0], targets({0, 4, 2, 1, 3, 2}), Sum); }},
    {"cross_entropy ignore_index 2 none", "F.cross_entropy(a, torch.tensor([0, 4, 2, 1, 3, 2]), "
     "reduction='none', ignore_index=2)",
     {{6, 5}}, {},
     [](auto& v) { return cross_entropy(v[0], targets({0, 4, 2, 1, 3, 2}), None, 2); }},
    {"cross_entropy ignore_index 2 mean", "F.cross_entropy(a, torch.tensor([0, 4, 2, 1, 3, 2]), "
     "ignore_index=2)",
     {{6, 5}}, {},
     [](auto& v) { return cross_entropy(v[0], targets({0, 4, 2, 1, 3, 2}), Mean, 2); }},
    {"cross_entropy ignore_index 2 sum", "F.cross_entropy(a, torch.tensor([0, 4, 2, 1, 3, 2]), "
     "reduction='sum', ignore_index=2)",
     {{6, 5}}, {},
     [](auto& v) { return cross_entropy(v[0], targets({0, 4, 2, 1, 3, 2}), Sum, 2); }},
    {"cross_entropy smoothing 0.1 none", "F.cross_entropy(a, torch.tensor([0, 4, 2, 1, 3, 2]), "
     "reduction='none', ignore_index=2, label_smoothing=0.1)",
     {{6, 5}}, {},
     [](auto& v) { return cross_entropy(v[0], targets({0, 4, 2, 1, 3, 2}), None, 2, 0.1); }},
    {"cross_entropy smoothing 0.1 mean", "F.cross_entropy(a, torch.tensor([0, 4, 2, 1, 3, 2]), "
     "ignore_index=2, label_smoothing=0.1)",
     {{6, 5}}, {},
     [](auto& v) { return cross_entropy(v[0], targets({0, 4, 2, 1, 3, 2}), Mean, 2, 0.1); }},
    {"cross_entropy smoothing 0.1 sum", "F.cross_entropy(a, torch.tensor([0, 4, 2, 1, 3, 2]), "
     "reduction='sum', ignore_index=2, label_smoothing=0.1)",
     {{6, 5}}, {},
     [](auto& v) { return cross_entropy(v[0], targets({0, 4, 2, 1, 3, 2}), Sum, 2, 0.1); }},
    {"cross_entropy smoothing 1 none", "F.cross_entropy(a, torch.tensor([0, 4, 2, 1, 3, 2]), "
     "reduction='none', ignore_index=2, label_smoothing=1.0)",
     {{6, 5}}, {},
     [](auto& v) { return cross_entropy(v[0], targets({0, 4, 2, 1, 3, 2}), None, 2, 1.0); }},
    {"cross_entropy smoothing 1 mean", "F.cross_entropy(a, torch.tensor([0, 4, 2, 1, 3, 2]), "
     "ignore_index=2, label_smoothing=1.0)",
     {{6, 5}}, {},
     [](auto& v) { return cross_entropy(v[0], targets({0, 4, 2, 1, 3, 2}), Mean, 2, 1.0); }},
    {"cross_entropy smoothing 1 sum", "F.cross_entropy(a, torch.tensor([0, 4, 2, 1, 3, 2]), "
     "reduction='sum', ignore_index=2, label_smoothing=1.0)",
     {{6, 5}}, {},
     [](auto& v) { return cross_entropy(v[0], targets({0, 4, 2, 1, 3, 2}), Sum, 2, 1.0); }},
    {"cross_entropy 1-D none", "F.cross_entropy(a, torch.tensor(3), reduction='none', "
     "label_smoothing=0.2)",
     {{5}}, {}, [](auto& v) { return cross_entropy(v[0], target(3), None, -100, 0.2); }},
    {"cross_entropy 1-D mean", "F.cross_entropy(a, torch.tensor(3), label_smoothing=0.2)",
     {{5}}, {}, [](auto& v) { return cross_entropy(v[0], target(3), Mean, -100, 0.2); }},
    {"cross_entropy 1-D sum", "F.cross_entropy(a, torch.tensor(3), reduction='sum', "
     "label_smoothing=0.2)",
     {{5}}, {}, [](auto& v) { return cross_entropy(v[0], target(3), Sum, -100, 0.2); }},
    {"cross_entropy one class none", "F.cross_entropy(a, torch.tensor([0, 0]), reduction='none')",
     {{2, 1}}, {}, [](auto& v) { return cross_entropy(v[0], targets({0, 0}), None); }},
    {"cross_entropy one class mean", "F.cross_entropy(a, torch.tensor([0, 0]))",
     {{2, 1}}, {}, [](auto& v) { return cross_entropy(v[0], targets({0, 0}), Mean); }},
    {"cross_entropy one class sum", "F.cross_entropy(a, torch.tensor([0, 0]), reduction='sum')",
     {{2, 1}}, {}, [](auto& v) { return cross_entropy(v[0], targets({0, 0}), Sum); }},
    // K-dim: scores (N, C, d1, ...) with targets (N, d1, ...); ignore_index and smoothing apply
    // per position, the mean is over the positions not ignored
    {"nll_loss K-dim none", "F.nll_loss(a, torch.tensor([[0, 4, 2], [1, -100, 3]]), "
     "reduction='none')",
     {{2, 5, 3}}, {},
     [](auto& v) { return nll_loss(v[0], targets({0, 4, 2, 1, -100, 3}, {2, 3}), None); }},
    {"nll_loss K-dim mean", "F.nll_loss(a, torch.tensor([[0, 4, 2], [1, -100, 3]]))",
     {{2, 5, 3}}, {},
     [](auto& v) { return nll_loss(v[0], targets({0, 4, 2, 1, -100, 3}, {2, 3}), Mean); }},
    {"nll_loss K-dim sum", "F.nll_loss(a, torch.tensor([[0, 4, 2], [1, -100, 3]]), "
     "reduction='sum')",
     {{2, 5, 3}}, {},
     [](auto& v) { return nll_loss(v[0], targets({0, 4, 2, 1, -100, 3}, {2, 3}), Sum); }},
    {"nll_loss 4-D none", "F.nll_loss(a, torch.tensor([[[0, 4], [2, 2], [1, 3]], "
     "[[4, 4], [0, 1], [3, 2]]]), reduction='none', ignore_index=2)",
     {{2, 5, 3, 2}}, {},
     [](auto& v) {
       return nll_loss(v[0], targets({0, 4, 2, 2, 1, 3, 4, 4, 0, 1, 3, 2}, {2, 3, 2}), None, 2);
     }},
    {"nll_loss 4-D mean", "F.nll_loss(a, torch.tensor([[[0, 4], [2, 2], [1, 3]], "
     "[[4, 4], [0, 1], [3, 2]]]), ignore_index=2)",
     {{2, 5, 3, 2}}, {},
     [](auto& v) {
       return nll_loss(v[0], targets({0, 4, 2, 2, 1, 3, 4, 4, 0, 1, 3, 2}, {2, 3, 2}), Mean, 2);
     }},
    {"cross_entropy K-dim none", "F.cross_entropy(a, torch.tensor([[0, 4, 2], [1, 3, 3]]), "
     "reduction='none')",
     {{2, 5, 3}}, {},
     [](auto& v) { return cross_entropy(v[0], targets({0, 4, 2, 1, 3, 3}, {2, 3}), None); }},
    {"cross_entropy K-dim mean", "F.cross_entropy(a, torch.tensor([[0, 4, 2], [1, 3, 3]]))",
     {{2, 5, 3}}, {},
     [](auto& v) { return cross_entropy(v[0], targets({0, 4, 2, 1, 3, 3}, {2, 3}), Mean); }},
    {"cross_entropy K-dim sum", "F.cross_entropy(a, torch.tensor([[0, 4, 2], [1, 3, 3]]), "
     "reduction='sum')",
     {{2, 5, 3}}, {},
     [](auto& v) { return cross_entropy(v[0], targets({0, 4, 2, 1, 3, 3}, {2, 3}), Sum); }},
    {"cross_entropy K-dim smoothing 0.1 ignore_index 3 none", "F.cross_entropy(a, "
     "torch.tensor([[0, 4, 2], [1, 3, 3]]), reduction='none', ignore_index=3, label_smoothing=0.1)",
     {{2, 5, 3}}, {},
     [](auto& v) {
       return cross_entropy(v[0], targets({0, 4, 2, 1, 3, 3}, {2, 3}), None, 3, 0.1);
     }},
    {"cross_entropy K-dim smoothing 0.1 ignore_index 3 mean", "F.cross_entropy(a, "
     "torch.tensor([[0, 4, 2], [1, 3, 3]]), ignore_index=3, label_smoothing=0.1)",
     {{2, 5, 3}}, {},
     [](auto& v) {
       return cross_entropy(v[0], targets({0, 4, 2, 1, 3, 3}, {2, 3}), Mean, 3, 0.1);
     }},
    {"cross_entropy 4-D none", "F.cross_entropy(a, torch.tensor([[[0, 4], [2, 2], [1, 3]], "
     "[[4, 4], [0, 1], [3, 2]]]), reduction='none')",
     {{2, 5, 3, 2}}, {},
     [](auto& v) {
       return cross_entropy(v[0], targets({0, 4, 2, 2, 1, 3, 4, 4, 0, 1, 3, 2}, {2, 3, 2}), None);
     }},
    {"cross_entropy 4-D mean", "F.cross_entropy(a, torch.tensor([[[0, 4], [2, 2], [1, 3]], "
     "[[4, 4], [0, 1], [3, 2]]]))",
     {{2, 5, 3, 2}}, {},
     [](auto& v) {
       return cross_entropy(v[0], targets({0, 4, 2, 2, 1, 3, 4, 4, 0, 1, 3, 2}, {2, 3, 2}), Mean);
     }},
    {"cross_entropy 4-D smoothing 0.2 ignore_index 2 sum", "F.cross_entropy(a, "
     "torch.tensor([[[0, 4], [2, 2], [1, 3]], [[4, 4], [0, 1], [3, 2]]]), reduction='sum', "
     "ignore_index=2, label_smoothing=0.2)",
     {{2, 5, 3, 2}}, {},
     [](auto& v) {
       return cross_entropy(v[0], targets({0, 4, 2, 2, 1, 3, 4, 4, 0, 1, 3, 2}, {2, 3, 2}), Sum, 2,
                            0.2);
     }},
    {"cross_entropy 4-D smoothing 0.2 ignore_index 2 mean", "F.cross_entropy(a, "
     "torch.tensor([[[0, 4], [2, 2], [1, 3]], [[4, 4], [0, 1], [3, 2]]]), "
     "ignore_index=2, label_smoothing=0.2)",
     {{2, 5, 3, 2}}, {},
     [](auto& v) {
       return cross_entropy(v[0], targets({0, 4, 2, 2, 1, 3, 4, 4, 0, 1, 3, 2}, {2, 3, 2}), Mean,
                            2, 0.2);
     }},
    // an empty batch: torch gives NaN for the mean (0 / 0), 0 for the sum
    {"nll_loss empty batch mean", "F.nll_loss(a, torch.zeros(0, dtype=torch.long))",
     {{0, 4}}, {}, [](auto& v) { return nll_loss(v[0], on_row_device(zeros({0}, kInt64)), Mean); }},
    {"nll_loss empty batch sum", "F.nll_loss(a, torch.zeros(0, dtype=torch.long), reduction='sum')",
     {{0, 4}}, {}, [](auto& v) { return nll_loss(v[0], on_row_device(zeros({0}, kInt64)), Sum); }},
    {"cross_entropy empty batch mean", "F.cross_entropy(a, torch.zeros(0, dtype=torch.long))",
     {{0, 4}}, {}, [](auto& v) { return cross_entropy(v[0], on_row_device(zeros({0}, kInt64)), Mean); }},
    {"cross_entropy empty batch none", "F.cross_entropy(a, torch.zeros(0, dtype=torch.long), "
     "reduction='none', label_smoothing=0.1)",
     {{0, 4}}, {}, [](auto& v) { return cross_entropy(v[0], on_row_device(zeros({0}, kInt64)), None, -100, 0.1); }},
    {"mse_loss empty mean", "F.mse_loss(a, b)",
     {{0, 3}, {0, 3}}, {}, [](auto& v) { return mse_loss(v[0], v[1], Mean); }},
    // kl_div: a positive target, differentiable too; then a broadcast one
    {"kl_div none", "F.kl_div(a, b, reduction='none')",
     {{3, 4}, {3, 4}}, {Real, Positive}, [](auto& v) { return kl_div(v[0], v[1], None); }},
    {"kl_div mean", "F.kl_div(a, b)",
     {{3, 4}, {3, 4}}, {Real, Positive}, [](auto& v) { return kl_div(v[0], v[1], Mean); }},
    {"kl_div sum", "F.kl_div(a, b, reduction='sum')",
     {{3, 4}, {3, 4}}, {Real, Positive}, [](auto& v) { return kl_div(v[0], v[1], Sum); }},
    {"kl_div broadcast target none", "F.kl_div(a, b, reduction='none')",
     {{3, 4}, {4}}, {Real, Positive}, [](auto& v) { return kl_div(v[0], v[1], None); }},
    {"kl_div broadcast target mean", "F.kl_div(a, b)",
     {{3, 4}, {4}}, {Real, Positive}, [](auto& v) { return kl_div(v[0], v[1], Mean); }},
    {"kl_div broadcast target sum", "F.kl_div(a, b, reduction='sum')",
     {{3, 4}, {4}}, {Real, Positive}, [](auto& v) { return kl_div(v[0], v[1], Sum); }},
};
// clang-format on

// Gradcheck of f for every reduction, then Float32 forward against Float64. Int64 inputs pass
// through unchanged.
void check_all_reductions(const std::string& what,
                          const std::function<Tensor(const std::vector<Tensor>&, Reduction)>& f,
                          const std::vector<Tensor>& inputs) {
  for (const auto& [name, r] : kReductions) {
    const auto fr = [&, r = r](const std::vector<Tensor>& v) { return f(v, r); };
    check_gradient(fr, inputs, what + " " + name);
    std::vector<Tensor> singles;
    for (const Tensor& t : inputs)
      singles.push_back(t.dtype() == kFloat64 ? t.detach().to(kFloat32) : t);
    expect_close(fr(singles).to(kFloat64), fr(inputs), 1e-5, 1e-5, what + " Float32 " + name);
  }
}

}  // namespace

BOOST_AUTO_TEST_SUITE(test_loss)

BOOST_AUTO_TEST_CASE(table_gradcheck) { check_gradients(kLossOps); }
BOOST_AUTO_TEST_CASE(table_gradgradcheck) { check_gradgradients(kLossOps); }
BOOST_AUTO_TEST_CASE(table_forward_ad) { check_forward_gradients(kLossOps); }
BOOST_AUTO_TEST_CASE(table_create_graph_gradients) { check_create_graph_gradients(kLossOps); }
BOOST_AUTO_TEST_CASE(table_golden) { check_golden(kLossOps); }
BOOST_AUTO_TEST_CASE(table_edge_cases) { check_edge_cases(kLossOps); }
BOOST_AUTO_TEST_CASE(table_edge_shapes) { check_edge_shapes(kLossOps); }
BOOST_AUTO_TEST_CASE(table_anomaly) { check_anomaly(kLossOps); }
BOOST_AUTO_TEST_CASE(table_on_device) { check_on_device(kLossOps); }

// kl_div with zeros in the target (ops.json): zero entries contribute 0.
BOOST_AUTO_TEST_CASE(kl_div_zero_targets_golden) {
  Golden g("ops.json");
  for (const auto& [name, r] : kReductions)
    expect_close(kl_div(g["kl_lp"], g["kl_t"], r), g["kl_" + name], 1e-12, 1e-12, "kl " + name);
  Tensor lp = g["kl_lp"].requires_grad_();
  kl_div(lp, g["kl_t"], Sum).backward();
  expect_close(lp.grad(), g["kl_grad_sum"], 1e-12, 1e-12, "kl grad");
}

BOOST_AUTO_TEST_CASE(mse_loss_target_without_grad) {
  manual_seed(1);
  // Only the input requires grad: the target gets none.
  Tensor a = leaf({2, 2});
  const Tensor t = randn({2, 2}, kFloat64);
  mse_loss(a, t).backward();
  BOOST_TEST(a.grad().defined());
  BOOST_TEST(!t.grad().defined());
  BOOST_TEST(a.mse_loss(t, Reduction::Sum).item<double>() ==
                 mse_loss(a, t, Reduction::Mean).item<double>() * 4,
             boost::test_tools::tolerance(1e-12));
}

BOOST_AUTO_TEST_CASE(nll_loss_every_target_ignored) {
  // Every target ignored: the mean is 0 / 0, as torch.
  const Tensor all = targets({-100, -100});
  BOOST_TEST(std::isnan(nll_loss(zeros({2, 3}), all).item<double>()));
  BOOST_TEST(nll_loss(zeros({2, 3}), all, Reduction::Sum).item<double>() == 0.0);
}

BOOST_AUTO_TEST_CASE(cross_entropy_matches_composed_form) {
  manual_seed(4);
  // Large enough for the parallel rows.
  const Tensor x = randn({600, 64}, kFloat64) * 3.0;
  Tensor t = randint(0, 64, {600});
  t.narrow(0, 10, 5).fill_(-100);
  const Tensor lp = log_softmax(x, 1);
  for (const auto& [name, r] : kReductions) {
    expect_close(cross_entropy(x, t, r), nll_loss(lp, t, r), 1e-12, 1e-12, "plain " + name);
    // torch's smoothing: (1 - eps) nll + eps / C * Σ_c -log p_c, ignored rows excluded.
    const Tensor keep = ne(t, -100.0).to(kFloat64);
    const Tensor smooth = -(lp.sum({1})) * keep;
    Tensor ref = nll_loss(lp, t, r) * 0.9;
    if (r == Reduction::None) ref = ref + smooth * (0.1 / 64);
    if (r == Reduction::Sum) ref = ref + smooth.sum() * (0.1 / 64);
    if (r == Reduction::Mean) ref = ref + smooth.sum() / keep.sum() * (0.1 / 64);
    expect_close(cross_entropy(x, t, r, -100, 0.1), ref, 1e-12, 1e-12, "smoothed " + name);
  }
  // Backward above the grain agrees with the composed form's.
  Tensor a = x.detach().clone().requires_grad_(), b = x.detach().clone().requires_grad_();
  cross_entropy(a, t, Reduction::Mean, -100, 0.0).backward();
  nll_loss(log_softmax(b, 1), t).backward();
  expect_close(a.grad(), b.grad(), 1e-10, 1e-14, "backward");
  // Extreme logits stay finite.
  const Tensor big = from_vector(std::vector<double>{1e4, -1e4, 0, -1e9, 5, -1e9}, {2, 3});
  const double l =
      cross_entropy(big.to(kFloat32), targets({0, 1}), Reduction::Sum, -100, 0.1).item<double>();
  BOOST_TEST(std::isfinite(l));
  BOOST_TEST(x.cross_entropy(t).item<double>() == cross_entropy(x, t).item<double>());
}

// (N, C, d1, d2) scores are the (N d1 d2, C) rows moved to the end: both losses, values and
// gradients, on a transposed (non-contiguous) input large enough for the parallel rows.
BOOST_AUTO_TEST_CASE(k_dim_matches_rows_form) {
  manual_seed(6);
  const Tensor base = randn({3, 4, 7, 40}, kFloat64) * 2.0;  // (N, d1, d2, C), then moved
  Tensor t = randint(0, 40, {3, 4, 7});
  t.select(1, 2).fill_(-100);
  const Tensor rows_t = t.reshape({-1});
  for (const auto& [name, r] : kReductions) {
    for (double eps : {0.0, 0.15}) {
      Tensor a = base.detach().clone().requires_grad_(), b = base.detach().clone().requires_grad_();
      const Tensor k_dim = cross_entropy(a.permute({0, 3, 1, 2}), t, r, -100, eps);
      const Tensor rows = cross_entropy(b.reshape({-1, 40}), rows_t, r, -100, eps);
      const std::string what = fmt::format("cross_entropy {} eps {}", name, eps);
      BOOST_TEST((k_dim.shape() == (r == Reduction::None ? t.shape() : Shape{})), what);
      expect_close(k_dim, r == Reduction::None ? rows.reshape(t.shape()) : rows, 1e-12, 1e-12,
                   what);
      k_dim.sum().backward();
      rows.sum().backward();
      expect_close(a.grad(), b.grad(), 1e-12, 1e-14, what + " grad");
    }
    Tensor a = base.detach().clone().requires_grad_(), b = base.detach().clone().requires_grad_();
    const Tensor k_dim = nll_loss(a.permute({0, 3, 1, 2}), t, r);
    const Tensor rows = nll_loss(b.reshape({-1, 40}), rows_t, r);
    expect_close(k_dim, r == Reduction::None ? rows.reshape(t.shape()) : rows, 1e-12, 1e-12,
                 "nll_loss " + name);
    k_dim.sum().backward();
    rows.sum().backward();
    expect_close(a.grad(), b.grad(), 1e-12, 1e-14, "nll_loss grad " + name);
  }
  // (N, C, d) with one position: the method form too.
  const Tensor x = randn({2, 3, 1}, kFloat64);
  BOOST_TEST(x.cross_entropy(targets({2, 0}, {2, 1})).item<double>() ==
             cross_entropy(x.squeeze(2), targets({2, 0})).item<double>());
}

BOOST_AUTO_TEST_CASE(kl_div_zero_targets_gradcheck) {
  manual_seed(5);
  Tensor target = softmax(randn({3, 4}, kFloat64), 1);
  target.narrow(1, 1, 1).fill_(0.0);  // zeros in the target contribute 0
  check_all_reductions("kl", [&](const auto& v, Reduction r) { return kl_div(v[0], target, r); },
                       {leaf({3, 4})});
  // Zero target entries: loss 0 whatever the input.
  const Tensor z = kl_div(full({2}, -1e30, kFloat64), zeros({2}, kFloat64), Reduction::None);
  BOOST_TEST((z.to_vector<double>() == std::vector<double>{0.0, 0.0}));
  BOOST_TEST(std::isnan(kl_div(zeros({1}), full({1}, -0.5), Reduction::Sum).item<double>()));
}

// Double backward where finite differences cannot go: kl_div's zero targets (its target
// gradient 0 there, the log never read at 0, so no NaN in the second derivative) and a mean over
// no target (a zero gradient, as first order gives, not 0 · inf).
BOOST_AUTO_TEST_CASE(double_backward_zero_targets_and_no_targets) {
  manual_seed(7);
  const Tensor x = leaf({3, 4});
  Tensor t0 = softmax(randn({3, 4}, kFloat64), 1);
  t0.narrow(1, 1, 1).fill_(0.0);
  const Tensor t = t0.detach().requires_grad_();
  for (const auto& [name, r] : kReductions) {
    const Tensor loss = kl_div(x, t, r).sum();
    const auto first = autograd::grad({loss}, {x, t}, {}, true);
    const auto in_ops = autograd::grad({loss}, {x, t}, {}, std::nullopt, true);
    expect_close(in_ops[0], first[0], 1e-12, 1e-14, "kl_div dx " + name);
    expect_close(in_ops[1], first[1], 1e-12, 1e-14, "kl_div dt " + name);
    const auto second = autograd::grad({(in_ops[1] * in_ops[1]).sum()}, {x, t});
    for (const Tensor& g : second)
      for (double e : g.to_vector<double>()) BOOST_TEST(std::isfinite(e), name);
    // d(dt)/dt = dL / t where t > 0, 0 at t = 0; d(dt)/dx = -dL.
    BOOST_TEST(second[1].narrow(1, 1, 1).abs().sum().item<double>() == 0.0);
  }
  const Tensor scores = leaf({2, 3});
  for (const auto& f : std::vector<std::function<Tensor(const Tensor&)>>{
           [](const Tensor& v) {
             return nll_loss(v, targets({-100, -100}));
           },
           [](const Tensor& v) {
             return cross_entropy(v, targets({-100, -100}), Mean, -100, 0.1);
           }}) {
    const Tensor dx = autograd::grad({f(scores)}, {scores}, {}, std::nullopt, true)[0];
    BOOST_TEST((dx.to_vector<double>() == std::vector<double>(6, 0.0)));
  }
}

BOOST_AUTO_TEST_CASE(loss_frees_graph) {
  const int64_t nodes = live_nodes(), impls = live_tensor_impls();
  {
    Tensor x = randn({4, 5}, kFloat64).requires_grad_();
    Tensor loss = cross_entropy(x, targets({1, 2, 3, 4}), Reduction::Mean, -100, 0.1) +
                  kl_div(log_softmax(x, 1), softmax(x, 1).detach()) + mse_loss(x, x * 2.0);
    loss.backward();
    BOOST_TEST(x.grad().defined());
  }
  BOOST_TEST(live_nodes() == nodes);
  BOOST_TEST(live_tensor_impls() == impls);
}

BOOST_AUTO_TEST_CASE(errors) {
  const Tensor lp = zeros({3, 5});
  expect_error(
      [&] {
        nll_loss(lp, targets({1, 5, 0}));
      },
      {"nll_loss", "target 5 out of range for 5 classes"});
  expect_error(
      [&] {
        nll_loss(lp, targets({1, -1, 0}));
      },
      {"nll_loss", "target -1 out of range for 5 classes"});
  expect_error([&] { nll_loss(lp, tensor({1, 2, 0})); }, {"nll_loss", "Int64", "Float32"});
  expect_error(
      [&] {
        nll_loss(lp, targets({1, 2}));
      },
      {"nll_loss", "target of shape [2]", "input of shape [3, 5]"});
  expect_error(
      [&] {
        nll_loss(zeros({2, 3, 4}), targets({1, 2}));
      },
      {"nll_loss", "target of shape [2]", "input of shape [2, 3, 4]", "[2, 4]"});
  expect_error(
      [&] {
        cross_entropy(zeros({2, 3, 4, 5}), zeros({2, 5, 4}, kInt64));
      },
      {"cross_entropy", "target of shape [2, 5, 4]", "[2, 3, 4, 5]", "[2, 4, 5]"});
  expect_error(
      [&] {
        cross_entropy(zeros({2, 3, 4}), targets({0, 1, 2, 3, 0, 1, 2, 0}, {2, 4}));
      },
      {"cross_entropy", "target 3 out of range for 3 classes", "[2, 3, 4]"});
  expect_error([&] { nll_loss(scalar_tensor(1.0), target(0)); },
               {"nll_loss", "(N, C, d1, ...)", "[]"});
  expect_error([&] { nll_loss(zeros({3, 5}, kInt64), targets({1, 2, 0})); }, {"nll_loss", "Int64"});
  expect_error(
      [&] {
        cross_entropy(lp, targets({1, 9, 0}));
      },
      {"cross_entropy", "target 9 out of range for 5 classes"});
  expect_error(
      [&] {
        cross_entropy(lp, targets({1, 2, 0}), Reduction::Mean, -100, 1.5);
      },
      {"cross_entropy", "label_smoothing", "1.5"});
  expect_error([&] { cross_entropy(zeros({5}), targets({1})); },
               {"cross_entropy", "target of shape [1]", "input of shape [5]"});
  expect_error([&] { mse_loss(zeros({2, 3}), zeros({4})); }, {"mse_loss", "[2, 3]", "[4]"});
  expect_error([&] { mse_loss(zeros({2}, kInt64), zeros({2})); }, {"mse_loss", "Int64"});
  expect_error([&] { kl_div(zeros({2, 3}), zeros({3, 2})); }, {"kl_div", "[2, 3]", "[3, 2]"});
}

BOOST_AUTO_TEST_SUITE_END()
