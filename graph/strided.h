// Strided iteration shared by the kernels: N operands walked over one shape, each with its own
// element strides (0 along broadcast dims), with adjacent dims coalesced so that a contiguous
// operand is one long row. Broadcasting happens here, by strides, never by copying.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>

#include <omp.h>

#include "graph/parallel.h"
#include "graph/profile.h"
#include "graph/tensor.h"

namespace ember {

// Runs body(t, threads) once on each of `threads` OpenMP threads (inline when threads is 1), and
// times it for the profiler (Note [Step shares]): the calling thread's own share as the current
// kind of work, the rest of the region's wall time as waiting for threads.
template <class F>
void parallel_region(int threads, F&& body) {
  profile::KernelTimer timer(profile::current_kind());
  if (threads <= 1) {
    body(int64_t{0}, int64_t{1});
    return;
  }
  profile::RegionTimer region;
#pragma omp parallel num_threads(threads)
  {
    const int64_t t = omp_get_thread_num(), count = omp_get_num_threads();
    if (t == 0) region.own_start();
    body(t, count);
    if (t == 0) region.own_stop();
  }
}

// Runs body(begin, end) over [0, n): split evenly across the OpenMP threads when n reaches
// `grain`, else inline on this thread. A plain `if` rather than OpenMP's if-clause, which still
// enters the runtime (microseconds) when false, and small tensors are the common case.
template <class F>
void parallel_for(int64_t n, F&& body, int64_t grain = parallel_grain()) {
  const int threads = n < grain || omp_in_parallel() ? 1 : get_num_threads();
  if (threads == 1) {
    profile::KernelTimer timer(profile::current_kind());
    body(int64_t{0}, n);
    return;
  }
  parallel_region(threads,
                  [&](int64_t t, int64_t count) { body(n * t / count, n * (t + 1) / count); });
}

// The row count from which a loop over rows of `row_length` elements is worth splitting, for
// loops split from `grain` elements.
inline int64_t row_grain(int64_t row_length, int64_t grain = parallel_grain()) {
  return std::max<int64_t>(2, grain / std::max<int64_t>(row_length, 1));  // length 0 counts as 1
}

// Strides of `t` viewed with shape `shape` (a broadcast of t's shape): 0 along broadcast dims.
Shape broadcast_strides(const Tensor& t, const Shape& shape);
// The broadcast of two shapes, as torch; throws naming `op` when they do not broadcast.
Shape broadcast_shapes(const Shape& a, const Shape& b, std::string_view op);

template <size_t N>
class StridedLoop {
 public:
  using Offsets = std::array<int64_t, N>;

  StridedLoop(const Shape& shape, const std::array<Shape, N>& strides) {
    for (int64_t s : shape) empty_ = empty_ || s == 0;
    // Drop size-1 dims and merge dim i into i+1 when every operand steps through them as one.
    for (size_t d = 0; d < shape.size(); ++d) {
      if (shape[d] == 1) continue;
      bool merge = !shape_.empty();
      for (size_t k = 0; k < N && merge; ++k)
        merge = strides_[k].back() == strides[k][d] * shape[d];
      if (merge) {
        shape_.back() *= shape[d];
        for (size_t k = 0; k < N; ++k) strides_[k].back() = strides[k][d];
      } else {
        shape_.push_back(shape[d]);
        for (size_t k = 0; k < N; ++k) strides_[k].push_back(strides[k][d]);
      }
    }
    if (shape_.empty()) {
      shape_.push_back(1);
      for (size_t k = 0; k < N; ++k) strides_[k].push_back(0);
    }
  }

  int64_t row_length() const { return shape_.back(); }
  int64_t num_rows() const {
    int64_t rows = 1;
    for (size_t d = 0; d + 1 < shape_.size(); ++d) rows *= shape_[d];
    return rows;
  }
  Offsets inner_strides() const {
    Offsets s;
    for (size_t k = 0; k < N; ++k) s[k] = strides_[k].back();
    return s;
  }

  // Calls row(offsets, n, inner_strides) for every innermost row; rows run in parallel when
  // the whole loop has at least parallel_grain() elements.
  template <class F>
  void run(F&& row) const {
    if (empty_) return;  // no element: nothing to call, and no row length to divide by
    const int64_t rows = num_rows(), n = row_length();
    const Offsets inner = inner_strides();
    const int64_t grain = rows == 1 ? rows + 1 : std::max<int64_t>(1, parallel_grain() / n);
    parallel_for(
        rows, [&](int64_t begin, int64_t end) { run_rows(begin, end, n, inner, row); }, grain);
  }

  // As run, on the calling thread only (for loops whose rows write to shared slots).
  template <class F>
  void run_serial(F&& row) const {
    if (empty_) return;
    run_rows(0, num_rows(), row_length(), inner_strides(), row);
  }

 private:
  template <class F>
  void run_rows(int64_t begin, int64_t end, int64_t n, const Offsets& inner, F& row) const {
    if (begin >= end) return;
    const size_t outer = shape_.size() - 1;
    std::array<int64_t, 16> index{};  // tensors have at most 16 dims after coalescing
    Offsets off{};
    for (int64_t r = begin, d = static_cast<int64_t>(outer) - 1; d >= 0; --d) {
      index[d] = r % shape_[d];
      r /= shape_[d];
      for (size_t k = 0; k < N; ++k) off[k] += index[d] * strides_[k][d];
    }
    for (int64_t r = begin; r < end; ++r) {
      row(off, n, inner);
      for (int64_t d = static_cast<int64_t>(outer) - 1; d >= 0; --d) {
        for (size_t k = 0; k < N; ++k) off[k] += strides_[k][d];
        if (++index[d] < shape_[d]) break;
        for (size_t k = 0; k < N; ++k) off[k] -= strides_[k][d] * shape_[d];
        index[d] = 0;
      }
    }
  }

  Shape shape_;
  std::array<Shape, N> strides_;
  bool empty_ = false;  // some dim has size 0
};

}  // namespace ember
