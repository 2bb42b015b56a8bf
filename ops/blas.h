// The product layer: one Float32 or Float64 matrix product on the calling thread, run by the
// library chosen for this CPU (OpenBLAS, BLIS or oneDNN; Note [Choosing the product library] in
// ops/blas.cpp). Internal to ops/linalg.cpp, which splits a product across Ember's threads
// (Note [Threads in products]) and calls gemm() once per piece. The public side (which library,
// the override) is set_blas_library / get_blas_library / blas_library_info in ops/linalg.h.
#pragma once

#include <cstdint>

namespace ember::detail {

enum class BlasLibrary { OpenBLAS, BLIS, DNNL };

// The library Float32 products run on now (Float64's: the same where it has a Float64 product,
// OpenBLAS for oneDNN, which has none).
BlasLibrary blas_library();

// C (m, n), row-major with leading dim ldc, = alpha · op(A) · op(B) + beta · C, where op(A) is
// (m, k) and op(B) is (k, n), read as row-major with leading dims lda and ldb, transposed when
// the flag says so (BLAS's meaning). With beta = 0, C's old contents are never read. m, n, k >= 1;
// runs on the calling thread.
void gemm(bool a_trans, bool b_trans, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
          int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc);
void gemm(bool a_trans, bool b_trans, int64_t m, int64_t n, int64_t k, double alpha,
          const double* a, int64_t lda, const double* b, int64_t ldb, double beta, double* c,
          int64_t ldc);

}  // namespace ember::detail
