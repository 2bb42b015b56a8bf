// What the MPI suites share: exact comparison of tensors, and a check that every rank holds the
// same bits as rank 0 (through all_gather, so every rank must call it at the same point).
#pragma once

#include <cstring>
#include <vector>

#include "distributed/distributed.h"
#include "ember.h"

namespace ember::testing {

// Same shape, same dtype, the same bits in every element.
inline bool identical(const Tensor& a, const Tensor& b) {
  if (a.shape() != b.shape() || a.dtype() != b.dtype()) return false;
  const Tensor x = a.contiguous(), y = b.contiguous();
  return dispatch_all(x.dtype(), [&]<class T>() {
    return std::memcmp(x.data<T>(), y.data<T>(), static_cast<size_t>(x.numel()) * sizeof(T)) == 0;
  });
}

// Same shape and the same values (after conversion to double).
inline bool equal(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.to_vector<double>() == b.to_vector<double>();
}

// True on every rank when every rank's tensors are bit for bit rank 0's.
inline bool same_on_every_rank(const std::vector<Tensor>& tensors) {
  bool same = true;
  for (const Tensor& t : tensors)
    for (const Tensor& other : distributed::all_gather(t.detach()))
      same = identical(other.view(t.shape()), t.detach()) && same;
  return same;
}

}  // namespace ember::testing
