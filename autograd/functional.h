// torch.autograd.functional for functions of one output: vector-Jacobian and Jacobian-vector
// products, Hessian-vector products, whole Jacobians and Hessians, all built on autograd::grad.
//
// As torch's: the inputs are differentiated through copies (detached leaves, or views keeping
// the caller's graph under create_graph), so the caller's tensors and their .grad are left
// alone; an input the output does not reach gets zeros; the results are detached unless
// create_graph, which records them so they can be differentiated again.
//
// jvp runs in forward mode (autograd/forward_ad.h): f once, with the inputs carrying v as
// tangents; every op f calls needs a forward rule (an Error names one that has none). hvp computes
// vᵀH (vhp) and returns it as H v: the Hessian of a twice-differentiable scalar function is
// symmetric, so both are the same vector, and this way costs one backward pass fewer than torch's
// double-backward hvp.
#pragma once

#include <functional>
#include <vector>

#include "graph/tensor.h"

namespace ember::autograd::functional {

using Fn = std::function<Tensor(const std::vector<Tensor>&)>;

struct VJP {
  Tensor output;
  std::vector<Tensor> vjp;  // vᵀ J, one per input, each of its input's shape
};
struct JVP {
  Tensor output;
  Tensor jvp;  // J v, of the output's shape
};
struct HVP {
  Tensor output;
  std::vector<Tensor> hvp;  // H v (or vᵀ H), one per input
};

// v: the output's shape; may be left undefined for a one-element output (then 1).
VJP vjp(const Fn& f, const std::vector<Tensor>& inputs, const Tensor& v = {},
        bool create_graph = false);
// v: one per input, of its shape.
JVP jvp(const Fn& f, const std::vector<Tensor>& inputs, const std::vector<Tensor>& v,
        bool create_graph = false);
// f returns one element; v: one per input, of its shape.
HVP hvp(const Fn& f, const std::vector<Tensor>& inputs, const std::vector<Tensor>& v,
        bool create_graph = false);
HVP vhp(const Fn& f, const std::vector<Tensor>& inputs, const std::vector<Tensor>& v,
        bool create_graph = false);
// H v by forward over reverse (a jvp of the gradient: the gradient taken with create_graph while
// the inputs carry v as tangents), the other way hvp could go; ember_bench's hvp/ rows time both
// (BENCHMARKS.md).
HVP hvp_forward_over_reverse(const Fn& f, const std::vector<Tensor>& inputs,
                             const std::vector<Tensor>& v, bool create_graph = false);

// The Jacobian of f at x, of shape f(x).shape + x.shape (one backward pass per output element).
// jacfwd: the same by forward mode, one dual pass per input element (the cheaper one when x has
// fewer elements than f(x)).
Tensor jacfwd(const std::function<Tensor(const Tensor&)>& f, const Tensor& x);
Tensor jacobian(const std::function<Tensor(const Tensor&)>& f, const Tensor& x,
                bool create_graph = false);
// The Hessian of f at x, f returning one element: of shape x.shape + x.shape.
Tensor hessian(const std::function<Tensor(const Tensor&)>& f, const Tensor& x,
               bool create_graph = false);

}  // namespace ember::autograd::functional
