// The pooling modules: their options kept, each forward the functional op (ops/pool.cpp), which
// checks the options against the input.
#include "nn/pooling.h"

#include <utility>

namespace ember::nn {

MaxPool1d::MaxPool1d(IntList kernel_size, IntList stride, IntList padding, IntList dilation,
                     bool ceil_mode)
    : kernel_size(std::move(kernel_size)),
      stride(std::move(stride)),
      padding(std::move(padding)),
      dilation(std::move(dilation)),
      ceil_mode(ceil_mode) {}

Tensor MaxPool1d::forward(const Tensor& x) const {
  return max_pool1d(x, kernel_size, stride, padding, dilation, ceil_mode);
}

MaxPool2d::MaxPool2d(IntList kernel_size, IntList stride, IntList padding, IntList dilation,
                     bool ceil_mode)
    : kernel_size(std::move(kernel_size)),
      stride(std::move(stride)),
      padding(std::move(padding)),
      dilation(std::move(dilation)),
      ceil_mode(ceil_mode) {}

Tensor MaxPool2d::forward(const Tensor& x) const {
  return max_pool2d(x, kernel_size, stride, padding, dilation, ceil_mode);
}

AvgPool1d::AvgPool1d(IntList kernel_size, IntList stride, IntList padding, bool ceil_mode,
                     bool count_include_pad)
    : kernel_size(std::move(kernel_size)),
      stride(std::move(stride)),
      padding(std::move(padding)),
      ceil_mode(ceil_mode),
      count_include_pad(count_include_pad) {}

Tensor AvgPool1d::forward(const Tensor& x) const {
  return avg_pool1d(x, kernel_size, stride, padding, ceil_mode, count_include_pad);
}

AvgPool2d::AvgPool2d(IntList kernel_size, IntList stride, IntList padding, bool ceil_mode,
                     bool count_include_pad)
    : kernel_size(std::move(kernel_size)),
      stride(std::move(stride)),
      padding(std::move(padding)),
      ceil_mode(ceil_mode),
      count_include_pad(count_include_pad) {}

Tensor AvgPool2d::forward(const Tensor& x) const {
  return avg_pool2d(x, kernel_size, stride, padding, ceil_mode, count_include_pad);
}

AdaptiveAvgPool1d::AdaptiveAvgPool1d(IntList output_size) : output_size(std::move(output_size)) {}

Tensor AdaptiveAvgPool1d::forward(const Tensor& x) const {
  return adaptive_avg_pool1d(x, output_size);
}

AdaptiveAvgPool2d::AdaptiveAvgPool2d(IntList output_size) : output_size(std::move(output_size)) {}

Tensor AdaptiveAvgPool2d::forward(const Tensor& x) const {
  return adaptive_avg_pool2d(x, output_size);
}

}  // namespace ember::nn
