// max_pool1d/2d, max_pool2d_with_indices, avg_pool1d/2d and adaptive_avg_pool1d/2d: one table of
// cases (tests/op_table.h) drives gradcheck and gradgradcheck on several layouts, the backward
// under create_graph, the PyTorch golden values and gradients (indices too), edge shapes, anomaly
// mode and the emulated device; then the kernels at a size that runs in parallel against pooling
// composed of slices, Float32 against Float64, NaN, empty batches, a window wholly in the padding,
// every error message, and the modules in a Sequential.
#include <boost/test/unit_test.hpp>

#include "tests/edge_shapes.h"
#include "tests/forward_over_forward.h"

using namespace ember;
using namespace ember::testing;

namespace {

// One row per op case; tests/op_table.h says what the fields mean. After adding or changing a
// row, run /usr/bin/python3 tests/golden/gen_op_tables.py. Max pooling reads Real inputs (ties,
// where the gradient's place is a convention, have probability zero).
// clang-format off
const OpTable kPoolOps = {
    // max_pool2d: stride (default = kernel), padding, dilation, ceil_mode, non-square, unbatched
    {"max_pool2d", "F.max_pool2d(a, 2)", {{2, 3, 7, 6}}, {},
     [](auto& v) { return max_pool2d(v[0], {2}); }},
    {"max_pool2d stride padding", "F.max_pool2d(a, 3, stride=2, padding=1)", {{2, 3, 7, 6}}, {},
     [](auto& v) { return max_pool2d(v[0], {3}, {2}, {1}); }},
    {"max_pool2d non-square kernel and stride", "F.max_pool2d(a, (3, 2), stride=(1, 2), padding=(1, 0))",
     {{2, 2, 5, 6}}, {},
     [](auto& v) { return max_pool2d(v[0], {3, 2}, {1, 2}, {1, 0}); }},
    {"max_pool2d dilation", "F.max_pool2d(a, 3, stride=1, padding=1, dilation=2)", {{2, 2, 7, 6}}, {},
     [](auto& v) { return max_pool2d(v[0], {3}, {1}, {1}, {2}); }},
    // 7 rows: 3 windows of 2, a 4th (half in the input) with ceil_mode
    {"max_pool2d ceil_mode", "F.max_pool2d(a, 2, ceil_mode=True)", {{2, 3, 7, 5}}, {},
     [](auto& v) { return max_pool2d(v[0], {2}, {}, {0}, {1}, true); }},
    {"max_pool2d ceil_mode padding", "F.max_pool2d(a, 3, stride=2, padding=1, ceil_mode=True)",
     {{1, 2, 6, 8}}, {},
     [](auto& v) { return max_pool2d(v[0], {3}, {2}, {1}, {1}, true); }},
    {"max_pool2d unbatched", "F.max_pool2d(a, 2, stride=1)", {{3, 5, 4}}, {},
     [](auto& v) { return max_pool2d(v[0], {2}, {1}); }},
    {"max_pool2d_with_indices", "F.max_pool2d(a, 3, stride=2, padding=1, return_indices=True)[1]",
     {{2, 3, 7, 6}}, {},
     [](auto& v) { return max_pool2d_with_indices(v[0], {3}, {2}, {1}).indices; }, kNoGrad},
    {"max_pool2d_with_indices dilation ceil_mode",
     "F.max_pool2d(a, (2, 3), dilation=(2, 1), ceil_mode=True, return_indices=True)[1]",
     {{2, 2, 7, 8}}, {},
     [](auto& v) { return max_pool2d_with_indices(v[0], {2, 3}, {}, {0}, {2, 1}, true).indices; },
     kNoGrad},
    {"max_pool2d_with_indices values", "F.max_pool2d(a, (2, 3), dilation=(2, 1), ceil_mode=True, return_indices=True)[0]",
     {{2, 2, 7, 8}}, {},
     [](auto& v) { return max_pool2d_with_indices(v[0], {2, 3}, {}, {0}, {2, 1}, true).values; }},
    {"max_pool2d_with_indices unbatched", "F.max_pool2d(a, 2, stride=1, padding=1, return_indices=True)[1]",
     {{2, 5, 4}}, {},
     [](auto& v) { return max_pool2d_with_indices(v[0], {2}, {1}, {1}).indices; }, kNoGrad},
    // max_pool1d
    {"max_pool1d", "F.max_pool1d(a, 3)", {{2, 3, 10}}, {},
     [](auto& v) { return max_pool1d(v[0], {3}); }},
    {"max_pool1d stride padding dilation", "F.max_pool1d(a, 3, stride=2, padding=1, dilation=2)",
     {{2, 3, 9}}, {},
     [](auto& v) { return max_pool1d(v[0], {3}, {2}, {1}, {2}); }},
    {"max_pool1d ceil_mode", "F.max_pool1d(a, 2, ceil_mode=True)", {{2, 3, 7}}, {},
     [](auto& v) { return max_pool1d(v[0], {2}, {}, {0}, {1}, true); }},
    {"max_pool1d unbatched", "F.max_pool1d(a, 2, stride=1)", {{3, 6}}, {},
     [](auto& v) { return max_pool1d(v[0], {2}, {1}); }},
    // avg_pool2d: count_include_pad with and without, ceil_mode, non-square, unbatched
    {"avg_pool2d", "F.avg_pool2d(a, 2)", {{2, 3, 7, 6}}, {},
     [](auto& v) { return avg_pool2d(v[0], {2}); }},
    {"avg_pool2d stride padding", "F.avg_pool2d(a, 3, stride=2, padding=1)", {{2, 3, 7, 6}}, {},
     [](auto& v) { return avg_pool2d(v[0], {3}, {2}, {1}); }},
    {"avg_pool2d padding without count_include_pad",
     "F.avg_pool2d(a, 3, stride=2, padding=1, count_include_pad=False)", {{2, 3, 7, 6}}, {},
     [](auto& v) { return avg_pool2d(v[0], {3}, {2}, {1}, false, false); }},
    {"avg_pool2d ceil_mode", "F.avg_pool2d(a, 2, ceil_mode=True)", {{2, 3, 7, 5}}, {},
     [](auto& v) { return avg_pool2d(v[0], {2}, {}, {0}, true); }},
    {"avg_pool2d ceil_mode padding", "F.avg_pool2d(a, 3, stride=2, padding=1, ceil_mode=True)",
     {{1, 2, 6, 8}}, {},
     [](auto& v) { return avg_pool2d(v[0], {3}, {2}, {1}, true); }},
    {"avg_pool2d ceil_mode padding without count_include_pad",
     "F.avg_pool2d(a, 3, stride=2, padding=1, ceil_mode=True, count_include_pad=False)",
     {{1, 2, 6, 8}}, {},
     [](auto& v) { return avg_pool2d(v[0], {3}, {2}, {1}, true, false); }},
    {"avg_pool2d non-square kernel and stride", "F.avg_pool2d(a, (3, 1), stride=(2, 1), padding=(1, 0))",
     {{2, 2, 6, 4}}, {},
     [](auto& v) { return avg_pool2d(v[0], {3, 1}, {2, 1}, {1, 0}); }},
    {"avg_pool2d unbatched", "F.avg_pool2d(a, 2, stride=1)", {{3, 4, 5}}, {},
     [](auto& v) { return avg_pool2d(v[0], {2}, {1}); }},
    // avg_pool1d
    {"avg_pool1d", "F.avg_pool1d(a, 3)", {{2, 3, 9}}, {},
     [](auto& v) { return avg_pool1d(v[0], {3}); }},
    {"avg_pool1d stride padding ceil_mode", "F.avg_pool1d(a, 4, stride=3, padding=2, ceil_mode=True)",
     {{2, 2, 8}}, {},
     [](auto& v) { return avg_pool1d(v[0], {4}, {3}, {2}, true); }},
    {"avg_pool1d without count_include_pad",
     "F.avg_pool1d(a, 3, stride=2, padding=1, count_include_pad=False)", {{2, 3, 8}}, {},
     [](auto& v) { return avg_pool1d(v[0], {3}, {2}, {1}, false, false); }},
    {"avg_pool1d unbatched", "F.avg_pool1d(a, 2)", {{3, 7}}, {},
     [](auto& v) { return avg_pool1d(v[0], {2}); }},
    // adaptive_avg_pool2d / 1d: non-divisors (7x5 -> 3x2, 5 -> 3), divisors, more outputs than
    // inputs, output 1. Output 1 is kEdgeDiffers: torch takes a mean there, which gives NaN over an
    // empty spatial dim where Ember (as torch at any other output size) raises. Batched rows run
    // torch on the (N·C, …) planes as one unbatched input: torch 1.13's backward raises on zero
    // channels (its forward does not), the same pooling of planes does not.
    {"adaptive_avg_pool2d", "F.adaptive_avg_pool2d(a.flatten(0, 1), (3, 2)).view(a.shape[0], a.shape[1], 3, 2)", {{2, 3, 7, 5}}, {},
     [](auto& v) { return adaptive_avg_pool2d(v[0], {3, 2}); }},
    {"adaptive_avg_pool2d divisor", "F.adaptive_avg_pool2d(a.flatten(0, 1), (2, 3)).view(a.shape[0], a.shape[1], 2, 3)",
     {{2, 2, 4, 6}}, {},
     [](auto& v) { return adaptive_avg_pool2d(v[0], {2, 3}); }},
    {"adaptive_avg_pool2d larger output", "F.adaptive_avg_pool2d(a.flatten(0, 1), 5).view(a.shape[0], a.shape[1], 5, 5)", {{1, 2, 3, 4}}, {},
     [](auto& v) { return adaptive_avg_pool2d(v[0], {5}); }},
    {"adaptive_avg_pool2d output 1", "F.adaptive_avg_pool2d(a, 1)", {{2, 3, 5, 4}}, {},
     [](auto& v) { return adaptive_avg_pool2d(v[0], {1}); }, kEdgeDiffers},
    {"adaptive_avg_pool2d unbatched", "F.adaptive_avg_pool2d(a, (2, 3))", {{3, 5, 7}}, {},
     [](auto& v) { return adaptive_avg_pool2d(v[0], {2, 3}); }},
    {"adaptive_avg_pool1d", "F.adaptive_avg_pool1d(a.flatten(0, 1), 3).view(a.shape[0], a.shape[1], 3)", {{2, 3, 5}}, {},
     [](auto& v) { return adaptive_avg_pool1d(v[0], {3}); }},
    {"adaptive_avg_pool1d output 1", "F.adaptive_avg_pool1d(a, 1)", {{2, 3, 6}}, {},
     [](auto& v) { return adaptive_avg_pool1d(v[0], {1}); }, kEdgeDiffers},
    {"adaptive_avg_pool1d unbatched", "F.adaptive_avg_pool1d(a, 4)", {{3, 10}}, {},
     [](auto& v) { return adaptive_avg_pool1d(v[0], {4}); }},
    // pooling after pooling: the second reads the first's output and its backward feeds the first's
    {"max_pool2d then avg_pool2d", "F.avg_pool2d(F.max_pool2d(a, 2, stride=1), 2, padding=1)",
     {{2, 2, 6, 5}}, {},
     [](auto& v) { return avg_pool2d(max_pool2d(v[0], {2}, {1}), {2}, {}, {1}); }},
};
// clang-format on

// x padded by p on both sides of dims 2 and 3 with `fill`.
Tensor pad_with(const Tensor& x, int64_t p, double fill) {
  Shape rows = x.shape();
  rows[2] = p;
  const Tensor tall = cat({full(rows, fill, x.dtype()), x, full(rows, fill, x.dtype())}, 2);
  Shape cols = tall.shape();
  cols[3] = p;
  return cat({full(cols, fill, x.dtype()), tall, full(cols, fill, x.dtype())}, 3);
}

// Pooling with a k x k window, stride s, padding p, composed of strided slices of the padded
// input: the max (padding -inf) or the mean counting the padding (padding 0).
Tensor pooled_by_slices(const Tensor& x, int64_t k, int64_t s, int64_t p, bool max) {
  const Tensor xp = pad_with(x, p, max ? -std::numeric_limits<double>::infinity() : 0.0);
  const int64_t OH = (x.size(2) + 2 * p - k) / s + 1, OW = (x.size(3) + 2 * p - k) / s + 1;
  Tensor out;
  for (int64_t i = 0; i < k; ++i)
    for (int64_t j = 0; j < k; ++j) {
      const Tensor tap =
          xp.slice(2, i, i + (OH - 1) * s + 1, s).slice(3, j, j + (OW - 1) * s + 1, s);
      out = !out.defined() ? tap : max ? maximum(out, tap) : out + tap;
    }
  return max ? out : out / static_cast<double>(k * k);
}

// adaptive_avg_pool2d composed of means over narrowed windows.
Tensor adaptive_by_narrow(const Tensor& x, int64_t OH, int64_t OW) {
  const int64_t H = x.size(2), W = x.size(3);
  std::vector<Tensor> rows;
  for (int64_t i = 0; i < OH; ++i) {
    std::vector<Tensor> row;
    const int64_t h0 = i * H / OH, h1 = ((i + 1) * H + OH - 1) / OH;
    for (int64_t j = 0; j < OW; ++j) {
      const int64_t w0 = j * W / OW, w1 = ((j + 1) * W + OW - 1) / OW;
      row.push_back(x.narrow(2, h0, h1 - h0).narrow(3, w0, w1 - w0).mean({2, 3}));
    }
    rows.push_back(stack(row, -1));
  }
  return stack(rows, -2);
}

// The value of f(x) and the gradient of sum(f(x) * up).
struct ValueAndGrad {
  Tensor value, grad;
};
ValueAndGrad value_and_grad(const std::function<Tensor(const Tensor&)>& f, const Tensor& x,
                            const Tensor& up) {
  const Tensor leaf = x.detach().clone().requires_grad_();
  const Tensor y = f(leaf);
  y.backward(up);
  return {y.detach(), leaf.grad()};
}

}  // namespace

BOOST_AUTO_TEST_SUITE(test_pool)

BOOST_AUTO_TEST_CASE(table_gradcheck) { check_gradients(kPoolOps); }
BOOST_AUTO_TEST_CASE(table_gradgradcheck) { check_gradgradients(kPoolOps); }
BOOST_AUTO_TEST_CASE(table_forward_ad) { check_forward_gradients(kPoolOps); }
BOOST_AUTO_TEST_CASE(table_forward_over_forward) { check_forward_over_forward(kPoolOps); }
BOOST_AUTO_TEST_CASE(table_forward_over_reverse) { check_forward_over_reverse(kPoolOps); }
BOOST_AUTO_TEST_CASE(table_create_graph_gradients) { check_create_graph_gradients(kPoolOps); }
BOOST_AUTO_TEST_CASE(table_golden) { check_golden(kPoolOps); }
BOOST_AUTO_TEST_CASE(table_edge_cases) { check_edge_cases(kPoolOps); }
BOOST_AUTO_TEST_CASE(table_edge_shapes) { check_edge_shapes(kPoolOps); }
BOOST_AUTO_TEST_CASE(table_anomaly) { check_anomaly(kPoolOps); }
BOOST_AUTO_TEST_CASE(table_on_device) { check_on_device(kPoolOps); }
BOOST_AUTO_TEST_CASE(table_forward_ad_on_device) { check_forward_on_device(kPoolOps); }

// 128 planes of 31 x 30 (the kernels split the planes across threads from ~70 of this size),
// against pooling composed of slices and means, values and gradients, on a transposed input too.
BOOST_AUTO_TEST_CASE(parallel_planes_match_composed_pooling) {
  manual_seed(11);
  const Tensor x = randn({8, 16, 31, 30}, kFloat64);
  const Tensor xt = randn({30, 16, 31, 8}, kFloat64).transpose(0, 3);
  for (const Tensor& in : {x, xt}) {
    expect_close(max_pool2d(in, {3}, {2}, {1}), pooled_by_slices(in, 3, 2, 1, true), 0, 0,
                 "max_pool2d value");
    // 2x2 windows of stride 2, the CNNs' pool
    expect_close(max_pool2d(in, {2}), pooled_by_slices(in, 2, 2, 0, true), 0, 0,
                 "max_pool2d 2x2 value");
    const Tensor up2 = randn({8, 16, 15, 15}, kFloat64);
    expect_close(
        value_and_grad([](const Tensor& t) { return max_pool2d(t, {2}); }, in, up2).grad,
        value_and_grad([](const Tensor& t) { return pooled_by_slices(t, 2, 2, 0, true); }, in, up2)
            .grad,
        1e-12, 1e-12, "max_pool2d 2x2 gradient");
    // odd height and width: the last row and column are in no window and get no gradient
    const Tensor odd = randn({2, 3, 5, 7}, kFloat64), up_odd = randn({2, 3, 2, 3}, kFloat64);
    expect_close(
        value_and_grad([](const Tensor& t) { return max_pool2d(t, {2}); }, odd, up_odd).grad,
        value_and_grad([](const Tensor& t) { return pooled_by_slices(t, 2, 2, 0, true); }, odd,
                       up_odd)
            .grad,
        0, 0, "max_pool2d 2x2 gradient, odd sizes");
    const Tensor up = randn({8, 16, 16, 15}, kFloat64);
    const auto grad_of = [&](const std::function<Tensor(const Tensor&)>& f) {
      return value_and_grad(f, in, up).grad;
    };
    expect_close(grad_of([](const Tensor& t) { return max_pool2d(t, {3}, {2}, {1}); }),
                 grad_of([](const Tensor& t) { return pooled_by_slices(t, 3, 2, 1, true); }), 1e-12,
                 1e-12, "max_pool2d gradient");
    expect_close(grad_of([](const Tensor& t) { return avg_pool2d(t, {3}, {2}, {1}); }),
                 grad_of([](const Tensor& t) { return pooled_by_slices(t, 3, 2, 1, false); }),
                 1e-12, 1e-12, "avg_pool2d gradient");
    expect_close(avg_pool2d(in, {3}, {2}, {1}), pooled_by_slices(in, 3, 2, 1, false), 1e-12, 1e-12,
                 "avg_pool2d value");
    const Tensor up7 = randn({8, 16, 7, 5}, kFloat64);
    const ValueAndGrad a = value_and_grad(
        [](const Tensor& t) {
          return adaptive_avg_pool2d(t, {7, 5});
        },
        in, up7);
    const ValueAndGrad b =
        value_and_grad([](const Tensor& t) { return adaptive_by_narrow(t, 7, 5); }, in, up7);
    expect_close(a.value, b.value, 1e-12, 1e-12, "adaptive_avg_pool2d value");
    expect_close(a.grad, b.grad, 1e-12, 1e-12, "adaptive_avg_pool2d gradient");
  }
}

BOOST_AUTO_TEST_CASE(float32_agrees_with_float64) {
  manual_seed(12);
  const Tensor x = randn({4, 5, 13, 11}, kFloat64);
  const std::vector<std::function<Tensor(const Tensor&)>> ops = {
      [](const Tensor& t) { return max_pool2d(t, {3}, {2}, {1}, {1}, true); },
      [](const Tensor& t) {
        return avg_pool2d(t, {3, 2}, {2}, {1}, true, false);
      },
      [](const Tensor& t) {
        return adaptive_avg_pool2d(t, {4, 3});
      },
      [](const Tensor& t) { return max_pool1d(t.flatten(2), {4}, {3}, {2}, {2}); },
      [](const Tensor& t) { return avg_pool1d(t.flatten(2), {5}, {3}, {2}); },
      [](const Tensor& t) { return adaptive_avg_pool1d(t.flatten(2), {9}); },
  };
  for (size_t i = 0; i < ops.size(); ++i) {
    const Tensor up = randn(ops[i](x).shape(), kFloat64);
    const ValueAndGrad d = value_and_grad(ops[i], x, up);
    const ValueAndGrad f = value_and_grad(ops[i], x.to(kFloat32), up.to(kFloat32));
    BOOST_TEST((f.value.dtype() == kFloat32 && f.grad.dtype() == kFloat32));
    expect_close(f.value.to(kFloat64), d.value, 1e-5, 1e-6, fmt::format("op {} value", i));
    expect_close(f.grad.to(kFloat64), d.grad, 1e-5, 1e-6, fmt::format("op {} gradient", i));
  }
}

// NaN wins its window (the last NaN's index, as torch); -inf windows point at their first
// element; a window wholly in the padding gives -inf, torch's index, and no gradient.
BOOST_AUTO_TEST_CASE(max_pool_nan_inf_and_padding_windows) {
  const double nan = std::numeric_limits<double>::quiet_NaN(),
               inf = std::numeric_limits<double>::infinity();
  const Tensor x = from_vector(std::vector<double>{1, nan, 3, nan, 2, 5}, {1, 1, 1, 6}, kFloat64);
  const MaxPoolResult r = max_pool2d_with_indices(x, {1, 3});
  const std::vector<double> v = r.values.to_vector<double>();
  BOOST_TEST((std::isnan(v[0]) && std::isnan(v[1])));
  BOOST_TEST((r.indices.to_vector<int64_t>() == std::vector<int64_t>{1, 3}));

  const MaxPoolResult all_inf =
      max_pool2d_with_indices(full({1, 1, 2, 2}, -inf, kFloat64), {2}, {}, {1});
  BOOST_TEST((all_inf.indices.to_vector<int64_t>() == std::vector<int64_t>{0, 1, 2, 3}));

  // the same in 2x2 windows of stride 2 (the CNNs' pool), Float32 and Float64: the last NaN,
  // the first of equal maxima, the first tap of an all -inf window
  for (const DType dtype : {kFloat32, kFloat64}) {
    const Tensor q = from_vector(std::vector<double>{nan, 1, 7, 7, -inf, -inf, 2, 5,  //
                                                     0, nan, 7, 7, -inf, -inf, 5, 2},
                                 {1, 1, 2, 8}, dtype);
    const MaxPoolResult p = max_pool2d_with_indices(q, {2});
    const std::vector<double> pv = p.values.to(kFloat64).to_vector<double>();
    BOOST_TEST(std::isnan(pv[0]));
    BOOST_TEST((std::vector<double>(pv.begin() + 1, pv.end()) == std::vector<double>{7, -inf, 5}));
    BOOST_TEST((p.indices.to_vector<int64_t>() == std::vector<int64_t>{9, 2, 4, 7}));
  }

  // L = 1, kernel 2, padding 1, dilation 2: the one window's taps are -1 and 1, both padding
  const Tensor leaf = full({1, 1, 1, 1}, 0.5, kFloat64).requires_grad_();
  const MaxPoolResult empty_window = max_pool2d_with_indices(leaf, {1, 2}, {1}, {0, 1}, {1, 2});
  BOOST_TEST(empty_window.values.item<double>() == -inf);
  BOOST_TEST(empty_window.indices.item<int64_t>() == 1);  // torch's
  empty_window.values.sum().backward();
  BOOST_TEST(leaf.grad().item<double>() == 0.0);
  const Tensor leaf1 = full({1, 1}, 0.5, kFloat64).requires_grad_();
  const Tensor twice = max_pool1d(leaf1, {2}, {1}, {1}, {2});
  const Tensor g = autograd::grad({twice.sum()}, {leaf1}, {}, std::nullopt, true)[0];
  BOOST_TEST(g.item<double>() == 0.0);
}

// Float32 2x2 pooling of stride 2 (Notes [2x2 pooling rows in AVX-512] and [2x2 pooling rows in
// AVX2] in ops/pool.cpp) against the general kernel (the same input with a non-unit column
// stride): rows of 7 to 33 windows (one to five vector blocks, partly filled), odd sizes, ties and
// NaNs; the values and indices the same to the bit, and the gradient each window's upstream value
// at its index, zeros elsewhere.
BOOST_AUTO_TEST_CASE(max_pool_2x2_float32_rows) {
  manual_seed(21);
  for (const int64_t W : {14, 15, 28, 32, 34, 66}) {
    for (const int64_t H : {4, 5}) {
      Tensor x = clamp(randn({3, 5, H, W}) * 2, -1.0, 1.0);  // many ties at -1 and 1
      x.view({-1}).narrow(0, 7, 1).fill_(std::nan(""));
      x.view({-1}).narrow(0, 2 * W + 3, 1).fill_(std::nan(""));
      const Tensor strided = x.transpose(2, 3).contiguous().transpose(2, 3);
      const MaxPoolResult fast = max_pool2d_with_indices(x, {2});
      const MaxPoolResult general = max_pool2d_with_indices(strided, {2});
      const std::string what = fmt::format("H {} W {}", H, W);
      expect_close(fast.values, general.values, 0, 0, what + " values");
      BOOST_TEST((fast.indices.to_vector<int64_t>() == general.indices.to_vector<int64_t>()),
                 what << " indices");
      const Tensor leaf = x.clone().requires_grad_();
      const Tensor up = randn(fast.values.shape());
      max_pool2d(leaf, {2}).backward(up);
      const int64_t P = 15, O = (H / 2) * (W / 2);
      const Tensor expected =
          scatter_add(zeros({P, H * W}), 1, fast.indices.reshape({P, O}), up.reshape({P, O}));
      expect_close(leaf.grad(), expected.reshape(x.shape()), 0, 0, what + " gradient");
    }
  }
}

// An empty batch gives an empty result with a gradient of the input's shape.
BOOST_AUTO_TEST_CASE(empty_batch) {
  const std::vector<std::function<Tensor(const Tensor&)>> ops = {
      [](const Tensor& t) { return max_pool2d(t, {2}); },
      [](const Tensor& t) { return avg_pool2d(t, {3}, {2}, {1}); },
      [](const Tensor& t) {
        return adaptive_avg_pool2d(t, {3, 2});
      },
  };
  for (const auto& f : ops) {
    const Tensor x = zeros({0, 3, 7, 6}, kFloat64).requires_grad_();
    const Tensor y = f(x);
    BOOST_TEST((y.size(0) == 0 && y.size(1) == 3 && y.dim() == 4));
    y.sum().backward();
    BOOST_TEST((x.grad().shape() == x.shape()));
  }
  BOOST_TEST((max_pool1d(zeros({0, 2, 5}), {2}).shape() == Shape{0, 2, 2}));
}

BOOST_AUTO_TEST_CASE(error_messages) {
  const Tensor x = zeros({2, 3, 7, 6}), x1 = zeros({2, 3, 7});
  expect_error(
      [&] {
        max_pool2d(x, {2, 2, 2});
      },
      {"max_pool2d: kernel_size must have 1 or 2 values, got 3"});
  expect_error([&] { max_pool2d(x, {}); }, {"max_pool2d: kernel_size must have 1 or 2 values"});
  expect_error(
      [&] {
        max_pool1d(x1, {2}, {1, 1});
      },
      {"max_pool1d: stride must have 1 or 1 values, got 2"});
  expect_error(
      [&] {
        avg_pool2d(x, {2}, {}, {0, 0, 0});
      },
      {"avg_pool2d: padding must have 1 or 2 values, got 3"});
  expect_error(
      [&] {
        max_pool2d_with_indices(x, {2}, {}, {0}, {1, 1, 1});
      },
      {"max_pool2d_with_indices: dilation must have 1 or 2 values"});
  expect_error([&] { max_pool2d(x, {2}, {0}); }, {"max_pool2d: stride must be positive", "[0, 0]"});
  expect_error([&] { avg_pool1d(x1, {2}, {-1}); }, {"avg_pool1d: stride must be positive", "[-1]"});
  expect_error(
      [&] {
        max_pool2d(x, {2, 0});
      },
      {"max_pool2d: kernel_size must be positive", "[2, 0]"});
  expect_error([&] { avg_pool2d(x, {-2}); }, {"avg_pool2d: kernel_size must be positive"});
  expect_error([&] { max_pool1d(x1, {2}, {}, {0}, {0}); },
               {"max_pool1d: dilation must be positive"});
  expect_error([&] { max_pool2d(x, {3}, {1}, {2}); },
               {"max_pool2d: padding must be between 0 and half of kernel_size", "padding [2, 2]",
                "kernel_size [3, 3]"});
  expect_error([&] { avg_pool1d(x1, {2}, {}, {-1}); }, {"avg_pool1d: padding must be between 0"});
  expect_error(
      [&] {
        max_pool2d(zeros({1, 1, 2, 5}), {3});
      },
      {"max_pool2d: output size [0, 1] is too small", "[1, 1, 2, 5]"});
  expect_error(
      [&] {
        max_pool1d(zeros({1, 1, 3}), {3}, {1}, {0}, {2});
      },
      {"max_pool1d: output size [-1] is too small", "dilation [2]"});
  expect_error([&] { avg_pool2d(zeros({1, 1, 1, 1}), {2}); }, {"avg_pool2d: output size"});
  expect_error([&] { max_pool2d(zeros({5}), {2}); },
               {"max_pool2d: expected a 3-D (unbatched) or 4-D (batched) input", "[5]"});
  expect_error([&] { avg_pool1d(x, {2}); }, {"avg_pool1d: expected a 2-D (unbatched) or 3-D"});
  expect_error(
      [&] {
        adaptive_avg_pool2d(zeros({1, 2, 3, 4, 5}), {2});
      },
      {"adaptive_avg_pool2d: expected a 3-D (unbatched) or 4-D"});
  expect_error(
      [&] {
        max_pool2d(zeros({2, 0, 4, 4}), {2});
      },
      {"max_pool2d: expected non-empty channel and spatial dims", "[2, 0, 4, 4]"});
  expect_error([&] { avg_pool1d(zeros({3, 0}), {2}); }, {"avg_pool1d: expected non-empty"});
  expect_error(
      [&] {
        max_pool2d(zeros({2, 3}, kInt64), {2});
      },
      {"max_pool2d: expected a Float32 or Float64 tensor"});
  expect_error(
      [&] {
        adaptive_avg_pool2d(x, {2, -1});
      },
      {"adaptive_avg_pool2d: output_size must be non-negative, got [2, -1]"});
  expect_error(
      [&] {
        adaptive_avg_pool1d(x1, {2, 2});
      },
      {"adaptive_avg_pool1d: output_size must have 1 or 1 values, got 2"});
  expect_error(
      [&] {
        adaptive_avg_pool2d(zeros({1, 2, 0, 3}), {2});
      },
      {"adaptive_avg_pool2d: expected non-empty spatial dims", "[1, 2, 0, 3]"});
  // adaptive output 0 and zero channels are fine, as torch
  BOOST_TEST((adaptive_avg_pool2d(x, {0, 2}).shape() == Shape{2, 3, 0, 2}));
  BOOST_TEST((adaptive_avg_pool1d(zeros({2, 0, 4}), {2}).shape() == Shape{2, 0, 2}));
}

// The modules keep their options, hold no state, and run in a Sequential as their functions.
BOOST_AUTO_TEST_CASE(modules_in_sequential) {
  manual_seed(13);
  nn::Sequential net(
      std::make_shared<nn::MaxPool2d>(IntList{2}),
      std::make_shared<nn::AvgPool2d>(IntList{3}, IntList{1}, IntList{1}, false, false),
      std::make_shared<nn::AdaptiveAvgPool2d>(IntList{2, 1}));
  BOOST_TEST(net.parameters().empty());
  BOOST_TEST(net.state_dict().empty());
  const auto& avg = static_cast<const nn::AvgPool2d&>(*net[1]);
  BOOST_TEST((avg.kernel_size == IntList{3} && avg.stride == IntList{1} &&
              avg.padding == IntList{1} && !avg.ceil_mode && !avg.count_include_pad));
  const auto& mp = static_cast<const nn::MaxPool2d&>(*net[0]);
  BOOST_TEST((mp.kernel_size == IntList{2} && mp.stride.empty() && mp.padding == IntList{0} &&
              mp.dilation == IntList{1} && !mp.ceil_mode));
  const Tensor x = randn({2, 3, 8, 9}, kFloat64);
  const Tensor y = net.forward(x);
  BOOST_TEST((y.shape() == Shape{2, 3, 2, 1}));
  expect_close(
      y, adaptive_avg_pool2d(avg_pool2d(max_pool2d(x, {2}), {3}, {1}, {1}, false, false), {2, 1}),
      0, 0, "Sequential of 2-D pools");
  BOOST_TEST((net.forward(x.select(0, 1)).shape() == Shape{3, 2, 1}));  // unbatched
  const auto copy = std::static_pointer_cast<nn::Sequential>(net.clone());
  expect_close(copy->forward(x), y, 0, 0, "clone");

  nn::Sequential net1(
      std::make_shared<nn::MaxPool1d>(IntList{3}, IntList{2}, IntList{1}, IntList{1}, true),
      std::make_shared<nn::AvgPool1d>(IntList{2}),
      std::make_shared<nn::AdaptiveAvgPool1d>(IntList{3}));
  const Tensor x1 = randn({2, 4, 17}, kFloat64).requires_grad_();
  const Tensor y1 = net1.forward(x1);
  BOOST_TEST((y1.shape() == Shape{2, 4, 3}));
  expect_close(y1,
               adaptive_avg_pool1d(avg_pool1d(max_pool1d(x1, {3}, {2}, {1}, {1}, true), {2}), {3}),
               0, 0, "Sequential of 1-D pools");
  y1.sum().backward();
  BOOST_TEST((x1.grad().shape() == x1.shape()));
  const auto& mp1 = static_cast<const nn::MaxPool1d&>(*net1[0]);
  BOOST_TEST((mp1.ceil_mode && mp1.stride == IntList{2}));
  const auto& ad1 = static_cast<const nn::AdaptiveAvgPool1d&>(*net1[2]);
  BOOST_TEST((ad1.output_size == IntList{3}));
  expect_error([&] { nn::MaxPool2d({2}, {0}).forward(x); },
               {"max_pool2d: stride must be positive"});
}

BOOST_AUTO_TEST_SUITE_END()
