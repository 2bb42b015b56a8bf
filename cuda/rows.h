// Row kernels of the CUDA backend: ops that run along one dim of a tensor, a row at a time
// (softmax and log_softmax with their backwards, max/min with their index, cumsum, logsumexp,
// the moments of layer_norm), written once as host-and-device code as cuda/elementwise.h. A row
// is every index of the other ("outer") dims; each operand has its own strides over the outer
// dims and its own stride along the row. The GPU gives each row a thread (cuda/rows.cu), the
// emulated device a loop. The formulas follow the CPU kernels (ops/softmax.cpp,
// ops/layer_norm.cpp, ops/reduce.cpp), NaN handling included.
#pragma once

#include "cuda/elementwise.h"

namespace ember::cuda::kernels {

enum class RowOp : int32_t {
  Softmax,             // out0 = exp(x - max) / Σ exp(x - max)
  LogSoftmax,          // out0 = x - max - log Σ exp(x - max)
  SoftmaxBackward,     // in0 = dY, in1 = Y:  out0 = Y (dY - Σ dY Y)
  LogSoftmaxBackward,  // in0 = dY, in1 = Y:  out0 = dY - exp(Y) Σ dY
  Max,                 // out0 = the largest element (NaN above all), out1 = its first index
  Min,                 // likewise the smallest (NaN below all)
  Cumsum,              // out0 = the running sum (from the row's end when `reverse`)
  LogSumExp,           // out0 = m + log Σ exp(x - m), m the largest element (0 when ±inf)
  Moments,             // out0 = mean, out1 = 1 / sqrt(biased variance + p0)
  Sort,                // out0 = the row sorted, stably (descending when `reverse`; NaN above
                       // all), out1 = the positions the values came from
  // in0 = logits, in1 = the row's target t (Int64, one per row), p0 = label smoothing eps,
  // i0 = ignore_index: out0 = (1 - eps) (-log p_t) + eps / C Σ_c -log p_c (one per row), 0 for
  // an ignored row; a target outside [0, C) is reported (slot, check) and its loss is NaN
  CrossEntropy,
  // in0 = logits, in1 = t, in2 = dL for the row: out0 = dL (p - eps / C - (1 - eps) [c = t]),
  // 0 for an ignored row (p = softmax of the row, recomputed)
  CrossEntropyBackward,
  // in0 = x, in1 = weight, in2 = bias (each absent when its data is null), p0 = eps: out0 =
  // (x - mean) rstd weight + bias, out1 = mean, out2 = rstd (one per row; Moments' formulas)
  LayerNorm,
  // in0 = dY, in1 = x, in2 = weight (absent when null), p0 = eps: out0 = dX = rstd (dxhat -
  // mean(dxhat) - (x - mean) rstd² mean(dxhat (x - mean))), dxhat = dY weight, the row's mean
  // and rstd recomputed from x
  LayerNormBackward,
  // Along a column of the (M, N) tables (the rows here are the N columns, each of length M):
  // in0 = dY, in1 = x, in2 = the forward's mean (one per table row; its rstd stored M elements
  // after it, the two in one (2, M) buffer): out0 = dW = Σ dY (x - mean) rstd, out1 = dB = Σ dY
  // (one per column; either absent when null)
  LayerNormParams,
};

struct RowOperand {
  void* data = nullptr;  // the first element's address
  ScalarType type = ScalarType::Float32;
  int64_t outer_strides[kMaxDims] = {};
  int64_t stride = 0;  // along the row; 0 for an operand of one value per row
};

struct Rows {
  RowOp op = RowOp::Softmax;
  ScalarType compute = ScalarType::Float32;  // Float32 or Float64 (Max, Min, Cumsum: any)
  int64_t rows = 0, length = 0;              // rows, and elements in each
  int outer_ndim = 0;
  int64_t outer_sizes[kMaxDims] = {};
  RowOperand in[3], out[3];
  bool reverse = false;
  double p0 = 0;
  int64_t i0 = 0;
  DeviceCheck* slot = nullptr;  // where a bad value is reported (Note [Checks on the device])
  int32_t check = 0;
};

namespace detail {

template <class T>
EMBER_HD bool nan(T v) {
  return v != v;
}

// a before b in a max (Max) or min scan: NaN first, as the CPU's greater().
template <class T>
EMBER_HD bool better(T a, T b, bool max) {
  if (nan(a)) return !nan(b);
  return max ? a > b : a < b;
}

// -inf, or int64's lowest where T has no infinity (Max's start on integral rows).
template <class T>
EMBER_HD T lowest() {
  if constexpr (std::is_floating_point_v<T>)
    return -INFINITY;
  else
    return T(INT64_MIN);
}

#if defined(__CUDA_ARCH__)
#define EMBER_ROW_MATH(fn) ::fn
#else
#define EMBER_ROW_MATH(fn) std::fn
#endif

// The x of a layer_norm row: in0 forward, in1 backward (in0 is dY there).
template <class T>
EMBER_HD T in0_or_x(const Rows& r, const RowOperand& x, const RowOperand& y, const int64_t* base,
                    int64_t j) {
  return r.op == RowOp::LayerNormBackward ? load<T>(y.data, y.type, base[1] + j * y.stride)
                                          : load<T>(x.data, x.type, base[0] + j * x.stride);
}

template <class T>
EMBER_HD void row(const Rows& r, int64_t index) {
  int64_t base[6] = {0, 0, 0, 0, 0, 0};  // in0, in1, out0, out1, in2, out2
  int64_t rest = index;
  for (int d = r.outer_ndim - 1; d >= 0; --d) {
    const int64_t i = rest % r.outer_sizes[d];
    rest /= r.outer_sizes[d];
    base[0] += i * r.in[0].outer_strides[d];
    base[1] += i * r.in[1].outer_strides[d];
    base[2] += i * r.out[0].outer_strides[d];
    base[3] += i * r.out[1].outer_strides[d];
    base[4] += i * r.in[2].outer_strides[d];
    base[5] += i * r.out[2].outer_strides[d];
  }
  const int64_t n = r.length;
  const RowOperand &x = r.in[0], &y = r.in[1], &o = r.out[0], &o1 = r.out[1];
  const auto in0 = [&](int64_t j) { return load<T>(x.data, x.type, base[0] + j * x.stride); };
  const auto in1 = [&](int64_t j) { return load<T>(y.data, y.type, base[1] + j * y.stride); };
  const auto put = [&](int64_t j, T v) { store<T>(o.data, o.type, base[2] + j * o.stride, v); };
  switch (r.op) {
    case RowOp::Softmax:
    case RowOp::LogSoftmax: {
      T m = lowest<T>();
      for (int64_t j = 0; j < n; ++j) m = in0(j) > m || nan(in0(j)) ? in0(j) : m;
      double s = 0;
      for (int64_t j = 0; j < n; ++j) s += static_cast<double>(EMBER_ROW_MATH(exp)(in0(j) - m));
      if (r.op == RowOp::LogSoftmax) {
        const T l = static_cast<T>(EMBER_ROW_MATH(log)(s));
        for (int64_t j = 0; j < n; ++j) put(j, in0(j) - m - l);
      } else {
        for (int64_t j = 0; j < n; ++j)
          put(j, static_cast<T>(EMBER_ROW_MATH(exp)(in0(j) - m) / static_cast<T>(s)));
      }
      return;
    }
    case RowOp::SoftmaxBackward: {
      double dot = 0;
      for (int64_t j = 0; j < n; ++j) dot += static_cast<double>(in0(j) * in1(j));
      for (int64_t j = 0; j < n; ++j) put(j, in1(j) * (in0(j) - static_cast<T>(dot)));
      return;
    }
    case RowOp::LogSoftmaxBackward: {
      double sum = 0;
      for (int64_t j = 0; j < n; ++j) sum += static_cast<double>(in0(j));
      for (int64_t j = 0; j < n; ++j)
        put(j, in0(j) - EMBER_ROW_MATH(exp)(in1(j)) * static_cast<T>(sum));
      return;
    }
    case RowOp::Max:
    case RowOp::Min: {
      const bool max = r.op == RowOp::Max;
      int64_t best = 0;
      for (int64_t j = 1; j < n; ++j)
        if (better(in0(j), in0(best), max)) best = j;
      put(0, in0(best));
      store<int64_t>(o1.data, o1.type, base[3], best);
      return;
    }
    case RowOp::Cumsum: {
      T acc = 0;  // T: double for floating rows, int64 (wrapping) for integral ones
      for (int64_t k = 0; k < n; ++k) {
        const int64_t j = r.reverse ? n - 1 - k : k;
        acc = add(acc, in0(j));
        put(j, acc);
      }
      return;
    }
    case RowOp::LogSumExp: {
      T m = lowest<T>();
      for (int64_t j = 0; j < n; ++j)
        if (better(in0(j), m, true)) m = in0(j);
      if (EMBER_ROW_MATH(isinf)(m)) m = T(0);
      double s = 0;
      for (int64_t j = 0; j < n; ++j) s += static_cast<double>(EMBER_ROW_MATH(exp)(in0(j) - m));
      put(0, static_cast<T>(EMBER_ROW_MATH(log)(s)) + m);
      return;
    }
    case RowOp::Sort: {
      // Insertion sort of (value, position) pairs in the outputs: stable, as the comparison is
      // strict; O(n²) per row, a thread's work
      const auto value = [&](int64_t j) { return load<T>(o.data, o.type, base[2] + j * o.stride); };
      const auto position = [&](int64_t j) {
        return load<int64_t>(o1.data, o1.type, base[3] + j * o1.stride);
      };
      const auto set = [&](int64_t j, T v, int64_t p) {
        put(j, v);
        store<int64_t>(o1.data, o1.type, base[3] + j * o1.stride, p);
      };
      const bool descending = r.reverse;
      const auto before = [&](T a, T b) {  // a strictly before b
        return descending ? (nan(a) && !nan(b)) || a > b : !nan(a) && (nan(b) || a < b);
      };
      for (int64_t j = 0; j < n; ++j) set(j, in0(j), j);
      for (int64_t i = 1; i < n; ++i) {
        const T v = value(i);
        const int64_t p = position(i);
        int64_t j = i - 1;
        for (; j >= 0 && before(v, value(j)); --j) set(j + 1, value(j), position(j));
        set(j + 1, v, p);
      }
      return;
    }
    case RowOp::CrossEntropy:
    case RowOp::CrossEntropyBackward: {
      // the CPU's cross_entropy_row and CrossEntropyBackward (ops/loss.cpp): m = max, log_s =
      // log Σ exp(x - m), log p_c = (x_c - m) - log_s; floating rows only (supported())
      if constexpr (std::is_floating_point_v<T>) {
        const int64_t t = load<int64_t>(y.data, y.type, base[1]);
        const bool backward = r.op == RowOp::CrossEntropyBackward;
        if (t == r.i0) {
          for (int64_t j = 0; j < (backward ? n : 1); ++j) put(j, T(0));
          return;
        }
        if (t < 0 || t >= n) {
          if (r.slot != nullptr) report(r.slot, r.check, t);
          for (int64_t j = 0; j < (backward ? n : 1); ++j) put(j, T(NAN));
          return;
        }
        T m = lowest<T>();
        for (int64_t j = 0; j < n; ++j) m = in0(j) > m || nan(in0(j)) ? in0(j) : m;
        double sum_exp = 0, sum_gap = 0;
        for (int64_t j = 0; j < n; ++j) {
          sum_exp += static_cast<double>(EMBER_ROW_MATH(exp)(in0(j) - m));
          sum_gap += static_cast<double>(m - in0(j));
        }
        const double log_s = EMBER_ROW_MATH(log)(sum_exp), eps = r.p0;
        if (!backward) {
          const double nll = static_cast<double>(m - in0(t)) + log_s;
          const double c = static_cast<double>(n);
          put(0,
              static_cast<T>(eps == 0 ? nll : (1 - eps) * nll + eps / c * (sum_gap + c * log_s)));
          return;
        }
        const RowOperand& g = r.in[2];
        const T w = load<T>(g.data, g.type, base[4]), l = static_cast<T>(log_s);
        const T keep = static_cast<T>(1 - eps),
                spread = static_cast<T>(eps / static_cast<double>(n));
        for (int64_t j = 0; j < n; ++j)
          put(j, w * (EMBER_ROW_MATH(exp)((in0(j) - m) - l) - spread) - (j == t ? w * keep : T(0)));
        return;
      }
      return;
    }
    case RowOp::LayerNorm:
    case RowOp::LayerNormBackward: {
      if constexpr (std::is_floating_point_v<T>) {
        // Moments' corrected two-pass mean and variance (the CPU's layer_norm_forward)
        double s = 0;
        for (int64_t j = 0; j < n; ++j) s += static_cast<double>(in0_or_x<T>(r, x, y, base, j));
        const double mean0 = s / static_cast<double>(n);
        double sd = 0, sd2 = 0;
        for (int64_t j = 0; j < n; ++j) {
          const double d = static_cast<double>(in0_or_x<T>(r, x, y, base, j)) - mean0;
          sd += d, sd2 += d * d;
        }
        const double c = sd / static_cast<double>(n);
        const double var = sd2 / static_cast<double>(n) - c * c;
        const T mu = static_cast<T>(mean0 + c);
        const T rs = static_cast<T>(1 / EMBER_ROW_MATH(sqrt)((var > 0 ? var : 0.0) + r.p0));
        const RowOperand &w = r.op == RowOp::LayerNorm ? y : r.in[2], &b = r.in[2];
        const int64_t w_base = r.op == RowOp::LayerNorm ? base[1] : base[4];
        const auto weight = [&](int64_t j) {
          return w.data != nullptr ? load<T>(w.data, w.type, w_base + j * w.stride) : T(1);
        };
        if (r.op == RowOp::LayerNorm) {
          for (int64_t j = 0; j < n; ++j) {
            T v = (in0(j) - mu) * rs * weight(j);
            if (b.data != nullptr) v += load<T>(b.data, b.type, base[4] + j * b.stride);
            put(j, v);
          }
          store<T>(o1.data, o1.type, base[3], mu);
          const RowOperand& o2 = r.out[2];
          store<T>(o2.data, o2.type, base[5], rs);
          return;
        }
        // dY is in0, x is in1
        double sum = 0, dot = 0;
        for (int64_t j = 0; j < n; ++j) {
          const double d = static_cast<double>(in0(j) * weight(j));
          sum += d;
          dot += d * static_cast<double>(in1(j) - mu);
        }
        const T mean_dxhat = static_cast<T>(sum / static_cast<double>(n));
        const T k = static_cast<T>(dot / static_cast<double>(n)) * rs * rs;
        for (int64_t j = 0; j < n; ++j)
          put(j, rs * (in0(j) * weight(j) - mean_dxhat - (in1(j) - mu) * k));
        return;
      }
      return;
    }
    case RowOp::LayerNormParams: {
      if constexpr (std::is_floating_point_v<T>) {
        const RowOperand& stats = r.in[2];
        double dw = 0, db = 0;
        for (int64_t j = 0; j < n; ++j) {
          const int64_t at = base[4] + j * stats.stride;
          const T mu = load<T>(stats.data, stats.type, at);
          const T rs = load<T>(stats.data, stats.type, at + n);
          dw += static_cast<double>(in0(j) * ((in1(j) - mu) * rs));
          db += static_cast<double>(in0(j));
        }
        if (o.data != nullptr) put(0, static_cast<T>(dw));
        if (o1.data != nullptr) store<T>(o1.data, o1.type, base[3], static_cast<T>(db));
      }
      return;
    }
    case RowOp::Moments: {
      // The CPU's corrected two-pass variance: m = Σx / n, d = x - m, mean = m + Σd / n,
      // var = Σd² / n - (Σd / n)²
      double s = 0;
      for (int64_t j = 0; j < n; ++j) s += static_cast<double>(in0(j));
      const double m = s / static_cast<double>(n);
      double sd = 0, sd2 = 0;
      for (int64_t j = 0; j < n; ++j) {
        const double d = static_cast<double>(in0(j)) - m;
        sd += d, sd2 += d * d;
      }
      const double c = sd / static_cast<double>(n);
      const double var = sd2 / static_cast<double>(n) - c * c;
      put(0, static_cast<T>(m + c));
      store<T>(o1.data, o1.type, base[3], static_cast<T>(1 / EMBER_ROW_MATH(sqrt)(var + r.p0)));
      return;
    }
  }
}

#undef EMBER_ROW_MATH

}  // namespace detail

EMBER_HD inline bool supported(const Rows& r) {
  const bool floating = r.compute == ScalarType::Float32 || r.compute == ScalarType::Float64;
  switch (r.op) {
    case RowOp::Max:
    case RowOp::Min:
    case RowOp::Sort:
      return r.compute != ScalarType::Bool;
    case RowOp::Cumsum:
      return r.compute == ScalarType::Float64 || r.compute == ScalarType::Int64;
    default:
      return floating;
  }
}

EMBER_HD inline void row_element(const Rows& r, int64_t index) {
  dispatch(r.compute, [&](auto t) {
    if constexpr (!std::is_same_v<decltype(t), bool>) detail::row<decltype(t)>(r, index);
  });
}

}  // namespace ember::cuda::kernels
