// D2L's attention cues and Nadaraya-Watson attention pooling (Dive into Deep Learning, chapter
// "Attention Mechanisms", sections 10.1-10.2), step by step with D2L's names: the attention-cues
// heatmap, the data, average pooling, nonparametric attention pooling, the bmm demo, and the
// parametric model NWKernelRegression trained on leave-one-out keys and values. Every figure D2L
// draws is written as SVG into --out, with the numbers a reader would check in metrics.json.
// Failures end as one line on stderr and a non-zero exit (examples/program.h).
#include <cmath>
#include <filesystem>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "ember.h"
#include "program.h"

using namespace ember;

namespace {

struct Flags {
  uint64_t seed = 2;  // an initial w that training moves (docs/examples.md's note on this example)
  int epochs = 5, threads = 0;
  int64_t n_train = 50;
  double lr = 0.5;
  program::OnNonfinite on_nonfinite = program::OnNonfinite::kStop;
  std::string out = "out/nw_regression";
  std::string device = "cpu";
};

// Bytes the run needs: its (n_train, n_train) matrices (tiles, mask, keys, values, the kernel
// and their gradients) take about 16 floats per element, measured at n_train 2000 and 4000.
double memory_bytes(int64_t n_train) {
  const double n = static_cast<double>(n_train);
  return 64 * n * n + (1 << 24);
}

int run(const Flags& flags) {
  const uint64_t seed = flags.seed;
  const int epochs = flags.epochs;
  const int64_t n_train = flags.n_train;
  const double lr = flags.lr;
  const std::string& out = flags.out;
  program::check_memory(memory_bytes(n_train), fmt::format("--n-train {}", n_train));
  program::prepare_out_dir(out, {"metrics.json", "loss.svg"});
  set_num_threads(flags.threads);
  const Device device = program::device_of(flags.device);
  manual_seed(seed);
  const auto file = [&](const std::string& name) {
    return (std::filesystem::path(out) / name).string();
  };

  // --- 10.1 Attention cues: a query attends only to the key of the same index ---------------
  Tensor attention_weights = eye(10).reshape({1, 1, 10, 10});
  viz::show_heatmaps(attention_weights, file("attention_cues.svg"), "Keys", "Queries");

  // --- 10.2.1 Data: y = 2 sin(x) + x^0.8 + noise --------------------------------------------
  // (drawn on the host, the same numbers for any --device, then moved there)
  const Tensor x_train = sort(rand({n_train}) * 5).values.to(device);  // sorted training inputs
  const auto f = [](const Tensor& x) { return 2 * sin(x) + x.pow(0.8); };
  const Tensor y_train = f(x_train) + normal(0.0, 0.5, {n_train}).to(device);  // training outputs
  const Tensor x_test = arange(0, 5, 0.1, kFloat32, device);                   // testing examples
  const Tensor y_truth = f(x_test);  // ground-truth outputs of the testing examples
  const int64_t n_test = x_test.numel();
  fmt::print("n_train {}, n_test {}\n", n_train, n_test);

  // Truth and prediction as lines, the training examples as circles.
  const auto plot_kernel_reg = [&](const Tensor& y_hat, const std::string& name) {
    viz::Figure fig("x", "y");
    fig.add_line(x_test.cpu(), y_truth.cpu(), "Truth")
        .add_line(x_test.cpu(), y_hat.reshape({-1}).cpu(), "Pred");
    fig.add_scatter(x_train.cpu(), y_train.cpu(), "", 0.5).xlim(0, 5).ylim(-1, 5);
    fig.save(file(name));
  };
  const auto test_mse = [&](const Tensor& y_hat) {
    return (y_hat.reshape({-1}) - y_truth).pow(2).mean().item<double>();
  };

  // --- 10.2.2 Average pooling: every prediction is the mean of the training outputs ----------
  Tensor y_hat = repeat_interleave(y_train.mean(), n_test);
  plot_kernel_reg(y_hat, "kernel_reg_average.svg");
  const double mse_average = test_mse(y_hat);

  // --- 10.2.3 Nonparametric attention pooling (Gaussian kernel) -----------------------------
  // X_repeat: (n_test, n_train), each row holds the same testing input (the same query).
  const Tensor X_repeat = x_test.repeat_interleave(n_train).reshape({-1, n_train});
  // x_train holds the keys; attention_weights: (n_test, n_train), row i distributes query i's
  // attention over the values (y_train).
  attention_weights = softmax(-(X_repeat - x_train).pow(2) / 2, 1);
  // Each element of y_hat is a weighted average of the values.
  y_hat = matmul(attention_weights, y_train);
  fmt::print("attention_weights {}, y_train {}\n", attention_weights.shape(), y_train.shape());
  plot_kernel_reg(y_hat, "kernel_reg_nonparametric.svg");
  const double mse_nonparametric = test_mse(y_hat);
  viz::show_heatmaps(attention_weights.unsqueeze(0).unsqueeze(0).cpu(),
                     file("attention_nonparametric.svg"), "Sorted training inputs",
                     "Sorted testing inputs");

  // --- 10.2.4 Parametric attention pooling --------------------------------------------------
  // Batch matrix multiplication: (n, a, b) x (n, b, c) -> (n, a, c).
  const Tensor X = ones({2, 1, 4}, kFloat32, device), Y = ones({2, 4, 6}, kFloat32, device);
  fmt::print("bmm(X, Y).shape {}\n", bmm(X, Y).shape());
  {
    const Tensor weights = ones({2, 10}, kFloat32, device) * 0.1;
    const Tensor values = arange(0, 20, 1, kFloat32, device).reshape({2, 10});
    fmt::print("bmm(weights.unsqueeze(1), values.unsqueeze(-1))\n{}\n",
               bmm(weights.unsqueeze(1), values.unsqueeze(-1)));
  }

  // Training data as keys and values: every training input attends to all the others (its own
  // key-value pair is masked out, or w would grow to make each point predict itself).
  // X_tile: (n_train, n_train), each row holds the same training inputs.
  const Tensor X_tile = x_train.repeat({n_train, 1});
  // Y_tile: (n_train, n_train), each row holds the same training outputs.
  const Tensor Y_tile = y_train.repeat({n_train, 1});
  const Tensor mask = (1 - eye(n_train, kFloat32, device)).to(kBool);
  // keys: (n_train, n_train - 1)
  Tensor keys = X_tile.masked_select(mask).reshape({n_train, -1});
  // values: (n_train, n_train - 1)
  Tensor values = Y_tile.masked_select(mask).reshape({n_train, -1});
  fmt::print("keys {}, values {}\n", keys.shape(), values.shape());

  nn::NWKernelRegression net;
  net.to(device);
  const double w_initial = net.w.item<double>();
  const auto loss = [](const Tensor& y_hat, const Tensor& y) {
    return mse_loss(y_hat, y, Reduction::None);
  };
  optim::SGD trainer(net.parameters(), {.lr = lr});
  viz::Animator animator("epoch", "loss", {}, std::pair<double, double>{1, std::max(epochs, 2)});
  std::vector<double> loss_per_epoch;
  program::NonfiniteGuard guard(flags.on_nonfinite, net.parameters());
  fmt::print("w initial {:.6f}\n", w_initial);
  for (int epoch = 0; epoch < epochs; ++epoch) {
    const auto where = [&] { return fmt::format("epoch {}", epoch + 1); };
    trainer.zero_grad();
    const Tensor l = loss(net(x_train, keys, values), y_train);
    const double total = l.sum().item<double>();
    if (!guard.loss_ok(total, where)) continue;
    l.sum().backward();
    if (!guard.gradients_ok(where)) continue;
    trainer.step();
    fmt::print("epoch {}, loss {:.6f}\n", epoch + 1, total);
    animator.add(epoch + 1, {total});
    loss_per_epoch.push_back(total);
  }
  guard.check_parameters("after training");
  animator.save(file("loss.svg"));
  const double w_learned = net.w.item<double>();
  fmt::print("w learned {:.6f}\n", w_learned);

  // Testing: every testing input attends to all training pairs.
  // keys: (n_test, n_train), each row holds the same training inputs (the same keys).
  keys = x_train.repeat({n_test, 1});
  // values: (n_test, n_train)
  values = y_train.repeat({n_test, 1});
  y_hat = net(x_test, keys, values).detach();
  plot_kernel_reg(y_hat, "kernel_reg_parametric.svg");
  const double mse_parametric = test_mse(y_hat);
  // Sharper than the nonparametric weights: w > 1 narrows the Gaussian kernel.
  viz::show_heatmaps(net.attention_weights.unsqueeze(0).unsqueeze(0).cpu(),
                     file("attention_parametric.svg"), "Sorted training inputs",
                     "Sorted testing inputs");

  fmt::print(
      "test MSE against the truth: average {:.4f}, nonparametric {:.4f}, parametric {:.4f}\n",
      mse_average, mse_nonparametric, mse_parametric);
  const nlohmann::json metrics = {
      {"seed", seed},
      {"n_train", n_train},
      {"epochs", epochs},
      {"lr", lr},
      {"device", device.str()},
      {"gpu", program::device_model(device)},
      {"skipped_steps", guard.skipped()},
      {"w_initial", w_initial},
      {"w_learned", w_learned},
      {"loss_per_epoch", loss_per_epoch},
      {"test_mse",
       {{"average", mse_average},
        {"nonparametric", mse_nonparametric},
        {"parametric", mse_parametric}}},
  };
  program::write_text(file("metrics.json"), metrics.dump(2) + "\n");
  fmt::print("wrote {}\n", out);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"D2L attention pooling: Nadaraya-Watson kernel regression"};
  Flags flags;
  app.add_option("--seed", flags.seed, "random seed");
  app.add_option("--epochs", flags.epochs, "full-batch SGD steps")
      ->check(program::finite_in(0, 1000000));
  app.add_option("--lr", flags.lr, "SGD learning rate (positive)")->check(program::positive());
  program::add_on_nonfinite_option(app, flags.on_nonfinite);
  app.add_option("--n-train", flags.n_train, "training examples (memory grows as its square)")
      ->check(program::finite_in(2, 100000));
  program::add_threads_option(app, flags.threads);
  program::add_device_option(app, flags.device);
  app.add_option("--out", flags.out, "output directory");
  return program::run("nw_regression", app, argc, argv, [&] { return run(flags); });
}
