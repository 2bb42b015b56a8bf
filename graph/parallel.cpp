// Thread control for OpenMP and OpenBLAS. EMBER_NUM_THREADS, when set, is applied at start.
#include "graph/parallel.h"

#include <cstdlib>

#include <cblas.h>
#include <omp.h>

namespace ember {

namespace {
int default_threads() {
  if (const char* env = std::getenv("EMBER_NUM_THREADS")) {
    const int n = std::atoi(env);
    if (n > 0) return n;
  }
  return omp_get_num_procs();
}

const bool g_applied = [] {
  if (std::getenv("EMBER_NUM_THREADS")) set_num_threads(0);
  return true;
}();
}  // namespace

void set_num_threads(int n) {
  if (n <= 0) n = default_threads();
  omp_set_num_threads(n);
  openblas_set_num_threads(n);
}

int get_num_threads() { return omp_get_max_threads(); }

}  // namespace ember
