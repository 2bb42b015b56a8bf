// Linear algebra on OpenBLAS (cblas_sgemm / cblas_dgemm). Transposed operands are passed with
// BLAS transpose flags, never copied.
#pragma once

#include <string>

#include "graph/tensor.h"

namespace ember {

// The ops of this family that are also Tensor methods are declared in graph/tensor_ops.def.

// Kernel building block for fused ops, no autograd: c = alpha · a · b + beta · c on 2-D views of
// one floating dtype, a (m, k), b (k, n), c (m, n). a and b are read as they lie (a transposed
// view becomes a BLAS flag; only a matrix with no unit stride is copied); c must be row- or
// column-major. With beta = 0, c's old contents are ignored.
void gemm(const Tensor& a, const Tensor& b, const Tensor& c, double alpha = 1.0, double beta = 0.0);

// torch.set_float32_matmul_precision: how every Float32 product (matmul, mm, bmm, linear, gemm and
// their backwards) computes. "highest" (the default) and "high": in Float32, as OpenBLAS's
// sgemm. "medium": each operand rounded to bfloat16 (to nearest even), products and sums in
// Float32, the result Float32 (ops/gemm_bf16.cpp); where the CPU lacks AVX512-BF16 it computes
// as "highest" (float32_matmul_uses_bfloat16() says which). The products below BLAS stay
// Float32: tiny ones (m·n·k <= 512), matrix-vector ones, and narrow ones (at most 64 columns and
// 16,384 multiply-adds: attention over short sequences). Weights, gradients and optimizer state are
// untouched: mixed precision with Float32 master weights. Any other string throws.
void set_float32_matmul_precision(const std::string& precision);
std::string get_float32_matmul_precision();
// Whether Float32 products now round to bfloat16: "medium" on a CPU that has AVX512-BF16.
bool float32_matmul_uses_bfloat16();

}  // namespace ember
