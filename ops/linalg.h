// Linear algebra on OpenBLAS (cblas_sgemm / cblas_dgemm). Transposed operands are passed with
// BLAS transpose flags, never copied.
#pragma once

#include "graph/tensor.h"

namespace ember {

// The ops of this family that are also Tensor methods are declared in graph/tensor_ops.def.

// Kernel building block for fused ops, no autograd: c = alpha · a · b + beta · c on 2-D views of
// one floating dtype, a (m, k), b (k, n), c (m, n). a and b are read as they lie (a transposed
// view becomes a BLAS flag; only a matrix with no unit stride is copied); c must be row- or
// column-major. With beta = 0, c's old contents are ignored.
void gemm(const Tensor& a, const Tensor& b, const Tensor& c, double alpha = 1.0, double beta = 0.0);

}  // namespace ember
