// gradcheck: compares autograd's vector-Jacobian products with central finite differences.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "graph/tensor.h"

namespace ember {

struct GradcheckOptions {
  double eps = 1e-6, atol = 1e-5, rtol = 1e-3;
  // Also each input's columns of the Jacobian by forward mode (J e_j, one dual pass per element),
  // projected on the same v, against the same finite differences: so a forward rule agrees with
  // the finite differences and, through them, with the backward (torch's check_forward_ad).
  bool check_forward_ad = false;
};

struct GradcheckResult {
  bool ok;
  double max_abs_error;  // over every checked element
  std::string message;   // names the worst element
};

// Checks f's gradient with respect to every input that requires grad. Inputs must be Float64;
// they may be non-contiguous but must not overlap in memory (no expanded dims), and may be on a
// CUDA device (the differences are then taken there: each element written by fill_, f's
// output read back to the host for the dot product). For two random
// projections v of f's output, each element j of each input gets
//   analytic = (Jᵀ v)_j  from backward,   numeric = (f(x + eps e_j) - f(x - eps e_j)) · v / 2eps,
// and passes when |analytic - numeric| <= atol + rtol |numeric|.
GradcheckResult gradcheck(const std::function<Tensor(const std::vector<Tensor>&)>& f,
                          const std::vector<Tensor>& inputs, const GradcheckOptions& options = {});

// torch.autograd.gradgradcheck: second derivatives by finite differences of the first, against
// the double backward. The first derivatives, autograd::grad of f with grad_outputs (random and
// seeded when none are given) and create_graph, flattened and joined into one tensor, are
// checked with gradcheck, as functions of f's inputs and of the grad_output (a backward formula
// must be differentiable in both).
GradcheckResult gradgradcheck(const std::function<Tensor(const std::vector<Tensor>&)>& f,
                              const std::vector<Tensor>& inputs,
                              const std::vector<Tensor>& grad_outputs = {},
                              const GradcheckOptions& options = {});

}  // namespace ember
