// The convolution layers: argument checks, registration and torch's default initialisation.
#include "nn/conv.h"

#include <cmath>

#include "nn/init.h"
#include "ops/resample.h"

namespace ember::nn {

namespace {

// The weight's shape of a convolution layer ((out, in / groups, k…), transposed (in, out /
// groups, k…)), its arguments checked; `kernel` comes back expanded to n dims.
Shape weight_shape(std::string_view layer, int64_t in, int64_t out, IntList& kernel, int64_t n,
                   int64_t groups, bool transposed) {
  EMBER_CHECK(in > 0 && out > 0, "{}: in_channels {} and out_channels {} must be positive", layer,
              in, out);
  EMBER_CHECK(groups > 0, "{}: groups must be positive, got {}", layer, groups);
  EMBER_CHECK(in % groups == 0 && out % groups == 0,
              "{}: in_channels {} and out_channels {} must both be divisible by groups {}", layer,
              in, out, groups);
  kernel = expand_param(kernel, n, layer, "kernel_size");
  Shape shape = transposed ? Shape{in, out / groups} : Shape{out, in / groups};
  for (int64_t k : kernel) {
    EMBER_CHECK(k > 0, "{}: kernel_size must be positive, got {}", layer, kernel);
    shape.push_back(k);
  }
  return shape;
}

// torch's reset_parameters: kaiming_uniform_(a=√5) is U(-b, b) with b = 1 / sqrt(fan_in), where
// fan_in = weight.size(1) · Πk; the bias in the same bound.
void init_conv(Tensor& weight, Tensor& bias) {
  double fan_in = 1;
  for (int64_t d = 1; d < weight.dim(); ++d) fan_in *= static_cast<double>(weight.size(d));
  const double bound = 1.0 / std::sqrt(fan_in);
  init::uniform_(weight, -bound, bound);
  if (bias.defined()) init::uniform_(bias, -bound, bound);
}

void check_padding_mode(std::string_view layer, const ConvOptions& o) {
  EMBER_CHECK(o.padding_mode == "zeros" || o.padding_mode == "reflect" ||
                  o.padding_mode == "replicate" || o.padding_mode == "circular",
              "{}: padding_mode must be \"zeros\", \"reflect\", \"replicate\" or \"circular\", got "
              "\"{}\"",
              layer, o.padding_mode);
  EMBER_CHECK(o.padding_mode == "zeros" || o.padding.mode.empty(),
              "{}: padding \"{}\" takes padding_mode \"zeros\" only, got \"{}\"", layer,
              o.padding.mode, o.padding_mode);
}

// torch's _conv_forward for padding_mode other than "zeros": x padded by pad() in that mode
// ((left, right) of the last dim first), then the convolution without padding.
Tensor padded_input(const Tensor& x, const ConvOptions& o, int64_t n) {
  const IntList p = expand_param(o.padding.values, n, "padding_mode", "padding");
  IntList twice;
  for (int64_t i = n - 1; i >= 0; --i) twice.insert(twice.end(), {p[i], p[i]});
  return pad(x, twice, o.padding_mode);
}

}  // namespace

Conv1d::Conv1d(int64_t in, int64_t out, IntList kernel, ConvOptions o)
    : in_channels(in), out_channels(out), kernel_size(std::move(kernel)), options(std::move(o)) {
  const Shape shape = weight_shape("Conv1d", in, out, kernel_size, 1, options.groups, false);
  check_padding_mode("Conv1d", options);
  register_parameter("weight", weight, empty(shape));
  if (options.bias) register_parameter("bias", bias, empty({out}));
  init_conv(weight, bias);
}

Tensor Conv1d::forward(const Tensor& x) const {
  if (options.padding_mode != "zeros")
    return conv1d(padded_input(x, options, 1), weight, bias, options.stride, 0, options.dilation,
                  options.groups);
  return conv1d(x, weight, bias, options.stride, options.padding, options.dilation, options.groups);
}

Conv2d::Conv2d(int64_t in, int64_t out, IntList kernel, ConvOptions o)
    : in_channels(in), out_channels(out), kernel_size(std::move(kernel)), options(std::move(o)) {
  const Shape shape = weight_shape("Conv2d", in, out, kernel_size, 2, options.groups, false);
  check_padding_mode("Conv2d", options);
  register_parameter("weight", weight, empty(shape));
  if (options.bias) register_parameter("bias", bias, empty({out}));
  init_conv(weight, bias);
}

Tensor Conv2d::forward(const Tensor& x) const {
  if (options.padding_mode != "zeros")
    return conv2d(padded_input(x, options, 2), weight, bias, options.stride, 0, options.dilation,
                  options.groups);
  return conv2d(x, weight, bias, options.stride, options.padding, options.dilation, options.groups);
}

ConvTranspose1d::ConvTranspose1d(int64_t in, int64_t out, IntList kernel, ConvTransposeOptions o)
    : in_channels(in), out_channels(out), kernel_size(std::move(kernel)), options(std::move(o)) {
  const Shape shape =
      weight_shape("ConvTranspose1d", in, out, kernel_size, 1, options.groups, true);
  register_parameter("weight", weight, empty(shape));
  if (options.bias) register_parameter("bias", bias, empty({out}));
  init_conv(weight, bias);
}

Tensor ConvTranspose1d::forward(const Tensor& x) const {
  return conv_transpose1d(x, weight, bias, options.stride, options.padding, options.output_padding,
                          options.groups, options.dilation);
}

ConvTranspose2d::ConvTranspose2d(int64_t in, int64_t out, IntList kernel, ConvTransposeOptions o)
    : in_channels(in), out_channels(out), kernel_size(std::move(kernel)), options(std::move(o)) {
  const Shape shape =
      weight_shape("ConvTranspose2d", in, out, kernel_size, 2, options.groups, true);
  register_parameter("weight", weight, empty(shape));
  if (options.bias) register_parameter("bias", bias, empty({out}));
  init_conv(weight, bias);
}

Tensor ConvTranspose2d::forward(const Tensor& x) const {
  return conv_transpose2d(x, weight, bias, options.stride, options.padding, options.output_padding,
                          options.groups, options.dilation);
}

}  // namespace ember::nn
