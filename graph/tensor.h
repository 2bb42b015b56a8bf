// Tensor: a cheap handle (shared_ptr<TensorImpl>) over a strided view of a shared Storage.
// Copies of a Tensor alias the same data; views share storage and change only shape/strides.
// The ops that are also methods (x.exp()) come from one list, graph/tensor_ops.def, which
// declares both the free function and the method; ops/tensor_methods.cpp defines the methods.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include <fmt/ostream.h>

#include "graph/device.h"
#include "graph/dtype.h"
#include "graph/error.h"

namespace ember {

class Node;
class Tensor;
struct TensorImpl;
struct MaxResult;
struct SortResult;
struct TopkResult;
enum class Reduction { None, Mean, Sum };

// A 64-byte aligned buffer shared by a tensor and all its views, on one device. Its version counts
// in-place writes through any of them (see Note [Version counter] in graph/autograd.h).
class Storage {
 public:
  // nbytes on `device`: only the CPU holds storage in this build (check_device says why not).
  explicit Storage(size_t nbytes, Device device = kCPU);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return data_; }
  size_t nbytes() const { return nbytes_; }
  const Device& device() const { return device_; }
  uint64_t version() const { return version_; }
  void bump_version() { ++version_; }

 private:
  void* data_;
  size_t nbytes_;
  Device device_;
  uint64_t version_ = 0;
};

// One tangent of a dual tensor (Note [Forward grads] in graph/forward_ad.h): the dual level it
// belongs to (a process-unique id), that level's depth in its thread's stack of open levels, and
// the tangent, of the tensor's shape and dtype.
struct ForwardGrad {
  uint64_t level;
  uint32_t depth;
  std::shared_ptr<TensorImpl> tangent;
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
  // Run by backward once it has accumulated this leaf's gradient into `grad`
  // (set_post_accumulate_grad_hook in graph/autograd.h); empty for almost every tensor.
  std::function<void(const Tensor&)> post_accumulate_grad_hook;
  // forward-mode autograd: one tangent per dual level, outermost first; empty unless dual
  std::vector<ForwardGrad> forward_grads;
};

// Number of TensorImpls alive now (the leak tests count them).
int64_t live_tensor_impls();

class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

  // --- metadata
  // Every accessor below throws ember::Error on an undefined tensor (Tensor()).
  bool defined() const { return impl_ != nullptr; }
  const Shape& shape() const { return checked("shape").shape; }
  const Shape& sizes() const { return checked("sizes").shape; }
  const Shape& strides() const { return checked("strides").strides; }
  int64_t dim() const { return static_cast<int64_t>(checked("dim").shape.size()); }
  int64_t numel() const { return checked("numel").numel; }
  int64_t size(int64_t d) const;
  int64_t stride(int64_t d) const;
  int64_t storage_offset() const { return checked("storage_offset").offset; }
  DType dtype() const { return checked("dtype").dtype; }
  const Device& device() const { return checked("device").storage->device(); }
  bool is_cuda() const { return device().is_cuda(); }
  bool is_contiguous() const;
  TensorImpl* impl() const { return impl_.get(); }
  const std::shared_ptr<TensorImpl>& impl_ptr() const { return impl_; }
  bool same(const Tensor& other) const { return impl_ == other.impl_; }

  // Typed pointer to the first element (at the storage offset); T must match dtype(), and the
  // tensor must be on the CPU (Note [CPU kernels and devices] in graph/tensor.cpp).
  template <class T>
  T* data() const;
  // The address of the first element on whatever device holds it, untyped: for copies between
  // devices (a device address is no host pointer).
  void* data_bytes() const;

  // --- values
  template <class T>
  T item() const;
  template <class T>
  std::vector<T> to_vector() const;
  Tensor to(DType dtype) const;
  // On `device`: this tensor itself when already there, else a copy (differentiable, as torch's).
  Tensor to(const Device& device) const;
  Tensor to(const Device& device, DType dtype) const;
  Tensor cpu() const { return to(kCPU); }
  Tensor cuda(int index = 0) const { return to(Device(DeviceType::CUDA, index)); }
  Tensor contiguous() const;
  Tensor clone() const;

  // --- autograd
  bool requires_grad() const { return impl_ && impl_->requires_grad; }
  Tensor& requires_grad_(bool on = true);
  Tensor grad() const;
  void set_grad(const Tensor& grad) const;
  const std::shared_ptr<Node>& grad_fn() const { return checked("grad_fn").grad_fn; }
  bool is_leaf() const { return checked("is_leaf").grad_fn == nullptr; }
  // Gradients of this tensor into every leaf that requires grad (autograd/engine.cpp).
  // create_graph=true records the backward pass, so the gradients put into .grad can be
  // differentiated again; it retains the graph too (torch's retain_graph default).
  void backward(const Tensor& grad = {}, bool retain_graph = false,
                bool create_graph = false) const;
  Tensor detach() const;

  // --- in place (return *this); see Note [Version counter] in graph/autograd.h
  Tensor& add_(const Tensor& other);
  Tensor& add_(double value);
  Tensor& add_(const Tensor& other, double alpha);  // self += alpha · other (torch's alpha=)
  Tensor& mul_(const Tensor& other);
  Tensor& mul_(double value);
  Tensor& zero_();
  Tensor& fill_(double value);
  Tensor& masked_fill_(const Tensor& mask, double value);
  Tensor& copy_(const Tensor& src);

  // --- the ops that are also methods: x.exp(), x.sum({0}, true), … (graph/tensor_ops.def)
#define EMBER_DEFAULT(...) = __VA_ARGS__
#define EMBER_OP(R, name, args, ...) R name(__VA_ARGS__) const;
#include "graph/tensor_ops.def"
#undef EMBER_OP

 private:
  const TensorImpl& checked(std::string_view op) const {
    if (impl_ == nullptr) [[unlikely]]
      throw_undefined(op);
    return *impl_;
  }
  [[noreturn]] static void throw_undefined(std::string_view op);

  std::shared_ptr<TensorImpl> impl_;
};

// The free functions of the rows of graph/tensor_ops.def: ember::exp(x), ember::sum(x, {0}).
#define EMBER_OP(R, name, args, ...) R name(const Tensor& self __VA_OPT__(, ) __VA_ARGS__);
#include "graph/tensor_ops.def"
#undef EMBER_OP
#undef EMBER_DEFAULT

// The most dims a tensor may have (TensorImpl refuses more; readers of files check first).
inline constexpr size_t kMaxDims = 16;
// A new contiguous tensor of `shape` with uninitialised contents.
Tensor empty(const Shape& shape, DType dtype = kFloat32, const Device& device = kCPU);
// A view of `base`'s storage with the given geometry (no autograd link).
Tensor make_view(const Tensor& base, Shape shape, Shape strides, int64_t offset);
// Row-major strides of a contiguous tensor of `shape`.
Shape contiguous_strides(const Shape& shape);
int64_t shape_numel(const Shape& shape);
// Note [In-place overlap]
// An in-place write is refused where its result would depend on the order elements are written,
// as torch refuses it: the written tensor has internal overlap (an expanded view: several
// elements are one memory location), or an operand partially overlaps it (shares some memory
// locations but is not the very same view, e.g. a.add_(a.t())). The same view (a.add_(a)) is
// fine: each element reads itself before it is written.
//
// True when some memory location backs several elements of t (a stride 0 over a size > 1, or
// strides that interleave); checked conservatively.
bool has_internal_overlap(const Tensor& t);
// True when a and b share memory locations without being the same view of the same storage.
bool partially_overlaps(const Tensor& a, const Tensor& b);

// Wraps a possibly negative dim into [0, ndim); throws naming `op` when out of range.
int64_t wrap_dim(int64_t dim, int64_t ndim, std::string_view op);

std::ostream& operator<<(std::ostream& os, const Tensor& t);

}  // namespace ember

template <>
struct fmt::formatter<ember::Tensor> : fmt::ostream_formatter {};
