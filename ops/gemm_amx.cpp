// bfloat16 products on AMX tiles through oneDNN's matmul primitive (ops/gemm_amx.h).
//
// Note [bfloat16 products on AMX]
// gemm_bf16 (ops/gemm_bf16.cpp) multiplies bfloat16 pairs with vdpbf16ps, 32 products per
// instruction. A CPU with AMX-BF16 (Intel Xeon since Sapphire Rapids) has tile units whose one
// instruction, tdpbf16ps, does 16x16x32 of them. On such a Xeon (2 vCPUs, 2026-12-06) vdpbf16ps
// ran at half the rate of its own Float32 FMAs (gemm_bf16: 91 GFLOP/s on 800x512x2048, against
// 164 for oneDNN's sgemm), so "medium" was slower than "highest" there, while oneDNN 2.6's matmul
// on AMX (brg:avx512_core_amx_bf16) ran the same shapes at 1,000-1,670 GFLOP/s on one core, as
// PyTorch's autocast does. So where the CPU has AMX-BF16 and Ember was built with oneDNN, a
// bfloat16 product of at least kAmxMinWork multiply-adds runs here:
// - op(A) and op(B) are rounded to bfloat16 (vcvtneps2bf16: to nearest even, as gemm_bf16's
//   packing rounds) into buffers of this thread's, in the layout their memory gives: a transposed
//   operand stays transposed and oneDNN reads it through its strides. C is written in place
//   through ldc; alpha is the primitive's output scale, beta its sum post-op (C not read when 0),
//   the bias its bias (with alpha 1 only: oneDNN scales the bias with the product, Ember's
//   contract does not, so alpha != 1 with a bias stays on gemm_bf16).
// - Each product is the bfloat16 products summed in Float32, gemm_bf16's contract; the order of
//   the sums is the tiles' own, so the bits differ from gemm_bf16's (as from library to library).
// - A product runs whole, on oneDNN's threads at Ember's count, not cut into blocks of C per
//   thread as other products are (Note [Threads in products]): a block of columns writes C
//   through a leading dimension wider than itself, which oneDNN 2.6's AMX matmul does not take
//   (it fell back to its Float32-speed gemm:jit), and every block would round all of the other
//   operand again. The rounding passes are split across Ember's threads. oneDNN splits C's
//   blocks across threads and sums each element's k on one: the bits do not depend on the count
//   (test_linalg compares one and two threads).
// - A primitive is made once per shape, layout, alpha, beta, bias and thread count, and kept in a
//   cache as the convolutions' are (ops/conv_dnnl.cpp). A shape for which oneDNN offers no AMX
//   kernel is cached as missing and runs on gemm_bf16.
// - EMBER_AMX=off in the environment (read once), or set_amx_products(false), keeps every
//   bfloat16 product on gemm_bf16.
#include "ops/gemm_amx.h"

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string>

#ifdef EMBER_HAVE_DNNL
#include <algorithm>
#include <array>
#include <map>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include <immintrin.h>
#include <omp.h>
#include <oneapi/dnnl/dnnl.hpp>

#include "graph/parallel.h"
#include "graph/strided.h"
#include "ops/dnnl_common.h"
#endif

namespace ember::detail {

namespace {

// Below this many multiply-adds (m·n·k) a product stays on gemm_bf16: the rounding passes and
// oneDNN's fixed cost per call outweigh the tiles' speed.
constexpr int64_t kAmxMinWork = int64_t{1} << 18;

bool cpu_has_amx_bf16() {
  static const bool has = [] {
#if defined(__x86_64__) && defined(EMBER_HAVE_DNNL)
    // CPUID leaf 7, subleaf 0: EDX bit 22 is AMX-BF16 (bit 24 AMX-TILE)
    unsigned eax = 7, ebx = 0, ecx = 0, edx = 0;
    __asm__("cpuid" : "+a"(eax), "=b"(ebx), "+c"(ecx), "=d"(edx));
    return (edx >> 22 & 1u) && (edx >> 24 & 1u) && __builtin_cpu_supports("avx512bf16");
#else
    return false;
#endif
  }();
  return has;
}

bool wanted_by_environment() {
  static const bool wanted = [] {
    const char* v = std::getenv("EMBER_AMX");
    return v == nullptr || (std::strcmp(v, "off") != 0 && std::strcmp(v, "0") != 0);
  }();
  return wanted;
}

std::atomic<int> g_amx{-1};  // -1: as the CPU and the environment say; 0 / 1: set_amx_products

}  // namespace

bool amx_products() {
  const int forced = g_amx.load(std::memory_order_relaxed);
  if (forced >= 0) return forced == 1;
  return cpu_has_amx_bf16() && wanted_by_environment();
}

void set_amx_products(bool on) {
  g_amx.store(on && cpu_has_amx_bf16() ? 1 : 0, std::memory_order_relaxed);
}

#ifndef EMBER_HAVE_DNNL

int64_t amx_cached_primitives() { return 0; }

bool gemm_bf16_amx(int64_t, int64_t, int64_t, float, const float*, bool, int64_t, const float*,
                   bool, int64_t, float, float*, int64_t, const float*, int) {
  return false;
}

#else

namespace {

using dnnl::memory;
using dt = memory::data_type;

#define EMBER_BF16_CVT __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))

// dst (rows, cols) row-major = src (rows, cols, rows ld apart) rounded to bfloat16.
EMBER_BF16_CVT void round_rows(const float* src, int64_t rows, int64_t cols, int64_t ld,
                               uint16_t* dst) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* s = src + r * ld;
    uint16_t* d = dst + r * cols;
    for (int64_t j = 0; j < cols; j += 16) {
      const __mmask16 m = cols - j >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (cols - j)) - 1);
      const __m256bh h = _mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(m, s + j));
      _mm256_mask_storeu_epi16(d + j, m, reinterpret_cast<__m256i>(h));
    }
  }
}

// op(A) (m, k) and op(B) (k, n) as their bfloat16 copies lie (a transposed one through its
// strides), and C (m, n) at ldc.
struct Descs {
  memory::desc a, b, c;
};

Descs descs(int64_t m, int64_t n, int64_t k, bool a_trans, bool b_trans, int64_t ldc) {
  return {memory::desc({m, k}, dt::bf16, a_trans ? memory::dims{1, m} : memory::dims{k, 1}),
          memory::desc({k, n}, dt::bf16, b_trans ? memory::dims{1, k} : memory::dims{n, 1}),
          memory::desc({m, n}, dt::f32, memory::dims{ldc, 1})};
}

memory::desc bias_desc(int64_t n) { return memory::desc({1, n}, dt::f32, memory::dims{n, 1}); }

struct Entry {
  dnnl::matmul prim;
  size_t scratchpad = 0;
};

// m, n, k, the transposes, ldc, bias, alpha's and beta's bits, and the thread count
using Key = std::array<int64_t, 10>;

PrimitiveCache<Key, Entry>& cache() {
  static auto* c = new PrimitiveCache<Key, Entry>;  // never destroyed: products may run at exit
  return *c;
}

int64_t bits(float f) {
  uint32_t u = 0;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

// The primitive for the product, or null where oneDNN has no AMX kernel for it.
std::shared_ptr<const Entry> entry_for(int64_t m, int64_t n, int64_t k, bool a_trans, bool b_trans,
                                       int64_t ldc, bool bias, float alpha, float beta,
                                       int threads) {
  const Key key{m, n, k, a_trans, b_trans, ldc, bias, bits(alpha), bits(beta), threads};
  return cache().get(key, [&] {
    std::shared_ptr<const Entry> made;
    try {
      const Descs d = descs(m, n, k, a_trans, b_trans, ldc);
      dnnl::primitive_attr attr;
      attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
      if (alpha != 1.0f) attr.set_output_scales(0, {alpha});
      if (beta != 0.0f && !bias) {
        dnnl::post_ops ops;
        ops.append_sum(beta);
        attr.set_post_ops(ops);
      }
      const dnnl::matmul::primitive_desc pd(
          dnnl::matmul::desc(d.a, d.b, bias ? bias_desc(n) : memory::desc(), d.c), attr,
          dnnl_cpu_engine());
      if (std::string(pd.impl_info_str()).find("amx") != std::string::npos) {
        auto e = std::make_shared<Entry>();
        e->prim = dnnl::matmul(pd);
        e->scratchpad = pd.scratchpad_desc().get_size();
        made = std::move(e);
      }
    } catch (const dnnl::error&) {
      // no primitive: cached as missing, the product runs on gemm_bf16
    }
    return made;
  });
}

}  // namespace

int64_t amx_cached_primitives() { return cache().size(); }

bool gemm_bf16_amx(int64_t m, int64_t n, int64_t k, float alpha, const float* a, bool a_trans,
                   int64_t lda, const float* b, bool b_trans, int64_t ldb, float beta, float* c,
                   int64_t ldc, const float* bias, int threads) {
  if (!amx_products() || m * n * k < kAmxMinWork || (bias != nullptr && alpha != 1.0f))
    return false;
  threads = std::max(1, threads);
  OmpThreads omp(threads);
  const std::shared_ptr<const Entry> e =
      entry_for(m, n, k, a_trans, b_trans, ldc, bias != nullptr, alpha, beta, threads);
  if (!e) return false;
  thread_local std::vector<uint16_t> a16, b16;
  thread_local std::vector<char> scratch;
  a16.resize(static_cast<size_t>(m * k));
  b16.resize(static_cast<size_t>(k * n));
  // A transposed is (k, m) in memory, B transposed (n, k): rounded row by row as they lie, the
  // rows split across the threads where the product is
  const auto round = [&](const float* src, int64_t rows, int64_t cols, int64_t ld, uint16_t* dst) {
    if (threads == 1) return round_rows(src, rows, cols, ld, dst);
    parallel_for(
        rows,
        [&](int64_t r0, int64_t r1) {
          round_rows(src + r0 * ld, r1 - r0, cols, ld, dst + r0 * cols);
        },
        std::max<int64_t>(1, 16384 / std::max<int64_t>(cols, 1)));
  };
  if (a_trans)
    round(a, k, m, lda, a16.data());
  else
    round(a, m, k, lda, a16.data());
  if (b_trans)
    round(b, n, k, ldb, b16.data());
  else
    round(b, k, n, ldb, b16.data());
  constexpr size_t kAlign = 64;
  scratch.resize(e->scratchpad + kAlign);
  char* pad =
      scratch.data() + (kAlign - reinterpret_cast<uintptr_t>(scratch.data()) % kAlign) % kAlign;
  const auto& eng = dnnl_cpu_engine();
  thread_local dnnl::stream stream(eng);
  const Descs d = descs(m, n, k, a_trans, b_trans, ldc);
  std::unordered_map<int, memory> args{
      {DNNL_ARG_SRC, memory(d.a, eng, a16.data())},
      {DNNL_ARG_WEIGHTS, memory(d.b, eng, b16.data())},
      {DNNL_ARG_DST, memory(d.c, eng, c)},
      {DNNL_ARG_SCRATCHPAD,
       memory(memory::desc({static_cast<int64_t>(e->scratchpad)}, dt::u8, memory::format_tag::x),
              eng, pad)}};
  if (bias != nullptr) args[DNNL_ARG_BIAS] = memory(bias_desc(n), eng, const_cast<float*>(bias));
  e->prim.execute(stream, args);
  stream.wait();
  return true;
}

#endif  // EMBER_HAVE_DNNL

}  // namespace ember::detail
