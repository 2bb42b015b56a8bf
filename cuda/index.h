// Index kernels of the CUDA backend, written once as host-and-device code as cuda/elementwise.h:
// for every position p of an Int64 index tensor, q is p with its coordinate along `dim` replaced
// by index[p]; gather reads out[p] = x[q], scatter_add adds target[q] += src[p] (atomically on a
// GPU, where positions run at once: repeated indices add in no fixed order, as torch's). An
// index outside [0, bound) is skipped, and reported when the launch has a check (Note [Checks on
// the device] in graph/device_backend.h).
#pragma once

#include "cuda/elementwise.h"

namespace ember::cuda::kernels {

enum class IndexOp : int32_t { Gather, ScatterAdd };

struct IndexAlong {
  IndexOp op = IndexOp::Gather;
  ScalarType type = ScalarType::Float32;  // of the data (x or target, out or src: one dtype)
  int dim = 0;
  int ndim = 0;
  int64_t numel = 0;
  int64_t sizes[kMaxDims] = {};  // index's shape: the loop
  const int64_t* index = nullptr;
  int64_t index_strides[kMaxDims] = {};
  void* dense = nullptr;  // out (gather) or src (scatter_add): read or written at p
  int64_t dense_strides[kMaxDims] = {};
  void* indexed = nullptr;  // x (gather) or target (scatter_add): at q
  int64_t indexed_strides[kMaxDims] = {};
  int64_t bound = 0;            // indices are in [0, bound): indexed's size along dim
  DeviceCheck* slot = nullptr;  // where an index out of range is reported (null: none)
  int32_t check = 0;            // with this id
};

namespace detail {

template <class T>
EMBER_HD void add_at(T* p, T v) {
#if defined(__CUDA_ARCH__)
  if constexpr (std::is_same_v<T, int64_t>)
    atomicAdd(reinterpret_cast<unsigned long long*>(p), static_cast<unsigned long long>(v));
  else if constexpr (std::is_same_v<T, bool>)
    *p = *p || v;  // or: racing writes all store true
  else
    atomicAdd(p, v);
#else
  *p = add(*p, v);
#endif
}

template <class T>
EMBER_HD void index_element(const IndexAlong& a, int64_t i) {
  int64_t at_index = 0, at_dense = 0, at_indexed = 0, rest = i;
  for (int d = a.ndim - 1; d >= 0; --d) {
    const int64_t c = rest % a.sizes[d];
    rest /= a.sizes[d];
    at_index += c * a.index_strides[d];
    at_dense += c * a.dense_strides[d];
    if (d != a.dim) at_indexed += c * a.indexed_strides[d];
  }
  const int64_t k = a.index[at_index];
  if (k < 0 || k >= a.bound) {  // never used; reported when the launch checks
    if (a.slot != nullptr) report(a.slot, a.check, k);
    return;
  }
  at_indexed += k * a.indexed_strides[a.dim];
  if (a.op == IndexOp::Gather)
    static_cast<T*>(a.dense)[at_dense] = static_cast<const T*>(a.indexed)[at_indexed];
  else
    add_at(static_cast<T*>(a.indexed) + at_indexed, static_cast<const T*>(a.dense)[at_dense]);
}

}  // namespace detail

EMBER_HD inline void index_element(const IndexAlong& a, int64_t i) {
  dispatch(a.type, [&](auto t) { detail::index_element<decltype(t)>(a, i); });
}

}  // namespace ember::cuda::kernels
