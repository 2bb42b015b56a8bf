// The vectorisable math functions of ops/vec_math.h, through the ops that use them (so as the
// library compiles them: -march=native, vectorised, FMA where the CPU has it), against glibc:
// the largest error in ulp over dense samples of each function's range, in Float32 (against the
// 80-bit long double function) and Float64 (likewise), and the special values (±0, ±inf, NaN,
// overflow, underflow and denormal results).
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "ops/vec_math.h"
#include "tests/helpers.h"

using namespace ember;
using namespace ember::testing;

namespace {

// |got - want| in units of the last place of `want` in T (denormals: the smallest denormal).
template <class T>
double ulps(T got, long double want) {
  const T w = static_cast<T>(want);
  if (std::isnan(want)) return std::isnan(got) ? 0 : 1e30;
  if (std::isinf(w)) return got == w ? 0 : 1e30;
  const long double ulp = std::max<long double>(
      std::nextafter(std::abs(w), std::numeric_limits<T>::infinity()) - std::abs(w),
      std::numeric_limits<T>::denorm_min());
  return static_cast<double>(std::abs(static_cast<long double>(got) - want) / ulp);
}

using Op = std::function<Tensor(const Tensor&)>;

// op over the values xs in dtype T, elementwise.
template <class T>
std::vector<T> apply(const Op& op, const std::vector<T>& xs) {
  std::vector<double> wide(xs.begin(), xs.end());
  const Tensor x = from_vector(wide, {static_cast<int64_t>(xs.size())}, dtype_of<T>());
  return op(x).template to_vector<T>();
}

// The worst error of op against ref over n points spread evenly on [lo, hi] plus a log-spaced
// sweep of small magnitudes (where relative accuracy is hardest).
// `condition`: how many times the function amplifies a rounding error inside it (1 for most; a
// formula like gelu's tanh form amplifies the rounding of its argument u by |2u|).
template <class T>
void expect_ulps(const std::string& name, const Op& op, long double (*ref)(long double), double lo,
                 double hi, double max_ulps, double (*condition)(double) = nullptr) {
  std::vector<T> xs;
  constexpr int n = 400000;
  for (int i = 0; i <= n; ++i) xs.push_back(static_cast<T>(lo + (hi - lo) * i / n));
  for (double m = 1e-30; m < std::max(std::abs(lo), std::abs(hi)); m *= 1.0007) {
    if (m >= lo && m <= hi) xs.push_back(static_cast<T>(m));
    if (-m >= lo && -m <= hi) xs.push_back(static_cast<T>(-m));
  }
  const std::vector<T> ys = apply<T>(op, xs);
  double worst = 0, at = 0;
  for (size_t i = 0; i < xs.size(); ++i) {
    const double e = ulps<T>(ys[i], ref(static_cast<long double>(xs[i]))) /
                     (condition ? std::max(1.0, condition(xs[i])) : 1.0);
    if (e > worst) worst = e, at = xs[i];
  }
  BOOST_TEST(worst <= max_ulps, name << ": " << worst << " ulp at x = " << at);
  BOOST_TEST_MESSAGE(name << ": max " << worst << " ulp at " << at);
}

long double ref_exp(long double x) { return std::exp(x); }
long double ref_log(long double x) { return std::log(x); }
long double ref_tanh(long double x) { return std::tanh(x); }
long double ref_sigmoid(long double x) { return 1 / (1 + std::exp(-x)); }
long double ref_silu(long double x) { return x / (1 + std::exp(-x)); }
long double ref_gelu(long double x) { return x * std::erfc(-x / std::sqrt(2.0L)) / 2; }
long double ref_gelu_tanh(long double x) {
  const long double u = std::sqrt(2 / (4 * std::atan(1.0L))) * (x + 0.044715L * x * x * x);
  return x / (1 + std::exp(-2 * u));
}

double gelu_tanh_condition(double x) {
  return std::abs(1.5957691216057308 * (x + 0.044715 * x * x * x));
}

// Ranges: down to where the result leaves the normal range (a denormal result has fewer bits, so
// its error in ulp of the smallest denormal grows; the special-value test checks that tail).
template <class T>
void check_accuracy(double tolerance) {
  const std::string t = std::is_same_v<T, float> ? " (Float32)" : " (Float64)";
  const double big = std::is_same_v<T, float> ? 88 : 709;
  expect_ulps<T>(
      "exp" + t, [](auto& x) { return exp(x); }, ref_exp, -big - 15, big, tolerance);
  expect_ulps<T>(
      "log" + t, [](auto& x) { return log(x); }, ref_log, 0, 1e4, tolerance);
  expect_ulps<T>(
      "log near 1" + t, [](auto& x) { return log(x); }, ref_log, 0.5, 2, tolerance);
  expect_ulps<T>(
      "tanh" + t, [](auto& x) { return tanh(x); }, ref_tanh, -30, 30, tolerance);
  const bool f32 = std::is_same_v<T, float>;
  expect_ulps<T>(
      "sigmoid" + t, [](auto& x) { return sigmoid(x); }, ref_sigmoid, -big + 3, 100, tolerance);
  expect_ulps<T>(
      "silu" + t, [](auto& x) { return silu(x); }, ref_silu, -big + 3, 100, tolerance);
  // Between -1.41 and 0, Φ = 1/2 + erf/2 cancels a little; below, it is erfc's tail.
  expect_ulps<T>(
      "gelu" + t, [](auto& x) { return gelu(x); }, ref_gelu, f32 ? -12.5 : -37, 10, 2 * tolerance);
  expect_ulps<T>(
      "gelu tanh" + t, [](auto& x) { return gelu(x, "tanh"); }, ref_gelu_tanh, f32 ? -9.5 : -20, 10,
      tolerance, gelu_tanh_condition);
}

template <class T>
void check_special_values() {
  constexpr T inf = std::numeric_limits<T>::infinity(), nan = std::numeric_limits<T>::quiet_NaN();
  constexpr T denorm = std::numeric_limits<T>::denorm_min(), tiny = std::numeric_limits<T>::min();
  const auto at = [](const Op& op, std::vector<T> xs) { return apply<T>(op, xs); };
  const std::vector<T> e =
      at([](auto& x) { return exp(x); }, {0, inf, -inf, nan, 1000, -1000, std::log(tiny) - 3});
  BOOST_TEST(
      (e[0] == 1 && e[1] == inf && e[2] == 0 && std::isnan(e[3]) && e[4] == inf && e[5] == 0));
  BOOST_TEST((e[6] > 0 && e[6] < tiny));  // a denormal result is kept, not flushed to 0
  const std::vector<T> l =
      at([](auto& x) { return log(x); }, {1, 0, -T(0), -1, -inf, inf, nan, denorm, tiny / 3});
  BOOST_TEST((l[0] == 0 && l[1] == -inf && l[2] == -inf && std::isnan(l[3]) && std::isnan(l[4]) &&
              l[5] == inf && std::isnan(l[6])));
  BOOST_TEST(ulps<T>(l[7], std::log(static_cast<long double>(denorm))) <= 2);
  BOOST_TEST(ulps<T>(l[8], std::log(static_cast<long double>(tiny / 3))) <= 2);
  const std::vector<T> th = at([](auto& x) { return tanh(x); }, {0, -T(0), inf, -inf, nan});
  BOOST_TEST((th[0] == 0 && std::signbit(th[1]) && th[2] == 1 && th[3] == -1 && std::isnan(th[4])));
  const std::vector<T> sg = at([](auto& x) { return sigmoid(x); }, {inf, -inf, nan});
  BOOST_TEST((sg[0] == 1 && sg[1] == 0 && std::isnan(sg[2])));
  for (const std::string approximate : {"none", "tanh"}) {
    const std::vector<T> g =
        at([&](auto& x) { return gelu(x, approximate); }, {0, inf, -inf, nan, -1e4});
    BOOST_TEST((g[0] == 0 && g[1] == inf && std::isnan(g[3]) && g[4] == 0), approximate);
    BOOST_TEST((g[2] == 0 || std::isnan(g[2])), approximate);  // torch: -inf · 0 is NaN or 0
  }
  const std::vector<T> si = at([](auto& x) { return silu(x); }, {0, inf, nan, -1e4});
  BOOST_TEST((si[0] == 0 && si[1] == inf && std::isnan(si[2]) && si[3] == 0));
}

}  // namespace

BOOST_AUTO_TEST_SUITE(test_vec_math)

BOOST_AUTO_TEST_CASE(float32_accuracy) { check_accuracy<float>(4); }
BOOST_AUTO_TEST_CASE(float64_accuracy) { check_accuracy<double>(4); }
BOOST_AUTO_TEST_CASE(special_values) {
  check_special_values<float>();
  check_special_values<double>();
}

// vexp_nonpositive is vexp with the scale built in one exponent: bit for bit the same on x <= 0,
// denormal results, -0, -inf and NaN included (every Float32 step of 2^-10 down to past the
// smallest denormal's log, and a walk of Float64's range); a positive x is taken as 0.
template <class T>
void check_nonpositive_exp(T lowest, T step) {
  int64_t checked = 0;
  for (T x = T(0); x > lowest; x -= step, ++checked) {
    const T a = vexp(x), b = vexp_nonpositive(x);
    if (std::memcmp(&a, &b, sizeof a) != 0) {
      BOOST_ERROR("vexp_nonpositive(" << x << ") = " << b << ", vexp " << a);
      return;
    }
  }
  BOOST_TEST(checked > 100000);
  BOOST_TEST(vexp_nonpositive(T(-0.0)) == T(1));
  BOOST_TEST(vexp_nonpositive(-std::numeric_limits<T>::infinity()) == T(0));
  BOOST_TEST(std::isnan(vexp_nonpositive(std::numeric_limits<T>::quiet_NaN())));
  BOOST_TEST(vexp_nonpositive(T(3)) == T(1));
}

BOOST_AUTO_TEST_CASE(nonpositive_exp_equals_exp) {
  check_nonpositive_exp<float>(-110.0f, 0x1p-10f);
  check_nonpositive_exp<double>(-760.0, 0.00123);
}

// Non-contiguous inputs take the strided loop, contiguous ones the vectorised one: the same
// values either way.
BOOST_AUTO_TEST_CASE(every_layout_agrees) {
  const Tensor x = randn({64, 33}) * 4.0;
  for (const Tensor& in : {x.transpose(0, 1), x.narrow(1, 1, 30)}) {
    const Tensor c = in.contiguous();
    expect_close(tanh(in), tanh(c), 0, 0, "tanh");
    expect_close(sigmoid(in), sigmoid(c), 0, 0, "sigmoid");
    expect_close(exp(in), exp(c), 0, 0, "exp");
    expect_close(log(in.abs()), log(c.abs()), 0, 0, "log");
    expect_close(gelu(in), gelu(c), 0, 0, "gelu");
    expect_close(gelu(in, "tanh"), gelu(c, "tanh"), 0, 0, "gelu tanh");
    expect_close(silu(in), silu(c), 0, 0, "silu");
  }
}

BOOST_AUTO_TEST_SUITE_END()
