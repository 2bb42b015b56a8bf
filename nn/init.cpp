// In-place initialisers drawing from the global generator.
#include "nn/init.h"

#include <cmath>

#include "graph/autograd.h"
#include "graph/random.h"
#include "ops/elementwise.h"

namespace ember::nn::init {

namespace {

void check_floating(const Tensor& t, std::string_view op) {
  EMBER_CHECK(t.defined(), "{}: undefined tensor", op);
  EMBER_CHECK(is_floating(t.dtype()),
              "{}: expected a Float32 or Float64 tensor, got {} of shape {}", op, t.dtype(),
              t.shape());
}

}  // namespace

void xavier_uniform_(Tensor& t) {
  check_floating(t, "xavier_uniform_");
  EMBER_CHECK(t.dim() >= 2, "xavier_uniform_: needs a tensor of at least 2 dims, got shape {}",
              t.shape());
  const int64_t receptive = t.numel() / std::max<int64_t>(1, t.size(0) * t.size(1));
  const double fan_in = static_cast<double>(t.size(1) * receptive);
  const double fan_out = static_cast<double>(t.size(0) * receptive);
  const double a = std::sqrt(6.0 / std::max(1.0, fan_in + fan_out));
  uniform_(t, -a, a);
}

void uniform_(Tensor& t, double low, double high) {
  check_floating(t, "uniform_");
  EMBER_CHECK(low <= high, "uniform_: low {} must not exceed high {}", low, high);
  NoGradGuard no_grad;
  t.copy_(rand(t.shape(), kFloat64) * (high - low) + low);
}

void normal_(Tensor& t, double mean, double std) {
  check_floating(t, "normal_");
  EMBER_CHECK(std >= 0, "normal_: std must be non-negative, got {}", std);
  NoGradGuard no_grad;
  t.copy_(normal(mean, std, t.shape(), kFloat64));
}

void zeros_(Tensor& t) {
  EMBER_CHECK(t.defined(), "zeros_: undefined tensor");
  NoGradGuard no_grad;
  t.zero_();
}

void ones_(Tensor& t) {
  EMBER_CHECK(t.defined(), "ones_: undefined tensor");
  NoGradGuard no_grad;
  t.fill_(1.0);
}

}  // namespace ember::nn::init
