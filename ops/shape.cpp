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
  bool differentiable_backward() const override { return true; }
  // Forward: dY = reshape(dX, y.shape), a view of the tangent where its strides allow
  std::vector<Tensor> jvp(const std::vector<Tensor>&, const std::vector<Tensor>& t,
                          const std::vector<Tensor>& out) override {
    return {reshape(t[0], out[0].shape())};
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
  bool differentiable_backward() const override { return true; }
  // Forward: dY = permute(dX, dims), dims the inverse's inverse
  std::vector<Tensor> jvp(const std::vector<Tensor>&, const std::vector<Tensor>& t,
                          const std::vector<Tensor>&) override {
    std::vector<int64_t> dims(inverse_.size());
    for (size_t d = 0; d < dims.size(); ++d) dims[inverse_[d]] = static_cast<int64_t>(d);
    return {permute(t[0], dims)};
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
  bool differentiable_backward() const override { return true; }
  // Forward: dY = expand(dX)
  std::vector<Tensor> jvp(const std::vector<Tensor>&, const std::vector<Tensor>& t,
                          const std::vector<Tensor>& out) override {
    return {expand(t[0], out[0].shape())};
  }
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

// t[..., start : start + length * step : step, ...] along dim (no autograd; dim wrapped).
Tensor slice_view(const Tensor& t, int64_t dim, int64_t start, int64_t length, int64_t step) {
  Shape shape = t.shape(), strides = t.strides();
  shape[dim] = length;
  if (length > 1) strides[dim] *= step;  // a size-1 dim's stride is never read
  return make_view(t, shape, strides, t.storage_offset() + start * t.stride(dim));
}

// y = zeros of `shape` with x written into [..., start::step, ...] (op slice_backward, the
// backward of slice, narrow and select under create_graph):  dX = dY[..., start::step, ...]
struct SliceBackwardBackward final : Node {
  SliceBackwardBackward(int64_t dim, int64_t start, int64_t step)
      : dim_(dim), start_(start), step_(step) {}
  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    return {slice(grads[0], dim_, start_, start_ + input_shapes[0][dim_] * step_, step_)};
  }
  bool differentiable_backward() const override { return true; }
  // Forward: the op again on the tangent (it is linear)
  std::vector<Tensor> jvp(const std::vector<Tensor>&, const std::vector<Tensor>& t,
                          const std::vector<Tensor>& out) override;
  int64_t dim_, start_, step_;
};

// Zeros of `shape` with g written into [..., start::step, ...] along dim (g.size(dim) elements);
// under grad mode (create_graph) recorded as the op slice_backward of g, so that it
// differentiates again. The views' backwards are made of it and of views (split's of
// split_backward, below), never of ops/index.cpp's copies (cat), which are built on views: so
// this family sits below that one.
Tensor slice_backward(const Tensor& g, const Shape& shape, int64_t dim, int64_t start,
                      int64_t step) {
  Tensor grad_x = zeros(shape, g.dtype(), g.device());
  copy_into(slice_view(grad_x, dim, start, g.size(dim), step), g);
  if (!is_grad_enabled() && !detail::forward_wanted(&g, 1)) return grad_x;
  return record<SliceBackwardBackward>("slice_backward", grad_x, {g}, dim, start, step);
}

std::vector<Tensor> SliceBackwardBackward::jvp(const std::vector<Tensor>&,
                                               const std::vector<Tensor>& t,
                                               const std::vector<Tensor>& out) {
  return {slice_backward(t[0], out[0].shape(), dim_, start_, step_)};
}

// y = x[..., start:start+length, ...]:  dX = zeros with dY written into that slice
struct NarrowBackward final : Node {
  NarrowBackward(int64_t dim, int64_t start) : dim_(dim), start_(start) {}
  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    const Tensor& g = grads[0];
    if (is_grad_enabled())
      return {slice_backward(g, input_shapes[0], dim_, start_, 1)};  // create_graph
    Tensor grad_x = zeros(input_shapes[0], g.dtype(), g.device());
    copy_into(narrow(grad_x, dim_, start_, g.size(dim_)), g);
    return {grad_x};
  }
  bool differentiable_backward() const override { return true; }
  // Forward: dY = narrow(dX), a view of the tangent
  std::vector<Tensor> jvp(const std::vector<Tensor>&, const std::vector<Tensor>& t,
                          const std::vector<Tensor>& out) override {
    return {narrow(t[0], dim_, start_, out[0].size(dim_))};
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

// --- select, slice, split, chunk: views along one dim

namespace {

// y = x[..., index, ...] (that dim removed):  dX = zeros with dY written into that slice
struct SelectBackward final : Node {
  SelectBackward(int64_t dim, int64_t index) : dim_(dim), index_(index) {}
  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    if (is_grad_enabled())  // create_graph
      return {slice_backward(unsqueeze(grads[0], dim_), input_shapes[0], dim_, index_, 1)};
    Tensor grad_x = zeros(input_shapes[0], grads[0].dtype(), grads[0].device());
    copy_into(select_view(grad_x, dim_, index_), grads[0]);
    return {grad_x};
  }
  bool differentiable_backward() const override { return true; }
  // Forward: dY = select(dX), a view of the tangent
  std::vector<Tensor> jvp(const std::vector<Tensor>&, const std::vector<Tensor>& t,
                          const std::vector<Tensor>&) override {
    return {select(t[0], dim_, index_)};
  }
  int64_t dim_, index_;
};

// y = x[..., start::step, ...] (length elements):  dX = zeros with dY written into that slice
// (under create_graph recorded as op slice_backward)
struct SliceBackward final : Node {
  SliceBackward(int64_t dim, int64_t start, int64_t step) : dim_(dim), start_(start), step_(step) {}
  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    return {slice_backward(grads[0], input_shapes[0], dim_, start_, step_)};
  }
  bool differentiable_backward() const override { return true; }
  // Forward: dY = slice(dX), a view of the tangent
  std::vector<Tensor> jvp(const std::vector<Tensor>&, const std::vector<Tensor>& t,
                          const std::vector<Tensor>& out) override {
    return {slice(t[0], dim_, start_, start_ + out[0].size(dim_) * step_, step_)};
  }
  int64_t dim_, start_, step_;
};

// y = the gradients of some pieces of a split written side by side along dim, zeros where the
// others lie (op split_backward, split's and chunk's backward under create_graph):
//   dG_i = dY[..., start_i : start_i + size_i, ...]
struct SplitBackwardBackward final : Node {
  SplitBackwardBackward(int64_t dim, std::vector<int64_t> starts, std::vector<int64_t> sizes)
      : dim_(dim), starts_(std::move(starts)), sizes_(std::move(sizes)) {}
  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    const Tensor& g = grads[0];
    std::vector<Tensor> grad_pieces(next_edges.size());
    for (size_t i = 0; i < grad_pieces.size(); ++i)
      if (needs_grad(i))
        grad_pieces[i] = is_grad_enabled() ? narrow(g, dim_, starts_[i], sizes_[i])  // as an op
                                           : narrow_view(g, dim_, starts_[i], sizes_[i]);
    return grad_pieces;
  }
  bool differentiable_backward() const override { return true; }
  // Forward: the op again on the tangents that came (it is linear in each piece)
  std::vector<Tensor> jvp(const std::vector<Tensor>&, const std::vector<Tensor>& t,
                          const std::vector<Tensor>& out) override {
    Tensor y = zeros(out[0].shape(), out[0].dtype(), out[0].device());
    std::vector<Tensor> given;
    std::vector<int64_t> starts, sizes;
    for (size_t i = 0; i < t.size(); ++i) {
      if (!t[i].defined()) continue;
      copy_into(narrow_view(y, dim_, starts_[i], sizes_[i]), t[i]);
      given.push_back(t[i]), starts.push_back(starts_[i]), sizes.push_back(sizes_[i]);
    }
    return {record<SplitBackwardBackward>("split_backward", y, given, dim_, std::move(starts),
                                          std::move(sizes))};
  }
  int64_t dim_;
  std::vector<int64_t> starts_, sizes_;
};

// The pieces of split and chunk, one Node for all (so backward writes their gradients side by
// side into one tensor): dX = [dY_0, dY_1, ...] along dim, zeros for a piece that got none.
// Under create_graph recorded as op split_backward of the gradients that came.
struct SplitBackward final : Node {
  SplitBackward(int64_t dim, std::vector<int64_t> sizes) : dim_(dim), sizes_(std::move(sizes)) {}
  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    const Device device = std::find_if(grads.begin(), grads.end(), [](const Tensor& g) {
                            return g.defined();
                          })->device();  // the engine calls a Node with at least one gradient
    const bool all =
        std::all_of(grads.begin(), grads.end(), [](const Tensor& g) { return g.defined(); });
    Tensor grad_x = all ? empty(input_shapes[0], input_dtypes[0], device)
                        : zeros(input_shapes[0], input_dtypes[0], device);
    const bool create_graph = is_grad_enabled();
    std::vector<Tensor> given;  // create_graph: the gradients that came, and where they lie
    std::vector<int64_t> starts, sizes;
    int64_t start = 0;
    for (size_t i = 0; i < sizes_.size(); ++i) {
      if (grads[i].defined()) {
        copy_into(narrow_view(grad_x, dim_, start, sizes_[i]), grads[i]);
        if (create_graph)
          given.push_back(grads[i]), starts.push_back(start), sizes.push_back(sizes_[i]);
      }
      start += sizes_[i];
    }
    if (!create_graph) return {grad_x};
    return {record<SplitBackwardBackward>("split_backward", grad_x, given, dim_, std::move(starts),
                                          std::move(sizes))};
  }
  bool differentiable_backward() const override { return true; }
  // Forward: each piece's tangent is that piece of the tangent (a view of it)
  std::vector<Tensor> jvp(const std::vector<Tensor>&, const std::vector<Tensor>& t,
                          const std::vector<Tensor>&) override {
    std::vector<Tensor> pieces;
    int64_t start = 0;
    for (int64_t length : sizes_) {
      pieces.push_back(narrow(t[0], dim_, start, length));
      start += length;
    }
    return pieces;
  }
  int64_t dim_;
  std::vector<int64_t> sizes_;
};

// The views of split and chunk: pieces of `sizes` along dim d, recorded as op `op`.
std::vector<Tensor> split_views(const Tensor& x, int64_t d, const std::vector<int64_t>& sizes,
                                std::string_view op) {
  std::vector<Tensor> pieces;
  pieces.reserve(sizes.size());
  int64_t start = 0;
  for (int64_t length : sizes) {
    pieces.push_back(narrow_view(x, d, start, length));
    start += length;
  }
  record<SplitBackward>(op, pieces, {x}, d, sizes);
  return pieces;
}

// torch.split's sizes: pieces of split_size, the last one smaller; one piece at least.
std::vector<int64_t> split_sizes(int64_t dim_size, int64_t split_size) {
  const int64_t count = split_size == 0 ? 1 : std::max<int64_t>((dim_size - 1) / split_size + 1, 1);
  std::vector<int64_t> sizes(count, split_size);
  sizes.back() = dim_size - split_size * (count - 1);
  return sizes;
}

}  // namespace

Tensor select(const Tensor& x, int64_t dim, int64_t index) {
  constexpr std::string_view op = "select";
  profile::Scope scope(op);
  check_defined(x, op);
  EMBER_CHECK(x.dim() > 0, "{}: cannot select from a 0-d tensor", op);
  const int64_t d = wrap_dim(dim, x.dim(), op), size = x.size(d);
  EMBER_CHECK(index >= -size && index < size,
              "{}: index {} out of range for dim {} of size {} (shape {})", op, index, d, size,
              x.shape());
  if (index < 0) index += size;
  return record<SelectBackward>(op, select_view(x, d, index), {x}, d, index);
}

Tensor slice(const Tensor& x, int64_t dim, std::optional<int64_t> start, std::optional<int64_t> end,
             int64_t step) {
  constexpr std::string_view op = "slice";
  profile::Scope scope(op);
  check_defined(x, op);
  EMBER_CHECK(x.dim() > 0, "{}: cannot slice a 0-d tensor", op);
  EMBER_CHECK(step >= 1, "{}: step must be positive, got {}", op, step);
  const int64_t d = wrap_dim(dim, x.dim(), op), size = x.size(d);
  // Python's rules: a negative bound counts from the end, then both are clamped to [0, size].
  const auto bound = [size](std::optional<int64_t> b, int64_t absent) {
    if (!b) return absent;
    const int64_t v = *b < 0 ? *b + size : *b;
    return std::clamp<int64_t>(v, 0, size);
  };
  const int64_t s = bound(start, 0), e = bound(end, size);
  const int64_t length = e > s ? (e - s - 1) / step + 1 : 0;
  return record<SliceBackward>(op, slice_view(x, d, s, length, step), {x}, d, s, step);
}

std::vector<Tensor> split(const Tensor& x, int64_t split_size, int64_t dim) {
  constexpr std::string_view op = "split";
  profile::Scope scope(op);
  check_defined(x, op);
  EMBER_CHECK(x.dim() > 0, "{}: expected a tensor of at least 1 dim, got a 0-d tensor", op);
  const int64_t d = wrap_dim(dim, x.dim(), op), size = x.size(d);
  EMBER_CHECK(split_size >= 0, "{}: split_size must be non-negative, got {}", op, split_size);
  EMBER_CHECK(split_size > 0 || size == 0,
              "{}: split_size can be 0 only when dim {} has size 0, not size {} (shape {})", op, d,
              size, x.shape());
  return split_views(x, d, split_sizes(size, split_size), op);
}

std::vector<Tensor> chunk(const Tensor& x, int64_t chunks, int64_t dim) {
  constexpr std::string_view op = "chunk";
  profile::Scope scope(op);
  check_defined(x, op);
  EMBER_CHECK(x.dim() > 0, "{}: expected a tensor of at least 1 dim, got a 0-d tensor", op);
  EMBER_CHECK(chunks > 0, "{}: chunks must be positive, got {}", op, chunks);
  const int64_t d = wrap_dim(dim, x.dim(), op), size = x.size(d);
  // torch.chunk: pieces of ceil(size / chunks), so fewer than `chunks` pieces may come back
  // (6 in 4 chunks is 2 + 2 + 2); an empty dim gives `chunks` empty pieces.
  if (size == 0) return split_views(x, d, std::vector<int64_t>(chunks, 0), op);
  return split_views(x, d, split_sizes(size, (size - 1) / chunks + 1), op);
}

}  // namespace ember
