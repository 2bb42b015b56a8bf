// Thread control: one knob for OpenMP (our kernels) and OpenBLAS together.
//
// Note [Serial below the grain]
// Entering an OpenMP region costs about a microsecond even as `#pragma omp parallel for if
// (false)` (libgomp still sets up a team of one), more than a whole small op. Loops that are
// parallel only above a size therefore branch in C++ (parallel_for below) and small ones never
// touch libgomp.
#pragma once

#include <cstdint>

namespace ember {

// body(i) for every i in [0, n): split over the OpenMP threads when `parallel`, else a plain
// loop on this thread (Note [Serial below the grain]).
template <class F>
void parallel_for(int64_t n, bool parallel, F&& body) {
  if (parallel) {
#pragma omp parallel for
    for (int64_t i = 0; i < n; ++i) body(i);
  } else {
    for (int64_t i = 0; i < n; ++i) body(i);
  }
}

// As parallel_for, for elementwise bodies the compiler may vectorise (no dependence between i).
template <class F>
void parallel_for_simd(int64_t n, bool parallel, F&& body) {
  if (parallel) {
#pragma omp parallel for simd
    for (int64_t i = 0; i < n; ++i) body(i);
  } else {
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) body(i);
  }
}

// Sets the threads of OpenMP and OpenBLAS; n <= 0 restores the default (EMBER_NUM_THREADS, or
// every core).
void set_num_threads(int n);
int get_num_threads();

}  // namespace ember
