// The reduction kernel of the CUDA backend: sums over a set of dims (sum, mean, sum_to, the
// engine's broadcast gradients), written once as host-and-device code as cuda/elementwise.h.
// Output element j sums the input elements that share its index along the kept dims; the GPU
// gives each output a block whose threads split its elements and add their partial sums in a
// fixed tree (so a sum is the same run to run), the emulated device one loop.
#pragma once

#include "cuda/elementwise.h"

namespace ember::cuda::kernels {

struct Reduce {
  const void* in = nullptr;  // the first element's address
  ScalarType in_type = ScalarType::Float32;
  void* out = nullptr;  // contiguous, out_numel elements, in the kept dims' order
  ScalarType out_type = ScalarType::Float32;
  int64_t out_numel = 0;
  int kept_ndim = 0;  // the dims kept, their sizes and the input's strides along them
  int64_t kept_sizes[kMaxDims] = {};
  int64_t kept_strides[kMaxDims] = {};
  int reduced_ndim = 0;  // the dims summed over
  int64_t reduced_sizes[kMaxDims] = {};
  int64_t reduced_strides[kMaxDims] = {};
  int64_t reduced_numel = 1;  // elements summed into each output
};

namespace detail {

// The offset of the element at linear index i over `ndim` dims of `sizes` stepping `strides`.
EMBER_HD inline int64_t offset_of(int64_t i, int ndim, const int64_t* sizes,
                                  const int64_t* strides) {
  int64_t offset = 0;
  for (int d = ndim - 1; d >= 0; --d) {
    offset += (i % sizes[d]) * strides[d];
    i /= sizes[d];
  }
  return offset;
}

}  // namespace detail

// Sums accumulate in double (floating inputs) or int64 (integral and Bool ones, as torch).
template <class Acc>
EMBER_HD Acc reduce_partial(const Reduce& r, int64_t j, int64_t first, int64_t step) {
  const int64_t base = detail::offset_of(j, r.kept_ndim, r.kept_sizes, r.kept_strides);
  Acc acc = 0;
  for (int64_t k = first; k < r.reduced_numel; k += step)
    acc += detail::load<Acc>(
        r.in, r.in_type,
        base + detail::offset_of(k, r.reduced_ndim, r.reduced_sizes, r.reduced_strides));
  return acc;
}

template <class Acc>
EMBER_HD void reduce_store(const Reduce& r, int64_t j, Acc sum) {
  detail::store<Acc>(r.out, r.out_type, j, sum);
}

EMBER_HD inline bool reduce_in_double(const Reduce& r) {
  return r.in_type == ScalarType::Float32 || r.in_type == ScalarType::Float64;
}

}  // namespace ember::cuda::kernels
