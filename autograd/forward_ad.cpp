// Dual levels, make_dual and unpack_dual (autograd/forward_ad.h) over the core of
// graph/forward_ad.h.
#include "autograd/forward_ad.h"

#include "graph/autograd.h"
#include "graph/forward_ad.h"

namespace ember::autograd::forward_ad {

namespace {

// An alias of x (a view of all of it): the gradient passes through, and so does the tangent.
struct AliasBackward final : Node {
  std::vector<Tensor> apply(std::vector<Tensor>& grads) override { return {grads[0]}; }
  bool differentiable_backward() const override { return true; }
  std::vector<Tensor> jvp(const std::vector<Tensor>&, const std::vector<Tensor>& tangents,
                          const std::vector<Tensor>&) override {
    return {tangents[0]};
  }
};

Tensor alias(const Tensor& x, std::string_view op) {
  return record<AliasBackward>(op, make_view(x, x.shape(), x.strides(), x.storage_offset()), {x});
}

}  // namespace

DualLevel::DualLevel() : depth_(fwd::open_level()) {}
DualLevel::~DualLevel() { fwd::close_level(depth_); }

Tensor make_dual(const Tensor& primal, const Tensor& tangent) {
  constexpr std::string_view op = "make_dual";
  EMBER_CHECK(primal.defined() && tangent.defined(), "{}: the primal or the tangent is undefined",
              op);
  EMBER_CHECK(fwd::open_levels() > 0,
              "{}: no dual level is open (make an autograd::forward_ad::DualLevel first)", op);
  EMBER_CHECK(is_floating(primal.dtype()), "{}: the primal is {}, expected a floating dtype", op,
              primal.dtype());
  EMBER_CHECK(tangent.shape() == primal.shape(),
              "{}: the tangent's shape {} differs from the primal's {}", op, tangent.shape(),
              primal.shape());
  EMBER_CHECK(tangent.dtype() == primal.dtype(), "{}: the tangent is {}, the primal {}", op,
              tangent.dtype(), primal.dtype());
  EMBER_CHECK(tangent.device() == primal.device(), "{}: the tangent is on {}, the primal on {}", op,
              tangent.device(), primal.device());
  const Tensor out = alias(primal, op);
  fwd::set_tangent(out, fwd::open_levels() - 1, tangent);
  return out;
}

UnpackedDual unpack_dual(const Tensor& t) {
  EMBER_CHECK(t.defined(), "unpack_dual: the tensor is undefined");
  if (fwd::open_levels() == 0) return {t, Tensor()};
  const uint32_t depth = fwd::open_levels() - 1;
  Tensor tangent = fwd::tangent(t, depth);
  if (!tangent.defined()) return {t, Tensor()};
  Tensor primal;
  {
    fwd::VisibleLevels outer(depth);  // the alias keeps the outer levels' tangents only
    primal = alias(t, "unpack_dual");
  }
  return {primal, tangent};
}

}  // namespace ember::autograd::forward_ad
