// A two-layer MLP fitted to a noisy sine with plain SGD: the smallest complete Ember training
// script, written with the functional ops only (parameters are leaf tensors).
#include <filesystem>

#include <CLI/CLI.hpp>

#include "ember.h"

using namespace ember;

int main(int argc, char** argv) {
  CLI::App app{"Train a 2-layer MLP on y = sin(3x) + noise"};
  uint64_t seed = 0;
  int epochs = 1000, threads = 0;
  std::string out = "out/mlp_regression";
  app.add_option("--seed", seed, "random seed");
  app.add_option("--epochs", epochs, "full-batch training steps");
  app.add_option("--threads", threads, "threads for OpenMP and OpenBLAS (0: all cores)");
  app.add_option("--out", out, "output directory");
  CLI11_PARSE(app, argc, argv);
  set_num_threads(threads);
  manual_seed(seed);
  std::filesystem::create_directories(out);

  // Data: 256 points of a noisy sine on [-1, 1].
  const Tensor x = rand({256, 1}) * 2.0 - 1.0;
  const Tensor y = sin(x * 3.0) + normal(0, 0.05, {256, 1});

  // Parameters, initialised as torch.nn.Linear does: U(-1/sqrt(in), 1/sqrt(in)).
  const int64_t hidden = 32;
  Tensor w1 = (rand({hidden, 1}) * 2.0 - 1.0).requires_grad_();
  Tensor b1 = (rand({hidden}) * 2.0 - 1.0).requires_grad_();
  const double bound = 1.0 / std::sqrt(static_cast<double>(hidden));
  Tensor w2 = ((rand({1, hidden}) * 2.0 - 1.0) * bound).requires_grad_();
  Tensor b2 = ((rand({1}) * 2.0 - 1.0) * bound).requires_grad_();
  const std::vector<Tensor> params{w1, b1, w2, b2};

  const double lr = 0.1;
  for (int epoch = 1; epoch <= epochs; ++epoch) {
    const Tensor y_hat = linear(relu(linear(x, w1, b1)), w2, b2);
    const Tensor loss = mse_loss(y_hat, y);
    for (const Tensor& p : params) p.set_grad({});
    loss.backward();
    {
      NoGradGuard no_grad;
      for (Tensor p : params) p.add_(p.grad() * -lr);
    }
    if (epoch == 1 || epoch % 100 == 0)
      fmt::print("epoch {}, loss {:.5f}\n", epoch, loss.item<double>());
  }
  return 0;
}
