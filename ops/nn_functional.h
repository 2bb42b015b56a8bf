// Neural-network functions with fused kernels: softmax, log_softmax, layer_norm, dropout,
// embedding and scaled_dot_product_attention.
#pragma once

#include "graph/tensor.h"

namespace ember {

// The ops of this family that are also Tensor methods are declared in graph/tensor_ops.def.

}  // namespace ember
