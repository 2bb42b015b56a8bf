// The elementwise launch of a CUDA device (Note [Host emulation of a GPU] says how it is tested
// without one): operands' strides over the output's shape, adjacent dims merged where every
// operand allows, and one kernel.
#include "graph/device_backend.h"

#include "graph/strided.h"

namespace ember {

static_assert(
    static_cast<int>(DType::Float32) == static_cast<int>(cuda::kernels::ScalarType::Float32) &&
        static_cast<int>(DType::Float64) == static_cast<int>(cuda::kernels::ScalarType::Float64) &&
        static_cast<int>(DType::Int64) == static_cast<int>(cuda::kernels::ScalarType::Int64) &&
        static_cast<int>(DType::Bool) == static_cast<int>(cuda::kernels::ScalarType::Bool),
    "cuda/elementwise.h's ScalarType must list graph/dtype.h's dtypes in their order");
static_assert(cuda::kernels::kMaxDims == static_cast<int>(kMaxDims));

void elementwise_on_device(const Tensor& out, cuda::kernels::Op op, DType compute,
                           std::initializer_list<Tensor> inputs, std::string_view name, double p0,
                           double p1) {
  namespace kn = cuda::kernels;
  const size_t n = inputs.size();
  EMBER_CHECK(n == static_cast<size_t>(kn::arity(op)),
              "{}: the elementwise kernel takes {} inputs, got {}", name, kn::arity(op), n);
  kn::Elementwise e;
  e.op = op;
  e.compute = scalar_type_of(compute);
  e.p0 = p0;
  e.p1 = p1;
  e.numel = out.numel();
  // Every operand's strides over out's shape (0 along broadcast dims), then the dims merged as
  // the CPU's StridedLoop does: size-1 dims dropped, dim d folded into the one before it when
  // every operand steps through both as one.
  std::vector<Shape> strides{out.strides()};
  for (const Tensor& t : inputs) {
    EMBER_CHECK(t.defined(), "{}: undefined tensor", name);
    EMBER_CHECK(t.device() == out.device(),
                "{}: expected all tensors on one device, got {} and {} (shapes {} and {})", name,
                out.device(), t.device(), out.shape(), t.shape());
    strides.push_back(broadcast_strides(t, out.shape()));
  }
  const Shape& shape = out.shape();
  Shape sizes;
  std::vector<Shape> merged(n + 1);
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 1) continue;
    bool merge = !sizes.empty();
    for (size_t k = 0; k <= n && merge; ++k) merge = merged[k].back() == strides[k][d] * shape[d];
    if (merge) {
      sizes.back() *= shape[d];
      for (size_t k = 0; k <= n; ++k) merged[k].back() = strides[k][d];
    } else {
      sizes.push_back(shape[d]);
      for (size_t k = 0; k <= n; ++k) merged[k].push_back(strides[k][d]);
    }
  }
  e.ndim = static_cast<int>(sizes.size());
  e.contiguous = true;
  for (size_t d = 0; d < sizes.size(); ++d) {
    e.sizes[d] = sizes[d];
    for (size_t k = 0; k <= n; ++k)
      e.contiguous = e.contiguous && sizes.size() == 1 && merged[k][d] == 1;
  }
  const auto operand = [&](const Tensor& t, size_t k) {
    kn::Operand o;
    o.data = t.data_bytes();
    o.type = scalar_type_of(t.dtype());
    for (size_t d = 0; d < sizes.size(); ++d) o.strides[d] = merged[k][d];
    return o;
  };
  e.out = operand(out, 0);
  size_t k = 1;
  for (const Tensor& t : inputs) {
    e.in[k - 1] = operand(t, k);
    ++k;
  }
  if (e.numel == 0) return;
  cuda::detail::launch_elementwise(e, out.device(), name);
}

void sum_on_device(const Tensor& out, const Tensor& x, const std::vector<bool>& reduce,
                   std::string_view name) {
  EMBER_CHECK(out.device() == x.device() && out.is_contiguous(),
              "{}: the sum's output must be contiguous and on the input's device", name);
  cuda::kernels::Reduce r;
  r.in = x.data_bytes();
  r.in_type = scalar_type_of(x.dtype());
  r.out = out.data_bytes();
  r.out_type = scalar_type_of(out.dtype());
  r.out_numel = out.numel();
  for (int64_t d = 0; d < x.dim(); ++d) {
    if (x.size(d) == 1) continue;  // nothing to index
    if (reduce[static_cast<size_t>(d)]) {
      r.reduced_sizes[r.reduced_ndim] = x.size(d);
      r.reduced_strides[r.reduced_ndim++] = x.stride(d);
      r.reduced_numel *= x.size(d);
    } else {
      r.kept_sizes[r.kept_ndim] = x.size(d);
      r.kept_strides[r.kept_ndim++] = x.stride(d);
    }
  }
  if (r.out_numel == 0) return;
  if (x.numel() == 0) r.reduced_numel = 0;  // every output an empty sum: 0
  cuda::detail::launch_sum(r, out.device(), name);
}

void rows_on_device(cuda::kernels::RowOp op, DType compute, int64_t dim,
                    std::initializer_list<Tensor> inputs, std::initializer_list<Tensor> outputs,
                    std::string_view name, bool reverse, double p0, int64_t i0,
                    const std::string& check) {
  namespace kn = cuda::kernels;
  EMBER_CHECK(
      inputs.size() >= 1 && inputs.size() <= 3 && outputs.size() >= 1 && outputs.size() <= 3,
      "{}: the row kernel takes one to three inputs and outputs", name);
  const Tensor& x = *inputs.begin();
  kn::Rows r;
  r.op = op;
  r.compute = scalar_type_of(compute);
  r.reverse = reverse;
  r.p0 = p0;
  r.i0 = i0;
  r.length = x.dim() == 0 ? 1 : x.size(dim);
  r.rows = x.dim() == 0 ? 1 : x.numel() / std::max<int64_t>(r.length, 1);
  if (x.numel() == 0) r.rows = 0;
  std::vector<int64_t> outer;  // the dims indexed per row (size-1 dims need no index)
  for (int64_t d = 0; d < x.dim(); ++d)
    if (d != dim && x.size(d) != 1) outer.push_back(d);
  r.outer_ndim = static_cast<int>(outer.size());
  for (size_t i = 0; i < outer.size(); ++i) r.outer_sizes[i] = x.size(outer[i]);
  const auto operand = [&](const Tensor& t) {
    if (!t.defined()) return kn::RowOperand();  // an absent operand (null data)
    EMBER_CHECK(t.device() == x.device() && t.shape() == x.shape(),
                "{}: the row kernel's operands must share one shape and device, got {} on {} "
                "and {} on {}",
                name, x.shape(), x.device(), t.shape(), t.device());
    kn::RowOperand o;
    o.data = t.data_bytes();
    o.type = scalar_type_of(t.dtype());
    o.stride = t.dim() == 0 ? 0 : t.stride(dim);
    for (size_t i = 0; i < outer.size(); ++i) o.outer_strides[i] = t.stride(outer[i]);
    return o;
  };
  size_t k = 0;
  for (const Tensor& t : inputs) r.in[k++] = operand(t);
  k = 0;
  for (const Tensor& t : outputs) r.out[k++] = operand(t);
  if (r.rows == 0) return;
  if (!check.empty()) {
    r.slot = cuda::detail::check_slot(x.device());
    r.check = cuda::detail::register_check(x.device(), check);
  }
  cuda::detail::launch_rows(r, x.device(), name);
}

void index_on_device(cuda::kernels::IndexOp op, const Tensor& dense, const Tensor& indexed,
                     int64_t dim, const Tensor& index, std::string_view name,
                     const std::string& check) {
  EMBER_CHECK(dense.device() == indexed.device() && index.device() == indexed.device() &&
                  dense.dtype() == indexed.dtype() && index.dtype() == kInt64 &&
                  dense.dim() == index.dim() && indexed.dim() == index.dim(),
              "{}: the index kernel's operands must share one device, dtype and rank", name);
  cuda::kernels::IndexAlong a;
  a.op = op;
  a.type = scalar_type_of(dense.dtype());
  a.dim = static_cast<int>(dim);
  a.ndim = static_cast<int>(index.dim());
  a.numel = index.numel();
  a.index = static_cast<const int64_t*>(index.data_bytes());
  a.dense = dense.data_bytes();
  a.indexed = indexed.data_bytes();
  for (int64_t d = 0; d < index.dim(); ++d) {
    a.sizes[d] = index.size(d);
    a.index_strides[d] = index.stride(d);
    a.dense_strides[d] = dense.stride(d);
    a.indexed_strides[d] = indexed.stride(d);
  }
  if (a.numel == 0) return;
  a.bound = indexed.size(dim);
  if (!check.empty()) {
    a.slot = cuda::detail::check_slot(indexed.device());
    a.check = cuda::detail::register_check(indexed.device(), check);
  }
  cuda::detail::launch_index(a, indexed.device(), name);
}

Tensor per_row(const Tensor& t, const Shape& shape, int64_t dim) {
  Shape strides = t.strides();
  if (!strides.empty()) strides[dim] = 0;
  return make_view(t, shape, strides, t.storage_offset());
}

}  // namespace ember
