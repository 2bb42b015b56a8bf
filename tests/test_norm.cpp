// batch_norm, group_norm, pad and interpolate: one table of cases (tests/op_table.h) drives
// gradcheck and gradgradcheck on several layouts, the backward in ops (create_graph) against the
// kernels', the PyTorch golden values and gradients, the edge cases and shapes, anomaly mode and
// the emulated device; then the running statistics over training steps and the modules
// BatchNorm1d, BatchNorm2d and GroupNorm against torch (tests/golden/norm.json), the parallel
// kernels against the ops, and every error message.
#include <boost/test/unit_test.hpp>

#include "tests/edge_shapes.h"
#include "tests/forward_over_forward.h"

using namespace ember;
using namespace ember::testing;

namespace {

// One row per op case; tests/op_table.h says what the fields mean. After adding or changing a
// row, run /usr/bin/python3 tests/golden/gen_op_tables.py. batch_norm's rows in training pass no
// running statistics (their in-place update is tested below against torch). In eval, torch
// refuses running statistics that require grad; Ember differentiates through them (ops/norm.h),
// so the torch expression adds the running statistics' term with the value zero and their
// derivative: q - q.detach().
// kEdgeDiffers, batch_norm with per-channel arguments: torch returns an empty input unchecked
// (its shortcut for empty inputs then multiplies by weight[0], an error when C is 0), Ember checks
// the per-channel shapes of every input and returns an empty result for C = 0; the rows without
// them keep the edge shapes, and norm_empty_batch_gradients tests the empty batch with weight and
// bias. group_norm with weight over empty spatial dims: torch's weight gradient is NaN (a mean of
// no element enters it), Ember's the sum over no element, 0 (norm_empty_batch_gradients); the
// 2-D and no-affine rows keep the edge shapes.
// clang-format off
const OpTable kNormOps = {
    // batch_norm in training: batch statistics over every dim but C
    {"batch_norm train 2-D", "F.batch_norm(a, None, None, b, c, True)", {{4, 3}, {3}, {3}}, {},
     [](auto& v) { return batch_norm(v[0], {}, {}, v[1], v[2], true); }, kOptionalInputs | kEdgeDiffers},
    {"batch_norm train 3-D", "F.batch_norm(a, None, None, b, c, True)", {{3, 2, 4}, {2}, {2}}, {},
     [](auto& v) { return batch_norm(v[0], {}, {}, v[1], v[2], true); }, kOptionalInputs | kEdgeDiffers},
    {"batch_norm train 4-D", "F.batch_norm(a, None, None, b, c, True)", {{2, 3, 2, 3}, {3}, {3}}, {},
     [](auto& v) { return batch_norm(v[0], {}, {}, v[1], v[2], true); }, kOptionalInputs | kEdgeDiffers},
    {"batch_norm train no affine", "F.batch_norm(a, None, None, training=True)", {{3, 2, 5}}, {},
     [](auto& v) { return batch_norm(v[0], {}, {}, {}, {}, true); }},
    {"batch_norm train weight only eps", "F.batch_norm(a, None, None, b, None, True, eps=1e-3)",
     {{2, 3, 3}, {3}}, {},
     [](auto& v) { return batch_norm(v[0], {}, {}, v[1], {}, true, 0.1, 1e-3); }, kOptionalInputs | kEdgeDiffers},
    {"batch_norm train 4-D no affine", "F.batch_norm(a, None, None, training=True)", {{3, 2, 2, 2}}, {},
     [](auto& v) { return batch_norm(v[0], {}, {}, {}, {}, true); }},
    // batch_norm in eval: the running statistics (Positive variances)
    {"batch_norm eval 3-D",
     "F.batch_norm(a, b.detach(), c.detach(), d, e) + "
     "(q := (a.detach() - b[:, None]) * (c[:, None] + 1e-5).rsqrt() * d.detach()[:, None]) - q.detach()",
     {{3, 2, 4}, {2}, {2}, {2}, {2}}, {Real, Real, Positive},
     [](auto& v) { return batch_norm(v[0], v[1], v[2], v[3], v[4]); }, kOptionalInputs | kEdgeDiffers},
    {"batch_norm eval 2-D",
     "F.batch_norm(a, b.detach(), c.detach(), d, e) + "
     "(q := (a.detach() - b) * (c + 1e-5).rsqrt() * d.detach()) - q.detach()",
     {{4, 3}, {3}, {3}, {3}, {3}}, {Real, Real, Positive},
     [](auto& v) { return batch_norm(v[0], v[1], v[2], v[3], v[4], false); }, kOptionalInputs | kEdgeDiffers},
    {"batch_norm eval 4-D no affine",
     "F.batch_norm(a, b.detach(), c.detach(), eps=1e-3) + "
     "(q := (a.detach() - b[:, None, None]) * (c[:, None, None] + 1e-3).rsqrt()) - q.detach()",
     {{2, 3, 2, 2}, {3}, {3}}, {Real, Real, Positive},
     [](auto& v) { return batch_norm(v[0], v[1], v[2], {}, {}, false, 0.1, 1e-3); }, kOptionalInputs | kEdgeDiffers},
    // batch_norm_relu: relu(batch_norm(…)) in one op, fused in training on the CPU
    {"batch_norm_relu train 2-D", "F.relu(F.batch_norm(a, None, None, b, c, True))",
     {{5, 3}, {3}, {3}}, {},
     [](auto& v) { return batch_norm_relu(v[0], {}, {}, v[1], v[2], true); }, kOptionalInputs | kEdgeDiffers},
    {"batch_norm_relu train 4-D", "F.relu(F.batch_norm(a, None, None, b, c, True))",
     {{2, 3, 2, 3}, {3}, {3}}, {},
     [](auto& v) { return batch_norm_relu(v[0], {}, {}, v[1], v[2], true); }, kOptionalInputs | kEdgeDiffers},
    {"batch_norm_relu train 3-D no affine eps", "F.relu(F.batch_norm(a, None, None, training=True, eps=1e-3))",
     {{3, 2, 5}}, {},
     [](auto& v) { return batch_norm_relu(v[0], {}, {}, {}, {}, true, 0.1, 1e-3); }},
    {"batch_norm_relu eval 4-D",
     "F.relu(F.batch_norm(a, b.detach(), c.detach(), d, e) + "
     "(q := (a.detach() - b[:, None, None]) * (c[:, None, None] + 1e-5).rsqrt() * d.detach()[:, None, None]) - q.detach())",
     {{2, 3, 2, 2}, {3}, {3}, {3}, {3}}, {Real, Real, Positive},
     [](auto& v) { return batch_norm_relu(v[0], v[1], v[2], v[3], v[4]); }, kOptionalInputs | kEdgeDiffers},
    // group_norm
    {"group_norm 3-D 2 groups", "F.group_norm(a, 2, b, c)", {{2, 4, 3}, {4}, {4}}, {},
     [](auto& v) { return group_norm(v[0], 2, v[1], v[2]); }, kOptionalInputs | kEdgeDiffers},
    {"group_norm 4-D 3 groups", "F.group_norm(a, 3, b, c)", {{2, 6, 2, 2}, {6}, {6}}, {},
     [](auto& v) { return group_norm(v[0], 3, v[1], v[2]); }, kOptionalInputs | kEdgeDiffers},
    {"group_norm 4-D 1 group", "F.group_norm(a, 1, b, c)", {{2, 3, 2, 3}, {3}, {3}}, {},
     [](auto& v) { return group_norm(v[0], 1, v[1], v[2]); }, kOptionalInputs | kEdgeDiffers},
    {"group_norm group per channel", "F.group_norm(a, 4, b, c, eps=1e-3)", {{3, 4, 5}, {4}, {4}}, {},
     [](auto& v) { return group_norm(v[0], 4, v[1], v[2], 1e-3); }, kOptionalInputs | kEdgeDiffers},
    {"group_norm no affine", "F.group_norm(a, 2)", {{2, 4, 3, 2}}, {},
     [](auto& v) { return group_norm(v[0], 2); }},
    {"group_norm 2-D", "F.group_norm(a, 2, b, c)", {{3, 4}, {4}, {4}}, {},
     [](auto& v) { return group_norm(v[0], 2, v[1], v[2]); }, kOptionalInputs},
    // pad: constant (negative pads crop), reflect, replicate, circular
    {"pad constant last dim", "F.pad(a, (1, 2))", {{2, 3, 4}}, {},
     [](auto& v) { return pad(v[0], {1, 2}); }},
    {"pad constant 2-D value", "F.pad(a, (1, 0, 2, 1), value=0.5)", {{2, 2, 3, 3}}, {},
     [](auto& v) { return pad(v[0], {1, 0, 2, 1}, "constant", 0.5); }},
    {"pad constant negative", "F.pad(a, (-1, 2, 1, -2))", {{2, 3, 4, 5}}, {},
     [](auto& v) { return pad(v[0], {-1, 2, 1, -2}); }},
    {"pad constant every dim", "F.pad(a, (1, 1, 0, 1, 2, 0))", {{2, 3, 2}}, {},
     [](auto& v) { return pad(v[0], {1, 1, 0, 1, 2, 0}); }},
    {"pad reflect 1-D", "F.pad(a, (2, 1), 'reflect')", {{2, 3, 4}}, {},
     [](auto& v) { return pad(v[0], {2, 1}, "reflect"); }},
    {"pad reflect 2-D", "F.pad(a, (1, 2, 2, 1), 'reflect')", {{1, 2, 3, 4}}, {},
     [](auto& v) { return pad(v[0], {1, 2, 2, 1}, "reflect"); }},
    {"pad reflect unbatched", "F.pad(a, (1, 1), 'reflect')", {{3, 4}}, {},
     [](auto& v) { return pad(v[0], {1, 1}, "reflect"); }},
    {"pad reflect negative", "F.pad(a, (-1, 2), 'reflect')", {{2, 2, 5}}, {},
     [](auto& v) { return pad(v[0], {-1, 2}, "reflect"); }},
    {"pad replicate 1-D", "F.pad(a, (3, 1), 'replicate')", {{2, 2, 3}}, {},
     [](auto& v) { return pad(v[0], {3, 1}, "replicate"); }},
    {"pad replicate 2-D", "F.pad(a, (2, 0, 1, 3), 'replicate')", {{2, 2, 3, 2}}, {},
     [](auto& v) { return pad(v[0], {2, 0, 1, 3}, "replicate"); }},
    {"pad circular 1-D", "F.pad(a, (2, 3), 'circular')", {{2, 2, 4}}, {},
     [](auto& v) { return pad(v[0], {2, 3}, "circular"); }},
    {"pad circular 2-D", "F.pad(a, (1, 2, 2, 1), 'circular')", {{1, 2, 3, 4}}, {},
     [](auto& v) { return pad(v[0], {1, 2, 2, 1}, "circular"); }},
    {"pad circular crop", "F.pad(a, (-1, -1, 1, 0), 'circular')", {{2, 1, 3, 4}}, {},
     [](auto& v) { return pad(v[0], {-1, -1, 1, 0}, "circular"); }},
    // interpolate: up and down, non-integer scales, align_corners
    {"interpolate nearest up", "F.interpolate(a, size=7)", {{2, 3, 5}}, {},
     [](auto& v) { return interpolate(v[0], {7}); }},
    {"interpolate nearest down", "F.interpolate(a, size=3)", {{2, 2, 7}}, {},
     [](auto& v) { return interpolate(v[0], {3}, "nearest"); }},
    {"interpolate nearest 2-D", "F.interpolate(a, size=(5, 3))", {{1, 2, 3, 4}}, {},
     [](auto& v) { return interpolate(v[0], {5, 3}); }},
    {"interpolate nearest doubled", "F.interpolate(a, size=(4, 6))", {{2, 1, 2, 3}}, {},
     [](auto& v) { return interpolate(v[0], {4, 6}); }},
    {"interpolate nearest 5-D", "F.interpolate(a, size=(3, 2, 3))", {{1, 2, 2, 3, 2}}, {},
     [](auto& v) { return interpolate(v[0], {3, 2, 3}); }},
    {"interpolate linear up", "F.interpolate(a, size=7, mode='linear', align_corners=False)",
     {{2, 3, 4}}, {}, [](auto& v) { return interpolate(v[0], {7}, "linear", false); }},
    {"interpolate linear align_corners", "F.interpolate(a, size=7, mode='linear', align_corners=True)",
     {{2, 2, 4}}, {}, [](auto& v) { return interpolate(v[0], {7}, "linear", true); }},
    {"interpolate linear down", "F.interpolate(a, size=3, mode='linear')", {{1, 2, 8}}, {},
     [](auto& v) { return interpolate(v[0], {3}, "linear"); }},
    {"interpolate linear down align_corners",
     "F.interpolate(a, size=3, mode='linear', align_corners=True)", {{2, 2, 5}}, {},
     [](auto& v) { return interpolate(v[0], {3}, "linear", true); }},
    {"interpolate bilinear up", "F.interpolate(a, size=(5, 7), mode='bilinear', align_corners=False)",
     {{2, 2, 3, 4}}, {}, [](auto& v) { return interpolate(v[0], {5, 7}, "bilinear", false); }},
    {"interpolate bilinear align_corners",
     "F.interpolate(a, size=(5, 3), mode='bilinear', align_corners=True)", {{1, 2, 3, 4}}, {},
     [](auto& v) { return interpolate(v[0], {5, 3}, "bilinear", true); }},
    {"interpolate bilinear down", "F.interpolate(a, size=(2, 3), mode='bilinear')", {{2, 1, 5, 7}}, {},
     [](auto& v) { return interpolate(v[0], {2, 3}, "bilinear"); }},
    {"interpolate bilinear one size", "F.interpolate(a, size=4, mode='bilinear', align_corners=True)",
     {{1, 3, 3, 2}}, {}, [](auto& v) { return interpolate(v[0], {4}, "bilinear", true); }},
};
// clang-format on

// Gradients of f at the leaves for the upstream gradient `up`.
std::vector<Tensor> grads_of(const std::function<Tensor(const std::vector<Tensor>&)>& f,
                             const std::vector<Tensor>& leaves, const Tensor& up) {
  return autograd::grad({f(leaves)}, leaves, {up});
}

}  // namespace

BOOST_AUTO_TEST_SUITE(test_norm)

BOOST_AUTO_TEST_CASE(table_gradcheck) { check_gradients(kNormOps); }
BOOST_AUTO_TEST_CASE(table_gradgradcheck) { check_gradgradients(kNormOps); }
BOOST_AUTO_TEST_CASE(table_forward_ad) { check_forward_gradients(kNormOps); }
BOOST_AUTO_TEST_CASE(table_forward_over_forward) { check_forward_over_forward(kNormOps); }
BOOST_AUTO_TEST_CASE(table_forward_over_reverse) { check_forward_over_reverse(kNormOps); }
BOOST_AUTO_TEST_CASE(table_create_graph_gradients) { check_create_graph_gradients(kNormOps); }
BOOST_AUTO_TEST_CASE(table_golden) { check_golden(kNormOps); }
BOOST_AUTO_TEST_CASE(table_edge_cases) { check_edge_cases(kNormOps); }
BOOST_AUTO_TEST_CASE(table_edge_shapes) { check_edge_shapes(kNormOps); }
BOOST_AUTO_TEST_CASE(table_anomaly) { check_anomaly(kNormOps); }
BOOST_AUTO_TEST_CASE(table_on_device) { check_on_device(kNormOps); }
BOOST_AUTO_TEST_CASE(table_forward_ad_on_device) { check_forward_on_device(kNormOps); }

// --- batch_norm's running statistics

// F.batch_norm's in-place update over the training steps of tests/golden/norm.json, on the
// functional op (Float64 and Float32), running statistics of the input's dtype.
BOOST_AUTO_TEST_CASE(batch_norm_running_statistics_match_torch) {
  const Golden g("norm.json");
  for (DType dt : {kFloat64, kFloat32}) {
    const double tol = dt == kFloat64 ? 1e-12 : 1e-5;
    Tensor rm = zeros({3}, dt), rv = ones({3}, dt);
    const Tensor w = g["bn2d.weight"].to(dt), b = g["bn2d.bias"].to(dt);
    for (int i = 0; i < 3; ++i) {
      const std::string step = std::to_string(i);
      const Tensor y = batch_norm(g["bn2d.x" + step].to(dt), rm, rv, w, b, true, 0.1, 1e-5);
      expect_close(y.to(kFloat64), g["bn2d.y" + step], tol, tol, "output, step " + step);
      expect_close(rm.to(kFloat64), g["bn2d.running_mean" + step], tol, tol, "mean, step " + step);
      expect_close(rv.to(kFloat64), g["bn2d.running_var" + step], tol, tol, "var, step " + step);
    }
    const Tensor y = batch_norm(g["bn2d.x_eval"].to(dt), rm, rv, w, b, false);
    expect_close(y.to(kFloat64), g["bn2d.y_eval"], tol, tol, "eval");
  }
}

// Strided running statistics (a column of a matrix) are updated where they lie; a training
// forward leaves them alone when the batch is empty.
BOOST_AUTO_TEST_CASE(batch_norm_running_statistics_strided_and_empty) {
  manual_seed(3);
  const Tensor x = randn({6, 4}, kFloat64) * 3 + 1;
  Tensor table = zeros({4, 2}, kFloat64);
  table.select(1, 1).fill_(1.0);
  Tensor rm = table.select(1, 0), rv = table.select(1, 1);
  batch_norm(x, rm, rv, {}, {}, true, 0.25);
  const Tensor mean = x.mean({0}), var = x.var({0}, true);
  expect_close(rm, mean * 0.25, 1e-12, 1e-14, "mean");
  expect_close(rv, var * 0.25 + 0.75, 1e-12, 1e-14, "var");
  const Tensor before = table.clone();
  const Tensor y = batch_norm(zeros({0, 4}, kFloat64), rm, rv, {}, {}, true);
  BOOST_TEST((y.shape() == Shape{0, 4}));
  expect_close(table, before, 0, 0, "untouched by an empty batch");
}

// On a device (composed of ops there) the running statistics move as on the CPU, and a module
// moved there counts its batches there.
BOOST_AUTO_TEST_CASE(batch_norm_running_statistics_on_device) {
  if (!cuda::is_available()) {
    BOOST_TEST_MESSAGE("skipped: no CUDA device (" << cuda::unavailable_reason() << ")");
    return;
  }
  manual_seed(21);
  const Tensor x = randn({4, 3, 2, 2}, kFloat64) * 2 + 1;
  const Tensor w = randn({3}, kFloat64), b = randn({3}, kFloat64);
  Tensor rm = zeros({3}, kFloat64), rv = ones({3}, kFloat64);
  Tensor device_rm = rm.to(kCUDA), device_rv = rv.to(kCUDA);
  for (int i = 0; i < 2; ++i) {
    const Tensor y = batch_norm(x, rm, rv, w, b, true, 0.2);
    const Tensor on_device =
        batch_norm(x.to(kCUDA), device_rm, device_rv, w.to(kCUDA), b.to(kCUDA), true, 0.2);
    BOOST_TEST(on_device.is_cuda());
    expect_close(on_device.cpu(), y, 1e-12, 1e-12, "output");
  }
  expect_close(device_rm.cpu(), rm, 1e-12, 1e-14, "running_mean");
  expect_close(device_rv.cpu(), rv, 1e-12, 1e-14, "running_var");
  nn::BatchNorm2d bn(3);
  bn.to(kCUDA);
  bn(x.to(kCUDA, kFloat32));
  BOOST_TEST(bn.num_batches_tracked.is_cuda());
  BOOST_TEST(bn.num_batches_tracked.item<int64_t>() == 1);
  bn.eval();
  BOOST_TEST(bn(x.to(kCUDA, kFloat32)).is_cuda());
}

// An empty batch (or empty groups): an empty result, and weight and bias gradients of zeros
// (sums of nothing).
BOOST_AUTO_TEST_CASE(norm_empty_batch_gradients) {
  for (bool training : {true, false}) {
    Tensor x = zeros({0, 3, 2}, kFloat64).requires_grad_();
    Tensor w = ones({3}, kFloat64).requires_grad_(), b = zeros({3}, kFloat64).requires_grad_();
    const Tensor y = batch_norm(x, zeros({3}, kFloat64), ones({3}, kFloat64), w, b, training);
    BOOST_TEST((y.shape() == Shape{0, 3, 2}));
    y.sum().backward();
    expect_close(w.grad(), zeros({3}, kFloat64), 0, 0, "batch_norm weight");
    expect_close(b.grad(), zeros({3}, kFloat64), 0, 0, "batch_norm bias");
  }
  for (const Shape& shape : {Shape{0, 4, 2}, Shape{2, 4, 0}}) {
    Tensor x = zeros(shape, kFloat64).requires_grad_();
    Tensor w = ones({4}, kFloat64).requires_grad_(), b = ones({4}, kFloat64).requires_grad_();
    group_norm(x, 2, w, b).sum().backward();
    expect_close(w.grad(), zeros({4}, kFloat64), 0, 0, "group_norm weight");
    expect_close(b.grad(), zeros({4}, kFloat64), 0, 0, "group_norm bias");
  }
}

// Above the parallel grain, the kernels (forward and first-order backward) agree with the same
// formulas in ops; Float32 statistics of inputs far from zero keep their digits.
BOOST_AUTO_TEST_CASE(norm_kernels_match_ops_above_the_grain) {
  manual_seed(11);
  const Tensor x = (randn({16, 8, 24, 24}, kFloat64) * 2 + 5).requires_grad_();
  const Tensor w = randn({8}, kFloat64).requires_grad_(), b = randn({8}, kFloat64).requires_grad_();
  const Tensor up = randn({16, 8, 24, 24}, kFloat64);
  const auto bn_ops = [](const std::vector<Tensor>& v) {
    const std::vector<int64_t> dims{0, 2, 3};
    const Tensor xc = v[0] - v[0].mean(dims, true);
    const Tensor y = xc * pow(mean(xc * xc, dims, true) + 1e-5, -0.5);
    return y * v[1].reshape({1, 8, 1, 1}) + v[2].reshape({1, 8, 1, 1});
  };
  const auto bn = [](const std::vector<Tensor>& v) {
    return batch_norm(v[0], {}, {}, v[1], v[2], true);
  };
  expect_close(bn({x, w, b}), bn_ops({x, w, b}), 1e-10, 1e-12, "batch_norm forward");
  const auto g1 = grads_of(bn, {x, w, b}, up), g2 = grads_of(bn_ops, {x, w, b}, up);
  for (size_t i = 0; i < 3; ++i)
    expect_close(g1[i], g2[i], 1e-8, 1e-10, fmt::format("batch_norm gradient {}", i));

  const auto gn_ops = [](const std::vector<Tensor>& v) {
    const Tensor xg = v[0].reshape({16, 4, 2 * 24 * 24});
    const Tensor xc = xg - xg.mean({2}, true);
    const Tensor y = (xc * pow(mean(xc * xc, {2}, true) + 1e-5, -0.5)).reshape({16, 8, 24, 24});
    return y * v[1].reshape({1, 8, 1, 1}) + v[2].reshape({1, 8, 1, 1});
  };
  const auto gn = [](const std::vector<Tensor>& v) { return group_norm(v[0], 4, v[1], v[2]); };
  expect_close(gn({x, w, b}), gn_ops({x, w, b}), 1e-10, 1e-12, "group_norm forward");
  const auto h1 = grads_of(gn, {x, w, b}, up), h2 = grads_of(gn_ops, {x, w, b}, up);
  for (size_t i = 0; i < 3; ++i)
    expect_close(h1[i], h2[i], 1e-8, 1e-10, fmt::format("group_norm gradient {}", i));

  // (N, C) inputs: a channel a column (the kernels' column path), above the grain too
  const Tensor x2 = (randn({700, 40}, kFloat64) * 3 - 2).requires_grad_();
  const Tensor w2 = randn({40}, kFloat64).requires_grad_(),
               b2 = randn({40}, kFloat64).requires_grad_();
  const Tensor up2 = randn({700, 40}, kFloat64);
  const auto bn2_ops = [](const std::vector<Tensor>& v) {
    const Tensor xc = v[0] - v[0].mean({0}, true);
    return xc * pow(mean(xc * xc, {0}, true) + 1e-5, -0.5) * v[1] + v[2];
  };
  expect_close(bn({x2, w2, b2}), bn2_ops({x2, w2, b2}), 1e-10, 1e-12, "batch_norm 2-D forward");
  const auto k1 = grads_of(bn, {x2, w2, b2}, up2), k2 = grads_of(bn2_ops, {x2, w2, b2}, up2);
  for (size_t i = 0; i < 3; ++i)
    expect_close(k1[i], k2[i], 1e-8, 1e-10, fmt::format("batch_norm 2-D gradient {}", i));

  // Float32 at an offset of 1000: the two-pass statistics against Float64's
  const Tensor far = randn({32, 4, 16, 16}, kFloat64) + 1000;
  expect_close(batch_norm(far.to(kFloat32), {}, {}, {}, {}, true).to(kFloat64),
               batch_norm(far, {}, {}, {}, {}, true), 0, 2e-3, "batch_norm Float32 far");
  expect_close(group_norm(far.to(kFloat32), 2).to(kFloat64), group_norm(far, 2), 0, 2e-3,
               "group_norm Float32 far");
  const Tensor far2 = randn({300, 16}, kFloat64) + 1000;
  expect_close(batch_norm(far2.to(kFloat32), {}, {}, {}, {}, true).to(kFloat64),
               batch_norm(far2, {}, {}, {}, {}, true), 0, 2e-3, "batch_norm 2-D Float32 far");
}

// batch_norm_relu's fused kernels (Note [Fused batch_norm and relu]) against relu(batch_norm)
// above the grain, on both kernel paths, in Float32 and Float64: the same values and running
// statistics, bit for bit, and the same gradients (the mask recomputed in the backward is the
// forward's; a NaN passes its gradient as relu's does); under create_graph and in forward mode
// the same as the pair too.
BOOST_AUTO_TEST_CASE(batch_norm_relu_matches_the_pair) {
  manual_seed(12);
  for (const DType dt : {kFloat32, kFloat64}) {
    for (const Shape& shape : {Shape{16, 8, 24, 24}, Shape{700, 40}, Shape{5, 3, 7}}) {
      const int64_t C = shape[1];
      Tensor x0 = randn(shape, dt) * 2 + 0.3;
      if (shape.size() == 3) x0.view({-1}).narrow(0, 4, 1).fill_(std::nan(""));
      const Tensor x = x0.requires_grad_();
      const Tensor w = randn({C}, dt).requires_grad_(), b = randn({C}, dt).requires_grad_();
      const Tensor up = randn(shape, dt);
      Tensor rm1 = zeros({C}, dt), rv1 = ones({C}, dt), rm2 = zeros({C}, dt), rv2 = ones({C}, dt);
      const Tensor fused = batch_norm_relu(x, rm1, rv1, w, b, true, 0.2);
      const Tensor pair = relu(batch_norm(x, rm2, rv2, w, b, true, 0.2));
      const std::string what = fmt::format("{} {}", dt, shape);
      BOOST_TEST(fused.grad_fn()->op() == "batch_norm_relu");
      expect_close(fused, pair, 0, 0, what + " forward");
      expect_close(rm1, rm2, 0, 0, what + " running_mean");
      expect_close(rv1, rv2, 0, 0, what + " running_var");
      const auto g1 = autograd::grad({fused}, {x, w, b}, {up});
      const auto g2 = autograd::grad({pair}, {x, w, b}, {up});
      const double tol = dt == kFloat32 ? 1e-5 : 1e-12;
      for (size_t i = 0; i < 3; ++i)
        expect_close(g1[i], g2[i], tol, tol, fmt::format("{} gradient {}", what, i));
    }
  }
  // create_graph: the backward in ops, differentiable again (gradgradcheck in the table)
  const Tensor x = (randn({4, 3, 5, 5}, kFloat64) + 0.2).requires_grad_();
  const Tensor w = randn({3}, kFloat64).requires_grad_(), b = randn({3}, kFloat64).requires_grad_();
  const auto fused = [&] { return batch_norm_relu(x, {}, {}, w, b, true); };
  const auto pair = [&] { return relu(batch_norm(x, {}, {}, w, b, true)); };
  const Tensor up = randn({4, 3, 5, 5}, kFloat64);
  const auto h1 = autograd::grad({fused()}, {x, w, b}, {up}, std::nullopt, true);
  const auto h2 = autograd::grad({pair()}, {x, w, b}, {up}, std::nullopt, true);
  for (size_t i = 0; i < 3; ++i) {
    BOOST_TEST(h1[i].requires_grad());
    expect_close(h1[i], h2[i], 1e-12, 1e-12, fmt::format("create_graph gradient {}", i));
  }
  // eval: the running statistics, relu after the affine map
  const Tensor rm = randn({3}, kFloat64), rv = rand({3}, kFloat64) + 0.5;
  expect_close(batch_norm_relu(x, rm, rv, w, b), relu(batch_norm(x, rm, rv, w, b)), 0, 0, "eval");
}

// Sequential runs a BatchNorm followed by a ReLU as batch_norm_relu, with the pair's values and
// gradients and the module's bookkeeping (num_batches_tracked); a ReLU after anything else, or
// a BatchNorm followed by something else, runs as before.
BOOST_AUTO_TEST_CASE(sequential_fuses_batch_norm_and_relu) {
  manual_seed(13);
  auto bn = std::make_shared<nn::BatchNorm2d>(3);
  auto relu_module = std::make_shared<nn::ReLU>();
  nn::Sequential seq(bn, relu_module);
  const Tensor x = (randn({4, 3, 5, 5}) + 0.2).requires_grad_();
  const Tensor y = seq(x);
  BOOST_TEST(y.grad_fn()->op() == "batch_norm_relu");
  BOOST_TEST(bn->num_batches_tracked.item<int64_t>() == 1);
  nn::BatchNorm2d twin(3);
  const Tensor z = relu(twin(x));
  expect_close(y, z, 0, 0, "Sequential(BatchNorm2d, ReLU)");
  expect_close(bn->running_var, twin.running_var, 0, 0, "running_var");
  const Tensor up = randn({4, 3, 5, 5});
  const auto gy = autograd::grad({y}, {x, bn->weight, bn->bias}, {up});
  const auto gz = autograd::grad({z}, {x, twin.weight, twin.bias}, {up});
  for (size_t i = 0; i < 3; ++i) expect_close(gy[i], gz[i], 1e-5, 1e-6, "Sequential gradient");
  // eval: fused call, the running statistics
  seq.eval(), twin.eval();
  expect_close(seq(x), relu(twin(x)), 0, 0, "Sequential in eval");
  // not a pair: a ReLU first, a BatchNorm last
  nn::Sequential other(std::make_shared<nn::ReLU>(), std::make_shared<nn::BatchNorm1d>(3));
  BOOST_TEST(other(randn({4, 3})).grad_fn()->op() == "batch_norm");
}

// pad and interpolate above the parallel grain, and a large pad's backward, against the ops
// they compose on a device (index_select), on the CPU.
BOOST_AUTO_TEST_CASE(resample_large_inputs) {
  manual_seed(12);
  const Tensor x = randn({4, 8, 40, 40}, kFloat64).requires_grad_();
  const Tensor up = randn({4, 8, 46, 43}, kFloat64);
  const auto reflect = [](const std::vector<Tensor>& v) {
    return pad(v[0], {1, 2, 3, 3}, "reflect");
  };
  const auto by_index = [](const std::vector<Tensor>& v) {
    std::vector<int64_t> w, h;
    for (int64_t i = -1; i < 42; ++i) w.push_back(i < 0 ? -i : i >= 40 ? 78 - i : i);
    for (int64_t i = -3; i < 43; ++i) h.push_back(i < 0 ? -i : i >= 40 ? 78 - i : i);
    return index_select(index_select(v[0], 3, from_vector(w, {43})), 2, from_vector(h, {46}));
  };
  expect_close(reflect({x}), by_index({x}), 0, 0, "reflect forward");
  expect_close(grads_of(reflect, {x}, up)[0], grads_of(by_index, {x}, up)[0], 1e-12, 1e-14,
               "reflect backward");
  const Tensor y = interpolate(x, {61, 17}, "bilinear", true);
  BOOST_TEST((y.shape() == Shape{4, 8, 61, 17}));
  // corners are the input's with align_corners
  expect_close(y.select(2, 0).select(2, 0), x.select(2, 0).select(2, 0), 1e-12, 1e-14, "corner");
  expect_close(y.select(2, 60).select(2, 16), x.select(2, 39).select(2, 39), 1e-12, 1e-14,
               "far corner");
}

// --- modules

// BatchNorm1d/2d and GroupNorm through training steps and eval against torch.nn: outputs,
// running statistics, num_batches_tracked, and the state_dict's names, shapes and dtypes in
// torch's order.
template <class M>
void module_against_torch(M& m, const std::string& name, int steps, const Golden& g) {
  BOOST_TEST_CONTEXT(name) {
    m.to(kFloat64);
    nn::NamedTensors params = m.named_parameters();
    {
      NoGradGuard no_grad;
      for (auto& [pname, t] : params) t.copy_(g[name + "." + pname]);
    }
    m.train();
    for (int i = 0; i < steps; ++i) {
      const std::string s = std::to_string(i);
      expect_close(m(g[name + ".x" + s]), g[name + ".y" + s], 1e-12, 1e-12, "output " + s);
      for (const auto& [bname, t] : m.named_buffers()) {
        if (bname == "num_batches_tracked") {
          BOOST_TEST((t.dtype() == kInt64));
          BOOST_TEST(t.template item<int64_t>() == i + 1);
        } else {
          expect_close(t, g[name + "." + bname + s], 1e-12, 1e-12, bname + " " + s);
        }
      }
    }
    m.eval();
    expect_close(m(g[name + ".x_eval"]), g[name + ".y_eval"], 1e-12, 1e-12, "eval output");
    std::vector<std::string> entries;
    for (const auto& [key, t] : m.state_dict())
      entries.push_back(
          fmt::format("{}:{}:{}", key, t.shape(), t.dtype() == kInt64 ? "int64" : "float64"));
    BOOST_TEST(fmt::format("{}", fmt::join(entries, " ")) == g.text(name + ".state_dict"));
  }
}

BOOST_AUTO_TEST_CASE(modules_match_torch) {
  const Golden g("norm.json");
  nn::BatchNorm2d bn2d(3);
  module_against_torch(bn2d, "bn2d", 3, g);
  nn::BatchNorm2d bn2d_momentum(2, 1e-3, 0.3, false);
  module_against_torch(bn2d_momentum, "bn2d_momentum", 2, g);
  nn::BatchNorm1d bn1d(4);
  module_against_torch(bn1d, "bn1d", 3, g);
  nn::BatchNorm1d bn1d_3d(3, 1e-5, 0.5);
  module_against_torch(bn1d_3d, "bn1d_3d", 2, g);
  nn::BatchNorm1d untracked(3, 1e-5, 0.1, true, false);
  module_against_torch(untracked, "bn1d_untracked", 1, g);
  nn::GroupNorm gn(2, 4);
  module_against_torch(gn, "gn", 1, g);
  nn::GroupNorm gn_plain(3, 6, 1e-3, false);
  module_against_torch(gn_plain, "gn_plain", 1, g);
}

// A torch state dict (tests/golden/norm_model.safetensors: BatchNorm2d, GroupNorm and
// BatchNorm2d without affine, after two training steps) loads one to one through nn::load, buffers
// and num_batches_tracked included, and gives torch's eval output.
BOOST_AUTO_TEST_CASE(torch_state_dict_loads) {
  const Golden g("norm.json");
  nn::Sequential model(std::make_shared<nn::BatchNorm2d>(3), std::make_shared<nn::GroupNorm>(1, 3),
                       std::make_shared<nn::BatchNorm2d>(3, 1e-5, 0.1, false));
  nn::load(model, golden_dir() + "/norm_model.safetensors");
  const auto first = std::static_pointer_cast<nn::BatchNorm2d>(model[0]);
  BOOST_TEST(first->num_batches_tracked.item<int64_t>() == 2);
  model.eval();
  expect_close(model(g["model.x"].to(kFloat32)).to(kFloat64), g["model.y"], 1e-5, 1e-6, "eval");
}

BOOST_AUTO_TEST_CASE(batch_norm_module_train_and_eval) {
  manual_seed(8);
  nn::BatchNorm2d bn(2);
  BOOST_TEST(bn.weight.requires_grad());
  BOOST_TEST(!bn.running_mean.requires_grad());
  BOOST_TEST((bn.num_batches_tracked.shape() == Shape{}));
  const Tensor x = randn({3, 2, 2, 2}) * 2 + 1;
  // train: normalised by the batch (mean 0, variance 1 per channel) and the buffers move
  const Tensor y = bn(x);
  expect_close(y.mean({0, 2, 3}), zeros({2}), 0, 1e-6, "batch mean");
  BOOST_TEST(bn.num_batches_tracked.item<int64_t>() == 1);
  const Tensor running = bn.running_mean.clone();
  BOOST_TEST(running.abs().sum().item<float>() > 0);
  // eval: the running statistics, nothing moves; the same input gives another result
  bn.eval();
  const Tensor z = bn(x);
  expect_close(bn.running_mean, running, 0, 0, "running mean in eval");
  BOOST_TEST(bn.num_batches_tracked.item<int64_t>() == 1);
  BOOST_TEST((z - y).abs().max().item<float>() > 0.1);
  // the gradient reaches weight and bias in both modes; the buffers get none
  z.sum().backward();
  BOOST_TEST(bn.weight.grad().defined());
  BOOST_TEST(!bn.running_mean.grad().defined());
  // without tracked statistics: batch statistics in eval too, no buffers
  nn::BatchNorm2d plain(2, 1e-5, 0.1, true, false);
  BOOST_TEST(plain.named_buffers().empty());
  BOOST_TEST(!plain.running_mean.defined());
  plain.eval();
  expect_close(plain(x), y, 1e-6, 1e-6, "untracked eval uses the batch");
  // clone copies the buffers (new storage)
  bn.train();
  auto copy = std::static_pointer_cast<nn::BatchNorm2d>(bn.clone());
  (*copy)(x);
  BOOST_TEST(copy->num_batches_tracked.item<int64_t>() == 2);
  BOOST_TEST(bn.num_batches_tracked.item<int64_t>() == 1);
}

// --- errors

BOOST_AUTO_TEST_CASE(norm_errors) {
  const Tensor x = zeros({2, 3, 4}), c3 = zeros({3}), c2 = zeros({2});
  expect_error([&] { batch_norm(zeros({3}), {}, {}, {}, {}, true); }, {"batch_norm", "[3]"});
  expect_error(
      [&] {
        batch_norm(from_vector(std::vector<int64_t>{1, 2}, {1, 2}), c3, c3);
      },
      {"batch_norm", "Int64"});
  expect_error(
      [&] {
        batch_norm(zeros({1, 3}), {}, {}, {}, {}, true);
      },
      {"batch_norm", "more than 1 value per channel", "[1, 3]"});
  expect_error(
      [&] {
        batch_norm(zeros({1, 3, 1}), {}, {}, {}, {}, true);
      },
      {"batch_norm", "more than 1 value"});
  expect_error([&] { batch_norm(x, {}, {}); }, {"batch_norm", "running_mean", "eval"});
  expect_error([&] { batch_norm(x, c3, {}); }, {"batch_norm", "running_var", "eval"});
  expect_error([&] { batch_norm(x, c2, c3); }, {"batch_norm", "running_mean", "3 channels", "[2]"});
  expect_error([&] { batch_norm(x, c3, zeros({3, 1})); }, {"batch_norm", "running_var", "[3, 1]"});
  expect_error([&] { batch_norm(x, {}, {}, c2, {}, true); }, {"batch_norm", "weight", "[2]"});
  expect_error([&] { batch_norm(x, {}, {}, {}, c2, true); }, {"batch_norm", "bias", "[2]"});
  expect_error([&] { batch_norm(x, c3, c3, zeros({3}, kFloat64)); },
               {"batch_norm", "weight", "Float64", "Float32"});
  expect_error([&] { batch_norm(x, {}, {}, {}, {}, true, 0.1, -1.0); }, {"batch_norm", "eps"});
  expect_error([&] { batch_norm_relu(zeros({3}), {}, {}, {}, {}, true); },
               {"batch_norm_relu", "[3]"});
  expect_error([&] { batch_norm_relu(x, {}, {}); }, {"batch_norm_relu", "running_mean", "eval"});
  expect_error([&] { batch_norm_relu(x, {}, {}, c2, {}, true); },
               {"batch_norm_relu", "weight", "[2]"});
  expect_error(
      [&] {
        batch_norm_relu(zeros({1, 3}), {}, {}, {}, {}, true);
      },
      {"batch_norm_relu", "more than 1 value per channel", "[1, 3]"});

  expect_error([&] { group_norm(zeros({4}), 2); }, {"group_norm", "[4]"});
  expect_error(
      [&] {
        group_norm(zeros({2, 3, 3}), 2);
      },
      {"group_norm", "3 channels", "num_groups 2", "[2, 3, 3]"});
  expect_error([&] { group_norm(x, 0); }, {"group_norm", "num_groups", "0"});
  expect_error([&] { group_norm(zeros({2, 4, 3}), 2, c3); }, {"group_norm", "weight", "[3]"});
  expect_error([&] { group_norm(zeros({2, 4, 3}), 2, {}, c3); }, {"group_norm", "bias", "[3]"});
  expect_error(
      [&] {
        group_norm(zeros({1, 2, 1}), 2);
      },
      {"group_norm", "more than 1 value", "[1, 2, 1]"});
  expect_error([&] { group_norm(x, 1, {}, {}, -1.0); }, {"group_norm", "eps"});
}

BOOST_AUTO_TEST_CASE(pad_errors) {
  const Tensor x = zeros({1, 2, 3});
  expect_error([&] { pad(x, {1}); }, {"pad", "even", "1"});
  expect_error([&] { pad(x, {1, 1, 1, 1, 1, 1, 1, 1}); }, {"pad", "8 values", "[1, 2, 3]"});
  expect_error([&] { pad(x, {-2, -2}); }, {"pad", "(-2, -2)", "crops", "[1, 2, 3]"});
  expect_error([&] { pad(x, {1, 1}, "wrap"); }, {"pad", "unknown mode", "wrap"});
  expect_error([&] { pad(x, {1, 1}, "reflect", 1.0); }, {"pad", "reflect", "no value"});
  expect_error([&] { pad(x, {3, 0}, "reflect"); }, {"pad", "reflect", "(3, 0)", "size 3"});
  expect_error([&] { pad(x, {-2, -1}, "reflect"); }, {"pad", "reflect", "no element"});
  expect_error([&] { pad(x, {-2, -1}, "replicate"); }, {"pad", "replicate", "no element"});
  expect_error([&] { pad(x, {4, 0}, "circular"); }, {"pad", "circular", "more than once"});
  expect_error([&] { pad(zeros({3}), {1, 1}, "reflect"); }, {"pad", "reflect", "[3]"});
  expect_error(
      [&] {
        pad(zeros({1, 1, 2, 3}), {1, 1}, "replicate");
      },
      {"pad", "replicate", "2 values", "[1, 1, 2, 3]"});
  expect_error([&] { pad(zeros({2, 0, 3}), {1, 1}, "replicate"); }, {"pad", "[2, 0, 3]"});
  expect_error(
      [&] {
        pad(from_vector(std::vector<int64_t>{1, 2, 3}, {1, 1, 3}), {1, 1}, "reflect");
      },
      {"pad", "Int64"});
  expect_error([&] { pad(Tensor(), {1, 1}); }, {"pad", "undefined"});
}

BOOST_AUTO_TEST_CASE(interpolate_errors) {
  const Tensor x3 = zeros({1, 2, 3}), x4 = zeros({1, 2, 3, 4});
  expect_error([&] { interpolate(x3, {4}, "nearest", false); },
               {"interpolate", "align_corners", "nearest"});
  expect_error([&] { interpolate(x3, {4}, "cubic"); }, {"interpolate", "unknown mode", "cubic"});
  expect_error([&] { interpolate(x4, {4}, "linear"); },
               {"interpolate", "linear", "3-D", "[1, 2, 3, 4]"});
  expect_error([&] { interpolate(x3, {4}, "bilinear"); }, {"interpolate", "bilinear", "4-D"});
  expect_error([&] { interpolate(zeros({2, 3}), {4}); }, {"interpolate", "[2, 3]"});
  expect_error(
      [&] {
        interpolate(x4, {4, 5, 6});
      },
      {"interpolate", "size", "1 or 2 values", "got 3"});
  expect_error([&] { interpolate(x3, {0}); }, {"interpolate", "output size 0"});
  expect_error([&] { interpolate(zeros({1, 2, 0}), {3}); }, {"interpolate", "[1, 2, 0]"});
  expect_error([&] { interpolate(zeros({1, 0, 3}), {3}, "linear"); }, {"interpolate", "[1, 0, 3]"});
}

BOOST_AUTO_TEST_CASE(module_errors) {
  nn::BatchNorm1d bn1d(3);
  nn::BatchNorm2d bn2d(3);
  expect_error([&] { bn1d(zeros({2, 3, 4, 5})); }, {"BatchNorm1d", "2-D", "[2, 3, 4, 5]"});
  expect_error([&] { bn1d(zeros({3})); }, {"BatchNorm1d", "[3]"});
  expect_error([&] { bn2d(zeros({2, 3, 4})); }, {"BatchNorm2d", "4-D", "[2, 3, 4]"});
  expect_error([&] { bn2d(zeros({2, 4, 2, 2})); }, {"batch_norm", "4 channels"});
  expect_error([&] { nn::BatchNorm2d(0); }, {"BatchNorm2d", "num_features"});
  expect_error([&] { nn::BatchNorm1d(3, -1.0); }, {"BatchNorm1d", "eps"});
  expect_error([&] { nn::GroupNorm(4, 6); }, {"GroupNorm", "6", "divisible", "4"});
  expect_error([&] { nn::GroupNorm(0, 6); }, {"GroupNorm", "positive"});
  nn::GroupNorm gn(2, 4);
  expect_error([&] { gn(zeros({2, 6, 3})); }, {"group_norm", "weight"});
}

BOOST_AUTO_TEST_SUITE_END()
