// The Noam rate and LambdaLR.
#include "optim/schedule.h"

#include <algorithm>
#include <cmath>

namespace ember::optim {

double rate(int64_t step, int64_t model_size, double factor, int64_t warmup) {
  EMBER_CHECK(step >= 0, "rate: step must be non-negative, got {}", step);
  EMBER_CHECK(model_size > 0, "rate: model_size must be positive, got {}", model_size);
  EMBER_CHECK(warmup > 0, "rate: warmup must be positive, got {}", warmup);
  const double s = static_cast<double>(std::max<int64_t>(step, 1));
  return factor * (std::pow(static_cast<double>(model_size), -0.5) *
                   std::min(std::pow(s, -0.5), s * std::pow(static_cast<double>(warmup), -1.5)));
}

LambdaLR::LambdaLR(Optimizer& optimizer, std::function<double(int64_t)> lr_lambda)
    : optimizer_(optimizer), lr_lambda_(std::move(lr_lambda)), base_lr_(optimizer.lr()) {
  EMBER_CHECK(lr_lambda_ != nullptr, "LambdaLR: lr_lambda is empty");
  step();
}

void LambdaLR::step() {
  ++last_epoch_;
  optimizer_.set_lr(base_lr_ * lr_lambda_(last_epoch_));
}

}  // namespace ember::optim
