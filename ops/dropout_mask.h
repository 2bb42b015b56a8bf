// The mask of inverted dropout, shared by dropout (ops/dropout.cpp) and the dropout of attention
// weights (scaled_dot_product_attention in ops/attention.cpp, head_attention in
// ops/head_attention.cpp), all defined in ops/dropout.cpp. Internal to ops/.
#pragma once

#include <cstdint>
#include <string_view>

#include "graph/tensor.h"

namespace ember {

// Note [Dropout masks]
// One draw of the global generator keys a counter-based stream (counter_bits): pair j's 64 bits
// decide element j by their low half and element j + n/2 by their high half, dropped when the half
// is below p * 2^32 (p to within 2^-32). The loop vectorises and splits across threads, and one
// seed gives one mask on any thread count. dropout's forward also writes the mask, a byte an
// element (as torch's bool mask), for its backward: recomputing it there cost as much as the
// forward (the hash is most of a pass; on AVX2, without a 64-bit lane multiply, twice the
// multiply), reading a byte a fraction of it. Attention's dropout of its weights (sdpa,
// head_attention) still recomputes the mask from the key in its backward, where the weights are
// few and saving nothing is worth more.
struct DropoutMask {
  uint64_t key;
  uint32_t threshold;  // p * 2^32, below 2^32 as p < 1
  double scale;        // 1 / (1 - p)
};

// A fresh mask for probability p in (0, 1): one draw of the global generator.
DropoutMask dropout_mask(double p);

// x with m applied (a new tensor of x's shape), and m's kept elements into keep (Bool, x.numel()
// elements, contiguous) when keep is given.
Tensor apply_dropout_mask(const Tensor& x, const DropoutMask& m, std::string_view op,
                          const Tensor& keep = {});

// How dropout was applied to P: not at all, with a mask key, or every element dropped (p = 1).
struct AttentionDropout {
  enum { None, Mask, All } kind = None;
  DropoutMask mask{};
};

// The dropout of attention weights with probability p in [0, 1], as dropout()'s.
AttentionDropout attention_dropout(double p);

// t with d applied: masked and scaled, all zeros, or t itself.
Tensor apply_attention_dropout(const Tensor& t, const AttentionDropout& d, std::string_view op);

// The dropout of a weights tensor of `shape` as a constant factor: 0 where dropped, the scale
// elsewhere (apply_attention_dropout(t) is t times it); undefined without dropout.
Tensor attention_dropout_factor(const Shape& shape, DType dtype, const AttentionDropout& d,
                                std::string_view op);

}  // namespace ember
