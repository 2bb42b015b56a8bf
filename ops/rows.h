// The rows of a tensor along one dim, and the max, sum and dot product of a contiguous row: what
// the fused row kernels of softmax (ops/softmax.cpp) and scaled_dot_product_attention
// (ops/attention.cpp) share. Internal to ops/.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "graph/strided.h"
#include "ops/vec_math.h"

namespace ember {

// The rows of a tensor along one dim: row r starts `start(r)` elements after data<T>() and
// steps by `stride`. Rows are numbered in row-major order of the other dims, so row r of a
// strided input and row r of its contiguous output are the same row. Contiguous tensors
// compute starts from (outer, inner); strided ones list them.
struct Rows {
  int64_t count = 1, n = 1, stride = 1, inner = 1;
  std::vector<int64_t> starts;

  int64_t start(int64_t r) const {
    return starts.empty() ? (r / inner) * n * inner + r % inner : starts[r];
  }
  bool parallel() const { return count > 1 && count * n >= costly_grain(); }
};

inline Rows rows_along(const Tensor& t, int64_t dim) {
  Rows rows;
  if (t.dim() == 0) return rows;
  rows.n = t.size(dim);
  rows.count = 1;
  for (int64_t d = 0; d < t.dim(); ++d)
    if (d != dim) rows.count *= t.size(d);
  if (t.is_contiguous()) {
    for (int64_t d = dim + 1; d < t.dim(); ++d) rows.inner *= t.size(d);
    rows.stride = rows.inner;
    return rows;
  }
  rows.stride = t.stride(dim);
  if (rows.count == 0) return rows;
  Shape outer = t.shape();
  outer[dim] = 1;
  rows.starts.reserve(rows.count);
  StridedLoop<1> loop(outer, {t.strides()});
  loop.run_serial([&](const auto& off, int64_t len, const auto& st) {
    for (int64_t i = 0; i < len; ++i) rows.starts.push_back(off[0] + i * st[0]);
  });
  return rows;
}

// Calls f(r) for every row, in parallel above the grain.
template <class F>
void for_each_row(const Rows& rows, F f) {
  parallel_for(
      rows.count,
      [&](int64_t begin, int64_t end) {
        for (int64_t r = begin; r < end; ++r) f(r);
      },
      row_grain(rows.n, costly_grain()));
}

// Rows shorter than kShortRow run pass by pass over blocks of at most kShortRowBlock elements
// (softmax_short_rows in ops/softmax.cpp, attention_block in ops/attention.cpp).
inline constexpr int64_t kShortRow = 64, kShortRowBlock = 2048;

// The max, sum and dot product of contiguous rows: in lanes (Note [Lane sums]) from a vector's
// width on, below that in four independent chains (one chain's latency, not the arithmetic, is
// what such a row waits on; a SIMD loop would run in its scalar remainder).
template <class T>
EMBER_VEC_INLINE T row_max(const T* x, int64_t n) {
  using L = Lanes<T>;
  if (n >= L::kWidth) {
    L acc(x[0]);
    int64_t j = for_lanes<T>(
        n, [&](int64_t j, int u) EMBER_VEC_LAMBDA { acc.v[u] = L::max(acc.v[u], L::load(x + j)); });
    T m = acc.max_total();
    for (; j < n; ++j) m = std::max(m, x[j]);
    return m;
  }
  T m[4] = {x[0], x[0], x[0], x[0]};
  int64_t j = 0;
  for (; j + 4 <= n; j += 4)
    for (int l = 0; l < 4; ++l) m[l] = std::max(m[l], x[j + l]);
  for (; j < n; ++j) m[0] = std::max(m[0], x[j]);
  return std::max(std::max(m[0], m[1]), std::max(m[2], m[3]));
}

// Σ a[j] · b[j], or Σ a[j] when b is null.
template <class T>
EMBER_VEC_INLINE T row_dot(const T* a, const T* b, int64_t n) {
  using L = Lanes<T>;
  if (n >= L::kWidth) {
    L acc;
    int64_t j = for_lanes<T>(n, [&](int64_t j, int u) EMBER_VEC_LAMBDA {
      acc.v[u] += b ? L::load(a + j) * L::load(b + j) : L::load(a + j);
    });
    T s = acc.total();
    for (; j < n; ++j) s += b ? a[j] * b[j] : a[j];
    return s;
  }
  T s[4] = {0, 0, 0, 0};
  int64_t j = 0;
  for (; j + 4 <= n; j += 4)
    for (int l = 0; l < 4; ++l) s[l] += b ? a[j + l] * b[j + l] : a[j + l];
  for (; j < n; ++j) s[0] += b ? a[j] * b[j] : a[j];
  return (s[0] + s[1]) + (s[2] + s[3]);
}

template <class T>
EMBER_VEC_INLINE T row_sum(const T* x, int64_t n) {
  return row_dot<T>(x, nullptr, n);
}

}  // namespace ember
