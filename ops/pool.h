// Pooling over the spatial dims of (N, C, L) / (N, C, H, W) inputs, or unbatched (C, L) /
// (C, H, W): max pooling (with torch's return_indices), average pooling and adaptive average
// pooling, with torch.nn.functional's arguments and semantics. IntList arguments hold one value
// for every spatial dim or one per dim (ops/spatial.h); stride {} means kernel_size.
#pragma once

#include "graph/tensor.h"
#include "ops/spatial.h"

namespace ember {

// Max over each window of kernel_size taps spaced by dilation, moved by stride over the input
// padded with -inf on both sides by padding (at most half the kernel). ceil_mode rounds the
// output size up, keeping only windows that start inside the input or its left padding. NaN
// propagates (a window holding one gives NaN, as torch).
Tensor max_pool1d(const Tensor& x, IntList kernel_size, IntList stride = {}, IntList padding = {0},
                  IntList dilation = {1}, bool ceil_mode = false);
Tensor max_pool2d(const Tensor& x, IntList kernel_size, IntList stride = {}, IntList padding = {0},
                  IntList dilation = {1}, bool ceil_mode = false);

// max_pool2d's values, and as indices (Int64, the values' shape) the flat position h·W + w of
// each maximum in its input plane (H, W), as torch's return_indices.
struct MaxPoolResult {
  Tensor values, indices;
};
MaxPoolResult max_pool2d_with_indices(const Tensor& x, IntList kernel_size, IntList stride = {},
                                      IntList padding = {0}, IntList dilation = {1},
                                      bool ceil_mode = false);

// Mean over each window, the input padded with zeros by padding (at most half the kernel). The
// divisor is the window's size clipped to the padded input when count_include_pad, else the
// number of input elements in it.
Tensor avg_pool1d(const Tensor& x, IntList kernel_size, IntList stride = {}, IntList padding = {0},
                  bool ceil_mode = false, bool count_include_pad = true);
Tensor avg_pool2d(const Tensor& x, IntList kernel_size, IntList stride = {}, IntList padding = {0},
                  bool ceil_mode = false, bool count_include_pad = true);

// Mean over output_size windows along each spatial dim, window i of a dim of L spanning
// [floor(i·L/O), ceil((i+1)·L/O)): any O >= 0, divisor of L or not.
Tensor adaptive_avg_pool1d(const Tensor& x, IntList output_size);
Tensor adaptive_avg_pool2d(const Tensor& x, IntList output_size);

}  // namespace ember
