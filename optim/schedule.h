// Learning-rate schedules: the Annotated Transformer's `rate` and PyTorch's LambdaLR.
#pragma once

#include <cstdint>
#include <functional>

#include "optim/optimizer.h"

namespace ember::optim {

// factor * model_size^-0.5 * min(step^-0.5, step * warmup^-1.5), step 0 counted as 1.
double rate(int64_t step, int64_t model_size, double factor, int64_t warmup);

// torch.optim.lr_scheduler.LambdaLR: lr = base_lr * f(0) at construction and base_lr * f(k)
// after k calls of step(); base_lr is the optimizer's lr at construction.
class LambdaLR {
 public:
  LambdaLR(Optimizer& optimizer, std::function<double(int64_t)> lr_lambda);
  void step();
  double get_last_lr() const { return optimizer_.lr(); }
  int64_t last_epoch() const { return last_epoch_; }
  double base_lr() const { return base_lr_; }

 private:
  Optimizer& optimizer_;
  std::function<double(int64_t)> lr_lambda_;
  double base_lr_;
  int64_t last_epoch_ = -1;
};

}  // namespace ember::optim
