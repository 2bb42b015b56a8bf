// Upsample: its options kept, its forward the functional op (ops/resample.cpp), which checks them
// against the input.
#include "nn/resample.h"

#include <utility>

namespace ember::nn {

Upsample::Upsample(IntList size, std::string mode, std::optional<bool> align_corners)
    : size(std::move(size)), mode(std::move(mode)), align_corners(align_corners) {}

Tensor Upsample::forward(const Tensor& x) const {
  return interpolate(x, size, mode, align_corners);
}

}  // namespace ember::nn
