// Shape ops that are views: they share the input's storage and change only shape, strides and
// offset (reshape copies only when no view can express the result). reshape/view take one -1.
#pragma once

#include "graph/tensor.h"

namespace ember {

// The ops of this family that are also Tensor methods are declared in graph/tensor_ops.def.

}  // namespace ember
