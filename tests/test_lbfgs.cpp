// optim::LBFGS against torch.optim.LBFGS (golden/lbfgs.json, written by golden/lbfgs.py): the
// iterates, losses and evaluation counts of every step(closure) call on Rosenbrock and on a
// least-squares fit, with and without the strong Wolfe line search; the state dict against
// torch's and resuming from it; Float32; bad options and bad closures.
#include <cmath>
#include <functional>
#include <map>

#include "helpers.h"

using namespace ember;
using namespace ember::testing;
using optim::LBFGS;
using optim::LBFGSOptions;

namespace {

// A golden case: its options (as lbfgs.py's CASES), number of step() calls and loss, and how
// close the Float64 iterates (rtol) and the state dict after kResumeAfter calls (state_rtol) come
// to torch's. The evaluation counts match exactly everywhere, and the least-squares fit to the
// last bit or two. On Rosenbrock's curved valley a last-bit difference (torch's dot products are
// OpenBLAS's, ours a plain loop with FMA) grows through the curvature pairs: by ~10x a call with
// the line search, and near the minimum y·s ~ 1e-9 leaves 1 / y·s with ~4 digits: in the
// sanitizer build (-O1, other contractions) rosen_wolfe_long's ro differs from torch's by 1.03e-3
// relative, so its state is compared to 1e-2 (its iterates and losses still to 1e-7).
struct Case {
  LBFGSOptions options;
  int calls;
  std::function<Tensor(const std::vector<Tensor>&)> loss;
  double rtol, state_rtol;
};

// (1 - x0)² + 100 (x1 - x0²)², with torch's ops in torch's order: a product x0 · x0 instead of
// pow would sum x0's gradient in another order, and near the minimum L-BFGS's curvature pairs
// magnify that last bit.
Tensor rosenbrock(const std::vector<Tensor>& p) {
  const Tensor x0 = p[0].select(0, 0), x1 = p[0].select(0, 1);
  return pow(1.0 - x0, 2) + 100.0 * pow(x1 - pow(x0, 2), 2);
}

// mean((x wᵀ + b - y)²) on lbfgs.py's fixed data, in the parameters' dtype.
Tensor least_squares(const std::vector<Tensor>& p) {
  static const Golden golden("lbfgs.json");
  const Tensor x = golden["regression.x"].to(p[0].dtype());
  const Tensor y = golden["regression.y"].to(p[0].dtype());
  const Tensor r = matmul(x, p[0].transpose(0, 1)) + p[1] - y;
  return (r * r).mean();
}

const std::map<std::string, Case>& cases() {
  static const std::map<std::string, Case> table = {
      {"rosen", {{.lr = 1, .max_iter = 5, .history_size = 3}, 6, rosenbrock, 1e-10, 1e-10}},
      {"rosen_wolfe",
       {{.lr = 1, .max_iter = 5, .history_size = 3, .line_search_fn = "strong_wolfe"},
        8,
        rosenbrock,
        1e-6,
        1e-8}},
      {"rosen_wolfe_long",
       {{.history_size = 3, .line_search_fn = "strong_wolfe"}, 3, rosenbrock, 1e-7, 1e-2}},
      {"regression",
       {{.lr = 1, .max_iter = 20, .history_size = 4, .line_search_fn = "strong_wolfe"},
        3,
        least_squares,
        1e-12,
        1e-10}},
  };
  return table;
}

constexpr int kResumeAfter = 3;  // lbfgs.py's RESUME_AFTER

std::vector<Tensor> initial_params(const std::string& name, DType dtype) {
  const Golden golden("lbfgs.json");
  std::vector<Tensor> params;
  for (int i = 0; golden.contains(fmt::format("{}.p{}.init", name, i)); ++i)
    params.push_back(golden[fmt::format("{}.p{}.init", name, i)].to(dtype).requires_grad_());
  return params;
}

std::function<Tensor()> closure_for(const Case& c, const std::vector<Tensor>& params,
                                    optim::Optimizer& opt) {
  return [&c, params, &opt] {
    opt.zero_grad();
    Tensor loss = c.loss(params);
    loss.backward();
    return loss;
  };
}

// Replays a golden case in `dtype`, checking every call's parameters, returned loss and
// counters. With resume_at = k the optimizer is replaced before call k by a new one with default
// options, on copies of the parameters, that loads the old one's state dict.
void replay(const std::string& name, DType dtype, double rtol, int resume_at = -1) {
  const Golden golden("lbfgs.json");
  const Case& c = cases().at(name);
  std::vector<Tensor> params = initial_params(name, dtype);
  auto opt = std::make_unique<LBFGS>(params, c.options);
  for (int k = 0; k < c.calls; ++k) {
    const std::string what =
        fmt::format("{} {} call {} (resumed at {})", name, dtype, k, resume_at);
    if (k == resume_at) {
      const optim::StateDict state = opt->state_dict();
      for (Tensor& p : params) p = p.detach().clone().requires_grad_();
      opt = std::make_unique<LBFGS>(params);
      opt->load_state_dict(state);
    }
    const Tensor loss = opt->step(closure_for(c, params, *opt));
    expect_close(loss, golden[fmt::format("{}.loss{}", name, k)].to(dtype), rtol, 1e-14, what);
    if (dtype == kFloat64) {
      BOOST_TEST(
          opt->func_evals() == golden[fmt::format("{}.func_evals{}", name, k)].item<int64_t>(),
          what);
      BOOST_TEST(opt->n_iter() == golden[fmt::format("{}.n_iter{}", name, k)].item<int64_t>(),
                 what);
    }
    for (size_t i = 0; i < params.size(); ++i)
      expect_close(params[i], golden[fmt::format("{}.p{}.after{}", name, i, k)], rtol, 1e-12,
                   fmt::format("{} p{}", what, i));
  }
}

// 1, …, 1000 at even logarithmic steps, over 8 elements: the quadratic's curvatures.
Tensor logspace_like_weights() {
  std::vector<double> a;
  for (int i = 0; i < 8; ++i) a.push_back(std::pow(1000.0, i / 7.0));
  return from_vector(a, {8}, kFloat64);
}

}  // namespace

BOOST_AUTO_TEST_SUITE(test_lbfgs)

BOOST_AUTO_TEST_CASE(iterates_match_pytorch_float64) {
  for (const auto& [name, c] : cases()) replay(name, kFloat64, c.rtol);
}

BOOST_AUTO_TEST_CASE(state_dict_matches_pytorch) {
  // After kResumeAfter calls: torch's entries (lbfgs.py flattens its lists with Ember's names),
  // the same dtypes and values.
  const Golden golden("lbfgs.json");
  for (const auto& [name, c] : cases()) {
    std::vector<Tensor> params = initial_params(name, kFloat64);
    LBFGS opt(params, c.options);
    for (int k = 0; k < kResumeAfter; ++k) opt.step(closure_for(c, params, opt));
    expect_torch_state_dict(golden, fmt::format("{}.state_dict{}.", name, kResumeAfter),
                            opt.state_dict(), c.state_rtol, name);
  }
}

BOOST_AUTO_TEST_CASE(resume_from_state_dict_continues_identically) {
  // The new optimizer has default options: loading restores the saved ones too.
  for (const auto& [name, c] : cases())
    if (c.calls > kResumeAfter) replay(name, kFloat64, c.rtol, kResumeAfter);
  // And through a file: every entry survives safetensors.
  const Case& c = cases().at("rosen_wolfe");
  std::vector<Tensor> params = initial_params("rosen_wolfe", kFloat64);
  LBFGS opt(params, c.options);
  for (int k = 0; k < 2; ++k) opt.step(closure_for(c, params, opt));
  std::vector<Tensor> copies;
  for (const Tensor& p : params) copies.push_back(p.detach().clone().requires_grad_());
  LBFGS resumed(copies);
  resumed.load_state_dict(opt.state_dict());
  BOOST_TEST(resumed.options().history_size == 3);
  BOOST_TEST(resumed.options().max_eval.value() == 6);
  BOOST_TEST(resumed.options().line_search_fn.value() == "strong_wolfe");
  for (int k = 2; k < c.calls; ++k) {
    opt.step(closure_for(c, params, opt));
    resumed.step(closure_for(c, copies, resumed));
    BOOST_TEST((params[0].to_vector<double>() == copies[0].to_vector<double>()), "call " << k);
  }
  BOOST_TEST(resumed.func_evals() == opt.func_evals());
}

BOOST_AUTO_TEST_CASE(float32_follows_float64) {
  // The same algorithm in Float32 (vectors, dot products and history in Float32): the converging
  // least-squares fit lands on torch's Float64 answer to Float32 precision, and the state is
  // Float32 where torch's would be.
  replay("regression", kFloat32, 1e-4);
  const Case& c = cases().at("rosen_wolfe");
  std::vector<Tensor> params = initial_params("rosen_wolfe", kFloat32);
  LBFGS opt(params, c.options);
  const Tensor loss = opt.step(closure_for(c, params, opt));
  BOOST_TEST(loss.dtype() == kFloat32);
  for (const auto& [key, t] : opt.state_dict()) {
    const bool float32 = key == "state.0.d" || key == "state.0.H_diag" ||
                         key.starts_with("state.0.old_") || key.starts_with("state.0.ro.") ||
                         key == "state.0.prev_flat_grad";
    if (float32) BOOST_TEST(t.dtype() == kFloat32, key);
  }
  for (const double v : params[0].to_vector<double>()) BOOST_TEST(std::isfinite(v));
}

BOOST_AUTO_TEST_CASE(float32_ignores_matmul_precision) {
  // L-BFGS's own arithmetic (dot products, directions) is not a matrix product: "medium" matmul
  // precision, which rounds Float32 products' operands to bfloat16, leaves its iterates on a
  // loss with no product (Σ w (p - c)², 70,000 parameters: a dot product that long is a BLAS
  // product on the CPU, always one on a GPU) exactly as at "highest" (a check where the CPU has
  // bfloat16 products; elsewhere "medium" changes nothing anyway).
  manual_seed(3);
  const Tensor w = rand({70000}) + 0.5, c = randn({70000}), p0 = randn({70000});
  const auto run = [&](const std::string& precision) {
    set_float32_matmul_precision(precision);
    const Tensor p = p0.clone().requires_grad_();
    LBFGS opt({p}, {.history_size = 5, .line_search_fn = "strong_wolfe"});
    opt.step([&] {
      opt.zero_grad();
      Tensor loss = (w * (p - c) * (p - c)).sum();
      loss.backward();
      return loss;
    });
    set_float32_matmul_precision("highest");
    return p.detach();
  };
  const Tensor highest = run("highest"), medium = run("medium");
  expect_close(medium, highest, 0, 0, "the iterates at medium and highest precision");
}

BOOST_AUTO_TEST_CASE(converged_returns_after_one_evaluation) {
  // A zero gradient meets tolerance_grad at once: one evaluation, no iteration, no move; the
  // state holds the counters only (as torch's).
  Tensor w = from_vector(std::vector<double>{1, 2}, {2}, kFloat64).requires_grad_();
  LBFGS opt({w});
  int calls = 0;
  const Tensor loss = opt.step([&] {
    ++calls;
    opt.zero_grad();
    Tensor l = (w * 0.0).sum() + 3.0;
    l.backward();
    return l;
  });
  BOOST_TEST(loss.item<double>() == 3.0);
  BOOST_TEST(calls == 1);
  BOOST_TEST(opt.func_evals() == 1);
  BOOST_TEST(opt.n_iter() == 0);
  BOOST_TEST((w.to_vector<double>() == std::vector<double>{1, 2}));
  std::vector<std::string> names;
  for (const auto& [name, t] : opt.state_dict()) names.push_back(name);
  BOOST_TEST(names.size() == 10u);  // 2 counters, 8 group entries
  BOOST_TEST(names[0] == "state.0.func_evals");
  BOOST_TEST(names[1] == "state.0.n_iter");
  LBFGS other({w.detach().clone().requires_grad_()});
  other.load_state_dict(opt.state_dict());
  BOOST_TEST(other.func_evals() == 1);
}

// An ill-conditioned quadratic, sum_i a_i (x_i - 1)² with a from 1 to 1000, at two scales: as it
// is, and times 1e-12, where y·s falls below torch's fixed 1e-10, as a PINN's loss near 1e-6 does.
BOOST_AUTO_TEST_CASE(curvature_eps_keeps_a_tiny_loss_learning) {
  const auto run = [](double scale, double curvature_eps) {
    const Tensor a = logspace_like_weights();
    Tensor x = zeros({8}, kFloat64).requires_grad_();
    LBFGS opt({x}, {.max_iter = 40,
                    .tolerance_grad = 0,
                    .tolerance_change = 0,
                    .line_search_fn = "strong_wolfe",
                    .curvature_eps = curvature_eps});
    opt.step([&] {
      opt.zero_grad();
      Tensor loss = (a * pow(x - 1.0, 2)).sum() * scale;
      loss.backward();
      return loss;
    });
    // the pairs kept: the history's length in the state dict
    int64_t pairs = 0;
    for (const auto& [name, t] : opt.state_dict()) pairs += name.starts_with("state.0.ro.");
    return std::pair{x.detach(), pairs};
  };
  const auto [plain, plain_pairs] = run(1, 1e-10);
  const auto [tiny_torch, tiny_torch_pairs] = run(1e-12, 1e-10);
  const auto [tiny, tiny_pairs] = run(1e-12, 0);
  // Unscaled, torch's threshold keeps pairs and L-BFGS reaches the minimum x = 1.
  BOOST_TEST(plain_pairs > 0);
  expect_close(plain, ones({8}, kFloat64), 0, 1e-8, "unscaled");
  const auto error = [](const Tensor& x) { return (x - 1.0).abs().max().item<double>(); };
  // Unscaled, torch's threshold keeps the pairs and L-BFGS reaches the minimum x = 1 ...
  BOOST_TEST(plain_pairs > 10);
  BOOST_TEST(error(plain) < 1e-8);
  // ... but at 1e-12 it keeps almost none (only where the line search stretched a step), and
  // L-BFGS is left far from the minimum (here ~0.9 off) ...
  BOOST_TEST(tiny_torch_pairs < 5);
  BOOST_TEST(error(tiny_torch) > 0.1);
  // ... where curvature_eps = 0 keeps learning the curvature and reaches it too.
  BOOST_TEST(tiny_pairs > 10);
  BOOST_TEST(error(tiny) < 1e-8);
  // A state dict holds no curvature_eps (torch's has none): loading keeps the optimizer's own.
  Tensor w = zeros({2}, kFloat64).requires_grad_();
  LBFGS with_zero({w}, {.curvature_eps = 0});
  with_zero.load_state_dict(LBFGS({w}).state_dict());
  BOOST_TEST(with_zero.options().curvature_eps == 0.0);
}

BOOST_AUTO_TEST_CASE(closure_runs_with_grad_enabled) {
  // As torch's: step under no_grad still records the closure's graph.
  const Case& c = cases().at("rosen");
  std::vector<Tensor> params = initial_params("rosen", kFloat64);
  LBFGS opt(params, c.options);
  NoGradGuard no_grad;
  opt.step(closure_for(c, params, opt));
  expect_close(params[0], Golden("lbfgs.json")["rosen.p0.after0"], 1e-10, 1e-12);
  BOOST_TEST(!is_grad_enabled());
}

BOOST_AUTO_TEST_CASE(non_contiguous_parameter) {
  // A transposed leaf is updated through its strides: the same iterates as the contiguous one.
  const Case& c = cases().at("regression");
  std::vector<Tensor> params = initial_params("regression", kFloat64);
  Tensor base = params[0].detach().transpose(0, 1).contiguous();  // (3, 1)
  Tensor w = base.transpose(0, 1).requires_grad_();               // (1, 3), strides (1, 1)
  std::vector<Tensor> strided{w, params[1]};
  LBFGS opt(strided, c.options);
  opt.step(closure_for(c, strided, opt));
  const Golden golden("lbfgs.json");
  expect_close(w, golden["regression.p0.after0"], 1e-10, 1e-12);
  expect_close(params[1], golden["regression.p1.after0"], 1e-10, 1e-12);
}

BOOST_AUTO_TEST_CASE(bad_options_and_parameters) {
  Tensor w = zeros({3}, kFloat64).requires_grad_();
  expect_error([&] { LBFGS({w}, {.lr = 0}); }, {"LBFGS:", "lr 0"});
  expect_error([&] { LBFGS({w}, {.lr = -1}); }, {"LBFGS:", "-1"});
  expect_error([&] { LBFGS({w}, {.max_iter = 0}); }, {"LBFGS:", "max_iter 0"});
  expect_error([&] { LBFGS({w}, {.max_eval = 0}); }, {"LBFGS:", "max_eval 0"});
  expect_error([&] { LBFGS({w}, {.history_size = 0}); }, {"LBFGS:", "history_size 0"});
  expect_error([&] { LBFGS({w}, {.tolerance_grad = -1}); }, {"LBFGS:", "tolerance_grad -1"});
  expect_error([&] { LBFGS({w}, {.curvature_eps = -1}); }, {"LBFGS:", "curvature_eps -1"});
  expect_error([&] { LBFGS({w}, {.curvature_eps = NAN}); }, {"LBFGS:", "curvature_eps nan"});
  expect_error([&] { LBFGS({w}, {.line_search_fn = "backtracking"}); },
               {"LBFGS:", "line_search_fn 'backtracking'"});
  Tensor v = zeros({2}, kFloat64).requires_grad_();
  expect_error(
      [&] {
        LBFGS(std::vector<optim::ParamGroup<LBFGSOptions>>{{{w}, {}}, {{v}, {}}});
      },
      {"LBFGS:", "one parameter group", "got 2"});
  expect_error(
      [&] {
        LBFGS({w, zeros({2}, kFloat64)});
      },
      {"LBFGS:", "parameter 1", "does not require grad"});
  expect_error(
      [&] {
        LBFGS({w, zeros({2}, kFloat32).requires_grad_()});
      },
      {"LBFGS:", "Float32", "one dtype"});
  // the default max_eval is torch's max_iter * 5 / 4
  BOOST_TEST(LBFGS({w}, {.max_iter = 7}).options().max_eval.value() == 8);
}

BOOST_AUTO_TEST_CASE(bad_closures) {
  Tensor w = ones({3}, kFloat64).requires_grad_();
  LBFGS opt({w});
  expect_error([&] { opt.step(); }, {"LBFGS:", "closure"});
  expect_error([&] { opt.step(std::function<Tensor()>()); }, {"LBFGS:", "empty closure"});
  expect_error([&] { opt.step([] { return Tensor(); }); }, {"LBFGS:", "undefined"});
  expect_error(
      [&] {
        opt.step([&] {
          opt.zero_grad();
          Tensor l = w * w;
          l.sum().backward();
          return l;
        });
      },
      {"LBFGS:", "shape [3]", "not a scalar"});
  BOOST_TEST(opt.func_evals() == 0);  // a failed step changes no state
}

BOOST_AUTO_TEST_CASE(bad_state_dicts) {
  const Case& c = cases().at("rosen_wolfe");
  std::vector<Tensor> params = initial_params("rosen_wolfe", kFloat64);
  LBFGS opt(params, c.options);
  for (int k = 0; k < kResumeAfter; ++k) opt.step(closure_for(c, params, opt));
  const optim::StateDict good = opt.state_dict();  // a history of 3 pairs
  const auto with = [&](const std::string& name, const Tensor& value) {
    optim::StateDict s;
    for (const auto& [key, t] : good)
      if (key != name) s.emplace_back(key, t);
    if (value.defined()) s.emplace_back(name, value);
    return s;
  };
  LBFGS other({zeros({2}, kFloat64).requires_grad_()});
  expect_error(
      [&] { other.load_state_dict(with("param_groups.0.history_size", optim::state_integer(2))); },
      {"LBFGS::load_state_dict", "3 pairs", "history_size 2"});
  expect_error([&] { other.load_state_dict(with("state.0.old_stps.1", Tensor())); },
               {"LBFGS::load_state_dict", "missing state.0.old_stps.1"});
  expect_error([&] { other.load_state_dict(with("state.0.d", zeros({3}, kFloat64))); },
               {"LBFGS::load_state_dict", "'state.0.d'", "shape [3]"});
  expect_error([&] { other.load_state_dict(with("state.0.old_dirs.3", zeros({2}, kFloat64))); },
               {"LBFGS::load_state_dict", "history_size 3"});
  expect_error([&] { other.load_state_dict(with("param_groups.0.lr", optim::state_number(0))); },
               {"LBFGS::load_state_dict", "lr 0"});
  // Nothing was applied by the failed loads.
  BOOST_TEST(other.func_evals() == 0);
  BOOST_TEST(other.options().history_size == 100);
  // A Float32 optimizer refuses Float64 state.
  LBFGS float32({zeros({2}, kFloat32).requires_grad_()});
  expect_error([&] { float32.load_state_dict(good); }, {"LBFGS::load_state_dict", "Float32"});
}

BOOST_AUTO_TEST_SUITE_END()
