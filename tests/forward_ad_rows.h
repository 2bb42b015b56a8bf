// Forward mode on an op table's rows beyond check_forward_gradients (tests/op_table.h), which
// checks the first-order rules on the CPU: nested dual levels and forward over reverse (second
// derivatives through the rules' own ops), and the rules on the CUDA device. The tables of
// test_reduce and test_index call them.
#pragma once

#include <vector>

#include "tests/op_table.h"

namespace ember::testing {

namespace detail {

// The rows table_forward_ad checks.
inline bool forward_checked(const OpCase& c) {
  return c.differentiable() && !(c.flags & kNoGradcheck);
}

inline GradcheckOptions with_forward_ad() {
  GradcheckOptions options;
  options.check_forward_ad = true;
  return options;
}

// One row, contiguous layout:
//   - nested levels: x, u -> the row's tangent along u, taken at a dual level of its own, is
//     gradchecked with check_forward_ad (a level outside): the rules' ops carry the outer
//     level's tangent, so its forward columns are the row's second derivatives in forward mode
//     (and its backward is reverse over forward);
//   - forward over reverse: x, w -> the row's vjp with w under create_graph, gradchecked with
//     check_forward_ad: the rules of the backward's ops (gradgradcheck cannot take
//     check_forward_ad: its first derivatives read the inputs it was given, not the dual views
//     its gradcheck passes).
inline void forward_second_order_row(const OpCase& c) {
  namespace fa = ember::autograd::forward_ad;
  manual_seed(seed_of(c.name) + 7);
  const LaidOut row = lay_out(c, Layout::Contiguous);
  const size_t n = row.leaves.size();
  std::vector<size_t> floating;
  std::vector<Tensor> with_directions = row.leaves;
  for (size_t i = 0; i < n; ++i) {
    if (!is_floating_input(row.leaves[i])) continue;
    floating.push_back(i);
    with_directions.push_back(randn(row.leaves[i].shape(), kFloat64).requires_grad_());
  }
  const auto tangent_of_row = [&](const std::vector<Tensor>& in) {
    fa::DualLevel level;
    std::vector<Tensor> duals(in.begin(), in.begin() + n);
    for (size_t k = 0; k < floating.size(); ++k)
      duals[floating[k]] = fa::make_dual(duals[floating[k]], in[n + k]);
    return fa::unpack_dual(row.through_views(duals)).tangent;
  };
  check_gradient(tangent_of_row, with_directions, "nested levels", with_forward_ad());

  std::vector<Tensor> with_grad_output = row.leaves;
  with_grad_output.push_back(
      randn(row.through_views(row.leaves).shape(), kFloat64).requires_grad_());
  const auto vjp_of_row = [&](const std::vector<Tensor>& in) {
    GradModeScope grad_mode(true);  // gradcheck evaluates under NoGradGuard
    // x + z differentiated at z = 0: gradcheck's dual inputs need no grad themselves
    std::vector<Tensor> x(in.begin(), in.begin() + n), wrt;
    for (size_t i : floating) {
      wrt.push_back(zeros(x[i].shape(), kFloat64, x[i].device()).requires_grad_());
      x[i] = add(x[i], wrt.back());
    }
    const std::vector<Tensor> grads =
        autograd::grad({row.through_views(x)}, wrt, {in.back()}, true, true, true);
    std::vector<Tensor> flat;
    for (size_t k = 0; k < grads.size(); ++k)
      flat.push_back(grads[k].defined() ? grads[k].reshape({-1})
                                        : zeros({wrt[k].numel()}, kFloat64, wrt[k].device()));
    return cat(flat, 0);
  };
  check_gradient(vjp_of_row, with_grad_output, "forward over reverse", with_forward_ad());
}

// One row's forward gradcheck on the CUDA device (contiguous layout; the finite differences and
// dual passes there, the row's constants put there by on_row_device).
inline void forward_device_row(const OpCase& c) {
  manual_seed(seed_of(c.name) + 5);
  const LaidOut row = lay_out(c, Layout::Contiguous);
  std::vector<Tensor> device;
  for (const Tensor& leaf : row.leaves)
    device.push_back(is_floating_input(leaf) ? leaf.detach().to(kCUDA).requires_grad_()
                                             : leaf.to(kCUDA));
  check_gradient(
      [&](const std::vector<Tensor>& in) {
        RowOnDevice on(kCUDA);
        return row.through_views(in);
      },
      device, "forward mode on the device", with_forward_ad());
}

}  // namespace detail

// Second derivatives in forward mode of every row table_forward_ad checks
// (detail::forward_second_order_row).
inline void check_forward_second_order(const OpTable& table) {
  detail::for_rows(table, detail::forward_checked, detail::forward_second_order_row);
}

// The forward rules of every row table_forward_ad checks on the CUDA device (the emulated one
// under EMBER_CUDA_EMULATE=1, as ctest device_emulated runs the table_on_device cases); one line
// and nothing else where no device is usable.
inline void check_forward_on_device(const OpTable& table) {
  if (!cuda::is_available()) {
    BOOST_TEST_MESSAGE("skipped: no CUDA device (" << cuda::unavailable_reason() << ")");
    return;
  }
  detail::for_rows(table, detail::forward_checked, detail::forward_device_row);
}

}  // namespace ember::testing
