// The Tensor methods of graph/tensor_ops.def: each forwards to the free op of its row. Also the
// methods that copy and record a Node (to, clone): the core (graph/tensor.cpp) records nothing.
#include "graph/autograd.h"
#include "graph/copy.h"
#include "graph/tensor.h"
#include "ops/elementwise.h"
#include "ops/index.h"
#include "ops/linalg.h"
#include "ops/loss.h"
#include "ops/nn_functional.h"
#include "ops/reduce.h"
#include "ops/shape.h"

namespace ember {

#define EMBER_DEFAULT(...)
#define EMBER_OP(R, name, args, ...)  \
  R Tensor::name(__VA_ARGS__) const { \
    const Tensor& self = *this;       \
    return ember::name args;          \
  }
#include "graph/tensor_ops.def"
#undef EMBER_OP
#undef EMBER_DEFAULT

namespace {

// d(to(x))/dx: the gradient converted back to the input's dtype.
struct ToBackward final : Node {
  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    return {grads[0].to(input_dtypes[0])};
  }
  bool differentiable_backward() const override { return true; }
  // Forward: dY = dX converted to y's dtype
  std::vector<Tensor> jvp(const std::vector<Tensor>&, const std::vector<Tensor>& t,
                          const std::vector<Tensor>& out) override {
    return {t[0].to(out[0].dtype())};
  }
};

// to(Device[, DType]): the gradient goes back to the input's device and dtype.
struct ToDeviceBackward final : Node {
  explicit ToDeviceBackward(Device source) : source_(source) {}
  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    return {grads[0].to(source_, input_dtypes[0])};
  }
  bool differentiable_backward() const override { return true; }
  // Forward: dY = dX moved to y's device and dtype
  std::vector<Tensor> jvp(const std::vector<Tensor>&, const std::vector<Tensor>& t,
                          const std::vector<Tensor>& out) override {
    return {t[0].to(out[0].device(), out[0].dtype())};
  }
  Device source_;
};

// clone/contiguous: the identity on values.
struct CloneBackward final : Node {
  std::vector<Tensor> apply(std::vector<Tensor>& grads) override { return {grads[0]}; }
  bool differentiable_backward() const override { return true; }
  // Forward: dY = dX (copied by the forward step: y shares no memory with x)
  std::vector<Tensor> jvp(const std::vector<Tensor>&, const std::vector<Tensor>& t,
                          const std::vector<Tensor>&) override {
    return {t[0]};
  }
};

}  // namespace

Tensor Tensor::to(DType target) const {
  constexpr std::string_view op = "to";
  EMBER_CHECK(defined(), "{}: undefined tensor", op);
  if (target == dtype()) return *this;
  Tensor out = empty(shape(), target, device());
  copy_into(out, *this);
  if (!is_floating(target)) return out;  // an integral result carries no gradient
  return record<ToBackward>(op, out, {*this});
}

Tensor Tensor::to(const Device& target) const {
  EMBER_CHECK(defined(), "to: undefined tensor");
  return to(target, dtype());
}

Tensor Tensor::to(const Device& target, DType dtype) const {
  constexpr std::string_view op = "to";
  EMBER_CHECK(defined(), "{}: undefined tensor", op);
  if (target == device()) return to(dtype);
  check_device(target, op);
  const Tensor x = detach();  // one node below records the whole move
  Tensor out;
  if (x.device().is_cpu()) {
    // to a GPU: converted and laid out on the host, then one copy
    const Tensor src = x.to(dtype).contiguous();  // may be a view at an offset (a narrow)
    out = empty(src.shape(), dtype, target);
    cuda::detail::copy_bytes(out.data_bytes(), target, src.data_bytes(), kCPU,
                             static_cast<size_t>(src.numel()) * element_size(dtype));
  } else {
    // from a GPU: the stretch of storage the view spans to the host, the same view there, then
    // on from the host
    int64_t span = x.numel() == 0 ? 0 : 1;
    for (int64_t d = 0; d < x.dim() && span > 0; ++d) span += (x.size(d) - 1) * x.stride(d);
    const Tensor host = empty({span}, x.dtype());
    const size_t itemsize = element_size(x.dtype());
    cuda::detail::copy_bytes(host.data_bytes(), kCPU, x.data_bytes(), x.device(),
                             static_cast<size_t>(span) * itemsize);
    const Tensor view = make_view(host, x.shape(), x.strides(), 0);
    out = target.is_cpu() ? view.to(dtype).contiguous() : view.to(target, dtype);
  }
  if (!is_floating(dtype)) return out;
  return record<ToDeviceBackward>(op, out, {*this}, device());
}

Tensor Tensor::clone() const {
  constexpr std::string_view op = "clone";
  EMBER_CHECK(defined(), "{}: undefined tensor", op);
  Tensor out = empty(shape(), dtype(), device());
  copy_into(out, *this);
  return record<CloneBackward>(op, out, {*this});
}

}  // namespace ember
