// The grapheme-to-phoneme task's pieces (examples/g2p_task.h): FNV-1a and the fixed split, the
// CMUdict reader on the real dictionary (skipped when pocketsphinx-en-us is not installed; make
// deps installs it) and its errors, WER and PER, and a short run of examples/g2p: training on
// a slice (the loss falls), the metrics file, predictions, and the --load --predict mode. The
// Bahdanau model (examples/g2p_bahdanau.h): its decoding against teacher forcing, a word decoded
// alike in any batch, and `g2p --model bahdanau` trained, resumed bit for bit, loaded, and its
// defaults and bad flags.
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "examples/g2p_bahdanau.h"
#include "examples/g2p_task.h"
#include "helpers.h"

using namespace ember;
using namespace ember::testing;

namespace {

// Writes text to a fresh temporary file and returns its path.
std::string temp_file(const std::string& name, const std::string& text) {
  const auto path = std::filesystem::temp_directory_path() / name;
  std::ofstream(path, std::ios::binary) << text;
  return path.string();
}

}  // namespace

BOOST_AUTO_TEST_SUITE(test_g2p)

BOOST_AUTO_TEST_CASE(fnv1a_and_the_split) {
  BOOST_TEST(g2p::fnv1a64("a") == 0xaf63dc4c8601ec8cull);
  BOOST_TEST(g2p::fnv1a64("") == 0xcbf29ce484222325ull);
  // FNV-1a("a") % 20 == 16: train.
  BOOST_TEST((g2p::split_of("a") == g2p::Split::Train));
  BOOST_TEST((g2p::graphemes("d'or") == std::vector<std::string>{"d", "'", "o", "r"}));
  BOOST_TEST(
      (g2p::graphemes("caf\xc3\xa9") == std::vector<std::string>{"c", "a", "f", "\xc3\xa9"}));
}

BOOST_AUTO_TEST_CASE(reads_variants_and_comments) {
  const std::string path = temp_file("ember_test_cmudict.dict",
                                     ";;; a comment\n"
                                     "read R IY D\n"
                                     "a AH\n"
                                     "read(2) R EH D\n"
                                     "a(2) EY # the letter\n"
                                     "abc1 AE1 B K\r\n");
  const g2p::CmuDict dict = g2p::read_cmudict(path);
  BOOST_TEST(dict.lines == 5);
  std::map<std::string, std::vector<std::vector<std::string>>> all;
  for (const auto* split : {&dict.train, &dict.dev, &dict.test})
    for (const g2p::Entry& e : *split) {
      BOOST_TEST(!all.contains(e.word));
      all[e.word] = e.pronunciations;
    }
  BOOST_TEST(all.size() == 3u);
  BOOST_TEST(
      (all["read"] == std::vector<std::vector<std::string>>{{"R", "IY", "D"}, {"R", "EH", "D"}}));
  BOOST_TEST((all["a"] == std::vector<std::vector<std::string>>{{"AH"}, {"EY"}}));
  BOOST_TEST((all["abc1"] == std::vector<std::vector<std::string>>{{"AE1", "B", "K"}}));
  std::filesystem::remove(path);
}

BOOST_AUTO_TEST_CASE(errors_name_the_file_and_line) {
  expect_error([] { g2p::read_cmudict("/nonexistent/cmudict.dict"); },
               {"/nonexistent/cmudict.dict", "pocketsphinx-en-us", "--data"});
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"a AH\nb\n", ":2: expected `word PHONEME ...`"},
      {"a AH\n\nb B IY\n", ":2: expected"},
      {"a AH\nb(x) B\n", ":2: malformed word 'b(x)'"},
      {"a AH\nb B iy\n", ":2: 'iy' is not a phoneme"},
      {"(2) AH\n", ":1: malformed word"},
      {";;; only a comment\n", "holds no entries"}};
  for (const auto& [text, message] : bad) {
    const std::string path = temp_file("ember_test_bad.dict", text);
    expect_error([&] { g2p::read_cmudict(path); }, {"cmudict", path, message});
    std::filesystem::remove(path);
  }
}

BOOST_AUTO_TEST_CASE(the_real_dictionary_splits_as_the_issue_says) {
  if (!std::filesystem::exists(g2p::kDefaultDict)) {
    BOOST_TEST_MESSAGE("skipped: " << g2p::kDefaultDict << " is absent (make deps installs it)");
    return;
  }
  const g2p::CmuDict dict = g2p::read_cmudict(g2p::kDefaultDict);
  BOOST_TEST(dict.lines == 134723);
  BOOST_TEST(dict.train.size() + dict.dev.size() + dict.test.size() == 125945u);
  BOOST_TEST(dict.train.size() == 113281u);
  BOOST_TEST(dict.dev.size() == 6340u);
  BOOST_TEST(dict.test.size() == 6324u);
  for (const g2p::Entry& e : dict.test)
    BOOST_TEST_REQUIRE((g2p::split_of(e.word) == g2p::Split::Test));
}

BOOST_AUTO_TEST_CASE(wer_and_per_against_every_reference) {
  BOOST_TEST(g2p::edit_distance({1, 2, 3}, {1, 3}) == 1);
  BOOST_TEST(g2p::edit_distance({}, {4, 5}) == 2);
  BOOST_TEST(g2p::edit_distance({1, 2}, {2, 1}) == 2);
  g2p::ErrorRates rates;
  rates.add({5, 6, 7}, {{5, 6, 8}, {5, 6, 7}});  // matches the second: right, 0 edits of 3
  rates.add({5, 6}, {{5, 6, 8, 9}, {5, 7}});     // closest is {5, 7}: 1 edit of 2
  BOOST_TEST(rates.wer() == 0.5);
  BOOST_TEST(rates.per() == 1.0 / 5.0);
}

// Greedy decoding (beam 1) picks at every step the most likely phoneme of the teacher-forced
// model fed its own prefix; a word decodes the same alone as in a padded batch (the encoder packs
// the sources); wider beams score at least as high as greedy.
BOOST_AUTO_TEST_CASE(bahdanau_decoding) {
  manual_seed(11);
  g2p::Bahdanau model(9, 7, 16, 2, 0.0);
  model.eval();
  const Tensor src =
      from_vector(std::vector<int64_t>{4, 5, 6, 7, 8, 5, 4, 0, 0, 0, 6, 6, 6, 6, 6}, {3, 5});
  const Tensor lens = from_vector(std::vector<int64_t>{5, 2, 5}, {3});
  const auto greedy = g2p::bahdanau_search(model, src, lens, 8, 1, 2, 1, 0.6);
  BOOST_TEST_REQUIRE(greedy.size() == 3u);
  for (int64_t b = 0; b < 3; ++b) {
    const auto& tokens = greedy[static_cast<size_t>(b)].tokens;
    BOOST_TEST_REQUIRE(!tokens.empty());
    BOOST_TEST(tokens.size() <= 7u);  // max_len - 1
    std::vector<int64_t> in{1};
    in.insert(in.end(), tokens.begin(), tokens.end() - 1);
    const auto T = static_cast<int64_t>(in.size());
    const int64_t S = lens.to_vector<int64_t>()[static_cast<size_t>(b)];
    NoGradGuard no_grad;
    const Tensor logits =
        model.forward(src.narrow(0, b, 1).narrow(1, 0, S),
                      from_vector(std::vector<int64_t>{S}, {1}), from_vector(in, {1, T}));
    BOOST_TEST((logits.argmax(-1).reshape({-1}).to_vector<int64_t>() == tokens), "row " << b);
    BOOST_TEST((model.decoder->attention_weights.shape() == Shape{1, T, S}));
    // alone, unpadded: the same hypothesis and score
    const auto alone =
        g2p::bahdanau_search(model, src.narrow(0, b, 1).narrow(1, 0, S),
                             from_vector(std::vector<int64_t>{S}, {1}), 8, 1, 2, 1, 0.6);
    BOOST_TEST((alone[0].tokens == tokens), "row " << b);
    BOOST_TEST(alone[0].score == greedy[static_cast<size_t>(b)].score,
               boost::test_tools::tolerance(1e-5));
  }
  const auto beam = g2p::bahdanau_search(model, src, lens, 8, 1, 2, 4, 0.6);
  for (size_t b = 0; b < 3; ++b) BOOST_TEST(beam[b].score >= greedy[b].score - 1e-6);
}

// The model against d2l's definitions run by torch (gen_g2p_bahdanau.py; its encoder packs the
// sources as Ember's does): d2l's parameter names in d2l's order, the teacher-forced scores, the
// attention weights over padded sources and every parameter's gradient.
BOOST_AUTO_TEST_CASE(bahdanau_matches_d2l) {
  const Golden g("g2p_bahdanau.json");
  g2p::Bahdanau model(9, 7, 6, 2, 0.0);
  model.to(kFloat64);
  model.eval();
  std::string names;
  for (auto& [name, p] : model.named_parameters()) {
    names += (names.empty() ? "" : " ") + name;
    NoGradGuard no_grad;
    p.copy_(g["param." + name]);
  }
  BOOST_TEST(names == g.text("names"));
  const Tensor scores = model.forward(g["src"], g["lens"], g["dec_X"]);
  expect_close(scores, g["scores"], 1e-9, 1e-11, "scores");
  expect_close(model.decoder->attention_weights, g["attention_weights"], 1e-9, 1e-11,
               "attention weights");
  scores.backward(g["gy"]);
  for (const auto& [name, p] : model.named_parameters())
    expect_close(p.grad(), g["grad." + name], 1e-8, 1e-10, "grad " + name);
}

#ifdef EMBER_G2P
// Runs `g2p args` with stdout and stderr to files in dir; returns the exit status.
int run_g2p(const std::string& args, const std::filesystem::path& dir) {
  const std::string cmd = fmt::format("'{}' {} > '{}' 2> '{}'", EMBER_G2P, args,
                                      (dir / "stdout").string(), (dir / "stderr").string());
  const int status = std::system(cmd.c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// What the short-config runs below share: a check for the dictionary (absent: one line, and the
// test skips), a fresh directory for their files (removed at the end), the configuration, and
// expect_ok.
struct ShortRuns {
  static constexpr const char* kConfig =
      "--limit 1500 --eval-limit 50 --epochs 2 --layers 1 --d-model 32 --d-ff 64 --heads 2 "
      "--batch-tokens 1000 --warmup 50 --beam 2 --threads 1";
  static bool dictionary_absent() {
    if (std::filesystem::exists(g2p::kDefaultDict)) return false;
    BOOST_TEST_MESSAGE("skipped: " << g2p::kDefaultDict << " is absent (make deps installs it)");
    return true;
  }
  explicit ShortRuns(const std::string& name)
      : dir(std::filesystem::temp_directory_path() /
            fmt::format("ember_g2p_{}_{}", name, ::getpid())) {
    std::filesystem::create_directories(dir);
  }
  ~ShortRuns() { std::filesystem::remove_all(dir); }
  std::string path(const std::string& name) const { return (dir / name).string(); }
  // Each run's status is read before its stderr: a message argument is evaluated eagerly.
  void expect_ok(const std::string& args) const {
    const int status = run_g2p(args, dir);
    BOOST_TEST_REQUIRE(status == 0, args << ": " << read_text(dir / "stderr"));
  }
  std::filesystem::path dir;
};

BOOST_AUTO_TEST_CASE(example_trains_on_a_slice_and_predicts) {
  if (!std::filesystem::exists(g2p::kDefaultDict)) {
    BOOST_TEST_MESSAGE("skipped: " << g2p::kDefaultDict << " is absent (make deps installs it)");
    return;
  }
  const auto dir = std::filesystem::temp_directory_path() / fmt::format("ember_g2p_{}", ::getpid());
  std::filesystem::create_directories(dir);
  const std::string out = (dir / "out").string();
  const int trained =
      run_g2p(fmt::format("--limit 3000 --eval-limit 100 --epochs 6 --layers 1 --d-model 64 "
                          "--d-ff 128 --heads 2 --batch-tokens 2000 --warmup 200 --beam 3 "
                          "--threads 2 --out '{}'",
                          out),
              dir);
  BOOST_TEST_REQUIRE(trained == 0, read_text(dir / "stderr"));
  const auto metrics = nlohmann::json::parse(read_text(dir / "out/metrics.json"));
  const auto loss = metrics.at("train_loss").get<std::vector<double>>();
  BOOST_TEST_REQUIRE(loss.size() >= 3u);
  BOOST_TEST(loss.back() < 0.7 * loss.front());
  BOOST_TEST(metrics.at("split_sizes").at("train").get<int64_t>() == 113281);
  BOOST_TEST(metrics.at("dev_wer").size() == loss.size());
  for (const char* key : {"test_wer", "test_per", "test_wer_greedy", "test_wer_beam"}) {
    const double v = metrics.at(key).get<double>();
    BOOST_TEST((v >= 0 && v <= 1.5), key << " = " << v);
  }
  BOOST_TEST(metrics.at("test_per_beam").get<double>() < 0.9);  // it learned something
  const std::string predictions = read_text(dir / "out/predictions.tsv");
  BOOST_TEST(std::count(predictions.begin(), predictions.end(), '\n') == 100);
  for (const char* file :
       {"model.safetensors", "graphemes.txt", "phonemes.txt", "loss.svg", "attn_src_1.svg"})
    BOOST_TEST(std::filesystem::exists(dir / "out" / file), file);

  const int predicted = run_g2p(fmt::format("--load '{}' --predict hello 'wor1d'", out), dir);
  BOOST_TEST_REQUIRE(predicted == 0, read_text(dir / "stderr"));
  const std::string said = read_text(dir / "stdout");
  BOOST_TEST(said.starts_with("hello\t"));
  BOOST_TEST(std::count(said.begin(), said.end(), '\n') == 2);
  BOOST_TEST(read_text(dir / "stderr").find("'1' in 'wor1d'") != std::string::npos);
  BOOST_TEST(run_g2p(fmt::format("--load '{}' --predict ' '", out), dir) == 1);
  BOOST_TEST(read_text(dir / "stderr").find("empty word") != std::string::npos);
  BOOST_TEST(run_g2p("--data /nonexistent.dict", dir) == 1);
  BOOST_TEST(read_text(dir / "stderr").find("pocketsphinx-en-us") != std::string::npos);
  std::filesystem::remove_all(dir);
}

// A run stopped twice (mid-epoch, by --max-steps) and resumed ends with the same losses, WERs,
// model bytes and predictions as the same run never stopped.
BOOST_AUTO_TEST_CASE(a_resumed_run_is_bit_identical) {
  if (ShortRuns::dictionary_absent()) return;
  const ShortRuns runs("resume");
  const std::filesystem::path& dir = runs.dir;
  const std::string config = ShortRuns::kConfig, a = runs.path("a"), b = runs.path("b");
  const auto expect_ok = [&](const std::string& args) { runs.expect_ok(args); };
  expect_ok(fmt::format("{} --out '{}'", config, a));
  expect_ok(fmt::format("{} --out '{}' --max-steps 9 --checkpoint-every 4", config, b));
  BOOST_TEST(read_text(dir / "stdout").find("continue with --resume") != std::string::npos);
  BOOST_TEST(!std::filesystem::exists(dir / "b/metrics.json"));
  // The first command line plus --resume continues it.
  expect_ok(fmt::format("{} --out '{}' --max-steps 12 --resume '{}'", config, b, b));
  BOOST_TEST(read_text(dir / "stdout").find("resumed") != std::string::npos);
  expect_ok(fmt::format("--resume '{}' --threads 1", b));
  const auto ma = nlohmann::json::parse(read_text(dir / "a/metrics.json"));
  const auto mb = nlohmann::json::parse(read_text(dir / "b/metrics.json"));
  BOOST_TEST(ma.at("train_loss").size() == 2u);
  for (const char* key : {"train_loss", "dev_wer", "test_wer", "test_per", "test_wer_beam"})
    BOOST_TEST(ma.at(key) == mb.at(key), key << ": " << ma.at(key) << " vs " << mb.at(key));
  BOOST_TEST(read_text(dir / "a/model.safetensors") == read_text(dir / "b/model.safetensors"));
  BOOST_TEST(read_text(dir / "a/predictions.tsv") == read_text(dir / "b/predictions.tsv"));

  // The configuration comes from the run: a flag that would change it, or another --out, is a
  // usage error.
  BOOST_TEST(run_g2p(fmt::format("--resume '{}' --d-model 64", b), dir) == 2);
  BOOST_TEST(read_text(dir / "stderr").find("--d-model 64 differs from the resumed run's 32") !=
             std::string::npos);
  BOOST_TEST(read_text(dir / "stderr").find("run.json") != std::string::npos);
  BOOST_TEST(run_g2p(fmt::format("--out '{}' --resume '{}'", a, b), dir) == 2);
  BOOST_TEST(read_text(dir / "stderr").find("not the resumed run's directory") !=
             std::string::npos);
}

// --device cuda on the emulated device (Note [Host emulation of a GPU]): the CPU run's losses (to
// 1e-4: its products are the reference loop, the CPU's the vector kernels, and two epochs of
// training carry the difference, 3e-5 in the AVX2 build), and a run stopped on the CPU goes on
// on the device (its checkpoint loads onto the model's device).
BOOST_AUTO_TEST_CASE(trains_and_resumes_on_a_device) {
  if (ShortRuns::dictionary_absent()) return;
  const ShortRuns runs("device");
  const std::filesystem::path& dir = runs.dir;
  const std::string config = ShortRuns::kConfig, cpu = runs.path("cpu"), gpu = runs.path("gpu"),
                    moved = runs.path("moved");
  const auto expect_ok = [&](const std::string& args) { runs.expect_ok(args); };
  expect_ok(fmt::format("{} --out '{}'", config, cpu));
  expect_ok(fmt::format("{} --out '{}' --max-steps 9", config, moved));
  ::setenv("EMBER_CUDA_EMULATE", "1", 1);  // the children's device
  expect_ok(fmt::format("{} --device cuda --out '{}'", config, gpu));
  expect_ok(fmt::format("--resume '{}' --threads 1 --device cuda", moved));
  ::unsetenv("EMBER_CUDA_EMULATE");
  const auto m_cpu = nlohmann::json::parse(read_text(dir / "cpu/metrics.json"));
  for (const std::string run : {"gpu", "moved"}) {
    const auto m = nlohmann::json::parse(read_text(dir / run / "metrics.json"));
    BOOST_TEST(m.at("config").at("device") == "cuda:0", run);
    const auto want = m_cpu.at("train_loss").get<std::vector<double>>();
    const auto got = m.at("train_loss").get<std::vector<double>>();
    BOOST_TEST_REQUIRE(got.size() == want.size(), run);
    for (size_t i = 0; i < got.size(); ++i)
      BOOST_TEST(got[i] == want[i], boost::test_tools::tolerance(1e-4));
    const auto wer = m.at("dev_wer").get<std::vector<double>>();
    const auto cpu_wer = m_cpu.at("dev_wer").get<std::vector<double>>();
    for (size_t i = 0; i < wer.size(); ++i)  // a word or two may decode apart
      BOOST_TEST(std::abs(wer[i] - cpu_wer[i]) <= 0.05, run << " dev WER " << i);
  }
}

// --model bahdanau: a run stopped by --max-steps and resumed ends as the same run never stopped
// (losses, WERs, model bytes, predictions); the emulated device trains it as the CPU; --load reads
// the model kind from the saved run;
// --layers, --d-model and --dropout default to D2L's sizes; the transformer's flags are refused.
BOOST_AUTO_TEST_CASE(bahdanau_trains_resumes_and_predicts) {
  if (ShortRuns::dictionary_absent()) return;
  const ShortRuns runs("bahdanau");
  const std::filesystem::path& dir = runs.dir;
  const std::string config =
      "--model bahdanau --limit 1500 --eval-limit 50 --epochs 2 --layers 1 --d-model 32 "
      "--batch-tokens 1000 --warmup 50 --beam 2 --threads 1";
  const std::string a = runs.path("a"), b = runs.path("b");
  const auto expect_ok = [&](const std::string& args) { runs.expect_ok(args); };
  expect_ok(fmt::format("{} --out '{}'", config, a));
  expect_ok(fmt::format("{} --out '{}' --max-steps 9 --checkpoint-every 4", config, b));
  BOOST_TEST(!std::filesystem::exists(dir / "b/metrics.json"));
  expect_ok(fmt::format("--resume '{}' --threads 1", b));
  const auto ma = nlohmann::json::parse(read_text(dir / "a/metrics.json"));
  const auto mb = nlohmann::json::parse(read_text(dir / "b/metrics.json"));
  BOOST_TEST(ma.at("config").at("model") == "bahdanau");
  const auto loss = ma.at("train_loss").get<std::vector<double>>();
  BOOST_TEST_REQUIRE(loss.size() == 2u);
  BOOST_TEST(loss.back() < loss.front());
  for (const char* key : {"train_loss", "dev_wer", "test_wer", "test_per", "test_wer_beam"})
    BOOST_TEST(ma.at(key) == mb.at(key), key << ": " << ma.at(key) << " vs " << mb.at(key));
  BOOST_TEST(read_text(dir / "a/model.safetensors") == read_text(dir / "b/model.safetensors"));
  BOOST_TEST(read_text(dir / "a/predictions.tsv") == read_text(dir / "b/predictions.tsv"));
  for (const char* file : {"attn_src_1.svg", "loss.svg", "graphemes.txt", "phonemes.txt"})
    BOOST_TEST(std::filesystem::exists(dir / "a" / file), file);
  BOOST_TEST(read_text(dir / "a/attn_src_1.svg").find("<svg") != std::string::npos);
  expect_ok(fmt::format("--load '{}' --predict hello world", a));
  const std::string said = read_text(dir / "stdout");
  BOOST_TEST(said.starts_with("hello\t"));
  BOOST_TEST(std::count(said.begin(), said.end(), '\n') == 2);
  // On the emulated device: the CPU run's losses (to 1e-4, as trains_and_resumes_on_a_device)
  ::setenv("EMBER_CUDA_EMULATE", "1", 1);
  expect_ok(fmt::format("{} --device cuda --out '{}'", config, runs.path("gpu")));
  ::unsetenv("EMBER_CUDA_EMULATE");
  const auto mg = nlohmann::json::parse(read_text(dir / "gpu/metrics.json"));
  BOOST_TEST(mg.at("config").at("device") == "cuda:0");
  const auto gpu_loss = mg.at("train_loss").get<std::vector<double>>();
  BOOST_TEST_REQUIRE(gpu_loss.size() == loss.size());
  for (size_t i = 0; i < loss.size(); ++i)
    BOOST_TEST(gpu_loss[i] == loss[i], boost::test_tools::tolerance(1e-4));
  BOOST_TEST(std::filesystem::exists(dir / "gpu/attn_src_1.svg"));
  // A changed model on --resume is a usage error
  BOOST_TEST(run_g2p(fmt::format("--resume '{}' --model transformer", b), dir) == 2);
  BOOST_TEST(read_text(dir / "stderr").find("--model \"transformer\" differs") !=
             std::string::npos);

  // D2L's sizes where not given (no training: --epochs 0 decodes with the initial model)
  const std::string d = runs.path("defaults");
  expect_ok(
      fmt::format("--model bahdanau --limit 100 --eval-limit 5 --epochs 0 --threads 1 "
                  "--out '{}'",
                  d));
  const auto run = nlohmann::json::parse(read_text(dir / "defaults/run.json"));
  BOOST_TEST(run.at("layers") == 2);
  BOOST_TEST(run.at("d_model") == 256);
  BOOST_TEST(run.at("dropout") == 0.2);
  // bad flags
  BOOST_TEST(run_g2p("--model bahdanau --heads 2", dir) == 2);
  BOOST_TEST(read_text(dir / "stderr").find("--heads") != std::string::npos);
  BOOST_TEST(run_g2p("--model bahdanau --d-ff 64", dir) == 2);
  BOOST_TEST(read_text(dir / "stderr").find("not for --model bahdanau") != std::string::npos);
  BOOST_TEST(run_g2p("--model lstm", dir) == 2);
  BOOST_TEST(read_text(dir / "stderr").find("--model") != std::string::npos);
}
#endif

BOOST_AUTO_TEST_SUITE_END()
