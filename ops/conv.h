// Convolutions as torch.nn.functional: conv1d and conv2d, and their transposes, with stride,
// padding (numbers, or "same" / "valid"), dilation and groups (depthwise included), on batched
// (N, C, spatial…) or unbatched (C, spatial…) inputs. One 2-D implementation carries both ranks
// (a 1-D input is a 2-D one of height 1): im2col (or its adjoint col2im) and one product per
// group (Note [Convolution as products] in ops/conv.cpp).
#pragma once

#include <initializer_list>
#include <string>

#include "graph/tensor.h"
#include "ops/spatial.h"

namespace ember {

// A convolution's padding: numbers (one for every spatial dim, or one per dim), or "same" (the
// output as large as the input: stride 1 only; an odd total pads one more on the right, as
// torch) or "valid" (no padding). Another string is an Error at the convolution.
struct Padding {
  Padding(int64_t value) : values{value} {}
  Padding(int value) : values{value} {}  // so that a literal 0 is not ambiguous with const char*
  Padding(IntList v) : values(std::move(v)) {}
  Padding(std::initializer_list<int64_t> v) : values(v) {}
  Padding(const char* name) : mode(name) {}

  IntList values;    // when mode is empty
  std::string mode;  // "", "same" or "valid"
};

// x (N, C_in, L) or (C_in, L); weight (C_out, C_in / groups, k); bias (C_out) or undefined.
Tensor conv1d(const Tensor& x, const Tensor& weight, const Tensor& bias = {}, IntList stride = {1},
              Padding padding = 0, IntList dilation = {1}, int64_t groups = 1);
// x (N, C_in, H, W) or (C_in, H, W); weight (C_out, C_in / groups, kH, kW); bias (C_out).
Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias = {}, IntList stride = {1},
              Padding padding = 0, IntList dilation = {1}, int64_t groups = 1);

// The adjoints of the convolutions (torch's argument order): weight (C_in, C_out / groups, k…);
// each output size (in - 1)·stride - 2·padding + dilation·(k - 1) + output_padding + 1, with
// output_padding smaller than the stride or the dilation.
Tensor conv_transpose1d(const Tensor& x, const Tensor& weight, const Tensor& bias = {},
                        IntList stride = {1}, IntList padding = {0}, IntList output_padding = {0},
                        int64_t groups = 1, IntList dilation = {1});
Tensor conv_transpose2d(const Tensor& x, const Tensor& weight, const Tensor& bias = {},
                        IntList stride = {1}, IntList padding = {0}, IntList output_padding = {0},
                        int64_t groups = 1, IntList dilation = {1});

}  // namespace ember
