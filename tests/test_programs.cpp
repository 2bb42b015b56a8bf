// The example programs on bad input (issues 19 and 21): each bad flag, output directory or
// checkpoint runs the built program as a child process under `timeout 20`, which must exit with
// status 1 or 2 (not a signal, not an uncaught exception, not 0) and print exactly one line on
// stderr, `<program>: <message>`, naming the problem. Training that diverges stops with an error
// and leaves a good model from an earlier run unchanged.
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <numbers>
#include <random>

#include <nlohmann/json.hpp>

#include "examples/burgers.h"
#include "helpers.h"

using namespace ember;
using ember::testing::read_text;
namespace fs = std::filesystem;

#ifdef EMBER_EXAMPLES_DIR
namespace {

// A transformer_copy config that trains in a fraction of a second.
const std::string kTiny =
    "--layers 1 --d-model 16 --d-ff 32 --heads 2 --batch 8 --batches 2 --eval-batches 1 "
    "--epochs 1 --threads 1";

// A scratch directory for one test case, removed at the end.
struct Scratch {
  Scratch() : dir(fs::temp_directory_path() / fmt::format("ember_test_programs_{}", ::getpid())) {
    fs::remove_all(dir);
    fs::create_directories(dir);
  }
  ~Scratch() {
    std::error_code ec;
    fs::permissions(dir / "readonly", fs::perms::owner_all, ec);
    fs::remove_all(dir, ec);
  }
  std::string operator/(const std::string& name) const { return (dir / name).string(); }
  fs::path dir;
};

struct Run {
  int status;  // the exit status; -1 when the shell itself was killed by a signal
  std::string out, err;
};

// `program args` under `timeout 20` (with the environment assignments `env`, as "NAME=value"),
// stdout and stderr to files in scratch. A program killed by a signal shows as status 128 +
// signal, a timeout as 124.
Run run(const Scratch& scratch, const std::string& program, const std::string& args,
        const std::string& env = "") {
  const std::string out = scratch / "stdout", err = scratch / "stderr";
  const std::string cmd = fmt::format("{} timeout 20 '{}/{}' {} > '{}' 2> '{}'", env,
                                      EMBER_EXAMPLES_DIR, program, args, out, err);
  const int status = std::system(cmd.c_str());
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, read_text(out), read_text(err)};
}

// The run failed as the rule says: status 1 or 2, one line on stderr naming the program and
// containing `needle`.
void expect_one_line_failure(const Run& r, const std::string& program, const std::string& needle) {
  BOOST_TEST((r.status == 1 || r.status == 2), "exit status " << r.status << ", stderr: " << r.err);
  BOOST_TEST(std::count(r.err.begin(), r.err.end(), '\n') == 1, "stderr: " << r.err);
  BOOST_TEST(r.err.starts_with(program + ": "), "stderr: " << r.err);
  BOOST_TEST(r.err.find(needle) != std::string::npos, "stderr lacks '" << needle << "': " << r.err);
}

struct BadRun {
  std::string program, args, needle;
};

void expect_failures(const Scratch& scratch, const std::vector<BadRun>& cases) {
  for (const BadRun& c : cases) {
    BOOST_TEST_CONTEXT(c.program << " " << c.args) {
      expect_one_line_failure(run(scratch, c.program, c.args), c.program, c.needle);
    }
  }
}

// A transformer_copy checkpoint of the tiny model with the given metadata; `wide` adds an empty
// tensor of shape [1000000, 0], whose dim lets the metadata claim widths up to a million.
void write_checkpoint(const std::string& path, const std::map<std::string, std::string>& meta,
                      bool wide = false) {
  auto model = nn::make_model(11, 11, 1, 16, 32, 2);
  nn::NamedTensors tensors = model->state_dict();
  if (wide) tensors.emplace_back("wide", zeros({1000000, 0}));
  nn::write_safetensors(path, tensors, meta);
}

}  // namespace

BOOST_AUTO_TEST_SUITE(test_programs)

BOOST_AUTO_TEST_CASE(bad_output_directories) {
  Scratch s;
  std::ofstream(s / "file") << "not a directory\n";
  fs::create_directories(s / "dir/model.safetensors");
  std::vector<BadRun> cases;
  for (const char* p : {"mlp_regression", "nw_regression", "transformer_copy"}) {
    const std::string program = p;
    const std::string flags = program == "transformer_copy" ? kTiny : "--epochs 1 --threads 1";
    cases.push_back({program, fmt::format("{} --out '{}'", flags, s / "file"), "Not a directory"});
    cases.push_back({program, fmt::format("{} --out '{}'", flags, s / "file/sub"), "--out"});
    cases.push_back({program, flags + " --out ''", "empty path"});
    cases.push_back({program, flags + " --out /proc/ember_no_such_dir/out", "cannot create"});
    if (::geteuid() != 0) {  // root writes into a read-only directory all the same
      fs::create_directories(s / "readonly");
      fs::permissions(s / "readonly", fs::perms::owner_read | fs::perms::owner_exec);
      cases.push_back(
          {program, fmt::format("{} --out '{}'", flags, s / "readonly"), "not writable"});
    }
  }
  for (const char* p : {"mlp_regression", "transformer_copy"}) {
    const std::string program = p;
    const std::string flags = program == "transformer_copy" ? kTiny : "--epochs 1 --threads 1";
    cases.push_back({program, fmt::format("{} --out '{}'", flags, s / "dir"),
                     "model.safetensors' is a directory"});
  }
  expect_failures(s, cases);
}

BOOST_AUTO_TEST_CASE(bad_numbers_and_sizes) {
  Scratch s;
  const std::string out = "--out '" + s / "out" + "'";
  std::vector<BadRun> cases;
  for (const char* p : {"mlp_regression", "nw_regression", "transformer_copy"}) {
    const std::string program = p;
    for (const char* lr : {"inf", "nan", "-1", "0", "abc"})
      cases.push_back({program, fmt::format("--lr {} {}", lr, out), "--lr"});
    cases.push_back({program, "--threads 100000 " + out, "--threads"});
    cases.push_back({program, "--threads -1 " + out, "--threads"});
    cases.push_back({program, "--on-nonfinite maybe " + out, "--on-nonfinite"});
    cases.push_back({program, "--no-such-flag " + out, "no-such-flag"});
  }
  const std::string t = "transformer_copy";
  for (const char* dropout : {"nan", "inf", "1", "-0.1"})
    cases.push_back({t, fmt::format("--dropout {} {}", dropout, out), "--dropout"});
  cases.push_back({t, "--d-model 1000000 " + out, "memory"});
  cases.push_back({t, "--batch 1e11 " + out, "--batch"});
  cases.push_back({t, "--batch 100000000000 " + out, "--batch"});
  cases.push_back({t, "--batch 100000000 " + out, "memory"});
  cases.push_back({t, "--layers 100000000 " + out, "memory"});
  cases.push_back({t, "--d-model 30 --heads 4 " + out, "multiple"});
  cases.push_back({t, "--epochs -1 " + out, "--epochs"});
#ifdef EMBER_G2P
  // g2p --model bahdanau: its flags are refused before the dictionary is read
  const std::string g = "g2p";
  cases.push_back({g, "--model lstm " + out, "--model"});
  cases.push_back({g, "--model bahdanau --heads 2 " + out, "not for --model bahdanau"});
  cases.push_back({g, "--model bahdanau --d-ff 64 " + out, "not for --model bahdanau"});
  cases.push_back({g, "--model bahdanau --dropout 1 " + out, "--dropout"});
  cases.push_back({g, "--model bahdanau --d-model 1000000 " + out, "memory"});
  cases.push_back({g, "--model bahdanau --layers 100000000 " + out, "memory"});
#endif
  cases.push_back({"nw_regression", "--n-train 100000 " + out, "memory"});
  cases.push_back({"nw_regression", "--n-train 1 " + out, "--n-train"});
  expect_failures(s, cases);
  BOOST_TEST(!fs::exists(s / "out"), "a refused run created its output directory");
}

// --device: a bad name and a missing GPU are one line each; on the emulated device (Note [Host
// emulation of a GPU]) transformer_copy, nw_regression, pinn and mlp_regression make the CPU
// run's numbers, their metrics naming the device.
BOOST_AUTO_TEST_CASE(examples_on_a_device) {
  Scratch s;
  const std::string t = "transformer_copy";
  std::vector<BadRun> cases = {{t, "--device gpu --out '" + s / "bad" + "'", "'gpu'"},
                               {t, "--device cuda:x --out '" + s / "bad" + "'", "--device"}};
  if (!cuda::is_available())
    cases.push_back({t, "--device cuda --out '" + s / "bad" + "'", "cuda:0"});
  expect_failures(s, cases);
  const Run cpu = run(s, t, kTiny + " --out '" + s / "cpu" + "'");
  const Run gpu =
      run(s, t, kTiny + " --device cuda --out '" + s / "gpu" + "'", "EMBER_CUDA_EMULATE=1");
  BOOST_TEST_REQUIRE(cpu.status == 0, cpu.err);
  BOOST_TEST_REQUIRE(gpu.status == 0, gpu.err);
  const auto cpu_metrics = nlohmann::json::parse(read_text(s / "cpu" + "/metrics.json"));
  const auto gpu_metrics = nlohmann::json::parse(read_text(s / "gpu" + "/metrics.json"));
  BOOST_TEST(cpu_metrics["config"]["device"] == "cpu");
  BOOST_TEST(gpu_metrics["config"]["device"] == "cuda:0");
  BOOST_TEST(gpu_metrics["config"]["gpu"].get<std::string>().find("emulating") !=
             std::string::npos);
  BOOST_TEST(
      gpu_metrics["train_loss"][0].get<double>() == cpu_metrics["train_loss"][0].get<double>(),
      boost::test_tools::tolerance(1e-4));
  // nw_regression likewise: the same w learned, recorded with its device
  const std::string nw = "nw_regression";
  BOOST_TEST_REQUIRE(run(s, nw, "--threads 1 --out '" + s / "nw_cpu" + "'").status == 0);
  BOOST_TEST_REQUIRE(
      run(s, nw, "--threads 1 --device cuda --out '" + s / "nw_gpu" + "'", "EMBER_CUDA_EMULATE=1")
          .status == 0);
  const auto nw_cpu = nlohmann::json::parse(read_text(s / "nw_cpu" + "/metrics.json"));
  const auto nw_gpu = nlohmann::json::parse(read_text(s / "nw_gpu" + "/metrics.json"));
  BOOST_TEST(nw_gpu["device"] == "cuda:0");
  BOOST_TEST(nw_gpu["w_learned"].get<double>() == nw_cpu["w_learned"].get<double>(),
             boost::test_tools::tolerance(1e-4));
  // pinn in Float64: Adam, then L-BFGS with the line search, through second derivatives on the
  // device; the CPU's losses, evaluation count and error
  const std::string pinn_args =
      "--layers 4 --width 10 --n-f 200 --adam-iters 20 --lbfgs-iters 30 --dtype float64 ";
  BOOST_TEST_REQUIRE(run(s, "pinn", pinn_args + "--out '" + s / "pinn_cpu" + "'").status == 0);
  BOOST_TEST_REQUIRE(run(s, "pinn", pinn_args + "--device cuda --out '" + s / "pinn_gpu" + "'",
                         "EMBER_CUDA_EMULATE=1")
                         .status == 0);
  const auto pinn_cpu = nlohmann::json::parse(read_text(s / "pinn_cpu" + "/metrics.json"));
  const auto pinn_gpu = nlohmann::json::parse(read_text(s / "pinn_gpu" + "/metrics.json"));
  BOOST_TEST(pinn_gpu["config"]["device"] == "cuda:0");
  BOOST_TEST(pinn_gpu["lbfgs_evaluations"] == pinn_cpu["lbfgs_evaluations"]);
  for (const char* key : {"final_loss", "rel_l2_error"})
    BOOST_TEST(pinn_gpu[key].get<double>() == pinn_cpu[key].get<double>(),
               boost::test_tools::tolerance(1e-8));
  // mlp_regression: the same printed losses, the model saved from the device and reloaded
  const Run mlp_cpu = run(s, "mlp_regression", "--out '" + s / "mlp_cpu" + "'");
  const Run mlp_gpu = run(s, "mlp_regression", "--device cuda --out '" + s / "mlp_gpu" + "'",
                          "EMBER_CUDA_EMULATE=1");
  BOOST_TEST_REQUIRE(mlp_gpu.status == 0, mlp_gpu.err);
  const auto losses = [](const std::string& text) {
    std::string out;
    for (size_t at = text.find("loss "); at != std::string::npos; at = text.find("loss ", at + 1))
      out += text.substr(at, text.find('\n', at) - at) + "; ";
    return out;
  };
  BOOST_TEST(!losses(mlp_cpu.out).empty());
  BOOST_TEST(losses(mlp_gpu.out) == losses(mlp_cpu.out));
}

// Each trainer at --lr 1e300, after a good run into the same directory: exit 1 with one line, and
// the good model (nw_regression: its metrics) left as it was.
BOOST_AUTO_TEST_CASE(divergence_stops_and_keeps_the_good_model) {
  Scratch s;
  const std::string out = "--out '" + s / "out" + "'";
  struct Trainer {
    std::string program, flags, file;
  };
  for (const Trainer& t :
       {Trainer{"mlp_regression", "--epochs 5 --threads 1", "model.safetensors"},
        Trainer{"nw_regression", "--n-train 12 --epochs 5 --threads 1", "metrics.json"},
        Trainer{"transformer_copy", kTiny, "model.safetensors"}}) {
    BOOST_TEST_CONTEXT(t.program) {
      const Run good = run(s, t.program, t.flags + " " + out);
      BOOST_TEST_REQUIRE(good.status == 0, good.err);
      BOOST_TEST(good.err.empty(), good.err);
      const std::string saved = read_text(s / "out/" + t.file);
      for (const char* mode : {"stop", "skip"}) {
        const Run bad = run(s, t.program,
                            fmt::format("{} --lr 1e300 --on-nonfinite {} {}", t.flags, mode, out));
        BOOST_TEST(bad.status == 1);
        expect_one_line_failure(bad, t.program, "diverged");
        BOOST_TEST(read_text(s / "out/" + t.file) == saved, mode << ": " << t.file << " changed");
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(bad_checkpoints_and_decodes) {
  Scratch s;
  const std::string t = "transformer_copy";
  const std::map<std::string, std::string> meta = {{"format", "pt"}, {"vocab", "11"},
                                                   {"layers", "1"},  {"d_model", "16"},
                                                   {"d_ff", "32"},   {"heads", "2"}};
  write_checkpoint(s / "good.safetensors", meta);
  BOOST_TEST_REQUIRE(run(s, t, "--load '" + s / "good.safetensors" + "'").status == 0);

  const std::string good = read_text(s / "good.safetensors");
  std::ofstream(s / "truncated.safetensors", std::ios::binary) << good.substr(0, good.size() / 2);
  std::ofstream(s / "garbage.safetensors", std::ios::binary)
      << std::string("\x10\0\0\0\0\0\0\0{not json at all", 24);
  std::ofstream(s / "empty.safetensors", std::ios::binary);
  std::vector<BadRun> cases;
  for (const char* name : {"truncated", "garbage", "empty"})
    cases.push_back({t, fmt::format("--load '{}'", s / (std::string(name) + ".safetensors")),
                     "read_safetensors"});
  cases.push_back({t, "--load '" + s.dir.string() + "'", "--load"});
  cases.push_back({t, "--load '" + s / "missing.safetensors" + "'", "--load"});

  // Metadata values must be whole integers within what the file implies, and the model must fit
  // in memory, before it is built ("layers": "100000000" used to build layers for 20 s and 3 GB).
  int written = 0;
  const auto with = [&](const std::string& key, const std::string& value, bool wide = false) {
    std::map<std::string, std::string> m = meta;
    m[key] = value;
    const std::string path = s / fmt::format("meta_{}.safetensors", ++written);
    write_checkpoint(path, m, wide);
    return "--load '" + path + "'";
  };
  cases.push_back({t, with("layers", "abc"), "layers"});
  cases.push_back({t, with("layers", "2x"), "layers"});
  cases.push_back({t, with("layers", ""), "layers"});
  cases.push_back({t, with("layers", "-1"), "layers"});
  cases.push_back({t, with("layers", "99999999999999999999"), "layers"});
  cases.push_back({t, with("layers", "100000000"), "layers = '100000000' is not an integer"});
  cases.push_back({t, with("d_model", "1000000"), "d_model"});
  cases.push_back({t, with("d_model", "1000000", true), "memory"});
  cases.push_back({t, with("heads", "3"), "multiple"});
  cases.push_back({t, with("vocab", "12"), "vocab"});
  cases.push_back({t, with("layers", "2"), "load"});  // the tensors of layer 2 are missing

  // --decode: tokens in the vocabulary, at most 256 of them (5,000 ran for minutes).
  std::string long_decode;
  for (int i = 0; i < 5000; ++i) long_decode += i == 0 ? "1" : " 1";
  const std::string load = "--load '" + s / "good.safetensors" + "' ";
  cases.push_back({t, load + "--decode \"" + long_decode + "\"", "--decode"});
  cases.push_back({t, load + "--decode \"1 11\"", "outside the vocabulary"});
  cases.push_back({t, load + "--decode \"1 x\"", "not a token"});
  expect_failures(s, cases);
}

// examples/burgers.h: the Gauss–Hermite rule is exact for polynomials, and the exact solution
// meets its initial and boundary values, agrees with a fine trapezoid rule of the Cole–Hopf
// integral (across the shock too) and satisfies the PDE by finite differences.
BOOST_AUTO_TEST_CASE(burgers_exact_solution) {
  const burgers::Quadrature q = burgers::gauss_hermite(200);
  const double pi = std::numbers::pi;
  bool moment_ok = true;
  for (int k = 0; k <= 10; k += 2) {  // ∫ e^{-z²} z^k dz = Γ((k + 1) / 2)
    double sum = 0;
    for (size_t i = 0; i < q.nodes.size(); ++i) sum += q.weights[i] * std::pow(q.nodes[i], k);
    moment_ok &= std::abs(sum - std::tgamma((k + 1) / 2.0)) < 1e-12 * std::tgamma((k + 1) / 2.0);
  }
  BOOST_TEST(moment_ok);
  const auto trapezoid = [&](double t, double x) {
    const double width = std::sqrt(4 * burgers::kNu * t);
    double top = -1e300;
    for (int pass = 0; pass < 2; ++pass) {
      double num = 0, den = 0;
      for (int i = -400000; i <= 400000; ++i) {
        const double z = i * 1e-4, y = x - width * z;
        const double e = -std::cos(pi * y) / (2 * pi * burgers::kNu) - z * z;
        if (pass == 0) top = std::max(top, e);
        const double f = std::exp(e - top);
        num += std::sin(pi * y) * f, den += f;
      }
      if (pass == 1) return -num / den;
    }
    return 0.0;
  };
  for (const auto& [t, x] : std::vector<std::pair<double, double>>{
           {0.99, 0.003}, {0.5, 0.01}, {0.25, -0.3}, {0.99, -0.0157}, {0.05, 0.9}})
    BOOST_TEST(std::abs(burgers::exact(t, x, q) - trapezoid(t, x)) < 1e-12, t << ", " << x);
  BOOST_TEST(burgers::exact(0, 0.3, q) == -std::sin(0.3 * pi));
  BOOST_TEST(std::abs(burgers::exact(0.7, 1.0, q)) < 1e-14);
  BOOST_TEST(std::abs(burgers::exact(0.7, -1.0, q)) < 1e-14);
  BOOST_TEST(std::abs(burgers::exact(1e-9, 0.5, q) + 1.0) < 1e-6);  // continuous at t = 0
  // u_t + u u_x - nu u_xx = 0 at smooth points, by central differences (error ~h²).
  const double h = 1e-4;
  for (const auto& [t, x] : std::vector<std::pair<double, double>>{{0.3, 0.5}, {0.8, -0.6}}) {
    const auto u = [&](double tt, double xx) { return burgers::exact(tt, xx, q); };
    const double u_t = (u(t + h, x) - u(t - h, x)) / (2 * h);
    const double u_x = (u(t, x + h) - u(t, x - h)) / (2 * h);
    const double u_xx = (u(t, x + h) - 2 * u(t, x) + u(t, x - h)) / (h * h);
    BOOST_TEST(std::abs(u_t + u(t, x) * u_x - burgers::kNu * u_xx) < 1e-5, t << ", " << x);
  }
  // A Latin hypercube puts one point in each of the n strata of every dimension.
  std::mt19937_64 gen(7);
  const auto points = burgers::latin_hypercube(50, {{-1.0, 1.0}, {0.0, 1.0}}, gen);
  for (size_t d = 0; d < 2; ++d) {
    std::vector<int> hits(50);
    for (const auto& p : points) {
      const double unit = d == 0 ? (p[0] + 1) / 2 : p[1];
      ++hits[std::min(49, static_cast<int>(unit * 50))];
    }
    BOOST_TEST(std::all_of(hits.begin(), hits.end(), [](int n) { return n == 1; }), "dim " << d);
  }
}

// examples/pinn --derivatives forward: the residual's u_t, u_x, u_xx by nested forward mode give
// reverse mode's losses, step by step, in Float64 (the same sums in another order: to rounding).
BOOST_AUTO_TEST_CASE(pinn_forward_derivatives_equal_reverse) {
  Scratch s;
  const std::string tiny =
      "--layers 3 --width 8 --n-u 40 --n-f 200 --adam-iters 10 "
      "--lbfgs-iters 5 --threads 1 --dtype float64";
  for (const char* mode : {"forward", "reverse"}) {
    const Run r = run(s, "pinn", tiny + " --derivatives " + mode + " --out '" + s / mode + "'");
    BOOST_TEST_REQUIRE(r.status == 0, r.err);
  }
  const auto fwd = nlohmann::json::parse(read_text(s / "forward/metrics.json"));
  const auto rev = nlohmann::json::parse(read_text(s / "reverse/metrics.json"));
  BOOST_TEST(fwd["config"]["derivatives"] == "forward");
  for (const char* phase : {"adam", "lbfgs"}) {
    const std::vector<double> a = fwd["loss_history"][phase], b = rev["loss_history"][phase];
    BOOST_TEST_REQUIRE(a.size() == b.size(), phase);
    for (size_t i = 0; i < a.size(); ++i)
      BOOST_TEST(std::abs(a[i] - b[i]) <= 1e-9 * std::abs(b[i]),
                 phase << " " << i << ": " << a[i] << " vs " << b[i]);
  }
}

// examples/pinn: a short run writes its files with torch's parameter names and lowers the loss;
// bad flags and a diverging run fail with one line.
BOOST_AUTO_TEST_CASE(pinn_trains_and_refuses_bad_input) {
  Scratch s;
  const std::string tiny =
      "--layers 3 --width 8 --n-u 40 --n-f 300 --adam-iters 30 --lbfgs-iters 20 --threads 1";
  const Run r = run(s, "pinn", tiny + " --out '" + s / "out" + "'");
  BOOST_TEST_REQUIRE(r.status == 0, r.err);
  BOOST_TEST(r.err.empty(), r.err);
  const nlohmann::json m = nlohmann::json::parse(read_text(s / "out/metrics.json"));
  const std::vector<double> adam = m["loss_history"]["adam"], lbfgs = m["loss_history"]["lbfgs"];
  BOOST_TEST(adam.size() == 30u);
  BOOST_TEST(m["lbfgs_iters"].get<int>() <= 20);
  BOOST_TEST(m["lbfgs_iters"].get<int>() > 0);
  BOOST_TEST(lbfgs.back() < adam.front());
  BOOST_TEST(std::isfinite(m["rel_l2_error"].get<double>()));
  BOOST_TEST(m["train_seconds"].get<double>() > 0);
  BOOST_TEST(m["config"]["dtype"].get<std::string>() == "float32");
  BOOST_TEST(m["config"]["lbfgs_curvature_eps"].get<double>() == 0.0);
  const nn::SafetensorsFile file = nn::read_safetensors(s / "out/model.safetensors");
  std::vector<std::string> names;
  for (const auto& [name, t] : file.tensors) names.push_back(name);
  std::sort(names.begin(), names.end());
  BOOST_TEST(
      (names == std::vector<std::string>{"layers.0.bias", "layers.0.weight", "layers.1.bias",
                                         "layers.1.weight", "layers.2.bias", "layers.2.weight"}));
  for (const char* svg : {"solution.svg", "loss.svg"})
    BOOST_TEST(read_text(s / "out/" + svg).find("<svg") != std::string::npos, svg);

  const std::string out = " --out '" + s / "bad" + "'";
  expect_failures(s, {{"pinn", "--layers 1" + out, "--layers"},
                      {"pinn", "--width 0" + out, "--width"},
                      {"pinn", "--n-u 457" + out, "--n-u"},
                      {"pinn", "--n-f 0" + out, "--n-f"},
                      {"pinn", "--adam-lr nan" + out, "--adam-lr"},
                      {"pinn", "--lbfgs-iters -1" + out, "--lbfgs-iters"},
                      {"pinn", "--lbfgs-round -1" + out, "--lbfgs-round"},
                      {"pinn", "--lbfgs-curvature-eps -1e-3" + out, "--lbfgs-curvature-eps"},
                      {"pinn", "--dtype float16" + out, "--dtype"},
                      {"pinn", "--derivatives sideways" + out, "--derivatives"},
                      {"pinn", "--threads 100000" + out, "--threads"}});
  BOOST_TEST(!fs::exists(s / "bad"), "a refused run created its output directory");
  const std::string saved = read_text(s / "out/model.safetensors");
  expect_one_line_failure(run(s, "pinn", tiny + " --adam-lr 1e300 --out '" + s / "out" + "'"),
                          "pinn", "diverged");
  BOOST_TEST(read_text(s / "out/model.safetensors") == saved, "the good model changed");
}

BOOST_AUTO_TEST_SUITE_END()
#endif
