// The bfloat16 product kernel (ops/gemm_bf16.h). Note [bfloat16 products] says how it is laid
// out; every function that uses AVX512-BF16 carries its target attribute, so the library builds
// for any x86-64 and calls them only where cpu_has_bf16_products().
#include "ops/gemm_bf16.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include <immintrin.h>

namespace ember::detail {

// Note [bfloat16 products]
// vdpbf16ps multiplies pairs of bfloat16 and adds both products to a Float32 lane:
// c[j] += a[2j]·b[2j] + a[2j+1]·b[2j+1]. So the kernel works on pairs along k: each k-pair of a
// row of A is one 32-bit word (A[i][2p], A[i][2p+1]) broadcast to all lanes; B is packed in
// strips of kNR = 32 columns, each k-pair a row of 32 words (B[2p][j], B[2p+1][j]), two
// registers. A kMR x 32 tile of C (24 accumulators of the 32 registers) takes one pass over the
// strips' kc/2 pairs. Loops as in GotoBLAS: a block of kNC columns of B and kKC of k is packed
// once (256 KB, in L2), then blocks of kMC rows of A; one B strip (16 KB) stays in L1 while the
// A strips stream past it. A's words are packed in whichever order its memory gives without a
// transpose (the products of small layers are only a few times the cost of packing them): a
// row of A along k is pair_run of that row, so rows lie kRowWords apart; a column of Aᵀ (dYᵀ in
// a weight's gradient) gives one pair word of every row from two of its rows, so a block's rows
// lie side by side. The kernel reads either through its two strides. Packing rounds to bfloat16
// (vcvtne2ps2bf16, to nearest even) and pads edges with zeros (an odd k, a last partial strip),
// so the kernel never branches on sizes; only its stores are masked. Blocks of k after the first
// add to C.
constexpr int kMR = 12, kNR = 32;
constexpr int64_t kKC = 256, kMC = 96, kNC = 512;  // kKC even, kMC a multiple of kMR

#define EMBER_BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))

bool cpu_has_bf16_products() {
  static const bool has =
      __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512bw");
  return has;
}

namespace {

// out[j] = (r0[j], r1[j]) as bfloat16 pairs for j < count; r1 == nullptr reads zeros.
EMBER_BF16 void pair_rows(const float* r0, const float* r1, int64_t count, uint32_t* out) {
  const __m512i interleave =
      _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6,
                       21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  for (int64_t j = 0; j < count; j += 16) {
    const __mmask16 m = count - j >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (count - j)) - 1);
    const __m512 x0 = _mm512_maskz_loadu_ps(m, r0 + j);
    const __m512 x1 = r1 ? _mm512_maskz_loadu_ps(m, r1 + j) : _mm512_setzero_ps();
    const __m512i halves = reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(x1, x0));
    _mm512_mask_storeu_epi32(out + j, m, _mm512_permutexvar_epi16(interleave, halves));
  }
}

// out[p] = (x[2p], x[2p+1]) as bfloat16 pairs for 2p < count (an odd count's last pair ends in 0).
EMBER_BF16 void pair_run(const float* x, int64_t count, uint32_t* out) {
  for (int64_t l = 0; l < count; l += 32) {
    const int64_t left = count - l;
    const __mmask16 m0 = left >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << left) - 1);
    const __mmask16 m1 = left >= 32  ? __mmask16(0xFFFF)
                         : left > 16 ? __mmask16((1u << (left - 16)) - 1)
                                     : 0;
    const __m512 lo = _mm512_maskz_loadu_ps(m0, x + l), hi = _mm512_maskz_loadu_ps(m1, x + l + 16);
    const __m512i pairs = reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(hi, lo));
    const int64_t words = std::min<int64_t>(16, (left + 1) / 2);
    _mm512_mask_storeu_epi32(out + l / 2, __mmask16((1u << words) - 1), pairs);
  }
}

// A's strips, in one of two layouts, as its memory allows without a transpose (Note [bfloat16
// products]): by rows when its rows run along k (the word of pair p of strip row i at
// i·kRowWords + p, so a row is pair_run of A's row), by columns when its columns do (at
// p·ld + i, one pair_rows of two rows of Aᵀ per p, all strips side by side, ld = mc rounded up
// to a strip). Rows past mc are zeros. The kernel reads either through its two strides.
constexpr int64_t kRowWords = kKC / 2;

EMBER_BF16 void pack_a_by_rows(const float* a, int64_t lda, int64_t mc, int64_t kc, uint32_t* out) {
  const int64_t kp = (kc + 1) / 2, rows = (mc + kMR - 1) / kMR * kMR;
  for (int64_t i = 0; i < rows; ++i) {
    uint32_t* o = out + i * kRowWords;
    if (i < mc)
      pair_run(a + i * lda, kc, o);
    else
      std::fill(o, o + kp, 0u);
  }
}

EMBER_BF16 void pack_a_by_columns(const float* a, int64_t lda, int64_t mc, int64_t kc, int64_t ld,
                                  uint32_t* out) {
  for (int64_t p = 0; p < (kc + 1) / 2; ++p) {
    const float* r1 = 2 * p + 1 < kc ? a + (2 * p + 1) * lda : nullptr;
    pair_rows(a + 2 * p * lda, r1, mc, out + p * ld);
    std::fill(out + p * ld + mc, out + (p + 1) * ld, 0u);
  }
}

// B's strips of kNR columns, each kp rows of kNR pair words, zero-padded: straight from B's rows
// when they run along n, through a transpose of pair_run's columns when its columns run along k.
EMBER_BF16 void pack_b(const float* b, int64_t sk, int64_t sn, int64_t kc, int64_t nc,
                       uint32_t* out) {
  const int64_t kp = (kc + 1) / 2, strips = (nc + kNR - 1) / kNR;
  if (sn == 1) {
    for (int64_t s = 0; s < strips; ++s) {
      const int64_t j0 = s * kNR, w = std::min<int64_t>(kNR, nc - j0);
      for (int64_t p = 0; p < kp; ++p) {
        uint32_t* o = out + (s * kp + p) * kNR;
        const float* r1 = 2 * p + 1 < kc ? b + (2 * p + 1) * sk + j0 : nullptr;
        pair_rows(b + 2 * p * sk + j0, r1, w, o);
        std::fill(o + w, o + kNR, 0u);
      }
    }
    return;
  }
  thread_local std::vector<uint32_t> tmp;  // column j's pairs at j·kp
  tmp.resize(static_cast<size_t>(kp * nc));
  for (int64_t j = 0; j < nc; ++j) pair_run(b + j * sn, kc, tmp.data() + j * kp);
  for (int64_t s = 0; s < strips; ++s) {
    const int64_t j0 = s * kNR, w = std::min<int64_t>(kNR, nc - j0);
    uint32_t* o = out + s * kp * kNR;
    for (int64_t p = 0; p < kp; ++p) {
      for (int64_t j = 0; j < w; ++j) o[p * kNR + j] = tmp[(j0 + j) * kp + p];
      std::fill(o + p * kNR + w, o + (p + 1) * kNR, 0u);
    }
  }
}

// The kMR x kNR tile of C at c: mr x nr of it are stored (the rest is padding). A's strip word
// (p, i) is at pa[p · a_step + i · kAStride]. `first`: the first block of k, where beta · C is
// added (beta == 0 reads nothing), or the tile's nr floats of bias when given; later blocks add
// to C.
template <int64_t kAStride>
EMBER_BF16 void kernel(int64_t kp, const uint32_t* pa, int64_t a_step, const uint32_t* pb, float* c,
                       int64_t ldc, int64_t mr, int64_t nr, float alpha, float beta, bool first,
                       const float* bias) {
  __m512 acc[kMR][2];
#pragma GCC unroll 12
  for (int i = 0; i < kMR; ++i) acc[i][0] = acc[i][1] = _mm512_setzero_ps();
  for (int64_t p = 0; p < kp; ++p) {
    const __m512bh b0 = reinterpret_cast<__m512bh>(_mm512_loadu_si512(pb));
    const __m512bh b1 = reinterpret_cast<__m512bh>(_mm512_loadu_si512(pb + 16));
#pragma GCC unroll 12
    for (int i = 0; i < kMR; ++i) {
      const __m512bh ai =
          reinterpret_cast<__m512bh>(_mm512_set1_epi32(static_cast<int>(pa[i * kAStride])));
      acc[i][0] = _mm512_dpbf16_ps(acc[i][0], ai, b0);
      acc[i][1] = _mm512_dpbf16_ps(acc[i][1], ai, b1);
    }
    pa += a_step;
    pb += kNR;
  }
  const __mmask16 m0 = nr >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << nr) - 1);
  const __mmask16 m1 = nr >= 32  ? __mmask16(0xFFFF)
                       : nr > 16 ? __mmask16((1u << (nr - 16)) - 1)
                                 : __mmask16(0);
  const __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(first ? beta : 1.0f);
  const bool add_bias = first && bias != nullptr, read = !first || (!add_bias && beta != 0.0f);
  const __m512 bias0 = add_bias ? _mm512_maskz_loadu_ps(m0, bias) : _mm512_setzero_ps();
  const __m512 bias1 = add_bias ? _mm512_maskz_loadu_ps(m1, bias + 16) : _mm512_setzero_ps();
#pragma GCC unroll 12
  for (int i = 0; i < kMR; ++i) {  // unrolled, so that acc stays in registers
    if (i == mr) break;
    float* ci = c + i * ldc;
    __m512 v0 = add_bias ? _mm512_fmadd_ps(va, acc[i][0], bias0) : _mm512_mul_ps(va, acc[i][0]);
    __m512 v1 = add_bias ? _mm512_fmadd_ps(va, acc[i][1], bias1) : _mm512_mul_ps(va, acc[i][1]);
    if (read) {
      v0 = _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(m0, ci), v0);
      v1 = _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(m1, ci + 16), v1);
    }
    _mm512_mask_storeu_ps(ci, m0, v0);
    _mm512_mask_storeu_ps(ci + 16, m1, v1);
  }
}

}  // namespace

EMBER_BF16 void gemm_bf16(int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                          bool a_trans, int64_t lda, const float* b, bool b_trans, int64_t ldb,
                          float beta, float* c, int64_t ldc, const float* bias) {
  // Element strides of op(A) along k and along m, of op(B) along k and along n.
  const int64_t a_sk = a_trans ? lda : 1, a_sm = a_trans ? 1 : lda;
  const int64_t b_sk = b_trans ? 1 : ldb, b_sn = b_trans ? ldb : 1;
  thread_local std::vector<uint32_t> packed_a, packed_b;
  for (int64_t j0 = 0; j0 < n; j0 += kNC) {
    const int64_t nc = std::min(kNC, n - j0), b_strips = (nc + kNR - 1) / kNR;
    for (int64_t l0 = 0; l0 < k; l0 += kKC) {
      const int64_t kc = std::min(kKC, k - l0), kp = (kc + 1) / 2;
      packed_b.resize(static_cast<size_t>(b_strips * kp * kNR));
      pack_b(b + l0 * b_sk + j0 * b_sn, b_sk, b_sn, kc, nc, packed_b.data());
      for (int64_t i0 = 0; i0 < m; i0 += kMC) {
        const int64_t mc = std::min(kMC, m - i0), a_strips = (mc + kMR - 1) / kMR;
        const int64_t ld = a_strips * kMR;  // of the by-columns layout
        packed_a.resize(static_cast<size_t>(a_trans ? kp * ld : ld * kRowWords));
        const float* block = a + i0 * a_sm + l0 * a_sk;
        if (a_trans)
          pack_a_by_columns(block, a_sk, mc, kc, ld, packed_a.data());
        else
          pack_a_by_rows(block, a_sm, mc, kc, packed_a.data());
        for (int64_t js = 0; js < b_strips; ++js) {
          const uint32_t* pb = packed_b.data() + js * kp * kNR;
          const int64_t nr = std::min<int64_t>(kNR, nc - js * kNR);
          for (int64_t is = 0; is < a_strips; ++is) {
            float* tile = c + (i0 + is * kMR) * ldc + j0 + js * kNR;
            const int64_t mr = std::min<int64_t>(kMR, mc - is * kMR);
            const float* tile_bias = bias ? bias + j0 + js * kNR : nullptr;
            if (a_trans)
              kernel<1>(kp, packed_a.data() + is * kMR, ld, pb, tile, ldc, mr, nr, alpha, beta,
                        l0 == 0, tile_bias);
            else
              kernel<kRowWords>(kp, packed_a.data() + is * kMR * kRowWords, 1, pb, tile, ldc, mr,
                                nr, alpha, beta, l0 == 0, tile_bias);
          }
        }
      }
    }
  }
}

}  // namespace ember::detail
