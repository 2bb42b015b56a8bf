// Pooling layers as modules, torch.nn's names and arguments: MaxPool1d/2d, AvgPool1d/2d and
// AdaptiveAvgPool1d/2d over (N, C, …) or unbatched (C, …) inputs (ops/pool.h). They hold no
// parameters or buffers, only their options, and run in a Sequential.
#pragma once

#include "nn/module.h"
#include "ops/pool.h"

namespace ember::nn {

// torch.nn.MaxPool1d: max_pool1d with these options (stride {} = kernel_size).
class MaxPool1d : public Cloneable<MaxPool1d> {
 public:
  explicit MaxPool1d(IntList kernel_size, IntList stride = {}, IntList padding = {0},
                     IntList dilation = {1}, bool ceil_mode = false);
  Tensor forward(const Tensor& x) const;

  IntList kernel_size, stride, padding, dilation;
  bool ceil_mode;

 private:
  friend Cloneable;  // the only copier; see Note [Modules are not copyable]
  MaxPool1d(const MaxPool1d&) = default;
};

// torch.nn.MaxPool2d: max_pool2d with these options (stride {} = kernel_size).
class MaxPool2d : public Cloneable<MaxPool2d> {
 public:
  explicit MaxPool2d(IntList kernel_size, IntList stride = {}, IntList padding = {0},
                     IntList dilation = {1}, bool ceil_mode = false);
  Tensor forward(const Tensor& x) const;

  IntList kernel_size, stride, padding, dilation;
  bool ceil_mode;

 private:
  friend Cloneable;
  MaxPool2d(const MaxPool2d&) = default;
};

// torch.nn.AvgPool1d: avg_pool1d with these options (stride {} = kernel_size).
class AvgPool1d : public Cloneable<AvgPool1d> {
 public:
  explicit AvgPool1d(IntList kernel_size, IntList stride = {}, IntList padding = {0},
                     bool ceil_mode = false, bool count_include_pad = true);
  Tensor forward(const Tensor& x) const;

  IntList kernel_size, stride, padding;
  bool ceil_mode, count_include_pad;

 private:
  friend Cloneable;
  AvgPool1d(const AvgPool1d&) = default;
};

// torch.nn.AvgPool2d: avg_pool2d with these options (stride {} = kernel_size).
class AvgPool2d : public Cloneable<AvgPool2d> {
 public:
  explicit AvgPool2d(IntList kernel_size, IntList stride = {}, IntList padding = {0},
                     bool ceil_mode = false, bool count_include_pad = true);
  Tensor forward(const Tensor& x) const;

  IntList kernel_size, stride, padding;
  bool ceil_mode, count_include_pad;

 private:
  friend Cloneable;
  AvgPool2d(const AvgPool2d&) = default;
};

// torch.nn.AdaptiveAvgPool1d: adaptive_avg_pool1d to output_size.
class AdaptiveAvgPool1d : public Cloneable<AdaptiveAvgPool1d> {
 public:
  explicit AdaptiveAvgPool1d(IntList output_size);
  Tensor forward(const Tensor& x) const;

  IntList output_size;

 private:
  friend Cloneable;
  AdaptiveAvgPool1d(const AdaptiveAvgPool1d&) = default;
};

// torch.nn.AdaptiveAvgPool2d: adaptive_avg_pool2d to output_size ({1} for global average
// pooling).
class AdaptiveAvgPool2d : public Cloneable<AdaptiveAvgPool2d> {
 public:
  explicit AdaptiveAvgPool2d(IntList output_size);
  Tensor forward(const Tensor& x) const;

  IntList output_size;

 private:
  friend Cloneable;
  AdaptiveAvgPool2d(const AdaptiveAvgPool2d&) = default;
};

}  // namespace ember::nn
