// Products on the CUDA backend: C = alpha · op(A) · op(B) + beta · C over a batch of matrices at
// constant strides, row-major as cblas sees them (Note [BLAS layouts] in ops/linalg.cpp). The
// GPU runs cuBLAS (cuda/gemm.cu); the emulated device the plain loop below, the reference the
// GPU's results are tested against wherever there is one.
#pragma once

#include "cuda/elementwise.h"

namespace ember::cuda::kernels {

// set_float32_matmul_precision's three settings, for Float32 products: exact, TF32 inputs, or
// bfloat16 inputs (accumulation in Float32 in all three).
enum class Precision : int32_t { Highest, High, Medium };

struct Gemm {
  ScalarType type = ScalarType::Float32;  // Float32 or Float64, all three matrices
  Precision precision = Precision::Highest;
  bool trans_a = false, trans_b = false;  // op(A) is Aᵀ: A is stored (k, m) row-major
  int64_t m = 0, n = 0, k = 0;            // op(A) (m, k), op(B) (k, n), C (m, n)
  const void* a = nullptr;
  int64_t lda = 0, stride_a = 0;  // leading dim (row stride); between the batch's matrices
  const void* b = nullptr;
  int64_t ldb = 0, stride_b = 0;
  void* c = nullptr;
  int64_t ldc = 0, stride_c = 0;
  int64_t batch = 1;
  double alpha = 1, beta = 0;  // beta 0: C's old values are not read (NaN included), as BLAS
};

// The plain loop: C[p] for p in [0, batch), each element one dot product in T.
template <class T>
void gemm_reference(const Gemm& g) {
  for (int64_t p = 0; p < g.batch; ++p) {
    const T* a = static_cast<const T*>(g.a) + p * g.stride_a;
    const T* b = static_cast<const T*>(g.b) + p * g.stride_b;
    T* c = static_cast<T*>(g.c) + p * g.stride_c;
    for (int64_t i = 0; i < g.m; ++i) {
      for (int64_t j = 0; j < g.n; ++j) {
        T acc = 0;
        for (int64_t l = 0; l < g.k; ++l)
          acc += (g.trans_a ? a[l * g.lda + i] : a[i * g.lda + l]) *
                 (g.trans_b ? b[j * g.ldb + l] : b[l * g.ldb + j]);
        T& out = c[i * g.ldc + j];
        out = static_cast<T>(g.alpha) * acc + (g.beta == 0 ? T(0) : static_cast<T>(g.beta) * out);
      }
    }
  }
}

}  // namespace ember::cuda::kernels
