// head_attention: the Annotated Transformer's h heads of attention in one op, for
// nn::MultiHeadedAttention (Note [Head attention]): a head's two products and the masked softmax
// between them on one thread, read and written where the projections lie. Its backward is
// kernels too; under create_graph they run recorded as the op head_attention_backward, whose own
// derivative is a kernel on the CPU and ops elsewhere. On a device the op is composed of ops.
#include "ops/nn_functional.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <vector>

#include "graph/autograd.h"
#include "graph/creation.h"
#include "graph/profile.h"
#include "graph/strided.h"
#include "ops/common.h"
#include "ops/dropout_mask.h"
#include "ops/elementwise.h"
#include "ops/loop_gemm.h"
#include "ops/reduce.h"
#include "ops/vec_math.h"

namespace ember {

namespace {

// Note [Head attention]
// nn::MultiHeadedAttention's h heads of d_k features each, for batch row b and head hh, with Q, K
// and V the head's d_k columns of q, k and v, read where the projections wrote them (no split
// into (B, h, T, d_k) and no merging copy after):
//   S = Q Kᵀ / sqrt(d_k),  S[i, j] = -1e9 where keep[b, i, j] is false,  P = softmax(S),
//   P_d = dropout(P),  values[b, :, hh·d_k : (hh+1)·d_k] = P_d V,
// the Annotated Transformer's attention() value for value (its masked_fill and division, not
// sdpa's -inf and multiplied scale). Each head's products are a few thousand multiply-adds: as
// the composite's batched matmuls they spent most of their time in per-product set-up, and its
// division, masked_fill, softmax and dropout each made a pass over (B, h, Tq, Tk) of their own.
// Here one pass over the heads runs both products of a head on its thread (detail::loop_gemm)
// and the masked softmax between them while its scores are in L1; with dropout, P_d is one
// vectorised pass over all heads between the two (the mask of dropout(P), Note [Dropout masks]),
// so the pass splits in two. Saved for the backward: q, k, v, P and P_d:
//   dV = P_dᵀ dO,  dP = dropout(dO Vᵀ),  dS = P ⊙ (dP − Σ_j dP ⊙ P) / sqrt(d_k), 0 where masked,
//   dQ = dS K,  dK = dSᵀ Q,
// where the zeros where masked are masked_fill's backward (they matter in a row with no key kept,
// whose P is uniform).

// The geometry of one call: B batch rows, h heads of dk features, Tq queries, Tk keys, rows of
// D = h·dk features.
struct Heads {
  int64_t B, h, dk, Tq, Tk, D;
  int64_t count() const { return B * h; }
  // Q, K, V, the output and their gradients: head n's block of a (B, T, D) tensor.
  template <class T>
  T* block(T* x, int64_t n, int64_t T_len) const {
    return x + (n / h) * T_len * D + (n % h) * dk;
  }
};

// Runs body(begin, end) over the heads [0, count), split across threads when they are several
// and their products add up to parallel_grain() multiply-adds (as batched_gemm's).
template <class F>
void over_heads(const Heads& g, F&& body) {
  if (g.count() > 1 && g.count() * g.Tq * g.Tk * g.dk >= parallel_grain())
    parallel_for(g.count(), body, 2);
  else
    body(int64_t{0}, g.count());
}

// The max (sum) of a short row, in four interleaved partial results: one running result would
// chain every element's compare (add) on the one before.
template <class T, class Op>
T short_row_reduce(const T* x, int64_t n, T init, Op op) {
  T acc[4] = {init, init, init, init};
  int64_t j = 0;
  for (; j + 4 <= n; j += 4)
    for (int u = 0; u < 4; ++u) acc[u] = op(acc[u], x[j + u]);
  for (; j < n; ++j) acc[0] = op(acc[0], x[j]);
  return op(op(acc[0], acc[1]), op(acc[2], acc[3]));
}

// A head's rows of scores (rows x n, contiguous; keep, when given, the same layout) in place:
// divided by div, -1e9 where keep is false, then softmax; a row with a NaN score is all NaN, as
// softmax's. Rows are short (a few to a few dozen keys), so the division and mask, and the
// exponentials, each run over the whole block in one vectorised loop, and only the max and the
// sum row by row.
template <class T>
void masked_softmax_rows(T* x, const bool* keep, int64_t rows, int64_t n, T div) {
  constexpr T kFill = T(-1e9);
  const int64_t len = rows * n;
  int nan = 0;
  if (keep == nullptr) {
#pragma omp simd reduction(| : nan)
    for (int64_t e = 0; e < len; ++e) {
      x[e] /= div;
      nan |= x[e] != x[e];
    }
  } else {
    // keep's bytes read as bytes and every score divided: GCC 12 vectorises no loop that
    // branches on a bool load.
    const auto* kept = reinterpret_cast<const unsigned char*>(keep);
#pragma omp simd reduction(| : nan)
    for (int64_t e = 0; e < len; ++e) {
      const T v = x[e] / div;
      x[e] = kept[e] != 0 ? v : kFill;
      nan |= v != v;
    }
  }
  std::vector<char> nan_rows;  // rare: the rows that hold a NaN score, made NaN at the end
  if (nan != 0) {
    nan_rows.resize(static_cast<size_t>(rows));
    for (int64_t i = 0; i < rows; ++i)
      nan_rows[i] = std::any_of(x + i * n, x + (i + 1) * n, [](T v) { return v != v; });
  }
  const auto max = [](T a, T b) { return b > a ? b : a; };  // never NaN
  for (int64_t i = 0; i < rows; ++i) {
    T* xi = x + i * n;
    const T mx = short_row_reduce(xi, n, -std::numeric_limits<T>::infinity(), max);
    for (int64_t j = 0; j < n; ++j) xi[j] -= mx;
  }
#pragma omp simd
  for (int64_t e = 0; e < len; ++e) x[e] = vexp_nonpositive(x[e]);
  for (int64_t i = 0; i < rows; ++i) {
    T* xi = x + i * n;
    const T inv = T(1) / short_row_reduce(xi, n, T(0), std::plus<T>());
    for (int64_t j = 0; j < n; ++j) xi[j] *= inv;
  }
  for (size_t i = 0; i < nan_rows.size(); ++i)
    if (nan_rows[i]) std::fill(x + i * n, x + (i + 1) * n, std::numeric_limits<T>::quiet_NaN());
}

// The forward of heads [begin, end): P (B, h, Tq, Tk) from q and k.
template <class T>
void head_weights(const Heads& g, const T* q, const T* k, const bool* keep, T* p, int64_t begin,
                  int64_t end) {
  const T div = static_cast<T>(std::sqrt(static_cast<double>(g.dk)));
  for (int64_t n = begin; n < end; ++n) {
    T* ph = p + n * g.Tq * g.Tk;
    detail::loop_gemm<T>(g.Tq, g.Tk, g.dk, T(1), {g.block(q, n, g.Tq), g.D, 1},
                         {g.block(k, n, g.Tk), 1, g.D}, T(0), {ph, g.Tk, 1});
    masked_softmax_rows(ph, keep == nullptr ? keep : keep + (n / g.h) * g.Tq * g.Tk, g.Tq, g.Tk,
                        div);
  }
}

// values = P_d V for heads [begin, end).
template <class T>
void head_values(const Heads& g, const T* pd, const T* v, T* out, int64_t begin, int64_t end) {
  for (int64_t n = begin; n < end; ++n)
    detail::loop_gemm<T>(g.Tq, g.dk, g.Tk, T(1), {pd + n * g.Tq * g.Tk, g.Tk, 1},
                         {g.block(v, n, g.Tk), g.D, 1}, T(0), {g.block(out, n, g.Tq), g.D, 1});
}

// dV = P_dᵀ dO (when dv is given) and dP_d = dO Vᵀ into dp, for heads [begin, end).
template <class T>
void head_backward_values(const Heads& g, const T* pd, const T* v, const T* dout, T* dv, T* dp,
                          int64_t begin, int64_t end) {
  for (int64_t n = begin; n < end; ++n) {
    const T* pdh = pd + n * g.Tq * g.Tk;
    const T* doh = g.block(dout, n, g.Tq);
    if (dv != nullptr)
      detail::loop_gemm<T>(g.Tk, g.dk, g.Tq, T(1), {pdh, 1, g.Tk}, {doh, g.D, 1}, T(0),
                           {g.block(dv, n, g.Tk), g.D, 1});
    detail::loop_gemm<T>(g.Tq, g.Tk, g.dk, T(1), {doh, g.D, 1}, {g.block(v, n, g.Tk), 1, g.D}, T(0),
                         {dp + n * g.Tq * g.Tk, g.Tk, 1});
  }
}

// dS from dP (the softmax's, masked_fill's and the division's backward; ds may be dp), then
// dQ = dS K and dK = dSᵀ Q (each when given), for heads [begin, end).
template <class T>
void head_backward_scores(const Heads& g, const T* p, const bool* keep, const T* q, const T* k,
                          const T* dp, T* ds, T* dq, T* dk, int64_t begin, int64_t end) {
  const T div = static_cast<T>(std::sqrt(static_cast<double>(g.dk)));
  for (int64_t n = begin; n < end; ++n) {
    T* dsh = ds + n * g.Tq * g.Tk;
    const T* ph = p + n * g.Tq * g.Tk;
    const bool* kb = keep == nullptr ? nullptr : keep + (n / g.h) * g.Tq * g.Tk;
    for (int64_t i = 0; i < g.Tq; ++i) {
      const T* x = dp + (n * g.Tq + i) * g.Tk;
      T* d = dsh + i * g.Tk;
      const T* y = ph + i * g.Tk;
      T part[4] = {};  // four interleaved partial sums, as short_row_reduce
      int64_t j = 0;
      for (; j + 4 <= g.Tk; j += 4)
        for (int u = 0; u < 4; ++u) part[u] += x[j + u] * y[j + u];
      for (; j < g.Tk; ++j) part[0] += x[j] * y[j];
      const T dot = (part[0] + part[1]) + (part[2] + part[3]);
      for (j = 0; j < g.Tk; ++j) d[j] = y[j] * (x[j] - dot) / div;
      if (kb != nullptr) {
        const auto* m = reinterpret_cast<const unsigned char*>(kb + i * g.Tk);
        for (j = 0; j < g.Tk; ++j) d[j] = m[j] != 0 ? d[j] : T(0);
      }
    }
    if (dq != nullptr)
      detail::loop_gemm<T>(g.Tq, g.dk, g.Tk, T(1), {dsh, g.Tk, 1}, {g.block(k, n, g.Tk), g.D, 1},
                           T(0), {g.block(dq, n, g.Tq), g.D, 1});
    if (dk != nullptr)
      detail::loop_gemm<T>(g.Tk, g.dk, g.Tq, T(1), {dsh, 1, g.Tk}, {g.block(q, n, g.Tq), g.D, 1},
                           T(0), {g.block(dk, n, g.Tk), g.D, 1});
  }
}

// The pointers of head_attention_backward's derivative (HeadAttentionGradBackward): inputs q, k,
// v, dO (B, T, D), P (B, h, Tq, Tk), the keep mask (B, Tq, Tk) and the dropout factor (as P) or
// null; dP (after dropout) and dS (as P) as the first-order kernel left them; cotangents cQ, cK,
// cV or null; results gQ, gK, gV, gdO (each written in full) or null.
template <class T>
struct HeadGradGrad {
  const T *q, *k, *v, *dout, *p, *drop, *dp, *ds, *cq, *ck, *cv;
  const bool* keep;
  T *gq, *gk, *gv, *gdo;
};

// A head's products, for the short rows of attention (Tq, Tk of tens, d_k of a few vectors), two
// of them summed into one result that is written once (no zeros first, no result reloaded), in
// lanes along a contiguous row with the sums in registers (no packing, no dispatch). A pair whose
// A is null is left out; with none, the result is zeros. A's and B's rows are ld apart:
//   head_abt: C (m, n) = A1 B1ᵀ + A2 B2ᵀ, A's (m, kd), B's (n, kd), C contiguous; each B first
//     transposed into bt (kd rows of n rounded up to whole vectors, zero-padded; kept by the
//     caller across the calls of one n and kd);
//   head_ab:  C (m, kd) = A1 B1 + A2 B2, A's (m, n) contiguous, B's (n, kd), C's rows ld apart;
//   head_atb: C (n, kd) = A1ᵀ B1 + A2ᵀ B2, A's (m, n) contiguous, B's (m, kd), likewise.
template <class T>
struct HeadPairs {
  const T* a[2];
  const T* b[2];
  int64_t count;  // the pairs whose A is given, first
  HeadPairs(const T* a1, const T* b1, const T* a2 = nullptr, const T* b2 = nullptr)
      : a{a1, a2}, b{b1, b2}, count(0) {
    if (a1 == nullptr) a[0] = a2, b[0] = b2, a[1] = nullptr;
    count = (a[0] != nullptr) + (a[1] != nullptr);
  }
};

// The first `bytes` (fewer than 2 Chunk) of src into dst, in copies of constant sizes: a loop of
// a variable count is made a call of memmove.
template <size_t Chunk>
EMBER_VEC_INLINE void copy_prefix(char* dst, const char* src, size_t bytes) {
  if constexpr (Chunk > 0) {
    if (bytes & Chunk) std::memcpy(dst, src, Chunk), dst += Chunk, src += Chunk;
    copy_prefix<Chunk / 2>(dst, src, bytes);
  }
}

template <class T>
void head_abt(int64_t m, int64_t n, int64_t kd, const HeadPairs<T>& x, int64_t ld, T* c,
              std::vector<T>& bt) {
  using L = Lanes<T>;
  using V = typename L::V;
  constexpr int64_t W = L::kWidth, R = 4;  // R rows at a time: R independent sums
  if (x.count == 0) return std::fill(c, c + m * n, T(0));
  const int64_t np = (n + W - 1) / W * W, block = kd * np;
  // the padding columns stay zero from the first call (every call of a pass has the same n, kd)
  if (bt.size() < static_cast<size_t>(2 * block)) bt.assign(static_cast<size_t>(2 * block), T(0));
  for (int64_t p = 0; p < x.count; ++p)
    for (int64_t j = 0; j < n; ++j)
      for (int64_t l = 0; l < kd; ++l) bt[p * block + l * np + j] = x.b[p][j * ld + l];
  for (int64_t i0 = 0; i0 < m; i0 += R) {
    const int64_t rows = std::min(R, m - i0);
    const T* ar[2][R];
    for (int64_t p = 0; p < x.count; ++p)
      for (int64_t r = 0; r < R; ++r)
        ar[p][r] = x.a[p] + (i0 + std::min(r, rows - 1)) * ld;  // past m: reread
    for (int64_t j0 = 0; j0 < n; j0 += W) {
      V acc[R] = {};
      for (int64_t p = 0; p < x.count; ++p)
        for (int64_t l = 0; l < kd; ++l) {
          const V bl = L::load(bt.data() + p * block + l * np + j0);
          for (int64_t r = 0; r < R; ++r) acc[r] += ar[p][r][l] * bl;
        }
      const size_t bytes = std::min(W, n - j0) * sizeof(T);
      for (int64_t r = 0; r < rows; ++r)
        copy_prefix<sizeof(V)>(reinterpret_cast<char*>(c + (i0 + r) * n + j0),
                               reinterpret_cast<const char*>(&acc[r]), bytes);
    }
  }
}
// C (rows, kd) = Σ_p Σ_j A_p(row, j) B_p,j: rows of the B's (ldb apart) weighted by the A's
// entries (a_at(p, row, j)), R rows of C at a time (R independent sums, each B vector loaded once
// for them).
template <class T, class A>
void head_weighted_rows(int64_t rows, int64_t n, int64_t kd, const HeadPairs<T>& x, A a_at,
                        int64_t ldb, T* c, int64_t ldc) {
  using L = Lanes<T>;
  using V = typename L::V;
  constexpr int64_t W = L::kWidth, R = 4;
  for (int64_t i0 = 0; i0 < rows; i0 += R) {
    const int64_t live = std::min(R, rows - i0);
    int64_t row[R];
    for (int64_t r = 0; r < R; ++r) row[r] = i0 + std::min(r, live - 1);  // past rows: reread
    int64_t l = 0;
    for (; l + W <= kd; l += W) {
      V acc[R] = {};
      for (int64_t p = 0; p < x.count; ++p)
        for (int64_t j = 0; j < n; ++j) {
          const V bj = L::load(x.b[p] + j * ldb + l);
          for (int64_t r = 0; r < R; ++r) acc[r] += a_at(x.a[p], row[r], j) * bj;
        }
      for (int64_t r = 0; r < live; ++r) std::memcpy(c + (i0 + r) * ldc + l, &acc[r], sizeof(V));
    }
    for (; l < kd; ++l)
      for (int64_t r = 0; r < live; ++r) {
        T acc = 0;
        for (int64_t p = 0; p < x.count; ++p)
          for (int64_t j = 0; j < n; ++j) acc += a_at(x.a[p], i0 + r, j) * x.b[p][j * ldb + l];
        c[(i0 + r) * ldc + l] = acc;
      }
  }
}
template <class T>
void head_ab(int64_t m, int64_t n, int64_t kd, const HeadPairs<T>& x, int64_t ld, T* c) {
  head_weighted_rows<T>(
      m, n, kd, x, [n](const T* a, int64_t i, int64_t j) { return a[i * n + j]; }, ld, c, ld);
}
template <class T>
void head_atb(int64_t m, int64_t n, int64_t kd, const HeadPairs<T>& x, int64_t ld, T* c) {
  head_weighted_rows<T>(
      n, m, kd, x, [n](const T* a, int64_t j, int64_t i) { return a[i * n + j]; }, ld, c, ld);
}

// HeadAttentionGradBackward's formulas for heads [begin, end): each head's products on its blocks
// (head_abt, head_ab, head_atb), every result block written once; its (Tq, Tk) intermediates in
// a scratch of tables, with the mask and 1/√d_k as one table of factors per batch row.
template <class T>
void head_grad_grad(const Heads& g, const HeadGradGrad<T>& a, int64_t begin, int64_t end) {
  const int64_t tt = g.Tq * g.Tk, D = g.D, Tq = g.Tq, Tk = g.Tk, dk = g.dk;
  const T inv_div = T(1) / static_cast<T>(std::sqrt(static_cast<double>(dk)));
  std::vector<T> scratch(6 * tt + 3 * Tq), bt;  // bt: head_abt's transposed B's
  T *scale = scratch.data(), *u = scale + tt, *cp = u + tt, *cdpd = cp + tt, *cs = cdpd + tt;
  T *pdv = cs + tt, *r = pdv + tt, *ru = r + Tq, *rc = ru + Tq;
  // scale: 1/√d_k where a key is kept, 0 where it is left out
  if (a.keep == nullptr) std::fill(scale, scale + tt, inv_div);
  int64_t scale_row = -1;
  const auto scaled = [&](T* x) {
#pragma omp simd
    for (int64_t e = 0; e < tt; ++e) x[e] = scale[e] != T(0) ? x[e] * scale[e] : T(0);
  };
  const auto row_dots = [&](const T* x, const T* y, T* out) {  // Σ_j x_ij y_ij for each row i
    for (int64_t i = 0; i < Tq; ++i) {
      const T *xi = x + i * Tk, *yi = y + i * Tk;
      T part[4] = {};  // four interleaved partial sums, as short_row_reduce
      int64_t j = 0;
      for (; j + 4 <= Tk; j += 4)
        for (int w = 0; w < 4; ++w) part[w] += xi[j + w] * yi[j + w];
      for (; j < Tk; ++j) part[0] += xi[j] * yi[j];
      out[i] = (part[0] + part[1]) + (part[2] + part[3]);
    }
  };
  const bool scores = a.cq != nullptr || a.ck != nullptr;  // a cotangent on dQ or dK: c_dS
  for (int64_t n = begin; n < end; ++n) {
    if (a.keep != nullptr && n / g.h != scale_row) {
      scale_row = n / g.h;
      const auto* kept = reinterpret_cast<const unsigned char*>(a.keep + scale_row * tt);
#pragma omp simd
      for (int64_t e = 0; e < tt; ++e) scale[e] = kept[e] != 0 ? inv_div : T(0);
    }
    const T *ph = a.p + n * tt, *dh = a.drop ? a.drop + n * tt : nullptr;
    const T *dpv = a.dp + n * tt, *dsv = a.ds + n * tt;
    const T *qh = g.block(a.q, n, Tq), *kh = g.block(a.k, n, Tk), *vh = g.block(a.v, n, Tk);
    const T* doh = g.block(a.dout, n, Tq);
    const T* cqh = a.cq ? g.block(a.cq, n, Tq) : nullptr;
    const T* ckh = a.ck ? g.block(a.ck, n, Tk) : nullptr;
    const T* cvh = a.cv ? g.block(a.cv, n, Tk) : nullptr;
    // the first-order kernel's dP = (dO Vᵀ) D and dS = P (dP - r) / √d_k; r = rowsum(dP P)
    if (scores) {
      // u = c_dS / √d_k (0 where masked), c_dS = cQ Kᵀ + Q cKᵀ; ru = rowsum(u P);
      // c_P = u (dP - r) - ru dP, c_dPd = P (u - ru) D
      head_abt<T>(Tq, Tk, dk, {cqh, kh, ckh ? qh : nullptr, ckh}, D, u, bt);
      scaled(u);
      row_dots(dpv, ph, r);
      row_dots(u, ph, ru);
      for (int64_t i = 0; i < Tq; ++i) {
        const T ri = r[i], rui = ru[i];
#pragma omp simd
        for (int64_t e = i * Tk; e < (i + 1) * Tk; ++e) {
          cp[e] = u[e] * (dpv[e] - ri) - rui * dpv[e];
          cdpd[e] = ph[e] * (u[e] - rui);
        }
      }
      if (dh != nullptr)
#pragma omp simd
        for (int64_t e = 0; e < tt; ++e) cdpd[e] *= dh[e];
    }
    const T* pd = ph;  // P_d = P D
    if (cvh != nullptr) {
      // c_P += (dO cVᵀ) D
      head_abt<T>(Tq, Tk, dk, {doh, cvh}, D, cs, bt);
      if (dh != nullptr) {
#pragma omp simd
        for (int64_t e = 0; e < tt; ++e) pdv[e] = ph[e] * dh[e], cs[e] *= dh[e];
        pd = pdv;
      }
      if (scores)
#pragma omp simd
        for (int64_t e = 0; e < tt; ++e) cp[e] += cs[e];
      else
        std::copy(cs, cs + tt, cp);
    }
    const bool c_s = (scores || cvh != nullptr) && (a.gq || a.gk);
    if (c_s) {
      // c_S = P (c_P - rowsum(c_P P)) / √d_k (0 where masked)
      row_dots(cp, ph, rc);
      for (int64_t i = 0; i < Tq; ++i) {
        const T rci = rc[i];
#pragma omp simd
        for (int64_t e = i * Tk; e < (i + 1) * Tk; ++e) cs[e] = ph[e] * (cp[e] - rci);
      }
      scaled(cs);
    }
    // gQ = dS cK + c_S K, gK = dSᵀ cQ + c_Sᵀ Q, gdO = c_dPd V + P_d cV, gV = c_dPdᵀ dO
    if (a.gq)
      head_ab<T>(Tq, Tk, dk, {ckh ? dsv : nullptr, ckh, c_s ? cs : nullptr, kh}, D,
                 g.block(a.gq, n, Tq));
    if (a.gk)
      head_atb<T>(Tq, Tk, dk, {cqh ? dsv : nullptr, cqh, c_s ? cs : nullptr, qh}, D,
                  g.block(a.gk, n, Tk));
    if (a.gdo)
      head_ab<T>(Tq, Tk, dk, {scores ? cdpd : nullptr, vh, cvh ? pd : nullptr, cvh}, D,
                 g.block(a.gdo, n, Tq));
    if (a.gv) head_atb<T>(Tq, Tk, dk, {scores ? cdpd : nullptr, doh}, D, g.block(a.gv, n, Tk));
  }
}
// The formulas in ops over the heads as (B, h, T, d_k) views of (B, T, D) tensors, with keep
// (Bool (B, Tq, Tk), or undefined) and the dropout factor (or undefined) of a call.
struct HeadsInOps {
  HeadsInOps(const Heads& g, const Tensor& keep, Tensor drop)
      : g_(g),
        left_out_(keep.defined() ? unsqueeze(logical_not(keep), 1) : Tensor()),
        drop_(std::move(drop)),
        div_by_(std::sqrt(static_cast<double>(g.dk))) {}
  Tensor split(const Tensor& t) const {  // (B, T, D) -> (B, h, T, d_k)
    return transpose(reshape(t, {g_.B, t.size(1), g_.h, g_.dk}), 1, 2);
  }
  Tensor merge(const Tensor& t) const {  // (B, h, T, d_k) -> (B, T, D)
    return t.defined() ? reshape(transpose(t, 1, 2), {g_.B, t.size(2), g_.D}) : t;
  }
  Tensor masked(const Tensor& t) const {  // 0 where a key is left out
    return left_out_.defined() ? masked_fill(t, left_out_, 0.0) : t;
  }
  Tensor dropped(const Tensor& t) const { return drop_.defined() ? mul(t, drop_) : t; }
  Tensor weights(const Tensor& q, const Tensor& k) const {  // P of the split q and k
    Tensor s = div(matmul(q, transpose(k, -2, -1)), div_by_);
    if (left_out_.defined()) s = masked_fill(s, left_out_, -1e9);
    return softmax(s, -1);
  }
  // The softmax's Jacobian on a tangent of S: P (dS - Σ_j dS P)
  static Tensor through_softmax(const Tensor& p, const Tensor& ds) {
    return mul(p, sub(ds, sum(mul(ds, p), {-1}, true)));
  }
  // The tangent of S from those of the split q and k (either undefined): masked((dQ Kᵀ + Q dKᵀ)
  // / √d_k); undefined when both are.
  Tensor score_tangent(const Tensor& q, const Tensor& k, const Tensor& tq, const Tensor& tk) const {
    Tensor ts;
    if (tq.defined()) ts = matmul(tq, transpose(k, -2, -1));
    if (tk.defined()) ts = fwd::add_tangents(ts, matmul(q, transpose(tk, -2, -1)));
    return ts.defined() ? masked(div(ts, div_by_)) : ts;
  }
  const Heads& g_;
  Tensor left_out_, drop_;
  double div_by_;
};

// head_attention_backward's Node (Note [Head attention]): inputs q, k, v and dO, outputs dQ, dK,
// dV, all (B, T, D); cotangents cQ, cK, cV. Per head, with S = Q Kᵀ / √d_k (masked), P =
// softmax(S), D the dropout factor (mask · scale, or 1), P_d = P D, dP = (dO Vᵀ) D,
// r = rowsum(dP P), dS = P (dP - r) / √d_k (0 where masked), dQ = dS K, dK = dSᵀ Q, dV = P_dᵀ dO:
//   c_dS = cQ Kᵀ + Q cKᵀ (0 where masked),  u = c_dS / √d_k,  ru = rowsum(u P)
//   gQ  = dS cK + c_S K,   gK = dSᵀ cQ + c_Sᵀ Q
//   c_dP = P (u - ru),  gdO = (c_dP D) V + P_d cV,  gV = (c_dP D)ᵀ dO
//   c_P = u (dP - r) - ru dP + (dO cVᵀ) D,  c_S = P (c_P - rowsum(c_P P)) / √d_k (0 where masked)
// On the CPU, head_grad_grad per head, from the P, dP, dS and dropout factor the first-order
// kernels used (saved as data by HeadAttentionBackward); under create_graph (or on a device) the
// same in batched products over the (B, h, T, d_k) views, P and dP recomputed in ops from q, k,
// v and dO so that they can be differentiated once more.
struct HeadAttentionGradBackward final : Node {
  HeadAttentionGradBackward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& dout,
                            const Tensor& p, const Tensor& dp, const Tensor& ds, Tensor drop,
                            Tensor keep, AttentionDropout dropout, Heads heads)
      : drop_(std::move(drop)), keep_(std::move(keep)), dropout_(dropout), heads_(heads) {
    save(q_, q), save(k_, k), save(v_, v), save(dout_, dout), save(p_, p), save(dp_, dp);
    save(ds_, ds);
  }
  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    if (!is_grad_enabled() && q_.get().device().is_cpu()) return by_kernels(grads);
    return apply_in_ops(grads);
  }
  // head_grad_grad over the heads, which writes every block of the results.
  std::vector<Tensor> by_kernels(const std::vector<Tensor>& grads) {
    const Heads& g = heads_;
    const Tensor &q = q_.get(), &k = k_.get(), &v = v_.get(), &p = p_.get();
    const Tensor dout = contiguous_data(dout_.get());
    const Tensor& drop = drop_;
    std::vector<Tensor> c(3), out(4);
    for (size_t i = 0; i < 3; ++i) c[i] = contiguous_data(grads[i]);
    for (size_t i = 0; i < 4; ++i)
      if (needs_grad(i)) out[i] = empty(input_shapes[i], q.dtype(), q.device());
    dispatch_float(q.dtype(), op(), [&]<class T>() {
      const auto ptr = [](const Tensor& t) { return t.defined() ? t.data<T>() : nullptr; };
      const HeadGradGrad<T> a{
          q.data<T>(), k.data<T>(), v.data<T>(),    dout.data<T>(),
          p.data<T>(), ptr(drop),   ptr(dp_.get()), ptr(ds_.get()),
          ptr(c[0]),   ptr(c[1]),   ptr(c[2]),      keep_.defined() ? keep_.data<bool>() : nullptr,
          ptr(out[0]), ptr(out[1]), ptr(out[2]),    ptr(out[3])};
      over_heads(g, [&](int64_t begin, int64_t end) { head_grad_grad<T>(g, a, begin, end); });
    });
    return out;
  }
  std::vector<Tensor> apply_in_ops(const std::vector<Tensor>& grads) {
    const Heads& g = heads_;
    const auto split = [&](const Tensor& t) {  // (B, T, D) -> (B, h, T, d_k)
      return transpose(reshape(t, {g.B, t.size(1), g.h, g.dk}), 1, 2);
    };
    const auto merge = [&](const Tensor& t) {  // (B, h, T, d_k) -> (B, T, D)
      return t.defined() ? reshape(transpose(t, 1, 2), {g.B, t.size(2), g.D}) : t;
    };
    const auto mT = [](const Tensor& t) { return transpose(t, -2, -1); };
    const auto plus = [](Tensor& acc, const Tensor& t) { acc = acc.defined() ? add(acc, t) : t; };
    const Tensor q = split(q_.get()), k = split(k_.get()), v = split(v_.get());
    const Tensor d_o = split(dout_.get());
    const double div_by = std::sqrt(static_cast<double>(g.dk));
    const Tensor left_out = keep_.defined() ? unsqueeze(logical_not(keep_), 1) : Tensor();
    const auto masked = [&](const Tensor& t) {
      return left_out.defined() ? masked_fill(t, left_out, 0.0) : t;
    };
    Tensor s = div(matmul(q, mT(k)), div_by);  // P as a function of q and k
    if (left_out.defined()) s = masked_fill(s, left_out, -1e9);
    const Tensor p = softmax(s, -1);
    const Tensor& drop = drop_;
    const auto dropped = [&](const Tensor& t) { return drop.defined() ? mul(t, drop) : t; };
    const Tensor dp = dropped(matmul(d_o, mT(v)));
    const Tensor r = sum(mul(dp, p), {-1}, true);
    Tensor gq, gk, gv, gdo, c_ds, c_p;
    if (grads[0].defined() || grads[1].defined()) {
      const Tensor ds = masked(div(mul(p, sub(dp, r)), div_by));
      if (grads[0].defined()) {
        const Tensor cq = split(grads[0]);
        plus(c_ds, matmul(cq, mT(k)));
        if (needs_grad(1)) plus(gk, matmul(mT(ds), cq));
      }
      if (grads[1].defined()) {
        const Tensor ck = split(grads[1]);
        plus(c_ds, matmul(q, mT(ck)));
        if (needs_grad(0)) plus(gq, matmul(ds, ck));
      }
      const Tensor u = div(masked(c_ds), div_by);
      const Tensor ru = sum(mul(u, p), {-1}, true);
      c_p = sub(mul(u, sub(dp, r)), mul(ru, dp));
      const Tensor c_dpd = dropped(mul(p, sub(u, ru)));
      if (needs_grad(3)) plus(gdo, matmul(c_dpd, v));
      if (needs_grad(2)) plus(gv, matmul(mT(c_dpd), d_o));
    }
    if (grads[2].defined()) {
      const Tensor cv = split(grads[2]);
      if (needs_grad(3)) plus(gdo, matmul(dropped(p), cv));
      plus(c_p, dropped(matmul(d_o, mT(cv))));
    }
    if (c_p.defined() && (needs_grad(0) || needs_grad(1))) {
      const Tensor c_s = div(masked(mul(p, sub(c_p, sum(mul(c_p, p), {-1}, true)))), div_by);
      if (needs_grad(0)) plus(gq, matmul(c_s, k));
      if (needs_grad(1)) plus(gk, matmul(mT(c_s), q));
    }
    return {merge(gq), merge(gk), merge(gv), merge(gdo)};
  }
  bool differentiable_backward() const override { return true; }
  // Forward, per head in ops (P and dP recomputed from q, k, v and dO), with tangents tQ, tK, tV,
  // tdO and r = rowsum(dP P):
  //   tS = (tQ Kᵀ + Q tKᵀ) / √d_k (0 where masked),  tP = P (tS - rowsum(tS P)),
  //   tdP = (tdO Vᵀ + dO tVᵀ) D,  tr = rowsum(tdP P + dP tP),
  //   tdS = (tP (dP - r) + P (tdP - tr)) / √d_k (0 where masked),
  //   d(dQ) = tdS K + dS tK,  d(dK) = tdSᵀ Q + dSᵀ tQ,  d(dV) = (tP D)ᵀ dO + P_dᵀ tdO
  std::vector<Tensor> jvp(const std::vector<Tensor>& in, const std::vector<Tensor>& t,
                          const std::vector<Tensor>& out) override {
    const HeadsInOps h(heads_, keep_, drop_);
    const auto mT = [](const Tensor& x) { return transpose(x, -2, -1); };
    const auto split = [&](const Tensor& x) { return x.defined() ? h.split(x) : x; };
    const Tensor q = h.split(in[0]), k = h.split(in[1]), v = h.split(in[2]), d_o = h.split(in[3]);
    const Tensor tq = split(t[0]), tk = split(t[1]), tv = split(t[2]), tdo = split(t[3]);
    const Tensor p = h.weights(q, k);
    const Tensor dp = h.dropped(matmul(d_o, mT(v)));
    const Tensor r = sum(mul(dp, p), {-1}, true);
    const Tensor ds = h.masked(div(mul(p, sub(dp, r)), h.div_by_));
    const Tensor ts = h.score_tangent(q, k, tq, tk);
    const Tensor tp = ts.defined() ? HeadsInOps::through_softmax(p, ts) : Tensor();
    Tensor tdp;
    if (tdo.defined()) tdp = matmul(tdo, mT(v));
    if (tv.defined()) tdp = fwd::add_tangents(tdp, matmul(d_o, mT(tv)));
    if (tdp.defined()) tdp = h.dropped(tdp);
    Tensor tds;
    if (tp.defined() || tdp.defined()) {
      Tensor tr;
      if (tdp.defined()) tr = mul(tdp, p);
      if (tp.defined()) tr = fwd::add_tangents(tr, mul(dp, tp));
      tr = sum(tr, {-1}, true);
      Tensor inner = neg(mul(p, tr));
      if (tp.defined()) inner = add(inner, mul(tp, sub(dp, r)));
      if (tdp.defined()) inner = add(inner, mul(p, tdp));
      tds = h.masked(div(inner, h.div_by_));
    }
    Tensor gq, gk, gv;
    if (out[0].defined()) {
      if (tds.defined()) gq = matmul(tds, k);
      if (tk.defined()) gq = fwd::add_tangents(gq, matmul(ds, tk));
    }
    if (out[1].defined()) {
      if (tds.defined()) gk = matmul(mT(tds), q);
      if (tq.defined()) gk = fwd::add_tangents(gk, matmul(mT(ds), tq));
    }
    if (out[2].defined()) {
      if (tp.defined()) gv = matmul(mT(h.dropped(tp)), d_o);
      if (tdo.defined()) gv = fwd::add_tangents(gv, matmul(mT(h.dropped(p)), tdo));
    }
    return {h.merge(gq), h.merge(gk), h.merge(gv)};
  }
  Tensor drop_;  // the dropout factor (mask · scale, as P), or undefined
  Tensor keep_;  // Bool (B, Tq, Tk), contiguous, or undefined
  AttentionDropout dropout_;
  Heads heads_;
  SavedTensor q_, k_, v_, dout_, p_;
  SavedTensor dp_, ds_;  // the first-order kernel's dP and dS (data), or undefined
};

// Note [Head attention]; inputs q, k, v. Under create_graph the same kernels, recorded as the op
// head_attention_backward of (q, k, v, dO), whose derivative is HeadAttentionGradBackward.
struct HeadAttentionBackward final : Node {
  HeadAttentionBackward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& p,
                        const Tensor& pd, Tensor keep, AttentionDropout dropout, Heads heads)
      : keep_(std::move(keep)), dropout_(dropout), heads_(heads) {
    save(q_, q), save(k_, k), save(v_, v), save(p_, p), save(pd_, pd);
  }
  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    if (!is_grad_enabled()) return by_kernels(grads[0]);
    // create_graph: the kernels' values, recorded as head_attention_backward of (q, k, v, dO);
    // its derivative reads the dropout factor, dP and dS the kernels used (no second mask, no
    // second dO Vᵀ)
    std::vector<Tensor> out;
    Tensor drop, dp, ds;
    {
      NoGradGuard no_grad;
      drop = attention_dropout_factor(p_.get().shape(), p_.get().dtype(), dropout_, op());
      out = by_kernels(grads[0], drop, &dp, &ds);
    }
    const Tensor q = q_.get(), k = k_.get(), v = v_.get();
    record<HeadAttentionGradBackward>("head_attention_backward", {&out[0], &out[1], &out[2]},
                                      {q, k, v, grads[0]}, q, k, v, grads[0], p_.get(), dp, ds,
                                      drop, keep_, dropout_, heads_);
    return out;
  }
  // dQ, dK, dV by the kernels; with `drop` (the dropout factor) dP is multiplied by it instead of
  // the mask being regenerated; dP (after dropout) and dS into *dp_out and *ds_out when given.
  std::vector<Tensor> by_kernels(const Tensor& grad, const Tensor& drop = {},
                                 Tensor* dp_out = nullptr, Tensor* ds_out = nullptr) {
    const Tensor dout = grad.contiguous();
    const Tensor &q = q_.get(), &k = k_.get(), &v = v_.get(), &p = p_.get(), &pd = pd_.get();
    const Heads& g = heads_;
    Tensor dq = needs_grad(0) ? empty(q.shape(), q.dtype(), q.device()) : Tensor();
    Tensor dk = needs_grad(1) ? empty(k.shape(), k.dtype(), k.device()) : Tensor();
    Tensor dv = needs_grad(2) ? empty(v.shape(), v.dtype(), v.device()) : Tensor();
    Tensor dp = empty(p.shape(), p.dtype(), p.device());
    Tensor ds = dp;  // dS over dP, unless dP is kept
    const bool* keep = keep_.defined() ? keep_.data<bool>() : nullptr;
    dispatch_float(q.dtype(), op(), [&]<class T>() {
      const auto ptr = [](const Tensor& t) { return t.defined() ? t.data<T>() : nullptr; };
      const auto values = [&](int64_t begin, int64_t end) {
        head_backward_values<T>(g, pd.data<T>(), v.data<T>(), dout.data<T>(), ptr(dv), ptr(dp),
                                begin, end);
      };
      const auto scores = [&](int64_t begin, int64_t end) {
        head_backward_scores<T>(g, p.data<T>(), keep, q.data<T>(), k.data<T>(), dp.data<T>(),
                                ds.data<T>(), ptr(dq), ptr(dk), begin, end);
      };
      if (dropout_.kind == AttentionDropout::None && dp_out == nullptr) {
        over_heads(g, [&](int64_t begin, int64_t end) { values(begin, end), scores(begin, end); });
        return;
      }
      over_heads(g, values);
      if (drop.defined())
        dp.mul_(drop);
      else if (dropout_.kind != AttentionDropout::None)
        dp = apply_attention_dropout(dp, dropout_, op());
      ds = dp;
      if (dp_out != nullptr) *dp_out = dp, ds = empty(p.shape(), p.dtype(), p.device());
      over_heads(g, scores);
    });
    if (ds_out != nullptr) *ds_out = ds;
    return {dq, dk, dv};
  }
  bool differentiable_backward() const override { return true; }
  // Forward, per head in ops (P recomputed from q and k; D the dropout factor):
  //   tS = (tQ Kᵀ + Q tKᵀ) / √d_k (0 where masked),  tP = P (tS - rowsum(tS P)),
  //   tOut = (tP D) V + P_d tV, merged back to (B, Tq, D)
  std::vector<Tensor> jvp(const std::vector<Tensor>& in, const std::vector<Tensor>& t,
                          const std::vector<Tensor>&) override {
    const HeadsInOps h(heads_, keep_,
                       attention_dropout_factor({heads_.B, heads_.h, heads_.Tq, heads_.Tk},
                                                in[0].dtype(), dropout_, op()));
    const Tensor q = h.split(in[0]), k = h.split(in[1]);
    // Where the tangent needs no graph (records_graph), P and P_d are the kernels' own (saved),
    // not recomputed in ops
    if (p_.get().device().is_cpu() && !records_graph({in[0], in[1], in[2], t[0], t[1], t[2]})) {
      const Tensor& p = p_.get();
      const Tensor ts = h.score_tangent(q, k, t[0].defined() ? h.split(t[0]) : Tensor(),
                                        t[1].defined() ? h.split(t[1]) : Tensor());
      Tensor d;
      if (ts.defined()) d = matmul(h.dropped(HeadsInOps::through_softmax(p, ts)), h.split(in[2]));
      if (t[2].defined()) d = fwd::add_tangents(d, matmul(pd_.get(), h.split(t[2])));
      return {h.merge(d)};
    }
    const Tensor p = h.weights(q, k);
    const Tensor ts = h.score_tangent(q, k, t[0].defined() ? h.split(t[0]) : Tensor(),
                                      t[1].defined() ? h.split(t[1]) : Tensor());
    Tensor d;
    if (ts.defined()) d = matmul(h.dropped(HeadsInOps::through_softmax(p, ts)), h.split(in[2]));
    if (t[2].defined()) d = fwd::add_tangents(d, matmul(h.dropped(p), h.split(t[2])));
    return {h.merge(d)};
  }
  Tensor keep_;  // Bool (B, Tq, Tk), contiguous, or undefined
  AttentionDropout dropout_;
  Heads heads_;
  SavedTensor q_, k_, v_, p_, pd_;
};

}  // namespace

namespace {

// head_attention on a device other than the CPU, in ops (its gradient follows through them):
// the heads as (B, h, T, d_k) views, S = Q Kᵀ / sqrt(d_k), -1e9 where keep is false, P =
// softmax(S), P_d = dropout(P) (the CPU's mask for the same key), values = P_d V merged back.
HeadAttention head_attention_in_ops(const Tensor& query, const Tensor& key, const Tensor& value,
                                    const Heads& g, const Tensor& keep, double dropout_p,
                                    std::string_view op) {
  check_same_device(query, key, op);
  check_same_device(query, value, op);
  if (keep.defined()) check_same_device(query, keep, op);
  const auto split = [&](const Tensor& t, int64_t T) {
    return transpose(reshape(t, {g.B, T, g.h, g.dk}), 1, 2);
  };
  Tensor s = div(matmul(split(query, g.Tq), transpose(split(key, g.Tk), -2, -1)),
                 std::sqrt(static_cast<double>(g.dk)));
  if (keep.defined()) {
    Tensor dropped = eq(keep, 0.0);  // (B, Tq, Tk) or a broadcast of it, then a dim for the heads
    while (dropped.dim() < 3) dropped = unsqueeze(dropped, 0);
    s = masked_fill(s, unsqueeze(dropped, 1), -1e9);
  }
  Tensor p = softmax(s, -1);
  if (dropout_p > 0) p = dropout(p, dropout_p, true);
  const Tensor values = reshape(transpose(matmul(p, split(value, g.Tk)), 1, 2), {g.B, g.Tq, g.D});
  return {values, p.detach()};
}

}  // namespace

HeadAttention head_attention(const Tensor& query, const Tensor& key, const Tensor& value,
                             int64_t heads, const Tensor& keep, double dropout_p) {
  constexpr std::string_view op = "head_attention";
  profile::Scope scope(op);
  check_attention_dtypes(query, key, value, op);
  EMBER_CHECK(query.dim() == 3 && key.dim() == 3 && value.dim() == 3 &&
                  key.size(0) == query.size(0) && value.size(0) == query.size(0) &&
                  key.size(2) == query.size(2) && value.size(2) == query.size(2) &&
                  value.size(1) == key.size(1),
              "{}: q {}, k {} and v {} must be (B, Tq, D), (B, Tk, D) and (B, Tk, D)", op,
              query.shape(), key.shape(), value.shape());
  const int64_t D = query.size(2);
  EMBER_CHECK(heads > 0 && D % heads == 0,
              "{}: {} features (q {}) do not split into {} heads; heads must divide them", op, D,
              query.shape(), heads);
  EMBER_CHECK(dropout_p >= 0 && dropout_p <= 1, "{}: dropout_p has to be in [0, 1], got {}", op,
              dropout_p);
  const Heads g{query.size(0), heads, D / heads, query.size(1), key.size(1), D};
  if (!query.device().is_cpu())
    return head_attention_in_ops(query, key, value, g, keep, dropout_p, op);
  Tensor kept;  // Bool (B, Tq, Tk), contiguous
  if (keep.defined()) {
    const Shape shape{g.B, g.Tq, g.Tk};
    bool fits = keep.dim() <= 3;
    for (int64_t d = 1; fits && d <= keep.dim(); ++d)
      fits = keep.size(-d) == 1 || keep.size(-d) == shape.end()[-d];
    EMBER_CHECK(fits, "{}: keep of shape {} does not broadcast to (B, Tq, Tk) = {}", op,
                keep.shape(), shape);
    NoGradGuard no_grad;
    kept = expand(ne(keep, 0.0), shape).contiguous();
  }
  const Tensor q = query.contiguous(), k = key.contiguous(), v = value.contiguous();
  const AttentionDropout drop = attention_dropout(dropout_p);
  Tensor p = empty({g.B, g.h, g.Tq, g.Tk}, q.dtype(), q.device()), pd = p;
  Tensor out = empty(q.shape(), q.dtype(), q.device());
  const bool* kp = kept.defined() ? kept.data<bool>() : nullptr;
  dispatch_float(q.dtype(), op, [&]<class T>() {
    const auto weights = [&](int64_t begin, int64_t end) {
      head_weights<T>(g, q.data<T>(), k.data<T>(), kp, p.data<T>(), begin, end);
    };
    const auto values = [&](int64_t begin, int64_t end) {
      head_values<T>(g, pd.data<T>(), v.data<T>(), out.data<T>(), begin, end);
    };
    if (drop.kind == AttentionDropout::None) {
      over_heads(g, [&](int64_t begin, int64_t end) { weights(begin, end), values(begin, end); });
      return;
    }
    over_heads(g, weights);
    pd = apply_attention_dropout(p, drop, op);
    over_heads(g, values);
  });
  out = record<HeadAttentionBackward>(op, out, {query, key, value}, q, k, v, p, pd, kept, drop, g);
  return {out, pd};
}

}  // namespace ember
