// Losses with torch semantics and Reduction::{None, Mean, Sum}. nll_loss and cross_entropy take
// class scores (C), (N, C) or (N, C, d1, …) with targets (), (N) or (N, d1, …), as torch.
#pragma once

#include "graph/tensor.h"

namespace ember {

// The ops of this family that are also Tensor methods are declared in graph/tensor_ops.def.

}  // namespace ember
