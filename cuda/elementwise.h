// The elementwise kernels of the CUDA backend: one generic strided loop body for every
// elementwise op (unary, binary, ternary, with the dtype conversions on the way), written once as
// host-and-device code. nvcc compiles it into the GPU's kernel (cuda/elementwise.cu); the host
// compiler into the emulated device's loop (cuda/host.cpp, Note [Host emulation of a GPU] in
// graph/device_backend.h). Plain C++17, no Ember header (cuda/ is a leaf).
//
// An op reads up to three operands, each of its own element type and strides (0 along broadcast
// dims), converts them to the op's compute type, applies the op's formula, and converts the
// result to the output's element type: so a dtype conversion (Copy), a promotion and a
// comparison (compute Float64, output Bool) are all this one kernel. The formulas follow the CPU
// kernels of ops/elementwise.cpp, including their edge cases (NaN through relu and clamp, int64
// wrapping, Bool's + as or).
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#if defined(__CUDACC__)
#define EMBER_HD __host__ __device__
#else
#define EMBER_HD
#endif

namespace ember::cuda::kernels {

// Element types, in graph/dtype.h's DType order.
enum class ScalarType : int32_t { Float32, Float64, Int64, Bool };

inline constexpr int kMaxDims = 16;  // graph/tensor.h's kMaxDims

// The ops, by arity. p0, p1 are an op's parameters (a scalar, alpha, bounds).
enum class Op : int32_t {
  // unary: out = f(a)
  Copy,  // a, converted (compute in the output's type)
  Neg,   // -a (int64 wraps)
  Exp,
  Log,
  Sqrt,
  Sin,
  Cos,
  Tanh,
  Sigmoid,
  NormalCdf,  // Φ(a)
  Gelu,       // a Φ(a)
  GeluTanh,   // a σ(2 √(2/π) (a + 0.044715 a³))
  Silu,       // a σ(a)
  Relu,       // a unless a <= 0 (NaN passes)
  Abs,
  Pow,           // a^p0 (a a for p0 = 2)
  Clamp,         // min(max(a, p0), p1), ±inf meaning no bound (NaN passes)
  OutsideClamp,  // !(p0 <= a <= p1): clamp's gradient mask (Bool)
  AddScalar,     // a + p0
  SubScalar,     // a - p0
  RsubScalar,    // p0 - a
  MulScalar,     // a p0
  DivScalar,     // a / p0
  RdivScalar,    // p0 / a
  EqScalar,      // a == p0, and so on (Bool)
  NeScalar,
  LtScalar,
  LeScalar,
  GtScalar,
  GeScalar,
  IsNan,
  IsFinite,
  LogicalNot,  // a == 0
  // binary: out = f(a, b)
  Add,  // int64 wraps; Bool: or
  Sub,
  Mul,  // Bool: and
  Div,
  AddScaled,  // a + p0 b
  Maximum,    // NaN in either gives NaN
  Minimum,
  Eq,
  Ne,
  Lt,
  Le,
  Gt,
  Ge,
  LogicalAnd,
  LogicalOr,
  MaskedFill,         // b ? p0 : a
  TanhBackward,       // a (1 - b²)
  SigmoidBackward,    // a b (1 - b)
  ThresholdBackward,  // a unless b <= 0
  DropoutScale,       // a p0 where b (a keep mask), else a 0 (a NaN stays NaN, as the CPU's)
  // ternary: out = f(a, b, c)
  Where,          // a ? b : c
  AffineProduct,  // a b (p0 c + p1)
};

EMBER_HD constexpr int arity(Op op) { return op < Op::Add ? 1 : op < Op::Where ? 2 : 3; }

// One operand: its first element's address (its view's offset included), element type, and
// element strides over the loop's dims.
struct Operand {
  void* data = nullptr;
  ScalarType type = ScalarType::Float32;
  int64_t strides[kMaxDims] = {};
};

// One elementwise launch: numel elements over `sizes` (ndim dims, row-major, adjacent dims
// already merged where every operand allows), each computed in `compute`.
struct Elementwise {
  Op op = Op::Copy;
  ScalarType compute = ScalarType::Float32;
  int ndim = 0;
  int64_t numel = 0;
  int64_t sizes[kMaxDims] = {};
  bool contiguous = false;  // every operand dense in the loop's order: element i at offset i
  Operand out;
  Operand in[3];
  double p0 = 0, p1 = 0;
};

// Whether `op` is defined in `compute` (true division and the math functions on floating types
// only; Bool arithmetic only where the CPU has it). The launchers refuse anything else.
EMBER_HD constexpr bool supported(Op op, ScalarType compute) {
  const bool floating = compute == ScalarType::Float32 || compute == ScalarType::Float64;
  switch (op) {
    case Op::Copy:
    case Op::Eq:
    case Op::Ne:
    case Op::Lt:
    case Op::Le:
    case Op::Gt:
    case Op::Ge:
    case Op::Add:
    case Op::Mul:
    case Op::AddScaled:
    case Op::Maximum:
    case Op::Minimum:
    case Op::Where:
    case Op::MaskedFill:
    case Op::IsNan:
    case Op::IsFinite:
    case Op::LogicalNot:
    case Op::LogicalAnd:
    case Op::LogicalOr:
      return true;
    case Op::Neg:
    case Op::Sub:
    case Op::Relu:
    case Op::Abs:
    case Op::Clamp:
    case Op::AddScalar:
    case Op::SubScalar:
    case Op::RsubScalar:
    case Op::MulScalar:
      return compute != ScalarType::Bool;
    case Op::EqScalar:
    case Op::NeScalar:
    case Op::LtScalar:
    case Op::LeScalar:
    case Op::GtScalar:
    case Op::GeScalar:
    case Op::OutsideClamp:
      return floating;  // integral operands compare as Float64, as the CPU's
    default:
      return floating;
  }
}

// Where a kernel reports the first bad value it met: check is the host's id of the message (0:
// nothing reported), value the bad value. In memory the host reads after it waits for the
// device (mapped host memory on a GPU).
struct DeviceCheck {
  int32_t check = 0;
  int32_t unused = 0;
  int64_t value = 0;
};

// Records (check, value) in *slot unless something was recorded there first.
EMBER_HD inline void report(DeviceCheck* slot, int32_t check, int64_t value) {
#if defined(__CUDA_ARCH__)
  if (atomicCAS(&slot->check, 0, check) == 0) slot->value = value;
#else
  if (slot->check == 0) slot->check = check, slot->value = value;
#endif
}

// f(T()) with T the element type of `type` (float, double, int64_t, bool): the one switch of
// every kernel that works in its operands' type. f is a generic lambda; one written inside a
// host-and-device function is host-and-device too (CUDA infers a lambda's execution space from
// its enclosing function's).
template <class F>
EMBER_HD void dispatch(ScalarType type, F&& f) {
  switch (type) {
    case ScalarType::Float32:
      return f(float());
    case ScalarType::Float64:
      return f(double());
    case ScalarType::Int64:
      return f(int64_t());
    case ScalarType::Bool:
      return f(bool());
  }
}

namespace detail {

// Element conversion as graph/dtype.h's cast_value: floating -> int64 gives INT64_MIN for NaN
// and values out of range (x86's answer) where a plain cast is undefined.
template <class D, class S>
EMBER_HD D cast(S v) {
  if constexpr (std::is_same_v<D, int64_t> && std::is_floating_point_v<S>)
    return v >= S(-0x1p63) && v < S(0x1p63) ? static_cast<int64_t>(v) : INT64_MIN;
  else
    return static_cast<D>(v);
}

template <class T>
EMBER_HD T load(const void* base, ScalarType type, int64_t offset) {
  T out = T();
  dispatch(type, [&](auto s) { out = cast<T>(static_cast<const decltype(s)*>(base)[offset]); });
  return out;
}

template <class T>
EMBER_HD void store(void* base, ScalarType type, int64_t offset, T v) {
  dispatch(type, [&](auto d) {
    using D = decltype(d);
    static_cast<D*>(base)[offset] = cast<D>(v);
  });
}

// The math functions in the device's (CUDA's float and double overloads) or the host's (<cmath>)
// form.
#if defined(__CUDA_ARCH__)
#define EMBER_MATH(fn) ::fn
#else
#define EMBER_MATH(fn) std::fn
#endif

template <class T>
EMBER_HD T sigmoid(T x) {
  return T(1) / (T(1) + EMBER_MATH(exp)(-x));
}
template <class T>
EMBER_HD T normal_cdf(T x) {
  return T(0.5) * EMBER_MATH(erfc)(-x * T(0.7071067811865476));
}

// Int64 arithmetic wraps as the CPU's (signed overflow is undefined in C++); Bool + is or, * and.
template <class T>
EMBER_HD T add(T x, T y) {
  if constexpr (std::is_same_v<T, int64_t>)
    return static_cast<int64_t>(static_cast<uint64_t>(x) + static_cast<uint64_t>(y));
  else if constexpr (std::is_same_v<T, bool>)
    return x || y;
  else
    return x + y;
}
template <class T>
EMBER_HD T sub(T x, T y) {
  if constexpr (std::is_same_v<T, int64_t>)
    return static_cast<int64_t>(static_cast<uint64_t>(x) - static_cast<uint64_t>(y));
  else
    return x - y;
}
template <class T>
EMBER_HD T mul(T x, T y) {
  if constexpr (std::is_same_v<T, int64_t>)
    return static_cast<int64_t>(static_cast<uint64_t>(x) * static_cast<uint64_t>(y));
  else if constexpr (std::is_same_v<T, bool>)
    return x && y;
  else
    return x * y;
}

// A bound of clamp as T: ±inf (no bound) is the type's extreme where T has no infinity.
template <class T>
EMBER_HD T bound(double p) {
  if constexpr (std::is_floating_point_v<T>) {
    return static_cast<T>(p);
  } else {
    if (p == INFINITY) return T(INT64_MAX);
    if (p == -INFINITY) return T(INT64_MIN);
    return cast<T>(p);
  }
}

// The op's value at one element, in T (the math functions' branches only where T is floating:
// supported() keeps the others from being asked).
template <class T>
EMBER_HD T apply(Op op, T a, T b, T c, double p0, double p1) {
  constexpr bool kFloating = std::is_floating_point_v<T>;
  switch (op) {
    case Op::Copy:
      return a;
    case Op::Neg:
      return sub(T(0), a);
    case Op::Relu:
      return !(a <= T(0)) ? a : T(0);
    case Op::Abs:
      if constexpr (kFloating) return EMBER_MATH(fabs)(a);
      return a < T(0) ? sub(T(0), a) : a;
    case Op::Clamp: {
      const T lo = bound<T>(p0), hi = bound<T>(p1);
      const T r = a < lo ? lo : a;  // NaN compares false and passes through
      return r > hi ? hi : r;
    }
    case Op::OutsideClamp:
      return !(a >= bound<T>(p0) && a <= bound<T>(p1));
    case Op::AddScalar:
      return add(a, cast<T>(p0));
    case Op::SubScalar:
      return sub(a, cast<T>(p0));
    case Op::RsubScalar:
      return sub(cast<T>(p0), a);
    case Op::MulScalar:
      return mul(a, cast<T>(p0));
    case Op::EqScalar:
      return a == static_cast<T>(p0);
    case Op::NeScalar:
      return a != static_cast<T>(p0);
    case Op::LtScalar:
      return a < static_cast<T>(p0);
    case Op::LeScalar:
      return a <= static_cast<T>(p0);
    case Op::GtScalar:
      return a > static_cast<T>(p0);
    case Op::GeScalar:
      return a >= static_cast<T>(p0);
    case Op::IsNan:
      return a != a;
    case Op::IsFinite:
      if constexpr (kFloating) return EMBER_MATH(isfinite)(a);
      return true;
    case Op::LogicalNot:
      return a == T(0);
    case Op::Add:
      return add(a, b);
    case Op::Sub:
      return sub(a, b);
    case Op::Mul:
      return mul(a, b);
    case Op::AddScaled:
      if constexpr (std::is_same_v<T, bool>) return a || b;  // alpha 1
      return add(a, mul(cast<T>(p0), b));
    case Op::Maximum:
      return a > b || a != a ? a : b;
    case Op::Minimum:
      return a < b || a != a ? a : b;
    case Op::Eq:
      return a == b;
    case Op::Ne:
      return a != b;
    case Op::Lt:
      return a < b;
    case Op::Le:
      return a <= b;
    case Op::Gt:
      return a > b;
    case Op::Ge:
      return a >= b;
    case Op::LogicalAnd:
      return a != T(0) && b != T(0);
    case Op::LogicalOr:
      return a != T(0) || b != T(0);
    case Op::MaskedFill:
      return b != T(0) ? cast<T>(p0) : a;
    case Op::ThresholdBackward:
      return !(b <= T(0)) ? a : T(0);
    case Op::Where:
      return a != T(0) ? b : c;
    default:
      break;
  }
  if constexpr (kFloating) {
    switch (op) {
      case Op::Exp:
        return EMBER_MATH(exp)(a);
      case Op::Log:
        return EMBER_MATH(log)(a);
      case Op::Sqrt:
        return EMBER_MATH(sqrt)(a);
      case Op::Sin:
        return EMBER_MATH(sin)(a);
      case Op::Cos:
        return EMBER_MATH(cos)(a);
      case Op::Tanh:
        return EMBER_MATH(tanh)(a);
      case Op::Sigmoid:
        return sigmoid(a);
      case Op::NormalCdf:
        return normal_cdf(a);
      case Op::Gelu:
        return a * normal_cdf(a);
      case Op::GeluTanh:
        return a * sigmoid(T(1.5957691216057308) * (a + T(0.044715) * a * a * a));
      case Op::Silu:
        return a * sigmoid(a);
      case Op::Pow:
        return p0 == 2 ? a * a : static_cast<T>(EMBER_MATH(pow)(static_cast<double>(a), p0));
      case Op::DivScalar:
        return a / static_cast<T>(p0);
      case Op::RdivScalar:
        return static_cast<T>(p0) / a;
      case Op::Div:
        return a / b;
      case Op::TanhBackward:
        return a * (T(1) - b * b);
      case Op::DropoutScale:
        return a * (b != T(0) ? static_cast<T>(p0) : T(0));
      case Op::SigmoidBackward:
        return a * b * (T(1) - b);
      case Op::AffineProduct:
        return a * b * (static_cast<T>(p0) * c + static_cast<T>(p1));
      default:
        break;
    }
  }
  return T();
}

#undef EMBER_MATH

// Element i of the launch: its operands' offsets from the loop's index, the op, the store.
template <class T>
EMBER_HD void element(const Elementwise& e, int64_t i) {
  int64_t offsets[4] = {i, i, i, i};
  const int n = arity(e.op);
  if (!e.contiguous) {
    for (int k = 0; k < 4; ++k) offsets[k] = 0;
    int64_t rest = i;
    for (int d = e.ndim - 1; d >= 0; --d) {
      const int64_t index = rest % e.sizes[d];
      rest /= e.sizes[d];
      offsets[0] += index * e.out.strides[d];
      for (int k = 0; k < n; ++k) offsets[k + 1] += index * e.in[k].strides[d];
    }
  }
  const T a = load<T>(e.in[0].data, e.in[0].type, offsets[1]);
  const T b = n > 1 ? load<T>(e.in[1].data, e.in[1].type, offsets[2]) : T();
  const T c = n > 2 ? load<T>(e.in[2].data, e.in[2].type, offsets[3]) : T();
  store<T>(e.out.data, e.out.type, offsets[0], apply<T>(e.op, a, b, c, e.p0, e.p1));
}

}  // namespace detail

// Element i of the launch in its compute type.
EMBER_HD inline void elementwise_element(const Elementwise& e, int64_t i) {
  dispatch(e.compute, [&](auto t) { detail::element<decltype(t)>(e, i); });
}

}  // namespace ember::cuda::kernels
