// conv1d, conv2d, conv_transpose1d and conv_transpose2d: one table of cases (tests/op_table.h)
// drives gradcheck and gradgradcheck on several layouts, the backward under create_graph, the
// PyTorch golden values and gradients, edge shapes, anomaly mode and the emulated device; then a
// direct (seven-loop) convolution against the im2col path at a size that runs in parallel, the
// transposed convolution as the adjoint of the convolution, and every error message; then
// Float32 on oneDNN against im2col (value, gradients, second order, forward mode), threads and
// empty shapes.
#include <boost/test/unit_test.hpp>

#include <functional>
#include <thread>

#include "ops/conv_dnnl.h"
#include "tests/edge_shapes.h"
#include "tests/forward_over_forward.h"

using namespace ember;
using namespace ember::testing;

namespace {

// One row per op case; tests/op_table.h says what the fields mean. After adding or changing a
// row, run /usr/bin/python3 tests/golden/gen_op_tables.py. Rows whose bias may be undefined are
// kOptionalInputs.
// clang-format off
const OpTable kConvOps = {
    // conv2d: stride, padding (numbers, per dim, "same", "valid"), dilation, groups, unbatched
    {"conv2d", "F.conv2d(a, b, c)", {{2, 3, 5, 6}, {4, 3, 3, 3}, {4}}, {},
     [](auto& v) { return conv2d(v[0], v[1], v[2]); }, kOptionalInputs},
    {"conv2d stride padding", "F.conv2d(a, b, c, stride=2, padding=1)",
     {{2, 3, 6, 5}, {4, 3, 3, 3}, {4}}, {},
     [](auto& v) { return conv2d(v[0], v[1], v[2], {2}, 1); }, kOptionalInputs},
    {"conv2d stride and padding per dim", "F.conv2d(a, b, None, stride=(2, 1), padding=(0, 2))",
     {{2, 2, 5, 5}, {3, 2, 2, 3}}, {},
     [](auto& v) { return conv2d(v[0], v[1], {}, {2, 1}, {0, 2}); }},
    {"conv2d dilation", "F.conv2d(a, b, c, padding=2, dilation=2)",
     {{1, 2, 6, 6}, {3, 2, 3, 3}, {3}}, {},
     [](auto& v) { return conv2d(v[0], v[1], v[2], {1}, 2, {2}); }, kOptionalInputs},
    {"conv2d groups", "F.conv2d(a, b, c, groups=2)", {{2, 4, 5, 5}, {6, 2, 3, 3}, {6}}, {},
     [](auto& v) { return conv2d(v[0], v[1], v[2], {1}, 0, {1}, 2); }, kOptionalInputs},
    {"conv2d depthwise", "F.conv2d(a, b, c, padding=1, groups=3)",
     {{2, 3, 5, 5}, {6, 1, 3, 3}, {6}}, {},
     [](auto& v) { return conv2d(v[0], v[1], v[2], {1}, 1, {1}, 3); }, kOptionalInputs},
    {"conv2d same with an even kernel", "F.conv2d(a, b, c, padding='same', dilation=(1, 2))",
     {{1, 2, 5, 6}, {3, 2, 2, 4}, {3}}, {},
     [](auto& v) { return conv2d(v[0], v[1], v[2], {1}, "same", {1, 2}); }, kOptionalInputs},
    {"conv2d valid", "F.conv2d(a, b, None, stride=(1, 2), padding='valid')",
     {{2, 2, 4, 7}, {2, 2, 3, 2}}, {},
     [](auto& v) { return conv2d(v[0], v[1], {}, {1, 2}, "valid"); }},
    {"conv2d unbatched", "F.conv2d(a, b, c, padding=1)", {{3, 5, 4}, {2, 3, 3, 3}, {2}}, {},
     [](auto& v) { return conv2d(v[0], v[1], v[2], {1}, 1); }, kOptionalInputs},
    {"conv2d 1x1", "F.conv2d(a, b)", {{2, 4, 3, 3}, {5, 4, 1, 1}}, {},
     [](auto& v) { return conv2d(v[0], v[1]); }},
    {"conv2d then relu", "F.relu(F.conv2d(a, b, c, padding=1))", {{2, 2, 4, 4}, {3, 2, 3, 3}, {3}},
     {}, [](auto& v) { return relu(conv2d(v[0], v[1], v[2], {1}, 1)); }, kOptionalInputs},
    // conv1d
    {"conv1d", "F.conv1d(a, b, c)", {{2, 3, 7}, {4, 3, 3}, {4}}, {},
     [](auto& v) { return conv1d(v[0], v[1], v[2]); }, kOptionalInputs},
    {"conv1d stride padding dilation", "F.conv1d(a, b, c, stride=2, padding=2, dilation=2)",
     {{2, 2, 9}, {3, 2, 3}, {3}}, {},
     [](auto& v) { return conv1d(v[0], v[1], v[2], {2}, 2, {2}); }, kOptionalInputs},
    {"conv1d groups unbatched", "F.conv1d(a, b, None, groups=2)", {{4, 6}, {4, 2, 2}}, {},
     [](auto& v) { return conv1d(v[0], v[1], {}, {1}, 0, {1}, 2); }},
    {"conv1d same", "F.conv1d(a, b, c, padding='same')", {{2, 2, 6}, {3, 2, 4}, {3}}, {},
     [](auto& v) { return conv1d(v[0], v[1], v[2], {1}, "same"); }, kOptionalInputs},
    // conv_transpose2d and conv_transpose1d: output_padding, groups, dilation
    {"conv_transpose2d", "F.conv_transpose2d(a, b, c)", {{2, 3, 4, 4}, {3, 2, 3, 3}, {2}}, {},
     [](auto& v) { return conv_transpose2d(v[0], v[1], v[2]); }, kOptionalInputs},
    {"conv_transpose2d stride padding output_padding",
     "F.conv_transpose2d(a, b, c, stride=2, padding=1, output_padding=1)",
     {{2, 2, 3, 4}, {2, 3, 3, 3}, {3}}, {},
     [](auto& v) { return conv_transpose2d(v[0], v[1], v[2], {2}, {1}, {1}); }, kOptionalInputs},
    {"conv_transpose2d groups dilation",
     "F.conv_transpose2d(a, b, c, stride=(2, 1), padding=(1, 0), groups=2, dilation=(1, 2))",
     {{1, 4, 3, 3}, {4, 2, 3, 2}, {4}}, {},
     [](auto& v) { return conv_transpose2d(v[0], v[1], v[2], {2, 1}, {1, 0}, {0}, 2, {1, 2}); },
     kOptionalInputs},
    {"conv_transpose2d unbatched", "F.conv_transpose2d(a, b)", {{2, 3, 3}, {2, 3, 2, 2}}, {},
     [](auto& v) { return conv_transpose2d(v[0], v[1]); }},
    {"conv_transpose1d", "F.conv_transpose1d(a, b, c, stride=3, padding=1, output_padding=2)",
     {{2, 2, 4}, {2, 3, 3}, {3}}, {},
     [](auto& v) { return conv_transpose1d(v[0], v[1], v[2], {3}, {1}, {2}); }, kOptionalInputs},
    {"conv_transpose1d output_padding below the dilation",
     "F.conv_transpose1d(a, b, None, output_padding=1, groups=2, dilation=2)",
     {{2, 4, 5}, {4, 1, 3}}, {},
     [](auto& v) { return conv_transpose1d(v[0], v[1], {}, {1}, {0}, {1}, 2, {2}); }},
};
// clang-format on

// y[n, o, i, j] = b[o] + Σ x[n, c, i·s + p·dil - pad, …] w[o, c - g·C/G, p, q]: the definition,
// seven loops in Float64, for a (N, C, H, W) input.
Tensor direct_conv2d(const Tensor& x, const Tensor& w, const Tensor& b, int64_t stride, int64_t pad,
                     int64_t dil, int64_t groups) {
  const int64_t N = x.size(0), C = x.size(1), H = x.size(2), W = x.size(3);
  const int64_t O = w.size(0), Cg = w.size(1), kH = w.size(2), kW = w.size(3);
  const int64_t OH = (H + 2 * pad - dil * (kH - 1) - 1) / stride + 1;
  const int64_t OW = (W + 2 * pad - dil * (kW - 1) - 1) / stride + 1;
  const std::vector<double> xv = x.to_vector<double>(), wv = w.to_vector<double>(),
                            bv = b.to_vector<double>();
  std::vector<double> y(static_cast<size_t>(N * O * OH * OW));
  for (int64_t n = 0; n < N; ++n)
    for (int64_t o = 0; o < O; ++o)
      for (int64_t i = 0; i < OH; ++i)
        for (int64_t j = 0; j < OW; ++j) {
          double sum = bv[o];
          const int64_t g = o / (O / groups);
          for (int64_t c = 0; c < Cg; ++c)
            for (int64_t p = 0; p < kH; ++p)
              for (int64_t q = 0; q < kW; ++q) {
                const int64_t ih = i * stride + p * dil - pad, iw = j * stride + q * dil - pad;
                if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
                sum += xv[((n * C + g * Cg + c) * H + ih) * W + iw] *
                       wv[((o * Cg + c) * kH + p) * kW + q];
              }
          y[((n * O + o) * OH + i) * OW + j] = sum;
        }
  return from_vector(y, {N, O, OH, OW}, kFloat64);
}

// Float32 convolutions run on oneDNN where Ember has it (Note [Convolutions in oneDNN]): cases
// that reach it, each against the same call on the im2col path and both against Float64, for
// the value and the gradients of every input, first order and under create_graph.
struct PathCase {
  std::string name;
  std::vector<Shape> shapes;  // input, weight, bias (absent: no bias)
  std::function<Tensor(const std::vector<Tensor>&)> f;
};
// clang-format off
const std::vector<PathCase> kPathCases = {
    {"conv2d", {{4, 3, 9, 8}, {5, 3, 3, 3}, {5}},
     [](auto& v) { return conv2d(v[0], v[1], v[2]); }},
    {"conv2d stride padding", {{3, 4, 11, 10}, {8, 4, 3, 3}, {8}},
     [](auto& v) { return conv2d(v[0], v[1], v[2], {2}, 1); }},
    {"conv2d stride and padding per dim", {{2, 2, 9, 7}, {3, 2, 2, 3}},
     [](auto& v) { return conv2d(v[0], v[1], {}, {2, 1}, {0, 2}); }},
    {"conv2d dilation", {{2, 3, 10, 10}, {4, 3, 3, 3}, {4}},
     [](auto& v) { return conv2d(v[0], v[1], v[2], {1}, 2, {2}); }},
    {"conv2d groups", {{2, 8, 7, 7}, {12, 4, 3, 3}, {12}},
     [](auto& v) { return conv2d(v[0], v[1], v[2], {1}, 1, {1}, 2); }},
    {"conv2d depthwise", {{3, 16, 8, 8}, {16, 1, 3, 3}, {16}},
     [](auto& v) { return conv2d(v[0], v[1], v[2], {1}, 1, {1}, 16); }},
    {"conv2d same with an even kernel", {{2, 3, 7, 8}, {4, 3, 2, 4}, {4}},
     [](auto& v) { return conv2d(v[0], v[1], v[2], {1}, "same", {1, 2}); }},
    {"conv2d 1x1 stride 2", {{4, 16, 8, 8}, {32, 16, 1, 1}},
     [](auto& v) { return conv2d(v[0], v[1], {}, {2}); }},
    {"conv2d 32 channels", {{4, 32, 10, 10}, {32, 32, 3, 3}, {32}},
     [](auto& v) { return conv2d(v[0], v[1], v[2], {1}, 1); }},
    {"conv2d one input channel", {{4, 1, 12, 12}, {16, 1, 3, 3}, {16}},
     [](auto& v) { return conv2d(v[0], v[1], v[2], {1}, 1); }},
    {"conv2d unbatched", {{3, 6, 5}, {2, 3, 3, 3}, {2}},
     [](auto& v) { return conv2d(v[0], v[1], v[2], {1}, 1); }},
    {"conv1d", {{3, 4, 13}, {6, 4, 3}, {6}},
     [](auto& v) { return conv1d(v[0], v[1], v[2], {2}, 2, {2}); }},
    {"conv1d groups unbatched", {{4, 9}, {4, 2, 2}},
     [](auto& v) { return conv1d(v[0], v[1], {}, {1}, 0, {1}, 2); }},
    {"conv_transpose2d", {{2, 3, 5, 5}, {3, 4, 3, 3}, {4}},
     [](auto& v) { return conv_transpose2d(v[0], v[1], v[2]); }},
    {"conv_transpose2d stride padding output_padding", {{2, 4, 4, 5}, {4, 3, 3, 3}, {3}},
     [](auto& v) { return conv_transpose2d(v[0], v[1], v[2], {2}, {1}, {1}); }},
    {"conv_transpose2d groups dilation", {{2, 4, 4, 4}, {4, 2, 3, 2}, {4}},
     [](auto& v) { return conv_transpose2d(v[0], v[1], v[2], {2, 1}, {1, 0}, {0}, 2, {1, 2}); }},
    {"conv_transpose1d", {{2, 2, 6}, {2, 3, 3}, {3}},
     [](auto& v) { return conv_transpose1d(v[0], v[1], v[2], {3}, {1}, {2}); }},
    {"conv_transpose1d output_padding past the padding", {{2, 4, 5}, {4, 1, 3}},
     [](auto& v) { return conv_transpose1d(v[0], v[1], {}, {1}, {0}, {1}, 2, {2}); }},
};
// clang-format on

// Sets the oneDNN path on or off while alive, then on again.
struct ConvPath {
  explicit ConvPath(bool onednn) { ember::detail::set_conv_uses_onednn(onednn); }
  ~ConvPath() { ember::detail::set_conv_uses_onednn(true); }
  ConvPath(const ConvPath&) = delete;
  ConvPath& operator=(const ConvPath&) = delete;
};

// The value, every input's gradient for upstream `up`, and the gradients of Σ (those
// gradients)² (create_graph), in Float64 for comparing.
std::vector<Tensor> path_results(const PathCase& c, const std::vector<Tensor>& leaves64,
                                 const Tensor& up64, DType dtype) {
  std::vector<Tensor> in;
  for (const Tensor& t : leaves64) in.push_back(t.detach().to(dtype).requires_grad_());
  const Tensor y = c.f(in);
  std::vector<Tensor> out{y.detach().to(kFloat64)};
  const Tensor up = up64.to(dtype);
  for (const Tensor& g : autograd::grad({y}, in, {up}, true)) out.push_back(g.to(kFloat64));
  const std::vector<Tensor> first = autograd::grad({c.f(in)}, in, {up}, true, true);
  Tensor squares;
  for (const Tensor& g : first) {
    out.push_back(g.detach().to(kFloat64));  // the gradients again, from the ops' path
    squares = squares.defined() ? squares + (g * g).sum() : (g * g).sum();
  }
  const std::vector<Tensor> second = autograd::grad({squares}, in, {}, std::nullopt, false, true);
  for (size_t i = 0; i < in.size(); ++i)  // the bias's gradient is a constant: nothing reaches it
    out.push_back(second[i].defined() ? second[i].to(kFloat64) : zeros(in[i].shape(), kFloat64));
  return out;
}

// Forward mode in `dtype`, in Float64 for comparing: the tangent of the value for tangents
// `dirs` of every input, then forward over reverse: the tangents of the gradients for upstream
// `up` (create_graph), each input dual (zeros where a gradient has no tangent).
std::vector<Tensor> forward_results(const PathCase& c, const std::vector<Tensor>& leaves64,
                                    const std::vector<Tensor>& dirs64, const Tensor& up64,
                                    DType dtype) {
  namespace fa = autograd::forward_ad;
  std::vector<Tensor> out;
  fa::DualLevel level;
  std::vector<Tensor> in, dual;
  for (size_t i = 0; i < leaves64.size(); ++i) {
    in.push_back(leaves64[i].detach().to(dtype).requires_grad_());
    dual.push_back(fa::make_dual(in[i], dirs64[i].to(dtype)));
  }
  const Tensor y = c.f(dual);
  out.push_back(fa::unpack_dual(y).tangent.to(kFloat64));
  const std::vector<Tensor> grads =
      autograd::grad({y}, in, {up64.to(dtype)}, std::nullopt, true, true);
  for (size_t i = 0; i < in.size(); ++i) {
    const Tensor t = grads[i].defined() ? fa::unpack_dual(grads[i]).tangent : Tensor();
    out.push_back(t.defined() ? t.to(kFloat64) : zeros(in[i].shape(), kFloat64));
  }
  return out;
}

// f throws an ember::Error whose message contains `part`.
template <class F>
void fails(F&& f, const std::string& part) {
  expect_error(std::forward<F>(f), {part});
}

}  // namespace

BOOST_AUTO_TEST_SUITE(test_conv)

BOOST_AUTO_TEST_CASE(table_gradcheck) { check_gradients(kConvOps); }
BOOST_AUTO_TEST_CASE(table_gradgradcheck) { check_gradgradients(kConvOps); }
BOOST_AUTO_TEST_CASE(table_forward_ad) { check_forward_gradients(kConvOps); }
BOOST_AUTO_TEST_CASE(table_forward_over_forward) { check_forward_over_forward(kConvOps); }
BOOST_AUTO_TEST_CASE(table_forward_over_reverse) { check_forward_over_reverse(kConvOps); }
BOOST_AUTO_TEST_CASE(table_create_graph_gradients) { check_create_graph_gradients(kConvOps); }
BOOST_AUTO_TEST_CASE(table_golden) { check_golden(kConvOps); }
BOOST_AUTO_TEST_CASE(table_edge_cases) { check_edge_cases(kConvOps); }
BOOST_AUTO_TEST_CASE(table_edge_shapes) { check_edge_shapes(kConvOps); }
BOOST_AUTO_TEST_CASE(table_anomaly) { check_anomaly(kConvOps); }
BOOST_AUTO_TEST_CASE(table_on_device) { check_on_device(kConvOps); }
BOOST_AUTO_TEST_CASE(table_forward_ad_on_device) { check_forward_on_device(kConvOps); }

// The im2col path against the definition at a size whose im2col and col2im split across
// threads, with stride, padding, dilation and groups; Float32 against Float64.
BOOST_AUTO_TEST_CASE(conv2d_matches_definition_in_parallel) {
  manual_seed(7);
  const Tensor x = randn({6, 8, 19, 17}, kFloat64), w = randn({12, 4, 3, 3}, kFloat64),
               b = randn({12}, kFloat64);
  for (const auto& [stride, pad, dil] : {std::array<int64_t, 3>{1, 1, 1}, {2, 2, 2}, {3, 0, 1}}) {
    BOOST_TEST_CONTEXT("stride " << stride << " padding " << pad << " dilation " << dil) {
      const Tensor want = direct_conv2d(x, w, b, stride, pad, dil, 2);
      expect_close(conv2d(x, w, b, {stride}, pad, {dil}, 2), want, 1e-12, 1e-12, "Float64");
      expect_close(conv2d(x.to(kFloat32), w.to(kFloat32), b.to(kFloat32), {stride}, pad, {dil}, 2)
                       .to(kFloat64),
                   want, 1e-4, 1e-4, "Float32");
    }
  }
}

// <conv(x), y> = <x, conv_transpose(y)> with the same weight: the transposed convolution is the
// convolution's adjoint (output_padding recovering the sizes a stride drops).
BOOST_AUTO_TEST_CASE(conv_transpose_is_the_adjoint) {
  manual_seed(8);
  const Tensor x = randn({3, 4, 11, 10}, kFloat64), w = randn({6, 2, 3, 2}, kFloat64);
  const Tensor y = conv2d(x, w, {}, {2, 3}, {1, 0}, {2, 1}, 2);
  const Tensor u = randn(y.shape(), kFloat64);
  const Tensor back = conv_transpose2d(u, w, {}, {2, 3}, {1, 0}, {0, 2}, 2, {2, 1});
  BOOST_TEST_REQUIRE((back.shape() == x.shape()), fmt::format("{}", back.shape()));
  const double lhs = (y * u).sum().item<double>(), rhs = (x * back).sum().item<double>();
  BOOST_TEST(lhs == rhs, boost::test_tools::tolerance(1e-10));
}

// An empty batch gives an empty result, and empty gradients.
BOOST_AUTO_TEST_CASE(empty_batch) {
  const Tensor x = zeros({0, 3, 5, 5}, kFloat64).requires_grad_();
  const Tensor w = randn({4, 3, 3, 3}, kFloat64).requires_grad_();
  const Tensor y = conv2d(x, w, {}, {1}, 1);
  BOOST_TEST((y.shape() == Shape{0, 4, 5, 5}));
  y.sum().backward();
  BOOST_TEST((x.grad().shape() == x.shape()));
  BOOST_TEST(w.grad().abs().sum().item<double>() == 0.0);
  const Tensor t = conv_transpose1d(zeros({0, 2, 4}), randn({2, 3, 3}), {}, {2});
  BOOST_TEST((t.shape() == Shape{0, 3, 9}));
}

BOOST_AUTO_TEST_CASE(errors) {
  const Tensor x = randn({2, 4, 5, 5}), w = randn({6, 2, 3, 3});
  fails([&] { conv2d(x, w, {}, {1}, 0, {1}, 3); },
        "conv2d: in_channels 4 and out_channels 6 must both be divisible by groups 3");
  fails([&] { conv2d(x, w); },
        "conv2d: weight of shape [6, 2, 3, 3] with groups 1 "
        "expects 2 input channels");
  fails([&] { conv2d(x, w, {}, {0}, 0, {1}, 2); }, "conv2d: stride must be positive");
  fails([&] { conv2d(x, w, {}, {-1, 1}, 0, {1}, 2); }, "conv2d: stride must be positive");
  fails([&] { conv2d(x, w, {}, {1}, 0, {0}, 2); }, "conv2d: dilation must be positive");
  fails(
      [&] {
        conv2d(x, w, {}, {1, 1, 1}, 0, {1}, 2);
      },
      "conv2d: stride must have 1 or 2 values, got 3");
  fails([&] { conv2d(x, w, {}, {1}, -1, {1}, 2); }, "conv2d: padding must be non-negative");
  fails([&] { conv2d(x, w, {}, {1}, 0, {1}, 0); }, "conv2d: groups must be positive");
  fails([&] { conv2d(x, w, {}, {2}, "same", {1}, 2); }, "conv2d: padding \"same\" needs stride 1");
  fails([&] { conv2d(x, w, {}, {1}, "full", {1}, 2); },
        "conv2d: padding must be numbers, \"same\" or \"valid\", got \"full\"");
  fails(
      [&] {
        conv2d(randn({2, 4, 2, 5}), w, {}, {1}, 0, {1}, 2);
      },
      "conv2d: kernel size 3 (dilated to 3) is larger than the padded input 2");
  fails([&] { conv2d(x, w, {}, {1}, 0, {3}, 2); },
        "conv2d: kernel size 3 (dilated to 7) is larger than the padded input 5");
  fails(
      [&] {
        conv2d(randn({4, 5}), w, {}, {1}, 0, {1}, 2);
      },
      "conv2d: expected a 3-D (unbatched) or 4-D (batched) input, got shape [4, 5]");
  fails([&] { conv2d(x, randn({6, 2, 3})); }, "conv2d: weight must be 4-D");
  fails([&] { conv2d(x, w, randn({5}), {1}, 0, {1}, 2); },
        "conv2d: bias must be 1-D of 6 output channels, got shape [5]");
  fails([&] { conv2d(x, w.to(kFloat64), {}, {1}, 0, {1}, 2); },
        "conv2d: input is Float32 but weight is Float64");
  fails([&] { conv2d(randint(0, 3, {2, 4, 5, 5}), w); }, "conv2d: expected a Float32");
  fails(
      [&] {
        conv1d(randn({2, 3, 5}), randn({2, 3, 0}));
      },
      "conv1d: kernel sizes must be positive");
  fails(
      [&] {
        conv1d(randn({2, 3, 5}), randn({0, 3, 2}));
      },
      "conv1d: weight of shape [0, 3, 2] has 0 channels in dim 0, fewer than groups 1");
  fails(
      [&] {
        conv2d(randn({2, 3, 0, 5}), randn({2, 3, 1, 1}));
      },
      "conv2d: an input with a spatial size of 0 must have an empty batch or no channels");
  fails(
      [&] {
        conv_transpose1d(randn({2, 3, 5}), randn({3, 0, 2}));
      },
      "conv_transpose1d: weight of shape [3, 0, 2] is empty");
  fails(
      [&] {
        conv_transpose2d(x, randn({4, 3, 3, 3}), {}, {1}, {0}, {1});
      },
      "conv_transpose2d: output_padding [1] must be smaller than the stride [1] or the "
      "dilation [1]");
  fails(
      [&] {
        conv_transpose2d(x, randn({3, 3, 3, 3}));
      },
      "conv_transpose2d: weight of shape [3, 3, 3, 3] expects 3 input channels, but the "
      "input of shape [2, 4, 5, 5] has 4");
  fails(
      [&] {
        conv_transpose2d(x, randn({4, 3, 2, 2}), {}, {1}, {3});
      },
      "conv_transpose2d: output size 0 is below 1");
  fails(
      [&] {
        conv_transpose1d(randn({2, 3, 5}), randn({3, 2, 3}), {}, {1}, {0}, {0}, 2);
      },
      "conv_transpose1d: in_channels 3 of the input [2, 3, 5] is not divisible by "
      "groups 2");
}

// Float32 on oneDNN and on im2col + products agree with each other and with Float64, value and
// gradients, first and second order; the oneDNN calls record their own ops (their Nodes), except
// where im2col must run it (an output_padding past the padding plus the stride).
BOOST_AUTO_TEST_CASE(onednn_matches_im2col) {
  if (!ember::detail::onednn_built()) {
    BOOST_TEST_MESSAGE("skipped: Ember was built without oneDNN");
    return;
  }
  ConvPath on(true);  // whatever EMBER_CONV says
  const char* names[] = {"value", "input gradient", "weight gradient", "bias gradient"};
  for (const PathCase& c : kPathCases) {
    BOOST_TEST_CONTEXT(c.name) {
      manual_seed(11);
      std::vector<Tensor> leaves;
      for (const Shape& s : c.shapes) leaves.push_back(randn(s, kFloat64));
      const Tensor up = randn(c.f(leaves).shape(), kFloat64);
      const std::vector<Tensor> want = path_results(c, leaves, up, kFloat64);
      const std::vector<Tensor> onednn = path_results(c, leaves, up, kFloat32);
      std::vector<Tensor> im2col;
      {
        ConvPath path(false);
        im2col = path_results(c, leaves, up, kFloat32);
      }
      const size_t n = leaves.size();
      for (size_t i = 0; i < want.size(); ++i) {
        const std::string what = i <= n ? names[i]
                                 : i <= 2 * n
                                     ? fmt::format("{} under create_graph", names[i - n])
                                     : fmt::format("second-order gradient {}", i - 2 * n - 1);
        // relative to the result's scale: sums of up to a few thousand Float32 products
        const double scale = std::max(1.0, want[i].abs().max().item<double>());
        expect_close(onednn[i], want[i], 1e-5, 2e-6 * scale, what + " (oneDNN)");
        expect_close(im2col[i], want[i], 1e-5, 2e-6 * scale, what + " (im2col)");
        expect_close(onednn[i], im2col[i], 1e-5, 2e-6 * scale, what + " (oneDNN vs im2col)");
      }
    }
  }
  // which path ran: the convolution's own Node on oneDNN, im2col's ops otherwise
  const Tensor x = randn({2, 3, 6, 6}).requires_grad_(), w = randn({4, 3, 3, 3});
  BOOST_TEST(conv2d(x, w).grad_fn()->name() == "ConvolutionBackward");
  BOOST_TEST(conv2d(x.to(kFloat64), w.to(kFloat64)).grad_fn()->name() != "ConvolutionBackward");
  {
    ConvPath path(false);
    BOOST_TEST(conv2d(x, w).grad_fn()->name() != "ConvolutionBackward");
  }
  BOOST_TEST(conv_transpose2d(x, randn({3, 2, 3, 3})).grad_fn()->name() ==
             "ConvolutionInputBackward");
  // output_padding 1 past padding 0 + stride 1: oneDNN cannot express it, im2col runs
  const Tensor t = randn({2, 4, 5, 5}).requires_grad_();
  BOOST_TEST(
      conv_transpose2d(t, randn({4, 1, 3, 3}), {}, {1}, {0}, {1}, 2, {2}).grad_fn()->name() ==
      "Col2imBackward");
}

// Forward mode in Float32 on oneDNN (the rules of its three ops) and on im2col agree with each
// other and with Float64: the value's tangent, and forward over reverse, the tangents of the
// gradients under create_graph (Hessian-vector products of <y, up>).
BOOST_AUTO_TEST_CASE(onednn_forward_mode_matches_im2col) {
  if (!ember::detail::onednn_built()) {
    BOOST_TEST_MESSAGE("skipped: Ember was built without oneDNN");
    return;
  }
  ConvPath on(true);
  const char* names[] = {"input", "weight", "bias"};
  for (const PathCase& c : kPathCases) {
    BOOST_TEST_CONTEXT(c.name) {
      manual_seed(13);
      std::vector<Tensor> leaves, dirs;
      for (const Shape& s : c.shapes) leaves.push_back(randn(s, kFloat64));
      for (const Shape& s : c.shapes) dirs.push_back(randn(s, kFloat64));
      const Tensor up = randn(c.f(leaves).shape(), kFloat64);
      const std::vector<Tensor> want = forward_results(c, leaves, dirs, up, kFloat64);
      const std::vector<Tensor> onednn = forward_results(c, leaves, dirs, up, kFloat32);
      std::vector<Tensor> im2col;
      {
        ConvPath path(false);
        im2col = forward_results(c, leaves, dirs, up, kFloat32);
      }
      for (size_t i = 0; i < want.size(); ++i) {
        const std::string what =
            i == 0 ? "tangent of the value"
                   : fmt::format("tangent of the {} gradient (forward over reverse)", names[i - 1]);
        const double scale = std::max(1.0, want[i].abs().max().item<double>());
        expect_close(onednn[i], want[i], 1e-5, 2e-6 * scale, what + " (oneDNN)");
        expect_close(im2col[i], want[i], 1e-5, 2e-6 * scale, what + " (im2col)");
      }
    }
  }
}

// oneDNN's results on 1 and 2 threads (primitives cached per thread count) and from several
// caller threads at once agree with the 1-thread result; an empty batch and zero channels
// stay on im2col and give torch's shapes.
BOOST_AUTO_TEST_CASE(onednn_threads_and_empty_shapes) {
  manual_seed(12);
  const Tensor x = randn({8, 16, 14, 14}), w = randn({16, 16, 3, 3}), b = randn({16});
  const int before = get_num_threads();
  set_num_threads(1);
  const Tensor one = conv2d(x, w, b, {1}, 1);
  const Tensor up = randn(one.shape());
  const auto grads = [&] {
    const Tensor xg = x.detach().requires_grad_(), wg = w.detach().requires_grad_(),
                 bg = b.detach().requires_grad_();
    return autograd::grad({conv2d(xg, wg, bg, {1}, 1)}, {xg, wg, bg}, {up});
  };
  const std::vector<Tensor> g1 = grads();
  set_num_threads(2);
  // Ember's bits do not depend on its thread count
  expect_close(conv2d(x, w, b, {1}, 1), one, 0, 0, "2 threads");
  const std::vector<Tensor> g2 = grads();
  for (size_t i = 0; i < 3; ++i)
    expect_close(g2[i], g1[i], 0, 0, fmt::format("2 threads, gradient {}", i));
  set_num_threads(1);
  std::vector<Tensor> got(4);
  {
    std::vector<std::thread> callers;
    for (size_t i = 0; i < got.size(); ++i)
      callers.emplace_back([&, i] { got[i] = conv2d(x, w, b, {1}, 1); });
    for (std::thread& t : callers) t.join();
  }
  for (const Tensor& g : got) expect_close(g, one, 0, 0, "concurrent callers");
  set_num_threads(before);
  if (ember::detail::onednn_built()) BOOST_TEST(ember::detail::onednn_cached_primitives() > 0);
  const Tensor e = zeros({0, 3, 5, 5}).requires_grad_(), we = randn({4, 3, 3, 3}).requires_grad_();
  const Tensor y = conv2d(e, we, {}, {1}, 1);
  BOOST_TEST((y.shape() == Shape{0, 4, 5, 5}));
  y.sum().backward();
  BOOST_TEST((e.grad().shape() == e.shape()));
  BOOST_TEST(we.grad().abs().sum().item<double>() == 0.0);
}

// Sets Winograd's kernels on or off while alive, then on again.
struct WinogradPath {
  explicit WinogradPath(bool on) { ember::detail::set_conv_winograd(on); }
  ~WinogradPath() { ember::detail::set_conv_winograd(true); }
  WinogradPath(const WinogradPath&) = delete;
  WinogradPath& operator=(const WinogradPath&) = delete;
};

// Note [Winograd convolutions]: a 3x3 stride-1 convolution of 25 images of 16 channels at 28x28
// (two pieces of 12 and 13 images) runs Winograd's kernels; its value and gradients agree with
// Float64 and with the direct kernels, their bits do not depend on the thread count, and small,
// strided, grouped and switched-off convolutions stay direct.
BOOST_AUTO_TEST_CASE(onednn_winograd) {
  if (!ember::detail::onednn_built()) {
    BOOST_TEST_MESSAGE("skipped: Ember was built without oneDNN");
    return;
  }
  ConvPath on(true);
  WinogradPath winograd(true);
  ember::detail::ConvDesc d;
  d.N = 25, d.C = 16, d.O = 32, d.in = d.out = {28, 28}, d.kernel = {3, 3},
  d.pad_l = d.pad_r = {1, 1};
  d.bias = true;
  if (!ember::detail::onednn_uses_winograd(d)) {
    BOOST_TEST_MESSAGE("skipped: oneDNN has no Winograd convolution on this CPU");
    return;
  }
  ember::detail::ConvDesc small = d, strided = d, grouped = d;
  small.N = 5;  // 3,920 output positions
  strided.stride = {2, 2}, strided.out = {14, 14};
  grouped.G = 2;
  BOOST_TEST(!ember::detail::onednn_uses_winograd(small));
  BOOST_TEST(!ember::detail::onednn_uses_winograd(strided));
  BOOST_TEST(!ember::detail::onednn_uses_winograd(grouped));
  {
    WinogradPath off(false);
    BOOST_TEST(!ember::detail::onednn_uses_winograd(d));
  }

  manual_seed(21);
  const Tensor x = randn({25, 16, 28, 28}, kFloat64), w = randn({32, 16, 3, 3}, kFloat64) / 12.0,
               b = randn({32}, kFloat64), up = randn({25, 32, 28, 28}, kFloat64);
  // the value and the three gradients for `up`, computed in `dtype`, as Float64
  const auto results = [&](DType dtype) {
    const Tensor xg = x.to(dtype).requires_grad_(), wg = w.to(dtype).requires_grad_(),
                 bg = b.to(dtype).requires_grad_();
    const Tensor y = conv2d(xg, wg, bg, {1}, 1);
    std::vector<Tensor> out = autograd::grad({y}, {xg, wg, bg}, {up.to(dtype)});
    out.insert(out.begin(), y.detach());
    for (Tensor& t : out) t = t.to(kFloat64);
    return out;
  };
  const int before = get_num_threads();
  set_num_threads(1);
  const std::vector<Tensor> want = results(kFloat64), one = results(kFloat32);
  std::vector<Tensor> direct;
  {
    WinogradPath off(false);
    direct = results(kFloat32);
  }
  set_num_threads(2);
  const std::vector<Tensor> two = results(kFloat32);
  set_num_threads(before);
  const char* names[] = {"value", "input gradient", "weight gradient", "bias gradient"};
  for (size_t i = 0; i < want.size(); ++i) {
    // Winograd's rounding error is a few times the direct sum's in the value and the input
    // gradient (8e-7 and 1.3e-6 of the result's scale here, against 4e-7), and no larger in the
    // weight gradient (8e-7 against 1.8e-6)
    const double scale = want[i].abs().max().item<double>();
    expect_close(one[i], want[i], 1e-5, 5e-6 * scale, fmt::format("{} (Winograd)", names[i]));
    expect_close(direct[i], want[i], 1e-5, 2e-6 * scale, fmt::format("{} (direct)", names[i]));
    expect_close(two[i], one[i], 0, 0, fmt::format("{} on 2 threads", names[i]));
  }
  // Winograd's kernels ran: their bits differ from the direct kernels'
  BOOST_TEST((one[0] - direct[0]).abs().max().item<double>() > 0.0);
  // several callers at once share the cached primitives, each with its own scratchpad
  set_num_threads(1);
  const Tensor x32 = x.to(kFloat32), w32 = w.to(kFloat32), b32 = b.to(kFloat32);
  std::vector<Tensor> got(3);
  {
    std::vector<std::thread> callers;
    for (size_t i = 0; i < got.size(); ++i)
      callers.emplace_back([&, i] { got[i] = conv2d(x32, w32, b32, {1}, 1); });
    for (std::thread& t : callers) t.join();
  }
  set_num_threads(before);
  for (const Tensor& g : got) expect_close(g.to(kFloat64), one[0], 0, 0, "concurrent callers");
  // the transposed convolution is the backward-data: Winograd's too, and its gradients
  const Tensor t64 = randn({25, 32, 28, 28}, kFloat64);
  const auto transposed = [&](DType dtype) {
    const Tensor tg = t64.to(dtype).requires_grad_(), wg = w.to(dtype).requires_grad_();
    const Tensor y = conv_transpose2d(tg, wg, {}, {1}, {1});
    std::vector<Tensor> out = autograd::grad({y}, {tg, wg}, {x.to(dtype)});
    out.insert(out.begin(), y.detach());
    for (Tensor& r : out) r = r.to(kFloat64);
    return out;
  };
  const std::vector<Tensor> t_want = transposed(kFloat64), t_got = transposed(kFloat32);
  const char* t_names[] = {"transposed value", "transposed input gradient",
                           "transposed weight gradient"};
  for (size_t i = 0; i < t_want.size(); ++i)
    expect_close(t_got[i], t_want[i], 1e-5, 5e-6 * t_want[i].abs().max().item<double>(),
                 t_names[i]);
}

// Note [Single-channel weight gradients]: where oneDNN's backward-weights kernel is its AVX2 one,
// a weight gradient of one input channel per group is left to im2col (the call returns false,
// and conv2d's gradient is im2col's bit for bit); with more channels, or another kernel, oneDNN
// runs it.
BOOST_AUTO_TEST_CASE(onednn_single_channel_weight_gradient) {
  if (!ember::detail::onednn_built()) {
    BOOST_TEST_MESSAGE("skipped: Ember was built without oneDNN");
    return;
  }
  ConvPath on(true);
  ember::detail::ConvDesc one, many;
  one.N = 6, one.C = 1, one.O = 8, one.in = one.out = {12, 12}, one.kernel = {3, 3},
  one.pad_l = one.pad_r = {1, 1};
  one.bias = true;
  many = one;
  many.C = 4;
  const std::string kernel = ember::detail::onednn_weight_kernel(one);
  BOOST_TEST_MESSAGE("oneDNN's backward-weights kernel here: " << kernel);
  BOOST_TEST(!kernel.empty());
  manual_seed(5);
  const Tensor x1 = randn({6, 1, 12, 12}), x4 = randn({6, 4, 12, 12}), dy = randn({6, 8, 12, 12});
  Tensor dw = empty({8, 4, 3, 3}), db = empty({8});
  const bool ran_one = ember::detail::onednn_conv_backward_weights(
      one, x1.data<float>(), dy.data<float>(), dw.data<float>(), db.data<float>());
  BOOST_TEST(ran_one == (kernel != "jit:avx2"));
  if (ember::detail::onednn_weight_kernel(many) == "jit:avx2")
    BOOST_TEST(ember::detail::onednn_conv_backward_weights(many, x4.data<float>(), dy.data<float>(),
                                                           dw.data<float>(), db.data<float>()));
  // conv2d's weight and bias gradients: im2col's where oneDNN declined
  const Tensor w = randn({8, 1, 3, 3}).requires_grad_(), b = randn({8}).requires_grad_();
  const auto grads = [&] { return autograd::grad({conv2d(x1, w, b, {1}, 1)}, {w, b}, {dy}); };
  const std::vector<Tensor> dnnl = grads();
  std::vector<Tensor> im2col;
  {
    ConvPath path(false);
    im2col = grads();
  }
  for (size_t i = 0; i < 2; ++i) {
    if (!ran_one) expect_close(dnnl[i], im2col[i], 0, 0, "declined: im2col's bits");
    expect_close(dnnl[i], im2col[i], 1e-5, 1e-5, "oneDNN or im2col");
  }
}

// The layers: torch's parameter names, shapes and initialisation bound, options passed through,
// padding_mode as pad() then an unpadded convolution, Flatten in a Sequential.
BOOST_AUTO_TEST_CASE(conv_modules) {
  manual_seed(9);
  nn::Conv2d conv(4, 6, {3, 2}, {.stride = {2}, .padding = {1, 0}, .groups = 2});
  const auto named = conv.named_parameters();
  BOOST_TEST_REQUIRE(named.size() == 2u);
  BOOST_TEST(named[0].first == "weight");
  BOOST_TEST(named[1].first == "bias");
  BOOST_TEST((conv.weight.shape() == Shape{6, 2, 3, 2}));
  const double bound = 1.0 / std::sqrt(2.0 * 3 * 2);
  BOOST_TEST(conv.weight.abs().max().item<double>() <= bound);
  BOOST_TEST(conv.bias.abs().max().item<double>() <= bound);
  const Tensor x = randn({2, 4, 7, 5});
  expect_close(conv(x), conv2d(x, conv.weight, conv.bias, {2}, {1, 0}, {1}, 2), 0, 0, "forward");
  nn::Conv1d reflect(2, 3, {3}, {.padding = 2, .bias = false, .padding_mode = "reflect"});
  BOOST_TEST(!reflect.bias.defined());
  const Tensor s = randn({2, 2, 6});
  expect_close(reflect(s), conv1d(pad(s, {2, 2}, "reflect"), reflect.weight), 0, 0, "reflect");
  nn::ConvTranspose2d up(3, 4, {2}, {.stride = {2}});
  BOOST_TEST((up.weight.shape() == Shape{3, 4, 2, 2}));
  BOOST_TEST((up(randn({1, 3, 4, 5})).shape() == Shape{1, 4, 8, 10}));
  nn::Sequential net(std::make_shared<nn::Conv2d>(1, 2, IntList{3}),
                     std::make_shared<nn::Flatten>());
  BOOST_TEST((net.forward(randn({5, 1, 6, 6})).shape() == Shape{5, 32}));
  fails([] { nn::Conv2d(3, 4, {3}, {.groups = 2}); },
        "Conv2d: in_channels 3 and out_channels 4 must both be divisible by groups 2");
  fails([] { nn::Conv2d(3, 4, {3}, {.padding_mode = "mirror"}); }, "Conv2d: padding_mode must be");
  fails([] { nn::Conv1d(3, 4, {0}); }, "Conv1d: kernel_size must be positive");
}

// Upsample (torch.nn.Upsample): interpolate with its options, no parameters or buffers, in a
// Sequential and cloned; a bad mode or align_corners with "nearest" is interpolate's Error at
// forward, as torch's.
BOOST_AUTO_TEST_CASE(upsample_module) {
  manual_seed(10);
  const Tensor x = randn({2, 3, 4, 5}), s = randn({2, 3, 6});
  nn::Upsample nearest({8, 10});
  BOOST_TEST(nearest.named_parameters().empty());
  BOOST_TEST(nearest.state_dict().empty());
  expect_close(nearest(x), interpolate(x, {8, 10}), 0, 0, "nearest");
  nn::Upsample bilinear({7}, "bilinear", true);
  expect_close(bilinear(x), interpolate(x, {7}, "bilinear", true), 0, 0, "bilinear");
  expect_close(nn::Upsample({4}, "linear")(s), interpolate(s, {4}, "linear"), 0, 0, "linear");
  const auto copy = std::dynamic_pointer_cast<nn::Upsample>(bilinear.clone());
  BOOST_TEST_REQUIRE(copy != nullptr);
  BOOST_TEST((copy->size == IntList{7} && copy->mode == "bilinear" && copy->align_corners == true));
  nn::Sequential net(std::make_shared<nn::Conv2d>(3, 2, IntList{3}),
                     std::make_shared<nn::Upsample>(IntList{4, 6}, "bilinear"));
  BOOST_TEST((net.forward(x).shape() == Shape{2, 2, 4, 6}));
  fails([&] { nn::Upsample({8}, "cubic")(x); }, "interpolate: unknown mode \"cubic\"");
  fails([&] { nn::Upsample({8}, "nearest", false)(x); },
        "interpolate: align_corners can only be set");
  fails([&] { nn::Upsample({8}, "linear")(x); }, "interpolate: mode \"linear\" needs a 3-D input");
}

BOOST_AUTO_TEST_SUITE_END()
