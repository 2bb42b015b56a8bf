// pad and interpolate. Both are linear maps of x:
//   - constant pad fills a new tensor and copies x's overlap into it; its backward is pad
//     again with the pads negated (a crop where x was padded, zeros where x was cropped);
//   - reflect, replicate and circular pad and every interpolate mode act on each spatial dim in
//     turn as "taps" (Note [Taps]): output position i along the dim reads x at one or two
//     positions of the input, with weights. A tap map's adjoint (a sum of the output's gradient
//     into the input positions it read) is an op too, whose derivative is the map again, so both
//     differentiate any number of times. CPU kernels walk x as (outer, n, inner) rows; on a
//     device the map is index_select and elementwise ops, whose gradients follow.
// Being linear, each op's forward-mode tangent is the op itself on the input's tangent (constant
// pad's with zeros for the fill).
#include "ops/resample.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include "graph/autograd.h"
#include "graph/creation.h"
#include "graph/profile.h"
#include "graph/strided.h"
#include "ops/common.h"
#include "ops/elementwise.h"

namespace ember {

namespace {

// Note [Taps]
// A resampling of one dim of size n into m: output i = w0[i] · x[idx0[i]] + w1[i] · x[idx1[i]]
// (two taps: linear interpolation), or x[idx0[i]] (one tap, idx1 empty: nearest, padding). The
// weights are computed in the element type of the input (torch's order and rounding; a Float32
// weight is exact in double) and kept in double.
struct Taps {
  int64_t n = 0;  // the input's size along the dim
  std::vector<int64_t> idx0, idx1;
  std::vector<double> w0, w1;
  int64_t m() const { return static_cast<int64_t>(idx0.size()); }
  bool two() const { return !idx1.empty(); }
};
using TapsPtr = std::shared_ptr<const Taps>;

// x's shape around `dim`: (outer, n, inner).
struct Around {
  int64_t outer = 1, n = 1, inner = 1;
};
Around around(const Shape& shape, int64_t dim) {
  Around a;
  for (int64_t d = 0; d < dim; ++d) a.outer *= shape[d];
  a.n = shape[dim];
  for (size_t d = dim + 1; d < shape.size(); ++d) a.inner *= shape[d];
  return a;
}

// y (outer, m, inner) from x (outer, n, inner), both contiguous: y[o, i] = Σ_taps w x[o, idx].
template <class T>
void taps_forward(const T* x, T* y, const Taps& tp, Around a) {
  const int64_t m = tp.m(), n = a.n, inner = a.inner;
  const std::vector<T> w0(tp.w0.begin(), tp.w0.end()), w1(tp.w1.begin(), tp.w1.end());
  parallel_for(
      a.outer,
      [&](int64_t begin, int64_t end) {
        for (int64_t o = begin; o < end; ++o) {
          const T* xo = x + o * n * inner;
          T* yo = y + o * m * inner;
          if (inner == 1) {  // the last dim: a gather along the row
            const int64_t *i0 = tp.idx0.data(), *i1 = tp.idx1.data();
            if (!tp.two())
              for (int64_t i = 0; i < m; ++i) yo[i] = xo[i0[i]];
            else
              for (int64_t i = 0; i < m; ++i) yo[i] = w0[i] * xo[i0[i]] + w1[i] * xo[i1[i]];
            continue;
          }
          for (int64_t i = 0; i < m; ++i) {
            const T* p = xo + tp.idx0[i] * inner;
            T* yr = yo + i * inner;
            if (!tp.two()) {
              std::copy(p, p + inner, yr);
              continue;
            }
            const T* q = xo + tp.idx1[i] * inner;
            const T u = w0[i], v = w1[i];
#pragma omp simd
            for (int64_t j = 0; j < inner; ++j) yr[j] = u * p[j] + v * q[j];
          }
        }
      },
      row_grain(m * inner));
}

// The adjoint: dx (outer, n, inner) zeroed, g (outer, m, inner) contiguous:
// dx[o, idx] += w g[o, i] for every tap of every i.
template <class T>
void taps_adjoint(const T* g, T* dx, const Taps& tp, Around a) {
  const int64_t m = tp.m(), n = a.n, inner = a.inner;
  const std::vector<T> w0(tp.w0.begin(), tp.w0.end()), w1(tp.w1.begin(), tp.w1.end());
  parallel_for(
      a.outer,
      [&](int64_t begin, int64_t end) {
        for (int64_t o = begin; o < end; ++o) {
          const T* go = g + o * m * inner;
          T* dxo = dx + o * n * inner;
          if (inner == 1) {  // the last dim: a scatter along the row
            const int64_t *i0 = tp.idx0.data(), *i1 = tp.idx1.data();
            if (!tp.two())
              for (int64_t i = 0; i < m; ++i) dxo[i0[i]] += go[i];
            else
              for (int64_t i = 0; i < m; ++i) {
                dxo[i0[i]] += w0[i] * go[i];
                dxo[i1[i]] += w1[i] * go[i];
              }
            continue;
          }
          for (int64_t i = 0; i < m; ++i) {
            const T* gr = go + i * inner;
            T* p = dxo + tp.idx0[i] * inner;
            if (!tp.two()) {
#pragma omp simd
              for (int64_t j = 0; j < inner; ++j) p[j] += gr[j];
              continue;
            }
            T* q = dxo + tp.idx1[i] * inner;
            const T u = w0[i], v = w1[i];
            for (int64_t j = 0; j < inner; ++j) p[j] += u * gr[j];
            for (int64_t j = 0; j < inner; ++j) q[j] += v * gr[j];
          }
        }
      },
      row_grain(m * inner));
}

Tensor taps_along(const Tensor& x, int64_t dim, const TapsPtr& tp, std::string_view op,
                  std::string_view adjoint_op);
Tensor taps_adjoint_along(const Tensor& g, int64_t dim, const TapsPtr& tp, std::string_view op,
                          std::string_view adjoint_op);

// taps_along's Node: dX = the adjoint of the taps applied to the gradient (an op).
struct TapsBackward final : Node {
  TapsBackward(int64_t dim, TapsPtr tp, std::string_view op, std::string_view adjoint_op)
      : dim_(dim), taps_(std::move(tp)), op_name_(op), adjoint_op_(adjoint_op) {}
  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    return {taps_adjoint_along(grads[0], dim_, taps_, op_name_, adjoint_op_)};
  }
  bool differentiable_backward() const override { return true; }
  // Forward: the taps on the tangent (they are linear)
  std::vector<Tensor> jvp(const std::vector<Tensor>&, const std::vector<Tensor>& t,
                          const std::vector<Tensor>&) override {
    return {taps_along(t[0], dim_, taps_, op_name_, adjoint_op_)};
  }
  int64_t dim_;
  TapsPtr taps_;
  std::string_view op_name_, adjoint_op_;
};

// taps_adjoint_along's Node: its derivative is the taps themselves (a linear map's adjoint's
// adjoint).
struct TapsAdjointBackward final : Node {
  TapsAdjointBackward(int64_t dim, TapsPtr tp, std::string_view op, std::string_view adjoint_op)
      : dim_(dim), taps_(std::move(tp)), op_name_(op), adjoint_op_(adjoint_op) {}
  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    return {taps_along(grads[0], dim_, taps_, op_name_, adjoint_op_)};
  }
  bool differentiable_backward() const override { return true; }
  // Forward: the adjoint on the tangent (it is linear)
  std::vector<Tensor> jvp(const std::vector<Tensor>&, const std::vector<Tensor>& t,
                          const std::vector<Tensor>&) override {
    return {taps_adjoint_along(t[0], dim_, taps_, op_name_, adjoint_op_)};
  }
  int64_t dim_;
  TapsPtr taps_;
  std::string_view op_name_, adjoint_op_;
};

// A (m) tensor of weights seen along `dim` of an input of `ndim` dims: (m, 1, …, 1).
Tensor weights_along(const std::vector<double>& w, int64_t dim, int64_t ndim, const Tensor& like) {
  Shape shape(static_cast<size_t>(ndim - dim), 1);
  shape[0] = static_cast<int64_t>(w.size());
  return from_vector(w, shape, like.dtype(), like.device());
}

// x with its dim `dim` resampled by the taps (op names the op for the profiler and its Node).
Tensor taps_along(const Tensor& x, int64_t dim, const TapsPtr& tp, std::string_view op,
                  std::string_view adjoint_op) {
  if (!x.device().is_cpu()) {
    Tensor y = index_select(x, dim, from_vector(tp->idx0, {tp->m()}, x.device()));
    if (!tp->two()) return y;
    const Tensor z = index_select(x, dim, from_vector(tp->idx1, {tp->m()}, x.device()));
    return add(mul(y, weights_along(tp->w0, dim, x.dim(), x)),
               mul(z, weights_along(tp->w1, dim, x.dim(), x)));
  }
  Shape shape = x.shape();
  shape[dim] = tp->m();
  Tensor out = empty(shape, x.dtype(), x.device());
  if (out.numel() > 0) {
    Tensor xc;
    {
      NoGradGuard no_grad;
      xc = x.contiguous();
    }
    dispatch_float(x.dtype(), op, [&]<class T>() {
      taps_forward<T>(xc.data<T>(), out.data<T>(), *tp, around(x.shape(), dim));
    });
  }
  return record<TapsBackward>(op, out, {x}, dim, tp, op, adjoint_op);
}

// g (the output's shape along dim) summed back into the input positions the taps read. Only the
// CPU's taps_along records a TapsBackward (a device's map is index_select and elementwise ops,
// differentiated as such), so g is on the CPU.
Tensor taps_adjoint_along(const Tensor& g, int64_t dim, const TapsPtr& tp, std::string_view op,
                          std::string_view adjoint_op) {
  Shape shape = g.shape();
  shape[dim] = tp->n;
  Tensor dx = zeros(shape, g.dtype(), g.device());
  if (g.numel() > 0) {
    Tensor gc;
    {
      NoGradGuard no_grad;
      gc = g.contiguous();
    }
    dispatch_float(g.dtype(), adjoint_op, [&]<class T>() {
      taps_adjoint<T>(gc.data<T>(), dx.data<T>(), *tp, around(shape, dim));
    });
  }
  return record<TapsAdjointBackward>(adjoint_op, dx, {g}, dim, tp, op, adjoint_op);
}

// --- pad

// constant pad's Node: dX = pad(g, -pads) (the overlap back out of the gradient).
struct ConstantPadBackward final : Node {
  explicit ConstantPadBackward(IntList pads) : pads_(std::move(pads)) {
    for (int64_t& p : pads_) p = -p;
  }
  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    return {pad(grads[0], pads_, "constant", 0)};
  }
  bool differentiable_backward() const override { return true; }
  // Forward: dY = pad(dX, pads) with zeros (the fill value is a constant)
  std::vector<Tensor> jvp(const std::vector<Tensor>&, const std::vector<Tensor>& t,
                          const std::vector<Tensor>&) override {
    IntList pads = pads_;
    for (int64_t& p : pads) p = -p;
    return {pad(t[0], pads, "constant", 0)};
  }
  IntList pads_;  // negated
};

Tensor constant_pad(const Tensor& x, const IntList& pads, double value) {
  constexpr std::string_view op = "pad";
  Shape shape = x.shape();
  const int64_t k = static_cast<int64_t>(pads.size()) / 2;
  // the overlap: along each padded dim, `len` elements of x from max(-left, 0) go to the
  // output from max(left, 0)
  Tensor src = x, dst;
  std::vector<int64_t> from(k), to(k), len(k);
  for (int64_t j = 0; j < k; ++j) {
    const int64_t d = x.dim() - 1 - j, l = pads[2 * j], r = pads[2 * j + 1], n = x.size(d);
    len[j] = n - std::max<int64_t>(-l, 0) - std::max<int64_t>(-r, 0);
    EMBER_CHECK(len[j] >= 0,
                "pad: padding ({}, {}) crops more than the {} elements of dim {} of the input of "
                "shape {}",
                l, r, n, d, x.shape());
    shape[d] = n + l + r;
    from[j] = std::max<int64_t>(-l, 0), to[j] = std::max<int64_t>(l, 0);
  }
  Tensor out = full(shape, value, x.dtype(), x.device());
  dst = out;
  for (int64_t j = 0; j < k; ++j) {
    const int64_t d = x.dim() - 1 - j;
    src = narrow_view(src, d, from[j], len[j]);
    dst = narrow_view(dst, d, to[j], len[j]);
  }
  if (src.numel() > 0) {
    NoGradGuard no_grad;
    dst.copy_(src);
  }
  return record<ConstantPadBackward>(op, out, {x}, pads);
}

// The taps of one padded dim of size n, padded by (l, r) (checked), for a non-constant mode.
TapsPtr pad_taps(int64_t n, int64_t l, int64_t r, std::string_view mode) {
  auto tp = std::make_shared<Taps>();
  tp->n = n;
  if (mode == "circular") {
    // torch: the crops first, then the wrap around what is left (k elements from a)
    const int64_t a = std::max<int64_t>(-l, 0), k = n - a - std::max<int64_t>(-r, 0);
    const int64_t lp = std::max<int64_t>(l, 0), rp = std::max<int64_t>(r, 0);
    for (int64_t i = 0; i < k + lp + rp; ++i) tp->idx0.push_back(a + ((i - lp) % k + k) % k);
    return tp;
  }
  for (int64_t i = 0; i < n + l + r; ++i) {
    int64_t j = i - l;
    if (mode == "reflect") {
      if (j < 0) j = -j;
      if (j >= n) j = 2 * (n - 1) - j;
    } else {
      j = std::clamp<int64_t>(j, 0, n - 1);
    }
    tp->idx0.push_back(j);
  }
  return tp;
}

// The checks of reflect, replicate and circular padding (torch's rules) of one dim.
void check_pad_dim(const Tensor& x, int64_t d, int64_t l, int64_t r, std::string_view mode) {
  const int64_t n = x.size(d);
  if (mode == "reflect")
    EMBER_CHECK(l < n && r < n,
                "pad: reflect padding ({}, {}) must be less than the size {} of dim {} of the "
                "input of shape {}",
                l, r, n, d, x.shape());
  if (mode == "circular") {
    const int64_t k = n - std::max<int64_t>(-l, 0) - std::max<int64_t>(-r, 0);
    EMBER_CHECK(k >= 0 && l <= k && r <= k,
                "pad: circular padding ({}, {}) wraps around dim {} of size {} more than once "
                "(input of shape {})",
                l, r, d, n, x.shape());
    return;
  }
  EMBER_CHECK(n + l + r >= 1,
              "pad: {} padding ({}, {}) leaves no element of dim {} of size {} (input of shape {})",
              mode, l, r, d, n, x.shape());
}

}  // namespace

Tensor pad(const Tensor& x, IntList pads, std::string_view mode, double value) {
  constexpr std::string_view op = "pad";
  profile::Scope scope(op);
  check_defined(x, op);
  const int64_t count = static_cast<int64_t>(pads.size()), k = count / 2;
  EMBER_CHECK(count % 2 == 0, "pad: the padding must have an even number of values, got {} ({})",
              count, pads);
  EMBER_CHECK(k <= x.dim(), "pad: {} values pad {} dims, more than the input of shape {} has",
              count, k, x.shape());
  if (mode == "constant") {
    EMBER_CHECK(is_floating(x.dtype()) || value == std::trunc(value),
                "pad: value {} for a {} input", value, x.dtype());
    return constant_pad(x, pads, value);
  }
  EMBER_CHECK(mode == "reflect" || mode == "replicate" || mode == "circular",
              "pad: unknown mode \"{}\" (expected \"constant\", \"reflect\", \"replicate\" or "
              "\"circular\")",
              mode);
  check_floating(x, op);
  EMBER_CHECK(value == 0, "pad: mode \"{}\" takes no value, got {}", mode, value);
  EMBER_CHECK(k >= 1 && k <= 3 && (x.dim() == k + 1 || x.dim() == k + 2),
              "pad: mode \"{}\" pads the last 1 to 3 dims of a batched (N, C, …) or unbatched "
              "(C, …) input: got {} values ({}) for an input of shape {}",
              mode, count, pads, x.shape());
  if (mode != "circular")
    for (int64_t d = 1; d < x.dim(); ++d)
      EMBER_CHECK(x.size(d) > 0,
                  "pad: mode \"{}\" needs an input whose dims (but the first) are non-empty, "
                  "got shape {}",
                  mode, x.shape());
  for (int64_t j = 0; j < k; ++j)
    check_pad_dim(x, x.dim() - 1 - j, pads[2 * j], pads[2 * j + 1], mode);
  Tensor y = x;
  for (int64_t j = 0; j < k; ++j) {
    const int64_t d = x.dim() - 1 - j;
    y = taps_along(y, d, pad_taps(x.size(d), pads[2 * j], pads[2 * j + 1], mode), op,
                   "pad_backward");
  }
  return y;
}

// --- interpolate

namespace {

// torch's legacy nearest (nearest_idx): the same index, twice it halved, else
// min(floor(i · scale), in - 1) with scale = in / out in float.
TapsPtr nearest_taps(int64_t in, int64_t out) {
  auto tp = std::make_shared<Taps>();
  tp->n = in;
  const float scale = static_cast<float>(in) / static_cast<float>(out);
  for (int64_t i = 0; i < out; ++i) {
    if (out == in)
      tp->idx0.push_back(i);
    else if (out == 2 * in)
      tp->idx0.push_back(i >> 1);
    else
      tp->idx0.push_back(
          std::min(static_cast<int64_t>(std::floor(static_cast<float>(i) * scale)), in - 1));
  }
  return tp;
}

// torch's linear weights (area_pixel_compute_scale, area_pixel_compute_source_index,
// compute_indices_weights_linear) in T: src = scale · i (align_corners: scale = (in - 1) /
// (out - 1), 0 for one output) or max(scale (i + 0.5) - 0.5, 0) (scale = in / out); the taps
// floor(src) and the next one (the same at the end), weights 1 - λ and λ = clamp(src - floor).
template <class T>
TapsPtr linear_taps(int64_t in, int64_t out, bool align_corners) {
  auto tp = std::make_shared<Taps>();
  tp->n = in;
  const T scale = align_corners
                      ? (out > 1 ? static_cast<T>(in - 1) / static_cast<T>(out - 1) : T(0))
                      : static_cast<T>(in) / static_cast<T>(out);
  for (int64_t i = 0; i < out; ++i) {
    T src = align_corners ? scale * static_cast<T>(i)
                          : scale * (static_cast<T>(i) + static_cast<T>(0.5)) - static_cast<T>(0.5);
    if (!align_corners && src < 0) src = 0;
    const int64_t i0 = static_cast<int64_t>(src);
    const int64_t i1 = i0 + (i0 < in - 1 ? 1 : 0);
    const T l1 = std::min(std::max(src - static_cast<T>(i0), T(0)), T(1)), l0 = T(1) - l1;
    tp->idx0.push_back(i0), tp->idx1.push_back(i1);
    tp->w0.push_back(static_cast<double>(l0)), tp->w1.push_back(static_cast<double>(l1));
  }
  return tp;
}

}  // namespace

Tensor interpolate(const Tensor& x, IntList size, std::string_view mode,
                   std::optional<bool> align_corners) {
  constexpr std::string_view op = "interpolate";
  profile::Scope scope(op);
  check_floating(x, op);
  EMBER_CHECK(mode == "nearest" || mode == "linear" || mode == "bilinear",
              "interpolate: unknown mode \"{}\" (expected \"nearest\", \"linear\" or "
              "\"bilinear\")",
              mode);
  EMBER_CHECK(mode != "nearest" || !align_corners.has_value(),
              "interpolate: align_corners can only be set with the interpolating modes linear "
              "and bilinear, not \"{}\"",
              mode);
  const int64_t want = mode == "linear" ? 3 : mode == "bilinear" ? 4 : 0;
  EMBER_CHECK(want != 0 ? x.dim() == want : x.dim() >= 3 && x.dim() <= 5,
              "interpolate: mode \"{}\" needs a {} input (N, C, spatial…), got shape {}", mode,
              want == 3   ? "3-D"
              : want == 4 ? "4-D"
                          : "3-D to 5-D",
              x.shape());
  const int64_t k = x.dim() - 2;
  const IntList out = expand_param(size, k, op, "size");
  for (int64_t d = 1; d < x.dim(); ++d)
    EMBER_CHECK(x.size(d) > 0,
                "interpolate: expected an input whose dims (but the batch's) are non-empty, got "
                "shape {}",
                x.shape());
  for (int64_t j = 0; j < k; ++j)
    EMBER_CHECK(out[j] > 0, "interpolate: output size {} must be positive (size {}, input {})",
                out[j], out, x.shape());
  Tensor y = x;
  for (int64_t j = k - 1; j >= 0; --j) {
    const int64_t d = j + 2, in = x.size(d);
    const TapsPtr tp = mode == "nearest" ? nearest_taps(in, out[j])
                       : x.dtype() == kFloat32
                           ? linear_taps<float>(in, out[j], align_corners.value_or(false))
                           : linear_taps<double>(in, out[j], align_corners.value_or(false));
    y = taps_along(y, d, tp, op, "interpolate_backward");
  }
  return y;
}

}  // namespace ember
