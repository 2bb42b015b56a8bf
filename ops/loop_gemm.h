// Products below BLAS, for fused kernels that multiply small blocks (the heads of attention):
// the loops ops/linalg.cpp runs where a BLAS call's fixed cost would dominate (Note [Narrow
// products] there). Internal to ops/; no autograd, no threads.
#pragma once

#include <cstdint>

namespace ember::detail {

// A matrix read through its element strides: element (i, j) at p[i * rs + j * cs].
template <class T>
struct StridedMatrix {
  T* p;
  int64_t rs, cs;
};

// C (m, n) = alpha · A (m, k) · B (k, n) + beta · C, any strides, on the calling thread: tiny
// products by a plain loop, the others in blocks of a few vectors' worth of columns with the
// rows of C summed in registers. Meant for products of a few thousand multiply-adds; m, n, k >= 0
// (k = 0 gives beta · C). T is float or double.
template <class T>
void loop_gemm(int64_t m, int64_t n, int64_t k, T alpha, StridedMatrix<const T> a,
               StridedMatrix<const T> b, T beta, StridedMatrix<T> c);

}  // namespace ember::detail
