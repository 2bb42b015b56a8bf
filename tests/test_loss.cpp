// Losses: PyTorch golden values for every reduction, gradcheck for every reduction (ignored
// targets, label smoothing, broadcast and non-contiguous inputs), Float32 against Float64,
// consistency between the fused and composed forms, and every error message.
#include <boost/test/unit_test.hpp>

#include "ember.h"
#include "helpers.h"

using namespace ember;
using namespace ember::testing;

namespace {

const std::vector<std::pair<std::string, Reduction>> kReductions = {
    {"none", Reduction::None}, {"mean", Reduction::Mean}, {"sum", Reduction::Sum}};

Tensor targets(std::vector<int64_t> v) {
  const int64_t n = static_cast<int64_t>(v.size());
  return from_vector(std::move(v), {n});
}

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

BOOST_AUTO_TEST_CASE(golden_values) {
  Golden g("ops.json");
  for (const auto& [name, r] : kReductions) {
    expect_close(mse_loss(g["mse_a"], g["mse_t"], r), g["mse_" + name], 1e-12, 1e-12, "mse");
    expect_close(mse_loss(g["mse_a"], g["mse_tb"], r), g["mse_bcast_" + name], 1e-12, 1e-12,
                 "mse broadcast");
    expect_close(nll_loss(g["nll_lp"], g["nll_t"], r), g["nll_" + name], 1e-12, 1e-12, "nll");
    expect_close(cross_entropy(g["ce_x"], g["ce_t"], r), g["ce_" + name], 1e-12, 1e-12, "ce");
    expect_close(cross_entropy(g["ce_x"], g["ce_t"], r, 2, 0.1), g["ce_ls_" + name], 1e-12, 1e-12,
                 "ce smoothed");
    expect_close(kl_div(g["kl_lp"], g["kl_t"], r), g["kl_" + name], 1e-12, 1e-12, "kl");
  }
  expect_close(nll_loss(g["nll1_lp"], from_vector(std::vector<int64_t>{4}, {}), Reduction::Sum),
               g["nll1_sum"], 1e-12, 1e-12, "nll 1-D");
  expect_close(cross_entropy(g["ce1_x"], g["ce1_t"], Reduction::Mean, -100, 0.2), g["ce1_ls_mean"],
               1e-12, 1e-12, "ce 1-D");
}

BOOST_AUTO_TEST_CASE(golden_gradients) {
  Golden g("ops.json");
  const auto grad = [](const Tensor& x, const std::function<Tensor(const Tensor&)>& f,
                       const Tensor& up = {}) {
    Tensor l = x.detach().clone().requires_grad_();
    f(l).backward(up);
    return l.grad();
  };
  expect_close(grad(g["mse_a"], [&](const Tensor& a) { return mse_loss(a, g["mse_t"]); }),
               g["mse_grad_mean"], 1e-12, 1e-12, "mse");
  expect_close(grad(g["nll_lp"], [&](const Tensor& a) { return nll_loss(a, g["nll_t"]); }),
               g["nll_grad_mean"], 1e-12, 1e-12, "nll");
  expect_close(
      grad(g["ce_x"],
           [&](const Tensor& a) { return cross_entropy(a, g["ce_t"], Reduction::Mean, 2, 0.1); }),
      g["ce_ls_grad_mean"], 1e-10, 1e-12, "ce mean");
  expect_close(
      grad(
          g["ce_x"],
          [&](const Tensor& a) { return cross_entropy(a, g["ce_t"], Reduction::None, 2, 0.1); },
          g["ce_up"]),
      g["ce_ls_grad_none"], 1e-10, 1e-12, "ce none");
  expect_close(
      grad(g["kl_lp"], [&](const Tensor& a) { return kl_div(a, g["kl_t"], Reduction::Sum); }),
      g["kl_grad_sum"], 1e-12, 1e-12, "kl");
}

BOOST_AUTO_TEST_CASE(mse_loss_gradcheck) {
  manual_seed(1);
  const auto f = [](const std::vector<Tensor>& v, Reduction r) { return mse_loss(v[0], v[1], r); };
  check_all_reductions("mse", f, {leaf({3, 4}), leaf({3, 4})});
  check_all_reductions("mse broadcast target", f, {leaf({3, 4}), leaf({4})});
  check_all_reductions("mse size-1 dims", f, {leaf({1, 4}), leaf({3, 1})});
  check_all_reductions("mse transposed",
                       [](const std::vector<Tensor>& v, Reduction r) {
                         return mse_loss(v[0].transpose(0, 1), v[1], r);
                       },
                       {leaf({4, 3}), leaf({3, 4})});
  check_all_reductions("mse 0-d", f, {leaf({}), leaf({})});
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

BOOST_AUTO_TEST_CASE(nll_loss_gradcheck) {
  manual_seed(2);
  const Tensor t = targets({1, 0, -100, 3, 1});
  check_all_reductions("nll", [&](const auto& v, Reduction r) { return nll_loss(v[0], t, r); },
                       {leaf({5, 4})});
  const Tensor t2 = targets({2, 7, 2});  // ignore_index 7
  check_all_reductions(
      "nll ignore_index transposed",
      [&](const auto& v, Reduction r) { return nll_loss(v[0].transpose(0, 1), t2, r, 7); },
      {leaf({4, 3})});
  const Tensor t0 = from_vector(std::vector<int64_t>{2}, {});
  check_all_reductions("nll 1-D", [&](const auto& v, Reduction r) { return nll_loss(v[0], t0, r); },
                       {leaf({4})});
  // Every target ignored: the mean is 0 / 0, as torch.
  const Tensor all = targets({-100, -100});
  BOOST_TEST(std::isnan(nll_loss(zeros({2, 3}), all).item<double>()));
  BOOST_TEST(nll_loss(zeros({2, 3}), all, Reduction::Sum).item<double>() == 0.0);
}

BOOST_AUTO_TEST_CASE(cross_entropy_gradcheck) {
  manual_seed(3);
  const Tensor t = targets({0, 4, 2, 1, 3, 2});
  for (double eps : {0.0, 0.1, 1.0}) {
    check_all_reductions(
        fmt::format("ce smoothing {}", eps),
        [&](const auto& v, Reduction r) { return cross_entropy(v[0], t, r, 2, eps); },
        {leaf({6, 5}, 2.0)});
  }
  check_all_reductions("ce transposed logits",
                       [&](const auto& v, Reduction r) {
                         return cross_entropy(v[0].transpose(0, 1), t, r, -100, 0.1);
                       },
                       {leaf({5, 6})});
  check_all_reductions(
      "ce narrowed logits",
      [&](const auto& v, Reduction r) { return cross_entropy(v[0].narrow(1, 1, 5), t, r); },
      {leaf({6, 7})});
  const Tensor t0 = from_vector(std::vector<int64_t>{1}, {});
  check_all_reductions(
      "ce 1-D", [&](const auto& v, Reduction r) { return cross_entropy(v[0], t0, r, -100, 0.2); },
      {leaf({3})});
  check_all_reductions("ce one class",
                       [&](const auto& v, Reduction r) {
                         return cross_entropy(v[0], targets({0, 0}), r);
                       },
                       {leaf({2, 1})});
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

BOOST_AUTO_TEST_CASE(kl_div_gradcheck) {
  manual_seed(5);
  Tensor target = softmax(randn({3, 4}, kFloat64), 1);
  target.narrow(1, 1, 1).fill_(0.0);  // zeros in the target contribute 0
  check_all_reductions("kl", [&](const auto& v, Reduction r) { return kl_div(v[0], target, r); },
                       {leaf({3, 4})});
  // Differentiable in a positive target too, and broadcasting.
  check_all_reductions(
      "kl both", [](const auto& v, Reduction r) { return kl_div(v[0], softmax(v[1], -1), r); },
      {leaf({3, 4}), leaf({4})});
  // Zero target entries: loss 0 whatever the input.
  const Tensor z = kl_div(full({2}, -1e30, kFloat64), zeros({2}, kFloat64), Reduction::None);
  BOOST_TEST((z.to_vector<double>() == std::vector<double>{0.0, 0.0}));
  BOOST_TEST(std::isnan(kl_div(zeros({1}), full({1}, -0.5), Reduction::Sum).item<double>()));
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
      {"nll_loss", "(N, C) or (C)", "[2, 3, 4]"});
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
  expect_error([&] { kl_div(zeros({2}), Tensor()); }, {"kl_div", "undefined"});
}

BOOST_AUTO_TEST_SUITE_END()
