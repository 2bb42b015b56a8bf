// Tensor: a cheap handle (shared_ptr<TensorImpl>) over a strided view of a shared Storage.
// Copies of a Tensor alias the same data; views share storage and change only shape/strides.
// Every free op that takes a Tensor first is also a method here; the methods are one-line
// forwards defined beside their op in ops/<family>.cpp.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include <fmt/ostream.h>

#include "graph/dtype.h"
#include "graph/error.h"

namespace ember {

class Node;
class Tensor;
struct MaxResult;
struct SortResult;
enum class Reduction { None, Mean, Sum };

// A 64-byte aligned buffer shared by a tensor and all its views. Its version counts in-place
// writes through any of them (see Note [Version counter] in graph/autograd.h).
class Storage {
 public:
  explicit Storage(size_t nbytes);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return data_; }
  size_t nbytes() const { return nbytes_; }
  uint64_t version() const { return version_; }
  void bump_version() { ++version_; }

 private:
  void* data_;
  size_t nbytes_;
  uint64_t version_ = 0;
};

struct TensorImpl {
  TensorImpl(std::shared_ptr<Storage> storage, int64_t offset, Shape shape, Shape strides,
             DType dtype);
  ~TensorImpl();
  TensorImpl(const TensorImpl&) = delete;
  TensorImpl& operator=(const TensorImpl&) = delete;

  std::shared_ptr<Storage> storage;
  int64_t offset;  // in elements
  Shape shape;
  Shape strides;  // in elements
  int64_t numel;
  DType dtype;

  // autograd
  bool requires_grad = false;
  std::shared_ptr<Node> grad_fn;  // the Node that made this tensor; null for leaves
  uint32_t output_nr = 0;         // which output of grad_fn this is
  std::weak_ptr<Node> grad_accumulator;
  std::shared_ptr<TensorImpl> grad;
};

// Number of TensorImpls alive now (the leak tests count them).
int64_t live_tensor_impls();

class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

  // --- metadata
  bool defined() const { return impl_ != nullptr; }
  const Shape& shape() const { return impl_->shape; }
  const Shape& sizes() const { return impl_->shape; }
  const Shape& strides() const { return impl_->strides; }
  int64_t dim() const { return static_cast<int64_t>(impl_->shape.size()); }
  int64_t numel() const { return impl_->numel; }
  int64_t size(int64_t d) const;
  int64_t stride(int64_t d) const;
  int64_t storage_offset() const { return impl_->offset; }
  DType dtype() const { return impl_->dtype; }
  bool is_contiguous() const;
  TensorImpl* impl() const { return impl_.get(); }
  const std::shared_ptr<TensorImpl>& impl_ptr() const { return impl_; }
  bool same(const Tensor& other) const { return impl_ == other.impl_; }

  // Typed pointer to the first element (at the storage offset); T must match dtype().
  template <class T>
  T* data() const;

  // --- values
  template <class T>
  T item() const;
  template <class T>
  std::vector<T> to_vector() const;
  Tensor to(DType dtype) const;
  Tensor contiguous() const;
  Tensor clone() const;

  // --- autograd
  bool requires_grad() const { return impl_ && impl_->requires_grad; }
  Tensor& requires_grad_(bool on = true);
  Tensor grad() const;
  void set_grad(const Tensor& grad) const;
  const std::shared_ptr<Node>& grad_fn() const { return impl_->grad_fn; }
  bool is_leaf() const { return impl_->grad_fn == nullptr; }
  void backward(const Tensor& grad = {}, bool retain_graph = false) const;
  Tensor detach() const;

  // --- in place (return *this); see Note [Version counter] in graph/autograd.h
  Tensor& add_(const Tensor& other);
  Tensor& add_(double value);
  Tensor& mul_(const Tensor& other);
  Tensor& mul_(double value);
  Tensor& zero_();
  Tensor& fill_(double value);
  Tensor& masked_fill_(const Tensor& mask, double value);
  Tensor& copy_(const Tensor& src);

  // --- elementwise (ops/elementwise.cpp)
  Tensor add(const Tensor& other) const;
  Tensor sub(const Tensor& other) const;
  Tensor mul(const Tensor& other) const;
  Tensor div(const Tensor& other) const;
  Tensor neg() const;
  Tensor pow(double exponent) const;
  Tensor exp() const;
  Tensor log() const;
  Tensor sqrt() const;
  Tensor sin() const;
  Tensor cos() const;
  Tensor tanh() const;
  Tensor sigmoid() const;
  Tensor relu() const;
  Tensor abs() const;
  Tensor eq(const Tensor& other) const;
  Tensor ne(const Tensor& other) const;
  Tensor lt(const Tensor& other) const;
  Tensor le(const Tensor& other) const;
  Tensor gt(const Tensor& other) const;
  Tensor ge(const Tensor& other) const;
  Tensor eq(double other) const;
  Tensor ne(double other) const;
  Tensor lt(double other) const;
  Tensor le(double other) const;
  Tensor gt(double other) const;
  Tensor ge(double other) const;
  Tensor logical_not() const;
  Tensor logical_and(const Tensor& other) const;
  Tensor logical_or(const Tensor& other) const;
  Tensor masked_fill(const Tensor& mask, double value) const;

  // --- reductions (ops/reduce.cpp)
  Tensor sum() const;
  Tensor sum(std::vector<int64_t> dims, bool keepdim = false) const;
  Tensor mean() const;
  Tensor mean(std::vector<int64_t> dims, bool keepdim = false) const;
  Tensor var(std::vector<int64_t> dims, bool unbiased = true, bool keepdim = false) const;
  MaxResult max(int64_t dim, bool keepdim = false) const;
  Tensor max() const;
  Tensor argmax(int64_t dim, bool keepdim = false) const;

  // --- linear algebra (ops/linalg.cpp)
  Tensor matmul(const Tensor& other) const;
  Tensor bmm(const Tensor& other) const;

  // --- shape (ops/shape.cpp)
  Tensor reshape(Shape shape) const;
  Tensor view(Shape shape) const;
  Tensor flatten(int64_t start = 0, int64_t end = -1) const;
  Tensor transpose(int64_t d0, int64_t d1) const;
  Tensor permute(std::vector<int64_t> dims) const;
  Tensor unsqueeze(int64_t d) const;
  Tensor squeeze(int64_t d) const;
  Tensor expand(Shape shape) const;
  Tensor narrow(int64_t dim, int64_t start, int64_t length) const;
  Tensor repeat(std::vector<int64_t> repeats) const;
  Tensor repeat_interleave(int64_t repeats) const;
  Tensor repeat_interleave(int64_t repeats, int64_t dim) const;

  // --- indexing (ops/index.cpp)
  Tensor index_select(int64_t dim, const Tensor& index) const;
  Tensor masked_select(const Tensor& mask) const;
  Tensor triu(int64_t diagonal = 0) const;
  Tensor tril(int64_t diagonal = 0) const;
  SortResult sort(int64_t dim = -1, bool descending = false) const;

  // --- neural-network functions and losses (ops/nn_functional.cpp, ops/loss.cpp)
  Tensor softmax(int64_t dim) const;
  Tensor log_softmax(int64_t dim) const;
  Tensor layer_norm(Shape normalized_shape, const Tensor& weight = {}, const Tensor& bias = {},
                    double eps = 1e-5) const;
  Tensor dropout(double p, bool training) const;
  Tensor embedding(const Tensor& indices) const;
  Tensor mse_loss(const Tensor& target, Reduction reduction = Reduction::Mean) const;
  Tensor nll_loss(const Tensor& target, Reduction reduction = Reduction::Mean,
                  int64_t ignore_index = -100) const;
  Tensor cross_entropy(const Tensor& target, Reduction reduction = Reduction::Mean,
                       int64_t ignore_index = -100, double label_smoothing = 0.0) const;
  Tensor kl_div(const Tensor& target, Reduction reduction = Reduction::Mean) const;

 private:
  std::shared_ptr<TensorImpl> impl_;
};

// A new contiguous tensor of `shape` with uninitialised contents.
Tensor empty(const Shape& shape, DType dtype = kFloat32);
// A view of `base`'s storage with the given geometry (no autograd link).
Tensor make_view(const Tensor& base, Shape shape, Shape strides, int64_t offset);
// Row-major strides of a contiguous tensor of `shape`.
Shape contiguous_strides(const Shape& shape);
int64_t shape_numel(const Shape& shape);
// Wraps a possibly negative dim into [0, ndim); throws naming `op` when out of range.
int64_t wrap_dim(int64_t dim, int64_t ndim, std::string_view op);

std::ostream& operator<<(std::ostream& os, const Tensor& t);

}  // namespace ember

template <>
struct fmt::formatter<ember::Tensor> : fmt::ostream_formatter {};
