// Finite-difference gradient checking (see autograd/gradcheck.h for the method).
#include "autograd/gradcheck.h"

#include <cmath>
#include <random>

#include "autograd/engine.h"
#include "autograd/forward_ad.h"
#include "graph/autograd.h"
#include "graph/creation.h"
#include "ops/index.h"

namespace ember {

namespace {

// Storage offsets (in elements) of every element of t, in row-major order.
std::vector<int64_t> element_offsets(const Tensor& t) {
  std::vector<int64_t> offsets(t.numel());
  Shape index(t.dim(), 0);
  for (int64_t k = 0; k < t.numel(); ++k) {
    int64_t off = t.storage_offset();
    for (int64_t d = 0; d < t.dim(); ++d) off += index[d] * t.stride(d);
    offsets[k] = off;
    for (int64_t d = t.dim() - 1; d >= 0 && ++index[d] == t.size(d); --d) index[d] = 0;
  }
  return offsets;
}

double dot(const Tensor& y, const std::vector<double>& v) {
  const std::vector<double> values = y.to_vector<double>();
  double s = 0;
  for (size_t i = 0; i < values.size(); ++i) s += values[i] * v[i];
  return s;
}

void check_inputs(const std::vector<Tensor>& inputs) {
  bool any = false;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Tensor& x = inputs[i];
    if (!x.defined() || !x.requires_grad()) continue;
    any = true;
    EMBER_CHECK(x.dtype() == kFloat64, "gradcheck: input {} is {}, expected Float64", i, x.dtype());
    for (int64_t d = 0; d < x.dim(); ++d)
      EMBER_CHECK(x.stride(d) != 0 || x.size(d) <= 1,
                  "gradcheck: input {} of shape {} has overlapping (expanded) memory", i,
                  x.shape());
  }
  EMBER_CHECK(any, "gradcheck: no input requires grad");
}

// v · (J e_j) for element j of input i, by forward mode: input i made dual with the tangent e_j.
double forward_column(const std::function<Tensor(const std::vector<Tensor>&)>& f,
                      const std::vector<Tensor>& inputs, size_t i, int64_t j,
                      const std::vector<double>& v) {
  const Tensor& x = inputs[i];
  std::vector<double> basis(x.numel(), 0.0);
  basis[j] = 1.0;
  autograd::forward_ad::DualLevel level;
  std::vector<Tensor> dual = inputs;
  // under grad mode, so the dual view stays linked to its leaf (gradgradcheck's f differentiates
  // in the leaves)
  {
    GradModeScope grad_mode(true);
    dual[i] =
        autograd::forward_ad::make_dual(x, from_vector(basis, x.shape(), x.dtype()).to(x.device()));
  }
  const Tensor tangent = autograd::forward_ad::unpack_dual(f(dual)).tangent;
  return tangent.defined() ? dot(tangent, v) : 0.0;
}

}  // namespace

GradcheckResult gradcheck(const std::function<Tensor(const std::vector<Tensor>&)>& f,
                          const std::vector<Tensor>& inputs, const GradcheckOptions& options) {
  check_inputs(inputs);
  std::mt19937_64 gen(20261129);
  std::normal_distribution<double> normal;
  GradcheckResult result{true, 0.0, "ok"};
  double worst_excess = -1;

  for (int projection = 0; projection < 2; ++projection) {
    // Analytic: Jᵀ v by backward.
    std::vector<Tensor> saved_grads;
    for (const Tensor& x : inputs) {
      saved_grads.push_back(x.defined() ? x.grad() : Tensor());
      if (x.defined()) x.set_grad({});
    }
    const Tensor y = f(inputs);
    EMBER_CHECK(y.defined() && is_floating(y.dtype()),
                "gradcheck: f must return a floating tensor");
    std::vector<double> v(y.numel());
    for (double& e : v) e = normal(gen);
    if (y.requires_grad()) y.backward(from_vector(v, y.shape(), y.dtype()).to(y.device()));

    for (size_t i = 0; i < inputs.size(); ++i) {
      const Tensor& x = inputs[i];
      if (!x.defined() || !x.requires_grad()) continue;
      const Tensor g = x.grad();
      const std::vector<double> analytic =
          g.defined() ? g.to_vector<double>() : std::vector<double>(x.numel(), 0.0);
      x.set_grad(saved_grads[i]);

      // Numeric: central differences of f · v, one element at a time, written in place: through
      // the host pointer on the CPU, by fill_ of the element's 0-d view on a device
      const bool on_cpu = x.device().is_cpu();
      double* base = on_cpu ? static_cast<double*>(x.impl()->storage->data()) : nullptr;
      const std::vector<int64_t> offsets = on_cpu ? element_offsets(x) : std::vector<int64_t>();
      const std::vector<double> values = on_cpu ? std::vector<double>() : x.to_vector<double>();
      NoGradGuard no_grad;
      for (int64_t j = 0; j < x.numel(); ++j) {
        Tensor element = x.detach();  // element j's 0-d view (on a device)
        for (int64_t rest = j, d = 0; !on_cpu && d < x.dim(); ++d) {
          int64_t below = 1;
          for (int64_t k = d + 1; k < x.dim(); ++k) below *= x.size(k);
          element = element.select(0, rest / below);
          rest %= below;
        }
        const auto set = [&](double value) {
          if (on_cpu)
            base[offsets[j]] = value;
          else
            element.fill_(value);
        };
        const double orig = on_cpu ? base[offsets[j]] : values[j];
        set(orig + options.eps);
        const double plus = dot(f(inputs), v);
        set(orig - options.eps);
        const double minus = dot(f(inputs), v);
        set(orig);
        const double numeric = (plus - minus) / (2 * options.eps);
        const auto compare = [&](double value, double reference, std::string_view kind) {
          const double err = std::abs(value - reference);
          const double excess = err - (options.atol + options.rtol * std::abs(reference));
          result.max_abs_error = std::max(result.max_abs_error, err);
          if (excess > worst_excess) {
            worst_excess = excess;
            result.message = fmt::format(
                "input {} (shape {}) element {}: {} {:.10g} against {:.10g}, "
                "error {:.3g}",
                i, x.shape(), j, kind, value, reference, err);
          }
          if (excess > 0) result.ok = false;
        };
        compare(analytic[j], numeric, "analytic (backward) against numeric:");
        if (options.check_forward_ad && projection == 0) {
          // ⟨J e_j, v⟩ against the finite differences, and against ⟨e_j, Jᵀ v⟩ from backward
          const double forward = forward_column(f, inputs, i, j, v);
          compare(forward, numeric, "forward-mode against numeric:");
          compare(forward, analytic[j], "forward-mode against backward:");
        }
      }
    }
  }
  if (result.ok) result.message = fmt::format("ok (max abs error {:.3g})", result.max_abs_error);
  return result;
}

GradcheckResult gradgradcheck(const std::function<Tensor(const std::vector<Tensor>&)>& f,
                              const std::vector<Tensor>& inputs,
                              const std::vector<Tensor>& grad_outputs,
                              const GradcheckOptions& options) {
  check_inputs(inputs);
  std::vector<Tensor> differentiable;
  for (const Tensor& x : inputs)
    if (x.defined() && x.requires_grad()) differentiable.push_back(x);
  std::vector<Tensor> v = grad_outputs;
  if (v.empty()) {
    std::mt19937_64 gen(20261203);
    std::normal_distribution<double> normal;
    const Tensor y = f(inputs);
    EMBER_CHECK(y.defined() && is_floating(y.dtype()),
                "gradgradcheck: f must return a floating tensor");
    std::vector<double> values(y.numel());
    for (double& e : values) e = normal(gen);
    v.push_back(from_vector(values, y.shape(), y.dtype()).to(y.device()));
  }
  EMBER_CHECK(v.size() == 1, "gradgradcheck: {} grad_outputs for f's one output", v.size());
  // The grad_output is an input of the first derivatives too, as in torch: a backward formula
  // must be differentiable in the incoming gradient as well as in the inputs.
  const Tensor grad_output =
      v[0].dtype() == kFloat64 ? v[0].detach().clone().requires_grad_() : v[0].detach();
  std::vector<Tensor> all_inputs = inputs;
  all_inputs.push_back(grad_output);
  // x, v -> the first derivatives vᵀ J, one flat tensor (zeros where f does not reach an input).
  // It reads the tensors gradcheck hands it (the same ones, or dual views of them under
  // check_forward_ad, whose tangents then flow through the backward's ops).
  const auto first_derivatives = [&](const std::vector<Tensor>& in) {
    GradModeScope grad_mode(true);  // gradcheck evaluates under NoGradGuard
    const Tensor y = f(std::vector<Tensor>(in.begin(), in.end() - 1));
    if (!y.requires_grad()) return zeros({0}, kFloat64, y.device());
    const std::vector<Tensor> grads =
        autograd::grad({y}, differentiable, {in.back()}, true, true, true);
    std::vector<Tensor> flat;
    for (size_t i = 0; i < grads.size(); ++i)
      flat.push_back(grads[i].defined() ? grads[i].reshape({-1})
                                        : zeros({differentiable[i].numel()}, kFloat64,
                                                differentiable[i].device()));
    return cat(flat, 0);
  };
  return gradcheck(first_derivatives, all_inputs, options);
}

}  // namespace ember
