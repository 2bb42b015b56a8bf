// The autograd engine: accumulation, grad mode, retain_graph, version counters, anomaly mode,
// freeing of the graph (no cycles, no recursion), leaf hooks and end-of-backward callbacks, and
// its errors.
#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "tests/helpers.h"

using namespace ember;
using namespace ember::testing;

BOOST_AUTO_TEST_SUITE(test_autograd)

BOOST_AUTO_TEST_CASE(chain_rule_and_accumulation) {
  Tensor x = tensor({1, 2, 3}, kFloat64).requires_grad_();
  Tensor y = (x * x * 3.0).sum();  // dy/dx = 6x
  y.backward();
  BOOST_TEST((x.grad().to_vector<double>() == std::vector<double>{6, 12, 18}));
  (x * 2.0).sum().backward();  // gradients accumulate
  BOOST_TEST((x.grad().to_vector<double>() == std::vector<double>{8, 14, 20}));
  BOOST_TEST(x.is_leaf());
  BOOST_TEST(!y.is_leaf());
  BOOST_TEST(!x.grad().requires_grad());
}

BOOST_AUTO_TEST_CASE(diamond_and_explicit_gradient) {
  Tensor x = tensor({2}, kFloat64).requires_grad_();
  Tensor a = x * 3.0, b = x.exp();
  Tensor y = a * b;  // y = 3x e^x, dy/dx = 3 e^x (1 + x)
  y.backward(tensor({0.5}, kFloat64));
  BOOST_TEST(x.grad().item<double>() == 0.5 * 3 * std::exp(2.0) * 3,
             boost::test_tools::tolerance(1e-12));
}

BOOST_AUTO_TEST_CASE(grad_mode) {
  Tensor x = ones({2}).requires_grad_();
  {
    NoGradGuard outer;
    {
      NoGradGuard inner;
      BOOST_TEST(!is_grad_enabled());
    }
    BOOST_TEST(!is_grad_enabled());  // nesting restores the outer state
    Tensor y = x * 2.0;
    BOOST_TEST(!y.requires_grad());
    BOOST_TEST(!y.grad_fn());
    // Grad mode is per thread.
    bool other_thread_enabled = false;
    std::thread([&] { other_thread_enabled = is_grad_enabled(); }).join();
    BOOST_TEST(other_thread_enabled);
  }
  BOOST_TEST(is_grad_enabled());
  BOOST_TEST((x * 2.0).requires_grad());
  // No node for inputs that do not require grad.
  BOOST_TEST(!(ones({2}) * 2.0).grad_fn());
  Tensor d = (x * 2.0).detach();
  BOOST_TEST(!d.requires_grad());
}

BOOST_AUTO_TEST_CASE(retain_graph) {
  Tensor x = tensor({1, 2}, kFloat64).requires_grad_();
  Tensor y = (x * x).sum();
  y.backward({}, true);
  y.backward();  // allowed: the first kept the graph
  BOOST_TEST((x.grad().to_vector<double>() == std::vector<double>{4, 8}));
  expect_error([&] { y.backward(); }, {"backward", "MulBackward", "second time", "retain_graph"});
}

BOOST_AUTO_TEST_CASE(version_counter) {
  Tensor x = tensor({1, 2}, kFloat64).requires_grad_();
  Tensor w = tensor({3, 4}, kFloat64);
  Tensor y = (x * w).sum();  // MulBackward saved w
  w.add_(1.0);
  expect_error([&] { y.backward(); }, {"backward", "MulBackward", "in-place", "[2]"});
  // A view's write bumps the shared storage's version too.
  Tensor e = x.exp();  // saved its output
  Tensor z = e.sum();
  {
    NoGradGuard no_grad;
    e.narrow(0, 0, 1).mul_(2.0);
  }
  expect_error([&] { z.backward(); }, {"ExpBackward", "in-place"});
  // In place on a leaf that requires grad, outside NoGradGuard.
  expect_error([&] { x.zero_(); }, {"zero_", "leaf", "requires grad"});
  expect_error([&] { x.copy_(w); }, {"copy_", "leaf"});
  expect_error([&] { x.masked_fill_(x > 0.0, 0.0); }, {"masked_fill_", "leaf"});
  {
    NoGradGuard no_grad;
    x.fill_(0.0);  // allowed: how optimizers and initialisers write
  }
  BOOST_TEST(x.sum().item<double>() == 0.0);
}

BOOST_AUTO_TEST_CASE(anomaly_mode) {
  Tensor x = tensor({0, 1}, kFloat64).requires_grad_();
  set_detect_anomaly(true);
  expect_error([&] { x.sqrt().sum().backward(); }, {"SqrtBackward", "NaN/Inf"});
  set_detect_anomaly(false);
  x.set_grad({});
  x.sqrt().sum().backward();  // without anomaly mode the Inf just flows
  BOOST_TEST(std::isinf(x.grad().to_vector<double>()[0]));
  // The forward is checked too: the op that made the first NaN is named.
  set_detect_anomaly(true);
  const Tensor w = tensor({-1, 2}, kFloat64).requires_grad_();
  expect_error([&] { (void)(w * 2.0).log(); }, {"log", "NaN/Inf", "[2]", "element 0"});
  set_detect_anomaly(false);
  BOOST_TEST(std::isnan((w * 2.0).log().to_vector<double>()[0]));
}

// Every kind of op checks its forward output, not only the math functions of unary_math:
// binary arithmetic, products through BLAS, fused kernels, reductions, ops of several outputs and
// of a variable number of inputs, and views; each throws naming itself, whether its inputs
// require grad or not.
BOOST_AUTO_TEST_CASE(anomaly_mode_names_every_kind_of_op) {
  const double inf = std::numeric_limits<double>::infinity();
  for (const bool grad : {false, true}) {
    const auto leaf = [&](Tensor t) { return grad ? t.requires_grad_() : t; };
    const Tensor zero = leaf(zeros({2}, kFloat64)), big = leaf(full({2, 2}, 1e200, kFloat64));
    const Tensor huge = leaf(full({2}, 1e308, kFloat64));
    const Tensor with_nan = leaf(tensor({1, std::nan("")}, kFloat64));
    const Tensor infs = leaf(tensor({inf, -inf}, kFloat64));
    const std::vector<std::pair<std::string, std::function<Tensor()>>> cases = {
        {"log", [&] { return log(leaf(tensor({-1.0}, kFloat64))); }},
        {"div", [&] { return zero / zero; }},
        {"mul", [&] { return big * big; }},
        {"matmul", [&] { return matmul(big, big); }},
        {"linear", [&] { return linear(big, big); }},
        {"exp", [&] { return exp(leaf(tensor({1000.0}, kFloat64))); }},
        {"softmax", [&] { return softmax(infs, 0); }},
        {"sum", [&] { return sum(huge); }},
        {"logsumexp", [&] { return logsumexp(infs, {0}); }},
        {"cumsum", [&] { return cumsum(huge, 0); }},
        {"clamp", [&] { return clamp(with_nan, 0.0, 1.0); }},
        {"maximum", [&] { return maximum(with_nan, zero); }},
        {"cat",
         [&] {
           return cat({with_nan, zero}, 0);
         }},
        {"stack",
         [&] {
           return stack({with_nan, zero}, 0);
         }},
        {"max", [&] { return max(with_nan, 0).values; }},
        {"reshape",
         [&] {
           return with_nan.reshape({2, 1});
         }},
    };
    for (const auto& [op, f] : cases) {
      BOOST_TEST_CONTEXT(op << (grad ? " (inputs require grad)" : "")) {
        set_detect_anomaly(true);
        expect_error([&] { (void)f(); }, {op + ":", "NaN/Inf", "anomaly"});
        set_detect_anomaly(false);
        const Tensor out = f();  // without anomaly mode the non-finite values flow on
        BOOST_TEST(sum(out.isfinite()).item<int64_t>() < out.numel());
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(graph_is_freed) {
  const int64_t impls = live_tensor_impls(), nodes = live_nodes();
  {
    manual_seed(0);
    Tensor w = randn({4, 3}).requires_grad_();
    Tensor b = zeros({3}).requires_grad_();
    const Tensor x = randn({8, 4}), target = randn({8, 3});
    for (int step = 0; step < 10; ++step) {
      w.set_grad({});
      b.set_grad({});
      // A small model built from core ops (matmul comes with linalg).
      Tensor h = (x.unsqueeze(2) * w.unsqueeze(0)).sum({1}) + b;
      Tensor loss = ((h.tanh() - target).pow(2)).mean();
      loss.backward();
      NoGradGuard no_grad;
      w.add_(w.grad() * -0.1);
      b.add_(b.grad() * -0.1);
    }
  }
  BOOST_TEST(live_tensor_impls() == impls);
  BOOST_TEST(live_nodes() == nodes);
  // A graph that was never run backward is freed with its output.
  {
    Tensor x = ones({3}).requires_grad_();
    Tensor y = ((x * 2.0).exp() + x).sum();
    BOOST_TEST(live_nodes() > nodes);
  }
  BOOST_TEST(live_nodes() == nodes);
  BOOST_TEST(live_tensor_impls() == impls);
}

BOOST_AUTO_TEST_CASE(deep_graph_without_recursion) {
  const int64_t nodes = live_nodes();
  Tensor x = tensor({1}, kFloat64).requires_grad_();
  {
    Tensor y = x;
    for (int i = 0; i < 100000; ++i) y = y * 1.0;
    y.sum().backward();
    BOOST_TEST(x.grad().item<double>() == 1.0);
    Tensor z = x;
    for (int i = 0; i < 100000; ++i) z = z + 0.0;
  }  // freeing 100k chained Nodes must not overflow the stack
  BOOST_TEST(live_nodes() == nodes);
}

BOOST_AUTO_TEST_CASE(errors) {
  Tensor x = ones({2, 3}).requires_grad_();
  expect_error([&] { (x * 2.0).backward(); }, {"backward", "[2, 3]"});
  expect_error([&] { (x * 2.0).backward(ones({3})); }, {"backward", "[3]", "[2, 3]"});
  expect_error([&] { ones({2}).sum().backward(); }, {"backward", "does not require grad"});
  expect_error([&] { (x * 2.0).requires_grad_(false); }, {"requires_grad_", "non-leaf"});
  expect_error([] { gradcheck([](auto& v) { return v[0] * 2.0; }, {ones({2}).requires_grad_()}); },
               {"gradcheck", "Float32"});
}

// The two points DistributedDataParallel hooks into: a leaf's post-accumulate-grad hook runs
// once per backward, after every contribution is summed into .grad; callbacks queued during a
// backward run after its last Node, before it returns, in order, and may queue more.
BOOST_AUTO_TEST_CASE(post_accumulate_grad_hook_and_queue_callback) {
  Tensor a = tensor({1, 2}, kFloat64).requires_grad_();
  Tensor b = tensor({3, 4}, kFloat64).requires_grad_();
  std::vector<std::string> events;
  set_post_accumulate_grad_hook(a, [&](const Tensor& leaf) {
    BOOST_TEST(leaf.same(a));
    events.push_back(fmt::format("a {}", fmt::join(leaf.grad().to_vector<double>(), " ")));
    if (events.size() == 1)
      queue_callback([&] {
        events.push_back(fmt::format("end, b {}", fmt::join(b.grad().to_vector<double>(), " ")));
        queue_callback([&] { events.push_back("queued by a callback"); });
      });
  });
  ((a * b).sum() + (a * 2.0).sum()).backward();  // two paths into a: its hook sees b + 2
  BOOST_TEST((events == std::vector<std::string>{"a 5 6", "end, b 1 2", "queued by a callback"}));
  (a * 3.0).sum().backward();  // accumulates: the hook sees the sum, b's branch is not run
  BOOST_TEST(events.back() == "a 8 9");
  set_post_accumulate_grad_hook(a, nullptr);
  (a * 3.0).sum().backward();
  BOOST_TEST(events.size() == 4u);
  expect_error([] { queue_callback([] {}); }, {"queue_callback", "outside backward"});
  Tensor c = tensor({1.0});
  expect_error([&] { set_post_accumulate_grad_hook(c, [](const Tensor&) {}); },
               {"set_post_accumulate_grad_hook", "leaf that requires grad"});
}

// Note [Accumulating in place]: gradients meeting at an input are summed in place only into a
// buffer nothing else holds. The caller's grad_outputs, a gradient a Node passes on to two inputs
// (add's), one that is a view of another (reshape's) and a leaf's .grad all keep their values.
BOOST_AUTO_TEST_CASE(accumulating_in_place_touches_no_visible_tensor) {
  const Tensor x = tensor({1.0, 2.0, 3.0, 4.0}).requires_grad_();
  const Tensor y = x * 2.0;
  // y reached twice from the roots: the second seed is added to the first, the caller's
  const Tensor u = tensor({1.0, 1.0, 1.0, 1.0}), w = tensor({10.0, 20.0, 30.0, 40.0});
  const Tensor g = autograd::grad({y, y}, {x}, {u, w})[0];
  expect_close(g, tensor({22.0, 42.0, 62.0, 82.0}), 0, 0, "two seeds");
  expect_close(u, tensor({1.0, 1.0, 1.0, 1.0}), 0, 0, "the first seed unchanged");
  // x + x: AddBackward hands one gradient to both edges; then three uses through views
  const Tensor z = ((x + x) * 1.0 + x.reshape({2, 2}).reshape({4}) + x.view({4})).sum();
  z.backward();
  expect_close(x.grad(), tensor({4.0, 4.0, 4.0, 4.0}), 0, 0, "x + x and two views");
  const Tensor first = x.grad().clone();
  const Tensor held = x.grad();
  (x * x).sum().backward();  // into the leaf's .grad, which `held` sees
  expect_close(held, first + x.detach() * 2.0, 0, 0, "the leaf's gradient accumulates as before");
}

BOOST_AUTO_TEST_CASE(gradcheck_catches_a_wrong_gradient) {
  // A function whose backward is wrong (detach hides part of the dependence) must fail.
  Tensor x = tensor({0.5, 1.5}, kFloat64).requires_grad_();
  const GradcheckResult r = gradcheck([](auto& v) { return v[0] * v[0].detach(); }, {x});
  BOOST_TEST(!r.ok);
  BOOST_TEST(r.message.find("input 0") != std::string::npos);
}

BOOST_AUTO_TEST_SUITE_END()
