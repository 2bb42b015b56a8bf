// BLIS, one of the product layer's libraries (Note [Choosing the product library] in
// ops/blas.cpp), opened at run time from the path the build found (EMBER_BLIS_LIBRARY): it exports
// the cblas_* functions OpenBLAS exports, and only one of them can be linked. Its own file because
// blis.h declares those functions too, which OpenBLAS's cblas.h (ops/blas.cpp) also declares.
#pragma once

#include <cstdint>
#include <string>

namespace ember::detail {

struct Blis {
  std::string path;           // the file the build found; empty where it found none
  bool opened = false;        // the library and every function used here were found
  std::string version, arch;  // arch: BLIS's name for the kernels it picked for this CPU
  // BLIS runs generic C kernels on a CPU it has none for (Zen 5 with BLIS 0.9)
  bool usable() const { return opened && arch != "generic"; }
};

// Opened on the first call; never destroyed (the profiler's report, printed at exit, names it).
const Blis& blis();

// ops/blas.h's gemm() on BLIS; only where blis().usable().
void blis_gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
               int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc);
void blis_gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, double alpha, const double* a,
               int64_t lda, const double* b, int64_t ldb, double beta, double* c, int64_t ldc);

}  // namespace ember::detail
