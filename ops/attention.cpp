// scaled_dot_product_attention, as torch 2's: matmuls around one fused pass per row of scores
// that scales, masks and turns it into softmax weights in place (Note [Attention kernel]), and a
// hand-derived backward. Under create_graph the backward is written in ops, the weights
// recomputed from q and k, so that it can be differentiated again (Note [Double backward]); on a
// device the op is composed of ops.
#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>

#include "graph/autograd.h"
#include "graph/creation.h"
#include "graph/profile.h"
#include "graph/strided.h"
#include "ops/common.h"
#include "ops/dropout_mask.h"
#include "ops/elementwise.h"
#include "ops/reduce.h"
#include "ops/rows.h"
#include "ops/vec_math.h"

namespace ember {

namespace {

// Note [Attention kernel]
// scaled_dot_product_attention is one op over existing kernels: S = q kᵀ by matmul (a batched
// gemm; k's transpose is a BLAS flag), then one fused pass per row of S that scales it, applies
// the mask and turns it into softmax probabilities P in place (no scaled, masked or -inf-filled
// copy of S and no mask tensor is made), then out = dropout(P) v by matmul. With is_causal, row i
// keeps keys j <= i (torch's tril(ones(L, S)), aligned top-left): the pass computes exponentials
// there only and writes zeros beyond. A row where no key takes part gives zeros, as torch's math
// backend since 2.5 (_safe_softmax; 2.0 to 2.4 gave NaN). Saved for the backward: q, k, v (inputs)
// and P; dropout's mask is recomputed from its key (Note [Dropout masks]):
//   dV = P_dᵀ dO,  dP_d = dO vᵀ,  dP = dropout(dP_d),  dS = P ⊙ (dP − Σ_j dP ⊙ P),
//   dMask = dS (a floating mask),  dQ = scale · dS k,  dK = scale · dSᵀ q.

enum class MaskKind { None, Bool, Float };

// Rows [begin, end) of P (S keys each; query i = row % L), in place, as softmax_short_rows: in
// blocks of at most kShortRowBlock elements, pass by pass, since attention rows are short and a
// row-at-a-time loop would run mostly in its SIMD prologue and remainder:
//  1. each row: scores · scale, the mask applied (Bool false: -inf; floating: added), the keys
//     past the causal prefix -inf, then the row's max subtracted (none when all are -inf);
//  2. the exponentials of the whole block in one loop: masked keys and the causal zeros are its
//     exp(-inf) = 0;
//  3. each row divided by its sum: a row where no key takes part sums to 0 and stays zeros; a
//     row with a NaN score is all NaN, as softmax's.
template <MaskKind Kind, class T, class M>
void attention_block(T* p, int64_t begin, int64_t end, int64_t L, int64_t S, T scale, bool causal,
                     const M* pm, const Rows& mr) {
  constexpr T neg_inf = -std::numeric_limits<T>::infinity();
  const int64_t block_rows = std::max<int64_t>(1, kShortRowBlock / S);
  bool nan_row[kShortRowBlock];
  for (int64_t b = begin; b < end; b += block_rows) {
    const int64_t rows = std::min(block_rows, end - b);
    T* xb = p + b * S;
    for (int64_t i = 0; i < rows; ++i) {
      const int64_t r = b + i, keep = causal ? std::min(r % L + 1, S) : S;
      T* x = xb + i * S;
      [[maybe_unused]] const M* m = pm == nullptr ? pm : pm + mr.start(r);
      [[maybe_unused]] const int64_t ms = mr.stride;
      T mx = neg_inf;
      int nan = 0;
#pragma omp simd reduction(max : mx) reduction(| : nan)
      for (int64_t j = 0; j < keep; ++j) {
        T v = x[j] * scale;
        if constexpr (Kind == MaskKind::Bool) {
          v = m[j * ms] ? v : neg_inf;
        } else if constexpr (Kind == MaskKind::Float) {
          v += m[j * ms];
        }
        mx = std::max(mx, v);
        nan |= v != v;
        x[j] = v;
      }
      std::fill(x + keep, x + S, neg_inf);
      nan_row[i] = nan != 0;
      const T shift = mx == neg_inf ? T(0) : mx;
#pragma omp simd
      for (int64_t j = 0; j < keep; ++j) x[j] -= shift;
    }
    const int64_t len = rows * S;
#pragma omp simd
    for (int64_t i = 0; i < len; ++i) xb[i] = vexp_nonpositive(xb[i]);
    for (int64_t i = 0; i < rows; ++i) {
      T* x = xb + i * S;
      if (nan_row[i]) {
        std::fill(x, x + S, std::numeric_limits<T>::quiet_NaN());
        continue;
      }
      const T sum = row_sum(x, S);
      const T inv = sum > 0 ? T(1) / sum : T(0);
#pragma omp simd
      for (int64_t j = 0; j < S; ++j) x[j] *= inv;
    }
  }
}

// The forward pass over every row of P (rows of S keys, query i = row % L), in place.
template <class T>
void attention_rows(const Tensor& p, int64_t L, T scale, bool causal, const Tensor& mask) {
  const int64_t S = p.size(-1), count = p.numel() / std::max<int64_t>(S, 1);
  T* pp = p.data<T>();
  const auto run = [&]<MaskKind Kind, class M>(const M* pm, const Rows& mr) {
    parallel_for(
        count,
        [&](int64_t begin, int64_t end) {
          attention_block<Kind>(pp, begin, end, L, S, scale, causal, pm, mr);
        },
        row_grain(S, costly_grain()));
  };
  if (!mask.defined()) {
    run.template operator()<MaskKind::None>(static_cast<const T*>(nullptr), Rows{});
    return;
  }
  // The mask seen as P's shape (stride 0 where it broadcasts), read row by row.
  const Tensor mv =
      make_view(mask, p.shape(), broadcast_strides(mask, p.shape()), mask.storage_offset());
  const Rows mr = rows_along(mv, p.dim() - 1);
  if (mask.dtype() == kBool)
    run.template operator()<MaskKind::Bool>(mv.data<bool>(), mr);
  else
    run.template operator()<MaskKind::Float>(mv.data<T>(), mr);
}

// The backward of the softmax rows, in place in dp: dS = P ⊙ (dP − Σ_j dP ⊙ P) · factor over the
// first keep entries of each row, zeros after (P is zero there).
template <class T>
void attention_rows_backward(const Tensor& p, const Tensor& dp, int64_t L, bool causal, T factor) {
  const int64_t S = p.size(-1), count = p.numel() / std::max<int64_t>(S, 1);
  const T* pp = p.data<T>();
  T* pd = dp.data<T>();
  parallel_for(
      count,
      [&](int64_t begin, int64_t end) {
        for (int64_t r = begin; r < end; ++r) {
          const int64_t keep = causal ? std::min(r % L + 1, S) : S;
          const T* y = pp + r * S;
          T* g = pd + r * S;
          double acc = 0;
#pragma omp simd reduction(+ : acc)
          for (int64_t j = 0; j < keep; ++j) acc += g[j] * y[j];
          const T dot = static_cast<T>(acc);
#pragma omp simd
          for (int64_t j = 0; j < keep; ++j) g[j] = y[j] * (g[j] - dot) * factor;
          std::fill(g + keep, g + S, T(0));
        }
      },
      row_grain(S, costly_grain()));
}

// True when the Bool tensor t holds a true element.
bool any_true(const Tensor& t) {
  const Tensor c = contiguous_data(t);
  const bool* b = c.data<bool>();
  return std::any_of(b, b + c.numel(), [](bool e) { return e; });
}

// The last two dims swapped, a view (no autograd: used where grad mode is off).
Tensor swap_last(const Tensor& t) { return transpose(t, -2, -1); }

// out = dropout(softmax(q kᵀ · scale + mask)) v (Note [Attention kernel]); inputs q, k, v and a
// floating mask (undefined when Bool or absent). Under create_graph P is recomputed in ops from
// q, k and the mask (the kernel's P is data; it tells the rows where no key takes part, zeros):
//   S = q kᵀ · scale + mask, -inf where a key is left out,  P = softmax(S) (0 in those rows)
// and the formulas of Note [Attention kernel] follow in ops.
struct ScaledDotProductAttentionBackward final : Node {
  ScaledDotProductAttentionBackward(const Tensor& q, const Tensor& k, const Tensor& v,
                                    const Tensor& float_mask, Tensor bool_mask, const Tensor& p,
                                    AttentionDropout dropout, double scale, bool causal)
      : bool_mask_(std::move(bool_mask)), dropout_(dropout), scale_(scale), causal_(causal) {
    save(q_, q), save(k_, k), save(v_, v), save(p_, p), save(mask_, float_mask);
  }
  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    if (is_grad_enabled()) return apply_in_ops(grads[0]);  // create_graph
    const Tensor& g = grads[0];
    const Tensor &q = q_.get(), &k = k_.get(), &v = v_.get(), &p = p_.get();
    Tensor grad_q, grad_k, grad_v, grad_mask;
    if (needs_grad(2)) grad_v = matmul(swap_last(apply_attention_dropout(p, dropout_, op())), g);
    if (!needs_grad(0) && !needs_grad(1) && !needs_grad(3)) return {grad_q, grad_k, grad_v, {}};
    Tensor dp = matmul(g, swap_last(v));  // over out's batch dims, which may outgrow P's
    if (dp.shape() != p.shape()) dp = sum_to(dp, p.shape());
    dp = apply_attention_dropout(dp, dropout_, op()).contiguous();  // fresh: written in place
    const bool scaled_in_place = !needs_grad(3);
    dispatch_float(p.dtype(), op(), [&]<class T>() {
      attention_rows_backward<T>(p, dp, q.size(-2), causal_,
                                 static_cast<T>(scaled_in_place ? scale_ : 1.0));
    });
    Tensor ds = dp;
    if (!scaled_in_place) {
      grad_mask = dp;
      ds = mul(dp, scale_);
    }
    if (needs_grad(0)) grad_q = matmul(ds, k);
    if (needs_grad(1)) grad_k = matmul(swap_last(ds), q);
    return {grad_q, grad_k, grad_v, grad_mask};
  }
  // P in ops from q, k and the floating mask (undefined when none), as the kernel's.
  Tensor weights_in_ops(const Tensor& q, const Tensor& k, const Tensor& mask) const {
    const Tensor& p_data = p_.get();
    const Shape& shape = p_data.shape();
    const int64_t L = shape.end()[-2], S = shape.end()[-1];
    Tensor s = mul(matmul(q, transpose(k, -2, -1)), scale_);
    if (mask.defined()) s = add(s, mask);
    if (s.shape() != shape) s = expand(s, shape);
    Tensor left_out;  // Bool: true where a key takes no part
    if (bool_mask_.defined()) left_out = logical_not(bool_mask_);
    if (causal_)  // key j > query i
      left_out = gt(arange(0, static_cast<double>(S), 1, kInt64).view({1, S}),
                    arange(0, static_cast<double>(L), 1, kInt64).view({L, 1}));
    if (left_out.defined()) s = masked_fill(s, left_out, -std::numeric_limits<double>::infinity());
    // Rows where no key takes part (the kernel's P sums to 0 there): S 0, so that softmax gives
    // no NaN, and P 0.
    const Tensor empty_rows = eq(sum(p_data, {-1}, true), 0.0);
    const bool any_empty = any_true(empty_rows);
    if (any_empty) s = masked_fill(s, empty_rows, 0.0);
    const Tensor p = softmax(s, -1);
    return any_empty ? masked_fill(p, empty_rows, 0.0) : p;
  }
  std::vector<Tensor> apply_in_ops(const Tensor& g) {
    const Tensor &q = q_.get(), &k = k_.get(), &v = v_.get();
    const Shape& shape = p_.get().shape();
    const Tensor p = weights_in_ops(q, k, mask_.defined() ? mask_.get() : Tensor());
    const Tensor drop = attention_dropout_factor(shape, p.dtype(), dropout_, op());
    const auto dropped = [&](const Tensor& t) { return drop.defined() ? mul(t, drop) : t; };
    Tensor grad_q, grad_k, grad_v, grad_mask;
    if (needs_grad(2)) grad_v = matmul(transpose(dropped(p), -2, -1), g);
    if (!needs_grad(0) && !needs_grad(1) && !needs_grad(3)) return {grad_q, grad_k, grad_v, {}};
    Tensor dp = matmul(g, transpose(v, -2, -1));
    if (dp.shape() != shape) dp = sum_to(dp, shape);
    dp = dropped(dp);
    const Tensor ds = mul(p, sub(dp, sum(mul(dp, p), {-1}, true)));
    if (needs_grad(3)) grad_mask = ds;
    if (needs_grad(0)) grad_q = mul(matmul(ds, k), scale_);
    if (needs_grad(1)) grad_k = mul(matmul(transpose(ds, -2, -1), q), scale_);
    return {grad_q, grad_k, grad_v, grad_mask};
  }
  bool differentiable_backward() const override { return true; }
  // Forward, P recomputed in ops (0 where a key takes no part, and in rows where none does):
  //   dS = (dQ kᵀ + q dKᵀ) · scale + dMask,  dP = P ⊙ (dS − Σ_j dS ⊙ P),
  //   dOut = dropout(dP) v + dropout(P) dV
  std::vector<Tensor> jvp(const std::vector<Tensor>& in, const std::vector<Tensor>& t,
                          const std::vector<Tensor>& out) override {
    const Tensor &q = in[0], &k = in[1], &v = in[2];
    const Tensor p = weights_in_ops(q, k, in[3]);
    const Tensor drop = attention_dropout_factor(p.shape(), p.dtype(), dropout_, op());
    const auto dropped = [&](const Tensor& x) { return drop.defined() ? mul(x, drop) : x; };
    Tensor ds, d;
    if (t[0].defined()) ds = matmul(t[0], transpose(k, -2, -1));
    if (t[1].defined()) ds = fwd::add_tangents(ds, matmul(q, transpose(t[1], -2, -1)));
    if (ds.defined()) ds = mul(ds, scale_);
    ds = fwd::add_tangents(ds, t[3]);
    if (ds.defined()) d = matmul(dropped(mul(p, sub(ds, sum(mul(ds, p), {-1}, true)))), v);
    if (t[2].defined()) d = fwd::add_tangents(d, matmul(dropped(p), t[2]));
    return {fwd::broadcast_tangent(d, out[0].shape())};
  }
  Tensor bool_mask_;  // the Bool attn_mask, or undefined
  AttentionDropout dropout_;
  double scale_;
  bool causal_;
  SavedTensor q_, k_, v_, p_, mask_;
};

}  // namespace

namespace {

// scaled_dot_product_attention on a device other than the CPU, in ops (its gradient follows
// through them): S = q kᵀ · scale (+ a float mask), -inf where a Bool or the causal mask drops a
// key, P = softmax(S) with rows where no key takes part (all -inf) made zeros, as the CPU's,
// then dropout(P) v.
Tensor attention_in_ops(const Tensor& query, const Tensor& key, const Tensor& value,
                        const Tensor& mask, double dropout_p, bool is_causal, double scale,
                        std::string_view op) {
  check_same_device(query, key, op);
  check_same_device(query, value, op);
  if (mask.defined()) check_same_device(query, mask, op);
  const int64_t L = query.size(-2), S = key.size(-2);
  Tensor s = mul(matmul(query, swap_last(key)), scale);
  if (mask.defined() && mask.dtype() != kBool) s = add(s, mask);
  Tensor keep;
  if (is_causal) keep = tril(ones({L, S}, kBool, query.device()));
  if (mask.defined() && mask.dtype() == kBool) keep = mask;
  if (keep.defined())
    s = masked_fill(s, logical_not(keep), -std::numeric_limits<double>::infinity());
  Tensor p = softmax(s, -1);
  if (S > 0) {
    const Tensor dead =
        eq(max(s.detach(), -1, true).values, -std::numeric_limits<double>::infinity());
    p = masked_fill(p, dead, 0.0);
  }
  if (dropout_p > 0) p = dropout(p, dropout_p, true);
  return matmul(p, value);
}

}  // namespace

Tensor scaled_dot_product_attention(const Tensor& query, const Tensor& key, const Tensor& value,
                                    const Tensor& attn_mask, double dropout_p, bool is_causal,
                                    std::optional<double> scale) {
  constexpr std::string_view op = "scaled_dot_product_attention";
  profile::Scope scope(op);
  check_attention_dtypes(query, key, value, op);
  EMBER_CHECK(query.dim() >= 2 && key.dim() >= 2 && value.dim() >= 2,
              "{}: query {}, key {} and value {} need at least 2 dims: (..., L, E), (..., S, E), "
              "(..., S, Ev)",
              op, query.shape(), key.shape(), value.shape());
  const int64_t L = query.size(-2), E = query.size(-1), S = key.size(-2);
  EMBER_CHECK(key.size(-1) == E, "{}: query {} and key {} differ in their last dim (E: {} vs {})",
              op, query.shape(), key.shape(), E, key.size(-1));
  EMBER_CHECK(value.size(-2) == S,
              "{}: key {} and value {} differ in their number of keys (dim -2: {} vs {})", op,
              key.shape(), value.shape(), S, value.size(-2));
  EMBER_CHECK(dropout_p >= 0 && dropout_p <= 1, "{}: dropout_p has to be in [0, 1], got {}", op,
              dropout_p);
  EMBER_CHECK(!(is_causal && attn_mask.defined()),
              "{}: attn_mask and is_causal cannot both be set, as in torch (fold the causal mask "
              "into attn_mask)",
              op);
  // The scores' shape: q's and k's batch dims broadcast (the mask's too), then (L, S).
  Shape attn_shape = broadcast_shapes(Shape(query.shape().begin(), query.shape().end() - 2),
                                      Shape(key.shape().begin(), key.shape().end() - 2), op);
  attn_shape.push_back(L);
  attn_shape.push_back(S);
  Tensor mask = attn_mask;
  if (mask.defined()) {
    EMBER_CHECK(mask.dtype() == kBool || is_floating(mask.dtype()),
                "{}: attn_mask must be Bool or floating, got {} of shape {}", op, mask.dtype(),
                mask.shape());
    const Shape shape = broadcast_shapes(attn_shape, mask.shape(), op);
    EMBER_CHECK(shape.end()[-2] == L && shape.end()[-1] == S,
                "{}: attn_mask of shape {} does not broadcast to the scores' (..., L, S) = {}", op,
                mask.shape(), attn_shape);
    attn_shape = shape;
    if (mask.dtype() != kBool) mask = as_type(mask, query.dtype());
  }
  const double sc = scale ? *scale : 1.0 / std::sqrt(static_cast<double>(E));
  if (!query.device().is_cpu())
    return attention_in_ops(query, key, value, mask, dropout_p, is_causal, sc, op);
  const AttentionDropout drop = attention_dropout(dropout_p);
  Tensor p, out;
  {
    NoGradGuard no_grad;                // the kernels below, no graph; this op records its own Node
    p = matmul(query, swap_last(key));  // a fresh contiguous tensor, overwritten by P in place
    if (p.shape() != attn_shape) p = expand(p, attn_shape).contiguous();  // the mask adds dims
    if (p.numel() > 0)
      dispatch_float(p.dtype(), op, [&]<class T>() {
        attention_rows<T>(p, L, static_cast<T>(sc), is_causal, mask);
      });
    out = matmul(apply_attention_dropout(p, drop, op), value);
  }
  const Tensor float_mask = mask.defined() && mask.dtype() != kBool ? mask : Tensor();
  const Tensor bool_mask = mask.defined() && mask.dtype() == kBool ? mask : Tensor();
  return record<ScaledDotProductAttentionBackward>(op, out, {query, key, value, float_mask}, query,
                                                   key, value, float_mask, bool_mask, p, drop, sc,
                                                   is_causal);
}

}  // namespace ember
