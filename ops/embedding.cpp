// embedding: the rows of a weight gathered by Int64 indices, torch's padding_idx row getting no
// gradient. Its backward (the rows' gradients added into zeros) is an op of its own whose
// derivative is embedding again, so it differentiates to any order; on a device, the gather and
// scatter_add kernels of cuda/index.h.
#include <cstring>
#include <optional>

#include "graph/autograd.h"
#include "graph/copy.h"
#include "graph/creation.h"
#include "graph/device_backend.h"
#include "graph/profile.h"
#include "graph/strided.h"
#include "ops/common.h"
#include "ops/elementwise.h"

namespace ember {

namespace {

// w with its padding row zeroed (a constant 0 on that row, 1 elsewhere), in ops; w itself when
// there is none.
Tensor without_padding_row(const Tensor& w, int64_t padding_idx) {
  if (padding_idx < 0) return w;
  Tensor rows = ones({w.size(0), 1}, w.dtype(), w.device());
  rows.narrow(0, padding_idx, 1).fill_(0.0);
  return mul(w, rows);
}

// dW = embedding_backward(dOut) (below) adds row k of dOut into row indices[k] of zeros:
//   d(dOut)[k, :] = ddW[indices[k], :], zeros where indices[k] is the padding row
// which is embedding's forward again, of ddW with its padding row zeroed.
struct EmbeddingBackwardBackward final : Node {
  EmbeddingBackwardBackward(const Tensor& indices, int64_t padding_idx)
      : padding_idx_(padding_idx) {
    save(indices_, indices);
  }
  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    return {embedding(without_padding_row(grads[0], padding_idx_), indices_.get())};
  }
  bool differentiable_backward() const override { return true; }
  // Forward: d(dW) = embedding_backward(d(dOut)) (the op is linear)
  std::vector<Tensor> jvp(const std::vector<Tensor>&, const std::vector<Tensor>& t,
                          const std::vector<Tensor>& out) override;
  SavedTensor indices_;
  int64_t padding_idx_;  // -1: none
};

// The gradient of embedding's weight (wshape) for dOut g: zeros with g's row k added into row
// indices[k] (repeats add up), except the padding row, which gets none (torch's padding_idx). An
// op of its own (recorded under create_graph), so that its gradient can be taken in turn.
Tensor embedding_backward(const Tensor& g, const Tensor& indices, const Shape& wshape,
                          int64_t padding_idx) {
  constexpr std::string_view op = "embedding_backward";
  const Tensor gc = contiguous_data(g);
  Tensor grad_w = zeros(wshape, g.dtype(), g.device());
  if (!g.device().is_cpu()) {
    // A device: g's row k added into row indices[k] by scatter_add, the padding row then zeroed
    const int64_t count = indices.numel(), dim = wshape[1];
    const Tensor rows = make_view(gc, {count, dim}, {dim, 1}, gc.storage_offset());
    const Tensor index = make_view(indices, {count, dim}, {1, 0}, indices.storage_offset());
    index_on_device(cuda::kernels::IndexOp::ScatterAdd, rows, grad_w, 0, index, op);
    if (padding_idx >= 0)
      copy_into(narrow_view(grad_w, 0, padding_idx, 1), zeros({}, g.dtype(), g.device()));
  } else {
    dispatch_float(g.dtype(), op, [&]<class T>() {
      const int64_t* idx = indices.data<int64_t>();
      const T* pg = gc.data<T>();
      T* pw = grad_w.data<T>();
      const int64_t dim = wshape[1], count = indices.numel();
      for (int64_t k = 0; k < count; ++k) {  // serial: repeated indices add into one row
        if (idx[k] == padding_idx) continue;
        T* row = pw + idx[k] * dim;
        const T* src = pg + k * dim;
        for (int64_t j = 0; j < dim; ++j) row[j] += src[j];
      }
    });
  }
  // a first-order backward without tangents: nothing to record or check
  if (!is_grad_enabled() && !detail::forward_wanted(&g, 1)) return grad_w;
  return record<EmbeddingBackwardBackward>(op, grad_w, {g}, indices, padding_idx);
}

std::vector<Tensor> EmbeddingBackwardBackward::jvp(const std::vector<Tensor>&,
                                                   const std::vector<Tensor>& t,
                                                   const std::vector<Tensor>& out) {
  return {embedding_backward(t[0], indices_.get(), out[0].shape(), padding_idx_)};
}

// out[k, :] = weight[indices[k], :]:  dWeight = embedding_backward(dOut)
struct EmbeddingBackward final : Node {
  EmbeddingBackward(const Tensor& indices, int64_t padding_idx) : padding_idx_(padding_idx) {
    save(indices_, indices);
  }
  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    return {embedding_backward(grads[0], indices_.get(), input_shapes[0], padding_idx_)};
  }
  bool differentiable_backward() const override { return true; }
  // Forward: dOut = embedding(dWeight) with the padding row's tangent zeroed: the padding row
  // is held constant, as the backward gives it no gradient (torch's forward mode passes it)
  std::vector<Tensor> jvp(const std::vector<Tensor>&, const std::vector<Tensor>& t,
                          const std::vector<Tensor>&) override {
    return {embedding(without_padding_row(t[0], padding_idx_), indices_.get())};
  }
  SavedTensor indices_;
  int64_t padding_idx_;  // -1: none
};

}  // namespace

Tensor embedding(const Tensor& weight, const Tensor& indices, std::optional<int64_t> padding_idx) {
  constexpr std::string_view op = "embedding";
  profile::Scope scope(op);
  check_defined(weight, op);
  check_defined(indices, op);
  EMBER_CHECK(weight.dim() == 2, "{}: weight must be 2-D (num_embeddings, dim), got shape {}", op,
              weight.shape());
  EMBER_CHECK(is_floating(weight.dtype()), "{}: weight must be Float32 or Float64, got {}", op,
              weight.dtype());
  EMBER_CHECK(indices.dtype() == kInt64, "{}: indices must be Int64, got {} of shape {}", op,
              indices.dtype(), indices.shape());
  const Tensor idx = indices.contiguous();
  const int64_t rows = weight.size(0), dim = weight.size(1), count = idx.numel();
  if (padding_idx) {
    EMBER_CHECK(*padding_idx >= -rows && *padding_idx < rows,
                "{}: padding_idx {} out of range for {} rows", op, *padding_idx, rows);
    if (*padding_idx < 0) *padding_idx += rows;
  }
  check_same_device(weight, indices, op);
  // an index out of range, "{}" for it; on a device the kernel checks the indices (Note [Checks
  // on the device])
  const auto range = [&] {
    return fmt::format("{}: index {{}} out of range for {} rows", op, rows);
  };
  const int64_t* pi = idx.device().is_cpu() ? idx.data<int64_t>() : nullptr;
  for (int64_t k = 0; pi != nullptr && k < count; ++k)
    EMBER_CHECK(pi[k] >= 0 && pi[k] < rows, "{}", fmt::format(fmt::runtime(range()), pi[k]));

  Shape shape = indices.shape();
  shape.push_back(dim);
  Tensor out = empty(shape, weight.dtype(), weight.device());
  if (!weight.device().is_cpu()) {
    // A device: out[k, :] = weight[indices[k], :] by gather
    index_on_device(cuda::kernels::IndexOp::Gather, make_view(out, {count, dim}, {dim, 1}, 0),
                    weight, 0, make_view(idx, {count, dim}, {1, 0}, idx.storage_offset()), op,
                    range());
    return record<EmbeddingBackward>(op, out, {weight}, idx, padding_idx.value_or(-1));
  }
  dispatch_float(weight.dtype(), op, [&]<class T>() {
    const T* pw = weight.data<T>();
    T* po = out.data<T>();
    const int64_t s0 = weight.stride(0), s1 = weight.stride(1);
    parallel_for(
        count,
        [&](int64_t begin, int64_t end) {
          for (int64_t k = begin; k < end; ++k) {
            const T* src = pw + pi[k] * s0;
            T* dst = po + k * dim;
            if (s1 == 1)
              std::memcpy(dst, src, dim * sizeof(T));
            else
              for (int64_t j = 0; j < dim; ++j) dst[j] = src[j * s1];
          }
        },
        row_grain(dim));
  });
  return record<EmbeddingBackward>(op, out, {weight}, idx, padding_idx.value_or(-1));
}

}  // namespace ember
