// Tensor creation: from host data, constants, ranges and the identity. Each takes the device
// after the dtype (default the CPU; another is an Error in a build without its backend, see
// Note [CUDA availability] in graph/device.h); the *_like functions keep their argument's.
#pragma once

#include <initializer_list>
#include <vector>

#include "graph/tensor.h"

namespace ember {

Tensor from_vector(const std::vector<double>& data, Shape shape, DType dtype = kFloat32,
                   const Device& device = kCPU);
Tensor from_vector(const std::vector<float>& data, Shape shape, const Device& device = kCPU);
Tensor from_vector(const std::vector<int64_t>& data, Shape shape, const Device& device = kCPU);
// 1-D literal: tensor({1, 2, 3}).
Tensor tensor(std::initializer_list<double> data, DType dtype = kFloat32,
              const Device& device = kCPU);
// A 0-d tensor holding `value`.
Tensor scalar_tensor(double value, DType dtype = kFloat32, const Device& device = kCPU);
Tensor zeros(Shape shape, DType dtype = kFloat32, const Device& device = kCPU);
Tensor ones(Shape shape, DType dtype = kFloat32, const Device& device = kCPU);
Tensor full(Shape shape, double value, DType dtype = kFloat32, const Device& device = kCPU);
Tensor zeros_like(const Tensor& t);
Tensor ones_like(const Tensor& t);
Tensor full_like(const Tensor& t, double value);
// [start, end) in steps of `step`, as torch.arange.
Tensor arange(double start, double end, double step = 1, DType dtype = kFloat32,
              const Device& device = kCPU);
Tensor eye(int64_t n, DType dtype = kFloat32, const Device& device = kCPU);

}  // namespace ember
