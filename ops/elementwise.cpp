// Elementwise ops: each public function checks its inputs, runs a kernel from ops/kernels.h,
// and records its <Op>Backward Node, which sits right above it. The family helpers (arith,
// scalar_op, unary_math, compare, logical) take the op's name once and use it for the profiler
// scope, the error messages and the Node: a new differentiable math function is one call
// unary_math(x, "gelu", {kn::Op::Gelu}, Saves::Input, forward, derivative, ops_derivative), the
// kernel code naming its formula on a device other than the CPU (cuda/elementwise.h).
#include "ops/elementwise.h"

#include <cmath>
#include <limits>
#include <optional>

#include "graph/autograd.h"
#include "graph/copy.h"
#include "graph/creation.h"
#include "graph/device_backend.h"
#include "graph/profile.h"
#include "ops/common.h"
#include "ops/kernels.h"
#include "ops/vec_math.h"

namespace ember {

namespace {

// What integral (and Bool) inputs compute in: their own dtype, or Float32 as torch's true
// division and math functions. Bool + Bool and Bool * Bool stay Bool (or, and), as torch.
enum class Integral { Keep, ToFloat };

namespace kn = cuda::kernels;

// The kernel of an op on a device other than the CPU (cuda/elementwise.h), with its parameters.
struct DeviceOp {
  kn::Op code;
  double p0 = 0, p1 = 0;
};

bool on_cpu(const Tensor& t) { return t.device().is_cpu(); }

// op(inputs...) on their device: a new tensor of their broadcast shape and dtype `out_dtype`,
// each input converted to `compute` as the kernel reads it.
Tensor on_device(DeviceOp d, DType compute, DType out_dtype, std::initializer_list<Tensor> inputs,
                 std::string_view op) {
  Shape shape = inputs.begin()->shape();
  for (const Tensor& t : inputs)
    if (t.shape() != shape) shape = broadcast_shapes(shape, t.shape(), op);
  Tensor out = empty(shape, out_dtype, inputs.begin()->device());
  elementwise_on_device(out, d.code, compute, inputs, op, d.p0, d.p1);
  return out;
}

// The dtype two operands compute in: torch's promotion, then `integral` for non-floating ones.
DType arith_type(const Tensor& a, const Tensor& b, Integral integral) {
  const DType t = promote(a.dtype(), b.dtype());
  if (is_floating(t)) return t;
  return integral == Integral::ToFloat ? kFloat32 : t;
}

// A double the integral dtypes hold exactly as a whole number: `t op s` with such an s keeps an
// integral tensor integral (torch's int scalars); any other s (fractional, ±inf, NaN, beyond
// int64) makes it Float32.
bool is_whole(double s) { return std::floor(s) == s && s >= -0x1p63 && s < 0x1p63; }

// Int64 arithmetic wraps around on overflow, as torch's (signed overflow is undefined in C++).
template <class T>
T wrapping_add(T x, T y) {
  if constexpr (std::is_same_v<T, int64_t>)
    return static_cast<int64_t>(static_cast<uint64_t>(x) + static_cast<uint64_t>(y));
  else
    return x + y;
}
template <class T>
T wrapping_sub(T x, T y) {
  if constexpr (std::is_same_v<T, int64_t>)
    return static_cast<int64_t>(static_cast<uint64_t>(x) - static_cast<uint64_t>(y));
  else
    return x - y;
}
template <class T>
T wrapping_mul(T x, T y) {
  if constexpr (std::is_same_v<T, int64_t>)
    return static_cast<int64_t>(static_cast<uint64_t>(x) * static_cast<uint64_t>(y));
  else if constexpr (std::is_same_v<T, bool>)
    return x && y;
  else
    return x * y;
}

// torch refuses `-` on Bool tensors: "use ^ or logical_xor" (and logical_not for negation).
void check_not_bool(const Tensor& a, const Tensor& b, std::string_view op) {
  EMBER_CHECK(a.dtype() != kBool || b.dtype() != kBool,
              "{}: subtraction of two Bool tensors (shapes {} and {}) is not supported; use "
              "logical_xor or logical_and/logical_or instead",
              op, a.shape(), b.shape());
}

// Op `op`: out = f(a, b) in arith_type's dtype, broadcasting, recorded as Node N(node_args…).
template <class N, class F, class... Args>
Tensor arith(const Tensor& a, const Tensor& b, std::string_view op, Integral integral, DeviceOp d,
             F f, Args&&... node_args) {
  profile::Scope scope(op);
  check_defined(a, op);
  check_defined(b, op);
  check_same_device(a, b, op);
  const DType t = arith_type(a, b, integral);
  Tensor out;
  if (on_cpu(a)) {
    const Tensor x = as_type(a, t), y = as_type(b, t);
    out = dispatch_all(t, [&]<class T>() { return zip<T, T, T>(x, y, op, f); });
  } else {
    out = on_device(d, t, t, {a, b}, op);
  }
  return record<N>(op, out, {a, b}, std::forward<Args>(node_args)...);
}

}  // namespace

// --- arithmetic between tensors

namespace {

// c = a + b:  dA = dC,  dB = dC  (the engine sums over broadcast dims)
// Forward: dC = dA + dB, broadcast to C's shape.
struct AddBackward final : Node {
  std::vector<Tensor> apply(std::vector<Tensor>& grads) override { return {grads[0], grads[0]}; }
  bool differentiable_backward() const override { return true; }
  std::vector<Tensor> jvp(const std::vector<Tensor>&, const std::vector<Tensor>& t,
                          const std::vector<Tensor>& out) override {
    return {fwd::broadcast_tangent(fwd::add_tangents(t[0], t[1]), out[0].shape())};
  }
};

}  // namespace

Tensor add(const Tensor& a, const Tensor& b) {
  return arith<AddBackward>(a, b, "add", Integral::Keep, {kn::Op::Add},
                            []<class T>(T x, T y) { return wrapping_add(x, y); });
}

namespace {

// c = a - b:  dA = dC,  dB = -dC
struct SubBackward final : Node {
  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    return {grads[0], needs_grad(1) ? neg(grads[0]) : Tensor()};
  }
  bool differentiable_backward() const override { return true; }
  // Forward: dC = dA - dB
  std::vector<Tensor> jvp(const std::vector<Tensor>&, const std::vector<Tensor>& t,
                          const std::vector<Tensor>& out) override {
    const Tensor d = !t[1].defined() ? t[0] : !t[0].defined() ? neg(t[1]) : sub(t[0], t[1]);
    return {fwd::broadcast_tangent(d, out[0].shape())};
  }
};

}  // namespace

Tensor sub(const Tensor& a, const Tensor& b) {
  if (a.defined() && b.defined()) check_not_bool(a, b, "sub");
  return arith<SubBackward>(a, b, "sub", Integral::Keep, {kn::Op::Sub},
                            []<class T>(T x, T y) { return wrapping_sub(x, y); });
}

namespace {

// c = a + alpha · b:  dA = dC,  dB = alpha · dC
struct AddAlphaBackward final : Node {
  explicit AddAlphaBackward(double alpha) : alpha_(alpha) {}
  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    return {grads[0], needs_grad(1) ? mul(grads[0], alpha_) : Tensor()};
  }
  bool differentiable_backward() const override { return true; }
  // Forward: dC = dA + alpha · dB
  std::vector<Tensor> jvp(const std::vector<Tensor>&, const std::vector<Tensor>& t,
                          const std::vector<Tensor>& out) override {
    const Tensor d = !t[1].defined()   ? t[0]
                     : !t[0].defined() ? mul(t[1], alpha_)
                                       : add(t[0], t[1], alpha_);
    return {fwd::broadcast_tangent(d, out[0].shape())};
  }
  double alpha_;
};

// torch's check for alpha: an integral result needs a whole alpha, a Bool one alpha 1. `shown` is
// the alpha the caller passed (sub negates it).
void check_alpha(DType result, double alpha, double shown, const Tensor& a, const Tensor& b,
                 std::string_view op) {
  EMBER_CHECK(is_floating(result) || (result == kBool ? alpha == 1 : is_whole(alpha)),
              "{}: alpha {} does not fit the {} result of {} and {} tensors (an integral "
              "result needs a whole alpha, a Bool one alpha 1)",
              op, shown, result, a.dtype(), b.dtype());
}

// x + alpha · y in T (alpha checked by check_alpha).
auto scaled_sum(double alpha) {
  return [alpha]<class T>(T x, T y) {
    if constexpr (std::is_same_v<T, bool>)
      return bool(x || y);  // alpha 1
    else if constexpr (std::is_same_v<T, int64_t>)
      return wrapping_add(x, wrapping_mul(static_cast<int64_t>(alpha), y));
    else
      return static_cast<T>(x + static_cast<T>(alpha) * y);
  };
}

// a + alpha · b, one pass; sub is alpha negated (named `op` in errors and the graph).
Tensor add_scaled(const Tensor& a, const Tensor& b, double alpha, std::string_view op) {
  check_defined(a, op);
  check_defined(b, op);
  check_alpha(arith_type(a, b, Integral::Keep), alpha, op == "sub" ? -alpha : alpha, a, b, op);
  return arith<AddAlphaBackward>(a, b, op, Integral::Keep, {kn::Op::AddScaled, alpha},
                                 scaled_sum(alpha), alpha);
}

}  // namespace

Tensor add(const Tensor& a, const Tensor& b, double alpha) {
  return add_scaled(a, b, alpha, "add");
}

Tensor sub(const Tensor& a, const Tensor& b, double alpha) {
  if (a.defined() && b.defined()) check_not_bool(a, b, "sub");
  return add_scaled(a, b, -alpha, "sub");
}

namespace {

// c = a * b:  dA = dC * b,  dB = dC * a
struct MulBackward final : Node {
  MulBackward(const Tensor& a, const Tensor& b) {
    if (b.requires_grad()) save(a_, a);
    if (a.requires_grad()) save(b_, b);
  }
  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    const Tensor& g = grads[0];
    return {needs_grad(0) ? mul(g, b_.get()) : Tensor(),
            needs_grad(1) ? mul(g, a_.get()) : Tensor()};
  }
  bool differentiable_backward() const override { return true; }
  // Forward: dC = dA b + a dB
  std::vector<Tensor> jvp(const std::vector<Tensor>& in, const std::vector<Tensor>& t,
                          const std::vector<Tensor>& out) override {
    const Tensor d = fwd::add_tangents(t[0].defined() ? mul(t[0], in[1]) : Tensor(),
                                       t[1].defined() ? mul(in[0], t[1]) : Tensor());
    return {fwd::broadcast_tangent(d, out[0].shape())};
  }
  SavedTensor a_, b_;
};

}  // namespace

Tensor mul(const Tensor& a, const Tensor& b) {
  return arith<MulBackward>(
      a, b, "mul", Integral::Keep, {kn::Op::Mul},
      []<class T>(T x, T y) { return wrapping_mul(x, y); }, a, b);
}

namespace {

// c = a / b:  dA = dC / b,  dB = -dC * a / b²
struct DivBackward final : Node {
  DivBackward(const Tensor& a, const Tensor& b) {
    if (b.requires_grad()) save(a_, a);
    save(b_, b);
  }
  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    const Tensor& g = grads[0];
    Tensor grad_b;
    if (needs_grad(1) && (is_grad_enabled() || !on_cpu(g))) {  // create_graph, a device: ops
      const Tensor b = b_.get();
      grad_b = div(mul(neg(g), a_.get()), mul(b, b));
    } else if (needs_grad(1)) {
      // The operands in the gradient's dtype, one fused pass
      const Tensor a = as_type(a_.get(), g.dtype()), b = as_type(b_.get(), g.dtype());
      dispatch_float(g.dtype(), op(), [&]<class T>() {
        grad_b = empty(g.shape(), g.dtype());
        ternary_into<T, T, T, T>(g, a, b, grad_b, [](T dc, T a, T b) { return -dc * a / (b * b); });
      });
    }
    return {needs_grad(0) ? div(g, b_.get()) : Tensor(), grad_b};
  }
  bool differentiable_backward() const override { return true; }
  // Forward: dC = (dA - c dB) / b
  std::vector<Tensor> jvp(const std::vector<Tensor>& in, const std::vector<Tensor>& t,
                          const std::vector<Tensor>& out) override {
    const Tensor num = !t[1].defined()   ? t[0]
                       : !t[0].defined() ? neg(mul(out[0], t[1]))
                                         : sub(t[0], mul(out[0], t[1]));
    return {fwd::broadcast_tangent(div(num, in[1]), out[0].shape())};
  }
  SavedTensor a_, b_;
};

}  // namespace

// True division: integral operands compute in Float32.
Tensor div(const Tensor& a, const Tensor& b) {
  return arith<DivBackward>(
      a, b, "div", Integral::ToFloat, {kn::Op::Div}, [](auto x, auto y) { return x / y; }, a, b);
}

// --- arithmetic with a double

namespace {

// The dtype of `t op s`: integral tensors stay integral for whole scalars, as torch (with
// Integral::Keep).
DType scalar_type(const Tensor& t, double s, Integral integral) {
  if (is_floating(t.dtype())) return t.dtype();
  return integral == Integral::Keep && is_whole(s) ? kInt64 : kFloat32;
}

// f(x, s) for every element x, in scalar_type's dtype; no Node.
template <class F>
Tensor scalar_map(const Tensor& x, double s, std::string_view op, Integral integral, kn::Op code,
                  F f) {
  const DType t = scalar_type(x, s, integral);
  if (!on_cpu(x)) return on_device({code, s}, t, t, {x}, op);
  const Tensor in = as_type(x, t);
  return dispatch_numeric(in.dtype(), op, [&]<class T>() {
    const T v = cast_value<T>(s);
    return map<T, T>(in, [=](T e) { return f(e, v); });
  });
}

// dA = dC * scale: the backward of every op that is linear in one input (neg, x*s, x/s, s-x).
struct ScaleBackward final : Node {
  explicit ScaleBackward(double scale) : scale_(scale) {}
  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    return {scale_ == 1.0 ? grads[0] : mul(grads[0], scale_)};
  }
  bool differentiable_backward() const override { return true; }
  // Forward: dY = dX * scale
  std::vector<Tensor> jvp(const std::vector<Tensor>&, const std::vector<Tensor>& t,
                          const std::vector<Tensor>&) override {
    return {scale_ == 1.0 ? t[0] : mul(t[0], scale_)};
  }
  double scale_;
};

// Op `op`: y = f(x, s), linear in x:  dX = dY * scale
template <class F>
Tensor scalar_op(const Tensor& x, double s, std::string_view op, Integral integral, double scale,
                 kn::Op code, F f) {
  profile::Scope scope(op);
  check_defined(x, op);
  return record<ScaleBackward>(op, scalar_map(x, s, op, integral, code, f), {x}, scale);
}

}  // namespace

// y = x + s, x - s, s - x, x * s, x / s:  dX = dY * scale, the argument before the function
Tensor add(const Tensor& a, double b) {
  return scalar_op(a, b, "add", Integral::Keep, 1.0, kn::Op::AddScalar,
                   []<class T>(T x, T s) { return wrapping_add(x, s); });
}
Tensor sub(const Tensor& a, double b) {
  return scalar_op(a, b, "sub", Integral::Keep, 1.0, kn::Op::SubScalar,
                   []<class T>(T x, T s) { return wrapping_sub(x, s); });
}
Tensor rsub(const Tensor& a, double b) {
  return scalar_op(a, b, "rsub", Integral::Keep, -1.0, kn::Op::RsubScalar,
                   []<class T>(T x, T s) { return wrapping_sub(s, x); });
}
Tensor mul(const Tensor& a, double b) {
  return scalar_op(a, b, "mul", Integral::Keep, b, kn::Op::MulScalar,
                   []<class T>(T x, T s) { return wrapping_mul(x, s); });
}
Tensor div(const Tensor& a, double b) {
  return scalar_op(a, b, "div", Integral::ToFloat, 1.0 / b, kn::Op::DivScalar,
                   [](auto x, auto s) { return x / s; });
}

namespace {

// y = s / x:  dX = -dY * s / x² = -dY * y / x
struct RdivBackward final : Node {
  RdivBackward(const Tensor& x, const Tensor& y) { save(x_, x), save_output(y_, y); }
  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    const Tensor& g = grads[0];
    if (is_grad_enabled() || !on_cpu(g))  // create_graph, a device: in ops
      return {div(mul(neg(g), y_.get()), x_.get())};
    Tensor grad_x = empty(g.shape(), g.dtype());
    dispatch_float(g.dtype(), op(), [&]<class T>() {
      ternary_into<T, T, T, T>(g, y_.get(), x_.get(), grad_x,
                               [](T dy, T y, T x) { return -dy * y / x; });
    });
    return {grad_x};
  }
  bool differentiable_backward() const override { return true; }
  // Forward: dY = -dX y / x
  std::vector<Tensor> jvp(const std::vector<Tensor>& in, const std::vector<Tensor>& t,
                          const std::vector<Tensor>& out) override {
    return {div(mul(neg(t[0]), out[0]), in[0])};
  }
  SavedTensor x_, y_;
};

}  // namespace

Tensor rdiv(const Tensor& a, double b) {
  constexpr std::string_view op = "rdiv";
  profile::Scope scope(op);
  check_defined(a, op);
  const Tensor x = as_floating(a);
  Tensor out = scalar_map(x, b, op, Integral::ToFloat, kn::Op::RdivScalar,
                          [](auto v, auto s) { return s / v; });
  return record<RdivBackward>(op, out, {a}, x, out);
}

// y = -x:  dX = -dY
Tensor neg(const Tensor& x) {
  constexpr std::string_view op = "neg";
  profile::Scope scope(op);
  check_defined(x, op);
  EMBER_CHECK(x.dtype() != kBool,
              "neg: negation of a Bool tensor (shape {}) is not supported; use logical_not",
              x.shape());
  Tensor out = !on_cpu(x) ? on_device({kn::Op::Neg}, x.dtype(), x.dtype(), {x}, op)
                          : dispatch_numeric(x.dtype(), op, [&]<class T>() {
                              return map<T, T>(x, [](T v) { return wrapping_sub(T(0), v); });
                            });
  return record<ScaleBackward>(op, out, {x}, -1.0);
}

// --- math functions: y = f(x), with dX = derivative(dY, x or y) in one fused kernel

namespace {

// dX = derivative(dY, saved) in one fused kernel; under create_graph the same formula in ops,
// ops_derivative(dY, saved), which records the backward (Note [Double backward]). An op without
// one (nullptr) has a first-order backward only.
template <class D, class O>
struct UnaryBackward final : Node {
  static constexpr bool kInOps = !std::is_same_v<O, std::nullptr_t>;
  UnaryBackward(const Tensor& saved, bool is_output, D derivative, O ops_derivative)
      : derivative_(derivative), ops_derivative_(ops_derivative), is_output_(is_output) {
    is_output ? save_output(saved_, saved) : save(saved_, saved);
  }
  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    const Tensor& g = grads[0];
    if constexpr (kInOps) {  // create_graph, or a device: in ops
      if (is_grad_enabled() || !on_cpu(g)) return {ops_derivative_(g, saved_.get())};
    }
    return {dispatch_float(g.dtype(), name(), [&]<class T>() {
      return zip<T, T, T>(g, saved_.get(), name(), derivative_);
    })};
  }
  bool differentiable_backward() const override { return kInOps; }
  // Forward: dY = derivative(dX, x or y), the backward's formula (the Jacobian is diagonal)
  std::vector<Tensor> jvp(const std::vector<Tensor>& in, const std::vector<Tensor>& t,
                          const std::vector<Tensor>& out) override {
    if constexpr (kInOps)
      return {ops_derivative_(t[0], is_output_ ? out[0] : in[0])};
    else
      return Node::jvp(in, t, out);
  }
  D derivative_;
  O ops_derivative_;
  bool is_output_;
  SavedTensor saved_;
};

enum class Saves { Input, Output };

// Op `op`: y = f(x) with dX = derivative(dY, saved), `saved` the input or the output as `saves`
// says. Integral inputs compute in Float32, or in their own dtype with Integral::Keep (relu, abs).
template <Integral I = Integral::ToFloat, class F, class D, class O>
Tensor unary_math(const Tensor& input, std::string_view op, DeviceOp d, Saves saves, F f,
                  D derivative, O ops_derivative) {
  profile::Scope scope(op);
  check_defined(input, op);
  if constexpr (I == Integral::Keep) {
    if (!is_floating(input.dtype())) {
      if (!on_cpu(input)) return on_device(d, input.dtype(), input.dtype(), {input}, op);
      return dispatch_numeric(input.dtype(), op, [&]<class T>() { return map<T, T>(input, f); });
    }
  }
  const Tensor x = as_floating(input);
  Tensor out = !on_cpu(x)
                   ? on_device(d, x.dtype(), x.dtype(), {x}, op)
                   : dispatch_float(x.dtype(), op, [&]<class T>() { return map<T, T>(x, f); });
  return record<UnaryBackward<D, O>>(op, out, {input}, saves == Saves::Input ? x : out,
                                     saves == Saves::Output, derivative, ops_derivative);
}

// z = a b (alpha c + beta), broadcasting, in a's dtype: the second derivatives of tanh and
// sigmoid (affine in their output) times two gradients, in one kernel. Its backward is the same
// op: dA = op(dZ, b, c), dB = op(dZ, a, c), dC = dZ a b alpha = op(dZ, a, b) with (alpha, 0).
struct Affine {
  double alpha, beta;
};

Tensor affine_product(const Tensor& a, const Tensor& b, const Tensor& c, Affine f);

struct AffineProductBackward final : Node {
  AffineProductBackward(const Tensor& a, const Tensor& b, const Tensor& c, Affine f) : f_(f) {
    save(a_, a), save(b_, b), save(c_, c);
  }
  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    const Tensor& dz = grads[0];
    const Tensor a = a_.get(), b = b_.get(), c = c_.get();
    return {needs_grad(0) ? affine_product(dz, b, c, f_) : Tensor(),
            needs_grad(1) ? affine_product(dz, a, c, f_) : Tensor(),
            needs_grad(2) && f_.alpha != 0 ? affine_product(dz, a, b, {f_.alpha, 0}) : Tensor()};
  }
  bool differentiable_backward() const override { return true; }
  // Forward: dZ = op(dA, b, c) + op(a, dB, c) + dC a b alpha
  std::vector<Tensor> jvp(const std::vector<Tensor>& in, const std::vector<Tensor>& t,
                          const std::vector<Tensor>& out) override {
    Tensor d;
    if (t[0].defined()) d = affine_product(t[0], in[1], in[2], f_);
    if (t[1].defined()) d = fwd::add_tangents(d, affine_product(in[0], t[1], in[2], f_));
    if (t[2].defined() && f_.alpha != 0)
      d = fwd::add_tangents(d, affine_product(in[0], in[1], t[2], {f_.alpha, 0}));
    return {fwd::broadcast_tangent(d, out[0].shape())};
  }
  Affine f_;
  SavedTensor a_, b_, c_;
};

Tensor affine_product(const Tensor& a, const Tensor& b, const Tensor& c, Affine f) {
  constexpr std::string_view op = "affine_product";
  profile::Scope scope(op);
  const Shape shape = broadcast_shapes(broadcast_shapes(a.shape(), b.shape(), op), c.shape(), op);
  if (!on_cpu(a)) {
    Tensor out =
        on_device({kn::Op::AffineProduct, f.alpha, f.beta}, a.dtype(), a.dtype(), {a, b, c}, op);
    return record<AffineProductBackward>(op, out, {a, b, c}, a, b, c, f);
  }
  const Tensor y = as_type(b, a.dtype()), z = as_type(c, a.dtype());
  Tensor out = empty(shape, a.dtype());
  dispatch_float(a.dtype(), op, [&]<class T>() {
    const T alpha = static_cast<T>(f.alpha), beta = static_cast<T>(f.beta);
    ternary_into<T, T, T, T>(a, y, z, out,
                             [=](T u, T v, T w) { return u * v * (alpha * w + beta); });
  });
  return record<AffineProductBackward>(op, out, {a, b, c}, a, b, c, f);
}

// The derivative of a math function as one op (torch's tanh_backward, sigmoid_backward,
// threshold_backward): z = k(g, s) = g d(s), with g the incoming gradient and s the saved input
// or output. Under create_graph a function's backward is this one fused kernel instead of the
// two to four ops of its formula, and its own backward is dG = k(dZ, s) (this op again) and
// dS = dZ g d'(s), d' affine (tanh: -2s, sigmoid: 1 - 2s; affine_product), or none where d is
// piecewise constant (relu): s then gets no gradient.
template <class K>
Tensor derivative_op(std::string_view op, kn::Op code, const Tensor& g, const Tensor& s, K k,
                     std::optional<Affine> d2);

template <class K>
struct DerivativeBackward final : Node {
  DerivativeBackward(const Tensor& g, const Tensor& s, kn::Op code, K k, std::optional<Affine> d2)
      : code_(code), k_(k), d2_(d2) {
    if (d2 && s.requires_grad()) save(g_, g);
    save(s_, s);
  }
  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    const Tensor& dz = grads[0];
    const Tensor s = s_.get();
    return {needs_grad(0) ? derivative_op(op(), code_, dz, s, k_, d2_) : Tensor(),
            d2_ && needs_grad(1) ? affine_product(dz, g_.get(), s, *d2_) : Tensor()};
  }
  bool differentiable_backward() const override { return true; }
  // Forward: dZ = k(dG, s) + dS g d'(s)
  std::vector<Tensor> jvp(const std::vector<Tensor>& in, const std::vector<Tensor>& t,
                          const std::vector<Tensor>& out) override {
    Tensor d;
    if (t[0].defined()) d = derivative_op(op(), code_, t[0], in[1], k_, d2_);
    if (t[1].defined() && d2_) d = fwd::add_tangents(d, affine_product(t[1], in[0], in[1], *d2_));
    return {fwd::broadcast_tangent(d, out[0].shape())};
  }
  kn::Op code_;
  K k_;
  std::optional<Affine> d2_;
  SavedTensor g_, s_;
};

template <class K>
Tensor derivative_op(std::string_view op, kn::Op code, const Tensor& g, const Tensor& s, K k,
                     std::optional<Affine> d2) {
  profile::Scope scope(op);
  Tensor out;
  if (!on_cpu(g)) {
    out = on_device({code}, g.dtype(), g.dtype(), {g, s}, op);
  } else {
    const Tensor v = as_type(s, g.dtype());
    out = dispatch_float(g.dtype(), op, [&]<class T>() { return zip<T, T, T>(g, v, op, k); });
  }
  return record<DerivativeBackward<K>>(op, out, {g, s}, g, s, code, k, d2);
}

}  // namespace

// y = x^p:  dX = dY p x^(p-1)
Tensor pow(const Tensor& x, double p) {
  constexpr std::string_view op = "pow";
  if (p == 2.0) {
    return unary_math(
        x, op, {kn::Op::Pow, 2.0}, Saves::Input, [](auto v) { return v * v; },
        [](auto g, auto v) { return g * 2 * v; },
        [](const Tensor& g, const Tensor& s) { return mul(mul(g, s), 2.0); });
  }
  return unary_math(
      x, op, {kn::Op::Pow, p}, Saves::Input,
      [p](auto v) { return static_cast<decltype(v)>(std::pow(v, p)); },
      [p](auto g, auto v) {
        using T = decltype(v);
        return p == 0 ? T(0) : static_cast<T>(g * p * std::pow(v, p - 1));
      },
      [p](const Tensor& g, const Tensor& s) {
        return p == 0 ? mul(g, 0.0) : mul(g, mul(pow(s, p - 1), p));
      });
}

// The math functions below that have a vectorisable form in ops/vec_math.h (exp, log, tanh,
// sigmoid, gelu, silu) use it in the forward and in the derivative: over contiguous data their
// loops become SIMD code.

// y = exp(x):  dX = dY * y
Tensor exp(const Tensor& x) {
  return unary_math(
      x, "exp", {kn::Op::Exp}, Saves::Output, [](auto v) EMBER_VEC_LAMBDA { return vexp(v); },
      [](auto g, auto y) EMBER_VEC_LAMBDA { return g * y; },
      [](const Tensor& g, const Tensor& s) { return mul(g, s); });
}

// y = log(x):  dX = dY / x
Tensor log(const Tensor& x) {
  return unary_math(
      x, "log", {kn::Op::Log}, Saves::Input, [](auto v) EMBER_VEC_LAMBDA { return vlog(v); },
      [](auto g, auto v) EMBER_VEC_LAMBDA { return g / v; },
      [](const Tensor& g, const Tensor& s) { return div(g, s); });
}

// y = sqrt(x):  dX = dY / (2 y)
Tensor sqrt(const Tensor& x) {
  return unary_math(
      x, "sqrt", {kn::Op::Sqrt}, Saves::Output, [](auto v) { return std::sqrt(v); },
      [](auto g, auto y) { return g / (2 * y); },
      [](const Tensor& g, const Tensor& s) { return div(g, mul(s, 2.0)); });
}

// y = sin(x):  dX = dY cos(x)
Tensor sin(const Tensor& x) {
  return unary_math(
      x, "sin", {kn::Op::Sin}, Saves::Input, [](auto v) { return std::sin(v); },
      [](auto g, auto v) { return g * std::cos(v); },
      [](const Tensor& g, const Tensor& s) { return mul(g, cos(s)); });
}

// y = cos(x):  dX = -dY sin(x)
Tensor cos(const Tensor& x) {
  return unary_math(
      x, "cos", {kn::Op::Cos}, Saves::Input, [](auto v) { return std::cos(v); },
      [](auto g, auto v) { return -g * std::sin(v); },
      [](const Tensor& g, const Tensor& s) { return neg(mul(g, sin(s))); });
}

// y = tanh(x):  dX = dY (1 - y²)
Tensor tanh(const Tensor& x) {
  return unary_math(
      x, "tanh", {kn::Op::Tanh}, Saves::Output, [](auto v) EMBER_VEC_LAMBDA { return vtanh(v); },
      [](auto g, auto y) EMBER_VEC_LAMBDA { return g * (1 - y * y); },
      [](const Tensor& g, const Tensor& y) {  // d(y) = 1 - y², d'(y) = -2y
        return derivative_op(
            "tanh_backward", kn::Op::TanhBackward, g, y,
            [](auto a, auto v) { return a * (1 - v * v); }, Affine{-2, 0});
      });
}

// y = 1 / (1 + exp(-x)):  dX = dY y (1 - y)
Tensor sigmoid(const Tensor& x) {
  return unary_math(
      x, "sigmoid", {kn::Op::Sigmoid}, Saves::Output,
      [](auto v) EMBER_VEC_LAMBDA { return vsigmoid(v); },
      [](auto g, auto y) EMBER_VEC_LAMBDA { return g * y * (1 - y); },
      [](const Tensor& g, const Tensor& y) {  // d(y) = y (1 - y), d'(y) = 1 - 2y
        return derivative_op(
            "sigmoid_backward", kn::Op::SigmoidBackward, g, y,
            [](auto a, auto v) { return a * v * (1 - v); }, Affine{-2, 1});
      });
}

namespace {

// φ(x) = exp(-x²/2) / √(2π), the standard normal density, in ops.
Tensor normal_pdf(const Tensor& x) { return mul(exp(mul(mul(x, x), -0.5)), 0.3989422804014327); }

// y = Φ(x), the standard normal CDF, an op of its own for gelu's backward under create_graph:
// dX = dY φ(x)
Tensor normal_cdf(const Tensor& x) {
  return unary_math(
      x, "normal_cdf", {kn::Op::NormalCdf}, Saves::Input,
      [](auto v) EMBER_VEC_LAMBDA { return vnormal_cdf(v); },
      [](auto g, auto v) EMBER_VEC_LAMBDA { return g * vnormal_cdf_pdf(v).pdf; },
      [](const Tensor& g, const Tensor& x) { return mul(g, normal_pdf(x)); });
}

}  // namespace

// torch's gelu. "none": y = x Φ(x) = x (1 + erf(x / √2)) / 2,  dX = dY (Φ(x) + x φ(x)).
// "tanh": y = x (1 + tanh(u)) / 2 with u = √(2/π) (x + 0.044715 x³), computed as x σ(2u) (the
//         same function, without 1 + tanh's cancellation for negative x);
//         dX = dY ((1 + t) / 2 + x (1 - t²) u' / 2) = dY (s + 2 x s (1 - s) u'),  s = σ(2u),
//         t = tanh(u) = 2s - 1, u' = √(2/π) (1 + 3 · 0.044715 x²).
Tensor gelu(const Tensor& x, std::string_view approximate) {
  EMBER_CHECK(approximate == "none" || approximate == "tanh",
              "gelu: approximate must be \"none\" or \"tanh\", got \"{}\"", approximate);
  if (approximate == "tanh") {
    return unary_math(
        x, "gelu", {kn::Op::GeluTanh}, Saves::Input,
        [](auto v) EMBER_VEC_LAMBDA {
          using T = decltype(v);
          const T u = T(0.7978845608028654) * (v + T(0.044715) * v * v * v);
          return v * vsigmoid(T(2) * u);
        },
        [](auto g, auto v) EMBER_VEC_LAMBDA {
          using T = decltype(v);
          const T s = vsigmoid(T(1.5957691216057308) * (v + T(0.044715) * v * v * v));
          const T du = T(0.7978845608028654) * (T(1) + T(3 * 0.044715) * v * v);
          return g * (s + T(2) * v * s * (T(1) - s) * du);
        },
        [](const Tensor& g, const Tensor& x) {
          const Tensor x2 = mul(x, x);
          const Tensor s = sigmoid(mul(mul(x, add(mul(x2, 0.044715), 1.0)), 1.5957691216057308));
          const Tensor du = mul(add(mul(x2, 3 * 0.044715), 1.0), 0.7978845608028654);
          return mul(g, add(s, mul(mul(mul(x, s), rsub(s, 1.0)), mul(du, 2.0))));
        });
  }
  return unary_math(
      x, "gelu", {kn::Op::Gelu}, Saves::Input,
      [](auto v) EMBER_VEC_LAMBDA { return v * vnormal_cdf(v); },
      [](auto g, auto v) EMBER_VEC_LAMBDA {
        const auto [cdf, pdf] = vnormal_cdf_pdf(v);
        return g * vec_detail::fmadd(v, pdf, cdf);
      },
      [](const Tensor& g, const Tensor& x) {
        return mul(g, add(normal_cdf(x), mul(x, normal_pdf(x))));
      });
}

// y = x σ(x):  dX = dY σ(x) (1 + x (1 - σ(x)))
Tensor silu(const Tensor& x) {
  return unary_math(
      x, "silu", {kn::Op::Silu}, Saves::Input,
      [](auto v) EMBER_VEC_LAMBDA { return v * vsigmoid(v); },
      [](auto g, auto v) EMBER_VEC_LAMBDA {
        const auto s = vsigmoid(v);
        return g * s * (1 + v * (1 - s));
      },
      [](const Tensor& g, const Tensor& x) {
        const Tensor s = sigmoid(x);
        return mul(g, mul(s, add(mul(x, rsub(s, 1.0)), 1.0)));
      });
}

// y = max(x, 0):  dX = dY where y > 0. As torch's: NaN stays NaN and passes its gradient (written
// as "not <= 0", which NaN is not).
Tensor relu(const Tensor& x) {
  return unary_math<Integral::Keep>(
      x, "relu", {kn::Op::Relu}, Saves::Output,
      [](auto v) { return !(v <= 0) ? v : decltype(v)(0); },
      [](auto g, auto y) { return !(y <= 0) ? g : decltype(g)(0); },
      [](const Tensor& g, const Tensor& y) { return threshold_backward(g, y); });
}

Tensor threshold_backward(const Tensor& g, const Tensor& y) {  // y gets no gradient
  return derivative_op(
      "threshold_backward", kn::Op::ThresholdBackward, g, y,
      [](auto a, auto v) { return !(v <= 0) ? a : decltype(a)(0); }, std::nullopt);
}

// y = |x|:  dX = dY sign(x)
Tensor abs(const Tensor& x) {
  return unary_math<Integral::Keep>(
      x, "abs", {kn::Op::Abs}, Saves::Input, [](auto v) { return std::abs(v); },
      [](auto g, auto v) {
        using T = decltype(v);
        return v > 0 ? g : v < 0 ? -g : T(0);
      },
      [](const Tensor& g, const Tensor& s) {
        return sub(masked_fill(g, le(s, 0.0), 0.0), masked_fill(g, ge(s, 0.0), 0.0));
      });
}

// --- clamp, minimum, maximum

namespace {

// y = min(max(x, lo), hi), each bound only when given:  dX = dY where lo <= x <= hi (as torch's
// clamp_backward: NaN inputs get 0); under create_graph masked_fill(dY, outside, 0)
struct ClampBackward final : Node {
  ClampBackward(const Tensor& x, std::optional<double> lo, std::optional<double> hi)
      : lo_(lo), hi_(hi) {
    save(x_, x);
  }
  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    const Tensor& g = grads[0];
    if (!on_cpu(g)) {  // a device: in ops
      constexpr double inf = std::numeric_limits<double>::infinity();
      const Tensor x = x_.get();
      const Tensor outside =
          on_device({kn::Op::OutsideClamp, lo_.value_or(-inf), hi_.value_or(inf)}, x.dtype(), kBool,
                    {x}, op());
      return {masked_fill(g, outside, 0.0)};
    }
    return {dispatch_float(g.dtype(), op(), [&]<class T>() {
      constexpr T inf = std::numeric_limits<T>::infinity();
      const T lo = lo_ ? static_cast<T>(*lo_) : -inf, hi = hi_ ? static_cast<T>(*hi_) : inf;
      if (is_grad_enabled())  // create_graph
        return masked_fill(g, map<T, bool>(x_.get(), [=](T v) { return !(v >= lo && v <= hi); }),
                           0.0);
      return zip<T, T, T>(g, x_.get(), op(),
                          [=](T d, T v) { return v >= lo && v <= hi ? d : T(0); });
    })};
  }
  bool differentiable_backward() const override { return true; }
  // Forward: dY = dX where lo <= x <= hi, else 0
  std::vector<Tensor> jvp(const std::vector<Tensor>& in, const std::vector<Tensor>& t,
                          const std::vector<Tensor>&) override {
    const Tensor& x = in[0];
    Tensor inside = lo_ ? ge(x, *lo_) : Tensor();
    if (hi_) inside = inside.defined() ? logical_and(inside, le(x, *hi_)) : le(x, *hi_);
    return {masked_fill(t[0], logical_not(inside), 0.0)};
  }
  std::optional<double> lo_, hi_;
  SavedTensor x_;
};

}  // namespace

// As torch.clamp: a floating tensor keeps its dtype; an integral (or Bool) one becomes Int64
// for whole bounds and Float32 otherwise. NaN in x stays NaN; min > max gives max everywhere.
Tensor clamp(const Tensor& x, std::optional<double> min, std::optional<double> max) {
  constexpr std::string_view op = "clamp";
  profile::Scope scope(op);
  check_defined(x, op);
  EMBER_CHECK(min || max, "{}: at least one of min and max must be given (both are nullopt)", op);
  const bool whole = (!min || is_whole(*min)) && (!max || is_whole(*max));
  const DType t = is_floating(x.dtype()) ? x.dtype() : whole ? kInt64 : kFloat32;
  const Tensor in = as_type(x, t);
  if (!on_cpu(x)) {
    constexpr double inf = std::numeric_limits<double>::infinity();
    Tensor out = on_device({kn::Op::Clamp, min.value_or(-inf), max.value_or(inf)}, t, t, {in}, op);
    return record<ClampBackward>(op, out, {x}, in, min, max);
  }
  Tensor out = dispatch_numeric(t, op, [&]<class T>() {
    const T lowest = std::numeric_limits<T>::has_infinity ? -std::numeric_limits<T>::infinity()
                                                          : std::numeric_limits<T>::lowest();
    const T highest = std::numeric_limits<T>::has_infinity ? std::numeric_limits<T>::infinity()
                                                           : std::numeric_limits<T>::max();
    const T lo = min ? cast_value<T>(*min) : lowest, hi = max ? cast_value<T>(*max) : highest;
    return map<T, T>(in, [=](T v) {
      const T r = v < lo ? lo : v;  // NaN compares false and passes through
      return r > hi ? hi : r;
    });
  });
  return record<ClampBackward>(op, out, {x}, in, min, max);
}

namespace {

// c = maximum(a, b) (Max) or minimum(a, b), split as torch: the selected operand gets dC, the
// other 0, and ties give dC / 2 to each (elements where either is NaN: dC to both). Under
// create_graph: dA = masked_fill(where(a == b, dC / 2, dC), b wins, 0), likewise dB.
template <bool Max>
struct ExtremumBackward final : Node {
  ExtremumBackward(const Tensor& a, const Tensor& b) { save(a_, a), save(b_, b); }
  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    const Tensor& g = grads[0];
    if (is_grad_enabled() || !on_cpu(g)) {  // create_graph, a device: in ops
      const Tensor a = a_.get(), b = b_.get();
      const Tensor split = where(eq(a, b), mul(g, 0.5), g);
      const auto grad_of = [&](const Tensor& x, const Tensor& y) {
        return masked_fill(split, Max ? lt(x, y) : gt(x, y), 0.0);
      };
      return {needs_grad(0) ? grad_of(a, b) : Tensor(), needs_grad(1) ? grad_of(b, a) : Tensor()};
    }
    return dispatch_float(g.dtype(), op(), [&]<class T>() {
      const Tensor a = as_type(a_.get(), g.dtype()), b = as_type(b_.get(), g.dtype());
      // The gradient of the operand x against the other y: 0 where y wins.
      const auto grad_of = [&](const Tensor& x, const Tensor& y) {
        Tensor out = empty(g.shape(), g.dtype());
        ternary_into<T, T, T, T>(g, x, y, out, [](T d, T u, T v) {
          return u == v ? d / T(2) : (Max ? u < v : u > v) ? T(0) : d;
        });
        return out;
      };
      return std::vector<Tensor>{needs_grad(0) ? grad_of(a, b) : Tensor(),
                                 needs_grad(1) ? grad_of(b, a) : Tensor()};
    });
  }
  bool differentiable_backward() const override { return true; }
  // Forward: dC = dA where a wins, dB where b wins, (dA + dB) / 2 at ties
  std::vector<Tensor> jvp(const std::vector<Tensor>& in, const std::vector<Tensor>& t,
                          const std::vector<Tensor>&) override {
    const Tensor &a = in[0], &b = in[1];
    const Tensor tie = eq(a, b);
    const auto part = [&](const Tensor& d, const Tensor& x, const Tensor& y) {
      return d.defined() ? masked_fill(where(tie, mul(d, 0.5), d), Max ? lt(x, y) : gt(x, y), 0.0)
                         : Tensor();
    };
    return {fwd::add_tangents(part(t[0], a, b), part(t[1], b, a))};
  }
  SavedTensor a_, b_;
};

}  // namespace

// Elementwise max/min of a and b, broadcasting, in the promoted dtype (Bool stays Bool); a NaN
// in either operand gives NaN, as torch.
Tensor maximum(const Tensor& a, const Tensor& b) {
  return arith<ExtremumBackward<true>>(
      a, b, "maximum", Integral::Keep, {kn::Op::Maximum},
      []<class T>(T x, T y) {
        if constexpr (std::is_floating_point_v<T>)
          return x > y || x != x ? x : y;
        else
          return x > y ? x : y;
      },
      a, b);
}
Tensor minimum(const Tensor& a, const Tensor& b) {
  return arith<ExtremumBackward<false>>(
      a, b, "minimum", Integral::Keep, {kn::Op::Minimum},
      []<class T>(T x, T y) {
        if constexpr (std::is_floating_point_v<T>)
          return x < y || x != x ? x : y;
        else
          return x < y ? x : y;
      },
      a, b);
}

// --- isnan, isfinite -> Bool (integral elements are never NaN and always finite)

Tensor isnan(const Tensor& x) {
  constexpr std::string_view op = "isnan";
  profile::Scope scope(op);
  check_defined(x, op);
  if (!on_cpu(x)) return on_device({kn::Op::IsNan}, x.dtype(), kBool, {x}, op);
  return dispatch_all(x.dtype(), [&]<class T>() {
    return map<T, bool>(x, [](T v) {
      if constexpr (std::is_floating_point_v<T>)
        return v != v;
      else
        return (void)v, false;
    });
  });
}

Tensor isfinite(const Tensor& x) {
  constexpr std::string_view op = "isfinite";
  profile::Scope scope(op);
  check_defined(x, op);
  if (!on_cpu(x)) return on_device({kn::Op::IsFinite}, x.dtype(), kBool, {x}, op);
  return dispatch_all(x.dtype(), [&]<class T>() {
    return map<T, bool>(x, [](T v) {
      if constexpr (std::is_floating_point_v<T>)
        return std::isfinite(v);
      else
        return (void)v, true;
    });
  });
}

// --- comparisons -> Bool

namespace {

// Op `op`: f(a, b) in the promoted dtype, broadcasting.
template <class F>
Tensor compare(const Tensor& a, const Tensor& b, std::string_view op, kn::Op code, F f) {
  profile::Scope scope(op);
  check_defined(a, op);
  check_defined(b, op);
  check_same_device(a, b, op);
  const DType t = promote(a.dtype(), b.dtype());
  if (!on_cpu(a)) return on_device({code}, t, kBool, {a, b}, op);
  const Tensor x = as_type(a, t), y = as_type(b, t);
  return dispatch_all(t, [&]<class T>() { return zip<T, T, bool>(x, y, op, f); });
}

// Op `op` against a double, as torch: the scalar is cast to a floating tensor's dtype.
template <class F>
Tensor compare(const Tensor& a, double b, std::string_view op, kn::Op code, F f) {
  profile::Scope scope(op);
  check_defined(a, op);
  if (!on_cpu(a))  // integral elements compare as doubles, as below
    return on_device({code, b}, is_floating(a.dtype()) ? a.dtype() : kFloat64, kBool, {a}, op);
  return dispatch_all(a.dtype(), [&]<class T>() {
    if constexpr (std::is_floating_point_v<T>) {
      const T s = static_cast<T>(b);
      return map<T, bool>(a, [=](T v) { return f(v, s); });
    } else {
      return map<T, bool>(a, [=](T v) { return f(static_cast<double>(v), b); });
    }
  });
}

}  // namespace

Tensor eq(const Tensor& a, const Tensor& b) {
  return compare(a, b, "eq", kn::Op::Eq, std::equal_to<>());
}
Tensor ne(const Tensor& a, const Tensor& b) {
  return compare(a, b, "ne", kn::Op::Ne, std::not_equal_to<>());
}
Tensor lt(const Tensor& a, const Tensor& b) {
  return compare(a, b, "lt", kn::Op::Lt, std::less<>());
}
Tensor le(const Tensor& a, const Tensor& b) {
  return compare(a, b, "le", kn::Op::Le, std::less_equal<>());
}
Tensor gt(const Tensor& a, const Tensor& b) {
  return compare(a, b, "gt", kn::Op::Gt, std::greater<>());
}
Tensor ge(const Tensor& a, const Tensor& b) {
  return compare(a, b, "ge", kn::Op::Ge, std::greater_equal<>());
}
Tensor eq(const Tensor& a, double b) {
  return compare(a, b, "eq", kn::Op::EqScalar, std::equal_to<>());
}
Tensor ne(const Tensor& a, double b) {
  return compare(a, b, "ne", kn::Op::NeScalar, std::not_equal_to<>());
}
Tensor lt(const Tensor& a, double b) {
  return compare(a, b, "lt", kn::Op::LtScalar, std::less<>());
}
Tensor le(const Tensor& a, double b) {
  return compare(a, b, "le", kn::Op::LeScalar, std::less_equal<>());
}
Tensor gt(const Tensor& a, double b) {
  return compare(a, b, "gt", kn::Op::GtScalar, std::greater<>());
}
Tensor ge(const Tensor& a, double b) {
  return compare(a, b, "ge", kn::Op::GeScalar, std::greater_equal<>());
}

// --- logic: nonzero is true, as torch

namespace {

Tensor as_bool(const Tensor& t) { return t.dtype() == kBool ? t : ne(t, 0.0); }

// Op `op`: f(a, b) on the operands as Bool, broadcasting.
template <class F>
Tensor logical(const Tensor& a, const Tensor& b, std::string_view op, kn::Op code, F f) {
  profile::Scope scope(op);
  check_defined(a, op);
  check_defined(b, op);
  check_same_device(a, b, op);
  if (!on_cpu(a)) return on_device({code}, kBool, kBool, {a, b}, op);  // nonzero reads as true
  return zip<bool, bool, bool>(as_bool(a), as_bool(b), op, f);
}

}  // namespace

Tensor logical_not(const Tensor& mask) {
  constexpr std::string_view op = "logical_not";
  profile::Scope scope(op);
  check_defined(mask, op);
  if (!on_cpu(mask)) return on_device({kn::Op::LogicalNot}, kBool, kBool, {mask}, op);
  return map<bool, bool>(as_bool(mask), [](bool v) { return !v; });
}
Tensor logical_and(const Tensor& a, const Tensor& b) {
  return logical(a, b, "logical_and", kn::Op::LogicalAnd, [](bool x, bool y) { return x && y; });
}
Tensor logical_or(const Tensor& a, const Tensor& b) {
  return logical(a, b, "logical_or", kn::Op::LogicalOr, [](bool x, bool y) { return x || y; });
}

// --- where and masked_fill

namespace {

// out = cond ? a : b:  dA = cond ? dOut : 0,  dB = cond ? 0 : dOut
struct WhereBackward final : Node {
  explicit WhereBackward(const Tensor& cond) { save(cond_, cond); }
  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    const Tensor& g = grads[0];
    if (is_grad_enabled() || !on_cpu(g)) {  // create_graph, a device: in ops
      const Tensor cond = cond_.get();
      return {Tensor(), needs_grad(1) ? masked_fill(g, logical_not(cond), 0.0) : Tensor(),
              needs_grad(2) ? masked_fill(g, cond, 0.0) : Tensor()};
    }
    return dispatch_float(g.dtype(), op(), [&]<class T>() {
      const auto pick = [&](bool keep_when) {
        return zip<bool, T, T>(cond_.get(), g, op(),
                               [=](bool c, T d) { return c == keep_when ? d : T(0); });
      };
      return std::vector<Tensor>{Tensor(), needs_grad(1) ? pick(true) : Tensor(),
                                 needs_grad(2) ? pick(false) : Tensor()};
    });
  }
  bool differentiable_backward() const override { return true; }
  // Forward: dOut = cond ? dA : dB
  std::vector<Tensor> jvp(const std::vector<Tensor>& in, const std::vector<Tensor>& t,
                          const std::vector<Tensor>& out) override {
    return {
        where(cond_.get(), fwd::tangent_or_zeros(t[1], in[1]), fwd::tangent_or_zeros(t[2], in[2]))
            .expand(out[0].shape())};
  }
  SavedTensor cond_;
};

}  // namespace

Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b) {
  constexpr std::string_view op = "where";
  profile::Scope scope(op);
  check_defined(cond, op);
  check_defined(a, op);
  check_defined(b, op);
  EMBER_CHECK(cond.dtype() == kBool, "{}: condition must be Bool, got {}", op, cond.dtype());
  const Shape shape =
      broadcast_shapes(broadcast_shapes(cond.shape(), a.shape(), op), b.shape(), op);
  check_same_device(cond, a, op);
  check_same_device(a, b, op);
  const DType t = promote(a.dtype(), b.dtype());
  if (!on_cpu(a))
    return record<WhereBackward>(op, on_device({kn::Op::Where}, t, t, {cond, a, b}, op),
                                 {Tensor(), a, b}, cond);
  const Tensor x = as_type(a, t), y = as_type(b, t);
  Tensor out = empty(shape, t);
  dispatch_all(t, [&]<class T>() {
    ternary_into<bool, T, T, T>(cond, x, y, out, [](bool c, T u, T v) { return c ? u : v; });
  });
  return record<WhereBackward>(op, out, {Tensor(), a, b}, cond);
}

namespace {

void check_mask(const Tensor& x, const Tensor& mask, std::string_view op) {
  check_defined(x, op);
  check_defined(mask, op);
  EMBER_CHECK(mask.dtype() == kBool, "{}: mask must be Bool, got {}", op, mask.dtype());
  EMBER_CHECK(broadcast_shapes(x.shape(), mask.shape(), op) == x.shape(),
              "{}: mask of shape {} does not broadcast to the tensor's shape {}", op, mask.shape(),
              x.shape());
}

// y = mask ? value : x:  dX = mask ? 0 : dY
struct MaskedFillBackward final : Node {
  explicit MaskedFillBackward(const Tensor& mask) { save(mask_, mask); }
  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    const Tensor& g = grads[0];
    if (is_grad_enabled() || !on_cpu(g))  // create_graph, a device: in ops
      return {masked_fill(g, mask_.get(), 0.0)};
    return {dispatch_float(g.dtype(), op(), [&]<class T>() {
      return zip<T, bool, T>(g, mask_.get(), op(), [](T d, bool m) { return m ? T(0) : d; });
    })};
  }
  bool differentiable_backward() const override { return true; }
  // Forward: dY = mask ? 0 : dX
  std::vector<Tensor> jvp(const std::vector<Tensor>&, const std::vector<Tensor>& t,
                          const std::vector<Tensor>&) override {
    return {masked_fill(t[0], mask_.get(), 0.0)};
  }
  SavedTensor mask_;
};

}  // namespace

Tensor masked_fill(const Tensor& x, const Tensor& mask, double value) {
  constexpr std::string_view op = "masked_fill";
  profile::Scope scope(op);
  check_mask(x, mask, op);
  check_same_device(x, mask, op);
  if (!on_cpu(x))
    return record<MaskedFillBackward>(
        op, on_device({kn::Op::MaskedFill, value}, x.dtype(), x.dtype(), {x, mask}, op), {x}, mask);
  Tensor out = empty(x.shape(), x.dtype());
  dispatch_all(x.dtype(), [&]<class T>() {
    const T v = cast_value<T>(value);
    binary_into<T, bool, T>(x, mask, out, [=](T e, bool m) { return m ? v : e; });
  });
  return record<MaskedFillBackward>(op, out, {x}, mask);
}

// --- in place: Note [Version counter] in graph/autograd.h

namespace {

void check_inplace(const Tensor& self, std::string_view op) {
  check_defined(self, op);
  EMBER_CHECK(!(is_grad_enabled() && self.requires_grad()),
              "{}: a {} tensor of shape {} that requires grad cannot be modified in place "
              "outside NoGradGuard",
              op, self.is_leaf() ? "leaf" : "non-leaf", self.shape());
}

// Note [In-place overlap] in graph/tensor.h: the written tensor may not be an expanded view.
void check_no_internal_overlap(const Tensor& self, std::string_view op) {
  EMBER_CHECK(!has_internal_overlap(self),
              "{}: the tensor of shape {} and strides {} is written in place, but several of its "
              "elements share one memory location (an expanded view); clone() it first",
              op, self.shape(), self.strides());
}

void check_inplace_operand(const Tensor& self, const Tensor& other, std::string_view op) {
  check_defined(other, op);
  EMBER_CHECK(broadcast_shapes(self.shape(), other.shape(), op) == self.shape(),
              "{}: operand of shape {} does not broadcast to the tensor's shape {}", op,
              other.shape(), self.shape());
  EMBER_CHECK(!partially_overlaps(self, other),
              "{}: the operand (shape {}, strides {}) and the written tensor (shape {}, strides "
              "{}) share some memory locations; clone() the operand first",
              op, other.shape(), other.strides(), self.shape(), self.strides());
}

// torch's can_cast: the op's result type must fit the written tensor's dtype (no floating into
// Int64 or Bool, no Int64 into Bool).
void check_result_fits(const Tensor& self, DType result, std::string_view op) {
  const auto category = [](DType t) { return is_floating(t) ? 2 : t == kInt64 ? 1 : 0; };
  EMBER_CHECK(category(result) <= category(self.dtype()),
              "{}: the result type {} cannot be cast to the tensor's dtype {} in place", op, result,
              self.dtype());
}

// Note [Forward grads of in-place ops]
// An in-place op on a dual tensor, or with a dual operand, first updates self's tangent at each
// visible level, innermost first, so that each level's rule reads the old values of self and of
// its outer tangents (Note [Forward grads] in graph/forward_ad.h); then it writes self. A tangent
// self has is written in place (copy_), so the views sharing it see the change; self without one
// gets a new tensor (as does a tangent that cannot be written: an expanded view, or one in a
// reverse-mode graph). `rule(self_tangent, operand_tangents)` gives the new tangent of self,
// broadcastable to its shape, undefined for zero; returning self_tangent itself changes nothing.
template <class Rule>
void update_tangents(const Tensor& self, std::initializer_list<Tensor> operands, Rule rule) {
  std::vector<Tensor> all{self};
  all.insert(all.end(), operands.begin(), operands.end());
  if (!detail::forward_wanted(all.data(), all.size())) return;
  for (uint32_t depth = detail::t_fw_visible; depth-- > 0;) {
    Tensor own = fwd::tangent(self, depth);
    std::vector<Tensor> theirs;
    bool any = own.defined();
    for (const Tensor& x : operands) {
      theirs.push_back(fwd::tangent(x, depth));
      any = any || theirs.back().defined();
    }
    if (!any) continue;
    fwd::VisibleLevels scope(depth);
    const Tensor next = rule(own, theirs);
    if (next.defined() && next.same(own)) continue;
    if (own.defined() && !has_internal_overlap(own) &&
        !(is_grad_enabled() && own.requires_grad())) {
      if (next.defined())
        own.copy_(next);
      else
        own.zero_();
    } else if (next.defined()) {
      Tensor fresh = zeros(self.shape(), self.dtype(), self.device());
      fresh.copy_(next);
      fwd::set_tangent(self, depth, fresh);
    } else {
      fwd::clear_tangent(self, depth);
    }
  }
}

template <class F, class Rule>
Tensor& inplace_binary(Tensor& self, const Tensor& other, std::string_view op, DeviceOp d, F f,
                       Rule rule) {
  check_inplace(self, op);
  check_no_internal_overlap(self, op);
  check_inplace_operand(self, other, op);
  check_same_device(self, other, op);
  check_result_fits(self, arith_type(self, other, Integral::Keep), op);
  update_tangents(self, {other}, rule);
  if (!on_cpu(self)) {
    elementwise_on_device(self, d.code, self.dtype(), {self, other}, op, d.p0, d.p1);
  } else {
    const Tensor y = as_type(other, self.dtype());
    dispatch_all(self.dtype(), [&]<class T>() { binary_into<T, T, T>(self, y, self, f); });
  }
  self.impl()->storage->bump_version();
  return self;
}

}  // namespace

// Forward rules (Note [Forward grads of in-place ops]): add_ dS += alpha dO; mul_ dS = dS o + s dO.
Tensor& Tensor::add_(const Tensor& other) {
  return inplace_binary(
      *this, other, "add_", {kn::Op::Add}, []<class T>(T a, T b) { return wrapping_add(a, b); },
      [](const Tensor& own, const std::vector<Tensor>& t) { return fwd::add_tangents(own, t[0]); });
}
// torch's add_(other, alpha=): self += alpha · other in one pass.
Tensor& Tensor::add_(const Tensor& other, double alpha) {
  check_defined(*this, "add_");
  check_defined(other, "add_");
  check_alpha(arith_type(*this, other, Integral::Keep), alpha, alpha, *this, other, "add_");
  return inplace_binary(*this, other, "add_", {kn::Op::AddScaled, alpha}, scaled_sum(alpha),
                        [alpha](const Tensor& own, const std::vector<Tensor>& t) {
                          return fwd::add_tangents(own,
                                                   t[0].defined() ? ember::mul(t[0], alpha) : t[0]);
                        });
}
Tensor& Tensor::mul_(const Tensor& other) {
  return inplace_binary(
      *this, other, "mul_", {kn::Op::Mul}, []<class T>(T a, T b) { return wrapping_mul(a, b); },
      [&](const Tensor& own, const std::vector<Tensor>& t) {
        return fwd::add_tangents(own.defined() ? ember::mul(own, other) : own,
                                 t[0].defined() ? ember::mul(*this, t[0]) : t[0]);
      });
}
// The scalar has the dtype `self op value` has (a whole value is integral: Note in scalar_type).
Tensor& Tensor::add_(double value) {
  check_defined(*this, "add_");
  return add_(scalar_tensor(value, scalar_type(*this, value, Integral::Keep), device()));
}
Tensor& Tensor::mul_(double value) {
  check_defined(*this, "mul_");
  return mul_(scalar_tensor(value, scalar_type(*this, value, Integral::Keep), device()));
}
namespace {
// copy_ converts to the tensor's dtype, as torch's; zero_ and fill_ write one value into every
// element, so an expanded view may take them.
Tensor& inplace_copy(Tensor& self, const Tensor& src, std::string_view op) {
  check_inplace(self, op);
  if (op == "copy_") check_no_internal_overlap(self, op);
  check_inplace_operand(self, src, op);
  // Forward: the tangent becomes src's (zero for zero_ and fill_)
  update_tangents(self, {src}, [](const Tensor&, const std::vector<Tensor>& t) { return t[0]; });
  // From another device: the source moved to self's (one copy of its values), then written
  // there by self's strided copy kernel.
  copy_into(self, src.device() == self.device() ? src : src.detach().to(self.device()));
  self.impl()->storage->bump_version();
  return self;
}
}  // namespace

Tensor& Tensor::zero_() {
  return inplace_copy(*this, scalar_tensor(0.0, dtype(), device()), "zero_");
}
Tensor& Tensor::fill_(double value) {
  return inplace_copy(*this, scalar_tensor(value, dtype(), device()), "fill_");
}
Tensor& Tensor::copy_(const Tensor& src) { return inplace_copy(*this, src, "copy_"); }

Tensor& Tensor::masked_fill_(const Tensor& mask, double value) {
  constexpr std::string_view op = "masked_fill_";
  check_inplace(*this, op);
  check_no_internal_overlap(*this, op);
  check_mask(*this, mask, op);
  check_same_device(*this, mask, op);
  update_tangents(*this, {}, [&](const Tensor& own, const std::vector<Tensor>&) {
    return ember::masked_fill(own, mask, 0.0);
  });
  if (!on_cpu(*this)) {
    elementwise_on_device(*this, kn::Op::MaskedFill, dtype(), {*this, mask}, op, value);
  } else {
    dispatch_all(dtype(), [&]<class T>() {
      const T v = cast_value<T>(value);
      binary_into<T, bool, T>(*this, mask, *this, [=](T e, bool m) { return m ? v : e; });
    });
  }
  impl()->storage->bump_version();
  return *this;
}

// --- operators and methods

Tensor operator+(const Tensor& a, const Tensor& b) { return add(a, b); }
Tensor operator-(const Tensor& a, const Tensor& b) { return sub(a, b); }
Tensor operator*(const Tensor& a, const Tensor& b) { return mul(a, b); }
Tensor operator/(const Tensor& a, const Tensor& b) { return div(a, b); }
Tensor operator+(const Tensor& a, double b) { return add(a, b); }
Tensor operator-(const Tensor& a, double b) { return sub(a, b); }
Tensor operator*(const Tensor& a, double b) { return mul(a, b); }
Tensor operator/(const Tensor& a, double b) { return div(a, b); }
Tensor operator+(double a, const Tensor& b) { return add(b, a); }
Tensor operator-(double a, const Tensor& b) { return rsub(b, a); }
Tensor operator*(double a, const Tensor& b) { return mul(b, a); }
Tensor operator/(double a, const Tensor& b) { return rdiv(b, a); }
Tensor operator-(const Tensor& x) { return neg(x); }
Tensor operator<(const Tensor& a, const Tensor& b) { return lt(a, b); }
Tensor operator<=(const Tensor& a, const Tensor& b) { return le(a, b); }
Tensor operator>(const Tensor& a, const Tensor& b) { return gt(a, b); }
Tensor operator>=(const Tensor& a, const Tensor& b) { return ge(a, b); }
Tensor operator<(const Tensor& a, double b) { return lt(a, b); }
Tensor operator<=(const Tensor& a, double b) { return le(a, b); }
Tensor operator>(const Tensor& a, double b) { return gt(a, b); }
Tensor operator>=(const Tensor& a, double b) { return ge(a, b); }
Tensor operator==(const Tensor& a, double b) { return eq(a, b); }
Tensor operator!=(const Tensor& a, double b) { return ne(a, b); }
Tensor operator!(const Tensor& mask) { return logical_not(mask); }
Tensor operator&(const Tensor& a, const Tensor& b) { return logical_and(a, b); }
Tensor operator|(const Tensor& a, const Tensor& b) { return logical_or(a, b); }

}  // namespace ember
