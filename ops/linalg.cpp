// Linear algebra: matmul (torch.matmul's rules), bmm and linear, with their backward Nodes. Every
// product ends in the product layer's gemm (ops/blas.h: OpenBLAS, BLIS or oneDNN, chosen for the
// CPU), and every operand goes to it as it
// lies in memory (Note [BLAS layouts]): a transposed view is a transpose flag, not a copy. So the
// backwards are written as plain products with transposed views (dA = dC · Bᵀ) and cost no
// transposes.
#include "ops/linalg.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <optional>
#include <utility>
#include <vector>

#include <omp.h>

#include "graph/autograd.h"
#include "graph/copy.h"
#include "graph/device_backend.h"
#include "graph/profile.h"
#include "graph/strided.h"
#include "ops/blas.h"
#include "ops/common.h"
#include "ops/gemm_amx.h"
#include "ops/gemm_bf16.h"
#include "ops/loop_gemm.h"
#include "ops/reduce.h"
#include "ops/shape.h"
#include "ops/vec_math.h"

namespace ember {

namespace {

// set_float32_matmul_precision's setting, read by every Float32 product.
enum class MatmulPrecision { Highest, High, Medium };
constexpr const char* kPrecisionNames[] = {"highest", "high", "medium"};
std::atomic<MatmulPrecision> g_precision{MatmulPrecision::Highest};

// Note [BLAS layouts]
// A (rows, cols) matrix with element strides (rs, cs) is, to a row-major BLAS product:
//  - NoTrans with ld = rs when cs == 1 and rows do not overlap (rs >= cols): row-major;
//  - Trans with ld = cs when rs == 1 and cs >= rows: the transpose of a row-major (cols, rows)
//    matrix, which is what transpose(x, -1, -2) of a contiguous x is;
//  - neither otherwise (a stride-0 expanded dim, a strided column): only then it is copied.
// The stride of a size-1 dim is never read, so it constrains nothing; nor do any strides of an
// empty matrix (its products take the plain loop, BLAS rejects an ld of 0).
struct BlasLayout {
  bool trans;  // read as the transpose of the row-major matrix at ld
  int64_t ld;
};

std::optional<BlasLayout> blas_layout(int64_t rows, int64_t cols, int64_t rs, int64_t cs) {
  const int64_t r = std::max<int64_t>(rows, 1), c = std::max<int64_t>(cols, 1);
  if (rows == 0 || cols == 0) return BlasLayout{false, c};  // no element: never read
  if ((cols <= 1 || cs == 1) && (rows <= 1 || rs >= c))
    return BlasLayout{false, rows <= 1 ? c : rs};
  if ((rows <= 1 || rs == 1) && (cols <= 1 || cs >= r)) return BlasLayout{true, cols <= 1 ? r : cs};
  return std::nullopt;
}

std::optional<BlasLayout> blas_layout(const Tensor& x) {  // of x's last two dims
  const int64_t d = x.dim();
  return blas_layout(x.size(d - 2), x.size(d - 1), x.stride(d - 2), x.stride(d - 1));
}

// The same memory read as the transposed matrix.
BlasLayout flipped(BlasLayout l) { return {!l.trans, l.ld}; }

Tensor dense_copy(const Tensor& x) {
  Tensor out = empty(x.shape(), x.dtype(), x.device());
  copy_into(out, x);
  return out;
}

// A matrix operand (..., rows, cols) as BLAS reads it: the view itself when its layout allows,
// else a dense copy (kept alive here).
struct Operand {
  Tensor t;
  BlasLayout layout;
};

Operand blas_operand(const Tensor& x) {
  if (std::optional<BlasLayout> l = blas_layout(x)) return {x, *l};
  Tensor dense = dense_copy(x);
  return {dense, *blas_layout(dense)};
}

// C (m, n) row-major with leading dim ldc = alpha · op(A) · op(B) + beta · C, op(A) (m, k), all
// of m, n, k >= 1 (empty products take the plain loop below, as BLAS rejects their ld of 0), on
// this thread. With a bias (n values), C = alpha · op(A) · op(B) + bias in every row, beta unused:
// the bfloat16 kernel adds it as it stores C, for BLAS it is copied into C's rows first.
template <class T>
void blas_gemm_serial(int64_t m, int64_t n, int64_t k, T alpha, const T* a, BlasLayout la,
                      const T* b, BlasLayout lb, T beta, T* c, int64_t ldc,
                      const T* bias = nullptr) {
  if constexpr (std::is_same_v<T, float>) {
    if (float32_matmul_uses_bfloat16()) {
      detail::gemm_bf16(m, n, k, alpha, a, la.trans, la.ld, b, lb.trans, lb.ld, beta, c, ldc, bias);
      return;
    }
  }
  if (bias != nullptr) {
    for (int64_t r = 0; r < m; ++r) std::copy(bias, bias + n, c + r * ldc);
    beta = T(1);
  }
  detail::gemm(la.trans, lb.trans, m, n, k, alpha, a, la.ld, b, lb.ld, beta, c, ldc);
}

// Note [Threads in products]
// OpenBLAS runs every call on one thread (graph/parallel.cpp pins it); a product is split across
// Ember's threads here instead, so that one rule, from the product's size, decides whether a
// second thread is worth waking, and a batch of products can run in parallel over the batch. From
// blas_parallel_work() multiply-adds (m·n·k, Note [Parallel thresholds]) on, C is cut into one
// block of rows per thread (of columns when it has more columns than rows: each thread then packs
// all of A and its share of B, the smaller duplicate), with block edges on multiples of 16, the
// kernels' tile; below, the call runs on the calling thread.

template <class T>
void blas_gemm(int64_t m, int64_t n, int64_t k, T alpha, const T* a, BlasLayout la, const T* b,
               BlasLayout lb, T beta, T* c, int64_t ldc, const T* bias = nullptr) {
  profile::KernelTimer timer(profile::Kind::Gemm);
  const int threads = omp_in_parallel() ? 1 : get_num_threads();
  if constexpr (std::is_same_v<T, float>) {
    // on AMX tiles a product runs whole, on oneDNN's threads (Note [bfloat16 products on AMX])
    if (float32_matmul_uses_bfloat16() &&
        detail::gemm_bf16_amx(m, n, k, alpha, a, la.trans, la.ld, b, lb.trans, lb.ld, beta, c, ldc,
                              bias, m * n * k < blas_parallel_work() ? 1 : threads))
      return;
  }
  if (threads == 1 || m * n * k < blas_parallel_work()) {
    blas_gemm_serial(m, n, k, alpha, a, la, b, lb, beta, c, ldc, bias);
    return;
  }
  const bool by_rows = m >= n;
  const int64_t length = by_rows ? m : n;
  parallel_region(threads, [&](int64_t t, int64_t count) {
    const auto edge = [&](int64_t i) {
      return i == count ? length : std::min(length, (length * i / count + 8) / 16 * 16);
    };
    const int64_t begin = edge(t), end = edge(t + 1);
    if (begin < end && by_rows) {
      const T* rows = a + begin * (!la.trans ? la.ld : 1);
      blas_gemm_serial(end - begin, n, k, alpha, rows, la, b, lb, beta, c + begin * ldc, ldc, bias);
    } else if (begin < end) {
      const T* cols = b + begin * (!lb.trans ? 1 : lb.ld);
      blas_gemm_serial(m, end - begin, k, alpha, a, la, cols, lb, beta, c + begin, ldc,
                       bias ? bias + begin : nullptr);
    }
  });
}

// Up to this much work per matrix (m·n·k), a plain loop beats a BLAS call's fixed cost (as in
// PyTorch's small-bmm path): the batched dot products of attention pooling, tiny heads.
constexpr int64_t kSmallGemmWork = 512;

using detail::StridedMatrix;

template <class T>
StridedMatrix<T> strided(const Tensor& x) {
  return {x.data<std::remove_const_t<T>>(), x.stride(x.dim() - 2), x.stride(x.dim() - 1)};
}

// C (m, n) = alpha · A (m, k) · B (k, n) + beta · C for small matrices, read through any strides.
// With C's rows contiguous, two layouts get loops that vectorise: A's rows and B's columns
// contiguous (dot products: the batched row-times-column of attention pooling), and B's rows
// contiguous (each row of C accumulates scaled rows of B). Anything else runs the plain loop.
template <class T>
void small_gemm(int64_t m, int64_t n, int64_t k, T alpha, StridedMatrix<const T> a,
                StridedMatrix<const T> b, T beta, StridedMatrix<T> c) {
  if (k == 1) {  // an outer product (bmm's backward of batched dot products): the inner loop
                 // runs along C's longer side, with unit strides where they are
    const bool along_rows = n >= m;
    const int64_t outer = along_rows ? m : n, inner = along_rows ? n : m;
    const T* u = along_rows ? a.p : b.p;
    const T* v = along_rows ? b.p : a.p;
    const int64_t us = along_rows ? a.rs : b.cs, vs = along_rows ? b.cs : a.rs;
    const int64_t c_outer = along_rows ? c.rs : c.cs, c_inner = along_rows ? c.cs : c.rs;
    for (int64_t o = 0; o < outer; ++o) {
      const T s = alpha * u[o * us];
      T* co = c.p + o * c_outer;
      if (vs == 1 && c_inner == 1 && beta == T(0)) {
        for (int64_t i = 0; i < inner; ++i) co[i] = s * v[i];
      } else {
        for (int64_t i = 0; i < inner; ++i) {
          T& out = co[i * c_inner];
          out = beta == T(0) ? s * v[i * vs] : s * v[i * vs] + beta * out;
        }
      }
    }
    return;
  }
  if (c.cs == 1 && a.cs == 1 && b.rs == 1) {
    for (int64_t i = 0; i < m; ++i) {
      const T* ai = a.p + i * a.rs;
      T* ci = c.p + i * c.rs;
      for (int64_t j = 0; j < n; ++j) {
        const T* bj = b.p + j * b.cs;
        T acc = 0;
#pragma omp simd reduction(+ : acc)
        for (int64_t l = 0; l < k; ++l) acc += ai[l] * bj[l];
        ci[j] = beta == T(0) ? alpha * acc : alpha * acc + beta * ci[j];
      }
    }
    return;
  }
  if (c.cs == 1 && b.cs == 1) {
    for (int64_t i = 0; i < m; ++i) {
      T* ci = c.p + i * c.rs;
      for (int64_t j = 0; j < n; ++j) ci[j] = beta == T(0) ? T(0) : beta * ci[j];
      for (int64_t l = 0; l < k; ++l) {
        const T ail = alpha * a.p[i * a.rs + l * a.cs];
        const T* bl = b.p + l * b.rs;
        for (int64_t j = 0; j < n; ++j) ci[j] += ail * bl[j];
      }
    }
    return;
  }
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      T acc = 0;
      for (int64_t l = 0; l < k; ++l) acc += a.p[i * a.rs + l * a.cs] * b.p[l * b.rs + j * b.cs];
      T& out = c.p[i * c.rs + j * c.cs];
      out = beta == T(0) ? alpha * acc : alpha * acc + beta * out;
    }
  }
}

// Note [Narrow products]
// C with at most four vectors' worth of columns (64 floats with AVX-512, 32 with AVX2) and little
// work: the products of attention over short sequences (10 x 16 by 16 x 10, a batch of hundreds of
// them). A BLAS call packs both operands into its tile layout and runs edge kernels over most of
// such a C, ~200 ns of fixed cost per product. Here B is read as rows of NV whole vectors: in
// place when its rows are contiguous and n fills the vectors (a head's V or K, 16 features),
// else copied once into such rows, zero-padded, any layout read through its strides; blocks of
// 12 / NV rows of C are summed in registers, A's elements broadcast: no edges, no packing of A.
// The same loop wins over BLAS on two bigger kinds (product_loop): any number of rows over a
// short sum (k <= 64: B stays in L1, A streams through once), and few rows and columns over a
// long one, B copied a slice at a time. Physics-informed networks are made of both.
template <class T, int NV>
void narrow_gemm_nv(int64_t m, int64_t n, int64_t k, T alpha, StridedMatrix<const T> a, const T* bp,
                    int64_t ldb, T beta, StridedMatrix<T> c) {
  using L = Lanes<T>;
  using V = typename L::V;
  constexpr int64_t W = L::kWidth, NP = NV * W;
  // Rows per block: 12 accumulators (and NV registers of B) fit AVX2's 16 registers, and with
  // NV = 1 (a head of 16 features) 12 independent sums hide the FMA's latency over short k.
  constexpr int MR = 12 / NV;
  const bool whole = n == NP && c.cs == 1 && beta == T(0);  // C's rows stored as vectors
  for (int64_t i = 0; i < m; i += MR) {
    const int64_t rows = std::min<int64_t>(MR, m - i);
    const T* ar[MR];
    for (int r = 0; r < MR; ++r) ar[r] = a.p + std::min(i + r, m - 1) * a.rs;  // past m: reread
    V acc[MR][NV] = {};
    for (int64_t l = 0; l < k; ++l) {
      V bv[NV];
      for (int u = 0; u < NV; ++u) bv[u] = L::load(bp + l * ldb + u * W);
      for (int r = 0; r < MR; ++r) {
        const T s = ar[r][l * a.cs];
        for (int u = 0; u < NV; ++u) acc[r][u] += s * bv[u];
      }
    }
    for (int64_t r = 0; r < rows; ++r) {
      T* cr = c.p + (i + r) * c.rs;
      if (whole) {
        for (int u = 0; u < NV; ++u) {
          const V out = alpha * acc[r][u];
          std::memcpy(cr + u * W, &out, sizeof out);
        }
        continue;
      }
      T row[NP];
      std::memcpy(row, acc[r], sizeof row);
      for (int64_t j = 0; j < n; ++j) {
        T& out = cr[j * c.cs];
        out = beta == T(0) ? alpha * row[j] : alpha * row[j] + beta * out;
      }
    }
  }
}

template <class T>
constexpr int64_t kNarrowColumns = 4 * Lanes<T>::kWidth;
constexpr int64_t kNarrowWork = 1 << 14;  // m·n·k up to which a narrow product skips BLAS
// A narrow product over at most this many terms skips BLAS whatever its rows: B (k rows of a few
// vectors) stays in L1 and A streams through once, where BLAS packs both (a physics-informed
// network's layers, 10100 x 20 by 20 x 20: 78 µs against OpenBLAS's 117 µs on one Zen 5 core).
constexpr int64_t kNarrowDepth = 64;
constexpr int64_t kDeepNarrow = 32;  // rows and columns up to which any depth skips BLAS

template <class T>
void narrow_gemm(int64_t m, int64_t n, int64_t k, T alpha, StridedMatrix<const T> a,
                 StridedMatrix<const T> b, T beta, StridedMatrix<T> c) {
  constexpr int64_t W = Lanes<T>::kWidth;
  // At most four vectors of columns at a time: product_loop sends up to kDeepNarrow (32) columns
  // here, more than four vectors hold where they are narrower than AVX-512's (AVX2's 4 doubles,
  // SSE's 2), so C is done in blocks of columns there.
  if (n > kNarrowColumns<T>) {
    for (int64_t j = 0; j < n; j += kNarrowColumns<T>) {
      const int64_t w = std::min(kNarrowColumns<T>, n - j);
      narrow_gemm<T>(m, w, k, alpha, a, {b.p + j * b.cs, b.rs, b.cs}, beta,
                     {c.p + j * c.cs, c.rs, c.cs});
    }
    return;
  }
  const int64_t nv = (n + W - 1) / W, np = nv * W;
  const auto run = [&](int64_t kc, StridedMatrix<const T> ak, const T* bp, int64_t ldb, T bk) {
    switch (nv) {
      case 1:
        return narrow_gemm_nv<T, 1>(m, n, kc, alpha, ak, bp, ldb, bk, c);
      case 2:
        return narrow_gemm_nv<T, 2>(m, n, kc, alpha, ak, bp, ldb, bk, c);
      case 3:
        return narrow_gemm_nv<T, 3>(m, n, kc, alpha, ak, bp, ldb, bk, c);
      default:
        return narrow_gemm_nv<T, 4>(m, n, kc, alpha, ak, bp, ldb, bk, c);
    }
  };
  if (b.cs == 1 && n == np) return run(k, a, b.p, b.rs, beta);
  // B's rows copied into whole vectors, zero-padded, a slice of kPackDepth rows at a time so
  // that the copy stays in L1 (a deep product, k in the thousands, then sums slice by slice).
  constexpr int64_t kPackDepth = 256;
  thread_local std::vector<T> packed;
  packed.assign(static_cast<size_t>(std::min(k, kPackDepth) * np), T(0));
  for (int64_t l0 = 0; l0 < k || l0 == 0; l0 += kPackDepth) {
    const int64_t kc = std::min(kPackDepth, k - l0);
    for (int64_t l = 0; l < kc; ++l)
      for (int64_t j = 0; j < n; ++j) packed[l * np + j] = b.p[(l0 + l) * b.rs + j * b.cs];
    run(kc, {a.p + l0 * a.cs, a.rs, a.cs}, packed.data(), np, l0 == 0 ? beta : T(1));
    if (k == 0) break;
  }
}

// The loops below BLAS: tiny products, and matrix-vector ones (a row or a column out) up to
// kSmallGemvWork, where a BLAS gemm call costs more than the memory-bound loop, take small_gemm;
// narrow ones (Note [Narrow products]) narrow_gemm.
enum class Loop { None, Small, Narrow };
constexpr int64_t kSmallGemvWork = 65536;
template <class T>
Loop product_loop(int64_t m, int64_t n, int64_t k) {
  const int64_t work = m * n * k;
  if (work <= kSmallGemmWork || (std::min(m, n) == 1 && work <= kSmallGemvWork)) return Loop::Small;
  if (n <= kNarrowColumns<T> && work <= kNarrowWork) return Loop::Narrow;
  // Deep narrow products too, unless "medium" precision sends Float32 products to bfloat16.
  const bool bfloat16 = std::is_same_v<T, float> && float32_matmul_uses_bfloat16();
  if (n <= kNarrowColumns<T> && k <= kNarrowDepth && !bfloat16) return Loop::Narrow;
  // And products with at most 32 rows and columns whatever their depth: each block of rows
  // streams A and B once (a PINN layer's weight gradient, 20 x 10100 by 10100 x 20). From 64 x 64
  // on (a d_model 64 layer's) BLAS's tiles use the registers better.
  if (n <= kDeepNarrow && m <= kDeepNarrow && !bfloat16) return Loop::Narrow;
  return Loop::None;
}

// One product through the loop `loop` chose. A narrow product with many rows is cut into blocks
// of rows, one per thread, as blas_gemm cuts its C (Note [Threads in products]).
template <class T>
void loop_product(Loop loop, int64_t m, int64_t n, int64_t k, T alpha, StridedMatrix<const T> a,
                  StridedMatrix<const T> b, T beta, StridedMatrix<T> c) {
  if (loop == Loop::Small) return small_gemm<T>(m, n, k, alpha, a, b, beta, c);
  const int threads = omp_in_parallel() ? 1 : get_num_threads();
  if (threads == 1 || m * n * k < blas_parallel_work())
    return narrow_gemm<T>(m, n, k, alpha, a, b, beta, c);
  if (m < 12 * threads) {  // few rows (a deep product): each thread sums a share of k
    std::vector<std::vector<T>> partial(threads - 1, std::vector<T>(m * n));
    int64_t used = 1;
    parallel_region(threads, [&](int64_t t, int64_t count) {
      const int64_t begin = k * t / count, end = k * (t + 1) / count;
      const StridedMatrix<const T> at{a.p + begin * a.cs, a.rs, a.cs};
      const StridedMatrix<const T> bt{b.p + begin * b.rs, b.rs, b.cs};
      if (t == 0) {
        used = count;
        narrow_gemm<T>(m, n, end - begin, alpha, at, bt, beta, c);
      } else {
        narrow_gemm<T>(m, n, end - begin, alpha, at, bt, T(0), {partial[t - 1].data(), n, 1});
      }
    });
    for (int64_t t = 1; t < used; ++t)
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < n; ++j) c.p[i * c.rs + j * c.cs] += partial[t - 1][i * n + j];
    return;
  }
  parallel_region(threads, [&](int64_t t, int64_t count) {
    const auto edge = [&](int64_t i) {
      return i == count ? m : std::min(m, m * i / count / 12 * 12);
    };
    const int64_t begin = edge(t), end = edge(t + 1);
    if (begin < end)
      narrow_gemm<T>(end - begin, n, k, alpha, {a.p + begin * a.rs, a.rs, a.cs}, b, beta,
                     {c.p + begin * c.rs, c.rs, c.cs});
  });
}

// c = alpha · a · b + beta · c on 2-D views; c must have a BLAS layout (checked by callers).
// --- products on a CUDA device: cuda/gemm.h (cuBLAS), the operands in BLAS's layouts as above

namespace kn = cuda::kernels;

kn::Precision device_precision() {
  switch (g_precision.load(std::memory_order_relaxed)) {
    case MatmulPrecision::High:
      return kn::Precision::High;
    case MatmulPrecision::Medium:
      return kn::Precision::Medium;
    default:
      return kn::Precision::Highest;
  }
}

// g's op(A) (m, k) and op(B) (k, n) from two operands in BLAS layouts.
void set_operands(kn::Gemm& g, int64_t m, int64_t n, int64_t k, const Tensor& a, BlasLayout la,
                  const Tensor& b, BlasLayout lb) {
  g.m = m, g.n = n, g.k = k;
  g.a = a.data_bytes(), g.lda = la.ld, g.trans_a = la.trans;
  g.b = b.data_bytes(), g.ldb = lb.ld, g.trans_b = lb.trans;
}

kn::Gemm device_gemm_args(DType dtype, double alpha, double beta) {
  kn::Gemm g;
  g.type = scalar_type_of(dtype);
  g.precision = device_precision();
  g.alpha = alpha, g.beta = beta;
  return g;
}

// c (m, n), row- or column-major, = alpha · a · b + beta · c (+ bias in every row, beta unused)
// on c's device.
void device_gemm(const Tensor& a, const Tensor& b, const Tensor& c, double alpha, double beta,
                 const Tensor& bias) {
  const int64_t m = c.size(0), n = c.size(1), k = a.size(1);
  if (bias.defined()) {
    copy_into(c, bias);
    beta = 1;
  }
  if (m == 0 || n == 0) return;
  const Operand oa = blas_operand(a), ob = blas_operand(b);
  const BlasLayout lc = *blas_layout(c);
  kn::Gemm g = device_gemm_args(c.dtype(), alpha, beta);
  if (!lc.trans)
    set_operands(g, m, n, k, oa.t, oa.layout, ob.t, ob.layout);
  else  // the row-major cᵀ = bᵀ · aᵀ
    set_operands(g, n, m, k, ob.t, flipped(ob.layout), oa.t, flipped(oa.layout));
  g.c = c.data_bytes(), g.ldc = lc.ld;
  cuda::detail::launch_gemm(g, c.device(), "matmul");
}

// An operand of a batched product on the device: its matrices in a BLAS layout at one stride
// apart over `batch` (0 for one matrix broadcast to all), copied out densely where its batch
// dims do not step evenly.
struct BatchOperand {
  Operand matrix;
  int64_t stride;
};

std::vector<int64_t> batch_offsets(const Tensor& x, const Shape& batch);

BatchOperand batch_operand(const Tensor& x, const Shape& batch) {
  Operand o = blas_operand(x);
  const std::vector<int64_t> offsets = batch_offsets(o.t, batch);
  const int64_t stride = offsets.size() > 1 ? offsets[1] - offsets[0] : 0;
  bool even = true;
  for (size_t i = 0; i < offsets.size() && even; ++i)
    even = offsets[i] == static_cast<int64_t>(i) * stride;
  if (even) return {o, stride};
  Shape full = batch;
  full.push_back(x.size(-2));
  full.push_back(x.size(-1));
  const Tensor dense =
      dense_copy(make_view(o.t, full, broadcast_strides(o.t, full), o.t.storage_offset()));
  return {{dense, *blas_layout(dense)}, x.size(-2) * x.size(-1)};
}

// out (batch..., m, n), contiguous = a (..., m, k) · b (..., k, n) on out's device, one launch.
void device_batched_gemm(const Tensor& a, const Tensor& b, const Tensor& out) {
  const int64_t m = out.size(-2), n = out.size(-1), k = a.size(-1);
  const Shape batch(out.shape().begin(), out.shape().end() - 2);
  const int64_t count = shape_numel(batch);
  if (count == 0 || m == 0 || n == 0) return;
  const BatchOperand oa = batch_operand(a, batch), ob = batch_operand(b, batch);
  kn::Gemm g = device_gemm_args(out.dtype(), 1, 0);
  set_operands(g, m, n, k, oa.matrix.t, oa.matrix.layout, ob.matrix.t, ob.matrix.layout);
  g.stride_a = oa.stride, g.stride_b = ob.stride;
  g.c = out.data_bytes(), g.ldc = n, g.stride_c = m * n;
  g.batch = count;
  cuda::detail::launch_gemm(g, out.device(), "matmul");
}

// A column-major c is filled as the row-major cᵀ = bᵀ · aᵀ. With a bias (n values, linear's),
// c = alpha · a · b + bias in every row, beta unused.
template <class T>
void gemm_into(const Tensor& a, const Tensor& b, const Tensor& c, T alpha, T beta,
               const Tensor& bias = {}) {
  if (!c.device().is_cpu()) return device_gemm(a, b, c, alpha, beta, bias);
  profile::KernelTimer timer(profile::Kind::Gemm);
  const int64_t m = c.size(0), n = c.size(1), k = a.size(1);
  const Loop loop = product_loop<T>(m, n, k);
  // The bias goes down to the kernels of row-major products; the others start from it in c.
  const bool bias_in_kernel = bias.defined() && loop == Loop::None && !blas_layout(c)->trans;
  const Tensor bias_values = bias_in_kernel ? bias.contiguous() : Tensor();
  if (bias.defined() && !bias_in_kernel) {
    copy_into(c, bias);
    beta = T(1);
  }
  if (loop != Loop::None) {
    loop_product<T>(loop, m, n, k, alpha, strided<const T>(a), strided<const T>(b), beta,
                    strided<T>(c));
    return;
  }
  const Operand oa = blas_operand(a), ob = blas_operand(b);
  const BlasLayout lc = *blas_layout(c);
  if (!lc.trans) {
    blas_gemm<T>(m, n, k, alpha, oa.t.data<T>(), oa.layout, ob.t.data<T>(), ob.layout, beta,
                 c.data<T>(), lc.ld, bias_in_kernel ? bias_values.data<T>() : nullptr);
  } else {
    blas_gemm<T>(n, m, k, alpha, ob.t.data<T>(), flipped(ob.layout), oa.t.data<T>(),
                 flipped(oa.layout), beta, c.data<T>(), lc.ld);
  }
}

// Storage offsets (from x's first element) of x's matrices for every index of `batch`, which
// x's batch dims (all but the last two) broadcast to: stride 0 along broadcast dims.
std::vector<int64_t> batch_offsets(const Tensor& x, const Shape& batch) {
  const size_t nb = batch.size(), lead = nb - (x.dim() - 2);
  Shape strides(nb, 0);
  for (size_t d = lead; d < nb; ++d) strides[d] = x.size(d - lead) == 1 ? 0 : x.stride(d - lead);
  std::vector<int64_t> offsets(shape_numel(batch));
  Shape index(nb, 0);
  int64_t off = 0;
  for (int64_t& o : offsets) {
    o = off;
    for (int64_t d = static_cast<int64_t>(nb) - 1; d >= 0; --d) {
      off += strides[d];
      if (++index[d] < batch[d]) break;
      off -= strides[d] * batch[d];
      index[d] = 0;
    }
  }
  return offsets;
}

// out (batch..., m, n), contiguous = a (..., m, k) · b (..., k, n), whose batch dims broadcast
// to `batch`. Small matrices run the plain loop on their strides (no copies), the others BLAS.
template <class T>
void batched_gemm(const Tensor& a, const Tensor& b, const Tensor& out) {
  profile::KernelTimer timer(profile::Kind::Gemm);
  const int64_t m = out.size(-2), n = out.size(-1), k = a.size(-1), work = m * n * k;
  const Shape batch(out.shape().begin(), out.shape().end() - 2);
  const Loop loop = product_loop<T>(m, n, k);
  const bool small = loop != Loop::None;  // the loops read any strides, BLAS needs copies
  const Operand oa = small ? Operand{a, {}} : blas_operand(a);
  const Operand ob = small ? Operand{b, {}} : blas_operand(b);
  const std::vector<int64_t> off_a = batch_offsets(oa.t, batch), off_b = batch_offsets(ob.t, batch);
  const StridedMatrix<const T> sa = strided<const T>(oa.t), sb = strided<const T>(ob.t);
  T* pc = out.data<T>();
  const int64_t count = static_cast<int64_t>(off_a.size());
  // Over the batch when there are several products (each then runs on its thread, Note
  // [Threads in products]), else the one product splits itself.
  const bool parallel = count > 1 && count * work >= parallel_grain();
  const auto run = [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      if (small) {
        loop_product<T>(loop, m, n, k, T(1), {sa.p + off_a[i], sa.rs, sa.cs},
                        {sb.p + off_b[i], sb.rs, sb.cs}, T(0), {pc + i * m * n, n, 1});
      } else {
        blas_gemm<T>(m, n, k, T(1), sa.p + off_a[i], oa.layout, sb.p + off_b[i], ob.layout, T(0),
                     pc + i * m * n, n);
      }
    }
  };
  if (parallel)
    parallel_for(count, run, 2);
  else
    run(0, count);
}

// x (..., c) as a 2-D (N, c) view when its leading dims fold into one dim of rows.
std::optional<Tensor> fold_rows(const Tensor& x) {
  const int64_t c = x.size(-1);
  if (x.numel() == 0) {  // no element to reach: any strides do
    const Shape shape{shape_numel(Shape(x.shape().begin(), x.shape().end() - 1)), c};
    return make_view(x, shape, contiguous_strides(shape), x.storage_offset());
  }
  int64_t rows = 1, row_stride = c, next = -1;  // next: the stride the next outer dim must have
  for (int64_t d = x.dim() - 2; d >= 0; --d) {
    if (x.size(d) == 1) continue;
    if (next >= 0 && x.stride(d) != next) return std::nullopt;
    if (next < 0) row_stride = x.stride(d);
    next = x.stride(d) * x.size(d);
    rows *= x.size(d);
  }
  return make_view(x, {rows, c}, {row_stride, x.stride(-1)}, x.storage_offset());
}

// x (..., c) as (N, c) rows: a view when the leading dims fold, else a dense copy's view.
Tensor rows_of(const Tensor& x) {
  if (std::optional<Tensor> r = fold_rows(x)) return *r;
  return *fold_rows(dense_copy(x));
}

// The transpose of x's last two dims, as a view (no autograd).
Tensor mT(const Tensor& x) {
  Shape shape = x.shape(), strides = x.strides();
  std::swap(shape[x.dim() - 1], shape[x.dim() - 2]);
  std::swap(strides[x.dim() - 1], strides[x.dim() - 2]);
  return make_view(x, shape, strides, x.storage_offset());
}

// torch.matmul's unit dims: a 1-D left operand is a row (1, k), a 1-D right operand a column.
Tensor as_left_matrix(const Tensor& a) { return a.dim() == 1 ? unsqueeze_view(a, 0) : a; }
Tensor as_right_matrix(const Tensor& b) { return b.dim() == 1 ? unsqueeze_view(b, 1) : b; }

// The broadcast of a's and b's batch dims (all but the last two; both at least 2-D). Shapes
// shown in errors are the user's, before any unit dims were added.
Shape batch_shape(const Tensor& a, const Tensor& b, const Shape& user_a, const Shape& user_b) {
  const int64_t na = a.dim() - 2, nb = b.dim() - 2, n = std::max(na, nb);
  Shape batch(n);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t da = i < n - na ? 1 : a.size(i - (n - na));
    const int64_t db = i < n - nb ? 1 : b.size(i - (n - nb));
    EMBER_CHECK(da == db || da == 1 || db == 1,
                "matmul: batch dims of shapes {} and {} cannot be broadcast ({} vs {})", user_a,
                user_b, da, db);
    batch[i] = da == 1 ? db : da;
  }
  return batch;
}

// a (..., m, k) · b (..., k, n) -> (batch..., m, n) with the batch dims broadcast; no autograd.
// When b is one matrix and a's leading dims fold into rows, ((B, T, C) · (C, D), or 2-D · 2-D),
// this is one gemm of (N, k) · (k, n).
Tensor mm(const Tensor& a, const Tensor& b, const Shape& batch) {
  const int64_t n = b.size(-1);
  Shape shape = batch;
  shape.push_back(a.size(-2));
  shape.push_back(n);
  Tensor out = empty(shape, a.dtype(), a.device());
  dispatch_float(a.dtype(), "matmul", [&]<class T>() {
    std::optional<Tensor> rows = b.dim() == 2 ? fold_rows(a) : std::nullopt;
    if (rows) {
      gemm_into<T>(*rows, b, make_view(out, {rows->size(0), n}, {n, 1}, 0), T(1), T(0));
    } else if (!out.device().is_cpu()) {
      device_batched_gemm(a, b, out);
    } else {
      batched_gemm<T>(a, b, out);
    }
  });
  return out;
}
Tensor mm(const Tensor& a, const Tensor& b) {
  return mm(a, b, batch_shape(a, b, a.shape(), b.shape()));
}

}  // namespace

namespace detail {

template <class T>
void loop_gemm(int64_t m, int64_t n, int64_t k, T alpha, StridedMatrix<const T> a,
               StridedMatrix<const T> b, T beta, StridedMatrix<T> c) {
  if (m == 0 || n == 0) return;
  if (m * n * k <= kSmallGemmWork) {
    small_gemm<T>(m, n, k, alpha, a, b, beta, c);
    return;
  }
  for (int64_t j = 0; j < n; j += kNarrowColumns<T>) {  // C in blocks of columns
    const int64_t w = std::min(kNarrowColumns<T>, n - j);
    narrow_gemm<T>(m, w, k, alpha, a, {b.p + j * b.cs, b.rs, b.cs}, beta,
                   {c.p + j * c.cs, c.rs, c.cs});
  }
}
template void loop_gemm<float>(int64_t, int64_t, int64_t, float, StridedMatrix<const float>,
                               StridedMatrix<const float>, float, StridedMatrix<float>);
template void loop_gemm<double>(int64_t, int64_t, int64_t, double, StridedMatrix<const double>,
                                StridedMatrix<const double>, double, StridedMatrix<double>);

}  // namespace detail

// --- matmul

namespace {

// C = A · B with A (..., m, k), B (..., k, n), batch dims broadcast, 1-D operands unsqueezed:
//   dA = dC · Bᵀ,   dB = Aᵀ · dC
// each summed over A's or B's broadcast batch dims by the engine's sum_to; a 1-D operand's unit
// dim is dropped again.
struct MatmulBackward final : Node {
  MatmulBackward(const Tensor& a, const Tensor& b) : a_vec_(a.dim() == 1), b_vec_(b.dim() == 1) {
    if (b.requires_grad()) save(a_, as_left_matrix(a)), save(a_input_, a);
    if (a.requires_grad()) save(b_, as_right_matrix(b)), save(b_input_, b);
  }
  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    if (is_grad_enabled()) return apply_in_ops(grads[0]);
    Tensor g = grads[0];  // back to (batch..., m, n)
    if (a_vec_) g = unsqueeze_view(g, g.dim() - (b_vec_ ? 0 : 1));
    if (b_vec_) g = unsqueeze_view(g, g.dim());
    Tensor grad_a, grad_b;
    if (needs_grad(0)) {
      // dA = dC · Bᵀ
      grad_a = mm(g, mT(b_.get()));
      if (a_vec_) grad_a = select_view(grad_a, grad_a.dim() - 2, 0);
    }
    if (needs_grad(1)) {
      const Tensor& a = a_.get();
      if (input_shapes[1].size() <= 2) {
        // dB = Σ_batch Aᵀ · dC = A_rowsᵀ · dC_rows: the batch sum folds into one product
        const Tensor a_rows = rows_of(a), g_rows = rows_of(g);
        grad_b = empty({a_rows.size(1), g_rows.size(1)}, g.dtype(), g.device());
        gemm(mT(a_rows), g_rows, grad_b);
      } else {
        // dB = Aᵀ · dC
        grad_b = mm(mT(a), g);
      }
      if (b_vec_) grad_b = select_view(grad_b, grad_b.dim() - 1, 0);
    }
    return {grad_a, grad_b};
  }
  // The same in matmul ops, under create_graph; the engine sums over broadcast batch dims.
  std::vector<Tensor> apply_in_ops(Tensor g) {
    if (a_vec_) g = unsqueeze(g, g.dim() - (b_vec_ ? 0 : 1));
    if (b_vec_) g = unsqueeze(g, g.dim());
    Tensor grad_a, grad_b;
    if (needs_grad(0)) {
      const Tensor b = b_vec_ ? unsqueeze(b_input_.get(), 1) : b_input_.get();
      grad_a = matmul(g, transpose(b, -1, -2));
      if (a_vec_) grad_a = select(grad_a, -2, 0);
    }
    if (needs_grad(1)) {
      const Tensor a = a_vec_ ? unsqueeze(a_input_.get(), 0) : a_input_.get();
      grad_b = matmul(transpose(a, -1, -2), g);
      if (b_vec_) grad_b = select(grad_b, -1, 0);
    }
    return {grad_a, grad_b};
  }
  bool differentiable_backward() const override { return true; }
  // Forward: dC = dA · B + A · dB (each product of C's shape)
  std::vector<Tensor> jvp(const std::vector<Tensor>& in, const std::vector<Tensor>& t,
                          const std::vector<Tensor>&) override {
    return {fwd::add_tangents(t[0].defined() ? matmul(t[0], in[1]) : Tensor(),
                              t[1].defined() ? matmul(in[0], t[1]) : Tensor())};
  }
  bool a_vec_, b_vec_;
  SavedTensor a_, b_, a_input_, b_input_;
};

}  // namespace

Tensor matmul(const Tensor& a, const Tensor& b) {
  constexpr std::string_view op = "matmul";
  profile::Scope scope(op);
  const DType dtype = same_floating_type(a, b, op);
  EMBER_CHECK(a.dim() >= 1 && b.dim() >= 1,
              "{}: both arguments need at least 1 dim, got shapes {} and {}", op, a.shape(),
              b.shape());
  const int64_t ka = a.size(-1), kb = b.size(b.dim() == 1 ? 0 : -2);
  EMBER_CHECK(ka == kb, "{}: shapes {} and {} cannot be multiplied ({} != {})", op, a.shape(),
              b.shape(), ka, kb);
  const Tensor x = as_type(a, dtype), y = as_type(b, dtype);
  const Tensor a2 = as_left_matrix(x), b2 = as_right_matrix(y);
  const Shape batch = batch_shape(a2, b2, a.shape(), b.shape());
  Tensor out = mm(a2, b2, batch);
  Shape shape = batch;  // the unit dims of 1-D operands removed again
  if (a.dim() > 1) shape.push_back(a2.size(-2));
  if (b.dim() > 1) shape.push_back(b2.size(-1));
  if (shape != out.shape()) out = make_view(out, shape, contiguous_strides(shape), 0);
  return record<MatmulBackward>(op, out, {x, y}, x, y);
}

// --- bmm

namespace {

// C = A · B, A (n, p, q), B (n, q, r):  dA = dC · Bᵀ,  dB = Aᵀ · dC
struct BmmBackward final : Node {
  BmmBackward(const Tensor& a, const Tensor& b) {
    if (b.requires_grad()) save(a_, a);
    if (a.requires_grad()) save(b_, b);
  }
  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    const Tensor& g = grads[0];
    if (is_grad_enabled())  // create_graph: as bmm ops
      return {needs_grad(0) ? bmm(g, transpose(b_.get(), 1, 2)) : Tensor(),
              needs_grad(1) ? bmm(transpose(a_.get(), 1, 2), g) : Tensor()};
    return {needs_grad(0) ? mm(g, mT(b_.get())) : Tensor(),
            needs_grad(1) ? mm(mT(a_.get()), g) : Tensor()};
  }
  bool differentiable_backward() const override { return true; }
  // Forward: dC = dA · B + A · dB
  std::vector<Tensor> jvp(const std::vector<Tensor>& in, const std::vector<Tensor>& t,
                          const std::vector<Tensor>&) override {
    return {fwd::add_tangents(t[0].defined() ? bmm(t[0], in[1]) : Tensor(),
                              t[1].defined() ? bmm(in[0], t[1]) : Tensor())};
  }
  SavedTensor a_, b_;
};

}  // namespace

Tensor bmm(const Tensor& a, const Tensor& b) {
  constexpr std::string_view op = "bmm";
  profile::Scope scope(op);
  const DType dtype = same_floating_type(a, b, op);
  EMBER_CHECK(a.dim() == 3 && b.dim() == 3, "{}: expected 3-D tensors, got shapes {} and {}", op,
              a.shape(), b.shape());
  EMBER_CHECK(a.size(0) == b.size(0), "{}: batch sizes of shapes {} and {} differ ({} != {})", op,
              a.shape(), b.shape(), a.size(0), b.size(0));
  EMBER_CHECK(a.size(2) == b.size(1), "{}: shapes {} and {} cannot be multiplied ({} != {})", op,
              a.shape(), b.shape(), a.size(2), b.size(1));
  const Tensor x = as_type(a, dtype), y = as_type(b, dtype);
  return record<BmmBackward>(op, mm(x, y, {x.size(0)}), {x, y}, x, y);
}

// --- linear

namespace {

// linear_backward's Node: inputs dY (..., out), x (..., in), W (out, in); outputs dX = dY W,
// dW = dYᵀ X, dB = Σ_rows dY; cotangents cX, cW, cB:
//   gdY = cX Wᵀ + X cWᵀ + cB,   gX = dY cW,   gW = dYᵀ cX
// four products on the rows, each straight into its result in a row-major layout (gdY's second
// product and cB added in place), on any device. Under create_graph the same in matmul ops.
struct LinearGradBackward final : Node {
  LinearGradBackward(const Tensor& dy, const Tensor& x, const Tensor& weight) {
    save(dy_, dy), save(x_, x), save(weight_, weight);
  }
  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    const Tensor &cx = grads[0], &cw = grads[1], &cb = grads[2];
    const int64_t out = input_shapes[0].back();
    if (is_grad_enabled()) return apply_in_ops(cx, cw, cb, out);
    const Tensor dy = rows_of(dy_.get());  // (N, out)
    Tensor gdy, gx, gw;
    if (needs_grad(0) && (cx.defined() || cw.defined() || cb.defined())) {
      gdy = empty(input_shapes[0], dy.dtype(), dy.device());
      const Tensor rows = make_view(gdy, {dy.size(0), out}, {out, 1}, 0);
      // the first product starts from cB (added in its kernel where it can), the second adds on
      std::vector<std::pair<Tensor, Tensor>> terms;
      if (cx.defined()) terms.emplace_back(rows_of(cx), mT(weight_.get()));
      if (cw.defined()) terms.emplace_back(rows_of(x_.get()), mT(cw));
      if (terms.empty()) copy_into(rows, cb);
      dispatch_float(dy.dtype(), op(), [&]<class T>() {
        for (size_t i = 0; i < terms.size(); ++i)
          gemm_into<T>(terms[i].first, terms[i].second, rows, T(1), T(i == 0 ? 0 : 1),
                       i == 0 ? cb : Tensor());
      });
    }
    if (needs_grad(1) && cw.defined()) {
      gx = empty(input_shapes[1], dy.dtype(), dy.device());
      gemm(dy, cw, make_view(gx, {dy.size(0), cw.size(1)}, {cw.size(1), 1}, 0));
    }
    if (needs_grad(2) && cx.defined()) {
      gw = empty(input_shapes[2], dy.dtype(), dy.device());
      gemm(mT(dy), rows_of(cx), gw);
    }
    return {gdy, gx, gw};
  }
  std::vector<Tensor> apply_in_ops(const Tensor& cx, const Tensor& cw, const Tensor& cb,
                                   int64_t out) {
    const Tensor dy = reshape(dy_.get(), {-1, out});
    const int64_t in = input_shapes[2][1];
    Tensor gdy, gx, gw;
    if (needs_grad(0)) {
      const auto plus = [&](const Tensor& t) { gdy = gdy.defined() ? add(gdy, t) : t; };
      if (cx.defined()) plus(matmul(reshape(cx, {-1, in}), transpose(weight_.get(), 0, 1)));
      if (cw.defined()) plus(matmul(reshape(x_.get(), {-1, in}), transpose(cw, 0, 1)));
      if (cb.defined()) plus(gdy.defined() ? cb : expand(cb, dy.shape()));
      if (gdy.defined()) gdy = reshape(gdy, input_shapes[0]);
    }
    if (needs_grad(1) && cw.defined()) gx = reshape(matmul(dy, cw), input_shapes[1]);
    if (needs_grad(2) && cx.defined()) gw = matmul(transpose(dy, 0, 1), reshape(cx, {-1, in}));
    return {gdy, gx, gw};
  }
  bool differentiable_backward() const override { return true; }
  // Forward (rows flattened, each output only where the op computed it):
  //   d(dX) = tdY W + dY tW,   d(dW) = tdYᵀ X + dYᵀ tX,   d(dB) = Σ_rows tdY
  std::vector<Tensor> jvp(const std::vector<Tensor>& in, const std::vector<Tensor>& t,
                          const std::vector<Tensor>& out) override {
    // x or W is undefined where the other needs no gradient (LinearBackward saves neither then)
    const int64_t n_out = in[0].size(-1), n_in = in[1].defined() ? in[1].size(-1) : in[2].size(1);
    const auto rows = [](const Tensor& a, int64_t n) { return reshape(a, {-1, n}); };
    const auto rows_t = [&](const Tensor& a) { return transpose(rows(a, n_out), 0, 1); };
    Tensor dx, dw, db;
    if (out[0].defined()) {
      if (t[0].defined()) dx = matmul(rows(t[0], n_out), in[2]);
      if (t[2].defined()) dx = fwd::add_tangents(dx, matmul(rows(in[0], n_out), t[2]));
      if (dx.defined()) dx = reshape(dx, out[0].shape());
    }
    if (out[1].defined()) {
      if (t[0].defined()) dw = matmul(rows_t(t[0]), rows(in[1], n_in));
      if (t[1].defined()) dw = fwd::add_tangents(dw, matmul(rows_t(in[0]), rows(t[1], n_in)));
    }
    if (out[2].defined() && t[0].defined()) db = sum(rows(t[0], n_out), {0});
    return {dx, dw, db};
  }
  SavedTensor dy_, x_, weight_;
};

// y = x · Wᵀ + b over rows, x (N, in) (its leading dims flattened), W (out, in), b (out):
//   dX = dY · W,   dW = dYᵀ · X,   db = Σ_rows dY
// Each is one gemm (or one reduction) over all N rows at once. Under create_graph the same,
// recorded as the op linear_backward of (dY, x, W), whose derivative is LinearGradBackward.
struct LinearBackward final : Node {
  LinearBackward(const Tensor& x, const Tensor& x_rows, const Tensor& weight) {
    if (weight.requires_grad()) save(x_rows_, x_rows), save(x_, x);
    if (x.requires_grad()) save(weight_, weight);
  }
  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    if (!is_grad_enabled()) return by_kernels(grads[0]);
    // create_graph: the same products, recorded as linear_backward of (dY, x, W)
    std::vector<Tensor> out;
    {
      NoGradGuard no_grad;
      out = by_kernels(grads[0]);
    }
    const Tensor x = x_.get(), w = weight_.get();
    record<LinearGradBackward>("linear_backward", {&out[0], &out[1], &out[2]}, {grads[0], x, w},
                               grads[0], x, w);
    return out;
  }
  std::vector<Tensor> by_kernels(const Tensor& grad) {
    const Tensor g = rows_of(grad);  // (N, out)
    Tensor grad_x, grad_w, grad_b;
    if (needs_grad(0)) {
      // dX = dY · W
      grad_x = empty(input_shapes[0], g.dtype(), g.device());
      gemm(g, weight_.get(),
           make_view(grad_x, {g.size(0), input_shapes[1][1]}, {input_shapes[1][1], 1}, 0));
    }
    // dW = dYᵀ · X, db = Σ_rows dY; zeros where only their graph is wanted (Note [Results for
    // their graph alone]: an hvp's first gradient)
    if (needs_grad(1)) {
      grad_w = empty(input_shapes[1], g.dtype(), g.device());
      if (value_unused(1))
        grad_w.zero_();
      else
        gemm(mT(g), x_rows_.get(), grad_w);
    }
    if (needs_grad(2)) {
      if (value_unused(2))
        (grad_b = empty(input_shapes[2], g.dtype(), g.device())).zero_();
      else
        grad_b = sum(g, {0});
    }
    return {grad_x, grad_w, grad_b};
  }
  bool differentiable_backward() const override { return true; }
  // Forward: dY = dX · Wᵀ + X · dWᵀ + db, as linear ops (the first takes db as its bias)
  std::vector<Tensor> jvp(const std::vector<Tensor>& in, const std::vector<Tensor>& t,
                          const std::vector<Tensor>& out) override {
    Tensor d, db = t[2];
    if (t[0].defined()) d = linear(t[0], in[1], db), db = Tensor();
    if (t[1].defined()) d = fwd::add_tangents(d, linear(in[0], t[1], db)), db = Tensor();
    return {d.defined() ? d : fwd::broadcast_tangent(db, out[0].shape())};
  }
  SavedTensor x_rows_, x_, weight_;
};

}  // namespace

Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  constexpr std::string_view op = "linear";
  profile::Scope scope(op);
  DType dtype = same_floating_type(x, weight, op);
  EMBER_CHECK(x.dim() >= 1, "{}: input must have at least 1 dim, got shape {}", op, x.shape());
  EMBER_CHECK(weight.dim() == 2, "{}: weight must be 2-D (out, in), got shape {}", op,
              weight.shape());
  EMBER_CHECK(x.size(-1) == weight.size(1),
              "{}: input of shape {} has {} features, weight of shape {} expects {}", op, x.shape(),
              x.size(-1), weight.shape(), weight.size(1));
  if (bias.defined()) {
    check_same_device(x, bias, op);
    EMBER_CHECK(is_floating(bias.dtype()), "{}: expected a Float32 or Float64 bias, got {}", op,
                bias.dtype());
    EMBER_CHECK(bias.dim() == 1 && bias.size(0) == weight.size(0),
                "{}: bias of shape {} does not match the {} output features of weight of shape {}",
                op, bias.shape(), weight.size(0), weight.shape());
    EMBER_CHECK(bias.dtype() == dtype,
                "{}: a {} bias for {} input and weight; convert it with to()", op, bias.dtype(),
                dtype);
  }
  const Tensor in = as_type(x, dtype), w = as_type(weight, dtype);
  const Tensor b = bias.defined() ? as_type(bias, dtype) : Tensor();
  const int64_t out_features = w.size(0);
  Shape shape = in.shape();
  shape.back() = out_features;
  Tensor out = empty(shape, dtype, in.device());
  // x (N, in) · Wᵀ (in, out) + the bias in every row of out
  const Tensor x_rows = rows_of(in);
  const Tensor out_rows = make_view(out, {x_rows.size(0), out_features}, {out_features, 1}, 0);
  dispatch_float(dtype, op,
                 [&]<class T>() { gemm_into<T>(x_rows, mT(w), out_rows, T(1), T(0), b); });
  return record<LinearBackward>(op, out, {in, w, b}, in, x_rows, w);
}

// --- gemm, the building block

void gemm(const Tensor& a, const Tensor& b, const Tensor& c, double alpha, double beta) {
  EMBER_CHECK(a.defined() && b.defined() && c.defined(), "gemm: undefined tensor");
  check_same_device(a, c, "gemm");
  check_same_device(b, c, "gemm");
  EMBER_CHECK(a.dim() == 2 && b.dim() == 2 && c.dim() == 2,
              "gemm: expected 2-D tensors, got shapes {}, {} and {}", a.shape(), b.shape(),
              c.shape());
  EMBER_CHECK(a.size(1) == b.size(0) && c.size(0) == a.size(0) && c.size(1) == b.size(1),
              "gemm: shapes {} and {} cannot be multiplied into {}", a.shape(), b.shape(),
              c.shape());
  EMBER_CHECK(a.dtype() == c.dtype() && b.dtype() == c.dtype() && is_floating(c.dtype()),
              "gemm: expected one Float32 or Float64 dtype, got {}, {} and {}", a.dtype(),
              b.dtype(), c.dtype());
  EMBER_CHECK(blas_layout(c).has_value(),
              "gemm: output of shape {} and strides {} is neither row- nor column-major", c.shape(),
              c.strides());
  dispatch_float(c.dtype(), "gemm", [&]<class T>() {
    gemm_into<T>(a, b, c, static_cast<T>(alpha), static_cast<T>(beta));
  });
}

void set_float32_matmul_precision(const std::string& precision) {
  for (int i = 0; i < 3; ++i) {
    if (precision == kPrecisionNames[i]) {
      g_precision.store(static_cast<MatmulPrecision>(i));
      return;
    }
  }
  EMBER_CHECK(false,
              "set_float32_matmul_precision: expected \"highest\", \"high\" or \"medium\", got "
              "\"{}\"",
              precision);
}

std::string get_float32_matmul_precision() {
  return kPrecisionNames[static_cast<int>(g_precision.load())];
}

bool float32_matmul_uses_bfloat16() {
  return g_precision.load(std::memory_order_relaxed) == MatmulPrecision::Medium &&
         detail::cpu_has_bf16_products();
}

}  // namespace ember
