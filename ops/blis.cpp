// BLIS for the product layer (ops/blis.h): opened with dlopen, its functions called through
// pointers typed by its own header (EMBER_BLIS_HEADER, the blis.h of the same Debian build).
#include "ops/blis.h"

#ifdef EMBER_BLIS_LIBRARY
#include <dlfcn.h>

// BLIS's inline functions leave parameters unused and compare unsigned values with 0
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-parameter"
#pragma GCC diagnostic ignored "-Wtype-limits"
#include EMBER_BLIS_HEADER
#pragma GCC diagnostic pop
#endif

namespace ember::detail {

#ifdef EMBER_BLIS_LIBRARY

namespace {

// Note [BLIS's small-product path]
// BLIS 0.9 sends a product with any of m, n, k below its thresholds for the CPU (on Zen 3, for
// Float32: m < 512, n < 200 or k < 240) down a path that skips packing ("sup"). With a transposed
// operand that path is slow on Zen 3: at 1 thread, GFLOP/s without / with it, 800x256x64 with B
// transposed (a linear layer's forward at d_model 64) 69 / 42, 800x64x64 58 / 37, 400x512x2048
// with B transposed (half of step A's ff2 product, what each of two threads computes) 62 / 27,
// 1024x256x64 with A transposed (a weight gradient) 65 / 49; Float64 29 / 21 on that last one.
// Where neither operand is transposed it is level or ahead (64x256x1024: 66 / 77, 800x256x64:
// 72 / 75), and above the thresholds the two are one path. So a product with a transposed operand
// runs with the path turned off (the runtime object's l3_sup flag), the others as BLIS decides.
struct Functions {
  decltype(&bli_sgemm_ex) sgemm = nullptr;
  decltype(&bli_dgemm_ex) dgemm = nullptr;
};

Functions& functions() {
  static Functions f;
  return f;
}

rntm_t runtime(bool transposed) {
  rntm_t r = BLIS_RNTM_INITIALIZER;
  if (transposed) bli_rntm_disable_l3_sup(&r);
  return r;
}

trans_t trans(bool t) { return t ? BLIS_TRANSPOSE : BLIS_NO_TRANSPOSE; }

}  // namespace

const Blis& blis() {
  static const Blis& lib = *new Blis([] {
    Blis b;
    b.path = EMBER_BLIS_LIBRARY;
    // RTLD_LOCAL: its cblas_* symbols stay out of the process's namespace (OpenBLAS's win).
    void* h = dlopen(EMBER_BLIS_LIBRARY, RTLD_NOW | RTLD_LOCAL);
    if (h == nullptr) return b;
    const auto arch_id =
        reinterpret_cast<decltype(&bli_arch_query_id)>(dlsym(h, "bli_arch_query_id"));
    const auto arch_name =
        reinterpret_cast<decltype(&bli_arch_string)>(dlsym(h, "bli_arch_string"));
    const auto version =
        reinterpret_cast<decltype(&bli_info_get_version_str)>(dlsym(h, "bli_info_get_version_str"));
    Functions& f = functions();
    f.sgemm = reinterpret_cast<decltype(&bli_sgemm_ex)>(dlsym(h, "bli_sgemm_ex"));
    f.dgemm = reinterpret_cast<decltype(&bli_dgemm_ex)>(dlsym(h, "bli_dgemm_ex"));
    if (arch_id == nullptr || arch_name == nullptr || version == nullptr || f.sgemm == nullptr ||
        f.dgemm == nullptr)
      return b;
    b.opened = true;
    b.arch = arch_name(arch_id());
    b.version = version();
    return b;
  }());
  return lib;
}

// BLIS takes each matrix as stored (row stride ld, column stride 1) and the transposes apart;
// its pointers are not const, but it reads A and B only.
void blis_gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
               int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  rntm_t r = runtime(ta || tb);
  functions().sgemm(trans(ta), trans(tb), m, n, k, &alpha, const_cast<float*>(a), lda, 1,
                    const_cast<float*>(b), ldb, 1, &beta, c, ldc, 1, nullptr, &r);
}

void blis_gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, double alpha, const double* a,
               int64_t lda, const double* b, int64_t ldb, double beta, double* c, int64_t ldc) {
  rntm_t r = runtime(ta || tb);
  functions().dgemm(trans(ta), trans(tb), m, n, k, &alpha, const_cast<double*>(a), lda, 1,
                    const_cast<double*>(b), ldb, 1, &beta, c, ldc, 1, nullptr, &r);
}

#else  // this build found no BLIS: never usable, so the product layer never calls it

const Blis& blis() {
  static const Blis& lib = *new Blis;
  return lib;
}

void blis_gemm(bool, bool, int64_t, int64_t, int64_t, float, const float*, int64_t, const float*,
               int64_t, float, float*, int64_t) {}
void blis_gemm(bool, bool, int64_t, int64_t, int64_t, double, const double*, int64_t, const double*,
               int64_t, double, double*, int64_t) {}

#endif

}  // namespace ember::detail
