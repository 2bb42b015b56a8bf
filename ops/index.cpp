// Ops that gather, scatter or copy data into a new layout: repeat, repeat_interleave, cat, stack,
// index_select, gather, scatter_add, masked_select, triu/tril, sort and topk. Tiling ops are one
// strided copy between two views (no per-tile loops); their backwards view the gradient the same
// way and sum.
#include "ops/index.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "graph/autograd.h"
#include "graph/copy.h"
#include "graph/creation.h"
#include "graph/device_backend.h"
#include "graph/profile.h"
#include "graph/random.h"
#include "graph/strided.h"
#include "ops/common.h"
#include "ops/elementwise.h"
#include "ops/reduce.h"
#include "ops/shape.h"

namespace ember {

namespace {

// Calls line(offsets) once for every line of `shape` along `dim`, with each operand's element
// offset of that line's first element. The operands may differ in size along `dim` only. Lines
// are independent: they run in parallel when there are many.
template <size_t N, class F>
void for_each_line(Shape shape, int64_t dim, const std::array<Shape, N>& strides, F line) {
  shape[dim] = 1;
  StridedLoop<N> loop(shape, strides);
  loop.run([&](const auto& off, int64_t len, const auto& st) {
    auto o = off;
    for (int64_t i = 0; i < len; ++i) {
      line(o);
      for (size_t k = 0; k < N; ++k) o[k] += st[k];
    }
  });
}

}  // namespace

// --- repeat

namespace {

// y = x tiled, viewed as (r0, s0, r1, s1, ...) with y[a, i, b, j, ...] = x[i, j, ...]:
// dX = dY viewed the same way, summed over r0, r1, ...
struct RepeatBackward final : Node {
  explicit RepeatBackward(Shape tiled) : tiled_(std::move(tiled)) {}
  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    std::vector<int64_t> tile_dims;
    for (size_t d = 0; d < tiled_.size(); d += 2) tile_dims.push_back(static_cast<int64_t>(d));
    const Tensor summed = sum(reshape(grads[0], tiled_), tile_dims);
    return {reshape(summed, input_shapes[0])};
  }
  bool differentiable_backward() const override { return true; }  // reshape and sum are ops
  // Forward: dY = repeat(dX) (the op is linear), the repeats at the tiled shape's even dims
  std::vector<Tensor> jvp(const std::vector<Tensor>&, const std::vector<Tensor>& t,
                          const std::vector<Tensor>&) override {
    std::vector<int64_t> repeats;
    for (size_t d = 0; d < tiled_.size(); d += 2) repeats.push_back(tiled_[d]);
    return {repeat(t[0], repeats)};
  }
  Shape tiled_;
};

}  // namespace

Tensor repeat(const Tensor& x, std::vector<int64_t> repeats) {
  constexpr std::string_view op = "repeat";
  profile::Scope scope(op);
  check_defined(x, op);
  const int64_t nd = static_cast<int64_t>(repeats.size());
  EMBER_CHECK(nd >= x.dim(),
              "{}: number of repeats ({}) can not be smaller than number of dims ({})", op, nd,
              x.dim());
  for (int64_t r : repeats)
    EMBER_CHECK(r >= 0, "{}: repeats must be non-negative, got {} for shape {}", op, repeats,
                x.shape());
  // out (r0*s0, r1*s1, ...) is written as (r0, s0, r1, s1, ...) from x viewed as
  // (1, s0, 1, s1, ...) with stride 0 along the r-dims; x's missing leading dims have s = 1.
  const int64_t lead = nd - x.dim();
  Shape out_shape(nd), tiled(2 * nd), src_shape(2 * nd, 1), src_strides(2 * nd, 0);
  for (int64_t d = 0; d < nd; ++d) {
    const int64_t s = d < lead ? 1 : x.size(d - lead);
    out_shape[d] = size_product(repeats[d], s, op);
    tiled[2 * d] = repeats[d];
    tiled[2 * d + 1] = src_shape[2 * d + 1] = s;
    src_strides[2 * d + 1] = d < lead ? 0 : x.stride(d - lead);
  }
  Tensor out = empty(out_shape, x.dtype(), x.device());
  if (out.numel() > 0)
    copy_into(make_view(out, tiled, contiguous_strides(tiled), 0),
              make_view(x, src_shape, src_strides, x.storage_offset()));
  return record<RepeatBackward>(op, out, {x}, std::move(tiled));
}

// --- repeat_interleave

namespace {

// y = x with each slice along dim repeated r times, viewed as (..., n, r, ...):
// dX = dY viewed so, summed over the r-dim
struct RepeatInterleaveBackward final : Node {
  RepeatInterleaveBackward(Shape split, int64_t dim) : split_(std::move(split)), dim_(dim) {}
  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    return {sum(reshape(grads[0], split_), {dim_ + 1})};
  }
  bool differentiable_backward() const override { return true; }  // reshape and sum are ops
  // Forward: dY = repeat_interleave(dX, r, dim) (the op is linear), r the split shape's dim + 1
  std::vector<Tensor> jvp(const std::vector<Tensor>&, const std::vector<Tensor>& t,
                          const std::vector<Tensor>&) override {
    return {repeat_interleave(t[0], split_[dim_ + 1], dim_)};
  }
  Shape split_;
  int64_t dim_;
};

// Fast path for a small contiguous x (pre, n, post): each of the pre*n blocks of `post`
// elements is written `repeats` times in a row.
void repeat_blocks(const Tensor& x, int64_t dim, int64_t repeats, const Tensor& out) {
  int64_t post = 1;
  for (int64_t d = dim + 1; d < x.dim(); ++d) post *= x.size(d);
  const int64_t blocks = post == 0 ? 0 : x.numel() / post;
  dispatch_all(x.dtype(), [&]<class T>() {
    const T* src = x.data<T>();
    T* dst = out.data<T>();
    for (int64_t b = 0; b < blocks; ++b, src += post) {
      if (post == 1) {
        dst = std::fill_n(dst, repeats, *src);
      } else {
        for (int64_t k = 0; k < repeats; ++k) dst = std::copy_n(src, post, dst);
      }
    }
  });
}

}  // namespace

Tensor repeat_interleave(const Tensor& x, int64_t repeats, int64_t dim) {
  constexpr std::string_view op = "repeat_interleave";
  profile::Scope scope(op);
  check_defined(x, op);
  EMBER_CHECK(repeats >= 0, "{}: repeats must be non-negative, got {}", op, repeats);
  EMBER_CHECK(x.dim() > 0,
              "{}: dim {} given for a 0-d tensor (use repeat_interleave(x, repeats) to repeat its "
              "one element)",
              op, dim);
  const int64_t d = wrap_dim(dim, x.dim(), op);
  // out (..., n*r, ...) is written as (..., n, r, ...) from x viewed as (..., n, 1, ...).
  Shape out_shape = x.shape(), split = x.shape(), src_shape = x.shape(), src_strides = x.strides();
  out_shape[d] = size_product(out_shape[d], repeats, op);
  split.insert(split.begin() + d + 1, repeats);
  src_shape.insert(src_shape.begin() + d + 1, 1);
  src_strides.insert(src_strides.begin() + d + 1, 0);
  Tensor out = empty(out_shape, x.dtype(), x.device());
  if (x.device().is_cpu() && x.is_contiguous() && out.numel() < parallel_grain()) {
    repeat_blocks(x, d, repeats, out);
  } else if (out.numel() > 0) {
    copy_into(make_view(out, split, contiguous_strides(split), 0),
              make_view(x, src_shape, src_strides, x.storage_offset()));
  }
  return record<RepeatInterleaveBackward>(op, out, {x}, std::move(split), d);
}

Tensor repeat_interleave(const Tensor& x, int64_t repeats) {
  constexpr std::string_view op = "repeat_interleave";
  profile::Scope scope(op);
  check_defined(x, op);
  return repeat_interleave(flatten(x), repeats, 0);
}

// --- cat and stack

namespace {

// y = cat(x_0, x_1, ...) along dim:  dX_i = dY[..., offset_i : offset_i + size_i, ...], a view;
// stack gives no sizes (each x_i is one index along dim):  dX_i = dY[..., i, ...].
struct CatBackward final : Node {
  CatBackward(int64_t dim, std::vector<int64_t> sizes) : dim_(dim), sizes_(std::move(sizes)) {}
  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    const Tensor& g = grads[0];
    const bool stacked = sizes_.empty();
    std::vector<Tensor> grad_inputs(next_edges.size());
    int64_t offset = 0;
    for (size_t i = 0; i < grad_inputs.size(); ++i) {
      if (needs_grad(i))
        grad_inputs[i] =
            !is_grad_enabled()
                ? (stacked ? select_view(g, dim_, offset) : narrow_view(g, dim_, offset, sizes_[i]))
                : (stacked ? select(g, dim_, offset)  // create_graph: as ops
                           : narrow(g, dim_, offset, sizes_[i]));
      offset += stacked ? 1 : sizes_[i];
    }
    return grad_inputs;
  }
  bool differentiable_backward() const override { return true; }
  // Forward: dY = cat (or stack) of the inputs' tangents, zeros for those without one
  std::vector<Tensor> jvp(const std::vector<Tensor>& in, const std::vector<Tensor>& t,
                          const std::vector<Tensor>&) override {
    std::vector<Tensor> tangents(in.size());
    for (size_t i = 0; i < in.size(); ++i) tangents[i] = fwd::tangent_or_zeros(t[i], in[i]);
    return {sizes_.empty() ? stack(tangents, dim_) : cat(tangents, dim_)};
  }
  int64_t dim_;
  std::vector<int64_t> sizes_;
};

// The checks cat and stack share: a non-empty list of defined tensors of one dtype and rank.
void check_list(const std::vector<Tensor>& tensors, std::string_view op) {
  EMBER_CHECK(!tensors.empty(), "{}: expected a non-empty list of tensors", op);
  for (size_t i = 0; i < tensors.size(); ++i) {
    EMBER_CHECK(tensors[i].defined(), "{}: tensor {} is undefined", op, i);
    const Tensor &t = tensors[i], &first = tensors[0];
    EMBER_CHECK(t.dtype() == first.dtype(),
                "{}: tensor {} (shape {}) is {} but tensor 0 (shape {}) is {}", op, i, t.shape(),
                t.dtype(), first.shape(), first.dtype());
    EMBER_CHECK(t.dim() == first.dim(),
                "{}: tensor {} has {} dims (shape {}) but tensor 0 has {} (shape {})", op, i,
                t.dim(), t.shape(), first.dim(), first.shape());
  }
}

}  // namespace

Tensor cat(const std::vector<Tensor>& tensors, int64_t dim) {
  constexpr std::string_view op = "cat";
  profile::Scope scope(op);
  check_list(tensors, op);
  const Tensor& first = tensors[0];
  EMBER_CHECK(first.dim() > 0, "{}: zero-dimensional tensor 0 cannot be concatenated", op);
  const int64_t d = wrap_dim(dim, first.dim(), op);
  Shape out_shape = first.shape();
  out_shape[d] = 0;
  std::vector<int64_t> sizes(tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    for (int64_t k = 0; k < t.dim(); ++k)
      EMBER_CHECK(k == d || t.size(k) == first.size(k),
                  "{}: sizes must match except in dim {}: tensor {} has shape {} but tensor 0 "
                  "has shape {}",
                  op, d, i, t.shape(), first.shape());
    sizes[i] = t.size(d);
    out_shape[d] += sizes[i];
  }
  Tensor out = empty(out_shape, first.dtype(), first.device());
  int64_t offset = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (tensors[i].numel() > 0) copy_into(narrow_view(out, d, offset, sizes[i]), tensors[i]);
    offset += sizes[i];
  }
  return record<CatBackward>(op, out, tensors, d, std::move(sizes));
}

Tensor stack(const std::vector<Tensor>& tensors, int64_t dim) {
  constexpr std::string_view op = "stack";
  profile::Scope scope(op);
  check_list(tensors, op);
  const Tensor& first = tensors[0];
  for (size_t i = 0; i < tensors.size(); ++i)
    EMBER_CHECK(tensors[i].shape() == first.shape(),
                "{}: all tensors must have one shape: tensor {} has shape {} but tensor 0 has "
                "shape {}",
                op, i, tensors[i].shape(), first.shape());
  const int64_t d = wrap_dim(dim, first.dim() + 1, op);
  const int64_t n = static_cast<int64_t>(tensors.size());
  Shape out_shape = first.shape();
  out_shape.insert(out_shape.begin() + d, n);
  Tensor out = empty(out_shape, first.dtype(), first.device());
  if (out.numel() > 0)
    for (int64_t i = 0; i < n; ++i) copy_into(select_view(out, d, i), tensors[i]);
  return record<CatBackward>(op, out, tensors, d, std::vector<int64_t>());
}

// --- index_select

namespace {

// out (pre, K, post) = x (pre, N, post) at idx (K) along dim.
template <class T>
void gather_kernel(const Tensor& x, int64_t dim, const int64_t* idx, const Tensor& out) {
  const int64_t n = x.size(dim), k_count = out.size(dim);
  const T* px = x.data<T>();
  T* po = out.data<T>();
  if (x.is_contiguous()) {
    int64_t pre = 1, post = 1;
    for (int64_t d = 0; d < dim; ++d) pre *= x.size(d);
    for (int64_t d = dim + 1; d < x.dim(); ++d) post *= x.size(d);
    const int64_t rows = pre * k_count;
    const auto copy_row = [&](int64_t r) {
      std::copy_n(px + (r / k_count * n + idx[r % k_count]) * post, post, po + r * post);
    };
    parallel_for(
        rows,
        [&](int64_t begin, int64_t end) {
          for (int64_t r = begin; r < end; ++r) copy_row(r);
        },
        row_grain(post));
    return;
  }
  const int64_t sx = x.stride(dim), so = out.stride(dim);
  for_each_line<2>(out.shape(), dim, {out.strides(), x.strides()}, [&](const auto& off) {
    for (int64_t k = 0; k < k_count; ++k) po[off[0] + k * so] = px[off[1] + idx[k] * sx];
  });
}

// out = zeros of `shape` with g[..., k, ...] added at [..., index[k], ...] along dim (repeats
// accumulate): index_select's backward as an op of its own.  dG = index_select(dOut, dim, index)
struct IndexAddBackward final : Node {
  IndexAddBackward(int64_t dim, const Tensor& index) : dim_(dim) { save(index_, index); }
  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    return {index_select(grads[0], dim_, index_.get())};
  }
  bool differentiable_backward() const override { return true; }
  // Forward: dOut = index_add into zeros of dG (the op is linear)
  std::vector<Tensor> jvp(const std::vector<Tensor>&, const std::vector<Tensor>& t,
                          const std::vector<Tensor>& out) override;
  int64_t dim_;
  SavedTensor index_;
};

// A 1-D contiguous index seen with `shape`, its values along dim (stride 0 elsewhere): the index
// tensor of a device's gather or scatter_add that does index_select or index_add.
Tensor along_dim(const Tensor& index, const Shape& shape, int64_t dim) {
  Shape strides(shape.size(), 0);
  strides[dim] = 1;
  return make_view(index, shape, strides, index.storage_offset());
}

// index: contiguous Int64, 1-D, in range (index_select checked it).
Tensor index_add_zeros(const Tensor& g, int64_t dim, const Tensor& index, const Shape& shape) {
  constexpr std::string_view op = "index_add";
  Tensor out = zeros(shape, g.dtype(), g.device());
  if (!g.device().is_cpu()) {
    index_on_device(cuda::kernels::IndexOp::ScatterAdd, g, out, dim,
                    along_dim(index, g.shape(), dim), op);
    if (!is_grad_enabled() && !detail::forward_wanted(&g, 1)) return out;
    return record<IndexAddBackward>(op, out, {g}, dim, index);
  }
  const int64_t* idx = index.data<int64_t>();
  const int64_t k_count = g.size(dim);
  dispatch_float(g.dtype(), op, [&]<class T>() {
    const T* pg = g.data<T>();
    T* po = out.data<T>();
    if (g.is_contiguous()) {
      // Rows of `post` elements: g's row (o, k) adds into out's row (o, idx[k]), k in order, as
      // the lines below add them; the threads split the columns, so no two write one element.
      int64_t pre = 1, post = 1;
      for (int64_t d = 0; d < dim; ++d) pre *= g.size(d);
      for (int64_t d = dim + 1; d < g.dim(); ++d) post *= g.size(d);
      const int64_t n = shape[dim];
      parallel_for(
          post,
          [&](int64_t begin, int64_t end) {
            for (int64_t o = 0; o < pre; ++o)
              for (int64_t k = 0; k < k_count; ++k) {
                const T* src = pg + (o * k_count + k) * post;
                T* dst = po + (o * n + idx[k]) * post;
                for (int64_t j = begin; j < end; ++j) dst[j] += src[j];
              }
          },
          row_grain(pre * k_count));
      return;
    }
    const int64_t sg = g.stride(dim), so = out.stride(dim);
    // Each line of g along dim adds into its own line of out: lines never collide.
    for_each_line<2>(g.shape(), dim, {out.strides(), g.strides()}, [&](const auto& off) {
      for (int64_t k = 0; k < k_count; ++k) po[off[0] + idx[k] * so] += pg[off[1] + k * sg];
    });
  });
  // a first-order backward without tangents: the kernel alone
  if (!is_grad_enabled() && !detail::forward_wanted(&g, 1)) return out;
  return record<IndexAddBackward>(op, out, {g}, dim, index);
}

std::vector<Tensor> IndexAddBackward::jvp(const std::vector<Tensor>&, const std::vector<Tensor>& t,
                                          const std::vector<Tensor>& out) {
  return {index_add_zeros(t[0], dim_, index_.get(), out[0].shape())};
}

// y = x[..., idx, ...] along dim:  dX[..., idx[k], ...] += dY[..., k, ...] (repeats accumulate),
// an op that records under create_graph
struct IndexSelectBackward final : Node {
  IndexSelectBackward(int64_t dim, const Tensor& index) : dim_(dim) { save(index_, index); }
  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    return {index_add_zeros(grads[0], dim_, index_.get(), input_shapes[0])};
  }
  bool differentiable_backward() const override { return true; }
  // Forward: dY = index_select(dX, dim, index) (the op is linear)
  std::vector<Tensor> jvp(const std::vector<Tensor>&, const std::vector<Tensor>& t,
                          const std::vector<Tensor>&) override {
    return {index_select(t[0], dim_, index_.get())};
  }
  int64_t dim_;
  SavedTensor index_;
};

}  // namespace

Tensor index_select(const Tensor& x, int64_t dim, const Tensor& index) {
  constexpr std::string_view op = "index_select";
  profile::Scope scope(op);
  check_defined(x, op);
  check_defined(index, op);
  EMBER_CHECK(index.dtype() == kInt64, "{}: index must be Int64, got {} (shape {})", op,
              index.dtype(), index.shape());
  EMBER_CHECK(index.dim() <= 1, "{}: index must be 1-D, got shape {}", op, index.shape());
  if (x.dim() == 0) {
    EMBER_CHECK(index.numel() == 1, "{}: a 0-d tensor takes exactly one index, got {} (shape {})",
                op, index.numel(), index.shape());
    return reshape(index_select(reshape(x, {1}), dim, index.reshape({1})), {});
  }
  const int64_t d = wrap_dim(dim, x.dim(), op);
  check_same_device(x, index, op);
  const Tensor idx = index.contiguous();
  const int64_t size = x.size(d);
  // an index out of range, "{}" for it; on a device the kernel checks the indices (Note [Checks
  // on the device])
  const auto range = [&] {
    return fmt::format("{}: index {{}} out of range for dim {} of size {} (shape {})", op, d, size,
                       x.shape());
  };
  const int64_t* pi = idx.device().is_cpu() ? idx.data<int64_t>() : nullptr;
  for (int64_t k = 0; pi != nullptr && k < idx.numel(); ++k)
    EMBER_CHECK(pi[k] >= 0 && pi[k] < size, "{}", fmt::format(fmt::runtime(range()), pi[k]));
  Shape out_shape = x.shape();
  out_shape[d] = idx.numel();
  Tensor out = empty(out_shape, x.dtype(), x.device());
  if (!x.device().is_cpu())
    index_on_device(cuda::kernels::IndexOp::Gather, out, x, d, along_dim(idx, out_shape, d), op,
                    range());
  else if (out.numel() > 0)
    dispatch_all(x.dtype(), [&]<class T>() { gather_kernel<T>(x, d, pi, out); });
  return record<IndexSelectBackward>(op, out, {x}, d, idx);
}

// --- gather and scatter_add

namespace {

// t viewed with at least one dim: a 0-d tensor counts as shape [1], as torch's gather/scatter.
Tensor at_least_1d(const Tensor& t) {
  return t.dim() > 0 ? t : make_view(t, {1}, {1}, t.storage_offset());
}

// t's leading part of `shape` (each dim no larger than t's), a view.
Tensor leading_view(const Tensor& t, const Shape& shape) {
  return make_view(t, shape, t.strides(), t.storage_offset());
}

// For every position p of index's shape, with q = p whose coordinate along dim is index[p]:
// out[p] = x[q] (gather), or target[q] += src[p] (scatter_add). `out` and `src` have index's
// shape; x and target may be larger. Each line along dim of index reads (or adds into) its own
// line of x (target), so lines run in parallel without colliding.
template <class T>
void gather_lines(const Tensor& out, const Tensor& x, int64_t dim, const Tensor& index) {
  const T* px = x.data<T>();
  const int64_t* pi = index.data<int64_t>();
  T* po = out.data<T>();
  const int64_t n = index.size(dim), so = out.stride(dim), si = index.stride(dim),
                sx = x.stride(dim);
  for_each_line<3>(index.shape(), dim, {out.strides(), index.strides(), x.strides()},
                   [&](const auto& off) {
                     for (int64_t k = 0; k < n; ++k)
                       po[off[0] + k * so] = px[off[2] + pi[off[1] + k * si] * sx];
                   });
}

template <class T>
void scatter_add_lines(const Tensor& target, int64_t dim, const Tensor& index, const Tensor& src) {
  T* pt = target.data<T>();
  const int64_t* pi = index.data<int64_t>();
  const T* ps = src.data<T>();
  const int64_t n = index.size(dim), st = target.stride(dim), si = index.stride(dim),
                ss = src.stride(dim);
  for_each_line<3>(index.shape(), dim, {target.strides(), index.strides(), src.strides()},
                   [&](const auto& off) {
                     for (int64_t k = 0; k < n; ++k)
                       pt[off[0] + pi[off[1] + k * si] * st] += ps[off[2] + k * ss];
                   });
}

// The checks gather and scatter_add share (torch's): an Int64 index with as many dims as x (and
// src), no larger than x outside dim (nor than src anywhere), its values in [0, x.size(dim)).
// Sizes are not checked for an empty index, as torch. Returns dim wrapped and the index made
// contiguous, both seen with at least one dim.
// On a device the values are left to the kernel, which reports them with `range` (Note [Checks
// on the device]); `message` replaces the op's own words for an index out of range.
struct IndexGeometry {
  int64_t dim;
  Tensor index;
  std::string range;  // on a device: an index out of range, "{}" for its value
};

IndexGeometry check_index(const Tensor& x, int64_t dim, const Tensor& index, const Tensor* src,
                          std::string_view op, const std::string& message = {}) {
  check_defined(x, op);
  check_defined(index, op);
  if (src != nullptr) check_defined(*src, op);
  check_same_device(x, index, op);
  if (src != nullptr) check_same_device(x, *src, op);
  EMBER_CHECK(index.dtype() == kInt64, "{}: index must be Int64, got {} (shape {})", op,
              index.dtype(), index.shape());
  const int64_t nd = std::max<int64_t>(x.dim(), 1);
  EMBER_CHECK(std::max<int64_t>(index.dim(), 1) == nd,
              "{}: index of shape {} must have as many dims as the input of shape {}", op,
              index.shape(), x.shape());
  if (src != nullptr) {
    EMBER_CHECK(src->dtype() == x.dtype(), "{}: src is {} but the input is {} (shapes {} and {})",
                op, src->dtype(), x.dtype(), src->shape(), x.shape());
    EMBER_CHECK(std::max<int64_t>(src->dim(), 1) == nd,
                "{}: src of shape {} must have as many dims as the input of shape {}", op,
                src->shape(), x.shape());
  }
  const int64_t d = wrap_dim(dim, nd, op);
  const Tensor idx = at_least_1d(index.contiguous()), x1 = at_least_1d(x);
  if (idx.numel() > 0) {
    for (int64_t k = 0; k < nd; ++k) {
      EMBER_CHECK(k == d || idx.size(k) <= x1.size(k),
                  "{}: index of shape {} is larger than the input of shape {} in dim {} (only "
                  "dim {} may differ)",
                  op, index.shape(), x.shape(), k, d);
      EMBER_CHECK(src == nullptr || idx.size(k) <= at_least_1d(*src).size(k),
                  "{}: index of shape {} is larger than src of shape {} in dim {}", op,
                  index.shape(), src->shape(), k);
    }
  }
  const int64_t size = x1.size(d);
  const auto range = [&] {
    return !message.empty() ? message
                            : fmt::format(
                                  "{}: index {{}} is out of bounds for dim {} of size {} "
                                  "(input of shape {})",
                                  op, d, size, x.shape());
  };
  if (!idx.device().is_cpu()) return {d, idx, range()};  // the kernel checks
  const int64_t* pi = idx.data<int64_t>();
  for (int64_t k = 0; k < idx.numel(); ++k)
    EMBER_CHECK(pi[k] >= 0 && pi[k] < size, "{}", fmt::format(fmt::runtime(range()), pi[k]));
  return {d, idx, {}};
}

// out = gather(x, dim, index):  dX = zeros with dOut added at the gathered positions, i.e.
// scatter_add(zeros, dim, index, dOut)
struct GatherBackward final : Node {
  GatherBackward(int64_t dim, const Tensor& index) : dim_(dim) { save(index_, index); }
  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    if (is_grad_enabled() || !grads[0].device().is_cpu())  // create_graph, a device: the op
      return {scatter_add(zeros(input_shapes[0], grads[0].dtype(), grads[0].device()), dim_,
                          index_.get(), grads[0])};
    const Tensor g = grads[0].contiguous();
    Tensor grad_x = zeros(input_shapes[0], g.dtype(), g.device());
    dispatch_float(g.dtype(), op(), [&]<class T>() {
      scatter_add_lines<T>(at_least_1d(grad_x), dim_, index_.get(), at_least_1d(g));
    });
    return {grad_x};
  }
  bool differentiable_backward() const override { return true; }
  // Forward: dOut = gather(dX, dim, index) (the op is linear), in out's shape (a 0-d index is
  // kept as shape [1])
  std::vector<Tensor> jvp(const std::vector<Tensor>&, const std::vector<Tensor>& t,
                          const std::vector<Tensor>& out) override {
    return {reshape(gather(t[0], dim_, index_.get()), out[0].shape())};
  }
  int64_t dim_;
  SavedTensor index_;
};

// g padded with zeros at the end of each dim to `shape` (no smaller than g's), in ops (cat).
Tensor pad_end(Tensor g, const Shape& shape) {
  for (int64_t d = 0; d < g.dim(); ++d) {
    if (g.size(d) == shape[d]) continue;
    Shape side = g.shape();
    side[d] = shape[d] - g.size(d);
    g = cat({g, zeros(side, g.dtype(), g.device())}, d);
  }
  return g;
}

// out = x + scatter of src at index:  dX = dOut,  dSrc = gather(dOut, dim, index) on index's
// part of src, 0 on the rest
struct ScatterAddBackward final : Node {
  ScatterAddBackward(int64_t dim, const Tensor& index) : dim_(dim) { save(index_, index); }
  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    const Tensor& g = grads[0];
    Tensor grad_src;
    if (needs_grad(1) && (is_grad_enabled() || !g.device().is_cpu())) {  // create_graph: ops
      const Tensor& index = index_.get();
      const Shape src_shape = input_shapes[1].empty() ? Shape{1} : input_shapes[1];
      grad_src = index.numel() == 0
                     ? zeros(input_shapes[1], g.dtype(), g.device())
                     : reshape(pad_end(gather(g, dim_, index), src_shape), input_shapes[1]);
    } else if (needs_grad(1)) {
      const Tensor& index = index_.get();
      grad_src = zeros(input_shapes[1], g.dtype(), g.device());
      dispatch_float(g.dtype(), op(), [&]<class T>() {
        gather_lines<T>(leading_view(at_least_1d(grad_src), index.shape()), at_least_1d(g), dim_,
                        index);
      });
    }
    return {needs_grad(0) ? g : Tensor(), grad_src};
  }
  bool differentiable_backward() const override { return true; }
  // Forward: dOut = scatter_add(dX, dim, index, dSrc) (the op is linear in both), dX alone
  // where src has no tangent
  std::vector<Tensor> jvp(const std::vector<Tensor>&, const std::vector<Tensor>& t,
                          const std::vector<Tensor>& out) override {
    if (!t[1].defined()) return {t[0]};
    return {scatter_add(fwd::tangent_or_zeros(t[0], out[0]), dim_, index_.get(), t[1])};
  }
  int64_t dim_;
  SavedTensor index_;
};

}  // namespace

Tensor gather(const Tensor& x, int64_t dim, const Tensor& index) {
  return gather(x, dim, index, std::string());
}

Tensor gather(const Tensor& x, int64_t dim, const Tensor& index, const std::string& range) {
  constexpr std::string_view op = "gather";
  profile::Scope scope(op);
  const IndexGeometry geo = check_index(x, dim, index, nullptr, op, range);
  Tensor out = empty(index.shape(), x.dtype(), x.device());
  if (!x.device().is_cpu())
    index_on_device(cuda::kernels::IndexOp::Gather, at_least_1d(out), at_least_1d(x), geo.dim,
                    geo.index, op, geo.range);
  else if (out.numel() > 0)
    dispatch_all(x.dtype(), [&]<class T>() {
      gather_lines<T>(at_least_1d(out), at_least_1d(x), geo.dim, geo.index);
    });
  return record<GatherBackward>(op, out, {x}, geo.dim, geo.index);
}

Tensor scatter_add(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& src) {
  return scatter_add(x, dim, index, src, std::string());
}

Tensor scatter_add(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& src,
                   const std::string& range) {
  constexpr std::string_view op = "scatter_add";
  profile::Scope scope(op);
  const IndexGeometry geo = check_index(x, dim, index, &src, op, range);
  Tensor out = empty(x.shape(), x.dtype(), x.device());
  copy_into(out, x);
  if (!x.device().is_cpu()) {
    index_on_device(cuda::kernels::IndexOp::ScatterAdd,
                    leading_view(at_least_1d(src), geo.index.shape()), at_least_1d(out), geo.dim,
                    geo.index, op, geo.range);
  } else if (geo.index.numel() > 0) {
    // Bools add as a logical or (true + true stays true), as torch's.
    dispatch_all(x.dtype(), [&]<class T>() {
      scatter_add_lines<T>(at_least_1d(out), geo.dim, geo.index,
                           leading_view(at_least_1d(src), geo.index.shape()));
    });
  }
  return record<ScatterAddBackward>(op, out, {x, src}, geo.dim, geo.index);
}

// --- masked_select

namespace {

// out = zeros of `shape` with g (1-D, one element per true of the mask broadcast to shape)
// written at the mask's true positions in row-major order: masked_select's backward as an op of
// its own.  dG = masked_select(dOut, mask)
struct MaskedScatterBackward final : Node {
  explicit MaskedScatterBackward(const Tensor& mask) { save(mask_, mask); }
  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    return {masked_select(grads[0], mask_.get())};
  }
  bool differentiable_backward() const override { return true; }
  // Forward: dOut = masked_scatter into zeros of dG (the op is linear)
  std::vector<Tensor> jvp(const std::vector<Tensor>&, const std::vector<Tensor>& t,
                          const std::vector<Tensor>& out) override;
  SavedTensor mask_;
};

Tensor masked_scatter_zeros(const Tensor& g, const Tensor& mask, const Shape& shape) {
  constexpr std::string_view op = "masked_scatter";
  Tensor out = zeros(shape, g.dtype(), g.device());
  dispatch_float(g.dtype(), op, [&]<class T>() {
    const T* pg = g.data<T>();
    const bool* pm = mask.data<bool>();
    T* po = out.data<T>();
    const int64_t sg = g.dim() == 0 ? 0 : g.stride(0);
    int64_t k = 0;
    StridedLoop<2> loop(shape, {out.strides(), broadcast_strides(mask, shape)});
    loop.run_serial([&](const auto& off, int64_t len, const auto& st) {
      for (int64_t i = 0; i < len; ++i)
        if (pm[off[1] + i * st[1]]) po[off[0] + i * st[0]] = pg[sg * k++];
    });
  });
  // a first-order backward without tangents: the kernel alone
  if (!is_grad_enabled() && !detail::forward_wanted(&g, 1)) return out;
  return record<MaskedScatterBackward>(op, out, {g}, mask);
}

std::vector<Tensor> MaskedScatterBackward::jvp(const std::vector<Tensor>&,
                                               const std::vector<Tensor>& t,
                                               const std::vector<Tensor>& out) {
  return {masked_scatter_zeros(t[0], mask_.get(), out[0].shape())};
}

// y = x[mask] (x and mask broadcast to one shape, read in row-major order):
// dX = zeros of the broadcast shape with dY written at the mask's true positions (the engine
// then sums it down to x's shape), an op that records under create_graph
struct MaskedSelectBackward final : Node {
  MaskedSelectBackward(const Tensor& mask, Shape shape) : shape_(std::move(shape)) {
    save(mask_, mask);
  }
  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    return {masked_scatter_zeros(grads[0], mask_.get(), shape_)};
  }
  bool differentiable_backward() const override { return true; }
  // Forward: dY = masked_select(dX, mask) (the op is linear)
  std::vector<Tensor> jvp(const std::vector<Tensor>&, const std::vector<Tensor>& t,
                          const std::vector<Tensor>&) override {
    return {masked_select(t[0], mask_.get())};
  }
  Shape shape_;
  SavedTensor mask_;
};

}  // namespace

Tensor masked_select(const Tensor& x, const Tensor& mask) {
  constexpr std::string_view op = "masked_select";
  profile::Scope scope(op);
  check_defined(x, op);
  check_defined(mask, op);
  EMBER_CHECK(mask.dtype() == kBool, "{}: mask must be Bool, got {} (shape {})", op, mask.dtype(),
              mask.shape());
  const Shape shape = broadcast_shapes(x.shape(), mask.shape(), op);
  if (!x.device().is_cpu()) {
    // A device, in ops (the gradient follows through them): element i of the broadcast x goes
    // to slot (running count of the mask up to i) - 1 by scatter_add into zeros, the dropped
    // ones into a spare last slot; the count is read on the host (one sync, as torch's)
    check_same_device(x, mask, op);
    const int64_t n = shape_numel(shape);
    const Tensor flat_x = reshape(expand(x, shape), {n});
    const Tensor keep = reshape(expand(mask, shape), {n}).contiguous();
    const Tensor running = cumsum(keep, 0);
    const int64_t count = n == 0 ? 0 : running.select(0, n - 1).item<int64_t>();
    const Tensor slot =
        where(keep, sub(running, 1.0), full({}, static_cast<double>(count), kInt64, x.device()));
    const Tensor slots = zeros({count + 1}, x.dtype(), x.device());
    return narrow(scatter_add(slots, 0, slot, flat_x), 0, 0, count);
  }
  const Shape mask_strides = broadcast_strides(mask, shape);
  const bool* pm = mask.data<bool>();
  int64_t count = 0;
  StridedLoop<1>(shape, {mask_strides})
      .run_serial([&](const auto& off, int64_t len, const auto& st) {
        for (int64_t i = 0; i < len; ++i) count += pm[off[0] + i * st[0]];
      });
  Tensor out = empty({count}, x.dtype(), x.device());
  dispatch_all(x.dtype(), [&]<class T>() {
    const T* px = x.data<T>();
    T* po = out.data<T>();
    int64_t k = 0;
    StridedLoop<2> loop(shape, {broadcast_strides(x, shape), mask_strides});
    loop.run_serial([&](const auto& off, int64_t len, const auto& st) {
      for (int64_t i = 0; i < len; ++i)
        if (pm[off[1] + i * st[1]]) po[k++] = px[off[0] + i * st[0]];
    });
  });
  return record<MaskedSelectBackward>(op, out, {x}, mask, shape);
}

// --- triu and tril

namespace {

// out = x with the elements outside the triangle zeroed, for every matrix (M, N) of the last
// two dims: triu keeps j - i >= diagonal, tril keeps j - i <= diagonal.
Tensor triangle(const Tensor& x, int64_t diagonal, bool upper) {
  const int64_t nd = x.dim(), m = x.size(-2), n = x.size(-1);
  if (!x.device().is_cpu()) {
    // A device: where(j - i within the triangle, x, 0), the mask by comparison
    NoGradGuard no_grad;  // the caller records the op
    const Device& device = x.device();
    const Tensor columns = arange(0, static_cast<double>(n), 1, kInt64, device);
    const Tensor rows = reshape(arange(0, static_cast<double>(m), 1, kInt64, device), {m, 1});
    const Tensor offset = sub(columns, rows);  // j - i, (m, n)
    const Tensor keep = upper ? ge(offset, static_cast<double>(diagonal))
                              : le(offset, static_cast<double>(diagonal));
    return where(keep, x, zeros({}, x.dtype(), device));
  }
  Tensor out = empty(x.shape(), x.dtype(), x.device());
  if (out.numel() == 0) return out;
  Shape batch = x.shape();
  batch[nd - 2] = batch[nd - 1] = 1;
  const int64_t sr = x.stride(-2), sc = x.stride(-1);
  dispatch_all(x.dtype(), [&]<class T>() {
    const T* px = x.data<T>();
    T* po = out.data<T>();
    StridedLoop<2> loop(batch, {out.strides(), x.strides()});
    loop.run([&](const auto& off, int64_t len, const auto& st) {
      for (int64_t b = 0; b < len; ++b) {
        const T* src = px + off[1] + b * st[1];
        T* dst = po + off[0] + b * st[0];
        for (int64_t i = 0; i < m; ++i, dst += n, src += sr) {
          // Columns [begin, end) are kept, the rest zeroed.
          const int64_t edge = std::clamp<int64_t>(i + diagonal + (upper ? 0 : 1), 0, n);
          const int64_t begin = upper ? edge : 0, end = upper ? n : edge;
          std::fill(dst, dst + begin, T(0));
          for (int64_t j = begin; j < end; ++j) dst[j] = src[j * sc];
          std::fill(dst + end, dst + n, T(0));
        }
      }
    });
  });
  return out;
}

// y = x * triangle mask:  dX = dY * the same mask, i.e. triu/tril of dY
struct TriangleBackward final : Node {
  TriangleBackward(int64_t diagonal, bool upper) : diagonal_(diagonal), upper_(upper) {}
  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    if (is_grad_enabled())  // create_graph: as the op itself
      return {upper_ ? triu(grads[0], diagonal_) : tril(grads[0], diagonal_)};
    return {triangle(grads[0], diagonal_, upper_)};
  }
  bool differentiable_backward() const override { return true; }
  // Forward: dY = triu/tril(dX) (the op is linear)
  std::vector<Tensor> jvp(const std::vector<Tensor>&, const std::vector<Tensor>& t,
                          const std::vector<Tensor>&) override {
    return {upper_ ? triu(t[0], diagonal_) : tril(t[0], diagonal_)};
  }
  int64_t diagonal_;
  bool upper_;
};

// Op `op`: triu (upper) or tril.
Tensor triangle_op(const Tensor& x, int64_t diagonal, bool upper, std::string_view op) {
  profile::Scope scope(op);
  check_defined(x, op);
  EMBER_CHECK(x.dim() >= 2, "{}: expected a tensor of at least 2 dims, got shape {}", op,
              x.shape());
  return record<TriangleBackward>(op, triangle(x, diagonal, upper), {x}, diagonal, upper);
}

}  // namespace

Tensor triu(const Tensor& x, int64_t diagonal) { return triangle_op(x, diagonal, true, "triu"); }
Tensor tril(const Tensor& x, int64_t diagonal) { return triangle_op(x, diagonal, false, "tril"); }

// --- sort

namespace {

// Sorts (value, original position) pairs by value, stably: equal values keep their order (the
// position breaks ties, so the faster unstable std::sort is enough). NaN counts as larger than
// every number, as torch: NaNs are moved, in order, to the end (or the front when descending).
template <class T, bool Descending>
void stable_sort_line(std::vector<std::pair<T, int64_t>>& line) {
  auto first = line.begin(), last = line.end();
  if constexpr (std::is_floating_point_v<T>) {
    const auto is_nan = [](const std::pair<T, int64_t>& e) { return std::isnan(e.first); };
    if (std::any_of(first, last, is_nan)) {
      if (Descending)
        first = std::stable_partition(first, last, is_nan);
      else
        last = std::stable_partition(first, last, [&](const auto& e) { return !is_nan(e); });
    }
  }
  std::sort(first, last, [](const std::pair<T, int64_t>& a, const std::pair<T, int64_t>& b) {
    if (a.first == b.first) return a.second < b.second;
    return Descending ? a.first > b.first : a.first < b.first;
  });
}

// values/indices = x sorted along dim (each line of n elements on its own).
template <class T, bool Descending>
void sort_kernel(const Tensor& x, int64_t dim, const Tensor& values, const Tensor& indices) {
  const int64_t n = x.size(dim), sx = x.stride(dim), sv = values.stride(dim),
                si = indices.stride(dim);
  const T* px = x.data<T>();
  T* pv = values.data<T>();
  int64_t* pi = indices.data<int64_t>();
  const std::array<Shape, 3> strides = {x.strides(), values.strides(), indices.strides()};
  for_each_line<3>(x.shape(), dim, strides, [&](const auto& off) {
    thread_local std::vector<std::pair<T, int64_t>> line;
    line.resize(n);
    for (int64_t j = 0; j < n; ++j) line[j] = {px[off[0] + j * sx], j};
    stable_sort_line<T, Descending>(line);
    for (int64_t j = 0; j < n; ++j) {
      pv[off[1] + j * sv] = line[j].first;
      pi[off[2] + j * si] = line[j].second;
    }
  });
}

// values = gather(x, dim, indices):  dX[..., indices[k], ...] = dValues[k], i.e.
// scatter_add(zeros, dim, indices, dValues) (the indices of a line are distinct)
struct SortBackward final : Node {
  SortBackward(int64_t dim, const Tensor& indices) : dim_(dim) { save(indices_, indices); }
  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    const Tensor& g = grads[0];
    const Tensor& indices = indices_.get();
    if (is_grad_enabled() || !g.device().is_cpu())  // create_graph, a device: as the op
      return {scatter_add(zeros(input_shapes[0], g.dtype(), g.device()), dim_, indices, g)};
    Tensor grad_x = zeros(input_shapes[0], g.dtype(), g.device());
    dispatch_float(g.dtype(), op(), [&]<class T>() {
      const T* pg = g.data<T>();
      const int64_t* pi = indices.data<int64_t>();
      T* px = grad_x.data<T>();
      const int64_t n = g.size(dim_), sx = grad_x.stride(dim_), sg = g.stride(dim_),
                    si = indices.stride(dim_);
      const std::array<Shape, 3> strides = {grad_x.strides(), g.strides(), indices.strides()};
      for_each_line<3>(g.shape(), dim_, strides, [&](const auto& off) {
        for (int64_t k = 0; k < n; ++k) px[off[0] + pi[off[2] + k * si] * sx] = pg[off[1] + k * sg];
      });
    });
    return {grad_x};
  }
  bool differentiable_backward() const override { return true; }
  // Forward: dValues = gather(dX, dim, indices)
  std::vector<Tensor> jvp(const std::vector<Tensor>&, const std::vector<Tensor>& t,
                          const std::vector<Tensor>&) override {
    return {gather(t[0], dim_, indices_.get())};
  }
  int64_t dim_;
  SavedTensor indices_;
};

}  // namespace

SortResult sort(const Tensor& x, int64_t dim, bool descending) {
  constexpr std::string_view op = "sort";
  profile::Scope scope(op);
  check_defined(x, op);
  const int64_t d = wrap_dim(dim, x.dim(), op);
  if (x.dim() == 0) return {x.clone(), zeros({}, kInt64, x.device())};
  Tensor values = empty(x.shape(), x.dtype(), x.device()),
         indices = empty(x.shape(), kInt64, x.device());
  if (!x.device().is_cpu()) {
    EMBER_CHECK(x.dtype() != kBool, "{}: Bool tensors are not supported on {} yet (shape {})", op,
                x.device(), x.shape());
    rows_on_device(cuda::kernels::RowOp::Sort, x.dtype(), d, {x}, {values, indices}, op,
                   descending);
  } else if (x.numel() > 0) {
    dispatch_all(x.dtype(), [&]<class T>() {
      if (descending)
        sort_kernel<T, true>(x, d, values, indices);
      else
        sort_kernel<T, false>(x, d, values, indices);
    });
  }
  record<SortBackward>(op, {&values}, {x}, d, indices);
  return {values, indices};
}

// --- topk

namespace {

// Note [topk order]
// torch's CPU topk orders (value, position) pairs with an order that is not stable: largest
// first, NaN above every number (or smallest first, NaN below none), then for k * 64 <= n
// std::partial_sort of the first k, else std::nth_element at k - 1 and, when sorted,
// std::sort of the first k - 1. The same standard algorithms on the same pairs with the same
// comparison give the same permutation, so equal values come out in torch's order (with
// libstdc++, which Debian's torch is built with).
template <class T>
struct TopkBefore {
  bool largest;
  bool operator()(const std::pair<T, int64_t>& a, const std::pair<T, int64_t>& b) const {
    if constexpr (std::is_floating_point_v<T>) {
      if (largest) return (std::isnan(a.first) && !std::isnan(b.first)) || a.first > b.first;
      return (!std::isnan(a.first) && std::isnan(b.first)) || a.first < b.first;
    } else {
      return largest ? a.first > b.first : a.first < b.first;
    }
  }
};

// values/indices (k along dim) = the top k of each line of x along dim (Note [topk order]).
template <class T>
void topk_kernel(const Tensor& x, int64_t dim, int64_t k, bool largest, bool sorted,
                 const Tensor& values, const Tensor& indices) {
  const int64_t n = x.size(dim), sx = x.stride(dim), sv = values.stride(dim),
                si = indices.stride(dim);
  const T* px = x.data<T>();
  T* pv = values.data<T>();
  int64_t* pi = indices.data<int64_t>();
  const TopkBefore<T> before{largest};
  const std::array<Shape, 3> strides = {x.strides(), values.strides(), indices.strides()};
  for_each_line<3>(x.shape(), dim, strides, [&](const auto& off) {
    thread_local std::vector<std::pair<T, int64_t>> line;
    line.resize(n);
    for (int64_t j = 0; j < n; ++j) line[j] = {px[off[0] + j * sx], j};
    if (k * 64 <= n) {
      std::partial_sort(line.begin(), line.begin() + k, line.end(), before);
    } else {
      std::nth_element(line.begin(), line.begin() + (k - 1), line.end(), before);
      if (sorted) std::sort(line.begin(), line.begin() + (k - 1), before);
    }
    for (int64_t j = 0; j < k; ++j) {
      pv[off[1] + j * sv] = line[j].first;
      pi[off[2] + j * si] = line[j].second;
    }
  });
}

}  // namespace

TopkResult topk(const Tensor& x, int64_t k, int64_t dim, bool largest, bool sorted) {
  constexpr std::string_view op = "topk";
  profile::Scope scope(op);
  check_defined(x, op);
  EMBER_CHECK(x.dtype() != kBool, "{}: Bool tensors are not supported (shape {})", op, x.shape());
  const int64_t d = wrap_dim(dim, x.dim(), op);
  const int64_t n = x.dim() == 0 ? 1 : x.size(d);
  EMBER_CHECK(k >= 0 && k <= n, "{}: k {} out of range for dim {} of size {} (shape {})", op, k, d,
              n, x.shape());
  if (x.dim() == 0)
    return {x.clone(), zeros({}, kInt64, x.device())};  // as torch, for k 0 and 1 alike
  if (!x.device().is_cpu()) {
    // A device: the first k of a stable sort (ties in position order, sorted or not: torch's
    // order among equal values differs between its CPU and CUDA kernels too)
    const SortResult all = [&] {
      NoGradGuard no_grad;
      return sort(x, d, largest);
    }();
    const Tensor values = narrow_view(all.values, d, 0, k).contiguous();
    const Tensor indices = narrow_view(all.indices, d, 0, k).contiguous();
    Tensor out = values;
    record<SortBackward>(op, {&out}, {x}, d, indices);
    return {out, indices};
  }
  Shape shape = x.shape();
  shape[d] = k;
  Tensor values = empty(shape, x.dtype(), x.device()), indices = empty(shape, kInt64, x.device());
  if (values.numel() > 0) {
    dispatch_all(x.dtype(), [&]<class T>() {
      if constexpr (!std::is_same_v<T, bool>)
        topk_kernel<T>(x, d, k, largest, sorted, values, indices);
    });
  }
  // The values' gradient goes back to the positions they came from, as sort's.
  record<SortBackward>(op, {&values}, {x}, d, indices);
  return {values, indices};
}

// --- multinomial

namespace {

// One row of C weights w (stride s) -> `count` category indices written to out (stride so), drawn
// from gen. With replacement (or a single draw): inverse transform sampling on the cumulative
// sums. Without: each category's key E_c / w_c with E_c ~ Exp(1), the `count` smallest keys in
// order (Efraimidis and Spirakis): the same distribution as drawing one category at a time with
// probability proportional to its weight among those not drawn yet. Zero weights get an infinite
// key, so they come after every positive one, lowest index first.
template <class T>
void multinomial_row(const T* w, int64_t s, int64_t C, int64_t count, bool replacement,
                     std::mt19937_64& gen, int64_t* out, int64_t so) {
  thread_local std::vector<double> cumulative;
  if (replacement || count == 1) {
    cumulative.resize(C);
    double total = 0;
    int64_t last_positive = 0;
    for (int64_t c = 0; c < C; ++c) {
      total += static_cast<double>(w[c * s]);
      cumulative[c] = total;
      if (w[c * s] > 0) last_positive = c;
    }
    for (int64_t i = 0; i < count; ++i) {
      const double u = next_uniform(gen) * total;
      // The first category whose cumulative sum exceeds u: never a zero-weight one.
      const auto at = std::upper_bound(cumulative.begin(), cumulative.end(), u);
      out[i * so] =
          std::min<int64_t>(at - cumulative.begin(), last_positive);  // u rounded to total
    }
    return;
  }
  thread_local std::vector<std::pair<double, int64_t>> keys;
  keys.resize(C);
  for (int64_t c = 0; c < C; ++c) {
    const double e = -std::log1p(-next_uniform(gen));  // Exp(1): 1 - u in (0, 1]
    const double wc = static_cast<double>(w[c * s]);
    keys[c] = {wc > 0 ? e / wc : std::numeric_limits<double>::infinity(), c};
  }
  std::partial_sort(keys.begin(), keys.begin() + count, keys.end());  // ties: lower index first
  for (int64_t i = 0; i < count; ++i) out[i * so] = keys[i].second;
}

}  // namespace

Tensor multinomial(const Tensor& weights, int64_t num_samples, bool replacement) {
  constexpr std::string_view op = "multinomial";
  profile::Scope scope(op);
  check_defined(weights, op);
  EMBER_CHECK(is_floating(weights.dtype()),
              "{}: expected Float32 or Float64 weights, got {} (shape {})", op, weights.dtype(),
              weights.shape());
  EMBER_CHECK(weights.dim() == 1 || weights.dim() == 2,
              "{}: weights must be 1-D or 2-D, got shape {}", op, weights.shape());
  EMBER_CHECK(num_samples > 0, "{}: num_samples must be positive, got {}", op, num_samples);
  const bool batched = weights.dim() == 2;
  const int64_t N = batched ? weights.size(0) : 1, C = weights.size(-1);
  EMBER_CHECK(replacement || num_samples <= C,
              "{}: cannot draw {} samples from {} categories without replacement", op, num_samples,
              C);
  if (!weights.device().is_cpu())  // drawn on the host from the global generator (one copy
    // each way): the CPU's samples for the same seed
    return multinomial(weights.detach().cpu(), num_samples, replacement).to(weights.device());
  const int64_t rs = batched ? weights.stride(0) : 0, cs = weights.stride(-1);
  Tensor out = empty(batched ? Shape{N, num_samples} : Shape{num_samples}, kInt64);
  dispatch_float(weights.dtype(), op, [&]<class T>() {
    const T* w = weights.data<T>();
    for (int64_t r = 0; r < N; ++r) {
      double total = 0;
      for (int64_t c = 0; c < C; ++c) {
        const T v = w[r * rs + c * cs];
        EMBER_CHECK(std::isfinite(v) && v >= 0,
                    "{}: weights must be finite and non-negative, got {} at category {}{} "
                    "(shape {})",
                    op, v, c, batched ? fmt::format(" of row {}", r) : "", weights.shape());
        total += static_cast<double>(v);
      }
      EMBER_CHECK(total > 0, "{}: the weights{} sum to 0: no category can be drawn (shape {})", op,
                  batched ? fmt::format(" of row {}", r) : "", weights.shape());
    }
    GeneratorGuard guard;
    int64_t* po = out.data<int64_t>();
    for (int64_t r = 0; r < N; ++r)
      multinomial_row(w + r * rs, cs, C, num_samples, replacement, guard.gen(),
                      po + r * num_samples, 1);
  });
  return out;
}

}  // namespace ember
