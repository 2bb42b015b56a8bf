// Neural-network functions with fused kernels, one family a file: softmax and log_softmax
// (ops/softmax.cpp), layer_norm (ops/layer_norm.cpp), dropout (ops/dropout.cpp), embedding
// (ops/embedding.cpp), scaled_dot_product_attention (ops/attention.cpp) and head_attention
// (ops/head_attention.cpp).
#pragma once

#include "graph/tensor.h"

namespace ember {

// The ops of this family that are also Tensor methods are declared in graph/tensor_ops.def.

// The h heads of the Annotated Transformer's attention() in one op, for nn::MultiHeadedAttention
// (Note [Head attention] in ops/head_attention.cpp). q (B, Tq, h·d_k), k and v (B, Tk, h·d_k) hold
// the heads side by side in their last dim, as the projections make them. For each head,
// Q Kᵀ / sqrt(d_k), masked_fill(keep == 0, -1e9), softmax over the keys, dropout(dropout_p), times
// V: `values` (B, Tq, h·d_k) with the heads merged again, and `p_attn` (B, h, Tq, Tk), the weights
// after dropout, as the original keeps them (outside the graph). keep broadcasts to (B, Tq, Tk)
// and is TRUE (nonzero) WHERE ATTENDING IS ALLOWED; undefined, every key takes part. A row with
// no key allowed gets uniform weights, as the original's -1e9 fill. Dropout draws from the global
// generator whenever dropout_p > 0 (pass 0 outside training) and drops what dropout() on p_attn
// would.
struct HeadAttention {
  Tensor values, p_attn;
};
HeadAttention head_attention(const Tensor& q, const Tensor& k, const Tensor& v, int64_t heads,
                             const Tensor& keep = {}, double dropout_p = 0.0);

}  // namespace ember
