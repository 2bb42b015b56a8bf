// oneDNN's convolution primitives (Debian's libdnnl 2.6, direct kernels in its blocked layouts)
// behind ops/conv.cpp: forward, backward-data and backward-weights on the caller's Float32 NCHW
// tensors, their products in Float32 or, under bfloat16 products, on operands rounded to bfloat16,
// with the reorders to and from oneDNN's layouts inside (Note [Convolutions in oneDNN] in
// ops/conv_dnnl.cpp). Internal to ops/conv.cpp and its tests; no autograd, no oneDNN header.
#pragma once

#include <array>
#include <cstdint>
#include <string>

namespace ember::detail {

// One 2-D convolution: an image (N, C, in…) read by a weight (O, C / G, kernel…) into (N, O,
// out…), out = (in + pad_l + pad_r - dilation·(kernel - 1) - 1) / stride + 1 in each dim. A
// transposed convolution is the backward-data of the convolution whose image is its output.
struct ConvDesc {
  int64_t N = 0, C = 0, O = 0, G = 1;
  std::array<int64_t, 2> in{1, 1}, out{1, 1}, kernel{1, 1}, stride{1, 1}, pad_l{0, 0}, pad_r{0, 0},
      dilation{1, 1};
  bool bias = false;  // forward: adds a bias (O); backward-weights: also gives its gradient
  // The two multiplied operands (forward: x and w; backward-data: dy and w; backward-weights: x
  // and dy) rounded to bfloat16 (to nearest, ties to even) by the reorders into oneDNN's layouts,
  // products and sums in Float32, every result (y, dx, dw, db) and the bias Float32: the
  // convolution under set_float32_matmul_precision("medium") where the CPU has bfloat16 products.
  // (A bias gradient here would sum the rounded dy: ops/conv.cpp sums dy itself instead.)
  bool bf16 = false;
};

// Whether Ember was built with oneDNN (EMBER_HAVE_DNNL).
bool onednn_built();
// Whether Float32 convolutions on the CPU use oneDNN now: built with it, and not switched off by
// the environment (EMBER_CONV=im2col, read once) or set_conv_uses_onednn(false).
bool conv_uses_onednn();
// Switches the oneDNN path on or off for the whole process (tests compare the two paths). On has
// no effect where Ember was built without oneDNN.
void set_conv_uses_onednn(bool on);
// Whether Float32 convolutions that suit Winograd's kernels run them now (Note [Winograd
// convolutions] in ops/conv_dnnl.cpp): not switched off by the environment (EMBER_CONV=direct,
// read once) or set_conv_winograd(false).
bool conv_uses_winograd();
// Switches Winograd's kernels on or off for the whole process (tests compare them with the direct
// kernels).
void set_conv_winograd(bool on);
// Whether the forward of d runs Winograd's kernels now (making its primitive if not yet).
bool onednn_uses_winograd(const ConvDesc& d);
// oneDNN's name for the kernel of d's backward-weights (its direct one, on one thread, as Note
// [Weight gradients in pieces] runs it: "jit:avx2", "jit:avx512_core", ...), made now if not yet;
// "" where oneDNN has none.
std::string onednn_weight_kernel(const ConvDesc& d);
// The primitives made so far and kept (one per convolution, direction, data type and thread
// count).
int64_t onednn_cached_primitives();

// The kernels, on contiguous Float32 buffers; every size of d positive. They run on Ember's
// thread count (one thread inside a parallel region). Each returns true when it ran; false, with
// nothing written, where d.bf16 and oneDNN has no bfloat16 primitive for d on this CPU (the
// caller then computes it otherwise). A Float32 primitive oneDNN cannot make is an Error.
// y (N, O, out…) = conv(x (N, C, in…), w (O, C/G, kernel…)) + b (O) where d.bias.
bool onednn_conv_forward(const ConvDesc& d, const float* x, const float* w, const float* b,
                         float* y);
// dx (N, C, in…) = the input gradient of the convolution for dy (N, O, out…).
bool onednn_conv_backward_data(const ConvDesc& d, const float* dy, const float* w, float* dx);
// dw (O, C/G, kernel…) = the weight gradient for x and dy; db (O) = Σ dy over (N, out…) where
// d.bias. Also false where oneDNN's kernel for d is one measured slower than im2col (Note
// [Single-channel weight gradients] in ops/conv_dnnl.cpp).
bool onednn_conv_backward_weights(const ConvDesc& d, const float* x, const float* dy, float* dw,
                                  float* db);

}  // namespace ember::detail
