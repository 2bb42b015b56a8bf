// Elementwise ops: each public function checks its inputs, runs a kernel from ops/kernels.h,
// and records its <Op>Backward Node, which sits right above it.
#include "ops/elementwise.h"

#include <cmath>

#include "graph/autograd.h"
#include "graph/copy.h"
#include "graph/creation.h"
#include "graph/profile.h"
#include "ops/common.h"
#include "ops/kernels.h"

namespace ember {

namespace {

// The dtype two operands compute in: torch's promotion, with Bool arithmetic done in Int64.
DType arith_type(const Tensor& a, const Tensor& b) {
  const DType t = promote(a.dtype(), b.dtype());
  return t == kBool ? kInt64 : t;
}

// f(a, b) in the promoted dtype, broadcasting.
template <class F>
Tensor arith(const Tensor& a, const Tensor& b, std::string_view op, F f) {
  check_defined(a, op);
  check_defined(b, op);
  const DType t = arith_type(a, b);
  const Tensor x = as_type(a, t), y = as_type(b, t);
  return dispatch_numeric(t, op, [&]<class T>() { return zip<T, T, T>(x, y, op, f); });
}

// dA = dC * scale: the backward of every op that is linear in one input (neg, x*s, x/s, s-x).
struct ScaleBackward final : Node {
  ScaleBackward(std::string_view name, double scale) : name_(name), scale_(scale) {}
  std::string_view name() const override { return name_; }
  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    return {scale_ == 1.0 ? grads[0] : mul(grads[0], scale_)};
  }
  std::string_view name_;
  double scale_;
};

Tensor record_scale(Tensor out, const Tensor& x, std::string_view name, double scale) {
  if (any_requires_grad(x)) connect(std::make_shared<ScaleBackward>(name, scale), {x}, out);
  return out;
}

}  // namespace

// --- arithmetic between tensors

namespace {

// c = a + b:  dA = dC,  dB = dC  (the engine sums over broadcast dims)
struct AddBackward final : Node {
  std::string_view name() const override { return "AddBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>& grads) override { return {grads[0], grads[0]}; }
};

}  // namespace

Tensor add(const Tensor& a, const Tensor& b) {
  profile::Scope scope("add");
  Tensor out = arith(a, b, "add", [](auto x, auto y) { return x + y; });
  if (any_requires_grad(a, b)) connect(std::make_shared<AddBackward>(), {a, b}, out);
  return out;
}

namespace {

// c = a - b:  dA = dC,  dB = -dC
struct SubBackward final : Node {
  std::string_view name() const override { return "SubBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    return {grads[0], needs_grad(1) ? neg(grads[0]) : Tensor()};
  }
};

}  // namespace

Tensor sub(const Tensor& a, const Tensor& b) {
  profile::Scope scope("sub");
  Tensor out = arith(a, b, "sub", [](auto x, auto y) { return x - y; });
  if (any_requires_grad(a, b)) connect(std::make_shared<SubBackward>(), {a, b}, out);
  return out;
}

namespace {

// c = a * b:  dA = dC * b,  dB = dC * a
struct MulBackward final : Node {
  MulBackward(const Tensor& a, const Tensor& b) {
    if (b.requires_grad()) save(a_, a);
    if (a.requires_grad()) save(b_, b);
  }
  std::string_view name() const override { return "MulBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    const Tensor& g = grads[0];
    return {needs_grad(0) ? mul(g, b_.get()) : Tensor(),
            needs_grad(1) ? mul(g, a_.get()) : Tensor()};
  }
  SavedTensor a_, b_;
};

}  // namespace

Tensor mul(const Tensor& a, const Tensor& b) {
  profile::Scope scope("mul");
  Tensor out = arith(a, b, "mul", [](auto x, auto y) { return x * y; });
  if (any_requires_grad(a, b)) connect(std::make_shared<MulBackward>(a, b), {a, b}, out);
  return out;
}

namespace {

// c = a / b:  dA = dC / b,  dB = -dC * a / b²
struct DivBackward final : Node {
  DivBackward(const Tensor& a, const Tensor& b) {
    if (b.requires_grad()) save(a_, a);
    save(b_, b);
  }
  std::string_view name() const override { return "DivBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    const Tensor& g = grads[0];
    Tensor grad_b;
    if (needs_grad(1)) {
      dispatch_float(g.dtype(), "div", [&]<class T>() {
        grad_b = empty(g.shape(), g.dtype());
        ternary_into<T, T, T, T>(g, a_.get(), b_.get(), grad_b,
                                 [](T dc, T a, T b) { return -dc * a / (b * b); });
      });
    }
    return {needs_grad(0) ? div(g, b_.get()) : Tensor(), grad_b};
  }
  SavedTensor a_, b_;
};

}  // namespace

Tensor div(const Tensor& a, const Tensor& b) {
  profile::Scope scope("div");
  check_defined(a, "div");
  check_defined(b, "div");
  const DType t = is_floating(arith_type(a, b)) ? arith_type(a, b) : kFloat32;
  Tensor out = arith(as_type(a, t), as_type(b, t), "div", [](auto x, auto y) { return x / y; });
  if (any_requires_grad(a, b)) connect(std::make_shared<DivBackward>(a, b), {a, b}, out);
  return out;
}

// --- arithmetic with a double

namespace {

// The dtype of `t op scalar`: integral tensors stay integral for whole scalars, as torch.
DType scalar_result_type(const Tensor& t, double s) {
  if (is_floating(t.dtype())) return t.dtype();
  return std::floor(s) == s ? kInt64 : kFloat32;
}

template <class F>
Tensor scalar_op(const Tensor& x, double s, std::string_view op, F f) {
  check_defined(x, op);
  const Tensor in = as_type(x, scalar_result_type(x, s));
  return dispatch_numeric(in.dtype(), op, [&]<class T>() {
    const T v = static_cast<T>(s);
    return map<T, T>(in, [=](T e) { return f(e, v); });
  });
}

}  // namespace

Tensor add(const Tensor& a, double b) {
  profile::Scope scope("add");
  return record_scale(scalar_op(a, b, "add", [](auto x, auto s) { return x + s; }), a,
                      "AddBackward", 1.0);
}
Tensor sub(const Tensor& a, double b) {
  profile::Scope scope("sub");
  return record_scale(scalar_op(a, b, "sub", [](auto x, auto s) { return x - s; }), a,
                      "SubBackward", 1.0);
}
Tensor rsub(const Tensor& a, double b) {
  profile::Scope scope("rsub");
  return record_scale(scalar_op(a, b, "rsub", [](auto x, auto s) { return s - x; }), a,
                      "RsubBackward", -1.0);
}
Tensor mul(const Tensor& a, double b) {
  profile::Scope scope("mul");
  return record_scale(scalar_op(a, b, "mul", [](auto x, auto s) { return x * s; }), a,
                      "MulBackward", b);
}
Tensor div(const Tensor& a, double b) {
  profile::Scope scope("div");
  const Tensor x = as_floating(a);
  return record_scale(scalar_op(x, b, "div", [](auto v, auto s) { return v / s; }), a,
                      "DivBackward", 1.0 / b);
}

namespace {

// y = s / x:  dX = -dY * s / x² = -dY * y / x
struct RdivBackward final : Node {
  RdivBackward(const Tensor& x, const Tensor& y) { save(x_, x), save(y_, y); }
  std::string_view name() const override { return "RdivBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    const Tensor& g = grads[0];
    Tensor grad_x = empty(g.shape(), g.dtype());
    dispatch_float(g.dtype(), "rdiv", [&]<class T>() {
      ternary_into<T, T, T, T>(g, y_.get(), x_.get(), grad_x,
                               [](T dy, T y, T x) { return -dy * y / x; });
    });
    return {grad_x};
  }
  SavedTensor x_, y_;
};

}  // namespace

Tensor rdiv(const Tensor& a, double b) {
  profile::Scope scope("rdiv");
  const Tensor x = as_floating(a);
  Tensor out = scalar_op(x, b, "rdiv", [](auto v, auto s) { return s / v; });
  if (any_requires_grad(a)) connect(std::make_shared<RdivBackward>(x, out), {a}, out);
  return out;
}

Tensor neg(const Tensor& x) {
  profile::Scope scope("neg");
  check_defined(x, "neg");
  Tensor out = dispatch_numeric(x.dtype(), "neg",
                                [&]<class T>() { return map<T, T>(x, [](T v) { return -v; }); });
  return record_scale(out, x, "NegBackward", -1.0);
}

// --- math functions: y = f(x), with dX = derivative(dY, x or y) in one fused kernel

namespace {

template <class D>
struct UnaryBackward final : Node {
  UnaryBackward(std::string_view name, const Tensor& saved, D derivative)
      : name_(name), derivative_(derivative) {
    save(saved_, saved);
  }
  std::string_view name() const override { return name_; }
  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    const Tensor& g = grads[0];
    return {dispatch_float(g.dtype(), name_, [&]<class T>() {
      return zip<T, T, T>(g, saved_.get(), name_, derivative_);
    })};
  }
  std::string_view name_;
  D derivative_;
  SavedTensor saved_;
};

enum class Saves { Input, Output };

// A floating unary op: forward f(v), backward derivative(dy, saved) with saved the input or
// the output as `saves` says.
template <class F, class D>
Tensor unary_math(const Tensor& input, std::string_view op, std::string_view node, Saves saves, F f,
                  D derivative) {
  check_defined(input, op);
  const Tensor x = as_floating(input);
  Tensor out = dispatch_float(x.dtype(), op, [&]<class T>() { return map<T, T>(x, f); });
  if (any_requires_grad(input)) {
    const Tensor& saved = saves == Saves::Input ? x : out;
    connect(std::make_shared<UnaryBackward<D>>(node, saved, derivative), {input}, out);
  }
  return out;
}

}  // namespace

Tensor pow(const Tensor& x, double p) {
  profile::Scope scope("pow");
  if (p == 2.0) {
    return unary_math(
        x, "pow", "PowBackward", Saves::Input, [](auto v) { return v * v; },
        [](auto g, auto v) { return g * 2 * v; });
  }
  return unary_math(
      x, "pow", "PowBackward", Saves::Input,
      [p](auto v) { return static_cast<decltype(v)>(std::pow(v, p)); },
      [p](auto g, auto v) {
        using T = decltype(v);
        return p == 0 ? T(0) : static_cast<T>(g * p * std::pow(v, p - 1));
      });
}

// y = exp(x):  dX = dY * y
Tensor exp(const Tensor& x) {
  profile::Scope scope("exp");
  return unary_math(
      x, "exp", "ExpBackward", Saves::Output, [](auto v) { return std::exp(v); },
      [](auto g, auto y) { return g * y; });
}

// y = log(x):  dX = dY / x
Tensor log(const Tensor& x) {
  profile::Scope scope("log");
  return unary_math(
      x, "log", "LogBackward", Saves::Input, [](auto v) { return std::log(v); },
      [](auto g, auto v) { return g / v; });
}

// y = sqrt(x):  dX = dY / (2 y)
Tensor sqrt(const Tensor& x) {
  profile::Scope scope("sqrt");
  return unary_math(
      x, "sqrt", "SqrtBackward", Saves::Output, [](auto v) { return std::sqrt(v); },
      [](auto g, auto y) { return g / (2 * y); });
}

// y = sin(x):  dX = dY cos(x)
Tensor sin(const Tensor& x) {
  profile::Scope scope("sin");
  return unary_math(
      x, "sin", "SinBackward", Saves::Input, [](auto v) { return std::sin(v); },
      [](auto g, auto v) { return g * std::cos(v); });
}

// y = cos(x):  dX = -dY sin(x)
Tensor cos(const Tensor& x) {
  profile::Scope scope("cos");
  return unary_math(
      x, "cos", "CosBackward", Saves::Input, [](auto v) { return std::cos(v); },
      [](auto g, auto v) { return -g * std::sin(v); });
}

// y = tanh(x):  dX = dY (1 - y²)
Tensor tanh(const Tensor& x) {
  profile::Scope scope("tanh");
  return unary_math(
      x, "tanh", "TanhBackward", Saves::Output, [](auto v) { return std::tanh(v); },
      [](auto g, auto y) { return g * (1 - y * y); });
}

// y = 1 / (1 + exp(-x)):  dX = dY y (1 - y)
Tensor sigmoid(const Tensor& x) {
  profile::Scope scope("sigmoid");
  return unary_math(
      x, "sigmoid", "SigmoidBackward", Saves::Output, [](auto v) { return 1 / (1 + std::exp(-v)); },
      [](auto g, auto y) { return g * y * (1 - y); });
}

// y = max(x, 0):  dX = dY where y > 0
Tensor relu(const Tensor& x) {
  profile::Scope scope("relu");
  check_defined(x, "relu");
  if (!is_floating(x.dtype())) {
    return dispatch_numeric(x.dtype(), "relu", [&]<class T>() {
      return map<T, T>(x, [](T v) { return v > 0 ? v : T(0); });
    });
  }
  return unary_math(
      x, "relu", "ReluBackward", Saves::Output, [](auto v) { return v > 0 ? v : decltype(v)(0); },
      [](auto g, auto y) { return y > 0 ? g : decltype(g)(0); });
}

// y = |x|:  dX = dY sign(x)
Tensor abs(const Tensor& x) {
  profile::Scope scope("abs");
  check_defined(x, "abs");
  if (!is_floating(x.dtype())) {
    return dispatch_numeric(x.dtype(), "abs", [&]<class T>() {
      return map<T, T>(x, [](T v) { return v < 0 ? -v : v; });
    });
  }
  return unary_math(
      x, "abs", "AbsBackward", Saves::Input, [](auto v) { return std::abs(v); },
      [](auto g, auto v) {
        using T = decltype(v);
        return v > 0 ? g : v < 0 ? -g : T(0);
      });
}

// --- comparisons

namespace {

template <class F>
Tensor compare(const Tensor& a, const Tensor& b, std::string_view op, F f) {
  check_defined(a, op);
  check_defined(b, op);
  const DType t = promote(a.dtype(), b.dtype());
  const Tensor x = as_type(a, t), y = as_type(b, t);
  return dispatch_all(t, [&]<class T>() { return zip<T, T, bool>(x, y, op, f); });
}

// Compares with a double as torch does: the scalar is cast to a floating tensor's dtype.
template <class F>
Tensor compare(const Tensor& a, double b, std::string_view op, F f) {
  check_defined(a, op);
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
  profile::Scope scope("eq");
  return compare(a, b, "eq", std::equal_to<>());
}
Tensor ne(const Tensor& a, const Tensor& b) {
  profile::Scope scope("ne");
  return compare(a, b, "ne", std::not_equal_to<>());
}
Tensor lt(const Tensor& a, const Tensor& b) {
  profile::Scope scope("lt");
  return compare(a, b, "lt", std::less<>());
}
Tensor le(const Tensor& a, const Tensor& b) {
  profile::Scope scope("le");
  return compare(a, b, "le", std::less_equal<>());
}
Tensor gt(const Tensor& a, const Tensor& b) {
  profile::Scope scope("gt");
  return compare(a, b, "gt", std::greater<>());
}
Tensor ge(const Tensor& a, const Tensor& b) {
  profile::Scope scope("ge");
  return compare(a, b, "ge", std::greater_equal<>());
}
Tensor eq(const Tensor& a, double b) {
  profile::Scope scope("eq");
  return compare(a, b, "eq", std::equal_to<>());
}
Tensor ne(const Tensor& a, double b) {
  profile::Scope scope("ne");
  return compare(a, b, "ne", std::not_equal_to<>());
}
Tensor lt(const Tensor& a, double b) {
  profile::Scope scope("lt");
  return compare(a, b, "lt", std::less<>());
}
Tensor le(const Tensor& a, double b) {
  profile::Scope scope("le");
  return compare(a, b, "le", std::less_equal<>());
}
Tensor gt(const Tensor& a, double b) {
  profile::Scope scope("gt");
  return compare(a, b, "gt", std::greater<>());
}
Tensor ge(const Tensor& a, double b) {
  profile::Scope scope("ge");
  return compare(a, b, "ge", std::greater_equal<>());
}

// --- logic: nonzero is true, as torch

namespace {
Tensor as_bool(const Tensor& t) { return t.dtype() == kBool ? t : ne(t, 0.0); }
}  // namespace

Tensor logical_not(const Tensor& mask) {
  profile::Scope scope("logical_not");
  check_defined(mask, "logical_not");
  return map<bool, bool>(as_bool(mask), [](bool v) { return !v; });
}
Tensor logical_and(const Tensor& a, const Tensor& b) {
  profile::Scope scope("logical_and");
  check_defined(a, "logical_and");
  check_defined(b, "logical_and");
  return zip<bool, bool, bool>(as_bool(a), as_bool(b), "logical_and",
                               [](bool x, bool y) { return x && y; });
}
Tensor logical_or(const Tensor& a, const Tensor& b) {
  profile::Scope scope("logical_or");
  check_defined(a, "logical_or");
  check_defined(b, "logical_or");
  return zip<bool, bool, bool>(as_bool(a), as_bool(b), "logical_or",
                               [](bool x, bool y) { return x || y; });
}

// --- where and masked_fill

namespace {

// out = cond ? a : b:  dA = cond ? dOut : 0,  dB = cond ? 0 : dOut
struct WhereBackward final : Node {
  explicit WhereBackward(const Tensor& cond) { save(cond_, cond); }
  std::string_view name() const override { return "WhereBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    const Tensor& g = grads[0];
    return dispatch_float(g.dtype(), "where", [&]<class T>() {
      const auto pick = [&](bool keep_when) {
        return zip<bool, T, T>(cond_.get(), g, "where",
                               [=](bool c, T d) { return c == keep_when ? d : T(0); });
      };
      return std::vector<Tensor>{Tensor(), needs_grad(1) ? pick(true) : Tensor(),
                                 needs_grad(2) ? pick(false) : Tensor()};
    });
  }
  SavedTensor cond_;
};

}  // namespace

Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b) {
  profile::Scope scope("where");
  check_defined(cond, "where");
  check_defined(a, "where");
  check_defined(b, "where");
  EMBER_CHECK(cond.dtype() == kBool, "where: condition must be Bool, got {}", cond.dtype());
  const Shape shape =
      broadcast_shapes(broadcast_shapes(cond.shape(), a.shape(), "where"), b.shape(), "where");
  const DType t = promote(a.dtype(), b.dtype());
  const Tensor x = as_type(a, t), y = as_type(b, t);
  Tensor out = empty(shape, t);
  dispatch_all(t, [&]<class T>() {
    ternary_into<bool, T, T, T>(cond, x, y, out, [](bool c, T u, T v) { return c ? u : v; });
  });
  if (any_requires_grad(a, b))
    connect(std::make_shared<WhereBackward>(cond), {Tensor(), a, b}, out);
  return out;
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
  std::string_view name() const override { return "MaskedFillBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    const Tensor& g = grads[0];
    return {dispatch_float(g.dtype(), "masked_fill", [&]<class T>() {
      return zip<T, bool, T>(g, mask_.get(), "masked_fill",
                             [](T d, bool m) { return m ? T(0) : d; });
    })};
  }
  SavedTensor mask_;
};

}  // namespace

Tensor masked_fill(const Tensor& x, const Tensor& mask, double value) {
  profile::Scope scope("masked_fill");
  check_mask(x, mask, "masked_fill");
  Tensor out = empty(x.shape(), x.dtype());
  dispatch_all(x.dtype(), [&]<class T>() {
    const T v = static_cast<T>(value);
    binary_into<T, bool, T>(x, mask, out, [=](T e, bool m) { return m ? v : e; });
  });
  if (any_requires_grad(x)) connect(std::make_shared<MaskedFillBackward>(mask), {x}, out);
  return out;
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

void check_inplace_operand(const Tensor& self, const Tensor& other, std::string_view op) {
  check_defined(other, op);
  EMBER_CHECK(broadcast_shapes(self.shape(), other.shape(), op) == self.shape(),
              "{}: operand of shape {} does not broadcast to the tensor's shape {}", op,
              other.shape(), self.shape());
}

template <class F>
Tensor& inplace_binary(Tensor& self, const Tensor& other, std::string_view op, F f) {
  check_inplace(self, op);
  check_inplace_operand(self, other, op);
  const Tensor y = as_type(other, self.dtype());
  dispatch_numeric(self.dtype(), op, [&]<class T>() { binary_into<T, T, T>(self, y, self, f); });
  self.impl()->storage->bump_version();
  return self;
}

}  // namespace

Tensor& Tensor::add_(const Tensor& other) {
  return inplace_binary(*this, other, "add_", [](auto a, auto b) { return a + b; });
}
Tensor& Tensor::mul_(const Tensor& other) {
  return inplace_binary(*this, other, "mul_", [](auto a, auto b) { return a * b; });
}
Tensor& Tensor::add_(double value) { return add_(scalar_tensor(value, dtype())); }
Tensor& Tensor::mul_(double value) { return mul_(scalar_tensor(value, dtype())); }
namespace {
Tensor& inplace_copy(Tensor& self, const Tensor& src, std::string_view op) {
  check_inplace(self, op);
  check_inplace_operand(self, src, op);
  copy_into(self, src);
  self.impl()->storage->bump_version();
  return self;
}
}  // namespace

Tensor& Tensor::zero_() { return inplace_copy(*this, scalar_tensor(0.0, dtype()), "zero_"); }
Tensor& Tensor::fill_(double value) {
  return inplace_copy(*this, scalar_tensor(value, dtype()), "fill_");
}
Tensor& Tensor::copy_(const Tensor& src) { return inplace_copy(*this, src, "copy_"); }

Tensor& Tensor::masked_fill_(const Tensor& mask, double value) {
  check_inplace(*this, "masked_fill_");
  check_mask(*this, mask, "masked_fill_");
  dispatch_all(dtype(), [&]<class T>() {
    const T v = static_cast<T>(value);
    binary_into<T, bool, T>(*this, mask, *this, [=](T e, bool m) { return m ? v : e; });
  });
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
