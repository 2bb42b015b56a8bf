// Forward-mode autograd, as torch.autograd.forward_ad: open a DualLevel, give inputs tangents
// with make_dual, run the function, read the output's tangent (J v) with unpack_dual.
//
//   autograd::forward_ad::DualLevel level;
//   const Tensor x = autograd::forward_ad::make_dual(primal, direction);
//   const Tensor jv = autograd::forward_ad::unpack_dual(f(x)).tangent;
//
// Levels nest (as JAX's do): a jvp inside a jvp gives second derivatives. How tangents live and
// move is Note [Forward grads] in graph/forward_ad.h.
#pragma once

#include <cstdint>

#include "graph/tensor.h"

namespace ember::autograd::forward_ad {

// torch's `with dual_level():`: a dual level open while alive, on this thread. Tangents made at it
// are dropped when it ends; the levels outside it keep theirs. Levels end innermost first.
class DualLevel {
 public:
  DualLevel();
  ~DualLevel();
  DualLevel(const DualLevel&) = delete;
  DualLevel& operator=(const DualLevel&) = delete;

 private:
  uint32_t depth_;
};

// A view of primal carrying `tangent` at the innermost open level (differentiable in reverse
// mode as a view of primal; the tangent is kept as given, its own graph included). The tangent
// must have primal's shape, dtype and device, and a level must be open: else an Error.
Tensor make_dual(const Tensor& primal, const Tensor& tangent);

struct UnpackedDual {
  Tensor primal;   // a view without the innermost level's tangent (the outer levels' kept)
  Tensor tangent;  // the innermost level's tangent; undefined where there is none
};
// The primal and the tangent of t at the innermost open level.
UnpackedDual unpack_dual(const Tensor& t);

}  // namespace ember::autograd::forward_ad
