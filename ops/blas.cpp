// The product layer (ops/blas.h): which library runs a matrix product on this CPU, and the call
// into it. OpenBLAS is linked; oneDNN is linked where the build found it (EMBER_HAVE_DNNL, as for
// convolutions); BLIS is opened at run time (ops/blis.cpp), because it exports the same cblas_*
// symbols as OpenBLAS and the two cannot both be linked.
#include "ops/blas.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <optional>
#include <string>
#include <utility>

#include <cblas.h>
#if defined(__x86_64__)
#include <cpuid.h>
#endif
#ifdef EMBER_HAVE_DNNL
#include <oneapi/dnnl/dnnl.h>
#endif
#include <fmt/format.h>

#include "graph/error.h"
#include "graph/profile.h"
#include "ops/blis.h"
#include "ops/gemm_amx.h"
#include "ops/gemm_bf16.h"
#include "ops/linalg.h"

// Note [Choosing the product library]
// Every CPU product of Ember's ends in gemm() here, on one of three libraries, chosen once per
// process from the CPU (and again only through set_blas_library or EMBER_BLAS):
//  - with AVX-512 (Zen 4 and 5, Intel since Skylake-SP): oneDNN's sgemm, JIT-compiled for the
//    CPU it runs on. On Zen 4 at one thread it ran the model shapes of BENCHMARKS.md's products
//    table at 96-112 GFLOP/s, where OpenBLAS 0.3.21 (its Cooperlake kernels) gave 83-104 and
//    BLIS 0.9, which maps Zen 4 to its AVX2 zen3 kernels, 65-112.
//  - with AVX2 alone (Zen 1-3, Intel Haswell to Comet Lake): BLIS, whose zen/haswell kernels
//    ran 90-93 GFLOP/s on Zen 3 where OpenBLAS's gave 56-73 (issue 48's measurement), with its
//    small-product path off for transposed operands (Note [BLIS's small-product path] in
//    ops/blis.cpp).
//  - below 2^19 multiply-adds (m·n·k) a product chosen for oneDNN runs on OpenBLAS: oneDNN's
//    fixed cost per call (~0.3 us) loses there. On Zen 4 at one thread, 16^3: OpenBLAS 86
//    GFLOP/s, oneDNN 22; 64^3: 115 against 95; 80x64x64: 80 against 79; from 64x256x64 (2^20)
//    on oneDNN is ahead (105 against 89), and at 96^3 they are level.
//  - BLIS is a candidate only where its own CPU detection found kernels for the CPU (it runs
//    generic C kernels on a CPU it does not know, such as Zen 5 with BLIS 0.9), and oneDNN
//    only where the build linked it; OpenBLAS is the fallback everywhere.
// Float64 runs on BLIS where BLIS was chosen, else on OpenBLAS: oneDNN has no Float64 product.
// The bfloat16 products of set_float32_matmul_precision("medium") are Ember's own kernel
// (ops/gemm_bf16.cpp) whatever the library, or oneDNN's matmul on AMX tiles where the CPU has
// AMX-BF16 (Note [bfloat16 products on AMX] in ops/gemm_amx.cpp). The libraries run on the calling
// thread: OpenBLAS and OpenMP are pinned at one thread (graph/parallel.cpp), oneDNN sizes its work
// from OpenMP's count, and the BLIS opened is the serial build; ops/linalg.cpp splits a product
// across Ember's threads itself (Note [Threads in products]), so the thread rule is the same for
// all.

namespace ember {
namespace detail {

namespace {

constexpr const char* kNames[] = {"openblas", "blis", "dnnl"};

// Below this many multiply-adds oneDNN's choice runs on OpenBLAS (Note [Choosing the product
// library]).
constexpr int64_t kDnnlMinWork = int64_t{1} << 19;

constexpr bool kHaveDnnl =
#ifdef EMBER_HAVE_DNNL
    true;
#else
    false;
#endif

bool available(BlasLibrary lib) {
  switch (lib) {
    case BlasLibrary::OpenBLAS:
      return true;
    case BlasLibrary::BLIS:
      return blis().usable();
    case BlasLibrary::DNNL:
      return kHaveDnnl;
  }
  return false;
}

struct Cpu {
  std::string vendor;
  int family = 0, model = 0;
  bool avx2 = false, avx512 = false;
};

const Cpu& cpu() {
  static const Cpu& c = *new Cpu([] {
    Cpu c;
#if defined(__x86_64__)
    unsigned a = 0, b = 0, cx = 0, d = 0;
    if (__get_cpuid(0, &a, &b, &cx, &d)) {
      char v[13] = {};
      std::memcpy(v, &b, 4);
      std::memcpy(v + 4, &d, 4);
      std::memcpy(v + 8, &cx, 4);
      c.vendor = v;
    }
    if (__get_cpuid(1, &a, &b, &cx, &d)) {  // family and model as /proc/cpuinfo gives them
      const int base = (a >> 8) & 0xf, ext_family = (a >> 20) & 0xff;
      c.family = base == 0xf ? base + ext_family : base;
      c.model = static_cast<int>((a >> 4) & 0xf);
      if (base == 0x6 || base == 0xf) c.model |= static_cast<int>((a >> 16) & 0xf) << 4;
    }
    __builtin_cpu_init();
    c.avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    c.avx512 = __builtin_cpu_supports("avx512f");
#endif
    return c;
  }());
  return c;
}

// The library this CPU gets by default, and why (Note [Choosing the product library]).
std::pair<BlasLibrary, std::string> default_choice() {
  const Cpu& c = cpu();
  if (c.avx512 && available(BlasLibrary::DNNL)) return {BlasLibrary::DNNL, "AVX-512"};
  if (c.avx512) return {BlasLibrary::OpenBLAS, "AVX-512, without oneDNN"};
  if (c.avx2 && available(BlasLibrary::BLIS)) return {BlasLibrary::BLIS, "AVX2"};
  const char* why = c.avx2 ? "AVX2, without BLIS" : "no AVX2";
  if (available(BlasLibrary::DNNL)) return {BlasLibrary::DNNL, why};
  return {BlasLibrary::OpenBLAS, why};
}

std::optional<BlasLibrary> parse(const std::string& name) {
  for (int i = 0; i < 3; ++i)
    if (name == kNames[i]) return static_cast<BlasLibrary>(i);
  return std::nullopt;
}

// What a library is not available for, in words (for errors and EMBER_BLAS's warning).
std::string why_unavailable(BlasLibrary lib) {
  if (lib == BlasLibrary::DNNL) return "this build has no oneDNN (libdnnl-dev, EMBER_DNNL=ON)";
  const Blis& b = blis();
  if (b.path.empty()) return "this build found no BLIS (libblis-serial-dev)";
  if (!b.opened) return fmt::format("BLIS could not be opened from {}", b.path);
  return fmt::format("BLIS {} has no kernels for this CPU (it would run its \"{}\" C kernels)",
                     b.version, b.arch);
}

std::mutex g_mutex;                     // guards g_why and every change of g_lib
std::atomic<int> g_lib{-1};             // a BlasLibrary, or -1 before the first product
std::string& g_why = *new std::string;  // how g_lib was chosen, for blas_library_info

void choose(BlasLibrary lib, std::string why) {
  g_why = std::move(why);
  g_lib.store(static_cast<int>(lib));
}

// The first choice: EMBER_BLAS when it names an available library, else the CPU's default.
void choose_first() {
  std::lock_guard lock(g_mutex);
  if (g_lib.load() >= 0) return;
  auto [lib, why] = default_choice();
  why = "chosen for this CPU: " + why;
  if (const char* env = std::getenv("EMBER_BLAS"); env != nullptr && *env != '\0') {
    const std::optional<BlasLibrary> named = parse(env);
    if (named && available(*named)) {
      lib = *named;
      why = "set by EMBER_BLAS";
    } else if (std::string(env) != "auto") {
      std::fprintf(
          stderr, "ember: EMBER_BLAS=%s ignored (%s); products run on %s\n", env,
          named ? why_unavailable(*named).c_str() : "expected openblas, blis, dnnl or auto",
          kNames[static_cast<int>(lib)]);
    }
  }
  choose(lib, why);
}

// The profiler's report names the library (graph/profile.h's header lines).
const bool g_profile_header = [] {
  profile::add_report_header([] { return "products: " + blas_library_info(); });
  return true;
}();

template <class T>
void openblas_gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, T alpha, const T* a,
                   int64_t lda, const T* b, int64_t ldb, T beta, T* c, int64_t ldc) {
  const auto i = [](int64_t v) { return static_cast<blasint>(v); };
  const CBLAS_TRANSPOSE ta_ = ta ? CblasTrans : CblasNoTrans, tb_ = tb ? CblasTrans : CblasNoTrans;
  if constexpr (std::is_same_v<T, float>)
    cblas_sgemm(CblasRowMajor, ta_, tb_, i(m), i(n), i(k), alpha, a, i(lda), b, i(ldb), beta, c,
                i(ldc));
  else
    cblas_dgemm(CblasRowMajor, ta_, tb_, i(m), i(n), i(k), alpha, a, i(lda), b, i(ldb), beta, c,
                i(ldc));
}

}  // namespace

BlasLibrary blas_library() {
  const int lib = g_lib.load(std::memory_order_relaxed);
  if (lib >= 0) return static_cast<BlasLibrary>(lib);
  choose_first();
  return static_cast<BlasLibrary>(g_lib.load());
}

void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
          int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  switch (blas_library()) {
    case BlasLibrary::BLIS:
      return blis_gemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    case BlasLibrary::DNNL:
#ifdef EMBER_HAVE_DNNL
      if (m * n * k < kDnnlMinWork) break;
      // The arguments are valid by construction (m, n, k >= 1, each ld at least its row's
      // length), the only failure dnnl_sgemm reports; should it fail anyway, OpenBLAS computes.
      if (dnnl_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', m, n, k, alpha, a, lda, b, ldb, beta, c,
                     ldc) == dnnl_success)
        return;
#endif
      break;
    case BlasLibrary::OpenBLAS:
      break;
  }
  openblas_gemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, double alpha, const double* a,
          int64_t lda, const double* b, int64_t ldb, double beta, double* c, int64_t ldc) {
  if (blas_library() == BlasLibrary::BLIS)
    return blis_gemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  openblas_gemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

}  // namespace detail

void set_blas_library(const std::string& name) {
  using detail::BlasLibrary;
  if (name == "auto") {
    std::lock_guard lock(detail::g_mutex);
    auto [lib, why] = detail::default_choice();
    detail::choose(lib, "chosen for this CPU: " + why);
    return;
  }
  const std::optional<BlasLibrary> lib = detail::parse(name);
  EMBER_CHECK(lib.has_value(),
              "set_blas_library: expected \"openblas\", \"blis\", \"dnnl\" or \"auto\", got \"{}\"",
              name);
  EMBER_CHECK(detail::available(*lib), "set_blas_library: \"{}\" is not available: {}", name,
              detail::why_unavailable(*lib));
  std::lock_guard lock(detail::g_mutex);
  detail::choose(*lib, "set by set_blas_library");
}

std::string get_blas_library() { return detail::kNames[static_cast<int>(detail::blas_library())]; }

std::string blas_library_info() {
  using detail::BlasLibrary;
  const BlasLibrary lib = detail::blas_library();
  std::string why;
  {
    std::lock_guard lock(detail::g_mutex);
    why = detail::g_why;
  }
  std::string openblas = openblas_get_config();  // "OpenBLAS 0.3.21 DYNAMIC_ARCH ..."
  if (const size_t end = openblas.find(' ', openblas.find(' ') + 1); end != std::string::npos)
    openblas.resize(end);
  openblas += fmt::format(" ({})", openblas_get_corename());
  std::string f32, f64 = openblas;
  switch (lib) {
    case BlasLibrary::OpenBLAS:
      f32 = openblas;
      break;
    case BlasLibrary::BLIS:
      f32 = fmt::format("BLIS {} ({})", detail::blis().version, detail::blis().arch);
      f64 = f32;
      break;
    case BlasLibrary::DNNL: {
#ifdef EMBER_HAVE_DNNL
      const dnnl_version_t* v = dnnl_version();
      f32 = fmt::format("oneDNN {}.{}.{}", v->major, v->minor, v->patch);
#endif
      break;
    }
  }
  const detail::Cpu& c = detail::cpu();
  // the bfloat16 products of "medium" (Note [bfloat16 products on AMX])
  const char* bf16 = !detail::cpu_has_bf16_products() ? ""
                     : detail::amx_products()         ? "; bfloat16 on AMX (oneDNN's matmul)"
                                              : "; bfloat16 on AVX512-BF16 (Ember's kernel)";
  return fmt::format("{} ({}; {} family {} model {}{}); Float32 on {}, Float64 on {}{}",
                     detail::kNames[static_cast<int>(lib)], why, c.vendor, c.family, c.model,
                     c.avx512 ? ", AVX-512"
                     : c.avx2 ? ", AVX2"
                              : "",
                     f32, f64, bf16);
}

}  // namespace ember
