// View ops. Each makes a new TensorImpl over the same Storage; their backwards map the
// gradient back through the inverse view (or sum_to, for expand, in the engine).
#include "ops/shape.h"

#include <algorithm>
#include <numeric>
#include <optional>

#include "graph/autograd.h"
#include "graph/copy.h"
#include "graph/creation.h"
#include "graph/profile.h"
#include "ops/common.h"

namespace ember {

namespace {

// Resolves one -1 in `shape` against numel.
Shape infer_shape(Shape shape, int64_t numel, std::string_view op) {
  int64_t known = 1, infer = -1;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == -1) {
      EMBER_CHECK(infer < 0, "{}: only one dim can be -1, got {}", op, shape);
      infer = static_cast<int64_t>(d);
    } else {
      EMBER_CHECK(shape[d] >= 0, "{}: invalid size {} in shape {}", op, shape[d], shape);
      EMBER_CHECK(!__builtin_mul_overflow(known, shape[d], &known),
                  "{}: shape {} is invalid for input of size {}", op, shape, numel);
    }
  }
  if (infer >= 0) {
    EMBER_CHECK(known != 0 && numel % known == 0, "{}: shape {} is invalid for input of size {}",
                op, shape, numel);
    shape[infer] = numel / known;
  }
  EMBER_CHECK(shape_numel(shape) == numel, "{}: shape {} is invalid for input of size {}", op,
              shape, numel);
  return shape;
}

// Strides that let `x` be viewed as `shape` without copying, if any (torch's rule: each run of
// old dims that are contiguous with each other maps onto a run of new dims).
std::optional<Shape> view_strides(const Tensor& x, const Shape& shape) {
  if (x.is_contiguous()) return contiguous_strides(shape);
  const Shape& old_shape = x.shape();
  const Shape& old_strides = x.strides();
  Shape strides(shape.size());
  int64_t view_d = static_cast<int64_t>(shape.size()) - 1;
  int64_t chunk_base_stride = old_strides.empty() ? 1 : old_strides.back();
  int64_t tensor_numel = 1, view_numel = 1;
  for (int64_t d = static_cast<int64_t>(old_shape.size()) - 1; d >= 0; --d) {
    tensor_numel *= old_shape[d];
    if (d == 0 ||
        (old_shape[d - 1] != 1 && old_strides[d - 1] != tensor_numel * chunk_base_stride)) {
      while (view_d >= 0 && (view_numel < tensor_numel || shape[view_d] == 1)) {
        strides[view_d] = view_numel * chunk_base_stride;
        view_numel *= shape[view_d];
        --view_d;
      }
      if (view_numel != tensor_numel) return std::nullopt;
      if (d > 0) {
        chunk_base_stride = old_strides[d - 1];
        tensor_numel = 1;
        view_numel = 1;
      }
    }
  }
  if (view_d != -1) return std::nullopt;
  return strides;
}

// Any view whose inverse is a reshape back to the input's shape (view, reshape, unsqueeze,
// squeeze):  dX = reshape(dY, x.shape)
struct ReshapeBackward final : Node {
  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    return {reshape(grads[0], input_shapes[0])};
  }
};

}  // namespace

Tensor view(const Tensor& x, Shape shape) {
  constexpr std::string_view op = "view";
  profile::Scope scope(op);
  check_defined(x, op);
  shape = infer_shape(std::move(shape), x.numel(), op);
  std::optional<Shape> strides = view_strides(x, shape);
  EMBER_CHECK(strides.has_value(),
              "{}: a tensor of shape {} and strides {} cannot be viewed as {}; use reshape", op,
              x.shape(), x.strides(), shape);
  return record<ReshapeBackward>(op, make_view(x, shape, *strides, x.storage_offset()), {x});
}

Tensor reshape(const Tensor& x, Shape shape) {
  constexpr std::string_view op = "reshape";
  profile::Scope scope(op);
  check_defined(x, op);
  shape = infer_shape(std::move(shape), x.numel(), op);
  if (std::optional<Shape> strides = view_strides(x, shape))
    return record<ReshapeBackward>(op, make_view(x, shape, *strides, x.storage_offset()), {x});
  return view(x.clone(), shape);
}

Tensor flatten(const Tensor& x, int64_t start, int64_t end) {
  constexpr std::string_view op = "flatten";
  profile::Scope scope(op);
  check_defined(x, op);
  if (x.dim() == 0) return reshape(x, {1});
  const int64_t s = wrap_dim(start, x.dim(), op), e = wrap_dim(end, x.dim(), op);
  EMBER_CHECK(s <= e, "{}: start dim {} must not come after end dim {}", op, start, end);
  Shape shape(x.shape().begin(), x.shape().begin() + s);
  int64_t n = 1;
  for (int64_t d = s; d <= e; ++d) n *= x.size(d);
  shape.push_back(n);
  shape.insert(shape.end(), x.shape().begin() + e + 1, x.shape().end());
  return reshape(x, shape);
}

Tensor unsqueeze(const Tensor& x, int64_t d) {
  constexpr std::string_view op = "unsqueeze";
  profile::Scope scope(op);
  check_defined(x, op);
  return record<ReshapeBackward>(op, unsqueeze_view(x, wrap_dim(d, x.dim() + 1, op)), {x});
}

Tensor squeeze(const Tensor& x, int64_t d) {
  constexpr std::string_view op = "squeeze";
  profile::Scope scope(op);
  check_defined(x, op);
  if (x.dim() == 0) return x;
  const int64_t w = wrap_dim(d, x.dim(), op);
  if (x.size(w) != 1) return x;
  return record<ReshapeBackward>(op, select_view(x, w, 0), {x});
}

namespace {

// y = permute(x, dims):  dX = permute(dY, inverse(dims))  (transpose is its own inverse)
struct PermuteBackward final : Node {
  explicit PermuteBackward(std::vector<int64_t> inverse) : inverse_(std::move(inverse)) {}
  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    return {permute(grads[0], inverse_)};
  }
  std::vector<int64_t> inverse_;
};

}  // namespace

Tensor permute(const Tensor& x, std::vector<int64_t> dims) {
  constexpr std::string_view op = "permute";
  profile::Scope scope(op);
  check_defined(x, op);
  EMBER_CHECK(static_cast<int64_t>(dims.size()) == x.dim(),
              "{}: {} dims given for a tensor of {} dims (shape {})", op, dims.size(), x.dim(),
              x.shape());
  std::vector<int64_t> inverse(dims.size(), -1);
  Shape shape(dims.size()), strides(dims.size());
  for (size_t i = 0; i < dims.size(); ++i) {
    const int64_t d = wrap_dim(dims[i], x.dim(), op);
    EMBER_CHECK(inverse[d] < 0, "{}: dim {} repeats in {}", op, d, dims);
    inverse[d] = static_cast<int64_t>(i);
    shape[i] = x.size(d);
    strides[i] = x.stride(d);
  }
  return record<PermuteBackward>(op, make_view(x, shape, strides, x.storage_offset()), {x},
                                 std::move(inverse));
}

Tensor transpose(const Tensor& x, int64_t d0, int64_t d1) {
  constexpr std::string_view op = "transpose";
  profile::Scope scope(op);
  check_defined(x, op);
  if (x.dim() == 0) return x;
  std::vector<int64_t> dims(x.dim());
  std::iota(dims.begin(), dims.end(), 0);
  std::swap(dims[wrap_dim(d0, x.dim(), op)], dims[wrap_dim(d1, x.dim(), op)]);
  return permute(x, dims);
}

namespace {

// y = expand(x):  dX = dY, reduced to x's shape by the engine's sum_to
struct ExpandBackward final : Node {
  std::vector<Tensor> apply(std::vector<Tensor>& grads) override { return {grads[0]}; }
};

}  // namespace

Tensor expand(const Tensor& x, Shape shape) {
  constexpr std::string_view op = "expand";
  profile::Scope scope(op);
  check_defined(x, op);
  EMBER_CHECK(shape.size() >= static_cast<size_t>(x.dim()),
              "{}: cannot expand shape {} to fewer dims {}", op, x.shape(), shape);
  const size_t lead = shape.size() - x.dim();
  Shape strides(shape.size(), 0);
  for (size_t d = 0; d < shape.size(); ++d) {
    if (d < lead) {
      EMBER_CHECK(shape[d] >= 0, "{}: size -1 not allowed in a new leading dim ({})", op, shape);
      continue;
    }
    const int64_t have = x.size(d - lead);
    if (shape[d] == -1) shape[d] = have;
    EMBER_CHECK(have == shape[d] || have == 1,
                "{}: shape {} cannot be expanded to {} (dim {}: {} vs {})", op, x.shape(), shape, d,
                have, shape[d]);
    strides[d] = have == shape[d] ? x.stride(d - lead) : 0;
  }
  return record<ExpandBackward>(op, make_view(x, shape, strides, x.storage_offset()), {x});
}

namespace {

// y = x[..., start:start+length, ...]:  dX = zeros with dY written into that slice
struct NarrowBackward final : Node {
  NarrowBackward(int64_t dim, int64_t start) : dim_(dim), start_(start) {}
  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    const Tensor& g = grads[0];
    Tensor grad_x = zeros(input_shapes[0], g.dtype());
    copy_into(narrow(grad_x, dim_, start_, g.size(dim_)), g);
    return {grad_x};
  }
  int64_t dim_, start_;
};

}  // namespace

Tensor narrow(const Tensor& x, int64_t dim, int64_t start, int64_t length) {
  constexpr std::string_view op = "narrow";
  profile::Scope scope(op);
  check_defined(x, op);
  EMBER_CHECK(x.dim() > 0, "{}: cannot narrow a 0-d tensor", op);
  const int64_t d = wrap_dim(dim, x.dim(), op);
  if (start < 0) start += x.size(d);
  EMBER_CHECK(start >= 0 && length >= 0 && start <= x.size(d) && length <= x.size(d) - start,
              "{}: start {} and length {} out of range for dim {} of size {}", op, start, length, d,
              x.size(d));
  return record<NarrowBackward>(op, narrow_view(x, d, start, length), {x}, d, start);
}

}  // namespace ember
