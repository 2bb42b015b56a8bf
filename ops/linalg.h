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
// Float32, the result Float32 (ops/gemm_bf16.cpp; on AMX tiles where the CPU has AMX-BF16,
// ops/gemm_amx.cpp); where the CPU lacks AVX512-BF16 it computes
// as "highest" (float32_matmul_uses_bfloat16() says which). The products below BLAS stay
// Float32: tiny ones (m·n·k <= 512), matrix-vector ones, and narrow ones (at most 64 columns and
// 16,384 multiply-adds: attention over short sequences). Weights, gradients and optimizer state are
// untouched: mixed precision with Float32 master weights. Any other string throws.
void set_float32_matmul_precision(const std::string& precision);
std::string get_float32_matmul_precision();
// Whether Float32 products now round to bfloat16: "medium" on a CPU that has AVX512-BF16.
bool float32_matmul_uses_bfloat16();

// The library every CPU product runs on (Note [Choosing the product library], ops/blas.cpp):
// "openblas", "blis" or "dnnl" (oneDNN). The default is chosen once per process for the CPU;
// the environment variable EMBER_BLAS (read at the first product) or set_blas_library overrides
// it, and "auto" goes back to the CPU's choice. Naming a library this build or machine lacks
// throws (EMBER_BLAS's is ignored with a warning). Float64 products run on the same library,
// except oneDNN's choice, whose Float64 products run on OpenBLAS. Set it before products run on
// other threads: a product takes the library once per call.
void set_blas_library(const std::string& name);
std::string get_blas_library();
// One line for logs: the library, why it was chosen, the CPU, and the versions that run Float32
// and Float64 products ("dnnl (chosen for this CPU: AVX-512; AuthenticAMD family 25 model 17,
// AVX-512); Float32 on oneDNN 2.6.3, Float64 on OpenBLAS 0.3.21 (Cooperlake)").
std::string blas_library_info();

}  // namespace ember
