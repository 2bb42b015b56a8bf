// Inverted dropout: zeroes with probability p and scales the rest by 1 / (1 - p), by the
// counter-based mask of Note [Dropout masks] (ops/dropout_mask.h), which its forward also keeps,
// a byte an element, for its backward; and the dropout of attention weights, whose backwards
// recompute the mask from its key instead. On a device, cuda/random.h's mask and one elementwise
// kernel.
#include <algorithm>
#include <cmath>

#include "graph/autograd.h"
#include "graph/creation.h"
#include "graph/device_backend.h"
#include "graph/profile.h"
#include "graph/random.h"
#include "graph/strided.h"
#include "ops/common.h"
#include "ops/dropout_mask.h"
#include "ops/elementwise.h"

namespace ember {

DropoutMask dropout_mask(double p) {
  return {random_bits(), static_cast<uint32_t>(std::ldexp(p, 32)), 1.0 / (1.0 - p)};
}

namespace {

// out[i] = x[i] * (kept(i) ? scale : 0), for contiguous x and out of n elements, and kept(i) into
// keep[i] when keep is given. Blocks of pairs: the bits first, into 32-bit halves, then the
// multiply, so that both loops vectorise (GCC 12 does not vectorise one loop that mixes the 64-bit
// hash with 32-bit floats).
template <class T>
void apply_dropout_mask(const T* x, T* out, int64_t n, const DropoutMask& m, bool* keep = nullptr) {
  const int64_t half = n / 2;
  // keep's bytes written as bytes, 0 or 1: GCC 12 vectorises no loop that stores a bool.
  unsigned char* kept = reinterpret_cast<unsigned char*>(keep);
  parallel_for(
      half,
      [&, m, kept](int64_t begin, int64_t end) {
        // Locals by value: GCC 12 does not vectorise a loop that reads a by-reference capture.
        constexpr int64_t kBlock = 256;
        const uint64_t key = m.key;
        const uint32_t threshold = m.threshold;
        const T scale = static_cast<T>(m.scale);
        // And the pointers and half: a byte store could otherwise alias the closure's copies.
        const T* const xs = x;
        T* const ys = out;
        unsigned char* const ks = kept;
        const int64_t h = half;
        uint32_t lo[kBlock], hi[kBlock];
        for (int64_t b = begin; b < end; b += kBlock) {
          const int64_t len = std::min(kBlock, end - b);
          // counter_bits(key, b + j), the state stepped rather than multiplied out (on AVX2 a
          // 64-bit multiply is three 32-bit ones: this is a third of the hash's).
          uint64_t state = key + static_cast<uint64_t>(b + 1) * kCounterGamma;
          for (int64_t j = 0; j < len; ++j) {
            const uint64_t bits = counter_mix(state);
            state += kCounterGamma;
            lo[j] = static_cast<uint32_t>(bits);
            hi[j] = static_cast<uint32_t>(bits >> 32);
          }
          for (int64_t j = 0; j < len; ++j)
            ys[b + j] = xs[b + j] * (lo[j] < threshold ? T(0) : scale);
          for (int64_t j = 0; j < len; ++j)
            ys[b + h + j] = xs[b + h + j] * (hi[j] < threshold ? T(0) : scale);
          if (ks != nullptr) {
            for (int64_t j = 0; j < len; ++j) ks[b + j] = lo[j] >= threshold;
            for (int64_t j = 0; j < len; ++j) ks[b + h + j] = hi[j] >= threshold;
          }
        }
      },
      costly_grain() / 2);  // pairs: a hash each
  if (n % 2 == 1) {
    const auto bits = static_cast<uint32_t>(counter_bits(m.key, static_cast<uint64_t>(half)));
    out[n - 1] = x[n - 1] * (bits < m.threshold ? T(0) : static_cast<T>(m.scale));
    if (kept != nullptr) kept[n - 1] = bits >= m.threshold;
  }
}

}  // namespace

Tensor apply_dropout_mask(const Tensor& x, const DropoutMask& m, std::string_view op,
                          const Tensor& keep) {
  const Tensor xc = x.contiguous();
  Tensor out = empty(x.shape(), x.dtype(), x.device());
  dispatch_float(x.dtype(), op, [&]<class T>() {
    apply_dropout_mask(xc.data<T>(), out.data<T>(), xc.numel(), m,
                       keep.defined() ? keep.data<bool>() : nullptr);
  });
  return out;
}

AttentionDropout attention_dropout(double p) {
  if (p == 1) return {AttentionDropout::All, {}};  // every weight dropped, as torch; no 1 / 0
  if (p == 0) return {};
  return {AttentionDropout::Mask, dropout_mask(p)};
}

Tensor apply_attention_dropout(const Tensor& t, const AttentionDropout& d, std::string_view op) {
  switch (d.kind) {
    case AttentionDropout::Mask:
      return apply_dropout_mask(t, d.mask, op);
    case AttentionDropout::All:
      return mul(t, 0.0);
    default:
      return t;
  }
}

Tensor attention_dropout_factor(const Shape& shape, DType dtype, const AttentionDropout& d,
                                std::string_view op) {
  if (d.kind == AttentionDropout::None) return {};
  NoGradGuard no_grad;
  return apply_attention_dropout(ones(shape, dtype), d, op);
}

namespace {

// y = x * mask * scale:  dX = dY * mask * scale, the forward's mask read back (Note [Dropout
// masks]). Under create_graph the same kernel, recorded as the op dropout_backward of dY, whose
// derivative is this Node again (dX is dY through the same mask: linear in dY).
struct DropoutBackward final : Node {
  DropoutBackward(Tensor keep, double scale) : keep_(std::move(keep)), scale_(scale) {}
  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    if (!is_grad_enabled()) return {masked(grads[0])};
    Tensor dx;
    {
      NoGradGuard no_grad;
      dx = masked(grads[0]);
    }
    return {record<DropoutBackward>("dropout_backward", dx, {grads[0]}, keep_, scale_)};
  }
  Tensor masked(const Tensor& dy) const {
    if (!dy.device().is_cpu()) {  // a device: one elementwise kernel
      Tensor dx = empty(dy.shape(), dy.dtype(), dy.device());
      elementwise_on_device(dx, cuda::kernels::Op::DropoutScale, dy.dtype(),
                            {dy, keep_.view(dy.shape())}, op(), scale_);
      return dx;
    }
    const Tensor g = dy.contiguous();
    Tensor dx = empty(g.shape(), g.dtype(), g.device());
    dispatch_float(g.dtype(), op(), [&]<class T>() {
      const T* pg = g.data<T>();
      const auto* kept = reinterpret_cast<const unsigned char*>(keep_.data<bool>());
      T* out = dx.data<T>();
      const T scale = static_cast<T>(scale_);
      parallel_for(g.numel(), [&](int64_t begin, int64_t end) {
        // Locals: GCC 12 leaves the loop scalar when it reads the closure's members, which its
        // float stores could alias (the scale) or which it reloads after each of them.
        const T* const gs = pg;
        const unsigned char* const ks = kept;
        T* const ys = out;
        const T sc = scale;
        for (int64_t i = begin; i < end; ++i) ys[i] = gs[i] * (ks[i] != 0 ? sc : T(0));
      });
    });
    return dx;
  }
  bool differentiable_backward() const override { return true; }
  // Forward: dY = dX * mask * scale, the forward's mask again (linear in x), recorded as the op
  // dropout_backward of dX as the backward under create_graph is
  std::vector<Tensor> jvp(const std::vector<Tensor>&, const std::vector<Tensor>& t,
                          const std::vector<Tensor>&) override {
    return {record<DropoutBackward>("dropout_backward", masked(t[0]), {t[0]}, keep_, scale_)};
  }
  Tensor keep_;  // Bool, one element for each of x's, contiguous
  double scale_;
};

}  // namespace

Tensor dropout(const Tensor& x, double p, bool training) {
  constexpr std::string_view op = "dropout";
  profile::Scope scope(op);
  check_defined(x, op);
  EMBER_CHECK(p >= 0 && p <= 1, "{}: probability has to be in [0, 1], got {}", op, p);
  if (!training || p == 0) return x;
  check_floating(x, op);
  if (p == 1) return mul(x, 0.0);  // all dropped, as torch (x * 0: a NaN stays NaN); no 1 / 0
  const DropoutMask mask = dropout_mask(p);
  if (!x.device().is_cpu()) {
    // A device: the same mask from the same key (cuda/random.h), then x * mask * scale in one
    // elementwise kernel
    const Tensor keep = empty({x.numel()}, kBool, x.device());
    cuda::kernels::DropoutMask m;
    m.key = mask.key, m.threshold = mask.threshold, m.n = x.numel();
    m.keep = static_cast<bool*>(keep.data_bytes());
    cuda::detail::launch_dropout_mask(m, x.device(), op);
    Tensor out = empty(x.shape(), x.dtype(), x.device());
    elementwise_on_device(out, cuda::kernels::Op::DropoutScale, x.dtype(),
                          {x, keep.view(x.shape())}, op, mask.scale);
    return record<DropoutBackward>(op, out, {x}, keep, mask.scale);
  }
  // The mask only where a backward or a forward rule will read it (where record makes the node).
  const Tensor keep = any_requires_grad({x}) || detail::forward_wanted(&x, 1)
                          ? empty({x.numel()}, kBool)
                          : Tensor();
  return record<DropoutBackward>(op, apply_dropout_mask(x, mask, op, keep), {x}, keep, mask.scale);
}

}  // namespace ember
