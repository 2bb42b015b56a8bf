// Pooling: max_pool1d/2d (and max_pool2d_with_indices), avg_pool1d/2d and
// adaptive_avg_pool1d/2d. One 2-D implementation carries all of them: a 1-D input (N, C, L) runs
// as (N, C, 1, L) with a window of height 1, and every op is described by its windows along each
// spatial dim (Note [Pooling windows]). On the CPU, kernels parallel over the N·C planes; on a
// device, the same windows as a table of flat positions, gathered and reduced by existing ops.
//
// Note [Pooling windows]
// Along one spatial dim of size L, output o of a pooling reads the taps begin[o], begin[o] + step,
// … below end[o], every one inside the input: padding is left out (max pooling's -inf never wins
// over an input value, an average's zeros add nothing) and counted only in the divisor. So every
// pooling here is a product of its two dims' windows, and an average's divisor is divisor_h[oh] ·
// divisor_w[ow] (torch's (hend - hstart)·(wend - wstart), with or without the padding).
//   max pooling:  start = o·stride - padding, taps start + j·dilation for j < kernel, the
//                 first inside the input and those below L (torch's ih0 / ih1);
//   avg pooling:  [max(start, 0), min(start + kernel, L)), divisor min(start + kernel, L +
//                 padding) - start with count_include_pad, else the taps' count;
//   adaptive:     [floor(o·L/O), ceil((o+1)·L/O)), divisor its length.
// A max window may hold no tap at all (dilation stepping over a small input from the padding):
// torch gives -inf and an index of its first tap position; its gradient is zero.
//
// Note [Pooling backward]
// Max pooling is x's values picked at the argmax indices, so its input gradient is dY added at
// those indices into zeros of each plane (N, C, H·W): scatter_add, whose own derivative gathers
// the cotangent at the same indices. Average pooling is linear, y = A x per plane: its backward
// is the adjoint Aᵀ dY (avg_pool2d_backward, a kernel recorded as an op) and that op's backward
// is A again (the forward kernel), so each differentiates as often as asked. On a device the ops
// are composed of gather, max, sum and cat, whose derivatives autograd already has. Forward
// mode: max pooling's tangent is dX gathered at the same indices, an average pooling's is the op
// itself on dX (and its adjoint's, the adjoint on the tangent).
#include "ops/pool.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

#include "graph/autograd.h"
#include "graph/creation.h"
#include "graph/profile.h"
#include "graph/strided.h"
#include "ops/common.h"
#include "ops/elementwise.h"
#include "ops/index.h"
#include "ops/reduce.h"

namespace ember {

namespace {

// The windows along one spatial dim of size `in` (Note [Pooling windows]); for a window moved by
// a stride (not adaptive), its kernel, stride and padding too.
struct Axis {
  int64_t in = 1, step = 1;
  std::vector<int64_t> begin, end, divisor;
  int64_t kernel = 0, stride = 1, pad = 0;
  int64_t out() const { return static_cast<int64_t>(begin.size()); }
  // [lo, hi): the outputs whose every tap lies inside the input, o·stride - pad + j·step for
  // j < kernel (none when the windows are adaptive).
  std::pair<int64_t, int64_t> interior() const {
    if (kernel == 0) return {0, 0};
    const int64_t lo = std::min(out(), (pad + stride - 1) / stride);
    int64_t hi = out();
    while (hi > lo && (hi - 1) * stride - pad + (kernel - 1) * step >= in) --hi;
    return {lo, hi};
  }
  int64_t taps(int64_t o) const {
    return begin[o] < end[o] ? (end[o] - begin[o] + step - 1) / step : 0;
  }
  bool any_empty() const {
    for (int64_t o = 0; o < out(); ++o)
      if (taps(o) == 0) return true;
    return false;
  }
};

// A pooling's windows over (H, W) and the op names it records.
struct Pool2d {
  Axis h, w;
  std::string_view op;       // the forward ("avg_pool2d")
  std::string_view adjoint;  // a linear pooling's backward op ("avg_pool2d_backward")
};

// 1-D pooling's H: one window over a dim of size 1.
Axis unit_axis() { return {1, 1, {0}, {1}, {1}}; }

// torch's pooling_output_shape: floor (or ceil) of the windows that fit, less a last window
// starting past the input and its left padding.
int64_t pooled_size(int64_t L, int64_t k, int64_t s, int64_t p, int64_t d, bool ceil_mode) {
  const int64_t span = L + 2 * p - d * (k - 1) - 1 + (ceil_mode ? s - 1 : 0);
  int64_t o = (span >= 0 ? span / s : -((-span + s - 1) / s)) + 1;
  if (ceil_mode && (o - 1) * s >= L + p) --o;
  return o;
}

Axis max_axis(int64_t L, int64_t O, int64_t k, int64_t s, int64_t p, int64_t d) {
  Axis a{L, d, {}, {}, {}};
  for (int64_t o = 0; o < O; ++o) {
    int64_t start = o * s - p;
    const int64_t end = std::min(start + (k - 1) * d + 1, L);
    if (start < 0) start += (-start + d - 1) / d * d;
    a.begin.push_back(start), a.end.push_back(end), a.divisor.push_back(1);
  }
  a.kernel = k, a.stride = s, a.pad = p;
  return a;
}

Axis avg_axis(int64_t L, int64_t O, int64_t k, int64_t s, int64_t p, bool count_include_pad) {
  Axis a{L, 1, {}, {}, {}};
  for (int64_t o = 0; o < O; ++o) {
    const int64_t start = o * s - p, end = std::min(start + k, L + p);
    const int64_t b = std::max<int64_t>(start, 0), e = std::min(end, L);
    a.begin.push_back(b), a.end.push_back(e);
    a.divisor.push_back(count_include_pad ? end - start : e - b);
  }
  a.kernel = k, a.stride = s, a.pad = p;
  return a;
}

Axis adaptive_axis(int64_t L, int64_t O) {
  Axis a{L, 1, {}, {}, {}};
  for (int64_t o = 0; o < O; ++o) {
    const int64_t b = o * L / O, e = ((o + 1) * L + O - 1) / O;
    a.begin.push_back(b), a.end.push_back(e), a.divisor.push_back(e - b);
  }
  return a;
}

// --- arguments

// x of n spatial dims as (N, C, H, W) (a 1-D input gains H = 1), and how to give the result
// back x's rank.
struct Planes {
  Tensor x4;
  bool unbatched = false;
  int64_t n = 2;
  Tensor restore(const Tensor& y4) const {
    const Tensor y = n == 1 ? y4.squeeze(2) : y4;
    return unbatched ? y.squeeze(0) : y;
  }
};

Planes as_planes(const Tensor& x, int64_t n, std::string_view op) {
  const SpatialInput in = batched_input(x, n, op);
  return {n == 1 ? in.x.unsqueeze(2) : in.x, in.unbatched, n};
}

// The size of spatial dim i (of n) of x4.
int64_t spatial_size(const Planes& p, int64_t i) { return p.x4.size(p.n == 1 ? 3 : 2 + i); }

// Only the batch may be empty (torch: "with optional 0 dim batch size").
void check_planes(const Tensor& x, const Planes& p, std::string_view op) {
  bool empty = p.x4.size(1) == 0;
  for (int64_t i = 0; i < p.n; ++i) empty = empty || spatial_size(p, i) == 0;
  EMBER_CHECK(!empty,
              "{}: expected non-empty channel and spatial dims (only the batch may be empty), "
              "got an input of shape {}",
              op, x.shape());
}

struct Window {
  IntList kernel, stride, padding, dilation;
};

Window window_args(const IntList& kernel_size, const IntList& stride, const IntList& padding,
                   const IntList& dilation, int64_t n, std::string_view op) {
  Window w{expand_param(kernel_size, n, op, "kernel_size"),
           {},
           expand_param(padding, n, op, "padding"),
           expand_param(dilation, n, op, "dilation")};
  w.stride = stride.empty() ? w.kernel : expand_param(stride, n, op, "stride");
  for (int64_t i = 0; i < n; ++i) {
    EMBER_CHECK(w.kernel[i] > 0, "{}: kernel_size must be positive, got {}", op, w.kernel);
    EMBER_CHECK(w.stride[i] > 0, "{}: stride must be positive, got {}", op, w.stride);
    EMBER_CHECK(w.dilation[i] > 0, "{}: dilation must be positive, got {}", op, w.dilation);
    EMBER_CHECK(w.padding[i] >= 0 && w.padding[i] <= w.kernel[i] / 2,
                "{}: padding must be between 0 and half of kernel_size, got padding {} and "
                "kernel_size {}",
                op, w.padding, w.kernel);
  }
  return w;
}

// The output sizes of a window over each spatial dim; an Error naming `op` when one is below 1.
IntList output_sizes(const Tensor& x, const Planes& p, const Window& w, bool ceil_mode,
                     std::string_view op) {
  IntList out;
  for (int64_t i = 0; i < p.n; ++i)
    out.push_back(pooled_size(spatial_size(p, i), w.kernel[i], w.stride[i], w.padding[i],
                              w.dilation[i], ceil_mode));
  for (int64_t o : out)
    EMBER_CHECK(o >= 1,
                "{}: output size {} is too small: kernel_size {} (dilation {}) is larger than "
                "the input of shape {} padded by {}",
                op, out, w.kernel, w.dilation, x.shape(), w.padding);
  return out;
}

// The (H, W) windows from one Axis per spatial dim.
Pool2d pool_of(std::vector<Axis> axes, std::string_view op, std::string_view adjoint = {}) {
  if (axes.size() == 1) return {unit_axis(), std::move(axes[0]), op, adjoint};
  return {std::move(axes[0]), std::move(axes[1]), op, adjoint};
}

// --- CPU kernels: x4 (N, C, H, W) of any strides, results contiguous; parallel over planes

// The start of plane p (of N·C) of x4.
template <class T>
const T* plane_of(const T* data, const Tensor& x4, int64_t p) {
  const int64_t C = x4.size(1);
  return data + p / C * x4.stride(0) + p % C * x4.stride(1);
}

// One output row oh of max pooling of `plane` (rows sH apart, columns sW): into m and bi (OW)
// each window's max and its flat position h·W + w, the first of equal maxima and the last NaN
// (torch's `val > maxval || isnan(val)`, taps row by row). The interior columns (every tap
// inside the input) go one tap at a time across the row, in vector loops; the others window by
// window. Each window sees its taps in the same order either way. Idx: bi is wanted.
template <class T, bool Idx, bool Unit>
void max_pool_row(const T* plane, int64_t sH, int64_t sW, const Pool2d& g, int64_t oh, T* m,
                  int64_t* bi) {
  const Axis& aw = g.w;
  const int64_t OW = aw.out(), W = aw.in, dW = aw.step, s = aw.stride, h0 = g.h.begin[oh];
  const auto [lo, hi] = aw.interior();
  for (int64_t ow = 0; ow < OW; ++ow) {
    m[ow] = -std::numeric_limits<T>::infinity();
    if (Idx) bi[ow] = h0 * W + aw.begin[ow];
  }
  const auto update = [](T& best, int64_t& at, T v, int64_t pos) {
    const bool take = (v > best) | (v != v);
    best = take ? v : best;
    if (Idx) at = take ? pos : at;
  };
  for (int64_t h = h0; h < g.h.end[oh]; h += g.h.step) {
    const T* row = plane + h * sH;
    const auto window = [&](int64_t ow) {
      int64_t unused = 0;
      for (int64_t w = aw.begin[ow]; w < aw.end[ow]; w += dW)
        update(m[ow], Idx ? bi[ow] : unused, row[w * (Unit ? 1 : sW)], h * W + w);
    };
    for (int64_t ow = 0; ow < lo; ++ow) window(ow);
    for (int64_t j = 0; j < aw.kernel; ++j) {
      const int64_t off = j * dW - aw.pad, base = h * W + off;
      if (Unit && s == 1) {
        const T* r = row + off;
#pragma omp simd
        for (int64_t ow = lo; ow < hi; ++ow) {
          const T v = r[ow];
          const bool take = (v > m[ow]) | (v != v);
          m[ow] = take ? v : m[ow];
          if (Idx) bi[ow] = take ? base + ow : bi[ow];
        }
      } else {
        for (int64_t ow = lo; ow < hi; ++ow) {
          const int64_t w = ow * s + off;
          const T v = row[w * (Unit ? 1 : sW)];
          const bool take = (v > m[ow]) | (v != v);
          m[ow] = take ? v : m[ow];
          if (Idx) bi[ow] = take ? base + ow * s : bi[ow];
        }
      }
    }
    for (int64_t ow = std::max(lo, hi); ow < OW; ++ow) window(ow);
  }
}

#if defined(__AVX512F__)
// Note [2x2 pooling rows in AVX-512]
// A CNN's 2x2 pooling has short rows (OW = 14 or 7 on Fashion-MNIST), which GCC's vector loops
// for max_pool_2x2_row and max_pool_2x2_backward leave to their scalar remainders: both ran at a
// sixth of a memory pass (5.2 ms for the (128, 32, 28, 28) input, where relu takes 0.9). For
// Float32 these run 16 windows at a time in masked vectors: the row's taps split into even and
// odd columns by one permute of two loads, the same comparisons in the same tap order (so the
// values and indices are max_pool_2x2_row's, NaN and ties included), and the backward's taps
// merged back into the rows by the inverse permute.

// Lanes [0, n) of a 16-lane mask: none for n <= 0, all for n >= 16.
inline __mmask16 first_lanes(int64_t n) {
  if (n <= 0) return 0;
  return static_cast<__mmask16>(n >= 16 ? 0xFFFF : (1u << n) - 1);
}

// max_pool_2x2_row for Float32, 16 windows at a time.
template <bool Idx>
void max_pool_2x2_row_avx512(const float* r0, const float* r1, int64_t OW, int64_t base, int64_t W,
                             float* m, int64_t* bi) {
  const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
  const __m512i lane2 = _mm512_add_epi32(even, _mm512_set1_epi32(static_cast<int>(base)));
  for (int64_t o = 0; o < OW; o += 16) {
    const int64_t n = std::min<int64_t>(16, OW - o);
    const __mmask16 lo = first_lanes(2 * n), hi = first_lanes(2 * n - 16), out = first_lanes(n);
    const auto taps = [&](const float* row, __m512& e, __m512& d) {
      const __m512 a = _mm512_maskz_loadu_ps(lo, row + 2 * o);
      const __m512 b = _mm512_maskz_loadu_ps(hi, row + 2 * o + 16);
      e = _mm512_permutex2var_ps(a, even, b), d = _mm512_permutex2var_ps(a, odd, b);
    };
    __m512 t[4];
    taps(r0, t[0], t[1]);
    taps(r1, t[2], t[3]);
    __m512 best = t[0];
    __m512i tap = _mm512_setzero_si512();
    for (int k = 1; k < 4; ++k) {  // take = t > best || t is NaN
      const __mmask16 take =
          _mm512_cmp_ps_mask(t[k], best, _CMP_GT_OQ) | _mm512_cmp_ps_mask(t[k], t[k], _CMP_UNORD_Q);
      best = _mm512_mask_mov_ps(best, take, t[k]);
      tap = _mm512_mask_mov_epi32(tap, take, _mm512_set1_epi32(k));
    }
    _mm512_mask_storeu_ps(m + o, out, best);
    if constexpr (Idx) {  // base + 2 (o + lane) + (tap & 1) + (tap >> 1) W
      const __m512i one = _mm512_set1_epi32(1);
      __m512i at = _mm512_add_epi32(lane2, _mm512_set1_epi32(static_cast<int>(2 * o)));
      at = _mm512_add_epi32(at, _mm512_and_si512(tap, one));
      at = _mm512_add_epi32(at, _mm512_mullo_epi32(_mm512_maskz_srli_epi32(0xFFFF, tap, 1),
                                                   _mm512_set1_epi32(static_cast<int>(W))));
      _mm512_mask_storeu_epi64(
          bi + o, static_cast<__mmask8>(out),
          _mm512_maskz_cvtepi32_epi64(0xFF, _mm512_maskz_extracti64x4_epi64(0xF, at, 0)));
      _mm512_mask_storeu_epi64(
          bi + o + 8, static_cast<__mmask8>(out >> 8),
          _mm512_maskz_cvtepi32_epi64(0xFF, _mm512_maskz_extracti64x4_epi64(0xF, at, 1)));
    }
  }
}

// One output row of max_pool_2x2_backward for Float32, 16 windows at a time: g and at (OW) into
// the rows top and bottom (2 OW each).
void max_pool_2x2_backward_row_avx512(const float* g, const int64_t* at, float* top, float* bottom,
                                      int64_t OW, int64_t base, int64_t W) {
  const __m512i lane2 =
      _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i first = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
  const __m512i second = _mm512_add_epi32(first, _mm512_set1_epi32(8));
  const __m512i w0 = _mm512_set1_epi32(static_cast<int>(W));
  for (int64_t o = 0; o < OW; o += 16) {
    const int64_t n = std::min<int64_t>(16, OW - o);
    const __mmask16 lo = first_lanes(2 * n), hi = first_lanes(2 * n - 16), in = first_lanes(n);
    const __m512 v = _mm512_maskz_loadu_ps(in, g + o);
    // tap = at - base - 2 (o + lane): 0, 1, W or W + 1; at's low halves (positions fit 32 bits)
    __m512i tap = _mm512_permutex2var_epi32(
        _mm512_maskz_loadu_epi64(static_cast<__mmask8>(in), at + o), lane2,
        _mm512_maskz_loadu_epi64(static_cast<__mmask8>(in >> 8), at + o + 8));
    tap = _mm512_sub_epi32(
        tap, _mm512_add_epi32(lane2, _mm512_set1_epi32(static_cast<int>(base + 2 * o))));
    const auto row = [&](float* dst, __m512i at_even) {
      const __m512 e = _mm512_maskz_mov_ps(_mm512_cmpeq_epi32_mask(tap, at_even), v);
      const __m512 d = _mm512_maskz_mov_ps(
          _mm512_cmpeq_epi32_mask(tap, _mm512_add_epi32(at_even, _mm512_set1_epi32(1))), v);
      _mm512_mask_storeu_ps(dst + 2 * o, lo, _mm512_permutex2var_ps(e, first, d));
      _mm512_mask_storeu_ps(dst + 2 * o + 16, hi, _mm512_permutex2var_ps(e, second, d));
    };
    row(top, _mm512_setzero_si512());
    row(bottom, w0);
  }
}
#elif defined(__AVX2__)
// Note [2x2 pooling rows in AVX2]
// Note [2x2 pooling rows in AVX-512]'s rows for a CPU without AVX-512, 8 windows at a time. The
// row's taps split into even and odd columns by a shuffle and a 64-bit permute of two loads, the
// same comparisons in the same tap order (the values and indices are max_pool_2x2_row's, NaN and
// ties included); the backward's taps go back into the rows by unpacks and 128-bit permutes.
// A partial group of windows (OW = 14 or 7) loads under a mask and stores through a buffer: a
// masked store (vmaskmovps) is microcoded on AMD's cores, and with it the backward of a 28x28
// pooling ran slower than the scalar rows. On Zen 3 at one thread (medians of five runs, each the
// best of 30 calls, ms, against the scalar rows): the CNN's (128, 32, 28, 28) pooling 5.07 -> 4.34
// forward (with the indices) and 2.96 -> 2.30 backward, its (128, 64, 14, 14) one 4.82 -> 2.72
// and 2.89 -> 1.38. The forward of the larger one is bound by reading its input from memory.

// Lanes [0, n) of an 8-lane mask (all bits of a lane set): none for n <= 0, all for n >= 8.
inline __m256i first_lanes8(int64_t n) {
  const int32_t k = static_cast<int32_t>(std::clamp<int64_t>(n, 0, 8));
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(k), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

// An 8-lane 32-bit mask as two 4-lane 64-bit ones.
inline __m256i mask64_low(__m256i m) { return _mm256_cvtepi32_epi64(_mm256_castsi256_si128(m)); }
inline __m256i mask64_high(__m256i m) {
  return _mm256_cvtepi32_epi64(_mm256_extracti128_si256(m, 1));
}

// The first n (at most 8) lanes of v to dst. A whole vector by a plain store: a masked one
// (vmaskmovps) is microcoded on AMD's cores, and with them the backward of a 28x28 pooling took
// 4.3 ms on Zen 3 against 3.0 for the scalar rows.
inline void store_first(float* dst, int64_t n, __m256 v) {
  if (n >= 8) return _mm256_storeu_ps(dst, v);
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, v);
  for (int64_t i = 0; i < n; ++i) dst[i] = lanes[i];  // (std::copy became a slow rep movs)
}
// The same for 8 64-bit lanes held as two vectors.
inline void store_first(int64_t* dst, int64_t n, __m256i low, __m256i high) {
  if (n >= 8) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst), low);
    return _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + 4), high);
  }
  alignas(32) int64_t lanes[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), low);
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes + 4), high);
  for (int64_t i = 0; i < n; ++i) dst[i] = lanes[i];
}

// max_pool_2x2_row for Float32, 8 windows at a time.
template <bool Idx>
void max_pool_2x2_row_avx2(const float* r0, const float* r1, int64_t OW, int64_t base, int64_t W,
                           float* m, int64_t* bi) {
  const __m256i lane2 = _mm256_add_epi32(_mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14),
                                         _mm256_set1_epi32(static_cast<int>(base)));
  for (int64_t o = 0; o < OW; o += 8) {
    const int64_t n = std::min<int64_t>(8, OW - o);
    const __m256i lo = first_lanes8(2 * n), hi = first_lanes8(2 * n - 8);
    const auto taps = [&](const float* row, __m256& e, __m256& d) {
      const __m256 a = _mm256_maskload_ps(row + 2 * o, lo);
      const __m256 b = _mm256_maskload_ps(row + 2 * o + 8, hi);
      // per 128-bit half [a0 a2 b0 b2 | a4 a6 b4 b6], then its 64-bit pairs in order 0, 2, 1, 3
      e = _mm256_castpd_ps(_mm256_permute4x64_pd(
          _mm256_castps_pd(_mm256_shuffle_ps(a, b, _MM_SHUFFLE(2, 0, 2, 0))), 0xD8));
      d = _mm256_castpd_ps(_mm256_permute4x64_pd(
          _mm256_castps_pd(_mm256_shuffle_ps(a, b, _MM_SHUFFLE(3, 1, 3, 1))), 0xD8));
    };
    __m256 t[4];
    taps(r0, t[0], t[1]);
    taps(r1, t[2], t[3]);
    __m256 best = t[0];
    __m256 tap = _mm256_setzero_ps();  // the tap's number, as 32-bit integers
    for (int k = 1; k < 4; ++k) {      // take = t > best || t is NaN
      const __m256 take = _mm256_or_ps(_mm256_cmp_ps(t[k], best, _CMP_GT_OQ),
                                       _mm256_cmp_ps(t[k], t[k], _CMP_UNORD_Q));
      best = _mm256_blendv_ps(best, t[k], take);
      tap = _mm256_blendv_ps(tap, _mm256_castsi256_ps(_mm256_set1_epi32(k)), take);
    }
    store_first(m + o, n, best);
    if constexpr (Idx) {  // base + 2 (o + lane) + (tap & 1) + (tap >> 1) W
      const __m256i k = _mm256_castps_si256(tap);
      __m256i at = _mm256_add_epi32(lane2, _mm256_set1_epi32(static_cast<int>(2 * o)));
      at = _mm256_add_epi32(at, _mm256_and_si256(k, _mm256_set1_epi32(1)));
      at = _mm256_add_epi32(
          at, _mm256_mullo_epi32(_mm256_srli_epi32(k, 1), _mm256_set1_epi32(static_cast<int>(W))));
      store_first(bi + o, n, _mm256_cvtepi32_epi64(_mm256_castsi256_si128(at)),
                  _mm256_cvtepi32_epi64(_mm256_extracti128_si256(at, 1)));
    }
  }
}

// One output row of max_pool_2x2_backward for Float32, 8 windows at a time: g and at (OW) into
// the rows top and bottom (2 OW each).
inline void max_pool_2x2_backward_row_avx2(const float* g, const int64_t* at, float* top,
                                           float* bottom, int64_t OW, int64_t base, int64_t W) {
  const __m256i lane2 = _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14);
  const __m256i low_halves = _mm256_setr_epi32(0, 2, 4, 6, 0, 2, 4, 6);
  const __m256i w0 = _mm256_set1_epi32(static_cast<int>(W)), one = _mm256_set1_epi32(1);
  for (int64_t o = 0; o < OW; o += 8) {
    const int64_t n = std::min<int64_t>(8, OW - o);
    const __m256i in = first_lanes8(n);
    const __m256 v = _mm256_maskload_ps(g + o, in);
    // tap = at - base - 2 (o + lane): 0, 1, W or W + 1; at's low halves (positions fit 32 bits)
    const __m256i a =
        _mm256_maskload_epi64(reinterpret_cast<const long long*>(at + o), mask64_low(in));
    const __m256i b =
        _mm256_maskload_epi64(reinterpret_cast<const long long*>(at + o + 4), mask64_high(in));
    __m256i tap = _mm256_blend_epi32(_mm256_permutevar8x32_epi32(a, low_halves),
                                     _mm256_permutevar8x32_epi32(b, low_halves), 0xF0);
    tap = _mm256_sub_epi32(
        tap, _mm256_add_epi32(lane2, _mm256_set1_epi32(static_cast<int>(base + 2 * o))));
    const auto row = [&](float* dst, __m256i at_even) {
      const __m256 e = _mm256_and_ps(v, _mm256_castsi256_ps(_mm256_cmpeq_epi32(tap, at_even)));
      const __m256 d = _mm256_and_ps(
          v, _mm256_castsi256_ps(_mm256_cmpeq_epi32(tap, _mm256_add_epi32(at_even, one))));
      // [e0 d0 e1 d1 | e4 d4 e5 d5] and [e2 d2 e3 d3 | e6 d6 e7 d7] into the row's order
      const __m256 l = _mm256_unpacklo_ps(e, d), h = _mm256_unpackhi_ps(e, d);
      store_first(dst + 2 * o, 2 * n, _mm256_permute2f128_ps(l, h, 0x20));
      if (n > 4) store_first(dst + 2 * o + 8, 2 * n - 8, _mm256_permute2f128_ps(l, h, 0x31));
    };
    row(top, _mm256_setzero_si256());
    row(bottom, w0);
  }
}
#endif

// One output row of 2x2 stride-2 windows inside the input (a CNN's pooling): row r0 and the row
// below it, r1, read once across, each window's taps in max_pool_row's order (r0[2o], r0[2o + 1],
// r1[2o], r1[2o + 1]) under the same rule, so the values and indices are max_pool_row's; base is
// the flat position of r0[0], W the plane's width. Idx: bi is wanted.
template <class T, bool Idx>
void max_pool_2x2_row(const T* r0, const T* r1, int64_t OW, int64_t base, int64_t W, T* m,
                      int64_t* bi, [[maybe_unused]] bool lanes32) {
#if defined(__AVX512F__)
  if constexpr (std::is_same_v<T, float>) {
    if (lanes32) return max_pool_2x2_row_avx512<Idx>(r0, r1, OW, base, W, m, bi);
  }
#elif defined(__AVX2__)
  if constexpr (std::is_same_v<T, float>) {
    if (lanes32) return max_pool_2x2_row_avx2<Idx>(r0, r1, OW, base, W, m, bi);
  }
#endif
#pragma omp simd
  for (int64_t o = 0; o < OW; ++o) {
    const T taps[4] = {r0[2 * o], r0[2 * o + 1], r1[2 * o], r1[2 * o + 1]};
    T best = taps[0];
    int tap = 0;
    for (int t = 1; t < 4; ++t) {
      const bool take = (taps[t] > best) | (taps[t] != taps[t]);
      best = take ? taps[t] : best;
      tap = take ? t : tap;
    }
    m[o] = best;
    if (Idx) bi[o] = base + 2 * o + (tap & 1) + (tap >> 1) * W;
  }
}

// Whether every window of g is 2x2 with stride 2 and lies inside the input.
bool whole_2x2_windows(const Pool2d& g) {
  const auto two = [](const Axis& a) {
    return a.kernel == 2 && a.stride == 2 && a.pad == 0 && a.step == 1 && 2 * a.out() <= a.in;
  };
  return two(g.h) && two(g.w);
}

// out, idx (N·C, OH, OW): max_pool_row over every row of every plane; idx may be null. Unit:
// W's stride is 1.
template <class T, bool Unit>
void max_pool_kernel(const Tensor& x4, const Pool2d& g, T* out, int64_t* idx) {
  const T* px = x4.data<T>();
  const int64_t P = x4.size(0) * x4.size(1), OH = g.h.out(), OW = g.w.out();
  const int64_t sH = x4.stride(2), sW = x4.stride(3);
  if (Unit && whole_2x2_windows(g)) {
    const int64_t W = g.w.in;
    const bool lanes32 = g.h.in * W <= std::numeric_limits<int32_t>::max();
    parallel_for(
        P * OH,
        [&](int64_t r0, int64_t r1) {
          // the plane's first row, found once a plane (the rows are short: 14 windows or 7)
          const T* plane = plane_of(px, x4, r0 / OH);
          for (int64_t r = r0, p = r0 / OH, oh = r0 % OH; r < r1; ++r) {
            const T* row = plane + 2 * oh * sH;
            T* o = out + r * OW;
            int64_t* i = idx ? idx + r * OW : nullptr;
            i ? max_pool_2x2_row<T, true>(row, row + sH, OW, 2 * oh * W, W, o, i, lanes32)
              : max_pool_2x2_row<T, false>(row, row + sH, OW, 2 * oh * W, W, o, i, lanes32);
            if (++oh == OH && r + 1 < r1) oh = 0, plane = plane_of(px, x4, ++p);
          }
        },
        row_grain(4 * OW));
    return;
  }
  parallel_for(
      P,
      [&](int64_t p0, int64_t p1) {
        for (int64_t p = p0; p < p1; ++p) {
          const T* plane = plane_of(px, x4, p);
          for (int64_t oh = 0; oh < OH; ++oh) {
            T* o = out + (p * OH + oh) * OW;
            if (idx)
              max_pool_row<T, true, Unit>(plane, sH, sW, g, oh, o, idx + (p * OH + oh) * OW);
            else
              max_pool_row<T, false, Unit>(plane, sH, sW, g, oh, o, nullptr);
          }
        }
      },
      row_grain(x4.size(2) * x4.size(3)));
}

// gx (N·C, H·W), zeroed: gy (N·C, O) contiguous added at idx; indices outside the plane (a window
// without taps, Note [Pooling windows]) add nothing.
template <class T>
void max_pool_backward_kernel(const T* gy, const int64_t* idx, T* gx, int64_t P, int64_t O,
                              int64_t HW) {
  parallel_for(
      P,
      [&](int64_t p0, int64_t p1) {
        for (int64_t p = p0; p < p1; ++p)
          for (int64_t o = 0; o < O; ++o) {
            const int64_t i = idx[p * O + o];
            if (i >= 0 && i < HW) gx[p * HW + i] += gy[p * O + o];
          }
      },
      row_grain(HW + O));
}

// One output row of max_pool_2x2_backward: g and at (OW) into the rows top and bottom (2 OW
// each); in AVX-512 for Float32 where flat positions fit 32-bit lanes (lanes32).
template <class T>
void max_pool_2x2_backward_row(const T* g, const int64_t* at, T* top, T* bottom, int64_t OW,
                               int64_t base, int64_t W, [[maybe_unused]] bool lanes32) {
#if defined(__AVX512F__)
  if constexpr (std::is_same_v<T, float>) {
    if (lanes32) return max_pool_2x2_backward_row_avx512(g, at, top, bottom, OW, base, W);
  }
#elif defined(__AVX2__)
  if constexpr (std::is_same_v<T, float>) {
    if (lanes32) return max_pool_2x2_backward_row_avx2(g, at, top, bottom, OW, base, W);
  }
#endif
#pragma omp simd
  for (int64_t o = 0; o < OW; ++o) {
    const int64_t tap = at[o] - base - 2 * o;  // 0, 1, W or W + 1
    top[2 * o] = tap == 0 ? g[o] : T(0);
    top[2 * o + 1] = tap == 1 ? g[o] : T(0);
    bottom[2 * o] = tap == W ? g[o] : T(0);
    bottom[2 * o + 1] = tap == W + 1 ? g[o] : T(0);
  }
}

// gx (N·C planes of H x W), written whole: gy (N·C, OH, OW) at each 2x2 window's argmax (idx, a
// flat position in the plane), zeros at its other taps and on a last row or column no window
// covers (an odd H or W). One pass of writes where the general backward zeroes gx first and then
// scatters into it.
template <class T>
void max_pool_2x2_backward(const T* gy, const int64_t* idx, T* gx, int64_t P, int64_t H, int64_t W,
                           int64_t OH, int64_t OW) {
  const bool lanes32 = H * W <= std::numeric_limits<int32_t>::max();
  parallel_for(
      P * OH,
      [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
          const int64_t p = r / OH, oh = r % OH, base = 2 * oh * W;
          const T* g = gy + r * OW;
          const int64_t* at = idx + r * OW;
          T* top = gx + p * H * W + base;
          T* bottom = top + W;
          max_pool_2x2_backward_row(g, at, top, bottom, OW, base, W, lanes32);
          if (2 * OW < W) top[W - 1] = bottom[W - 1] = T(0);
          if (oh == OH - 1 && 2 * OH < H) std::fill(bottom + W, bottom + 2 * W, T(0));
        }
      },
      row_grain(4 * OW));
}

// row[b], row[b + 1], … below row[e] (elements sW apart) summed in double, in four partial sums
// (a chain of dependent adds is what a long window would wait on).
template <class T>
double row_sum(const T* row, int64_t b, int64_t e, int64_t sW) {
  double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  int64_t w = b;
  for (; w + 4 <= e; w += 4) {
    s0 += row[w * sW], s1 += row[(w + 1) * sW];
    s2 += row[(w + 2) * sW], s3 += row[(w + 3) * sW];
  }
  for (; w < e; ++w) s0 += row[w * sW];
  return (s0 + s1) + (s2 + s3);
}

// out (N·C, OH, OW) = each window's sum / (divisor_h · divisor_w) (y = A x), summed in double:
// an output row's sums in `acc` (OW), the interior columns (every tap inside the input) one tap
// at a time across the row in vector loops, the others window by window.
template <class T>
void avg_pool_kernel(const Tensor& x4, const Pool2d& g, T* out) {
  const T* px = x4.data<T>();
  const int64_t P = x4.size(0) * x4.size(1), OH = g.h.out(), OW = g.w.out();
  const int64_t sH = x4.stride(2), sW = x4.stride(3), s = g.w.stride;
  const auto [lo, hi] = g.w.interior();
  const bool whole_rows = OW == 1 && g.w.begin[0] == 0 && g.w.end[0] == g.w.in && sW == 1;
  parallel_for(
      P,
      [&](int64_t p0, int64_t p1) {
        std::vector<double> acc(static_cast<size_t>(OW));
        for (int64_t p = p0; p < p1; ++p) {
          const T* plane = plane_of(px, x4, p);
          for (int64_t oh = 0; oh < OH; ++oh) {
            std::fill(acc.begin(), acc.end(), 0.0);
            double* a = acc.data();
            // one window over whole rows of a contiguous plane (global pooling): one block
            const bool block = whole_rows && sH == x4.size(3);
            if (block) a[0] = row_sum(plane, g.h.begin[oh] * sH, g.h.end[oh] * sH, 1);
            for (int64_t h = g.h.begin[oh]; h < g.h.end[oh] && !block; ++h) {
              const T* row = plane + h * sH;
              for (int64_t ow = 0; ow < lo; ++ow)
                a[ow] += row_sum(row, g.w.begin[ow], g.w.end[ow], sW);
              for (int64_t j = 0; j < g.w.kernel && lo < hi; ++j) {
                const T* r = row + (j - g.w.pad) * sW;
                if (sW == 1 && s == 1) {
#pragma omp simd
                  for (int64_t ow = lo; ow < hi; ++ow) a[ow] += r[ow];
                } else {
                  for (int64_t ow = lo; ow < hi; ++ow) a[ow] += r[ow * s * sW];
                }
              }
              for (int64_t ow = std::max(lo, hi); ow < OW; ++ow)
                a[ow] += row_sum(row, g.w.begin[ow], g.w.end[ow], sW);
            }
            T* o = out + (p * OH + oh) * OW;
            for (int64_t ow = 0; ow < OW; ++ow) {
              const int64_t div = g.h.divisor[oh] * g.w.divisor[ow];
              o[ow] = div == 0 ? T(0) : static_cast<T>(a[ow] / static_cast<double>(div));
            }
          }
        }
      },
      row_grain(x4.size(2) * x4.size(3)));
}

// gx (N·C, H, W), zeroed, += gy / (divisor_h · divisor_w) over each window (z = Aᵀ gy); gy
// (N, C, OH, OW) of any strides. An output row's deltas in `delta` (OW), the interior columns
// spread one tap at a time across the row (distinct positions for distinct columns).
template <class T>
void avg_pool_adjoint_kernel(const Tensor& gy, const Pool2d& g, T* gx) {
  const T* pg = gy.data<T>();
  const int64_t P = gy.size(0) * gy.size(1), OH = g.h.out(), OW = g.w.out(), W = g.w.in;
  const int64_t HW = g.h.in * W, sH = gy.stride(2), sW = gy.stride(3), s = g.w.stride;
  const auto [lo, hi] = g.w.interior();
  parallel_for(
      P,
      [&](int64_t p0, int64_t p1) {
        std::vector<T> delta(static_cast<size_t>(OW));
        for (int64_t p = p0; p < p1; ++p) {
          const T* plane = plane_of(pg, gy, p);
          T* o = gx + p * HW;
          for (int64_t oh = 0; oh < OH; ++oh) {
            T* d = delta.data();
            for (int64_t ow = 0; ow < OW; ++ow) {
              const int64_t div = g.h.divisor[oh] * g.w.divisor[ow];
              d[ow] = div == 0 ? T(0) : plane[oh * sH + ow * sW] / static_cast<T>(div);
            }
            for (int64_t h = g.h.begin[oh]; h < g.h.end[oh]; ++h) {
              T* row = o + h * W;
              const auto window = [&](int64_t ow) {
                for (int64_t w = g.w.begin[ow]; w < g.w.end[ow]; ++w) row[w] += d[ow];
              };
              for (int64_t ow = 0; ow < lo; ++ow) window(ow);
              for (int64_t j = 0; j < g.w.kernel && lo < hi; ++j) {
                T* r = row + j - g.w.pad;
#pragma omp simd
                for (int64_t ow = lo; ow < hi; ++ow) r[ow * s] += d[ow];
              }
              for (int64_t ow = std::max(lo, hi); ow < OW; ++ow) window(ow);
            }
          }
        }
      },
      row_grain(HW + OH * OW));
}

// --- max pooling's backward (Note [Pooling backward])

// y = max of each window of x4 (N, C, H, W):  dX = scatter_add(zeros (N, C, H·W [+ 1]), 2, idx,
// dY), idx the argmax indices (H·W where a window has no tap: a slot dropped afterwards).
struct MaxPoolBackward final : Node {
  // whole_2x2: every window 2x2 of stride 2 inside the input (max_pool_2x2_backward)
  MaxPoolBackward(const Tensor& indices, bool slot, bool whole_2x2)
      : slot_(slot), whole_2x2_(whole_2x2) {
    save(indices_, indices);
  }
  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    const Shape& in = input_shapes[0];
    const Tensor& g = grads[0];
    const int64_t N = in[0], C = in[1], HW = in[2] * in[3], O = g.size(2) * g.size(3);
    const Tensor& idx = indices_.get();
    if (is_grad_enabled() || !g.device().is_cpu()) {  // create_graph, a device: in ops
      const Tensor planes = zeros({N, C, HW + (slot_ ? 1 : 0)}, g.dtype(), g.device());
      Tensor gx = scatter_add(planes, 2, idx.reshape({N, C, O}), g.reshape({N, C, O}));
      if (slot_) gx = gx.narrow(2, 0, HW);
      return {gx.reshape(in)};
    }
    const Tensor gy = g.contiguous();
    if (whole_2x2_) {
      Tensor gx = empty(in, g.dtype(), g.device());
      dispatch_float(g.dtype(), op(), [&]<class T>() {
        max_pool_2x2_backward<T>(gy.data<T>(), idx.data<int64_t>(), gx.data<T>(), N * C, in[2],
                                 in[3], g.size(2), g.size(3));
      });
      return {gx};
    }
    Tensor gx = zeros(in, g.dtype(), g.device());
    dispatch_float(g.dtype(), op(), [&]<class T>() {
      max_pool_backward_kernel<T>(gy.data<T>(), idx.data<int64_t>(), gx.data<T>(), N * C, O, HW);
    });
    return {gx};
  }
  bool differentiable_backward() const override { return true; }
  // Forward: dY = dX gathered at the argmax indices (0 where a window has no tap)
  std::vector<Tensor> jvp(const std::vector<Tensor>&, const std::vector<Tensor>& t,
                          const std::vector<Tensor>& out) override {
    const Tensor& dx = t[0];
    const Shape& y = out[0].shape();
    const int64_t N = dx.size(0), C = dx.size(1), HW = dx.size(2) * dx.size(3);
    Tensor planes = dx.reshape({N, C, HW});
    if (slot_) planes = cat({planes, zeros({N, C, 1}, dx.dtype(), dx.device())}, 2);
    return {gather(planes, 2, indices_.get().reshape({N, C, y[2] * y[3]})).reshape(y)};
  }
  bool slot_, whole_2x2_;
  SavedTensor indices_;
};

// idx with each window that has no tap pointing at the slot H·W (a copy; idx itself when none).
Tensor indices_for_gradient(const Tensor& idx, const Pool2d& g) {
  if (!g.h.any_empty() && !g.w.any_empty()) return idx;
  Tensor out = idx.clone();
  int64_t* pi = out.data<int64_t>();
  const int64_t OH = g.h.out(), OW = g.w.out(), P = idx.numel() / std::max<int64_t>(OH * OW, 1);
  for (int64_t p = 0; p < P; ++p)
    for (int64_t oh = 0; oh < OH; ++oh)
      for (int64_t ow = 0; ow < OW; ++ow)
        if (g.h.taps(oh) == 0 || g.w.taps(ow) == 0) pi[(p * OH + oh) * OW + ow] = g.h.in * g.w.in;
  return out;
}

// --- linear pooling (average, adaptive average) and its adjoint, as two ops

Tensor linear_pool(const Tensor& x4, const std::shared_ptr<const Pool2d>& g);
Tensor linear_pool_adjoint(const Tensor& gy, const std::shared_ptr<const Pool2d>& g);

// y = A x (an average per window):  dX = Aᵀ dY
struct LinearPoolBackward final : Node {
  explicit LinearPoolBackward(std::shared_ptr<const Pool2d> g) : pool_(std::move(g)) {}
  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    return {linear_pool_adjoint(grads[0], pool_)};
  }
  bool differentiable_backward() const override { return true; }
  // Forward: dY = A dX (the op on the tangent)
  std::vector<Tensor> jvp(const std::vector<Tensor>&, const std::vector<Tensor>& t,
                          const std::vector<Tensor>&) override {
    return {linear_pool(t[0], pool_)};
  }
  std::shared_ptr<const Pool2d> pool_;
};

// z = Aᵀ g:  dG = A dZ
struct LinearPoolAdjointBackward final : Node {
  explicit LinearPoolAdjointBackward(std::shared_ptr<const Pool2d> g) : pool_(std::move(g)) {}
  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    return {linear_pool(grads[0], pool_)};
  }
  bool differentiable_backward() const override { return true; }
  // Forward: dZ = Aᵀ dG (the op on the tangent)
  std::vector<Tensor> jvp(const std::vector<Tensor>&, const std::vector<Tensor>& t,
                          const std::vector<Tensor>&) override {
    return {linear_pool_adjoint(t[0], pool_)};
  }
  std::shared_ptr<const Pool2d> pool_;
};

// x4 (N, C, H, W) on the CPU -> (N, C, OH, OW)
Tensor linear_pool(const Tensor& x4, const std::shared_ptr<const Pool2d>& g) {
  Tensor out = empty({x4.size(0), x4.size(1), g->h.out(), g->w.out()}, x4.dtype(), x4.device());
  dispatch_float(x4.dtype(), g->op, [&]<class T>() { avg_pool_kernel<T>(x4, *g, out.data<T>()); });
  return record<LinearPoolBackward>(g->op, out, {x4}, g);
}

// gy (N, C, OH, OW) on the CPU -> (N, C, H, W)
Tensor linear_pool_adjoint(const Tensor& gy, const std::shared_ptr<const Pool2d>& g) {
  profile::Scope scope(g->adjoint);
  Tensor out = zeros({gy.size(0), gy.size(1), g->h.in, g->w.in}, gy.dtype(), gy.device());
  dispatch_float(gy.dtype(), g->adjoint,
                 [&]<class T>() { avg_pool_adjoint_kernel<T>(gy, *g, out.data<T>()); });
  return record<LinearPoolAdjointBackward>(g->adjoint, out, {gy}, g);
}

// --- on a device: the windows as a table of flat positions (Note [Pooling backward])

// The (OH·OW, K) table of each window's flat positions h·W + w, K the most taps of any window,
// H·W where a window has fewer.
Tensor window_table(const Pool2d& g) {
  int64_t kh = 1, kw = 1;
  for (int64_t o = 0; o < g.h.out(); ++o) kh = std::max(kh, g.h.taps(o));
  for (int64_t o = 0; o < g.w.out(); ++o) kw = std::max(kw, g.w.taps(o));
  const int64_t OH = g.h.out(), OW = g.w.out(), W = g.w.in, HW = g.h.in * W, K = kh * kw;
  std::vector<int64_t> table(static_cast<size_t>(OH * OW * K), HW);
  for (int64_t oh = 0; oh < OH; ++oh)
    for (int64_t ow = 0; ow < OW; ++ow) {
      int64_t* t = table.data() + (oh * OW + ow) * K;
      for (int64_t i = 0; i < g.h.taps(oh); ++i)
        for (int64_t j = 0; j < g.w.taps(ow); ++j)
          *t++ = (g.h.begin[oh] + i * g.h.step) * W + g.w.begin[ow] + j * g.w.step;
    }
  return from_vector(table, {OH * OW, K});
}

// x4 (N, C, H, W) on a device, each plane flattened with a slot holding `fill` appended, its
// windows gathered: (N, C, OH·OW, K), and the table (on the device).
struct Gathered {
  Tensor windows, table;
};
Gathered gather_windows(const Tensor& x4, const Pool2d& g, double fill) {
  const int64_t N = x4.size(0), C = x4.size(1), HW = g.h.in * g.w.in;
  const Tensor table = window_table(g).to(x4.device());
  const int64_t O = table.size(0), K = table.size(1);
  const Tensor planes =
      cat({x4.reshape({N, C, HW}), full({N, C, 1}, fill, x4.dtype(), x4.device())}, 2);
  const Tensor index = table.reshape({1, 1, O * K}).expand({N, C, O * K});
  return {gather(planes, 2, index).reshape({N, C, O, K}), table};
}

MaxPoolResult max_pool_on_device(const Tensor& x4, const Pool2d& g, bool want_indices) {
  const int64_t N = x4.size(0), C = x4.size(1), OH = g.h.out(), OW = g.w.out();
  const Gathered w = gather_windows(x4, g, -std::numeric_limits<double>::infinity());
  const MaxResult m = max(w.windows, 3, true);
  MaxPoolResult out{m.values.reshape({N, C, OH, OW}), {}};
  if (want_indices) {
    const Tensor table =
        w.table.reshape({1, 1, OH * OW, w.table.size(1)}).expand({N, C, OH * OW, w.table.size(1)});
    out.indices = gather(table, 3, m.indices).reshape({N, C, OH, OW});
  }
  return out;
}

Tensor linear_pool_on_device(const Tensor& x4, const Pool2d& g) {
  const int64_t N = x4.size(0), C = x4.size(1), OH = g.h.out(), OW = g.w.out();
  std::vector<double> inverse;
  for (int64_t oh = 0; oh < OH; ++oh)
    for (int64_t ow = 0; ow < OW; ++ow) {
      const int64_t div = g.h.divisor[oh] * g.w.divisor[ow];
      inverse.push_back(div == 0 ? 0.0 : 1.0 / static_cast<double>(div));
    }
  const Tensor scale = from_vector(inverse, {OH * OW}, x4.dtype()).to(x4.device());
  const Tensor sums = sum(gather_windows(x4, g, 0.0).windows, {3});
  return mul(sums, scale).reshape({N, C, OH, OW});
}

// --- the ops

MaxPoolResult max_pool(const Tensor& x, int64_t n, const IntList& kernel_size,
                       const IntList& stride, const IntList& padding, const IntList& dilation,
                       bool ceil_mode, bool want_indices, std::string_view op) {
  profile::Scope scope(op);
  const Planes p = as_planes(x, n, op);
  const Window w = window_args(kernel_size, stride, padding, dilation, n, op);
  check_planes(x, p, op);
  const IntList out = output_sizes(x, p, w, ceil_mode, op);
  std::vector<Axis> axes;
  for (int64_t i = 0; i < n; ++i)
    axes.push_back(max_axis(spatial_size(p, i), out[i], w.kernel[i], w.stride[i], w.padding[i],
                            w.dilation[i]));
  const Pool2d g = pool_of(std::move(axes), op);
  const Tensor& x4 = p.x4;
  MaxPoolResult r;
  if (!x4.device().is_cpu()) {
    r = max_pool_on_device(x4, g, want_indices);
  } else {
    const Shape shape{x4.size(0), x4.size(1), g.h.out(), g.w.out()};
    // the indices, for the backward or for the tangent (forward mode)
    const bool grad = any_requires_grad(x4) || detail::forward_wanted(&x4, 1);
    r.values = empty(shape, x4.dtype(), x4.device());
    if (want_indices || grad) r.indices = empty(shape, kInt64, x4.device());
    int64_t* idx = r.indices.defined() ? r.indices.data<int64_t>() : nullptr;
    dispatch_float(x4.dtype(), op, [&]<class T>() {
      if (x4.stride(3) == 1)
        max_pool_kernel<T, true>(x4, g, r.values.data<T>(), idx);
      else
        max_pool_kernel<T, false>(x4, g, r.values.data<T>(), idx);
    });
    const bool slot = g.h.any_empty() || g.w.any_empty();
    r.values = record<MaxPoolBackward>(op, r.values, {x4},
                                       grad ? indices_for_gradient(r.indices, g) : r.indices, slot,
                                       whole_2x2_windows(g));
  }
  return {p.restore(r.values), want_indices ? p.restore(r.indices) : Tensor()};
}

Tensor avg_pool(const Tensor& x, int64_t n, const IntList& kernel_size, const IntList& stride,
                const IntList& padding, bool ceil_mode, bool count_include_pad, std::string_view op,
                std::string_view adjoint) {
  profile::Scope scope(op);
  const Planes p = as_planes(x, n, op);
  const Window w = window_args(kernel_size, stride, padding, {1}, n, op);
  check_planes(x, p, op);
  const IntList out = output_sizes(x, p, w, ceil_mode, op);
  std::vector<Axis> axes;
  for (int64_t i = 0; i < n; ++i)
    axes.push_back(avg_axis(spatial_size(p, i), out[i], w.kernel[i], w.stride[i], w.padding[i],
                            count_include_pad));
  const auto g = std::make_shared<const Pool2d>(pool_of(std::move(axes), op, adjoint));
  if (!p.x4.device().is_cpu()) return p.restore(linear_pool_on_device(p.x4, *g));
  return p.restore(linear_pool(p.x4, g));
}

Tensor adaptive_avg_pool(const Tensor& x, int64_t n, const IntList& output_size,
                         std::string_view op, std::string_view adjoint) {
  profile::Scope scope(op);
  const Planes p = as_planes(x, n, op);
  const IntList out = expand_param(output_size, n, op, "output_size");
  for (int64_t o : out)
    EMBER_CHECK(o >= 0, "{}: output_size must be non-negative, got {}", op, out);
  std::vector<Axis> axes;
  for (int64_t i = 0; i < n; ++i) {
    EMBER_CHECK(spatial_size(p, i) > 0,
                "{}: expected non-empty spatial dims, got an input of shape {}", op, x.shape());
    axes.push_back(adaptive_axis(spatial_size(p, i), out[i]));
  }
  const auto g = std::make_shared<const Pool2d>(pool_of(std::move(axes), op, adjoint));
  if (!p.x4.device().is_cpu()) return p.restore(linear_pool_on_device(p.x4, *g));
  return p.restore(linear_pool(p.x4, g));
}

}  // namespace

Tensor max_pool1d(const Tensor& x, IntList kernel_size, IntList stride, IntList padding,
                  IntList dilation, bool ceil_mode) {
  return max_pool(x, 1, kernel_size, stride, padding, dilation, ceil_mode, false, "max_pool1d")
      .values;
}

Tensor max_pool2d(const Tensor& x, IntList kernel_size, IntList stride, IntList padding,
                  IntList dilation, bool ceil_mode) {
  return max_pool(x, 2, kernel_size, stride, padding, dilation, ceil_mode, false, "max_pool2d")
      .values;
}

MaxPoolResult max_pool2d_with_indices(const Tensor& x, IntList kernel_size, IntList stride,
                                      IntList padding, IntList dilation, bool ceil_mode) {
  return max_pool(x, 2, kernel_size, stride, padding, dilation, ceil_mode, true,
                  "max_pool2d_with_indices");
}

Tensor avg_pool1d(const Tensor& x, IntList kernel_size, IntList stride, IntList padding,
                  bool ceil_mode, bool count_include_pad) {
  return avg_pool(x, 1, kernel_size, stride, padding, ceil_mode, count_include_pad, "avg_pool1d",
                  "avg_pool1d_backward");
}

Tensor avg_pool2d(const Tensor& x, IntList kernel_size, IntList stride, IntList padding,
                  bool ceil_mode, bool count_include_pad) {
  return avg_pool(x, 2, kernel_size, stride, padding, ceil_mode, count_include_pad, "avg_pool2d",
                  "avg_pool2d_backward");
}

Tensor adaptive_avg_pool1d(const Tensor& x, IntList output_size) {
  return adaptive_avg_pool(x, 1, output_size, "adaptive_avg_pool1d",
                           "adaptive_avg_pool1d_backward");
}

Tensor adaptive_avg_pool2d(const Tensor& x, IntList output_size) {
  return adaptive_avg_pool(x, 2, output_size, "adaptive_avg_pool2d",
                           "adaptive_avg_pool2d_backward");
}

}  // namespace ember
