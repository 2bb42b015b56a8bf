// nn::init: in-place initialisers for parameters (they run without recording gradients and bump
// the tensor's version, as torch.nn.init).
#pragma once

#include "graph/tensor.h"

namespace ember::nn::init {

// U(-a, a) with a = sqrt(6 / (fan_in + fan_out)); t has at least 2 dims, (fan_out, fan_in, ...).
void xavier_uniform_(Tensor& t);
void uniform_(Tensor& t, double low, double high);  // U[low, high)
void normal_(Tensor& t, double mean, double std);   // N(mean, std^2)
void zeros_(Tensor& t);
void ones_(Tensor& t);

}  // namespace ember::nn::init
