// The convolution layers of examples/fashion_mnist (issue 44, part 5) at batch 128: every distinct
// (C_in, C_out, kernel, stride, input size) of the CNN and of the ResNet, shared by ember_bench's
// conv/ rows (bench/conv_workloads.cpp), their twins in bench/pytorch/bench_torch.py and the
// oneDNN measurement bench/conv_dnnl.cpp. Padding is kernel / 2 ("same" at stride 1).
#pragma once

#include <array>
#include <cstdint>
#include <string>

#include <fmt/format.h>

namespace ember::bench {

struct ConvShape {
  const char* model;                          // "cnn" or "resnet"
  const char* layer;                          // where it sits in the model
  int64_t c_in, c_out, kernel, stride, size;  // input (N, c_in, size, size)
  bool bias;                                  // the CNN's convolutions have one, the ResNet's not
  int64_t pad() const { return kernel / 2; }
  int64_t out() const { return (size + 2 * pad() - kernel) / stride + 1; }
  // multiply-adds x 2 of the forward (one product of the three)
  double flops(int64_t batch) const {
    return 2.0 * batch * c_out * out() * out() * c_in * kernel * kernel;
  }
  std::string name() const {
    return fmt::format("{} {} {}->{} {}x{}{} {}x{}", model, layer, c_in, c_out, kernel, kernel,
                       stride == 1 ? "" : fmt::format(" s{}", stride), size, size);
  }
};

constexpr int64_t kConvBatch = 128;

inline constexpr std::array<ConvShape, 12> kConvShapes{{
    {"cnn", "conv1", 1, 32, 3, 1, 28, true},
    {"cnn", "conv2", 32, 32, 3, 1, 28, true},
    {"cnn", "conv3", 32, 64, 3, 1, 14, true},
    {"cnn", "conv4", 64, 64, 3, 1, 14, true},
    {"resnet", "stem", 1, 16, 3, 1, 28, false},
    {"resnet", "stage1", 16, 16, 3, 1, 28, false},
    {"resnet", "stage2.conv1", 16, 32, 3, 2, 28, false},
    {"resnet", "stage2.proj", 16, 32, 1, 2, 28, false},
    {"resnet", "stage2", 32, 32, 3, 1, 14, false},
    {"resnet", "stage3.conv1", 32, 64, 3, 2, 14, false},
    {"resnet", "stage3.proj", 32, 64, 1, 2, 14, false},
    {"resnet", "stage3", 64, 64, 3, 1, 7, false},
}};

}  // namespace ember::bench
