// A two-layer MLP fitted to a noisy sine with Adam, then saved and loaded back: the smallest
// complete Ember training script (the README shows its core). Failures end as one line on stderr
// and a non-zero exit (examples/program.h).
#include <CLI/CLI.hpp>

#include "ember.h"
#include "program.h"

using namespace ember;

struct MLP : nn::Cloneable<MLP> {
  MLP(int64_t in, int64_t hidden, int64_t out) {
    register_module("fc1", fc1, std::make_shared<nn::Linear>(in, hidden));
    register_module("fc2", fc2, std::make_shared<nn::Linear>(hidden, out));
  }
  Tensor forward(const Tensor& x) const { return fc2->forward(relu(fc1->forward(x))); }
  std::shared_ptr<nn::Linear> fc1, fc2;
};

int main(int argc, char** argv) {
  CLI::App app{"Train a 2-layer MLP on y = sin(3x) + noise"};
  uint64_t seed = 0;
  int epochs = 500, threads = 0;
  double lr = 0.01;
  program::OnNonfinite on_nonfinite = program::OnNonfinite::kStop;
  std::string out = "out/mlp_regression", device_name = "cpu";
  app.add_option("--seed", seed, "random seed");
  app.add_option("--epochs", epochs, "full-batch training steps")->check(program::count(0));
  app.add_option("--lr", lr, "Adam learning rate")->check(program::positive());
  program::add_on_nonfinite_option(app, on_nonfinite);
  program::add_threads_option(app, threads);
  program::add_device_option(app, device_name);
  app.add_option("--out", out, "output directory");
  return program::run("mlp_regression", app, argc, argv, [&] {
    program::prepare_out_dir(out, {"model.safetensors"});
    set_num_threads(threads);
    const Device device = program::device_of(device_name);

    manual_seed(seed);
    const Tensor x = (rand({256, 1}) * 2.0 - 1.0).to(device);
    const Tensor y = sin(x * 3.0) + normal(0, 0.05, {256, 1}).to(device);
    auto model = std::make_shared<MLP>(1, 32, 1);
    model->to(device);  // parameters moved in place, before the optimizer takes them
    optim::Adam opt(model->parameters(), {.lr = lr});
    program::NonfiniteGuard guard(on_nonfinite, model->parameters());
    for (int epoch = 1; epoch <= epochs; ++epoch) {
      const auto where = [&] { return fmt::format("epoch {}", epoch); };
      opt.zero_grad();
      Tensor loss = mse_loss(model->forward(x), y);
      const double value = loss.item<double>();
      if (!guard.loss_ok(value, where)) continue;
      loss.backward();
      if (!guard.gradients_ok(where)) continue;
      opt.step();
      if (epoch == 1 || epoch % 100 == 0) fmt::print("epoch {}, loss {:.5f}\n", epoch, value);
    }
    if (guard.skipped() > 0) fmt::print("skipped {} non-finite steps\n", guard.skipped());
    guard.check_parameters("after training");

    const std::string path = out + "/model.safetensors";
    nn::save(*model, path);
    MLP restored(1, 32, 1);
    nn::load(restored, path);
    restored.to(device);
    fmt::print("saved and reloaded {}: loss {:.5f}\n", path,
               mse_loss(restored.forward(x), y).item<double>());
    return 0;
  });
}
