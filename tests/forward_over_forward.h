// Forward over forward on an op table's rows (tests/op_table.h): a jvp inside a jvp (two nested
// dual levels, Note [Forward grads] in graph/forward_ad.h) gives the second directional
// derivative D²f(x)[v, w]; it is checked against central differences of the first-order jvp
// along w, (J(x + εw) v - J(x - εw) v) / 2ε. So the forward rules' own ops carry the outer
// level's tangents: a rule written in raw kernels, or one reading values that are constants to
// the outer level, fails here while passing table_forward_ad. Also forward over reverse (the
// tangents of gradients under create_graph, so the backward ops' rules) against differences of
// the gradients, and forward mode on the (emulated) CUDA device against the CPU.
#pragma once

#include <string>
#include <vector>

#include "tests/op_table.h"

namespace ember::testing {

namespace detail {

// J(x) v, every floating input dual with its direction (undefined where the result has none).
inline Tensor first_order_jvp(const Fn& f, const std::vector<Tensor>& x,
                              const std::vector<Tensor>& v) {
  autograd::forward_ad::DualLevel level;
  std::vector<Tensor> dual = x;
  for (size_t i = 0; i < x.size(); ++i)
    if (v[i].defined()) dual[i] = autograd::forward_ad::make_dual(x[i], v[i]);
  return autograd::forward_ad::unpack_dual(f(dual)).tangent;
}

inline void forward_over_forward_row(const OpCase& c) {
  namespace fa = autograd::forward_ad;
  manual_seed(seed_of(c.name) + 7);
  std::vector<Tensor> x, v, w;
  for (size_t i = 0; i < c.shapes.size(); ++i) {
    x.push_back(make_input(c.shapes[i], c.domain(i)).detach());
    const bool floating = is_floating(x.back().dtype());
    v.push_back(floating ? randn(c.shapes[i], kFloat64) : Tensor());
    w.push_back(floating ? randn(c.shapes[i], kFloat64) : Tensor());
  }
  // the jvp along v inside the jvp along w: its outer tangent is D²f[v, w]
  Tensor jv, second;
  {
    fa::DualLevel outer;
    std::vector<Tensor> along_w = x;
    for (size_t i = 0; i < x.size(); ++i)
      if (w[i].defined()) along_w[i] = fa::make_dual(x[i], w[i]);
    const Tensor inner = first_order_jvp(c.f, along_w, v);
    if (inner.defined()) {
      const fa::UnpackedDual u = fa::unpack_dual(inner);
      jv = u.primal.detach().clone();
      if (u.tangent.defined()) second = u.tangent.detach().clone();
    }
  }
  // central differences of J v along w
  constexpr double eps = 1e-6;
  std::vector<Tensor> plus = x, minus = x;
  for (size_t i = 0; i < x.size(); ++i)
    if (w[i].defined()) plus[i] = add(x[i], mul(w[i], eps)), minus[i] = sub(x[i], mul(w[i], eps));
  const Tensor jp = first_order_jvp(c.f, plus, v), jm = first_order_jvp(c.f, minus, v);
  if (!jp.defined() && !jm.defined() && !jv.defined()) return;  // constant in every input
  const Tensor like = jp.defined() ? jp : jm.defined() ? jm : jv;
  const Tensor numeric =
      div(sub(jp.defined() ? jp : zeros_like(like), jm.defined() ? jm : zeros_like(like)), 2 * eps);
  expect_close(second.defined() ? second : zeros_like(numeric), numeric, 1e-5, 1e-6,
               c.name + ": forward over forward against differences of the jvp");
}

// The gradients of <f(x), up> at the floating inputs (undefined entries elsewhere), the pass
// recorded (create_graph) or not.
inline std::vector<Tensor> input_gradients(const Fn& f, const std::vector<Tensor>& x,
                                           const std::vector<Tensor>& at, const Tensor& up,
                                           bool create_graph) {
  std::vector<Tensor> leaves, out(x.size());
  std::vector<size_t> which;
  for (size_t i = 0; i < x.size(); ++i)
    if (is_floating(x[i].dtype())) leaves.push_back(x[i]), which.push_back(i);
  const std::vector<Tensor> g =
      autograd::grad({f(at)}, leaves, {up}, std::nullopt, create_graph, true);
  for (size_t k = 0; k < which.size(); ++k) out[which[k]] = g[k];
  return out;
}

inline void forward_over_reverse_row(const OpCase& c) {
  namespace fa = autograd::forward_ad;
  manual_seed(seed_of(c.name) + 8);
  std::vector<Tensor> x, v;
  for (size_t i = 0; i < c.shapes.size(); ++i) {
    x.push_back(make_input(c.shapes[i], c.domain(i)).detach());
    v.push_back(is_floating(x.back().dtype()) ? randn(c.shapes[i], kFloat64) : Tensor());
  }
  const Tensor up = randn(c.f(x).shape(), kFloat64), dup = randn(up.shape(), kFloat64);
  // the gradient's tangent along (v, dup): the backward's ops run on dual saved tensors
  // (create_graph) and a dual upstream, so the backward ops' rules give H v + Jᵀ dup
  std::vector<Tensor> tangents(x.size());
  {
    fa::DualLevel level;
    const Tensor dual_up = fa::make_dual(up, dup);
    std::vector<Tensor> leaves = x, dual = x;
    for (size_t i = 0; i < x.size(); ++i)
      if (v[i].defined()) {
        leaves[i] = x[i].clone().requires_grad_();
        dual[i] = fa::make_dual(leaves[i], v[i]);
      }
    const std::vector<Tensor> g = input_gradients(c.f, leaves, dual, dual_up, true);
    for (size_t i = 0; i < x.size(); ++i)
      if (g[i].defined()) tangents[i] = fa::unpack_dual(g[i]).tangent;
  }
  // central differences of the gradients along v
  constexpr double eps = 1e-6;
  const auto moved = [&](double sign) {
    std::vector<Tensor> at = x;
    for (size_t i = 0; i < x.size(); ++i)
      if (v[i].defined()) at[i] = add(x[i], mul(v[i], sign * eps)).requires_grad_();
    return input_gradients(c.f, at, at, add(up, mul(dup, sign * eps)), false);
  };
  const std::vector<Tensor> gp = moved(1), gm = moved(-1);
  for (size_t i = 0; i < x.size(); ++i) {
    if (!v[i].defined()) continue;
    const Tensor zero = zeros(x[i].shape(), kFloat64);
    const Tensor numeric =
        div(sub(gp[i].defined() ? gp[i] : zero, gm[i].defined() ? gm[i] : zero), 2 * eps);
    expect_close(tangents[i].defined() ? tangents[i] : zero, numeric, 1e-5, 1e-6,
                 fmt::format("{}: forward over reverse, gradient of input {}", c.name, i));
  }
}

// The row's jvp on the CUDA device against the CPU's, in Float64 (contiguous inputs): on a device
// the ops of this family are composed of other ops, whose rules give the tangent there.
inline void forward_on_device_row(const OpCase& c) {
  manual_seed(seed_of(c.name) + 9);
  std::vector<Tensor> x, v, xd, vd;
  for (size_t i = 0; i < c.shapes.size(); ++i) {
    x.push_back(make_input(c.shapes[i], c.domain(i)).detach());
    v.push_back(is_floating(x.back().dtype()) ? randn(c.shapes[i], kFloat64) : Tensor());
    xd.push_back(x.back().to(kCUDA));
    vd.push_back(v.back().defined() ? v.back().to(kCUDA) : Tensor());
  }
  const Tensor want = first_order_jvp(c.f, x, v);
  const Tensor got = [&] {
    RowOnDevice on(kCUDA);
    return first_order_jvp(c.f, xd, vd);
  }();
  BOOST_TEST_REQUIRE(got.defined() == want.defined(), "a tangent on one side only");
  if (!want.defined()) return;
  BOOST_TEST(got.is_cuda(), "the tangent is on " << got.device());
  expect_close(got.cpu(), want, 1e-10, 1e-12, c.name + ": tangent on the device");
}

}  // namespace detail

// Forward mode on the CUDA device against the CPU (detail::forward_on_device_row) for every row
// gradcheck checks; one line where no device is usable (EMBER_CUDA_EMULATE=1 emulates one).
inline void check_forward_on_device(const OpTable& table) {
  if (!cuda::is_available()) {
    BOOST_TEST_MESSAGE("skipped: no CUDA device (" << cuda::unavailable_reason() << ")");
    return;
  }
  detail::for_rows(
      table, [](const OpCase& c) { return c.differentiable() && !(c.flags & kNoGradcheck); },
      detail::forward_on_device_row);
}

// Forward over reverse (detail::forward_over_reverse_row) on every row gradcheck checks: the
// tangents of the gradients under create_graph, the inputs and the upstream gradient dual
// (H v + Jᵀ dup), against central differences of the gradients, so the backward ops' own rules
// hold.
inline void check_forward_over_reverse(const OpTable& table) {
  detail::for_rows(
      table, [](const OpCase& c) { return c.differentiable() && !(c.flags & kNoGradcheck); },
      detail::forward_over_reverse_row);
}

// Forward over forward (detail::forward_over_forward_row) on every row gradcheck checks.
inline void check_forward_over_forward(const OpTable& table) {
  detail::for_rows(
      table, [](const OpCase& c) { return c.differentiable() && !(c.flags & kNoGradcheck); },
      detail::forward_over_forward_row);
}

}  // namespace ember::testing
