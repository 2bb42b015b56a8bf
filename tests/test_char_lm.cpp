// examples/char_lm, the character-level GPT, on a tiny config (skipped when Debian's fortunes
// package is not installed; make deps installs it): the loss falls, a run ended early (--iters)
// or stopped (--max-steps) off an evaluation and resumed matches one never stopped bit for bit,
// sampling is seeded, and bad flags fail with one line.
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>

#include <nlohmann/json.hpp>

#include "helpers.h"

using namespace ember;
using namespace ember::testing;

BOOST_AUTO_TEST_SUITE(test_char_lm)

#ifdef EMBER_CHAR_LM
namespace {

constexpr const char* kFortunes = "/usr/share/games/fortunes";

// Runs `char_lm args` with stdout and stderr to files in dir; returns the exit status.
// `env` holds environment assignments ("NAME=value") for the run.
int run_char_lm(const std::string& args, const std::filesystem::path& dir,
                const std::string& env = "") {
  const std::string cmd = fmt::format("{} '{}' {} > '{}' 2> '{}'", env, EMBER_CHAR_LM, args,
                                      (dir / "stdout").string(), (dir / "stderr").string());
  const int status = std::system(cmd.c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

}  // namespace

BOOST_AUTO_TEST_CASE(trains_resumes_and_samples) {
  if (!std::filesystem::exists(kFortunes)) {
    BOOST_TEST_MESSAGE("skipped: " << kFortunes << " is absent (make deps installs fortunes)");
    return;
  }
  const auto dir =
      std::filesystem::temp_directory_path() / fmt::format("ember_char_lm_{}", ::getpid());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::string model =
      "--layers 1 --heads 2 --d-model 32 --block 16 --batch 8 --warmup 5 --lr 3e-3 "
      "--lr-decay-iters 40 --eval-interval 10 --eval-iters 4 --sample 30 --threads 1";
  const std::string config = model + " --iters 40";
  const std::string a = (dir / "a").string(), b = (dir / "b").string();
  // Each status is read before the stderr it may print: a message argument is evaluated eagerly.
  const auto expect_ok = [&](const std::string& args, const std::string& env = "") {
    const int status = run_char_lm(args, dir, env);
    BOOST_TEST_REQUIRE(status == 0, args << ": " << read_text(dir / "stderr"));
  };
  expect_ok(fmt::format("{} --out '{}'", config, a));
  const auto ma = nlohmann::json::parse(read_text(dir / "a/metrics.json"));
  const auto val = ma.at("val_loss").get<std::vector<double>>();
  BOOST_TEST_REQUIRE(val.size() == 5u);  // iterations 0, 10, 20, 30, 40
  BOOST_TEST(val.back() < val.front() - 0.5, "val loss " << val.front() << " -> " << val.back());
  BOOST_TEST(ma.at("sample").get<std::string>().size() >= 30u);
  for (const char* file : {"model.safetensors", "loss.svg", "checkpoint.safetensors"})
    BOOST_TEST(std::filesystem::exists(dir / "a" / file), file);

  // Ended at iteration 15 (which evaluates, off the --eval-interval; the learning rate's schedule
  // is --lr-decay-iters long, so --iters changes no step), extended and stopped by
  // --max-steps at 28, resumed to the end, each time by the first command line plus --resume: the
  // same evaluations, losses, model and sample as the run never stopped.
  expect_ok(fmt::format("{} --iters 15 --out '{}'", model, b));
  BOOST_TEST(nlohmann::json::parse(read_text(dir / "b/metrics.json")).at("eval_iter") ==
             nlohmann::json::parse("[0, 10, 15]"));
  expect_ok(fmt::format("{} --out '{}' --max-steps 13 --resume '{}'", config, b, b));
  BOOST_TEST(read_text(dir / "stdout").find("continue with --resume") != std::string::npos);
  expect_ok(fmt::format("{} --out '{}' --resume '{}'", config, b, b));
  const auto mb = nlohmann::json::parse(read_text(dir / "b/metrics.json"));
  for (const char* key : {"eval_iter", "train_loss", "val_loss", "sample"})
    BOOST_TEST(ma.at(key) == mb.at(key), key << ": " << ma.at(key) << " vs " << mb.at(key));
  BOOST_TEST(read_text(dir / "a/model.safetensors") == read_text(dir / "b/model.safetensors"));

  // --matmul-precision medium (bfloat16 products where the CPU has them): trains, is recorded in
  // run.json, and a resumed run keeps it (the same losses as one never stopped).
  const std::string c = (dir / "c").string(), d = (dir / "d").string();
  expect_ok(fmt::format("{} --matmul-precision medium --out '{}'", config, c));
  expect_ok(fmt::format("{} --matmul-precision medium --out '{}' --max-steps 13", config, d));
  expect_ok(fmt::format("--resume '{}' --threads 1 --sample 30", d));
  const auto mc = nlohmann::json::parse(read_text(dir / "c/metrics.json"));
  const auto md = nlohmann::json::parse(read_text(dir / "d/metrics.json"));
  BOOST_TEST(mc.at("config").at("matmul_precision") == "medium");
  const auto val_c = mc.at("val_loss").get<std::vector<double>>();
  BOOST_TEST(val_c.back() < val_c.front() - 0.5,
             "val loss " << val_c.front() << " -> " << val_c.back());
  BOOST_TEST(mc.at("val_loss") == md.at("val_loss"));
  BOOST_TEST(mc.at("sample") == md.at("sample"));
  if (mc.at("config").at("bfloat16_products").get<bool>())  // else computed as Float32
    BOOST_TEST(mc.at("val_loss") != ma.at("val_loss"));
  BOOST_TEST(run_char_lm("--matmul-precision low --threads 1", dir) == 2);
  BOOST_TEST(read_text(dir / "stderr").find("--matmul-precision") != std::string::npos);

  // --device cuda on the emulated device (Note [Host emulation of a GPU]): the CPU run's losses
  // and sample; stopped and resumed there, the same again.
  const std::string e = (dir / "e").string();
  expect_ok(fmt::format("{} --device cuda --out '{}' --max-steps 25", config, e),
            "EMBER_CUDA_EMULATE=1");
  expect_ok(fmt::format("{} --device cuda --out '{}' --resume '{}'", config, e, e),
            "EMBER_CUDA_EMULATE=1");
  const auto me = nlohmann::json::parse(read_text(dir / "e/metrics.json"));
  BOOST_TEST(me.at("config").at("device") == "cuda");
  const auto val_e = me.at("val_loss").get<std::vector<double>>();
  BOOST_TEST_REQUIRE(val_e.size() == val.size());
  for (size_t i = 0; i < val.size(); ++i)
    BOOST_TEST(val_e[i] == val[i], boost::test_tools::tolerance(1e-4));

  // Sampling from a saved model: the same seed gives the same text, another seed other text.
  const auto sample = [&](int seed) {
    expect_ok(fmt::format("--load '{}' --sample 40 --prompt 'The ' --seed {}", a, seed));
    return read_text(dir / "stdout");
  };
  const std::string s1 = sample(1);
  BOOST_TEST(s1.starts_with("The "));
  BOOST_TEST(sample(1) == s1);
  BOOST_TEST(sample(2) != s1);

  // Bad input: one line on stderr, a non-zero status.
  BOOST_TEST(run_char_lm(fmt::format("--load '{}' --prompt 'caf\xe2\x9c\x93'", a), dir) == 1);
  BOOST_TEST(read_text(dir / "stderr").find("not in the vocabulary") != std::string::npos);
  // --resume with a flag whose value differs from the run's, or another --out: a usage error
  // naming the flag, both values and run.json.
  BOOST_TEST(run_char_lm(fmt::format("--resume '{}' --layers 2", b), dir) == 2);
  BOOST_TEST(read_text(dir / "stderr").find("--layers 2 differs from the resumed run's 1 in") !=
             std::string::npos);
  BOOST_TEST(read_text(dir / "stderr").find("run.json") != std::string::npos);
  BOOST_TEST(run_char_lm(fmt::format("{} --seed 7 --resume '{}'", config, b), dir) == 2);
  BOOST_TEST(read_text(dir / "stderr").find("--seed 7 differs from the resumed run's 1337") !=
             std::string::npos);
  BOOST_TEST(run_char_lm(fmt::format("--out '{}' --resume '{}'", a, b), dir) == 2);
  BOOST_TEST(read_text(dir / "stderr").find("not the resumed run's directory") !=
             std::string::npos);
  BOOST_TEST(run_char_lm("--data /nonexistent --threads 1", dir) == 1);
  BOOST_TEST(read_text(dir / "stderr").find("fortunes") != std::string::npos);
  std::filesystem::remove_all(dir);
}
#endif

BOOST_AUTO_TEST_SUITE_END()
