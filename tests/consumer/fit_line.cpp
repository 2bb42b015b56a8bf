// A user's program against the installed Ember: fits y = 3x - 2 with nn::Linear and SGD, and
// prints one line; exits non-zero when the fit is off or anything throws.
#include <cmath>
#include <cstdio>

#include "ember.h"

using namespace ember;

int main() {
  try {
    manual_seed(0);
    const Tensor x = rand({64, 1}) * 2.0 - 1.0;
    const Tensor y = x * 3.0 - 2.0;
    nn::Linear model(1, 1);
    optim::SGD optimizer(model.parameters(), {.lr = 0.5});
    double loss = 0;
    for (int step = 0; step < 200; ++step) {
      optimizer.zero_grad();
      const Tensor l = mse_loss(model.forward(x), y);
      l.backward();
      optimizer.step();
      loss = l.item<double>();
    }
    const double w = model.weight.item<double>(), b = model.bias.item<double>();
    std::printf("fit_line: w %.4f, b %.4f, loss %.2e\n", w, b, loss);
    return std::abs(w - 3) < 1e-3 && std::abs(b + 2) < 1e-3 ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fit_line: %s\n", e.what());
    return 1;
  }
}
