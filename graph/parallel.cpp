// Thread control: Ember's own thread count, which every parallel region names explicitly, with
// OpenMP's default count (its nthreads ICV) and OpenBLAS pinned at one (Note [Threads in
// products], ops/linalg.cpp). EMBER_NUM_THREADS, when set, is the count at start; else
// OMP_NUM_THREADS's, else every core.
#include "graph/parallel.h"

#include <strings.h>
#include <atomic>

#include <cstdlib>

#include <cblas.h>
#include <omp.h>

namespace ember {

namespace {
int env_threads() {
  if (const char* env = std::getenv("EMBER_NUM_THREADS")) {
    const int n = std::atoi(env);
    if (n > 0) return n;
  }
  return 0;
}

// OpenBLAS's OpenMP build runs a call on omp_get_max_threads() threads (num_cpu_avail in its
// common_thread.h), and resizes its per-thread buffers whenever that count changes: so the
// count stays 1 for good, set through OpenBLAS (which also sets OpenMP's), and Ember keeps its
// own.
void pin_openmp_and_blas() {
  openblas_set_num_threads(1);
  omp_set_num_threads(1);
}

std::atomic<int> g_threads = [] {
  const int env = env_threads();
  const int n = env > 0 ? env : omp_get_max_threads();  // before the pin: OMP_NUM_THREADS's
  pin_openmp_and_blas();
  return n;
}();
}  // namespace

void set_num_threads(int n) {
  if (n <= 0) n = env_threads() > 0 ? env_threads() : omp_get_num_procs();
  pin_openmp_and_blas();  // again: a caller may have set OpenMP's or OpenBLAS's count since
  g_threads.store(n, std::memory_order_relaxed);
}

int get_num_threads() { return g_threads.load(std::memory_order_relaxed); }

namespace {
int64_t threshold_scale() {
  const char* policy = std::getenv("OMP_WAIT_POLICY");
  return policy && strncasecmp(policy, "passive", 7) == 0 ? 16 : 1;  // OpenMP ignores case
}
}  // namespace

// Note [Parallel thresholds]
int64_t parallel_grain() {
  static const int64_t grain = [] {
    const char* forced = std::getenv("EMBER_PARALLEL_GRAIN");  // for measuring other grains
    return forced != nullptr ? std::max<int64_t>(1, std::atoll(forced)) : 65536 * threshold_scale();
  }();
  return grain;
}
int64_t costly_grain() { return std::max<int64_t>(1, parallel_grain() / 4); }
int64_t blas_parallel_work() {
  static const int64_t work = (int64_t{1} << 20) * threshold_scale();
  return work;
}

}  // namespace ember
