// Convolutions and transposed convolutions (conv1d, conv2d, conv_transpose1d, conv_transpose2d)
// as im2col, one product per group, and col2im: the two data movements below are ops of their
// own, each the other's derivative, and everything else is bmm, views and a broadcast add, so a
// convolution differentiates to any order and runs on every device the products run on.
//
// Note [Convolution as products]
// For x (N, C, H, W), weight (C_out, C / G, kH, kW), G groups, K = kH·kW kernel offsets and
// L = OH·OW output positions, im2col lays out every input value a kernel offset reads:
//   cols[c·K + k, n·L + l] = x[n, c, oh·sH + ki·dH - pH, ow·sW + kj·dW - pW]   (0 outside)
// with k = ki·kW + kj and l = oh·OW + ow: (C·K, N·L), the batch beside the positions, so that each
// group's convolution is ONE product over the whole batch (Caffe's layout, with the batch folded
// into the columns):
//   y_g (C_out/G, N·L) = W_g (C_out/G, C/G·K) · cols_g (C/G·K, N·L)
// then (C_out, N, L) -> (N, C_out, OH, OW) and the bias. Its backward is the products' own:
//   dW_g = dY_g · cols_gᵀ        (a convolution of x with dY)
//   dcols_g = W_gᵀ · dY_g,  dX = col2im(dcols)   (a transposed convolution of dY)
// col2im is im2col's adjoint: it adds every column entry back into the input position it came
// from, so repeated reads (overlapping windows) accumulate. A transposed convolution is the same
// two steps in the other order: cols = Wᵀ · x, y = col2im(cols). On the CPU im2col and col2im
// are kernels (parallel over (row, sample) and (channel, sample): no two tasks write one
// element); on a device they are index_select and scatter_add over the input's plane with one
// zero slot appended for the padding, ops that already run there.
//
// Note [Convolution kernels]
// Every convolution, transposed or not, is one of three bilinear ops on an image (N, C, in…), a
// weight (O, C/G, kernel…) and a result (N, O, out…), each written once:
//   convolution(img, W)       -> the result;                   y  = conv(img, W)
//   convolution_input(dY, W)  -> an image (the adjoint in img); dX = conv_input(dY, W)
//   convolution_weight(img, dY) -> a weight (the adjoint in W); dW = conv_weight(img, dY)
// with <dY, conv(img, W)> = <conv_input(dY, W), img> = <conv_weight(img, dY), W>, so each one's
// derivatives are the other two (and itself):
//   conv:         dimg = conv_input(dY, W),        dW = conv_weight(img, dY)
//   conv_input:   ddY  = conv(dX', W),             dW = conv_weight(dX', dY)   (dX' its upstream)
//   conv_weight:  dimg = conv_input(dY, dW'),      ddY = conv(img, dW')        (dW' its upstream)
// conv2d and conv1d (a height of 1) are conv (+ the bias), conv_transpose2d and conv_transpose1d
// are conv_input (+ the bias) of the convolution whose image is their output. Where oneDNN
// runs the call (Float32 on the CPU, Note [Convolutions in oneDNN] in ops/conv_dnnl.cpp: its
// forward, backward-data and backward-weights primitives, with bfloat16 operands under
// set_float32_matmul_precision("medium") where the CPU has bfloat16 products) each is an op of
// its own whose Node calls the other two, so create_graph differentiates them again, and a
// first-order backward (grad mode off) of conv gets the weight and bias gradients from one
// backward-weights call. Elsewhere (Float64, other devices, empty sizes, EMBER_CONV=im2col, a
// bfloat16 primitive oneDNN cannot make) each is im2col / col2im and products, as above (their
// products in bfloat16 under "medium" as every product's), and autograd differentiates those
// ops. Forward mode follows from the same bilinearity: each op's
// tangent is the op on one operand's tangent plus the op on the other's (conv's plus the bias's),
// and im2col and col2im, linear, are themselves on the tangent.
#include "ops/conv.h"

#include <algorithm>
#include <array>
#include <optional>
#include <tuple>
#include <utility>
#include <vector>

#include "graph/autograd.h"
#include "graph/creation.h"
#include "graph/profile.h"
#include "graph/strided.h"
#include "ops/common.h"
#include "ops/conv_dnnl.h"
#include "ops/index.h"
#include "ops/linalg.h"
#include "ops/reduce.h"

namespace ember {

namespace {

// One convolution's spatial layout in two dims (a 1-D one has in, out and kernel 1 along dim 0):
// the image side (N, C, in…), the kernel, and the positions (out…) of the columns.
// O and G: the result's channels and the groups (Note [Convolution kernels]).
struct Geometry {
  int64_t N = 0, C = 0, O = 0, G = 1;
  std::array<int64_t, 2> in{1, 1}, out{1, 1}, kernel{1, 1}, stride{1, 1}, pad{0, 0},
      dilation{1, 1};  // pad: before; whatever lies past the input reads as zero
  int64_t K() const { return kernel[0] * kernel[1]; }
  int64_t L() const { return out[0] * out[1]; }
  int64_t S() const { return in[0] * in[1]; }
};

// The output positions ow in [lo, hi) of one kernel column whose input ow·s + offset lies in
// [0, size).
std::array<int64_t, 2> inside(int64_t offset, int64_t s, int64_t size, int64_t count) {
  const int64_t lo = offset >= 0 ? 0 : std::min(count, (-offset + s - 1) / s);
  const int64_t last = size - 1 - offset;  // the largest ow·s allowed
  const int64_t hi = last < 0 ? lo : std::clamp(last / s + 1, lo, count);
  return {lo, hi};
}

// cols (C·K, N·L) from x (N, C, H, W), both contiguous (Note [Convolution as products]).
template <class T>
void im2col_kernel(const T* x, T* cols, const Geometry& g) {
  const int64_t K = g.K(), L = g.L(), S = g.S(), NL = g.N * L;
  const int64_t W = g.in[1], OH = g.out[0], OW = g.out[1];
  parallel_for(
      g.C * K * g.N,
      [&](int64_t begin, int64_t end) {
        for (int64_t t = begin; t < end; ++t) {
          const int64_t row = t / g.N, n = t % g.N, c = row / K, k = row % K;
          const int64_t ki = k / g.kernel[1], kj = k % g.kernel[1];
          const int64_t oi = ki * g.dilation[0] - g.pad[0], oj = kj * g.dilation[1] - g.pad[1];
          const auto [lo, hi] = inside(oj, g.stride[1], W, OW);
          const T* plane = x + (n * g.C + c) * S;
          T* dst = cols + row * NL + n * L;
          for (int64_t oh = 0; oh < OH; ++oh) {
            T* d = dst + oh * OW;
            const int64_t ih = oh * g.stride[0] + oi;
            if (ih < 0 || ih >= g.in[0]) {
              std::fill(d, d + OW, T(0));
              continue;
            }
            const T* src = plane + ih * W + oj;
            std::fill(d, d + lo, T(0));
            if (g.stride[1] == 1) {
              for (int64_t ow = lo; ow < hi; ++ow) d[ow] = src[ow];
            } else {
              const int64_t s = g.stride[1];
              for (int64_t ow = lo; ow < hi; ++ow) d[ow] = src[ow * s];
            }
            std::fill(d + hi, d + OW, T(0));
          }
        }
      },
      row_grain(L));
}

// x (N, C, H, W) = the sum of every column entry at the position it reads (col2im), x zeroed
// first; both contiguous.
template <class T>
void col2im_kernel(const T* cols, T* x, const Geometry& g) {
  const int64_t K = g.K(), L = g.L(), S = g.S(), NL = g.N * L;
  const int64_t W = g.in[1], OH = g.out[0], OW = g.out[1];
  parallel_for(
      g.C * g.N,
      [&](int64_t begin, int64_t end) {
        for (int64_t t = begin; t < end; ++t) {
          const int64_t c = t / g.N, n = t % g.N;
          T* plane = x + (n * g.C + c) * S;
          std::fill(plane, plane + S, T(0));
          for (int64_t k = 0; k < K; ++k) {
            const int64_t ki = k / g.kernel[1], kj = k % g.kernel[1];
            const int64_t oi = ki * g.dilation[0] - g.pad[0], oj = kj * g.dilation[1] - g.pad[1];
            const auto [lo, hi] = inside(oj, g.stride[1], W, OW);
            const T* src = cols + (c * K + k) * NL + n * L;
            for (int64_t oh = 0; oh < OH; ++oh) {
              const int64_t ih = oh * g.stride[0] + oi;
              if (ih < 0 || ih >= g.in[0]) continue;
              T* d = plane + ih * W + oj;
              const T* s_row = src + oh * OW;
              const int64_t s = g.stride[1];
              for (int64_t ow = lo; ow < hi; ++ow) d[ow * s] += s_row[ow];
            }
          }
        }
      },
      row_grain(K * L));
}

// For the device path: the flat input position each (k, l) reads, or S (a zero slot) outside.
Tensor read_positions(const Geometry& g) {
  std::vector<int64_t> pos(static_cast<size_t>(g.K() * g.L()));
  size_t i = 0;
  for (int64_t ki = 0; ki < g.kernel[0]; ++ki)
    for (int64_t kj = 0; kj < g.kernel[1]; ++kj)
      for (int64_t oh = 0; oh < g.out[0]; ++oh)
        for (int64_t ow = 0; ow < g.out[1]; ++ow) {
          const int64_t ih = oh * g.stride[0] + ki * g.dilation[0] - g.pad[0];
          const int64_t iw = ow * g.stride[1] + kj * g.dilation[1] - g.pad[1];
          const bool in = ih >= 0 && ih < g.in[0] && iw >= 0 && iw < g.in[1];
          pos[i++] = in ? ih * g.in[1] + iw : g.S();
        }
  return from_vector(pos, {g.K() * g.L()});
}

Tensor col2im(const Tensor& cols, const Geometry& g);
Tensor im2col(const Tensor& x, const Geometry& g);

// cols = im2col(x):  dX = col2im(dCols), itself an op (Note [Convolution as products])
struct Im2colBackward final : Node {
  explicit Im2colBackward(const Geometry& g) : g_(g) {}
  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    return {col2im(grads[0], g_).reshape(input_shapes[0])};
  }
  bool differentiable_backward() const override { return true; }
  // Forward: dCols = im2col(dX) (it is linear)
  std::vector<Tensor> jvp(const std::vector<Tensor>&, const std::vector<Tensor>& t,
                          const std::vector<Tensor>&) override {
    return {im2col(t[0], g_)};
  }
  Geometry g_;
};

// x = col2im(cols):  dCols = im2col(dX)
struct Col2imBackward final : Node {
  explicit Col2imBackward(const Geometry& g) : g_(g) {}
  std::vector<Tensor> apply(std::vector<Tensor>& grads) override { return {im2col(grads[0], g_)}; }
  bool differentiable_backward() const override { return true; }
  // Forward: dX = col2im(dCols) (it is linear)
  std::vector<Tensor> jvp(const std::vector<Tensor>&, const std::vector<Tensor>& t,
                          const std::vector<Tensor>&) override {
    return {col2im(t[0], g_)};
  }
  Geometry g_;
};

// x (N, C, in…) of any layout -> cols (C·K, N·L).
Tensor im2col(const Tensor& x, const Geometry& g) {
  constexpr std::string_view op = "im2col";
  const int64_t K = g.K(), L = g.L();
  if (!x.device().is_cpu()) {  // in ops (their own graph): gather from the plane plus a zero slot
    const Tensor plane = x.reshape({g.N, g.C, g.S()});
    const Tensor padded = cat({plane, zeros({g.N, g.C, 1}, x.dtype(), x.device())}, 2);
    const Tensor gathered = index_select(padded, 2, read_positions(g).to(x.device()));
    return gathered.reshape({g.N, g.C * K, L}).permute({1, 0, 2}).reshape({g.C * K, g.N * L});
  }
  Tensor xc;
  {
    NoGradGuard no_grad;
    xc = x.contiguous();
  }
  Tensor cols = empty({g.C * K, g.N * L}, x.dtype(), x.device());
  if (cols.numel() > 0)
    dispatch_float(x.dtype(), op,
                   [&]<class T>() { im2col_kernel<T>(xc.data<T>(), cols.data<T>(), g); });
  return record<Im2colBackward>(op, cols, {x}, g);
}

// cols (C·K, N·L) of any layout -> x (N, C, in…) (in as 2 dims; the caller views it).
Tensor col2im(const Tensor& cols, const Geometry& g) {
  constexpr std::string_view op = "col2im";
  const int64_t K = g.K(), L = g.L(), S = g.S();
  if (!cols.device().is_cpu()) {  // in ops: scatter_add into the plane plus a zero slot
    const Tensor src =
        cols.reshape({g.C * K, g.N, L}).permute({1, 0, 2}).reshape({g.N, g.C, K * L});
    const Tensor index = read_positions(g)
                             .to(cols.device())
                             .reshape({1, 1, K * L})
                             .expand({g.N, g.C, K * L})
                             .contiguous();
    const Tensor summed =
        scatter_add(zeros({g.N, g.C, S + 1}, cols.dtype(), cols.device()), 2, index, src);
    return summed.narrow(2, 0, S).reshape({g.N, g.C, g.in[0], g.in[1]});
  }
  Tensor cc;
  {
    NoGradGuard no_grad;
    cc = cols.contiguous();
  }
  Tensor x = zeros({g.N, g.C, g.in[0], g.in[1]}, cols.dtype(), cols.device());
  if (x.numel() > 0 && K * L > 0)
    dispatch_float(cols.dtype(), op,
                   [&]<class T>() { col2im_kernel<T>(cc.data<T>(), x.data<T>(), g); });
  return record<Col2imBackward>(op, x, {cols}, g);
}

IntList checked_positive(const IntList& values, int64_t n, std::string_view op,
                         std::string_view arg) {
  IntList v = expand_param(values, n, op, arg);
  for (int64_t s : v) EMBER_CHECK(s > 0, "{}: {} must be positive, got {}", op, arg, values);
  return v;
}

IntList checked_non_negative(const IntList& values, int64_t n, std::string_view op,
                             std::string_view arg) {
  IntList v = expand_param(values, n, op, arg);
  for (int64_t s : v) EMBER_CHECK(s >= 0, "{}: {} must be non-negative, got {}", op, arg, values);
  return v;
}

// The checks common to both directions: dtypes, devices, the weight's rank, groups, the bias.
void check_operands(const Tensor& x, const Tensor& weight, const Tensor& bias, int64_t n,
                    int64_t groups, bool transposed, std::string_view op) {
  check_floating(weight, op);
  EMBER_CHECK(x.dtype() == weight.dtype(), "{}: input is {} but weight is {} (shapes {} and {})",
              op, x.dtype(), weight.dtype(), x.shape(), weight.shape());
  check_same_device(x, weight, op);
  EMBER_CHECK(weight.dim() == n + 2, "{}: weight must be {}-D, got shape {}", op, n + 2,
              weight.shape());
  EMBER_CHECK(groups > 0, "{}: groups must be positive, got {}", op, groups);
  EMBER_CHECK(weight.size(0) >= groups,
              "{}: weight of shape {} has {} channels in dim 0, fewer than groups {}", op,
              weight.shape(), weight.size(0), groups);
  EMBER_CHECK(!transposed || weight.size(1) > 0, "{}: weight of shape {} is empty", op,
              weight.shape());
  // torch's "zero batch or zero channel" inputs take any spatial and kernel sizes
  const bool empty_input = x.size(0) == 0 || x.size(1) == 0;
  for (int64_t d = 2; d < weight.dim(); ++d)
    EMBER_CHECK(weight.size(d) > 0 || x.size(1) == 0,
                "{}: kernel sizes must be positive, got weight of shape {}", op, weight.shape());
  for (int64_t d = 2; d < x.dim(); ++d)
    EMBER_CHECK(x.size(d) > 0 || empty_input,
                "{}: an input with a spatial size of 0 must have an empty batch or no channels, "
                "got shape {}",
                op, x.shape());
  if (!bias.defined()) return;
  check_floating(bias, op);
  check_same_device(x, bias, op);
  EMBER_CHECK(bias.dtype() == x.dtype(), "{}: bias is {} but the input is {}", op, bias.dtype(),
              x.dtype());
  const int64_t out_channels = transposed ? weight.size(1) * groups : weight.size(0);
  EMBER_CHECK(bias.dim() == 1 && bias.size(0) == out_channels,
              "{}: bias must be 1-D of {} output channels, got shape {}", op, out_channels,
              bias.shape());
}

// y (N, C_out, L) of the products, plus the bias, as (N, C_out, out…).
Tensor finish(const Tensor& y, const Tensor& bias, const Shape& out_shape) {
  const int64_t C = y.size(1);
  const Tensor with_bias = bias.defined() ? add(y, bias.reshape({1, C, 1})) : y.contiguous();
  return with_bias.reshape(out_shape);
}

// --- the three ops of Note [Convolution kernels]; images, weights and results all 4-D ---------

// The oneDNN description of g, where oneDNN may run this call: a (an operand) Float32 on the CPU,
// oneDNN on, every size positive, and a right padding oneDNN takes (it wants (in + pad_l + pad_r
// - span) / stride + 1 = out with pad_r > -stride; a transposed convolution whose output_padding
// passes its padding plus the stride keeps im2col). Its products are bfloat16 where Float32
// products are (float32_matmul_uses_bfloat16()); the kernel then still says whether oneDNN
// had the primitive (false: im2col computes it).
std::optional<detail::ConvDesc> onednn_desc(const Tensor& a, const Geometry& g, bool bias) {
  if (a.dtype() != kFloat32 || !a.device().is_cpu() || !detail::conv_uses_onednn())
    return std::nullopt;
  if (g.N <= 0 || g.C <= 0 || g.O <= 0 || g.K() <= 0 || g.L() <= 0 || g.S() <= 0)
    return std::nullopt;
  detail::ConvDesc d;
  d.N = g.N, d.C = g.C, d.O = g.O, d.G = g.G, d.bias = bias;
  d.bf16 = float32_matmul_uses_bfloat16();
  for (size_t i = 0; i < 2; ++i) {
    const int64_t span = g.dilation[i] * (g.kernel[i] - 1) + 1;
    const int64_t pad_r =
        std::max<int64_t>(0, (g.out[i] - 1) * g.stride[i] + span - g.in[i] - g.pad[i]);
    const int64_t padded = g.in[i] + g.pad[i] + pad_r;
    if (padded < span || (padded - span) / g.stride[i] + 1 != g.out[i]) return std::nullopt;
    d.in[i] = g.in[i], d.out[i] = g.out[i], d.kernel[i] = g.kernel[i], d.stride[i] = g.stride[i];
    d.pad_l[i] = g.pad[i], d.pad_r[i] = pad_r, d.dilation[i] = g.dilation[i];
  }
  return d;
}

// t as `shape` (a 1-D convolution's operands as 2-D ones and back), t itself where it has it.
Tensor as_shape(const Tensor& t, const Shape& shape) {
  return t.shape() == shape ? t : t.reshape(shape);
}

// The kernels' operands: contiguous, read without recording.
Tensor dense(const Tensor& t) {
  NoGradGuard no_grad;
  return t.contiguous();
}

Tensor conv(const Tensor& img, const Tensor& w, const Tensor& bias, const Geometry& g);
Tensor conv_input(const Tensor& dy, const Tensor& w, const Geometry& g);
Tensor conv_weight(const Tensor& img, const Tensor& dy, const Geometry& g);
// The weight gradient and the bias gradient Σ dY over (N, out…), each where wanted: one
// backward-weights call where oneDNN runs it and nothing records (grad mode off).
std::pair<Tensor, Tensor> conv_weight_and_bias(const Tensor& img, const Tensor& dy,
                                               const Geometry& g, bool want_w, bool want_b);

// y = conv(img, W) + b:  dimg = conv_input(dY, W), dW = conv_weight(img, dY), db = Σ dY
struct ConvolutionBackward final : Node {
  ConvolutionBackward(const Tensor& img, const Tensor& w, bool bias, const Geometry& g)
      : bias_(bias), g_(g) {
    save(img_, img), save(w_, w);
  }
  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    const Tensor& dy = grads[0];
    std::vector<Tensor> out(3);
    if (!dy.defined()) return out;
    if (needs_grad(0)) out[0] = conv_input(dy, w_.get(), g_);
    const bool want_w = needs_grad(1), want_b = bias_ && needs_grad(2);
    if (want_w || want_b)
      std::tie(out[1], out[2]) = conv_weight_and_bias(img_.get(), dy, g_, want_w, want_b);
    return out;
  }
  bool differentiable_backward() const override { return true; }
  // Forward: dY = conv(dimg, W) + conv(img, dW) + db (bilinear in img and W)
  std::vector<Tensor> jvp(const std::vector<Tensor>& in, const std::vector<Tensor>& t,
                          const std::vector<Tensor>& out) override {
    Tensor d;
    if (t[0].defined()) d = conv(t[0], in[1], {}, g_);
    if (t[1].defined()) d = fwd::add_tangents(d, conv(in[0], t[1], {}, g_));
    if (t[2].defined()) d = fwd::add_tangents(d, t[2].reshape({1, g_.O, 1, 1}));
    return {fwd::broadcast_tangent(d, out[0].shape())};
  }
  SavedTensor img_, w_;
  bool bias_;
  Geometry g_;
};

// dX = conv_input(dY, W):  ddY = conv(dX', W), dW = conv_weight(dX', dY)
struct ConvolutionInputBackward final : Node {
  ConvolutionInputBackward(const Tensor& dy, const Tensor& w, const Geometry& g) : g_(g) {
    save(dy_, dy), save(w_, w);
  }
  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    const Tensor& h = grads[0];
    std::vector<Tensor> out(2);
    if (!h.defined()) return out;
    if (needs_grad(0)) out[0] = conv(h, w_.get(), {}, g_);
    if (needs_grad(1)) out[1] = conv_weight(h, dy_.get(), g_);
    return out;
  }
  bool differentiable_backward() const override { return true; }
  // Forward: dX = conv_input(ddY, W) + conv_input(dY, dW) (bilinear)
  std::vector<Tensor> jvp(const std::vector<Tensor>& in, const std::vector<Tensor>& t,
                          const std::vector<Tensor>&) override {
    Tensor d;
    if (t[0].defined()) d = conv_input(t[0], in[1], g_);
    if (t[1].defined()) d = fwd::add_tangents(d, conv_input(in[0], t[1], g_));
    return {d};
  }
  SavedTensor dy_, w_;
  Geometry g_;
};

// dW = conv_weight(img, dY):  dimg = conv_input(dY, dW'), ddY = conv(img, dW')
struct ConvolutionWeightBackward final : Node {
  ConvolutionWeightBackward(const Tensor& img, const Tensor& dy, const Geometry& g) : g_(g) {
    save(img_, img), save(dy_, dy);
  }
  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    const Tensor& h = grads[0];
    std::vector<Tensor> out(2);
    if (!h.defined()) return out;
    if (needs_grad(0)) out[0] = conv_input(dy_.get(), h, g_);
    if (needs_grad(1)) out[1] = conv(img_.get(), h, {}, g_);
    return out;
  }
  bool differentiable_backward() const override { return true; }
  // Forward: dW = conv_weight(dimg, dY) + conv_weight(img, ddY) (bilinear)
  std::vector<Tensor> jvp(const std::vector<Tensor>& in, const std::vector<Tensor>& t,
                          const std::vector<Tensor>&) override {
    Tensor d;
    if (t[0].defined()) d = conv_weight(t[0], in[1], g_);
    if (t[1].defined()) d = fwd::add_tangents(d, conv_weight(in[0], t[1], g_));
    return {d};
  }
  SavedTensor img_, dy_;
  Geometry g_;
};

// img (N, C, in…), w (O, C/G, kernel…), bias (O) or undefined -> (N, O, out…).
Tensor conv(const Tensor& img, const Tensor& w, const Tensor& bias, const Geometry& g) {
  const int64_t N = g.N, L = g.L(), Cg = g.C / g.G, K = g.K();
  if (const auto d = onednn_desc(img, g, bias.defined())) {
    const Tensor ic = dense(img), wc = dense(w), bc = bias.defined() ? dense(bias) : Tensor();
    Tensor y = empty({N, g.O, g.out[0], g.out[1]}, kFloat32);
    if (detail::onednn_conv_forward(*d, ic.data<float>(), wc.data<float>(),
                                    bias.defined() ? bc.data<float>() : nullptr, y.data<float>()))
      return record<ConvolutionBackward>("convolution", y, {img, w, bias}, img, w, bias.defined(),
                                         g);
  }
  const Tensor cols = im2col(img, g);  // (C·K, N·L)
  const Tensor wg = w.reshape({g.G, g.O / g.G, Cg * K});
  const Tensor y = bmm(wg, cols.reshape({g.G, Cg * K, N * L}));  // (G, O/G, N·L)
  return finish(y.reshape({g.O, N, L}).permute({1, 0, 2}), bias, {N, g.O, g.out[0], g.out[1]});
}

// dy (N, O, out…), w (O, C/G, kernel…) -> (N, C, in…).
Tensor conv_input(const Tensor& dy, const Tensor& w, const Geometry& g) {
  const int64_t N = g.N, L = g.L(), Og = g.O / g.G, Cg = g.C / g.G, K = g.K();
  // oneDNN's blocked backward-data into a single channel (a first layer's image gradient) ran
  // at 1.5 times im2col's time (BENCHMARKS.md, "Convolution kernels"): that one stays im2col
  if (const auto d = g.C > 1 ? onednn_desc(dy, g, false) : std::nullopt) {
    const Tensor dc = dense(dy), wc = dense(w);
    Tensor dx = empty({N, g.C, g.in[0], g.in[1]}, kFloat32);
    if (detail::onednn_conv_backward_data(*d, dc.data<float>(), wc.data<float>(), dx.data<float>()))
      return record<ConvolutionInputBackward>("convolution_input", dx, {dy, w}, dy, w, g);
  }
  // dy (N, O, L) -> (G, O/G, N·L); cols_g (C/G·K, N·L) = W_gᵀ dy_g
  const Tensor ds = dy.reshape({N, g.O, L}).permute({1, 0, 2}).reshape({g.G, Og, N * L});
  const Tensor wt = w.reshape({g.G, Og, Cg * K}).transpose(1, 2);
  const Tensor cols = bmm(wt, ds).reshape({g.C * K, N * L});
  return col2im(cols, g);
}

// img (N, C, in…), dy (N, O, out…) -> (O, C/G, kernel…).
Tensor conv_weight(const Tensor& img, const Tensor& dy, const Geometry& g) {
  const int64_t N = g.N, L = g.L(), Og = g.O / g.G, Cg = g.C / g.G, K = g.K();
  if (const auto d = onednn_desc(img, g, false)) {
    const Tensor ic = dense(img), dc = dense(dy);
    Tensor dw = empty({g.O, Cg, g.kernel[0], g.kernel[1]}, kFloat32);
    if (detail::onednn_conv_backward_weights(*d, ic.data<float>(), dc.data<float>(),
                                             dw.data<float>(), nullptr))
      return record<ConvolutionWeightBackward>("convolution_weight", dw, {img, dy}, img, dy, g);
  }
  // dW_g (O/G, C/G·K) = dY_g (O/G, N·L) · cols_gᵀ
  const Tensor cols = im2col(img, g).reshape({g.G, Cg * K, N * L});
  const Tensor ds = dy.reshape({N, g.O, L}).permute({1, 0, 2}).reshape({g.G, Og, N * L});
  return bmm(ds, cols.transpose(1, 2)).reshape({g.O, Cg, g.kernel[0], g.kernel[1]});
}

std::pair<Tensor, Tensor> conv_weight_and_bias(const Tensor& img, const Tensor& dy,
                                               const Geometry& g, bool want_w, bool want_b) {
  if (want_w && !is_grad_enabled()) {
    // under bfloat16 products oneDNN's bias gradient would sum the rounded dY; a sum and no
    // product, it stays Float32 (below), as on im2col
    const bool dnnl_b = want_b && !float32_matmul_uses_bfloat16();
    if (const auto d = onednn_desc(img, g, dnnl_b)) {
      const Tensor ic = dense(img), dc = dense(dy);
      Tensor dw = empty({g.O, g.C / g.G, g.kernel[0], g.kernel[1]}, kFloat32);
      Tensor db = dnnl_b ? empty({g.O}, kFloat32) : Tensor();
      if (detail::onednn_conv_backward_weights(*d, ic.data<float>(), dc.data<float>(),
                                               dw.data<float>(),
                                               dnnl_b ? db.data<float>() : nullptr))
        return {dw, want_b && !dnnl_b ? sum(dy, {0, 2, 3}) : db};
    }
  }
  return {want_w ? conv_weight(img, dy, g) : Tensor(), want_b ? sum(dy, {0, 2, 3}) : Tensor()};
}

Tensor conv_nd(const Tensor& input, const Tensor& weight, const Tensor& bias, const IntList& stride,
               const Padding& padding, const IntList& dilation, int64_t groups, int64_t n,
               std::string_view op) {
  profile::Scope scope(op);
  const auto [x, unbatched] = batched_input(input, n, op);
  check_defined(weight, op);
  check_operands(x, weight, bias, n, groups, false, op);
  const int64_t N = x.size(0), C = x.size(1), C_out = weight.size(0);
  EMBER_CHECK(C % groups == 0 && C_out % groups == 0,
              "{}: in_channels {} and out_channels {} must both be divisible by groups {} (input "
              "{}, weight {})",
              op, C, C_out, groups, x.shape(), weight.shape());
  EMBER_CHECK(weight.size(1) * groups == C,
              "{}: weight of shape {} with groups {} expects {} input channels, but the input of "
              "shape {} has {}",
              op, weight.shape(), groups, weight.size(1) * groups, x.shape(), C);
  const IntList s = checked_positive(stride, n, op, "stride");
  const IntList d = checked_positive(dilation, n, op, "dilation");
  IntList before(n, 0), after(n, 0);
  if (padding.mode.empty()) {
    before = after = checked_non_negative(padding.values, n, op, "padding");
  } else if (padding.mode == "same") {
    for (int64_t i = 0; i < n; ++i) {
      EMBER_CHECK(s[i] == 1, "{}: padding \"same\" needs stride 1, got stride {}", op, stride);
      const int64_t total = d[i] * (weight.size(2 + i) - 1);
      EMBER_CHECK(total >= 0, "{}: padding \"same\" of a kernel of size 0 would be negative", op);
      before[i] = total / 2, after[i] = total - total / 2;
    }
  } else {
    EMBER_CHECK(padding.mode == "valid",
                "{}: padding must be numbers, \"same\" or \"valid\", got \"{}\"", op, padding.mode);
  }
  Geometry g;
  g.N = N, g.C = C, g.O = C_out, g.G = groups;
  Shape out_shape{N, C_out};
  for (int64_t i = 0; i < n; ++i) {
    const int64_t in = x.size(2 + i), k = weight.size(2 + i);
    const int64_t span = d[i] * (k - 1) + 1, padded = in + before[i] + after[i];
    EMBER_CHECK(span <= padded,
                "{}: kernel size {} (dilated to {}) is larger than the padded input {} (input {} "
                "of shape {}, padding {} + {}) in spatial dim {}",
                op, k, span, padded, in, x.shape(), before[i], after[i], i);
    const int64_t out = (padded - span) / s[i] + 1;
    out_shape.push_back(out);
    const size_t j = static_cast<size_t>(n == 2 ? i : 1);
    g.in[j] = in, g.out[j] = out, g.kernel[j] = k, g.stride[j] = s[i];
    g.pad[j] = before[i], g.dilation[j] = d[i];
  }
  // every operand 4-D (a 1-D convolution has height 1): Note [Convolution kernels]
  const Tensor x4 = as_shape(x, {N, C, g.in[0], g.in[1]});
  const Tensor w4 = as_shape(weight, {C_out, C / groups, g.kernel[0], g.kernel[1]});
  Tensor out = as_shape(conv(x4, w4, bias, g), out_shape);
  // An input without channels gives torch's result: no output channels either (and so no
  // gradient for the weight or bias).
  if (C == 0) out = out.narrow(1, 0, 0);
  return unbatched ? out.squeeze(0) : out;
}

Tensor conv_transpose_nd(const Tensor& input, const Tensor& weight, const Tensor& bias,
                         const IntList& stride, const IntList& padding,
                         const IntList& output_padding, int64_t groups, const IntList& dilation,
                         int64_t n, std::string_view op) {
  profile::Scope scope(op);
  const auto [x, unbatched] = batched_input(input, n, op);
  check_defined(weight, op);
  check_operands(x, weight, bias, n, groups, true, op);
  const int64_t N = x.size(0), C = x.size(1), C_out = weight.size(1) * groups;
  EMBER_CHECK(C % groups == 0, "{}: in_channels {} of the input {} is not divisible by groups {}",
              op, C, x.shape(), groups);
  EMBER_CHECK(weight.size(0) == C,
              "{}: weight of shape {} expects {} input channels, but the input of shape {} has {}",
              op, weight.shape(), weight.size(0), x.shape(), C);
  const IntList s = checked_positive(stride, n, op, "stride");
  const IntList d = checked_positive(dilation, n, op, "dilation");
  const IntList p = checked_non_negative(padding, n, op, "padding");
  const IntList o = checked_non_negative(output_padding, n, op, "output_padding");
  Geometry g;  // the image side is the output, the convolution's result is x
  g.N = N, g.C = C_out, g.O = C, g.G = groups;
  Shape out_shape{N, C_out};
  for (int64_t i = 0; i < n; ++i) {
    EMBER_CHECK(o[i] < s[i] || o[i] < d[i],
                "{}: output_padding {} must be smaller than the stride {} or the dilation {}", op,
                output_padding, stride, dilation);
    const int64_t in = x.size(2 + i), k = weight.size(2 + i);
    const int64_t out = (in - 1) * s[i] - 2 * p[i] + d[i] * (k - 1) + o[i] + 1;
    EMBER_CHECK(out >= 1,
                "{}: output size {} is below 1 in spatial dim {} (input {} of shape {}, kernel "
                "{}, stride {}, padding {}, dilation {}, output_padding {})",
                op, out, i, in, x.shape(), k, s[i], p[i], d[i], o[i]);
    out_shape.push_back(out);
    const size_t j = static_cast<size_t>(n == 2 ? i : 1);
    g.in[j] = out, g.out[j] = in, g.kernel[j] = k, g.stride[j] = s[i];
    g.pad[j] = p[i], g.dilation[j] = d[i];
  }
  const Tensor x4 = as_shape(x, {N, C, g.out[0], g.out[1]});
  const Tensor w4 = as_shape(weight, {C, C_out / groups, g.kernel[0], g.kernel[1]});
  const Tensor y = conv_input(x4, w4, g);  // (N, C_out, out…)
  const Tensor out =
      as_shape(bias.defined() ? add(y, bias.reshape({1, C_out, 1, 1})) : y, out_shape);
  return unbatched ? out.squeeze(0) : out;
}

}  // namespace

Tensor conv1d(const Tensor& x, const Tensor& weight, const Tensor& bias, IntList stride,
              Padding padding, IntList dilation, int64_t groups) {
  return conv_nd(x, weight, bias, stride, padding, dilation, groups, 1, "conv1d");
}

Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias, IntList stride,
              Padding padding, IntList dilation, int64_t groups) {
  return conv_nd(x, weight, bias, stride, padding, dilation, groups, 2, "conv2d");
}

Tensor conv_transpose1d(const Tensor& x, const Tensor& weight, const Tensor& bias, IntList stride,
                        IntList padding, IntList output_padding, int64_t groups, IntList dilation) {
  return conv_transpose_nd(x, weight, bias, stride, padding, output_padding, groups, dilation, 1,
                           "conv_transpose1d");
}

Tensor conv_transpose2d(const Tensor& x, const Tensor& weight, const Tensor& bias, IntList stride,
                        IntList padding, IntList output_padding, int64_t groups, IntList dilation) {
  return conv_transpose_nd(x, weight, bias, stride, padding, output_padding, groups, dilation, 2,
                           "conv_transpose2d");
}

}  // namespace ember
