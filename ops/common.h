// Helpers shared by the op implementations in ops/*.cpp (internal: included by no public header):
// the input checks every op starts with, whose messages start with the op's name, the dtype
// conversions ops make before a kernel, and views and copies made without autograd for kernels
// and backwards to read or write through.
#pragma once

#include <string_view>

#include "graph/autograd.h"
#include "graph/tensor.h"

namespace ember {

// --- checks

inline void check_defined(const Tensor& t, std::string_view op) {
  EMBER_CHECK(t.defined(), "{}: undefined tensor", op);
}

// For ops defined on Float32 and Float64 only.
inline void check_floating(const Tensor& t, std::string_view op) {
  check_defined(t, op);
  EMBER_CHECK(is_floating(t.dtype()),
              "{}: expected a Float32 or Float64 tensor, got {} of shape {}", op, t.dtype(),
              t.shape());
}

// Two operands of one op on one device, as torch ("Expected all tensors to be on the same
// device"): an op whose inputs span devices is an Error naming it and both devices.
inline void check_same_device(const Tensor& a, const Tensor& b, std::string_view op) {
  EMBER_CHECK(a.device() == b.device(),
              "{}: expected all tensors on one device, got {} and {} (shapes {} and {})", op,
              a.device(), b.device(), a.shape(), b.shape());
}

// Query, key and value of one floating dtype (scaled_dot_product_attention, head_attention).
inline void check_attention_dtypes(const Tensor& query, const Tensor& key, const Tensor& value,
                                   std::string_view op) {
  check_floating(query, op);
  check_floating(key, op);
  check_floating(value, op);
  EMBER_CHECK(query.dtype() == key.dtype() && key.dtype() == value.dtype(),
              "{}: query, key and value are {}, {} and {}; convert them to one dtype with to()", op,
              query.dtype(), key.dtype(), value.dtype());
}

// The dtype two floating operands compute in (matmul, losses).
inline DType floating_type(const Tensor& a, const Tensor& b, std::string_view op) {
  check_defined(a, op);
  check_defined(b, op);
  check_same_device(a, b, op);
  EMBER_CHECK(is_floating(a.dtype()) && is_floating(b.dtype()),
              "{}: expected Float32 or Float64 tensors, got {} and {} (shapes {} and {})", op,
              a.dtype(), b.dtype(), a.shape(), b.shape());
  return promote(a.dtype(), b.dtype());
}

// The dtype of a product's operands (matmul, bmm, linear): both floating and the same, as torch
// ("expected m1 and m2 to have the same dtype"), never a silent promotion.
inline DType same_floating_type(const Tensor& a, const Tensor& b, std::string_view op) {
  const DType t = floating_type(a, b, op);
  EMBER_CHECK(a.dtype() == b.dtype(),
              "{}: operands of shapes {} and {} have dtypes {} and {}; convert one with to()", op,
              a.shape(), b.shape(), a.dtype(), b.dtype());
  return t;
}

// a · b for a size, or an error naming `op` when it overflows an int64 (Note [Checked sizes]:
// a wrapped product would describe a smaller tensor than the kernel then writes).
inline int64_t size_product(int64_t a, int64_t b, std::string_view op) {
  int64_t p = 0;
  EMBER_CHECK(!__builtin_mul_overflow(a, b, &p), "{}: size {} * {} overflows an int64", op, a, b);
  return p;
}

// --- dtype conversions: the tensor itself when no conversion is needed

inline Tensor as_type(const Tensor& t, DType dtype) { return t.dtype() == dtype ? t : t.to(dtype); }

// Integral inputs of math functions (exp, log, true division, ...) compute in Float32, as torch.
inline Tensor as_floating(const Tensor& t) { return is_floating(t.dtype()) ? t : t.to(kFloat32); }

// A contiguous copy (or t itself) for a kernel to read; the copy is data, not part of the graph.
inline Tensor contiguous_data(const Tensor& t) {
  if (!t.defined()) return t;
  NoGradGuard no_grad;
  return t.contiguous();
}

// --- views without autograd (dim already wrapped)

// t[..., start:start+length, ...] along dim.
inline Tensor narrow_view(const Tensor& t, int64_t dim, int64_t start, int64_t length) {
  Shape shape = t.shape();
  shape[dim] = length;
  return make_view(t, shape, t.strides(), t.storage_offset() + start * t.stride(dim));
}

// t[..., i, ...] along dim, that dim removed.
inline Tensor select_view(const Tensor& t, int64_t dim, int64_t i) {
  Shape shape = t.shape(), strides = t.strides();
  shape.erase(shape.begin() + dim);
  strides.erase(strides.begin() + dim);
  return make_view(t, shape, strides, t.storage_offset() + i * t.stride(dim));
}

// t with a size-1 dim inserted at dim (0 <= dim <= t.dim()).
inline Tensor unsqueeze_view(const Tensor& t, int64_t dim) {
  Shape shape = t.shape(), strides = t.strides();
  strides.insert(strides.begin() + dim, dim < t.dim() ? t.stride(dim) * t.size(dim) : 1);
  shape.insert(shape.begin() + dim, 1);
  return make_view(t, shape, strides, t.storage_offset());
}

}  // namespace ember
