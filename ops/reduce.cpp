// Reductions. One strided kernel walks the input once and adds each element into its output
// slot (output strides are 0 along reduced dims); trailing-dim reductions of contiguous input
// take a flat, parallel fast path.
#include "ops/reduce.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "graph/autograd.h"
#include "graph/copy.h"
#include "graph/creation.h"
#include "graph/device_backend.h"
#include "graph/profile.h"
#include "graph/strided.h"
#include "ops/common.h"
#include "ops/elementwise.h"
#include "ops/kernels.h"
#include "ops/shape.h"

namespace ember {

namespace {

// Treats NaN as larger than every number, so NaN propagates as in torch.
template <class T>
bool greater(T a, T b) {
  if constexpr (std::is_floating_point_v<T>) {
    if (std::isnan(a)) return !std::isnan(b);
  }
  return a > b;
}

// Sorted, wrapped, unique dims to reduce; an empty list means every dim.
std::vector<bool> reduced_dims(const Tensor& x, const std::vector<int64_t>& dims,
                               std::string_view op) {
  std::vector<bool> reduce(x.dim(), dims.empty());
  for (int64_t d : dims) {
    const int64_t w = wrap_dim(d, x.dim(), op);
    if (x.dim() == 0) continue;
    EMBER_CHECK(!reduce[w], "{}: dim {} appears more than once in {}", op, w, dims);
    reduce[w] = true;
  }
  return reduce;
}

// How many elements of x each output element sums.
int64_t reduced_count(const Tensor& x, const std::vector<bool>& reduce) {
  int64_t count = 1;
  for (int64_t d = 0; d < x.dim(); ++d)
    if (reduce[d]) count *= x.size(d);
  return count;
}

Shape reduced_shape(const Shape& shape, const std::vector<bool>& reduce, bool keepdim) {
  Shape out;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (!reduce[d])
      out.push_back(shape[d]);
    else if (keepdim)
      out.push_back(1);
  }
  return out;
}

// Strides that map each input element to its output slot (out contiguous, keepdim layout).
Shape scatter_strides(const Shape& in_shape, const std::vector<bool>& reduce) {
  Shape keep = reduced_shape(in_shape, reduce, true);
  Shape strides = contiguous_strides(keep);
  for (size_t d = 0; d < in_shape.size(); ++d)
    if (reduce[d]) strides[d] = 0;
  return strides;
}

// The number of elements of x's dims from `dim` on.
int64_t reduced_run(const Tensor& x, size_t dim) {
  int64_t n = 1;
  for (size_t d = dim; d < static_cast<size_t>(x.dim()); ++d) n *= x.size(d);
  return n;
}

// v[0] + … + v[len - 1] in Acc, in eight partial sums.
template <class T, class Acc>
Acc run_sum(const T* v, int64_t len) {
  Acc part[8] = {};
  int64_t i = 0;
  for (; i + 8 <= len; i += 8)
    for (int j = 0; j < 8; ++j) part[j] += static_cast<Acc>(v[i + j]);
  for (; i < len; ++i) part[0] += static_cast<Acc>(v[i]);
  return ((part[0] + part[1]) + (part[2] + part[3])) + ((part[4] + part[5]) + (part[6] + part[7]));
}

// out (keepdim layout, contiguous) = sum of x over the reduced dims, accumulated in Acc.
template <class T, class Acc>
void sum_kernel(const Tensor& x, const std::vector<bool>& reduce, Acc* out, int64_t out_numel) {
  const T* px = x.data<T>();
  std::fill(out, out + out_numel, Acc(0));
  // Fast path: contiguous input reduced over its trailing dims.
  size_t lead = 0;
  while (lead < reduce.size() && !reduce[lead]) ++lead;
  bool trailing = x.is_contiguous();
  for (size_t d = lead; d < reduce.size(); ++d) trailing = trailing && reduce[d];
  if (trailing) {
    const int64_t m = out_numel == 0 ? 0 : x.numel() / out_numel;
    const int64_t grain = std::max<int64_t>(2, parallel_grain() / std::max<int64_t>(m, 1));
    parallel_for(
        out_numel,
        [&](int64_t begin, int64_t end) {
          for (int64_t i = begin; i < end; ++i) {
            Acc acc = 0;
            for (int64_t j = 0; j < m; ++j) acc += static_cast<Acc>(px[i * m + j]);
            out[i] = acc;
          }
        },
        grain);
    return;
  }
  // Fast path: contiguous input reduced over its leading dims (a bias's gradient, the sum of a
  // (rows, n) gradient's rows): blocks of output columns summed down the rows in registers,
  // the columns split across threads.
  size_t lead_end = 0;
  while (lead_end < reduce.size() && reduce[lead_end]) ++lead_end;
  bool leading = x.is_contiguous() && lead_end > 0 && out_numel > 0;
  for (size_t d = lead_end; d < reduce.size(); ++d) leading = leading && !reduce[d];
  if (leading) {
    const int64_t n = out_numel, rows = x.numel() / n;
    constexpr int64_t kColumns = 64;
    parallel_for(
        n,
        [&](int64_t begin, int64_t end) {
          for (int64_t c0 = begin; c0 < end; c0 += kColumns) {
            const int64_t w = std::min(kColumns, end - c0);
            Acc acc[kColumns] = {};
            for (int64_t r = 0; r < rows; ++r) {
              const T* row = px + r * n + c0;
              for (int64_t j = 0; j < w; ++j) acc[j] += static_cast<Acc>(row[j]);
            }
            std::copy(acc, acc + w, out + c0);
          }
        },
        std::max<int64_t>(32, parallel_grain() / std::max<int64_t>(rows, 1)));
    return;
  }
  // Fast path: contiguous input reduced over leading and trailing dims around kept ones (a
  // convolution's bias gradient, the sum of dY (N, C, H, W) over N, H and W): per kept index, its
  // contiguous runs of `inner` elements, one per leading index in order, each summed in eight
  // partial sums (a vector loop; one running sum is a chain of dependent adds), the kept indices
  // split across threads.
  size_t keep_end = lead_end;
  while (keep_end < reduce.size() && !reduce[keep_end]) ++keep_end;
  bool middle = x.is_contiguous() && lead_end > 0 && keep_end > lead_end &&
                keep_end < reduce.size() && out_numel > 0;
  for (size_t d = keep_end; d < reduce.size(); ++d) middle = middle && reduce[d];
  if (middle) {
    const int64_t n = out_numel, inner = reduced_run(x, keep_end);
    const int64_t outer = inner == 0 ? 0 : x.numel() / (n * inner);
    parallel_for(
        n,
        [&](int64_t begin, int64_t end) {
          for (int64_t c = begin; c < end; ++c) {
            Acc acc = 0;
            for (int64_t o = 0; o < outer; ++o)
              acc += run_sum<T, Acc>(px + (o * n + c) * inner, inner);
            out[c] = acc;
          }
        },
        std::max<int64_t>(1, parallel_grain() / std::max<int64_t>(outer * inner, 1)));
    return;
  }
  StridedLoop<2> loop(x.shape(), {scatter_strides(x.shape(), reduce), x.strides()});
  // Serial: several rows may add into the same output slots.
  loop.run_serial([&](const auto& off, int64_t len, const auto& st) {
    Acc* o = out + off[0];
    const T* v = px + off[1];
    const int64_t so = st[0], sv = st[1];  // locals: loops reading them vectorise
    if (so == 0) {
      Acc acc = 0;
      for (int64_t i = 0; i < len; ++i) acc += static_cast<Acc>(v[i * sv]);
      *o += acc;
    } else if (so == 1 && sv == 1) {
      for (int64_t i = 0; i < len; ++i) o[i] += static_cast<Acc>(v[i]);
    } else {
      for (int64_t i = 0; i < len; ++i) o[i * so] += static_cast<Acc>(v[i * sv]);
    }
  });
}

template <class T>
using Accumulator = std::conditional_t<std::is_floating_point_v<T>, double, int64_t>;

// Sum over the reduced dims into a new tensor (keepdim layout) of dtype `out_dtype`.
Tensor sum_impl(const Tensor& x, const std::vector<bool>& reduce, bool keepdim) {
  const DType out_dtype = is_floating(x.dtype()) ? x.dtype() : kInt64;
  Tensor out = empty(reduced_shape(x.shape(), reduce, keepdim), out_dtype, x.device());
  if (!x.device().is_cpu()) {
    sum_on_device(out, x, reduce, "sum");
    return out;
  }
  dispatch_all(x.dtype(), [&]<class T>() {
    using Acc = Accumulator<T>;
    const int64_t n = out.numel();
    std::vector<Acc> acc(n);
    sum_kernel<T, Acc>(x, reduce, acc.data(), n);
    dispatch_all(out_dtype, [&]<class O>() {
      O* po = out.data<O>();
      for (int64_t i = 0; i < n; ++i) po[i] = static_cast<O>(acc[i]);
    });
  });
  return out;
}

// A view of `g` (the reduced gradient) broadcast back to the input's shape: stride 0 along the
// reduced dims. No copy.
Tensor expand_reduced(const Tensor& g, const Shape& in_shape, const std::vector<bool>& reduce,
                      bool keepdim) {
  Shape strides(in_shape.size(), 0);
  size_t k = 0;
  for (size_t d = 0; d < in_shape.size(); ++d) {
    if (!reduce[d])
      strides[d] = g.strides()[k++];
    else if (keepdim)
      ++k;
  }
  return make_view(g, in_shape, strides, g.storage_offset());
}

// y = sum(x over dims):  dX = dY broadcast back over the reduced dims
struct SumBackward final : Node {
  SumBackward(std::vector<bool> reduce, bool keepdim)
      : reduce_(std::move(reduce)), keepdim_(keepdim) {}
  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    Tensor g = grads[0];
    if (keepdim_ && g.dim() != static_cast<int64_t>(input_shapes[0].size())) {
      // sum_to's output: the keepdim result with its leading dims dropped; back to keepdim
      Shape kept = input_shapes[0];
      for (size_t d = 0; d < reduce_.size(); ++d)
        if (reduce_[d]) kept[d] = 1;
      g = reshape(g, kept);
    }
    if (is_grad_enabled()) {  // create_graph: unsqueeze and expand as ops
      if (!keepdim_)
        for (size_t d = 0; d < reduce_.size(); ++d)
          if (reduce_[d]) g = unsqueeze(g, static_cast<int64_t>(d));
      return {expand(g, input_shapes[0])};
    }
    return {expand_reduced(g, input_shapes[0], reduce_, keepdim_)};
  }
  bool differentiable_backward() const override { return true; }
  // Forward: dY = sum(dX over dims), reshaped to y's shape (sum_to's output drops leading dims)
  std::vector<Tensor> jvp(const std::vector<Tensor>&, const std::vector<Tensor>& t,
                          const std::vector<Tensor>& out) override {
    std::vector<int64_t> dims;
    for (size_t d = 0; d < reduce_.size(); ++d)
      if (reduce_[d]) dims.push_back(static_cast<int64_t>(d));
    // no dim reduced (sum's empty dims list would mean every dim): the tangent itself
    if (dims.empty() && !reduce_.empty()) return {reshape(t[0], out[0].shape())};
    return {reshape(sum(t[0], dims, keepdim_), out[0].shape())};
  }
  std::vector<bool> reduce_;
  bool keepdim_;
};

}  // namespace

Tensor sum(const Tensor& x, std::vector<int64_t> dims, bool keepdim) {
  constexpr std::string_view op = "sum";
  profile::Scope scope(op);
  check_defined(x, op);
  const std::vector<bool> reduce = reduced_dims(x, dims, op);
  return record<SumBackward>(op, sum_impl(x, reduce, keepdim), {x}, reduce, keepdim);
}

Tensor sum(const Tensor& x) { return sum(x, {}, false); }

Tensor mean(const Tensor& x, std::vector<int64_t> dims, bool keepdim) {
  constexpr std::string_view op = "mean";
  profile::Scope scope(op);
  check_floating(x, op);
  const int64_t count = reduced_count(x, reduced_dims(x, dims, op));
  return div(sum(x, dims, keepdim), static_cast<double>(count));
}

Tensor mean(const Tensor& x) { return mean(x, {}, false); }

// var = sum((x - mean)²) / (N - unbiased), composed from differentiable ops.
Tensor var(const Tensor& x, std::vector<int64_t> dims, bool unbiased, bool keepdim) {
  constexpr std::string_view op = "var";
  profile::Scope scope(op);
  check_floating(x, op);
  const int64_t count = reduced_count(x, reduced_dims(x, dims, op));
  const Tensor centered = sub(x, mean(x, dims, true));
  // As torch, NaN for no elements, and for one element unbiased: 0 / 0 (never 0 / -1 = -0).
  const double divisor = std::max(static_cast<double>(count) - (unbiased ? 1.0 : 0.0), 0.0);
  return div(sum(mul(centered, centered), dims, keepdim), divisor);
}

namespace {

// y = sqrt(v) with v = var(x): dV = dY / (2 y), 0 where y is 0 (torch's std_backward: a constant
// input gets a zero gradient, not 0 · inf), and var's own graph takes dV back to x. Under
// create_graph y is first made 1 where it is 0, so that the second backward meets no 0 / 0.
struct StdBackward final : Node {
  explicit StdBackward(const Tensor& y) { save_output(y_, y); }
  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    if (is_grad_enabled() || !grads[0].device().is_cpu()) {  // create_graph, a device: in ops
      const Tensor y = y_.get(), zero = eq(y, 0.0);
      return {masked_fill(div(grads[0], mul(masked_fill(y, zero, 1.0), 2.0)), zero, 0.0)};
    }
    return {dispatch_float(grads[0].dtype(), op(), [&]<class T>() {
      return zip<T, T, T>(grads[0], y_.get(), op(),
                          [](T d, T y) { return y == T(0) ? T(0) : d / (T(2) * y); });
    })};
  }
  bool differentiable_backward() const override { return true; }
  // Forward: dY = dV / (2 y), 0 where y is 0 (the backward's convention)
  std::vector<Tensor> jvp(const std::vector<Tensor>&, const std::vector<Tensor>& t,
                          const std::vector<Tensor>& out) override {
    const Tensor zero = eq(out[0], 0.0);
    return {masked_fill(div(t[0], mul(masked_fill(out[0], zero, 1.0), 2.0)), zero, 0.0)};
  }
  SavedTensor y_;
};

}  // namespace

Tensor std(const Tensor& x, std::vector<int64_t> dims, bool unbiased, bool keepdim) {
  constexpr std::string_view op = "std";
  profile::Scope scope(op);
  check_floating(x, op);
  reduced_dims(x, dims, op);  // errors name std, not var
  const Tensor v = var(x, std::move(dims), unbiased, keepdim);
  Tensor out;
  if (!v.device().is_cpu()) {
    NoGradGuard no_grad;  // the Node below records std
    out = sqrt(v);
  } else {
    out = dispatch_float(v.dtype(), op,
                         [&]<class T>() { return map<T, T>(v, [](T e) { return std::sqrt(e); }); });
  }
  return record<StdBackward>(op, out, {v}, out);
}

// --- logsumexp

namespace {

// y = log(sum(exp(x)) over the reduced dims):  dX = dY exp(x - y), dY and y broadcast back
struct LogsumexpBackward final : Node {
  LogsumexpBackward(const Tensor& x, const Tensor& y, std::vector<bool> reduce, bool keepdim)
      : reduce_(std::move(reduce)), keepdim_(keepdim) {
    save(x_, x), save_output(y_, y);
  }
  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    if (is_grad_enabled() || !grads[0].device().is_cpu()) {  // create_graph, a device: in ops
      Tensor g = grads[0], y = y_.get();
      if (!keepdim_)
        for (size_t d = 0; d < reduce_.size(); ++d)
          if (reduce_[d])
            g = unsqueeze(g, static_cast<int64_t>(d)), y = unsqueeze(y, static_cast<int64_t>(d));
      return {mul(g, exp(sub(x_.get(), y)))};
    }
    const Tensor& x = x_.get();
    const Tensor g = expand_reduced(grads[0], x.shape(), reduce_, keepdim_);
    const Tensor y = expand_reduced(y_.get(), x.shape(), reduce_, keepdim_);
    Tensor grad_x = empty(x.shape(), grads[0].dtype(), grads[0].device());
    dispatch_float(grad_x.dtype(), op(), [&]<class T>() {
      ternary_into<T, T, T, T>(g, x, y, grad_x, [](T d, T v, T l) { return d * std::exp(v - l); });
    });
    return {grad_x};
  }
  bool differentiable_backward() const override { return true; }
  // Forward: dY = sum(dX exp(x - y) over the reduced dims), y broadcast back
  std::vector<Tensor> jvp(const std::vector<Tensor>& in, const std::vector<Tensor>& t,
                          const std::vector<Tensor>& out) override {
    Tensor y = out[0];
    std::vector<int64_t> dims;
    for (size_t d = 0; d < reduce_.size(); ++d) {
      if (!reduce_[d]) continue;
      dims.push_back(static_cast<int64_t>(d));
      if (!keepdim_) y = unsqueeze(y, static_cast<int64_t>(d));
    }
    const Tensor weighted = mul(t[0], exp(sub(in[0], y)));
    if (dims.empty()) return {reshape(weighted, out[0].shape())};  // a 0-d x
    return {sum(weighted, dims, keepdim_)};
  }
  std::vector<bool> reduce_;
  bool keepdim_;
  SavedTensor x_, y_;
};

}  // namespace

// Row by row over a copy with the kept dims first and the reduced ones last: m + log(sum(exp(x -
// m))) with m the row's largest element, or 0 when that is ±inf (a row of -inf gives -inf, one
// holding +inf gives +inf, NaN gives NaN), and -inf for a row of no element, as torch.
Tensor logsumexp(const Tensor& x, std::vector<int64_t> dims, bool keepdim) {
  constexpr std::string_view op = "logsumexp";
  profile::Scope scope(op);
  check_defined(x, op);
  const Tensor in = as_floating(x);
  const std::vector<bool> reduce = reduced_dims(in, dims, op);
  Shape shape, strides;  // kept dims, then reduced ones
  for (bool reduced : {false, true})
    for (int64_t d = 0; d < in.dim(); ++d)
      if (reduce[d] == reduced) shape.push_back(in.size(d)), strides.push_back(in.stride(d));
  const Tensor rows = make_view(in.detach(), shape, strides, in.storage_offset()).contiguous();
  Tensor out = empty(reduced_shape(in.shape(), reduce, keepdim), in.dtype(), in.device());
  const int64_t n = reduced_count(in, reduce), count = out.numel();
  if (!in.device().is_cpu()) {
    if (n == 0) {
      copy_into(out, full({}, -std::numeric_limits<double>::infinity(), in.dtype(), in.device()));
    } else {
      const Tensor table = make_view(rows, {count, n}, {n, 1}, 0);
      rows_on_device(cuda::kernels::RowOp::LogSumExp, in.dtype(), 1, {table},
                     {per_row(make_view(out, {count, 1}, {1, 1}, 0), {count, n}, 1)}, op);
    }
    return record<LogsumexpBackward>(op, out, {x}, in, out, reduce, keepdim);
  }
  dispatch_float(in.dtype(), op, [&]<class T>() {
    const T* px = rows.data<T>();
    T* po = out.data<T>();
    parallel_for(
        count,
        [&](int64_t begin, int64_t end) {
          for (int64_t i = begin; i < end; ++i) {
            const T* row = px + i * n;
            T m = -std::numeric_limits<T>::infinity();
            for (int64_t j = 0; j < n; ++j)
              if (greater(row[j], m)) m = row[j];
            if (std::isinf(m)) m = T(0);
            double s = 0;
            for (int64_t j = 0; j < n; ++j) s += static_cast<double>(std::exp(row[j] - m));
            po[i] = static_cast<T>(std::log(s)) + m;
          }
        },
        row_grain(n));
  });
  return record<LogsumexpBackward>(op, out, {x}, in, out, reduce, keepdim);
}

// --- cumsum

namespace {

// out = the running sum of x along dim (from the end when `reverse`), accumulated in double for
// floating tensors and in wrapping uint64 for integral ones; out is a new contiguous tensor of
// x's shape and dtype `out_dtype` (x's, or Int64 for integral x).
Tensor cumsum_impl(const Tensor& x, int64_t dim, bool reverse, DType out_dtype) {
  Tensor out = empty(x.shape(), out_dtype, x.device());
  if (x.numel() == 0) return out;
  if (x.dim() == 0) {
    copy_into(out, x);
    return out;
  }
  if (!x.device().is_cpu()) {
    rows_on_device(cuda::kernels::RowOp::Cumsum, is_floating(out_dtype) ? kFloat64 : kInt64, dim,
                   {x}, {out}, "cumsum", reverse);
    return out;
  }
  const int64_t n = x.size(dim), sx = x.stride(dim), so = out.stride(dim);
  Shape outer = x.shape();
  outer[dim] = 1;
  dispatch_all(x.dtype(), [&]<class T>() {
    dispatch_all(out_dtype, [&]<class O>() {
      if constexpr (std::is_same_v<O, float> || std::is_same_v<O, double> ||
                    std::is_same_v<O, int64_t>) {
        using Acc = std::conditional_t<std::is_floating_point_v<O>, double, uint64_t>;
        const T* px = x.data<T>();
        O* po = out.data<O>();
        StridedLoop<2> loop(outer, {out.strides(), x.strides()});
        loop.run([&](const auto& off, int64_t len, const auto& st) {
          for (int64_t i = 0; i < len; ++i) {
            const T* in = px + off[1] + i * st[1];
            O* o = po + off[0] + i * st[0];
            Acc acc = 0;
            for (int64_t k = 0; k < n; ++k) {
              const int64_t j = reverse ? n - 1 - k : k;
              acc += static_cast<Acc>(in[j * sx]);
              o[j * so] = static_cast<O>(acc);
            }
          }
        });
      }
    });
  });
  return out;
}

Tensor scan(const Tensor& x, int64_t dim, bool reverse);

// y = cumsum(x, dim):  dX = the running sum of dY along dim from the end; and the other way
// round for that reversed sum, the op of the backward under create_graph (`reverse`)
struct CumsumBackward final : Node {
  CumsumBackward(int64_t dim, bool reverse) : dim_(dim), reverse_(reverse) {}
  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    if (is_grad_enabled()) return {scan(grads[0], dim_, !reverse_)};  // create_graph
    return {cumsum_impl(grads[0], dim_, !reverse_, grads[0].dtype())};
  }
  bool differentiable_backward() const override { return true; }
  // Forward: dY = the same running sum of dX (the op is linear)
  std::vector<Tensor> jvp(const std::vector<Tensor>&, const std::vector<Tensor>& t,
                          const std::vector<Tensor>&) override {
    return {scan(t[0], dim_, reverse_)};
  }
  int64_t dim_;
  bool reverse_;
};

// The running sum of x along dim (wrapped), from the end when `reverse` (op reverse_cumsum).
Tensor scan(const Tensor& x, int64_t dim, bool reverse) {
  const DType out_dtype = is_floating(x.dtype()) ? x.dtype() : kInt64;
  return record<CumsumBackward>(reverse ? "reverse_cumsum" : "cumsum",
                                cumsum_impl(x, dim, reverse, out_dtype), {x}, dim, reverse);
}

}  // namespace

Tensor cumsum(const Tensor& x, int64_t dim) {
  constexpr std::string_view op = "cumsum";
  profile::Scope scope(op);
  check_defined(x, op);
  return scan(x, wrap_dim(dim, x.dim(), op), false);
}

Tensor sum_to(const Tensor& x, const Shape& shape) {
  constexpr std::string_view op = "sum_to";
  profile::Scope scope(op);
  if (x.shape() == shape) return x;
  EMBER_CHECK(broadcast_shapes(x.shape(), shape, op) == x.shape(),
              "{}: shape {} is not a broadcast of {}", op, x.shape(), shape);
  const size_t lead = x.shape().size() - shape.size();
  std::vector<bool> reduce(x.dim(), false);
  for (size_t d = 0; d < x.shape().size(); ++d)
    reduce[d] = d < lead || (shape[d - lead] == 1 && x.shape()[d] != 1);
  const Tensor summed = sum_impl(x, reduce, true);  // keepdim: the same elements in `shape`
  return record<SumBackward>(op, make_view(summed, shape, contiguous_strides(shape), 0), {x},
                             reduce, true);
}

// --- max and argmax

namespace {

// values/indices (keepdim layout) of the largest element along `dim`.
template <class T>
void max_kernel(const Tensor& x, int64_t dim, T* values, int64_t* indices) {
  const int64_t n = x.size(dim), stride = x.stride(dim);
  Shape outer_shape = x.shape(), outer_strides = x.strides();
  outer_shape[dim] = 1;
  const Shape out_strides = contiguous_strides(outer_shape);
  const T* px = x.data<T>();
  StridedLoop<2> loop(outer_shape, {out_strides, outer_strides});
  loop.run_serial([&](const auto& off, int64_t len, const auto& st) {
    for (int64_t i = 0; i < len; ++i) {
      const T* row = px + off[1] + i * st[1];
      int64_t best = 0;
      for (int64_t j = 1; j < n; ++j)
        if (greater(row[j * stride], row[best * stride])) best = j;
      values[off[0] + i * st[0]] = row[best * stride];
      indices[off[0] + i * st[0]] = best;
    }
  });
}

// values = max(x, dim):  dX[argmax] = dValues, 0 elsewhere; under create_graph
// where(argmax mask, dValues with dim kept, 0)
struct MaxBackward final : Node {
  MaxBackward(int64_t dim, const Tensor& indices) : dim_(dim) { save(indices_, indices); }
  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    const Shape& in = input_shapes[0];
    if (!grads[0].device().is_cpu()) {
      // A device: dY where the position along dim is the index (a one-hot mask by comparison)
      Shape kept = in, along(in.size(), 1);
      kept[dim_] = 1;
      along[dim_] = in[dim_];
      const Tensor positions =
          reshape(arange(0, static_cast<double>(in[dim_]), 1, kInt64, grads[0].device()), along);
      const Tensor mask = eq(positions, reshape(indices_.get(), kept));
      return {where(mask, reshape(grads[0], kept), zeros({}, grads[0].dtype(), grads[0].device()))};
    }
    const Tensor idx = indices_.get().contiguous();
    const int64_t* pi = idx.data<int64_t>();
    int64_t inner = 1;
    for (size_t d = dim_ + 1; d < in.size(); ++d) inner *= in[d];
    const int64_t n = in[dim_];
    // The offset in x (contiguous) of the k-th maximum.
    const auto at = [&](int64_t k) { return (k / inner * n + pi[k]) * inner + k % inner; };
    if (is_grad_enabled()) {  // create_graph
      Tensor mask = zeros(in, kBool);
      bool* pm = mask.data<bool>();
      for (int64_t k = 0; k < idx.numel(); ++k) pm[at(k)] = true;
      Shape kept = in;
      kept[dim_] = 1;
      return {where(mask, reshape(grads[0], kept), zeros({}, grads[0].dtype(), grads[0].device()))};
    }
    const Tensor g = grads[0].contiguous();
    Tensor grad_x = zeros(in, g.dtype(), g.device());
    dispatch_float(g.dtype(), op(), [&]<class T>() {
      const T* pg = g.data<T>();
      T* px = grad_x.data<T>();
      for (int64_t k = 0; k < g.numel(); ++k) px[at(k)] = pg[k];
    });
    return {grad_x};
  }
  bool differentiable_backward() const override { return true; }
  // Forward: dValues = gather(dX, dim, argmax) (indices with dim kept), in values' shape
  std::vector<Tensor> jvp(const std::vector<Tensor>&, const std::vector<Tensor>& t,
                          const std::vector<Tensor>& out) override {
    Shape kept = t[0].shape();
    kept[dim_] = 1;
    return {reshape(gather(t[0], dim_, reshape(indices_.get(), kept)), out[0].shape())};
  }
  int64_t dim_;
  SavedTensor indices_;
};

// max along a dim for `op` (max or argmax, whose errors name it).
MaxResult max_along(const Tensor& x, int64_t dim, bool keepdim, std::string_view op) {
  profile::Scope scope(op);
  check_defined(x, op);
  const int64_t d = wrap_dim(dim, x.dim(), op);
  EMBER_CHECK(x.dim() == 0 || x.size(d) > 0, "{}: cannot reduce dim {} of size 0 (shape {})", op, d,
              x.shape());
  if (x.dim() == 0) return {x.clone(), zeros({}, kInt64, x.device())};
  Shape keep = x.shape();
  keep[d] = 1;
  Tensor values = empty(keep, x.dtype(), x.device()), indices = empty(keep, kInt64, x.device());
  if (!x.device().is_cpu()) {
    EMBER_CHECK(x.dtype() != kBool, "{}: expected a numeric tensor, got {}", op, x.dtype());
    rows_on_device(cuda::kernels::RowOp::Max, x.dtype(), d, {x},
                   {per_row(values, x.shape(), d), per_row(indices, x.shape(), d)}, op);
  } else {
    dispatch_numeric(x.dtype(), op, [&]<class T>() {
      max_kernel<T>(x, d, values.data<T>(), indices.data<int64_t>());
    });
  }
  if (!keepdim) {
    Shape squeezed = x.shape();
    squeezed.erase(squeezed.begin() + d);
    values = make_view(values, squeezed, contiguous_strides(squeezed), 0);
    indices = make_view(indices, squeezed, contiguous_strides(squeezed), 0);
  }
  record<MaxBackward>("max", {&values}, {x}, d, indices);
  return {values, indices};
}

}  // namespace

MaxResult max(const Tensor& x, int64_t dim, bool keepdim) {
  return max_along(x, dim, keepdim, "max");
}

Tensor argmax(const Tensor& x, int64_t dim, bool keepdim) {
  NoGradGuard no_grad;
  return max_along(x, dim, keepdim, "argmax").indices;
}

namespace {

// y = max(x):  dX = dY / k at each of the k elements equal to y, 0 elsewhere (in ops)
struct MaxAllBackward final : Node {
  MaxAllBackward(const Tensor& x, const Tensor& y) { save(x_, x), save_output(y_, y); }
  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    const Tensor mask = eq(x_.get(), y_.get());
    const double ties = sum(mask).item<double>();
    return {mul(mask.to(grads[0].dtype()), div(grads[0], ties))};
  }
  bool differentiable_backward() const override { return true; }
  // Forward: dY = sum(dX at the k elements equal to y) / k, the mean of the ties' tangents
  std::vector<Tensor> jvp(const std::vector<Tensor>& in, const std::vector<Tensor>& t,
                          const std::vector<Tensor>& out) override {
    const Tensor mask = eq(in[0], out[0]);
    const double ties = sum(mask).item<double>();
    return {div(sum(mul(t[0], mask.to(t[0].dtype()))), ties)};
  }
  SavedTensor x_, y_;
};

}  // namespace

Tensor max(const Tensor& x) {
  constexpr std::string_view op = "max";
  profile::Scope scope(op);
  check_defined(x, op);
  EMBER_CHECK(x.numel() > 0, "{}: cannot reduce an empty tensor of shape {}", op, x.shape());
  Tensor out = empty({}, x.dtype(), x.device());
  if (!x.device().is_cpu()) {
    EMBER_CHECK(x.dtype() != kBool, "{}: expected a numeric tensor, got {}", op, x.dtype());
    const Tensor flat = make_view(x.contiguous(), {x.numel()}, {1}, 0);
    rows_on_device(cuda::kernels::RowOp::Max, x.dtype(), 0, {flat},
                   {per_row(make_view(out, {1}, {1}, 0), {x.numel()}, 0),
                    per_row(zeros({1}, kInt64, x.device()), {x.numel()}, 0)},
                   op);
    return record<MaxAllBackward>(op, out, {x}, x, out);
  }
  dispatch_numeric(x.dtype(), op, [&]<class T>() {
    const Tensor c = x.contiguous();
    const T* p = c.data<T>();
    T best = p[0];
    for (int64_t i = 1; i < c.numel(); ++i)
      if (greater(p[i], best)) best = p[i];
    *out.data<T>() = best;
  });
  return record<MaxAllBackward>(op, out, {x}, x, out);
}

}  // namespace ember
