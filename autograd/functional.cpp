// torch.autograd.functional over autograd::grad (autograd/functional.h).
#include "autograd/functional.h"

#include <string_view>

#include "autograd/engine.h"
#include "autograd/forward_ad.h"
#include "graph/autograd.h"
#include "graph/creation.h"
#include "graph/error.h"
#include "graph/profile.h"
#include "ops/index.h"

namespace ember::autograd::functional {

namespace {

// Input i of a transform: defined and floating.
void check_input(const Tensor& x, size_t i, std::string_view op) {
  EMBER_CHECK(x.defined(), "{}: input {} is undefined", op, i);
  EMBER_CHECK(is_floating(x.dtype()),
              "{}: input {} is {}; only floating tensors can be differentiated", op, i, x.dtype());
}

// The tensors f is called with: a view keeping the caller's graph where create_graph asks for
// one, else a detached leaf requiring grad (torch's _grad_preprocess).
std::vector<Tensor> prepare(const std::vector<Tensor>& inputs, bool create_graph,
                            std::string_view op) {
  EMBER_CHECK(!inputs.empty(), "{}: no inputs", op);
  std::vector<Tensor> prepared;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Tensor& x = inputs[i];
    check_input(x, i, op);
    prepared.push_back(create_graph && x.requires_grad() ? x.view(x.shape())
                                                         : x.detach().requires_grad_());
  }
  return prepared;
}

// f's output, which must be a defined floating tensor.
Tensor call(const Fn& f, const std::vector<Tensor>& inputs, std::string_view op) {
  Tensor out = f(inputs);
  EMBER_CHECK(out.defined(), "{}: f returned an undefined tensor", op);
  EMBER_CHECK(is_floating(out.dtype()), "{}: f returned a {} tensor; it must be floating", op,
              out.dtype());
  return out;
}

void check_one_element(const Tensor& out, std::string_view op) {
  EMBER_CHECK(out.numel() == 1, "{}: f must return one element, but returned shape {}", op,
              out.shape());
}

// v: one per input, each of its input's shape.
void check_tangents(const std::vector<Tensor>& v, const std::vector<Tensor>& inputs,
                    std::string_view op) {
  EMBER_CHECK(v.size() == inputs.size(), "{}: {} vectors v for {} inputs", op, v.size(),
              inputs.size());
  for (size_t i = 0; i < v.size(); ++i) {
    EMBER_CHECK(v[i].defined(), "{}: v {} is undefined", op, i);
    EMBER_CHECK(v[i].shape() == inputs[i].shape(), "{}: v {} has shape {}, but input {} has {}", op,
                i, v[i].shape(), i, inputs[i].shape());
  }
}

// The gradient where one flowed, else zeros of `like`'s shape; detached unless create_graph.
Tensor finish(const Tensor& grad, const Tensor& like, bool create_graph) {
  if (!grad.defined()) return zeros(like.shape(), like.dtype(), like.device());
  return create_graph ? grad : grad.detach();
}

std::vector<Tensor> finish(const std::vector<Tensor>& grads, const std::vector<Tensor>& like,
                           bool create_graph) {
  std::vector<Tensor> out;
  for (size_t i = 0; i < like.size(); ++i)
    out.push_back(finish(i < grads.size() ? grads[i] : Tensor(), like[i], create_graph));
  return out;
}

// The vᵀ H of f's one-element output for each input (vhp, and hvp by symmetry).
HVP hessian_vector(const Fn& f, const std::vector<Tensor>& inputs, const std::vector<Tensor>& v,
                   bool create_graph, std::string_view op) {
  profile::Scope scope(op);
  GradModeScope grad_mode(true);
  check_tangents(v, inputs, op);
  const std::vector<Tensor> xs = prepare(inputs, create_graph, op);
  const Tensor out = call(f, xs, op);
  check_one_element(out, op);
  HVP result{create_graph ? out : out.detach(), {}};
  if (!out.requires_grad()) return result.hvp = finish({}, xs, false), result;
  // jac is only differentiated (Note [Results for their graph alone])
  const std::vector<Tensor> jac = detail::grad_for_graph({out}, xs, {});
  std::vector<Tensor> outputs, cotangents;
  for (size_t i = 0; i < jac.size(); ++i)
    if (jac[i].defined() && jac[i].requires_grad())
      outputs.push_back(jac[i]), cotangents.push_back(v[i]);
  if (outputs.empty()) return result.hvp = finish({}, xs, false), result;
  result.hvp =
      finish(grad(outputs, xs, cotangents, create_graph, create_graph, true), xs, create_graph);
  return result;
}

}  // namespace

VJP vjp(const Fn& f, const std::vector<Tensor>& inputs, const Tensor& v, bool create_graph) {
  constexpr std::string_view op = "vjp";
  profile::Scope scope(op);
  GradModeScope grad_mode(true);
  const std::vector<Tensor> xs = prepare(inputs, create_graph, op);
  const Tensor out = call(f, xs, op);
  if (v.defined())
    EMBER_CHECK(v.shape() == out.shape(), "{}: v has shape {}, but f's output has shape {}", op,
                v.shape(), out.shape());
  else
    EMBER_CHECK(out.numel() == 1,
                "{}: v may be left out only when f returns one element; f returned shape {}", op,
                out.shape());
  VJP result{create_graph ? out : out.detach(), {}};
  if (!out.requires_grad()) return result.vjp = finish({}, xs, false), result;
  result.vjp = finish(grad({out}, xs, {v}, create_graph, create_graph, true), xs, create_graph);
  return result;
}

// In forward mode (Note [Forward grads] in graph/forward_ad.h): the inputs made dual with v at
// a level of its own, f run once, the output's tangent read back.
JVP jvp(const Fn& f, const std::vector<Tensor>& inputs, const std::vector<Tensor>& v,
        bool create_graph) {
  constexpr std::string_view op = "jvp";
  profile::Scope scope(op);
  check_tangents(v, inputs, op);
  EMBER_CHECK(!inputs.empty(), "{}: no inputs", op);
  GradModeScope grad_mode(create_graph);
  forward_ad::DualLevel level;
  std::vector<Tensor> xs;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Tensor& x = inputs[i];
    check_input(x, i, op);
    EMBER_CHECK(v[i].dtype() == x.dtype() && v[i].device() == x.device(),
                "{}: v {} is {} on {}, but input {} is {} on {}", op, i, v[i].dtype(),
                v[i].device(), i, x.dtype(), x.device());
    xs.push_back(
        forward_ad::make_dual(create_graph ? x : x.detach(), create_graph ? v[i] : v[i].detach()));
  }
  const Tensor out = call(f, xs, op);
  const forward_ad::UnpackedDual dual = forward_ad::unpack_dual(out);
  Tensor tangent = dual.tangent;
  if (!tangent.defined()) {
    tangent = zeros(out.shape(), out.dtype(), out.device());
  } else {
    for (const Tensor& given : v)  // f returned an input: J v is v, given back as a copy
      if (given.impl()->storage == tangent.impl()->storage) tangent = tangent.clone();
  }
  return {create_graph ? dual.primal : dual.primal.detach(),
          create_graph ? tangent : tangent.detach()};
}

// Column j of the Jacobian is the jvp with the j-th unit vector of the input.
Tensor jacfwd(const std::function<Tensor(const Tensor&)>& f, const Tensor& x) {
  constexpr std::string_view op = "jacfwd";
  profile::Scope scope(op);
  EMBER_CHECK(x.defined(), "{}: the input is undefined", op);
  EMBER_CHECK(is_floating(x.dtype()),
              "{}: the input is {}; only floating tensors can be differentiated", op, x.dtype());
  NoGradGuard no_grad;
  const Tensor units = eye(x.numel(), x.dtype()).to(x.device());
  const Fn g = [&](const std::vector<Tensor>& in) { return f(in[0]); };
  std::vector<Tensor> columns;
  Shape out_shape;
  for (int64_t j = 0; j < x.numel(); ++j) {
    const JVP column = jvp(g, {x}, {units.select(0, j).reshape(x.shape())});
    out_shape = column.output.shape();
    columns.push_back(column.jvp.reshape({-1}));
  }
  if (columns.empty()) {  // an empty input: f's output shape, then x's
    out_shape = call(g, {x.detach()}, op).shape();
    Shape shape = out_shape;
    shape.insert(shape.end(), x.shape().begin(), x.shape().end());
    return zeros(shape, x.dtype(), x.device());
  }
  Shape shape = out_shape;
  shape.insert(shape.end(), x.shape().begin(), x.shape().end());
  return stack(columns, -1).reshape(shape);
}

HVP hvp(const Fn& f, const std::vector<Tensor>& inputs, const std::vector<Tensor>& v,
        bool create_graph) {
  return hessian_vector(f, inputs, v, create_graph, "hvp");
}

// Forward over reverse: the gradient taken with create_graph inside a dual level whose inputs
// carry v, so the backward's ops carry tangents and the gradient's tangent is H v.
HVP hvp_forward_over_reverse(const Fn& f, const std::vector<Tensor>& inputs,
                             const std::vector<Tensor>& v, bool create_graph) {
  constexpr std::string_view op = "hvp";
  profile::Scope scope(op);
  GradModeScope grad_mode(true);
  check_tangents(v, inputs, op);
  const std::vector<Tensor> leaves = prepare(inputs, create_graph, op);
  forward_ad::DualLevel level;
  std::vector<Tensor> xs;
  for (size_t i = 0; i < leaves.size(); ++i)
    xs.push_back(forward_ad::make_dual(leaves[i], create_graph ? v[i] : v[i].detach()));
  const Tensor out = call(f, xs, op);
  check_one_element(out, op);
  const Tensor primal = forward_ad::unpack_dual(out).primal;
  HVP result{create_graph ? primal : primal.detach(), {}};
  if (!out.requires_grad()) return result.hvp = finish({}, xs, false), result;
  const std::vector<Tensor> g = grad({out}, xs, {}, true, true, true);
  std::vector<Tensor> tangents;
  for (const Tensor& gi : g)
    tangents.push_back(gi.defined() ? forward_ad::unpack_dual(gi).tangent : Tensor());
  result.hvp = finish(tangents, leaves, create_graph);
  return result;
}

HVP vhp(const Fn& f, const std::vector<Tensor>& inputs, const std::vector<Tensor>& v,
        bool create_graph) {
  return hessian_vector(f, inputs, v, create_graph, "vhp");
}

namespace {

// Row j of the Jacobian is the vjp with the j-th unit vector of the output.
Tensor jacobian_of(const std::function<Tensor(const Tensor&)>& f, const Tensor& x,
                   bool create_graph, std::string_view op) {
  profile::Scope scope(op);
  GradModeScope grad_mode(true);
  const Tensor input = prepare({x}, create_graph, op)[0];
  const Tensor out = call([&](const std::vector<Tensor>& in) { return f(in[0]); }, {input}, op);
  Shape shape = out.shape();
  shape.insert(shape.end(), x.shape().begin(), x.shape().end());
  if (!out.requires_grad() || out.numel() == 0) return zeros(shape, out.dtype(), out.device());
  const Tensor units = eye(out.numel(), out.dtype());
  std::vector<Tensor> rows;
  for (int64_t j = 0; j < out.numel(); ++j) {
    const Tensor unit = units.select(0, j).reshape(out.shape());
    rows.push_back(
        finish(grad({out}, {input}, {unit}, true, create_graph, true)[0], input, create_graph));
  }
  return stack(rows, 0).reshape(shape);
}

}  // namespace

Tensor jacobian(const std::function<Tensor(const Tensor&)>& f, const Tensor& x, bool create_graph) {
  return jacobian_of(f, x, create_graph, "jacobian");
}

// The Jacobian of x -> df/dx, recorded so that it can be differentiated.
Tensor hessian(const std::function<Tensor(const Tensor&)>& f, const Tensor& x, bool create_graph) {
  constexpr std::string_view op = "hessian";
  const auto gradient = [&](const Tensor& z) {
    const Tensor out = call([&](const std::vector<Tensor>& in) { return f(in[0]); }, {z}, op);
    check_one_element(out, op);
    if (!out.requires_grad()) return zeros(z.shape(), z.dtype(), z.device());
    const Tensor g = detail::grad_for_graph({out}, {z}, {})[0];  // only differentiated
    return g.defined() ? g : zeros(z.shape(), z.dtype(), z.device());
  };
  return jacobian_of(gradient, x, create_graph, op);
}

}  // namespace ember::autograd::functional
