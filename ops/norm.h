// Normalisation over a batch and over groups of channels, as torch.nn.functional: batch_norm
// (batch statistics in training, with the running statistics updated in place; the running
// statistics in eval), batch_norm followed by relu in one op, and group_norm. Inputs are
// (N, C, *): 2-D (N, C) and any spatial dims.
#pragma once

#include "graph/tensor.h"

namespace ember {

// (x - mean) / sqrt(var + eps) * weight + bias per channel (dim 1) of x (N, C, *). training:
// mean and the biased var over every dim but C, and running_mean / running_var (C), when
// defined, updated in place (no grad) with momentum and the unbiased var, as torch:
// running = (1 - momentum) · running + momentum · statistic. Otherwise the running statistics,
// which must be defined; the result is then an affine map per channel, differentiable in x,
// weight, bias and the running statistics alike (torch refuses running statistics that require
// grad). weight and bias (C) are optional.
Tensor batch_norm(const Tensor& x, const Tensor& running_mean, const Tensor& running_var,
                  const Tensor& weight = {}, const Tensor& bias = {}, bool training = false,
                  double momentum = 0.1, double eps = 1e-5);

// relu(batch_norm(x, …)) as one op, the same values and gradients: in training on the CPU one
// pass fewer forward (the relu applied as the normalised values are written) and none for the
// relu's backward (its mask recomputed inside batch_norm's backward kernel), so a CNN's
// BatchNorm + ReLU pair moves two activation-sized tensors fewer each way. nn::Sequential calls it
// for a BatchNorm1d or BatchNorm2d followed by a ReLU (the modules' forward_relu).
Tensor batch_norm_relu(const Tensor& x, const Tensor& running_mean, const Tensor& running_var,
                       const Tensor& weight = {}, const Tensor& bias = {}, bool training = false,
                       double momentum = 0.1, double eps = 1e-5);

// (x - mean) / sqrt(var + eps) * weight + bias with mean and the biased var over each of the
// num_groups groups of C / num_groups channels (and every spatial position) of each sample of
// x (N, C, *); weight and bias (C) optional.
Tensor group_norm(const Tensor& x, int64_t num_groups, const Tensor& weight = {},
                  const Tensor& bias = {}, double eps = 1e-5);

}  // namespace ember
