// Math functions the compiler vectorises, for the elementwise ops (exp, log, tanh, sigmoid, gelu,
// silu, forward and backward) and the hot loops of fused kernels (softmax, log_softmax).
// std::exp and friends are libm calls per element, which GCC vectorises only under -ffast-math;
// these are branch-free arithmetic (polynomials, bit manipulation of the exponent, and selects
// for the special values), so a loop of them over contiguous data becomes SIMD code: AVX2 or
// AVX-512 with -march=native (EMBER_NATIVE), SSE2 otherwise.
//
// Accuracy, measured against glibc over dense samples of each range (tests/test_vec_math.cpp):
// a few ulp in Float32 and Float64, with glibc's results for ±0, ±inf, NaN, and values that
// overflow or underflow (denormal results are kept). The polynomial coefficients come from
// ops/vec_math_fit.py (near-minimax fits of relative error), or are Taylor coefficients where
// the reduced range makes them enough.
#pragma once

#include <array>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <utility>

// Every function here is forced inline: a call left in a loop (GCC stops inlining once a file
// uses them often) would keep the loop from vectorising.
#define EMBER_VEC_INLINE [[gnu::always_inline]] inline
// The same for a lambda that calls them, written after its parameter list: `[](auto v)
// EMBER_VEC_LAMBDA { return vexp(v); }` (an op's forward or derivative, called in a kernel loop).
#define EMBER_VEC_LAMBDA __attribute__((always_inline))

namespace ember {

namespace vec_detail {

// a * b + c, fused where the target has FMA (one rounding, one instruction); elsewhere std::fma
// would be a libm call per element, so it is a multiply and an add.
template <class T>
EMBER_VEC_INLINE T fmadd(T a, T b, T c) {
#ifdef __FMA__
  return std::fma(a, b, c);
#else
  return a * b + c;
#endif
}

// c[0] + c[1] x + … + c[N-1] x^(N-1), by Horner's rule written out at compile time: a loop here
// would be an inner loop in the caller's, which GCC's vectoriser refuses before unrolling it.
template <class T, size_t N, size_t... I>
EMBER_VEC_INLINE T horner_steps(T x, const std::array<T, N>& c, std::index_sequence<I...>) {
  T r = c[N - 1];
  ((r = fmadd(r, x, c[N - 2 - I])), ...);
  return r;
}
template <class T, size_t N>
EMBER_VEC_INLINE T horner(T x, const std::array<T, N>& c) {
  return horner_steps(x, c, std::make_index_sequence<N - 1>());
}

// 1/k! for k = 0..N-1.
template <class T, size_t N>
constexpr std::array<T, N> taylor_exp() {
  std::array<T, N> c{};
  double f = 1;
  for (size_t k = 0; k < N; ++k) c[k] = static_cast<T>(1 / f), f *= static_cast<double>(k + 1);
  return c;
}

// 2/(2k+1) for k = 1..N: log(1+f) = 2 atanh(s), s = f/(2+f), is 2s + s R(s²) with these.
template <class T, size_t N>
constexpr std::array<T, N> taylor_log() {
  std::array<T, N> c{};
  for (size_t k = 0; k < N; ++k) c[k] = static_cast<T>(2.0 / static_cast<double>(2 * k + 3));
  return c;
}

template <class T>
struct Coefficients;

template <>
struct Coefficients<float> {
  using Int = int32_t;
  static constexpr int kMantissa = 23, kBias = 127;
  static constexpr float exp_lo = -103.972084f, exp_hi = 88.7228391f;  // ln 2^-150, ln FLT_MAX
  // e^r on [-ln2/2, ln2/2]: Cephes' expf (minimax, degree 7 with the first two terms exact).
  static constexpr std::array<float, 6> exp = {5.0000001201e-1f, 1.6666665459e-1f,
                                               4.1665795894e-2f, 8.3334519073e-3f,
                                               1.3981999507e-3f, 1.9875691500e-4f};
  static constexpr std::array<float, 5> log = taylor_log<float, 5>();
  static constexpr float ln2_hi = 0.693359375f, ln2_lo = -2.12194440e-4f;  // Cephes' split
  // tanh x = x + x z P(z), z = x², |x| < 0.625: max relative error of P 1.25e-7.
  static constexpr std::array<float, 5> tanh = {-3.33333292e-1f, 1.33327913e-1f, -5.38534283e-2f,
                                                2.10071306e-2f, -6.10936881e-3f};
  // Φ takes erfc everywhere (Q's terms sum to at most 2 Q: no cancellation worth a branch).
  static constexpr bool kErfNearZero = false;
  // erfc z = exp(-z²) Q(t), t = 1/(1 + p z), 0 <= z <= 10 (beyond, exp(-z²) is 0): 2.91e-8.
  static constexpr float erfc_p = 0.5f, erfc_zero = 11.0f;
  static constexpr std::array<float, 10> erfc = {
      -5.33033652e-6f, 2.82205151e-1f, 2.81261655e-1f,  2.48884106e-1f, 1.84345097e-1f,
      1.03898288e-2f,  2.30390753e-1f, -4.49272196e-1f, 2.67606424e-1f, -5.58055304e-2f};
};

template <>
struct Coefficients<double> {
  using Int = int64_t;
  static constexpr int kMantissa = 52, kBias = 1023;
  // ln 2^-1075 and ln DBL_MAX: vexp's 0 and inf
  static constexpr double exp_lo = -745.1332191019412, exp_hi = 709.782712893384;
  // e^r on [-ln2/2, ln2/2] by Taylor to degree 13: the remainder is below 4e-18.
  static constexpr std::array<double, 14> exp_all = taylor_exp<double, 14>();
  static constexpr std::array<double, 10> log = taylor_log<double, 10>();
  static constexpr double ln2_hi = 6.93147180369123816490e-01, ln2_lo = 1.90821492927058770002e-10;
  // tanh x = x + x z P(z), z = x², |x| < 0.625: max relative error of P 3.17e-16.
  static constexpr std::array<double, 11> tanh = {
      -3.3333333333333323e-1, 1.3333333333326733e-1, -5.3968253961466109e-2, 2.1869488263041407e-2,
      -8.863229874351515e-3,  3.5920594129431595e-3, -1.4553119634258158e-3, 5.8744741076961612e-4,
      -2.3079941881946555e-4, 7.962911475782057e-5,  -1.7260815616877731e-5};
  // Φ takes erf z = z P(z²) for -0.5 < z < 1, erfc beyond: one erfc fit from z = 0 would cancel
  // in Q near 0 (its terms sum to 15 times Q there: ~12 ulp).
  static constexpr bool kErfNearZero = true;
  // erf z = z P(z²), |z| < 1: max relative error 1.27e-19.
  static constexpr std::array<double, 13> erf = {
      1.1283791670955126,    -3.7612638903183748e-1, 1.1283791670954859e-1, -2.6866170645073069e-2,
      5.2239776247819934e-3, -8.548326978793508e-4,  1.2055331038684124e-4, -1.492559355330074e-5,
      1.6460973669323097e-6, -1.635003570013796e-7,  1.4657961046926863e-8, -1.1366023048153764e-9,
      5.9459394543764452e-11};
  // erfc z = exp(-z²) Q(t), t = 1/(1 + p z), 0.5 <= z <= 27 (beyond, exp(-z²) is 0): 1.03e-17.
  static constexpr double erfc_p = 0.3, erfc_zero = 28.0;
  static constexpr std::array<double, 21> erfc = {
      3.8644921798727779e-13, 1.6925687502825479e-1,  1.6925687655605073e-1, 1.6164027882472655e-1,
      1.4640781263907838e-1,  1.2457832230448583e-1,  9.8300006745979233e-2, 6.9725766231734055e-2,
      4.63078688966448e-2,    9.9535034808673919e-3,  4.7005771108148775e-2, -1.2045558260818018e-1,
      2.6468540633226277e-1,  -5.0120063457265149e-1, 7.2287365879089302e-1, -8.1769822900571455e-1,
      6.9955270822536203e-1,  -4.2387257628207414e-1, 1.6953601557703744e-1, -4.0123112592636156e-2,
      4.2692643738273463e-3};
};

}  // namespace vec_detail

namespace vec_detail {

// e^x = p · 2^n for x already clamped to the range its caller handles: n = round(x / ln 2),
// r = x - n ln 2 in [-ln2/2, ln2/2] (ln 2 split in two so that n ln2_hi is exact), p = e^r by a
// polynomial. The callers build 2^n from its bits.
template <class T>
struct ExpParts {
  T p;
  typename Coefficients<T>::Int n;
};

EMBER_VEC_INLINE ExpParts<float> exp_parts(float xc) {
  using C = Coefficients<float>;
  constexpr float round_magic = 12582912.0f;  // 1.5 · 2^23: adding it rounds to an integer
  const float t = xc * 1.44269504088896341f + round_magic;
  const float fn = t - round_magic;
  const int32_t n = std::bit_cast<int32_t>(t) - std::bit_cast<int32_t>(round_magic);
  const float r = (xc - fn * C::ln2_hi) - fn * C::ln2_lo;
  return {fmadd(r * r, horner(r, C::exp), r + 1.0f), n};
}

EMBER_VEC_INLINE ExpParts<double> exp_parts(double xc) {
  using C = Coefficients<double>;
  constexpr double round_magic = 6755399441055744.0;  // 1.5 · 2^52
  const double t = fmadd(xc, 1.4426950408889634, round_magic);
  const double fn = t - round_magic;
  const int64_t n = std::bit_cast<int64_t>(t) - std::bit_cast<int64_t>(round_magic);
  const double r = fmadd(fn, -C::ln2_lo, fmadd(fn, -C::ln2_hi, xc));
  return {horner(r, C::exp_all), n};
}

}  // namespace vec_detail

// e^x = p · 2^n (vec_detail::exp_parts), 2^n built from its bits in two halves (so that n = 128,
// or -150 for a denormal result, stays in the exponent field). 0 below the smallest denormal's
// log, +inf above ln(max), NaN stays NaN.
template <class T>
EMBER_VEC_INLINE T vexp(T x) {
  using C = vec_detail::Coefficients<T>;
  using I = typename C::Int;
  const auto [p, n] = vec_detail::exp_parts(std::min(std::max(x, C::exp_lo), C::exp_hi));
  const I n1 = n >> 1, n2 = n - n1;  // floor(n / 2): one shift
  const T y = p * std::bit_cast<T>((n1 + C::kBias) << C::kMantissa) *
              std::bit_cast<T>((n2 + C::kBias) << C::kMantissa);
  const T below = x < C::exp_lo ? T(0) : y;
  const T above = x > C::exp_hi ? std::numeric_limits<T>::infinity() : below;
  return x != x ? x : above;
}

// e^x for x <= 0: vexp without its overflow side, the scale 2^n built in one exponent as
// 2^(n + s) · 2^-s (s = 25 in Float32, 54 in Float64, so n + s stays a normal exponent down to
// the smallest denormal result): the same single rounding, so it equals vexp(x) bit for bit on
// x <= 0 (tested), in ~30% less time. x > 0 is taken as 0. For the exponentials of values shifted
// by their max (softmax), of -|x| (sigmoid) and of -x²/2 (the normal density).
template <class T>
EMBER_VEC_INLINE T vexp_nonpositive(T x) {
  using C = vec_detail::Coefficients<T>;
  using I = typename C::Int;
  constexpr int s = C::kMantissa + 2;
  const auto [p, n] = vec_detail::exp_parts(std::min(std::max(x, C::exp_lo), T(0)));
  const T y = p * std::bit_cast<T>((n + C::kBias + s) << C::kMantissa) *
              std::bit_cast<T>(I(C::kBias - s) << C::kMantissa);
  const T below = x < C::exp_lo ? T(0) : y;
  return x != x ? x : below;
}

// log x, as fdlibm: x = 2^k (1 + f) with 1 + f in [√½, √2), s = f/(2+f),
// log(1+f) = f - f²/2 + s (f²/2 + R(s²)), plus k ln 2 in two parts. Denormals are scaled into the
// normal range first; log 0 = -inf, log of a negative number NaN, log inf = inf.
template <class T>
EMBER_VEC_INLINE T vlog(T x) {
  using C = vec_detail::Coefficients<T>;
  using I = typename C::Int;
  constexpr int m = C::kMantissa;
  constexpr I exp_mask = (I(1) << (sizeof(T) * 8 - 1 - m)) - 1, mant_mask = (I(1) << m) - 1;
  constexpr int scale_bits = m + 2;
  const bool denormal = x < std::numeric_limits<T>::min();
  const T scaled = x * static_cast<T>(I(1) << scale_bits);  // both arms computed: no branch
  const T xs = denormal ? scaled : x;
  const I bits = std::bit_cast<I>(xs);
  I k = ((bits >> m) & exp_mask) - C::kBias - (denormal ? scale_bits : 0);
  T mant = std::bit_cast<T>((bits & mant_mask) | std::bit_cast<I>(T(1)));  // in [1, 2)
  const bool big = mant > static_cast<T>(M_SQRT2);
  const T half = mant * T(0.5);
  mant = big ? half : mant;
  k = big ? k + 1 : k;
  const T f = mant - T(1);
  const T s = f / (T(2) + f), z = s * s;
  const T hfsq = T(0.5) * f * f;
  const T R = z * vec_detail::horner(z, C::log);
  const T dk = static_cast<T>(k);
  const T y = dk * C::ln2_hi - ((hfsq - (s * (hfsq + R) + dk * C::ln2_lo)) - f);
  constexpr T inf = std::numeric_limits<T>::infinity();
  const T special = x == T(0) ? -inf : x < T(0) ? std::numeric_limits<T>::quiet_NaN() : x;
  return x > T(0) && x < inf ? y : special;  // NaN and inf fall to `special` as themselves
}

// tanh x: x + x z P(z) for |x| < 0.625, else ±(1 - 2 / (e^(2|x|) + 1)) (1 for large |x|).
template <class T>
EMBER_VEC_INLINE T vtanh(T x) {
  using C = vec_detail::Coefficients<T>;
  const T a = std::abs(x), z = x * x;
  const T small = vec_detail::fmadd(x * z, vec_detail::horner(z, C::tanh), x);
  const T large = T(1) - T(2) / (vexp(T(2) * a) + T(1));
  return std::copysign(a < T(0.625) ? small : large, x);  // copysign: tanh(-0) = -0
}

// 1 / (1 + e^-x), as e^x / (1 + e^x) for negative x: e^-|x| never overflows, so the tail keeps
// its (denormal) values where 1 / (1 + e^-x) would be 1 / inf.
template <class T>
EMBER_VEC_INLINE T vsigmoid(T x) {
  const T e = vexp_nonpositive(-std::abs(x)), r = T(1) / (T(1) + e);
  return x >= T(0) ? r : e * r;  // NaN takes the second branch and stays NaN
}

// Φ(x), the standard normal CDF, and φ(x), its density, from one exp(-x²/2): gelu's backward
// needs both.
template <class T>
struct NormalCdfPdf {
  T cdf, pdf;
};

// Φ(x) = erfc(-x/√2) / 2: erfc|z| = exp(-z²) Q(1/(1 + p|z|)) and Φ = 1 - erfc/2 or erfc/2, with
// no cancellation in the lower tail; in Float64 -0.5 < z < 1 takes erf z = z P(z²) instead
// (Coefficients::kErfNearZero; 1/2 + erf/2 loses at most a bit). Float32 has no such branch: one
// polynomial less per element. φ(x) = exp(-z²) / √(2π), the same exp.
// z² is x²/2 (exact but for x²'s rounding, which an FMA gives back: exp(-(z² + e)) ≈ exp(-z²)
// (1 - e)); rounding z = x/√2 before squaring would cost ~z² ulp in the tail.
template <class T>
EMBER_VEC_INLINE NormalCdfPdf<T> vnormal_cdf_pdf(T x) {
  using C = vec_detail::Coefficients<T>;
  using vec_detail::fmadd;
  const T z = x * static_cast<T>(M_SQRT1_2);
  const T a = std::abs(z), x2 = x * x, a2 = T(0.5) * x2;  // z² from x: z's rounding not squared
  const T t = T(1) / fmadd(C::erfc_p, a, T(1));
  T e = vexp_nonpositive(-a2);
#ifdef __FMA__
  e = e * (T(1) - T(0.5) * std::fma(x, x, -x2));
#endif
  // Beyond erfc_zero exp(-z²) is below the smallest denormal (and where a = inf, inf - inf made
  // e NaN).
  e = a < C::erfc_zero ? e : T(0);
  const T half_erfc = T(0.5) * e * vec_detail::horner(t, C::erfc);
  const T cdf = z > T(0) ? T(1) - half_erfc : half_erfc;
  const T pdf = e * static_cast<T>(0.3989422804014327);
  if constexpr (C::kErfNearZero) {
    const T small = fmadd(T(0.5) * z, vec_detail::horner(a2, C::erf), T(0.5));
    return {z > T(-0.5) && z < T(1) ? small : cdf, pdf};
  } else {
    return {cdf, pdf};
  }
}

template <class T>
EMBER_VEC_INLINE T vnormal_cdf(T x) {
  return vnormal_cdf_pdf(x).cdf;
}

// Note [Lane sums]
// A SIMD loop that sums needs independent partial sums (lanes) added at the end: GCC reorders a
// floating sum only under -ffast-math, and the lanes it makes for `#pragma omp simd reduction`
// may live in memory, read back with gathers (layer_norm's backward spent most of its time so).
// Lanes<T> holds kWays GCC vectors of T as wide as the target's registers (kVectorBytes: 64 bytes,
// 16 floats, with AVX-512; 32 with AVX; 16 otherwise): several, because one vector's chain of
// adds waits on each add's latency. A vector wider than the registers is not split into them:
// GCC 12 moves it through the stack, lane by lane (layer_norm ran 2.6x slower so on an AVX2 CPU).
// for_lanes walks blocks of kWidth elements, kWays at a time, handing each block its own vector:
//   Lanes<T> acc;
//   int64_t j = for_lanes<T>(n, [&](int64_t j, int u) EMBER_VEC_LAMBDA {
//     acc.v[u] += Lanes<T>::load(p + j); });
//   T sum = acc.total();
//   for (; j < n; ++j) sum += p[j];  // the tail, fewer than kWidth elements
// (GCC notes, -Wpsabi, that such vectors are returned differently where the library is built
// without them: every use is inlined, so nothing crosses an ABI, and CMakeLists.txt turns the note
// off.)
#if defined(__AVX512F__)
inline constexpr size_t kVectorBytes = 64;
#elif defined(__AVX__)
inline constexpr size_t kVectorBytes = 32;
#else
inline constexpr size_t kVectorBytes = 16;
#endif

template <class T>
struct Lanes {
  using V [[gnu::vector_size(kVectorBytes)]] = T;
  static constexpr int64_t kWidth = kVectorBytes / sizeof(T);
  static constexpr int kWays = 4;
  V v[kWays] = {};

  Lanes() = default;
  explicit Lanes(T fill) {  // every lane `fill` (a max's start)
    for (V& x : v) x = V{} + fill;
  }
  EMBER_VEC_INLINE static V load(const T* p) {
    V r;
    std::memcpy(&r, p, sizeof r);
    return r;
  }
  EMBER_VEC_INLINE static V max(V a, V b) { return a > b ? a : b; }
  // The sum (max) of every lane of one vector: halves, then the last few scalars.
  EMBER_VEC_INLINE static T sum_of(V x) {
    return reduce(x, [](auto a, auto b) { return a + b; });
  }
  EMBER_VEC_INLINE static T max_of(V x) {
    return reduce(x, [](auto a, auto b) { return a > b ? a : b; });
  }
  // ... of every lane of the kWays vectors.
  EMBER_VEC_INLINE T total() const { return sum_of((v[0] + v[1]) + (v[2] + v[3])); }
  EMBER_VEC_INLINE T max_total() const { return max_of(max(max(v[0], v[1]), max(v[2], v[3]))); }

 private:
  template <size_t Bytes>
  struct Vec {
    using type [[gnu::vector_size(Bytes)]] = T;
  };
  // Halves added (maxed) down to 16 bytes, then its few scalars.
  template <size_t Bytes = kVectorBytes, class Op>
  EMBER_VEC_INLINE static T reduce(const typename Vec<Bytes>::type& all, Op op) {
    if constexpr (Bytes == 16) {
      T r = all[0];
      for (size_t l = 1; l < 16 / sizeof(T); ++l) r = op(r, all[l]);
      return r;
    } else {
      typename Vec<Bytes / 2>::type lo, hi;
      std::memcpy(&lo, &all, sizeof lo);
      std::memcpy(&hi, reinterpret_cast<const char*>(&all) + sizeof lo, sizeof hi);
      return reduce<Bytes / 2>(op(lo, hi), op);
    }
  }
};

// body(j, u) for each whole block of Lanes<T>::kWidth elements below n, u (a constant once
// inlined) the block's vector; returns where the tail starts.
template <class T, class Body>
EMBER_VEC_INLINE int64_t for_lanes(int64_t n, Body&& body) {
  constexpr int64_t w = Lanes<T>::kWidth;
  int64_t j = 0;
  for (; j + 4 * w <= n; j += 4 * w) {
    body(j, 0);
    body(j + w, 1);
    body(j + 2 * w, 2);
    body(j + 3 * w, 3);
  }
  for (; j + w <= n; j += w) body(j, 0);
  return j;
}

}  // namespace ember
