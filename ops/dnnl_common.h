// What ops/conv_dnnl.cpp and ops/gemm_amx.cpp share in calling oneDNN: its CPU engine, and
// OpenMP's thread count held at a value for a call (oneDNN sizes its work from
// omp_get_max_threads(), which Ember pins at one: graph/parallel.cpp). Include only where
// EMBER_HAVE_DNNL.
#pragma once

#include <omp.h>
#include <oneapi/dnnl/dnnl.hpp>

namespace ember::detail {

// The one CPU engine of the process.
inline const dnnl::engine& dnnl_cpu_engine() {
  static const dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

// OpenMP's count on this thread set to `threads` while alive.
class OmpThreads {
 public:
  explicit OmpThreads(int threads) : prev_(omp_get_max_threads()) { omp_set_num_threads(threads); }
  ~OmpThreads() { omp_set_num_threads(prev_); }
  OmpThreads(const OmpThreads&) = delete;
  OmpThreads& operator=(const OmpThreads&) = delete;

 private:
  int prev_;
};

}  // namespace ember::detail
