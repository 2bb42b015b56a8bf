// Losses with torch semantics and Reduction::{None, Mean, Sum}.
#pragma once

#include "graph/tensor.h"

namespace ember {

// The ops of this family that are also Tensor methods are declared in graph/tensor_ops.def.

}  // namespace ember
