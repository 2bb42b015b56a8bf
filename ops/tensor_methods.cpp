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
};

// clone/contiguous: the identity on values.
struct CloneBackward final : Node {
  std::vector<Tensor> apply(std::vector<Tensor>& grads) override { return {grads[0]}; }
  bool differentiable_backward() const override { return true; }
};

}  // namespace

Tensor Tensor::to(DType target) const {
  constexpr std::string_view op = "to";
  EMBER_CHECK(defined(), "{}: undefined tensor", op);
  if (target == dtype()) return *this;
  Tensor out = empty(shape(), target);
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
  // Copies between devices come with the CUDA backend's storage; until then check_device refuses
  // every device but the CPU, saying why (Note [CUDA availability] in graph/device.h).
  check_device(target, op);
  throw Error(fmt::format("{}: no copy from {} to {} in this build", op, device(), target));
}

Tensor Tensor::clone() const {
  constexpr std::string_view op = "clone";
  EMBER_CHECK(defined(), "{}: undefined tensor", op);
  Tensor out = empty(shape(), dtype());
  copy_into(out, *this);
  return record<CloneBackward>(op, out, {*this});
}

}  // namespace ember
