// examples/fashion_mnist on a slice of the data (skipped when Debian's dataset-fashion-mnist is
// absent; make deps installs it): both models train and write every output, a run stopped by
// --max-steps mid-epoch and resumed by the first command line plus --resume ends with the same
// model, bit for bit, as one never stopped (augmentation, dropout and BatchNorm's statistics
// included), --load --predict classifies an IDX file, and bad flags fail with one line naming
// the flag.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "helpers.h"

using namespace ember;
using namespace ember::testing;
namespace fs = std::filesystem;

BOOST_AUTO_TEST_SUITE(test_fashion_mnist_example)

#ifdef EMBER_FASHION_MNIST
namespace {

// Runs `fashion_mnist args` with stdout and stderr to files in dir; returns the exit status.
int run_example(const std::string& args, const fs::path& dir) {
  const std::string cmd = fmt::format("'{}' {} > '{}' 2> '{}'", EMBER_FASHION_MNIST, args,
                                      (dir / "stdout").string(), (dir / "stderr").string());
  const int status = std::system(cmd.c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

bool have_data() {
  if (fs::exists(data::kFashionMNISTRoot)) return true;
  BOOST_TEST_MESSAGE("skipped: " << data::kFashionMNISTRoot
                                 << " is absent (make deps installs dataset-fashion-mnist)");
  return false;
}

struct TempDir {
  fs::path path;
  explicit TempDir(const char* name)
      : path(fs::temp_directory_path() / fmt::format("ember_{}_{}", name, ::getpid())) {
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
};

}  // namespace

BOOST_AUTO_TEST_CASE(trains_both_models_and_writes_its_outputs) {
  if (!have_data()) return;
  const TempDir tmp("fashion_mnist_train");
  const fs::path& dir = tmp.path;
  for (const std::string model : {"cnn", "resnet"}) {
    const fs::path out = dir / model;
    const std::string args = fmt::format(
        "--model {} --train-size 512 --test-size 200 --epochs 2 --batch 64 "
        "--threads 1 --log-every 4 --out '{}'",
        model, out.string());
    const int status = run_example(args, dir);
    BOOST_TEST_REQUIRE(status == 0, args << ": " << read_text(dir / "stderr"));
    const std::string stdout_text = read_text(dir / "stdout");
    BOOST_TEST(stdout_text.find("images/s | ETA") != std::string::npos, stdout_text);
    const auto m = nlohmann::json::parse(read_text(out / "metrics.json"));
    const double accuracy = m.at("test_accuracy").get<double>();
    // Two epochs of 512 images take the CNN well above chance (10%). The ResNet's 16 steps leave
    // its BatchNorm running statistics (momentum 0.1) far from the batches', so in eval mode it
    // may still be near chance: its training loss is what must fall.
    if (model == "cnn") BOOST_TEST(accuracy > 0.4, model << " test accuracy " << accuracy);
    BOOST_TEST((accuracy >= 0 && accuracy <= 1));
    const auto history = m.at("history");
    BOOST_TEST(history.at("train_loss").size() == 2u);
    BOOST_TEST(history.at("test_accuracy").size() == 2u);
    BOOST_TEST(history.at("test_accuracy").back().get<double>() == accuracy);
    BOOST_TEST(history.at("train_loss")[1].get<double>() <
               history.at("train_loss")[0].get<double>());
    BOOST_TEST(m.at("images_per_s").get<double>() > 0);
    BOOST_TEST(m.at("config").at("model").get<std::string>() == model);
    int64_t counted = 0;
    for (const auto& row : m.at("confusion"))
      for (const auto& v : row) counted += v.get<int64_t>();
    BOOST_TEST(counted == 200);
    for (const char* file : {"model.safetensors", "checkpoint.safetensors", "run.json", "loss.svg",
                             "accuracy.svg", "confusion.svg", "samples.svg"})
      BOOST_TEST(fs::exists(out / file), model << ": " << file);
    const std::string confusion = read_text(out / "confusion.svg");
    BOOST_TEST(confusion.find("Ankle boot") != std::string::npos);
    BOOST_TEST(read_text(out / "samples.svg").find("<rect") != std::string::npos);
  }
}

BOOST_AUTO_TEST_CASE(resumes_bit_for_bit) {
  if (!have_data()) return;
  const TempDir tmp("fashion_mnist_resume");
  const fs::path& dir = tmp.path;
  // The CNN with augmentation: dropout, random crops and flips, and BatchNorm's running
  // statistics all have to come back from the checkpoint. 4 steps per epoch.
  const std::string config =
      "--augment --train-size 256 --test-size 100 --epochs 2 --batch 64 --threads 1";
  const std::string a = (dir / "a").string(), b = (dir / "b").string();
  const auto expect_ok = [&](const std::string& args) {
    const int status = run_example(args, dir);
    BOOST_TEST_REQUIRE(status == 0, args << ": " << read_text(dir / "stderr"));
  };
  expect_ok(fmt::format("{} --out '{}'", config, a));
  // Stopped mid-epoch (after 3 of epoch 1's 4 steps), then again in epoch 2, each time resumed by
  // the first command line plus --resume; a different thread count changes nothing.
  expect_ok(fmt::format("{} --out '{}' --max-steps 3", config, b));
  BOOST_TEST(read_text(dir / "stdout").find("continue with --resume") != std::string::npos);
  expect_ok(fmt::format("{} --out '{}' --max-steps 3 --resume '{}'", config, b, b));
  expect_ok(fmt::format("--resume '{}' --threads 2", b));
  BOOST_TEST(read_text(dir / "a/model.safetensors") == read_text(dir / "b/model.safetensors"));
  const auto ma = nlohmann::json::parse(read_text(dir / "a/metrics.json"));
  const auto mb = nlohmann::json::parse(read_text(dir / "b/metrics.json"));
  BOOST_TEST(ma.at("history") == mb.at("history"));
  BOOST_TEST(ma.at("test_accuracy") == mb.at("test_accuracy"));

  // Another seed trains another model.
  expect_ok(fmt::format("{} --seed 5 --out '{}'", config, (dir / "c").string()));
  BOOST_TEST(read_text(dir / "a/model.safetensors") != read_text(dir / "c/model.safetensors"));

  // A resumed run keeps its configuration and its directory.
  BOOST_TEST(run_example(fmt::format("--resume '{}' --epochs 3", b), dir) == 2);
  BOOST_TEST(read_text(dir / "stderr").find("--epochs 3 differs from the resumed run's 2") !=
             std::string::npos);
  BOOST_TEST(run_example(fmt::format("--resume '{}' --out '{}'", b, a), dir) == 2);
  BOOST_TEST(read_text(dir / "stderr").find("not the resumed run's directory") !=
             std::string::npos);

  // --load --predict: the saved model classifies an IDX file (here two written images).
  std::string idx = {0, 0, 8, 3, 0, 0, 0, 2, 0, 0, 0, 28, 0, 0, 0, 28};
  idx += std::string(28 * 28, '\0') + std::string(28 * 28, '\x80');
  const fs::path images = dir / "two-images-idx3-ubyte";
  std::ofstream(images, std::ios::binary) << idx;
  expect_ok(fmt::format("--load '{}' --predict '{}'", a, images.string()));
  const std::string predicted = read_text(dir / "stdout");
  BOOST_TEST(std::count(predicted.begin(), predicted.end(), '\n') == 2, predicted);
  BOOST_TEST(predicted.starts_with("0 "), predicted);
  // The test set itself, gzipped, as Debian installs it.
  expect_ok(fmt::format("--load '{}' --predict '{}/t10k-images-idx3-ubyte.gz'", a,
                        data::kFashionMNISTRoot));
  const std::string all = read_text(dir / "stdout");
  BOOST_TEST(std::count(all.begin(), all.end(), '\n') == 10000);
}

BOOST_AUTO_TEST_CASE(bad_flags_fail_with_one_line) {
  const TempDir tmp("fashion_mnist_flags");
  const fs::path& dir = tmp.path;
  const auto expect_usage = [&](const std::string& args, int status, const std::string& names) {
    BOOST_TEST(
        run_example(args + fmt::format(" --out '{}'", (dir / "out").string()), dir) == status,
        args);
    const std::string err = read_text(dir / "stderr");
    BOOST_TEST(err.starts_with("fashion_mnist: "), args << ": " << err);
    BOOST_TEST(std::count(err.begin(), err.end(), '\n') == 1, args << ": " << err);
    BOOST_TEST(err.find(names) != std::string::npos, args << ": " << err);
  };
  expect_usage("--model vgg", 2, "--model");
  expect_usage("--optimizer rmsprop", 2, "--optimizer");
  expect_usage("--batch 0", 2, "--batch");
  expect_usage("--epochs -1", 2, "--epochs");
  expect_usage("--lr nan", 2, "--lr");
  expect_usage("--lr 0", 2, "--lr");
  expect_usage("--threads 100000", 2, "--threads");
  expect_usage("--device tpu", 2, "--device");
  expect_usage("--predict x.idx", 2, "--predict");
  expect_usage("--data /nonexistent/fashion-mnist", 1, "/nonexistent/fashion-mnist");
  if (have_data()) expect_usage("--train-size 70000", 2, "--train-size 70000");
  // --load without --predict has nothing to classify; --load excludes --out.
  BOOST_TEST(run_example(fmt::format("--load '{}'", dir.string()), dir) == 2);
  BOOST_TEST(read_text(dir / "stderr").find("--predict") != std::string::npos);
}
#else
BOOST_AUTO_TEST_CASE(example_not_built) { BOOST_TEST_MESSAGE("fashion_mnist is not built"); }
#endif

BOOST_AUTO_TEST_SUITE_END()
