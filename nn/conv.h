// Convolution layers as torch.nn: Conv1d, Conv2d, ConvTranspose1d, ConvTranspose2d (torch's
// parameter names, shapes and initialisation, so a torch state dict loads one to one), and
// Flatten. forward is one call of the functional op (ops/conv.h).
#pragma once

#include <string>

#include "nn/module.h"
#include "ops/conv.h"

namespace ember::nn {

struct ConvOptions {
  IntList stride{1};
  Padding padding = 0;
  IntList dilation{1};
  int64_t groups = 1;
  bool bias = true;
  std::string padding_mode = "zeros";  // "zeros", "reflect", "replicate", "circular"
};

// weight (out_channels, in_channels / groups, k…) and bias (out_channels) ~ U(-b, b) with
// b = 1 / sqrt(in_channels / groups · Πk), torch's kaiming_uniform_(a=√5) and bias rule.
class Conv1d : public Cloneable<Conv1d> {
 public:
  Conv1d(int64_t in_channels, int64_t out_channels, IntList kernel_size, ConvOptions options = {});
  Tensor forward(const Tensor& x) const;

  int64_t in_channels, out_channels;
  IntList kernel_size;
  ConvOptions options;
  Tensor weight, bias;  // bias is undefined without one

 private:
  friend Cloneable;  // the only copier; see Note [Modules are not copyable]
  Conv1d(const Conv1d&) = default;
};

class Conv2d : public Cloneable<Conv2d> {
 public:
  Conv2d(int64_t in_channels, int64_t out_channels, IntList kernel_size, ConvOptions options = {});
  Tensor forward(const Tensor& x) const;

  int64_t in_channels, out_channels;
  IntList kernel_size;
  ConvOptions options;
  Tensor weight, bias;

 private:
  friend Cloneable;
  Conv2d(const Conv2d&) = default;
};

struct ConvTransposeOptions {
  IntList stride{1}, padding{0}, output_padding{0};
  int64_t groups = 1;
  bool bias = true;
  IntList dilation{1};
};

// weight (in_channels, out_channels / groups, k…) and bias (out_channels) ~ U(-b, b) with
// b = 1 / sqrt(out_channels / groups · Πk) (torch's fan-in of that weight).
class ConvTranspose1d : public Cloneable<ConvTranspose1d> {
 public:
  ConvTranspose1d(int64_t in_channels, int64_t out_channels, IntList kernel_size,
                  ConvTransposeOptions options = {});
  Tensor forward(const Tensor& x) const;

  int64_t in_channels, out_channels;
  IntList kernel_size;
  ConvTransposeOptions options;
  Tensor weight, bias;

 private:
  friend Cloneable;
  ConvTranspose1d(const ConvTranspose1d&) = default;
};

class ConvTranspose2d : public Cloneable<ConvTranspose2d> {
 public:
  ConvTranspose2d(int64_t in_channels, int64_t out_channels, IntList kernel_size,
                  ConvTransposeOptions options = {});
  Tensor forward(const Tensor& x) const;

  int64_t in_channels, out_channels;
  IntList kernel_size;
  ConvTransposeOptions options;
  Tensor weight, bias;

 private:
  friend Cloneable;
  ConvTranspose2d(const ConvTranspose2d&) = default;
};

// The dims start_dim..end_dim flattened into one (torch.nn.Flatten: from dim 1, keeping the
// batch).
class Flatten : public Cloneable<Flatten> {
 public:
  explicit Flatten(int64_t start_dim = 1, int64_t end_dim = -1)
      : start_dim(start_dim), end_dim(end_dim) {}
  Tensor forward(const Tensor& x) const { return x.flatten(start_dim, end_dim); }

  int64_t start_dim, end_dim;

 private:
  friend Cloneable;
  Flatten(const Flatten&) = default;
};

}  // namespace ember::nn
