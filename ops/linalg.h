// Linear algebra on OpenBLAS (cblas_sgemm / cblas_dgemm). Transposed operands are passed with
// BLAS transpose flags, never copied.
#pragma once

#include "graph/tensor.h"

namespace ember {

// torch.matmul: 1-D·1-D is a dot product, 2-D·2-D a matrix product, 1-D operands gain and
// then lose a unit dim, and leading (batch) dims broadcast.
Tensor matmul(const Tensor& a, const Tensor& b);
// (n, p, q) x (n, q, r) -> (n, p, r), no broadcasting.
Tensor bmm(const Tensor& a, const Tensor& b);
// x @ weight^T + bias for x (..., in), weight (out, in), bias (out) or undefined.
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias = {});

}  // namespace ember
