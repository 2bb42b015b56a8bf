// Convolutions under bfloat16 products (set_float32_matmul_precision("medium") on a CPU with
// AVX512-BF16): oneDNN's primitives with bfloat16 operands (Note [Convolutions in oneDNN] in
// ops/conv_dnnl.cpp) against the same convolutions on operands rounded to bfloat16 beforehand and
// computed in Float32, against im2col + Ember's bfloat16 products, and against "highest"; the
// Float32 path unchanged by a detour through "medium"; bits independent of the thread count.
// Every case skips where the CPU has no bfloat16 products or Ember was built without oneDNN.
#include <boost/test/unit_test.hpp>

#include <bit>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "ember.h"
#include "ops/conv_dnnl.h"
#include "ops/gemm_bf16.h"
#include "tests/helpers.h"

using namespace ember;
using namespace ember::testing;

namespace {

// "medium" while alive, then "highest" again.
struct MediumPrecision {
  MediumPrecision() { set_float32_matmul_precision("medium"); }
  ~MediumPrecision() { set_float32_matmul_precision("highest"); }
  MediumPrecision(const MediumPrecision&) = delete;
  MediumPrecision& operator=(const MediumPrecision&) = delete;
};

// The oneDNN path off while alive, then on again.
struct Im2col {
  Im2col() { ember::detail::set_conv_uses_onednn(false); }
  ~Im2col() { ember::detail::set_conv_uses_onednn(true); }
  Im2col(const Im2col&) = delete;
  Im2col& operator=(const Im2col&) = delete;
};

// Whether this case cannot run here (and says why).
bool skipped() {
  if (!ember::detail::onednn_built()) {
    BOOST_TEST_MESSAGE("Ember was built without oneDNN: nothing to compare");
    return true;
  }
  if (!ember::detail::cpu_has_bf16_products()) {
    BOOST_TEST_MESSAGE("this CPU has no bfloat16 products: medium computes as highest");
    return true;
  }
  return false;
}

// t (Float32) with every element rounded to bfloat16, to nearest with ties to even, as the
// reorders into oneDNN's layouts and Ember's bfloat16 products round.
Tensor round_bf16(const Tensor& t) {
  std::vector<float> v = t.contiguous().to_vector<float>();
  for (float& f : v) {
    uint32_t u = std::bit_cast<uint32_t>(f);
    u += 0x7fffu + ((u >> 16) & 1u);
    f = std::bit_cast<float>(u & 0xffff0000u);
  }
  return from_vector(v, t.shape());
}

struct Case {
  std::string name;
  std::vector<Shape> shapes;  // the image, the weight, the bias where there is one
  std::function<Tensor(const std::vector<Tensor>&)> f;
};

// clang-format off
const std::vector<Case> kCases = {
    {"conv2d padding", {{4, 8, 10, 10}, {16, 8, 3, 3}, {16}},
     [](auto& v) { return conv2d(v[0], v[1], v[2], {1}, 1); }},
    {"conv2d stride dilation padding", {{3, 6, 13, 11}, {12, 6, 3, 3}, {12}},
     [](auto& v) { return conv2d(v[0], v[1], v[2], {2}, {2, 1}, {2}); }},
    {"conv2d groups", {{2, 8, 9, 9}, {12, 4, 3, 3}},
     [](auto& v) { return conv2d(v[0], v[1], {}, {1}, 0, {1}, 2); }},
    {"conv2d depthwise", {{2, 16, 10, 10}, {16, 1, 3, 3}, {16}},
     [](auto& v) { return conv2d(v[0], v[1], v[2], {1}, 1, {1}, 16); }},
    {"conv2d one input channel", {{4, 1, 12, 12}, {8, 1, 3, 3}, {8}},
     [](auto& v) { return conv2d(v[0], v[1], v[2]); }},
    {"conv2d 1x1 stride", {{4, 16, 8, 8}, {32, 16, 1, 1}},
     [](auto& v) { return conv2d(v[0], v[1], {}, {2}); }},
    {"conv1d", {{4, 8, 40}, {16, 8, 5}, {16}},
     [](auto& v) { return conv1d(v[0], v[1], v[2], {2}, 2); }},
    {"conv_transpose2d", {{2, 16, 7, 7}, {16, 8, 3, 3}, {8}},
     [](auto& v) { return conv_transpose2d(v[0], v[1], v[2], {2}, {1}, {1}); }},
    {"conv_transpose2d groups", {{2, 8, 8, 8}, {8, 6, 3, 3}},
     [](auto& v) { return conv_transpose2d(v[0], v[1], {}, {1}, {1}, {0}, 2); }},
};
// clang-format on

// The value and the gradient of every input for upstream `up`, first order (grad mode off: the
// weight and bias gradients from one call) or with create_graph (each gradient an op).
std::vector<Tensor> results(const Case& c, const std::vector<Tensor>& leaves, const Tensor& up,
                            bool create_graph = false) {
  std::vector<Tensor> in;
  for (const Tensor& t : leaves) in.push_back(t.detach().requires_grad_());
  const Tensor y = c.f(in);
  std::vector<Tensor> out{y.detach()};
  for (const Tensor& g : autograd::grad({y}, in, {up}, true, create_graph))
    out.push_back(g.detach());
  return out;
}

// The same under bfloat16 products ("medium"), "highest" again afterwards.
std::vector<Tensor> results_medium(const Case& c, const std::vector<Tensor>& leaves,
                                   const Tensor& up) {
  MediumPrecision m;
  return results(c, leaves, up);
}

const char* const kNames[] = {"value", "input gradient", "weight gradient", "bias gradient"};

// The largest magnitude of t, at least 1.
double scale_of(const Tensor& t) { return std::max(1.0, t.abs().max().item<double>()); }

struct Operands {
  std::vector<Tensor> leaves;
  Tensor up;
};

Operands operands(const Case& c) {
  Operands o;
  for (const Shape& s : c.shapes) o.leaves.push_back(randn(s));
  o.up = randn(c.f(o.leaves).shape());
  return o;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(test_conv_bf16)

// Under "medium" a Float32 convolution is oneDNN's op, and so are both its gradients.
BOOST_AUTO_TEST_CASE(medium_runs_onednn) {
  if (skipped()) return;
  const Tensor x = randn({2, 3, 6, 6}).requires_grad_(), w = randn({4, 3, 3, 3}).requires_grad_();
  MediumPrecision medium;
  BOOST_TEST_REQUIRE(float32_matmul_uses_bfloat16());
  const Tensor y = conv2d(x, w);
  BOOST_TEST(std::string(y.grad_fn()->name()) == "ConvolutionBackward");
  const auto g = autograd::grad({y}, {x, w}, {ones_like(y)}, true, true);
  BOOST_TEST(std::string(g[0].grad_fn()->name()) == "ConvolutionInputBackward");
  BOOST_TEST(std::string(g[1].grad_fn()->name()) == "ConvolutionWeightBackward");
}

// oneDNN's bfloat16 results equal, up to the order of Float32 sums (1e-5 of the result's scale,
// where a missing or wrong rounding would be 1e-3 or more), the Float32 convolution of the
// multiplied operands rounded to bfloat16 beforehand: the value conv(r(x), r(w)) + b, the input
// gradient conv_input(r(dY), r(w)), the weight gradient conv_weight(r(x), r(dY)); the bias
// gradient Σ dY unrounded (up to the order of its sum). First order and with create_graph.
BOOST_AUTO_TEST_CASE(onednn_bf16_is_rounded_operands_in_float32) {
  if (skipped()) return;
  manual_seed(1);
  for (const Case& c : kCases) {
    const Operands o = operands(c);
    // the reference: "highest" on the rounded operands (the bias is not a product's operand)
    std::vector<Tensor> rounded;
    for (size_t i = 0; i < o.leaves.size(); ++i)
      rounded.push_back(i < 2 ? round_bf16(o.leaves[i]) : o.leaves[i]);
    std::vector<Tensor> want = results(c, rounded, round_bf16(o.up));
    if (want.size() > 3) want[3] = results(c, o.leaves, o.up)[3];
    for (const bool create_graph : {false, true}) {
      std::vector<Tensor> got;
      {
        MediumPrecision medium;
        got = results(c, o.leaves, o.up, create_graph);
      }
      for (size_t i = 0; i < want.size(); ++i) {
        const std::string what =
            fmt::format("{} {}{}", c.name, kNames[i], create_graph ? " (create_graph)" : "");
        expect_close(got[i], want[i], 0, 1e-5 * scale_of(want[i]), what);
      }
    }
  }
}

// oneDNN's bfloat16 results against im2col + Ember's bfloat16 products under "medium": both
// round the multiplied operands to bfloat16 and sum in Float32. im2col keeps Float32 where its
// products are tiny, matrix-vector or narrow (ops/linalg.h), as a depthwise convolution's (one
// output channel per group): that one agrees within bfloat16's rounding alone.
BOOST_AUTO_TEST_CASE(onednn_bf16_agrees_with_im2col_bf16) {
  if (skipped()) return;
  manual_seed(2);
  for (const Case& c : kCases) {
    const Operands o = operands(c);
    std::vector<Tensor> onednn, im2col;
    {
      MediumPrecision medium;
      onednn = results(c, o.leaves, o.up);
      Im2col path;
      im2col = results(c, o.leaves, o.up);
    }
    const bool float32_products = c.name == "conv2d depthwise";
    for (size_t i = 0; i < onednn.size(); ++i) {
      const double tol = float32_products ? 2e-2 : 1e-5;
      expect_close(onednn[i], im2col[i], 0, tol * scale_of(im2col[i]),
                   fmt::format("{} {}", c.name, kNames[i]));
    }
  }
}

// Against "highest" (Float32 products) within bfloat16's rounding of the operands.
BOOST_AUTO_TEST_CASE(onednn_bf16_near_highest) {
  if (skipped()) return;
  manual_seed(3);
  for (const Case& c : kCases) {
    const Operands o = operands(c);
    const std::vector<Tensor> highest = results(c, o.leaves, o.up);
    const std::vector<Tensor> medium = results_medium(c, o.leaves, o.up);
    for (size_t i = 0; i < medium.size(); ++i)
      expect_close(medium[i], highest[i], 2e-2, 2e-2 * scale_of(highest[i]),
                   fmt::format("{} {}", c.name, kNames[i]));
  }
}

// "highest" stays Float32 oneDNN: the same bits before and after a detour through "medium" (whose
// primitives are cached apart, by data type), and results "medium" does not give.
BOOST_AUTO_TEST_CASE(highest_unchanged) {
  if (skipped()) return;
  manual_seed(4);
  for (const Case& c : kCases) {
    const Operands o = operands(c);
    const std::vector<Tensor> before = results(c, o.leaves, o.up);
    const std::vector<Tensor> medium = results_medium(c, o.leaves, o.up);
    const std::vector<Tensor> after = results(c, o.leaves, o.up);
    std::vector<Tensor> im2col;
    {
      Im2col path;
      im2col = results(c, o.leaves, o.up);
    }
    for (size_t i = 0; i < before.size(); ++i) {
      const std::string what = fmt::format("{} {}", c.name, kNames[i]);
      expect_close(after[i], before[i], 0, 0, what + " (highest again)");
      expect_close(before[i], im2col[i], 1e-5, 2e-6 * scale_of(im2col[i]), what + " (im2col)");
      if (i < 3)  // the bias gradient is no product: the same in both
        BOOST_TEST((medium[i] - before[i]).abs().max().item<double>() > 1e-4 * scale_of(before[i]),
                   what << ": medium rounds nothing");
    }
  }
}

// Under "medium" as under "highest", the bits do not depend on Ember's thread count (the
// weight gradient in pieces of the batch, Note [Weight gradients in pieces]).
BOOST_AUTO_TEST_CASE(bf16_threads) {
  if (skipped()) return;
  manual_seed(5);
  const int before = get_num_threads();
  for (const Case& c : kCases) {
    const Operands o = operands(c);
    MediumPrecision medium;
    set_num_threads(1);
    const std::vector<Tensor> one = results(c, o.leaves, o.up);
    set_num_threads(2);
    const std::vector<Tensor> two = results(c, o.leaves, o.up);
    set_num_threads(before);
    for (size_t i = 0; i < one.size(); ++i)
      expect_close(two[i], one[i], 0, 0, fmt::format("{} {} (2 threads)", c.name, kNames[i]));
  }
}

BOOST_AUTO_TEST_SUITE_END()
