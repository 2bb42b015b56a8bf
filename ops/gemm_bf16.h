// Float32 products with bfloat16 operands: the kernel behind set_float32_matmul_precision
// ("medium"), on AVX512-BF16 (vdpbf16ps). Internal to ops/linalg.cpp; no autograd.
#pragma once

#include <cstdint>

namespace ember::detail {

// Whether this CPU runs gemm_bf16 (AVX512-BF16 with AVX512-BW; asked once, at run time).
bool cpu_has_bf16_products();

// C (m, n), row-major with leading dim ldc, = alpha · op(A) · op(B) + beta · C, where op(A) is
// (m, k) and op(B) is (k, n), read as row-major with leading dims lda and ldb, transposed when
// the flag says so (BLAS's meaning). Each element of A and B is rounded to bfloat16 (to nearest,
// ties to even); products and sums are Float32. With a bias (n floats), C = alpha · op(A) ·
// op(B) + bias in every row instead, beta unused (linear's product, without a pass that first
// copies the bias into C). m, n, k >= 1; runs on the calling thread; only on a CPU where
// cpu_has_bf16_products().
void gemm_bf16(int64_t m, int64_t n, int64_t k, float alpha, const float* a, bool a_trans,
               int64_t lda, const float* b, bool b_trans, int64_t ldb, float beta, float* c,
               int64_t ldc, const float* bias = nullptr);

}  // namespace ember::detail
