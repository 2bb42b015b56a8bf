// Image classification on Fashion-MNIST (issue 44): D2L's vision chapters in Ember. Two models,
// fixed so that others can reproduce them:
//   --model cnn     two pairs of 3x3 convolutions (32, then 64 channels) with BatchNorm and ReLU,
//                   each pair followed by 2x2 max pooling, then Linear(3136, 256), ReLU,
//                   Dropout(0.3) and Linear(256, 10);
//   --model resnet  a ResNet of BasicBlocks (torchvision's names): a 3x3 stem of 16 channels,
//                   three stages of 16, 32 and 64 channels of two blocks each (stride 2 and a 1x1
//                   projection at stages 2 and 3), global average pooling and Linear(64, 10).
// Every layer is initialised as torch's defaults; the images are scaled to [0, 1] and
// normalised by the training set's mean and standard deviation (0.2860, 0.3530).
//
// Training: Adam (or SGD with Nesterov momentum) with a per-step cosine schedule from --lr to 0,
// batches of --batch images in an order shuffled per epoch by a generator seeded with (--seed,
// epoch), so a run stopped anywhere draws the same orders when resumed. --augment pads each image
// by 2 and crops it back to 28 x 28 at a random place, then flips it horizontally with p = 0.5,
// both from Ember's generator, which the checkpoint saves. After each epoch the model is tested
// on the test set; the run ends with the confusion matrix and a grid of test images.
//
// A run saves a checkpoint (train/checkpoint.h) after every epoch and when --max-steps stops it;
// `--resume DIR` continues it, bit for bit as a run never stopped.
//
//   fashion_mnist                                      the CNN, 15 epochs, into out/fashion_mnist
//   fashion_mnist --model resnet --augment --out out/resnet
//   fashion_mnist --resume out/fashion_mnist           continue a stopped run
//   fashion_mnist --load out/fashion_mnist --predict images.idx.gz   classify images
#include <sys/resource.h>

#include <chrono>
#include <cmath>
#include <numbers>
#include <random>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "ember.h"
#include "fashion_mnist_models.h"
#include "program.h"
#include "train/checkpoint.h"
#include "viz/svg.h"

using namespace ember;
using Clock = std::chrono::steady_clock;
using Json = nlohmann::ordered_json;

namespace {

// The training set's pixel mean and standard deviation (of the [0, 1] values): torchvision's
// usual Normalize((0.2860,), (0.3530,)) for Fashion-MNIST.
constexpr double kMean = 0.2860, kStd = 0.3530;
using fashion_mnist::Classifier;
using fashion_mnist::kClasses;
using fashion_mnist::make_model;
constexpr int64_t kSide = 28;

struct Config {
  std::string model = "cnn";
  int64_t epochs = 15, batch = 128;
  double lr = 0;             // 0: the optimizer's default (adam 1e-3, sgd 0.1)
  double weight_decay = -1;  // < 0: the optimizer's default (adam 0, sgd 5e-4)
  std::string optimizer = "adam";
  bool augment = false;
  uint64_t seed = 0;
  std::string data = data::kFashionMNISTRoot;
  int64_t train_size = 0, test_size = 0;  // 0: all
  std::string matmul_precision = "highest";
  // How this process runs, not what it computes: may change on --resume.
  int threads = 0;
  std::string device = "cpu";
  int64_t log_every = 100, max_steps = 0;
  program::OnNonfinite on_nonfinite = program::OnNonfinite::kStop;
};

// What a run computes with: metrics.json's "config" and DIR/run.json, which --resume reads.
template <class F>
void config_fields(Config& c, F&& f) {
  f("model", c.model);
  f("epochs", c.epochs);
  f("batch", c.batch);
  f("lr", c.lr);
  f("weight_decay", c.weight_decay);
  f("optimizer", c.optimizer);
  f("augment", c.augment);
  f("seed", c.seed);
  f("data", c.data);
  f("train_size", c.train_size);
  f("test_size", c.test_size);
  f("matmul_precision", c.matmul_precision);
}

Json config_json(const Config& c) {
  return program::config_to_json(c, [](Config& x, auto f) { config_fields(x, f); });
}

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

Tensor normalise(const Tensor& images) { return (images - kMean) / kStd; }

// --- data

struct Data {
  data::FashionMNIST train, test;
  int64_t train_size, test_size;  // the first this many images of each are used
};

// The order of epoch `epoch`: 0..n-1 shuffled (Fisher-Yates) by a generator of its own seeded
// with (seed, epoch), so that it does not depend on what else the run drew.
std::vector<int64_t> epoch_order(int64_t n, uint64_t seed, int64_t epoch) {
  std::mt19937_64 gen(counter_bits(seed, static_cast<uint64_t>(epoch)));
  std::vector<int64_t> order(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) order[static_cast<size_t>(i)] = i;
  for (int64_t i = n - 1; i > 0; --i) {
    const auto bound = static_cast<unsigned __int128>(i + 1);
    const auto j = static_cast<int64_t>((static_cast<unsigned __int128>(gen()) * bound) >> 64);
    std::swap(order[static_cast<size_t>(i)], order[static_cast<size_t>(j)]);
  }
  return order;
}

// --- a run

struct Progress {
  int64_t epoch = 0;                              // epochs finished
  int64_t step = 0;                               // batches of epoch `epoch` done
  double epoch_loss = 0;                          // their summed loss (mean loss x images)
  int64_t epoch_images = 0;                       // and images
  double epoch_seconds = 0;                       // and training time
  int64_t images = 0;                             // images of the finished epochs
  double train_seconds = 0;                       // and their training time
  std::vector<double> train_loss, test_accuracy;  // per finished epoch

  std::map<std::string, int64_t> counters() const {
    program::Counters c;
    c.put("epoch", epoch);
    c.put("step", step);
    c.put("epoch_images", epoch_images);
    c.put("images", images);
    c.put_real("epoch_loss", epoch_loss);
    c.put_real("epoch_seconds", epoch_seconds);
    c.put_real("train_seconds", train_seconds);
    for (size_t i = 0; i < train_loss.size(); ++i) {
      c.put_real(fmt::format("train_loss.{}", i), train_loss[i]);
      c.put_real(fmt::format("test_accuracy.{}", i), test_accuracy[i]);
    }
    return c.values();
  }
  static Progress from(std::map<std::string, int64_t> m, const std::string& path) {
    const program::Counters c(std::move(m), path);
    Progress p;
    p.epoch = c.get("epoch");
    p.step = c.get("step");
    p.epoch_images = c.get("epoch_images");
    p.images = c.get("images");
    p.epoch_loss = c.get_real("epoch_loss");
    p.epoch_seconds = c.get_real("epoch_seconds");
    p.train_seconds = c.get_real("train_seconds");
    EMBER_CHECK(p.epoch >= 0 && p.epoch <= program::kMaxCount && p.step >= 0,
                "--resume: '{}' has epoch {} and step {}", path, p.epoch, p.step);
    for (int64_t i = 0; i < p.epoch; ++i) {
      p.train_loss.push_back(c.get_real(fmt::format("train_loss.{}", i)));
      p.test_accuracy.push_back(c.get_real(fmt::format("test_accuracy.{}", i)));
    }
    return p;
  }
};

std::unique_ptr<optim::Optimizer> make_optimizer(const Config& c,
                                                 const std::vector<Tensor>& params) {
  if (c.optimizer == "sgd")
    return std::make_unique<optim::SGD>(
        params, optim::SGDOptions{
                    .lr = c.lr, .momentum = 0.9, .weight_decay = c.weight_decay, .nesterov = true});
  return std::make_unique<optim::Adam>(
      params, optim::AdamOptions{.lr = c.lr, .weight_decay = c.weight_decay});
}

int64_t steps_per_epoch(const Config& c, int64_t train_size) {
  return (train_size + c.batch - 1) / c.batch;
}

// Test-set predictions of the model in eval mode, without a graph, in batches of 1000.
std::vector<int64_t> predict(Classifier& model, const Tensor& images, const Device& device) {
  NoGradGuard no_grad;
  model.module->eval();
  std::vector<int64_t> out;
  const int64_t n = images.size(0);
  for (int64_t i = 0; i < n; i += 1000) {
    const Tensor x = normalise(images.narrow(0, i, std::min<int64_t>(1000, n - i))).to(device);
    const std::vector<int64_t> p = model.forward(x).argmax(1).to(kCPU).to_vector<int64_t>();
    out.insert(out.end(), p.begin(), p.end());
  }
  return out;
}

class Trainer {
 public:
  Trainer(const Config& c, const Data& data, std::string out)
      : c_(c),
        data_(data),
        out_(std::move(out)),
        device_(program::device_of(c.device)),
        model_(make_model(c.model)),
        optimizer_(make_optimizer(c, model_.module->parameters())),
        scheduler_(*optimizer_,
                   [total = c.epochs * steps_per_epoch(c, data.train_size)](int64_t step) {
                     const double t = static_cast<double>(std::min(step, total)) /
                                      static_cast<double>(std::max<int64_t>(total, 1));
                     return 0.5 * (1 + std::cos(std::numbers::pi * t));
                   }),
        guard_(c.on_nonfinite, model_.module->parameters()) {
    model_.module->to(device_);
  }

  Progress progress;
  Classifier& model() { return model_; }
  const Device& device() const { return device_; }

  std::string checkpoint_path() const { return out_ + "/checkpoint.safetensors"; }
  void checkpoint() {
    save_checkpoint(checkpoint_path(), *model_.module, *optimizer_, &scheduler_,
                    progress.counters());
  }
  void resume() {
    progress =
        Progress::from(load_checkpoint(checkpoint_path(), *model_.module, *optimizer_, &scheduler_),
                       checkpoint_path());
  }

  // Trains the rest of epoch progress.epoch. False when --max-steps stopped it first (after a
  // checkpoint).
  bool train_epoch() {
    Progress& p = progress;
    const std::vector<int64_t> order = epoch_order(data_.train_size, c_.seed, p.epoch);
    const int64_t steps = steps_per_epoch(c_, data_.train_size);
    while (p.step < steps) {
      if (c_.max_steps > 0 && steps_ == c_.max_steps) {
        checkpoint();
        return false;
      }
      const auto start = Clock::now();
      model_.module->train();
      const int64_t first = p.step * c_.batch;
      const std::vector<int64_t> indices(
          order.begin() + first, order.begin() + std::min(first + c_.batch, data_.train_size));
      data::ImageBatch batch = data_.train.batch(indices);
      Tensor images = batch.images;
      if (c_.augment)
        images = data::random_horizontal_flip(data::random_crop(images, kSide, 2), 0.5);
      const Tensor logits = model_.forward(normalise(images).to(device_));
      const Tensor loss = cross_entropy(logits, batch.labels.to(device_));
      const double value = loss.item<double>();
      const auto where = [&] { return fmt::format("epoch {}, step {}", p.epoch + 1, p.step + 1); };
      const auto n = static_cast<int64_t>(indices.size());
      if (guard_.loss_ok(value, where)) {
        loss.backward();
        if (guard_.gradients_ok(where)) {
          optimizer_->step();
          p.epoch_loss += value * static_cast<double>(n);
          p.epoch_images += n;
        }
        optimizer_->zero_grad();
      }
      scheduler_.step();
      profile::step();  // EMBER_PROFILE's per-step shares
      p.epoch_seconds += seconds_since(start);
      ++p.step;
      ++steps_;
      if (p.step % c_.log_every == 0 && p.step < steps) {
        const double rate = static_cast<double>(p.step * c_.batch) / p.epoch_seconds;
        const double left =
            static_cast<double>((c_.epochs - p.epoch) * data_.train_size - p.step * c_.batch) /
            rate;
        fmt::print("  epoch {} step {:4d}/{} | loss {:.4f} | {:.0f} images/s | ETA {}:{:02d}\n",
                   p.epoch + 1, p.step, steps,
                   p.epoch_loss / static_cast<double>(std::max<int64_t>(p.epoch_images, 1)), rate,
                   static_cast<int64_t>(left) / 60, static_cast<int64_t>(left) % 60);
        std::fflush(stdout);
      }
    }
    return true;
  }

  // After an epoch: the test accuracy, the history and a checkpoint.
  void end_epoch() {
    Progress& p = progress;
    guard_.check_parameters(fmt::format("after epoch {}", p.epoch + 1));
    const double loss = p.epoch_loss / static_cast<double>(std::max<int64_t>(p.epoch_images, 1));
    guard_.check_loss(p.epoch_images > 0 ? loss : NAN, fmt::format("epoch {}'s loss", p.epoch + 1));
    const double accuracy = test_accuracy();
    p.train_loss.push_back(loss);
    p.test_accuracy.push_back(accuracy);
    p.images += p.epoch_images;
    p.train_seconds += p.epoch_seconds;
    fmt::print("epoch {}/{}: train loss {:.4f}, test accuracy {:.2f}%, {:.0f} images/s, {:.1f} s\n",
               p.epoch + 1, c_.epochs, loss, 100 * accuracy,
               static_cast<double>(p.epoch_images) / p.epoch_seconds, p.epoch_seconds);
    std::fflush(stdout);
    ++p.epoch;
    p.step = 0;
    p.epoch_loss = 0;
    p.epoch_images = 0;
    p.epoch_seconds = 0;
    checkpoint();
  }

  std::vector<int64_t> test_predictions() {
    return predict(model_, data_.test.data().narrow(0, 0, data_.test_size), device_);
  }
  double test_accuracy() {
    const std::vector<int64_t> predicted = test_predictions();
    const std::vector<int64_t> truth = test_labels();
    int64_t right = 0;
    for (size_t i = 0; i < predicted.size(); ++i) right += predicted[i] == truth[i];
    return static_cast<double>(right) / static_cast<double>(predicted.size());
  }
  std::vector<int64_t> test_labels() const {
    return data_.test.targets().narrow(0, 0, data_.test_size).to_vector<int64_t>();
  }

 private:
  const Config& c_;
  const Data& data_;
  std::string out_;
  Device device_;
  Classifier model_;
  std::unique_ptr<optim::Optimizer> optimizer_;
  optim::LambdaLR scheduler_;
  program::NonfiniteGuard guard_;
  int64_t steps_ = 0;  // steps this process took (--max-steps)
};

// --- figures

// The confusion matrix (rows: true class, columns: predicted) as a heatmap in Blues with each
// cell's count and the class names on both axes.
void save_confusion(const std::vector<std::vector<int64_t>>& counts, const std::string& path) {
  const std::vector<std::string>& names = data::FashionMNIST::classes();
  constexpr double kCell = 34, kLeft = 100, kTop = 30, kBottom = 100;
  const double side = kCell * kClasses;
  viz::svg::Writer svg(kLeft + side + 20, kTop + side + kBottom);
  int64_t most = 1;
  for (const auto& row : counts)
    for (int64_t v : row) most = std::max(most, v);
  svg.text(kLeft + side / 2, 18, "Fashion-MNIST test set: true class (rows) vs predicted", {12});
  for (int64_t i = 0; i < kClasses; ++i) {
    for (int64_t j = 0; j < kClasses; ++j) {
      const int64_t v = counts[static_cast<size_t>(i)][static_cast<size_t>(j)];
      const double t = static_cast<double>(v) / static_cast<double>(most);
      const double x = kLeft + kCell * static_cast<double>(j),
                   y = kTop + kCell * static_cast<double>(i);
      svg.rect(x, y, kCell, kCell, viz::colormap_color("Blues", t));
      svg.open_group(t > 0.5 ? R"(fill="#ffffff")" : R"(fill="#000000")");  // legible on the cell
      svg.text(x + kCell / 2, y + kCell / 2 + 3.5, std::to_string(v),
               {.size = 9, .anchor = "middle"});
      svg.close_group();
    }
    const double y = kTop + kCell * (static_cast<double>(i) + 0.5);
    svg.text(kLeft - 6, y + 3.5, names[static_cast<size_t>(i)], {.size = 10, .anchor = "end"});
    const double x = kLeft + kCell * (static_cast<double>(i) + 0.5);
    svg.text(x, kTop + side + 8, names[static_cast<size_t>(i)],
             {.size = 10, .anchor = "end", .rotate = -60});
  }
  svg.text(kLeft + side / 2, kTop + side + kBottom - 8, "predicted", {11});
  svg.text(14, kTop + side / 2, "true", {.size = 11, .anchor = "middle", .rotate = -90});
  svg.save(path, "fashion_mnist");
}

// A grid of the first 32 test images drawn pixel by pixel (runs of one grey as one rectangle),
// each captioned with its predicted label; a mistake is framed in red and names the true label.
void save_samples(const Tensor& images, const std::vector<int64_t>& predicted,
                  const std::vector<int64_t>& truth, const std::string& path) {
  const std::vector<std::string>& names = data::FashionMNIST::classes();
  constexpr int64_t kCols = 8;
  constexpr double kPixel = 3, kPad = 14, kCaption = 26;
  const int64_t n = std::min<int64_t>(32, images.size(0));
  const int64_t rows = (n + kCols - 1) / kCols;
  const double tile = kPixel * kSide;
  viz::svg::Writer svg(kCols * (tile + kPad) + kPad, rows * (tile + kPad + kCaption) + kPad);
  const Tensor pixels = images.narrow(0, 0, n).contiguous();
  const float* px = pixels.data<float>();
  for (int64_t k = 0; k < n; ++k) {
    const double x0 = kPad + static_cast<double>(k % kCols) * (tile + kPad);
    const double y0 = kPad + static_cast<double>(k / kCols) * (tile + kPad + kCaption);
    const bool right = predicted[static_cast<size_t>(k)] == truth[static_cast<size_t>(k)];
    svg.rect(x0, y0, tile, tile, "#000000");
    svg.open_group(R"(shape-rendering="crispEdges")");  // no seams between the pixels
    for (int64_t r = 0; r < kSide; ++r) {
      const float* row = px + (k * kSide + r) * kSide;
      for (int64_t c = 0; c < kSide;) {
        const int grey = static_cast<int>(std::lround(std::clamp(row[c], 0.0f, 1.0f) * 255));
        int64_t end = c + 1;
        while (end < kSide && std::lround(std::clamp(row[end], 0.0f, 1.0f) * 255) == grey) ++end;
        if (grey > 0)
          svg.rect(x0 + kPixel * static_cast<double>(c), y0 + kPixel * static_cast<double>(r),
                   kPixel * static_cast<double>(end - c), kPixel,
                   fmt::format("#{0:02x}{0:02x}{0:02x}", grey));
        c = end;
      }
    }
    svg.close_group();
    if (!right)
      svg.rect(x0 - 2, y0 - 2, tile + 4, tile + 4, "none",
               R"(stroke="#d62728" stroke-width="2.5")");
    svg.text(x0 + tile / 2, y0 + tile + 11,
             names[static_cast<size_t>(predicted[static_cast<size_t>(k)])],
             {.size = 9, .anchor = "middle"});
    if (!right)
      svg.text(x0 + tile / 2, y0 + tile + 22,
               "true: " + names[static_cast<size_t>(truth[static_cast<size_t>(k)])],
               {.size = 8, .anchor = "middle"});
  }
  svg.save(path, "fashion_mnist");
}

double peak_rss_mb() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_maxrss) / 1024.0;
}

Data read_data(const Config& c) {
  Data d{data::FashionMNIST(c.data, true), data::FashionMNIST(c.data, false), 0, 0};
  const auto take = [](int64_t want, int64_t have, const char* flag) {
    if (want > have)
      throw program::UsageError(
          fmt::format("{} {} is more than the {} images there are", flag, want, have));
    return want == 0 ? have : want;
  };
  d.train_size = take(c.train_size, d.train.size(), "--train-size");
  d.test_size = take(c.test_size, d.test.size(), "--test-size");
  return d;
}

int train(const Config& c, const std::string& out, bool resume) {
  const Data data = read_data(c);
  fmt::print("Fashion-MNIST: {} training and {} test images; model {}, {} threads\n",
             data.train_size, data.test_size, c.model, get_num_threads());
  Trainer trainer(c, data, out);
  if (resume) {
    trainer.resume();
    fmt::print("resumed {} at epoch {}, step {}\n", out, trainer.progress.epoch + 1,
               trainer.progress.step);
  } else {
    program::write_text(out + "/run.json", config_json(c).dump(2) + "\n");
  }
  while (trainer.progress.epoch < c.epochs) {
    if (!trainer.train_epoch()) {
      fmt::print("stopped after --max-steps {} steps; continue with --resume {}\n", c.max_steps,
                 out);
      return 0;
    }
    trainer.end_epoch();
  }
  const Progress& p = trainer.progress;
  nn::write_safetensors(out + "/model.safetensors", trainer.model().module->state_dict(),
                        {{"format", "pt"}, {"model", c.model}});

  const std::pair<double, double> xlim{c.epochs > 1 ? 1 : 0, static_cast<double>(c.epochs)};
  viz::Animator loss_plot("epoch", "train loss", {"train loss"}, xlim);
  viz::Animator accuracy_plot("epoch", "test accuracy", {"test accuracy"}, xlim);
  for (size_t i = 0; i < p.train_loss.size(); ++i) {
    loss_plot.add(static_cast<double>(i + 1), {p.train_loss[i]});
    accuracy_plot.add(static_cast<double>(i + 1), {p.test_accuracy[i]});
  }
  loss_plot.save(out + "/loss.svg");
  accuracy_plot.save(out + "/accuracy.svg");

  const std::vector<int64_t> predicted = trainer.test_predictions();
  const std::vector<int64_t> truth = trainer.test_labels();
  std::vector<std::vector<int64_t>> confusion(kClasses, std::vector<int64_t>(kClasses, 0));
  int64_t right = 0;
  for (size_t i = 0; i < predicted.size(); ++i) {
    ++confusion[static_cast<size_t>(truth[i])][static_cast<size_t>(predicted[i])];
    right += predicted[i] == truth[i];
  }
  const double accuracy = static_cast<double>(right) / static_cast<double>(predicted.size());
  save_confusion(confusion, out + "/confusion.svg");
  save_samples(data.test.data(), predicted, truth, out + "/samples.svg");

  const double images_per_s = static_cast<double>(p.images) / p.train_seconds;
  Json config = config_json(c);
  config["threads"] = get_num_threads();
  config["device"] = c.device;
  config["gpu"] = program::device_model(trainer.device());
  config["bfloat16_products"] = float32_matmul_uses_bfloat16();
  const Json metrics = {
      {"config", config},
      {"test_accuracy", accuracy},
      {"history", {{"train_loss", p.train_loss}, {"test_accuracy", p.test_accuracy}}},
      {"images_per_s", images_per_s},
      {"train_seconds", p.train_seconds},
      {"parameters",
       [&] {
         int64_t n = 0;
         for (const Tensor& t : trainer.model().module->parameters()) n += t.numel();
         return n;
       }()},
      {"confusion", confusion},
      {"peak_rss_mb", peak_rss_mb()}};
  program::write_text(out + "/metrics.json", metrics.dump(2) + "\n");
  fmt::print(
      "test accuracy {:.2f}% after {} epochs, {:.0f} images/s ({:.0f} s training); wrote "
      "{}/{{metrics.json, model.safetensors, loss.svg, accuracy.svg, confusion.svg, samples.svg, "
      "checkpoint.safetensors, run.json}}\n",
      100 * accuracy, p.epoch, images_per_s, p.train_seconds, out);
  return 0;
}

// --load DIR --predict FILE: the saved model's class for every image of an IDX file.
int predict_only(const std::string& dir, const std::string& file, const Config& c) {
  const std::string path = dir + "/model.safetensors";
  const nn::SafetensorsFile saved = nn::read_safetensors(path);
  const auto it = saved.metadata.find("model");
  EMBER_CHECK(it != saved.metadata.end() && (it->second == "cnn" || it->second == "resnet"),
              "--load: {} does not say which model it holds (metadata 'model': cnn or resnet)",
              path);
  Classifier model = make_model(it->second);
  nn::load(*model.module, path);
  const Tensor images = data::read_idx_images(file);
  EMBER_CHECK(images.size(2) == kSide && images.size(3) == kSide,
              "--predict: {} holds {} x {} images; the model takes {} x {}", file, images.size(2),
              images.size(3), kSide, kSide);
  const Device device = program::device_of(c.device);
  model.module->to(device);
  const std::vector<int64_t> predicted = predict(model, images, device);
  for (size_t i = 0; i < predicted.size(); ++i)
    fmt::print("{} {}\n", i, data::FashionMNIST::classes()[static_cast<size_t>(predicted[i])]);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Config c;
  std::string out = "out/fashion_mnist", load, predict_file, resume;
  CLI::App app{"A CNN or a ResNet trained on Fashion-MNIST"};
  const CLI::Validator positive = program::count(1), count = program::count(0);
  const std::vector<CLI::Option*> run_options = {
      app.add_option("--model", c.model, "cnn (default) or resnet")
          ->check(CLI::IsMember({"cnn", "resnet"})),
      app.add_option("--epochs", c.epochs, "training epochs")->check(positive),
      app.add_option("--batch", c.batch, "images per batch")->check(program::finite_in(1, 65536)),
      app.add_option("--lr", c.lr, "peak learning rate (default: adam 1e-3, sgd 0.1)")
          ->check(program::positive()),
      app.add_option("--weight-decay", c.weight_decay,
                     "L2 weight decay (default: adam 0, sgd 5e-4)")
          ->check(program::finite_in(0, 1)),
      app.add_option("--optimizer", c.optimizer, "adam (default) or sgd (Nesterov momentum 0.9)")
          ->check(CLI::IsMember({"adam", "sgd"})),
      app.add_flag("--augment", c.augment, "random crops (padding 2) and horizontal flips"),
      app.add_option("--seed", c.seed, "random seed"),
      app.add_option("--data", c.data, "directory of the Fashion-MNIST IDX files"),
      app.add_option("--train-size", c.train_size, "train on the first N images (0: all)")
          ->check(count),
      app.add_option("--test-size", c.test_size, "test on the first N images (0: all)")
          ->check(count),
      program::add_matmul_precision_option(app, c.matmul_precision)};
  app.add_option("--log-every", c.log_every, "steps between progress lines")->check(positive);
  app.add_option("--max-steps", c.max_steps,
                 "stop after this many steps of this process (0: no limit); --resume continues")
      ->check(count);
  program::add_on_nonfinite_option(app, c.on_nonfinite);
  program::add_threads_option(app, c.threads);
  program::add_device_option(app, c.device);
  CLI::Option* out_option = app.add_option("--out", out, "output directory");
  CLI::Option* resume_option =
      app.add_option("--resume", resume, "continue the run saved in this directory")
          ->check(CLI::ExistingDirectory);
  CLI::Option* load_option =
      app.add_option("--load", load, "classify with the model saved in this directory")
          ->check(CLI::ExistingDirectory)
          ->excludes(out_option)
          ->excludes(resume_option);
  app.add_option("--predict", predict_file, "an IDX file of images (.gz or not) to classify")
      ->needs(load_option);
  return program::run("fashion_mnist", app, argc, argv, [&] {
    if (!load.empty() && predict_file.empty())
      throw program::UsageError("--load needs --predict FILE: the images to classify");
    if (!resume.empty()) {
      program::check_resume_out(out_option, out, resume);
      c = program::resume_config(
          resume, c, [](Config& x, auto f) { config_fields(x, f); }, run_options);
      out = resume;
    }
    if (c.lr == 0) c.lr = c.optimizer == "sgd" ? 0.1 : 1e-3;
    if (c.weight_decay < 0) c.weight_decay = c.optimizer == "sgd" ? 5e-4 : 0.0;
    set_num_threads(c.threads);
    set_float32_matmul_precision(c.matmul_precision);
    manual_seed(c.seed);
    if (!load.empty()) return predict_only(load, predict_file, c);
    // Activations of the CNN's widest layers: about 25 Float32 planes of 32 x 28 x 28 per image
    // are kept for backward (the ResNet keeps fewer), plus the dataset itself.
    program::check_memory(4.0 * static_cast<double>(c.batch) * 25 * 32 * 28 * 28 + 300e6,
                          fmt::format("training with --batch {}", c.batch));
    if (resume.empty())
      program::prepare_out_dir(
          out, {"model.safetensors", "metrics.json", "loss.svg", "accuracy.svg", "confusion.svg",
                "samples.svg", "checkpoint.safetensors", "run.json"});
    return train(c, out, !resume.empty());
  });
}
