// Math functions the compiler can vectorise, for the hot loops of fused kernels (softmax,
// log_softmax). std::exp(float) is a libm call per element, which GCC vectorises only under
// -ffast-math; vexp(float) is Cephes' expf written as plain arithmetic, so a loop of it becomes
// SIMD code. Double keeps std::exp (gradcheck and reference runs, where speed matters less).
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>

namespace ember {

// e^x for float, within 2 ulp of std::exp over the normal range:
//   n = round(x / ln 2),  r = x - n ln 2 in [-ln2/2, ln2/2]  (ln 2 split in two for exactness),
//   e^r by Cephes' degree-7 minimax polynomial,  e^x = e^r · 2^n  (2^n built from its bits, in two
//   halves so that n = 128 does not overflow the exponent field).
// Below ln(FLT_MIN) the result is 0 (no denormals), above ln(FLT_MAX) +inf, NaN stays NaN.
inline float vexp(float x) {
  constexpr float lo = -87.3365447505531f, hi = 88.7228391116729f;
  constexpr float round_magic = 12582912.0f;  // 1.5 · 2^23: adding it rounds to an integer
  const float xc = std::min(std::max(x, lo), hi);
  const float t = xc * 1.44269504088896341f + round_magic;
  const float fn = t - round_magic;
  const int32_t n = std::bit_cast<int32_t>(t) - std::bit_cast<int32_t>(round_magic);
  const float r = (xc - fn * 0.693359375f) + fn * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const int32_t n1 = n / 2, n2 = n - n1;
  const float y =
      p * std::bit_cast<float>((n1 + 127) << 23) * std::bit_cast<float>((n2 + 127) << 23);
  const float below = x < lo ? 0.0f : y;
  const float above = x > hi ? std::numeric_limits<float>::infinity() : below;
  return x != x ? x : above;
}

inline double vexp(double x) { return std::exp(x); }

}  // namespace ember
