// What the example programs share to fail cleanly (issues 19 and 21): every failure ends as one
// line `<program>: <message>` on stderr and a non-zero exit status, never a signal or an uncaught
// exception. Flags are checked as finite numbers within bounds, --threads against the cores, the
// output directory before any work, the memory a run needs against the machine's before anything
// is allocated, and a trainer stops on a non-finite loss (or skips the step, --on-nonfinite skip)
// instead of going on and saving NaNs.
//
// Exit status: 0 done; 2 a usage error (a flag that cannot work, refused before any work); 1 any
// other failure (a bad checkpoint, a write that failed, training that diverged).
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <map>
#include <new>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "ember.h"

namespace program {

// A flag or input that cannot work, found after parsing: exit status 2, as CLI11's own errors.
class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Training produced a non-finite loss or parameters: exit status 1, nothing more is written.
class Diverged : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// `name: message` on stderr as one line: newlines become spaces, and a huge message (a dumped
// header, say) is cut short.
inline void print_error(const char* name, std::string message) {
  for (char& ch : message)
    if (ch == '\n' || ch == '\r') ch = ' ';
  while (!message.empty() && message.back() == ' ') message.pop_back();
  constexpr size_t kMaxChars = 1000;
  if (message.size() > kMaxChars) message = message.substr(0, kMaxChars) + " ...";
  std::fflush(stdout);
  fmt::print(stderr, "{}: {}\n", name, message);
}

// Parses the command line into `app`'s options and runs body() -> exit status. --help prints the
// help and returns 0; any exception becomes print_error's one line and status 2 (CLI11's parse
// errors, UsageError) or 1 (anything else). Output that could not reach stdout is a failure too.
template <class Body>
int run(const char* name, CLI::App& app, int argc, char** argv, Body&& body) {
  int status = 1;
  try {
    try {
      app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
      if (e.get_exit_code() == 0) return app.exit(e);  // --help
      throw;
    }
    status = body();
  } catch (const CLI::ParseError& e) {
    print_error(name, e.what());
    return 2;
  } catch (const UsageError& e) {
    print_error(name, e.what());
    return 2;
  } catch (const std::bad_alloc&) {
    print_error(name, "out of memory (std::bad_alloc)");
    return 1;
  } catch (const std::exception& e) {
    print_error(name, e.what());
    return 1;
  } catch (...) {
    print_error(name, "unknown error");
    return 1;
  }
  if (std::fflush(stdout) != 0 || std::ferror(stdout)) {
    print_error(name, "cannot write to standard output");
    return 1;
  }
  return status;
}

// --- flag checks: the text must be a finite number in the range (CLI11's Range lets NaN through
// and prints the type's whole range; its PositiveNumber accepts inf).

// A finite number with lo <= v <= hi (lo < v when open_low), e.g. "must be in (0, 1]", or "must
// be > 0" when hi is infinite.
inline CLI::Validator finite_in(double lo, double hi, bool open_low = false) {
  const std::string range = std::isinf(hi)
                                ? fmt::format("{} {}", open_low ? ">" : ">=", lo)
                                : fmt::format("in {}{}, {}]", open_low ? "(" : "[", lo, hi);
  return CLI::Validator(
      [=](std::string& text) -> std::string {
        char* end = nullptr;
        const double v = std::strtod(text.c_str(), &end);
        if (text.empty() || end == text.c_str() || *end != '\0')
          return fmt::format("'{}' is not a number", text);
        if (!std::isfinite(v)) return fmt::format("must be a finite number, got {}", text);
        if (v < lo || v > hi || (open_low && v == lo))
          return fmt::format("must be {}, got {}", range, text);
        return {};
      },
      "NUMBER " + range);
}
// A finite number > 0.
inline CLI::Validator positive() { return finite_in(0, HUGE_VAL, true); }

// Counts (layers, batch, epochs, ...) stay below this, whatever memory allows: products of two
// counts still fit in int64.
constexpr double kMaxCount = 1e9;
inline CLI::Validator count(double lo) { return finite_in(lo, kMaxCount); }

// --threads: 0 (all cores) up to 4 threads per core; more only slows a run down, and 100000
// OpenMP threads would exhaust the machine.
inline int max_threads() {
  return 4 * static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}
inline void add_threads_option(CLI::App& app, int& threads) {
  app.add_option(
         "--threads", threads,
         fmt::format("threads for OpenMP and OpenBLAS (0: all cores; at most {})", max_threads()))
      ->check(finite_in(0, max_threads()));
}

// --matmul-precision: set_float32_matmul_precision's setting for every Float32 product of the run.
// --device cpu|cuda|cuda:N: where a trainer's model and batches live (default cpu). The name is
// checked here; whether the device is there, by device_of when the run starts.
inline CLI::Option* add_device_option(CLI::App& app, std::string& device) {
  return app.add_option("--device", device, "where to train: cpu, cuda or cuda:N (default cpu)")
      ->check(CLI::Validator(
          [](std::string& name) {
            try {
              (void)ember::Device(name);
              return std::string();
            } catch (const ember::Error& e) {
              return std::string(e.what());
            }
          },
          "DEVICE"));
}

// The --device a run uses, an Error (one line) when no such device is usable here.
inline ember::Device device_of(const std::string& name) {
  const ember::Device device(name);
  ember::check_device(device, "--device");
  return device;
}

// What metrics.json records of a device: its name, and the GPU's ("" on the CPU).
inline std::string device_model(const ember::Device& device) {
  return device.is_cuda() ? ember::cuda::get_device_name(device.index()) : std::string();
}

inline CLI::Option* add_matmul_precision_option(CLI::App& app, std::string& precision) {
  return app
      .add_option("--matmul-precision", precision,
                  "Float32 products: highest (Float32) or medium (operands rounded to bfloat16, "
                  "Float32 sums; where the CPU has AVX512-BF16, else as highest)")
      ->check(CLI::IsMember({"highest", "high", "medium"}));
}

// --- resuming a run

// A run's configuration is one list of fields, `fields(config, f)` calling f(name, member) for
// each (metrics.json's "config" and DIR/run.json): written and read through it, a field is named
// once.
template <class Config, class Fields>
nlohmann::ordered_json config_to_json(Config c, Fields fields) {
  nlohmann::ordered_json j;
  fields(c, [&](const char* name, const auto& value) { j[name] = value; });
  return j;
}

// The flag that sets field `name`: "--d-model" for "d_model".
inline std::string flag_of(std::string_view name) {
  std::string flag = "--" + std::string(name);
  std::replace(flag.begin(), flag.end(), '_', '-');
  return flag;
}

// --resume DIR: `flags` with every field but `keep` (the one the command line may change on
// --resume, such as --iters, or none) taken from DIR/run.json; a field that run.json lacks (it was
// written before the field existed) was the default. The first command line may be given again
// with --resume added: a run option (`run_options`, the flags that set what a run computes) whose
// value equals the run's is accepted, one that differs is a usage error naming the flag, both
// values and run.json.
template <class Config, class Fields>
Config resume_config(const std::string& dir, Config flags, Fields fields,
                     const std::vector<CLI::Option*>& run_options, std::string_view keep = {}) {
  const std::string path = dir + "/run.json";
  std::ifstream in(path);
  EMBER_CHECK(in.good(), "--resume: cannot read {}", path);
  nlohmann::ordered_json run;
  try {
    run = nlohmann::ordered_json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw std::runtime_error(fmt::format("--resume: {} is not valid JSON: {}", path, e.what()));
  }
  EMBER_CHECK(run.is_object(), "--resume: {} is not a JSON object", path);
  const nlohmann::ordered_json defaults = config_to_json(Config{}, fields);
  std::map<std::string, const CLI::Option*> given;
  for (const CLI::Option* o : run_options)
    if (o->count() > 0) given[o->get_name()] = o;
  fields(flags, [&](const char* name, auto& value) {
    if (name == keep) return;
    const nlohmann::ordered_json& was = run.contains(name) ? run.at(name) : defaults.at(name);
    if (const auto it = given.find(flag_of(name)); it != given.end()) {
      if (nlohmann::ordered_json(value) != was)
        throw UsageError(fmt::format(
            "{} {} differs from the resumed run's {} in {}: a resumed run keeps its configuration",
            it->first, nlohmann::ordered_json(value).dump(), was.dump(), path));
      given.erase(it);
    }
    try {
      was.get_to(value);
    } catch (const nlohmann::json::exception& e) {
      throw std::runtime_error(
          fmt::format("--resume: {} has '{}' = {}: {}", path, name, was.dump(), e.what()));
    }
  });
  if (!given.empty())
    throw UsageError(
        fmt::format("{} cannot be given with --resume: the run's configuration is in {}",
                    given.begin()->first, path));
  return flags;
}

// --out given with --resume DIR names DIR (the first command line's --out), or is a usage error.
inline void check_resume_out(const CLI::Option* out_option, const std::string& out,
                             const std::string& resume) {
  namespace fs = std::filesystem;
  if (out_option->count() == 0) return;
  std::error_code ec1, ec2;
  const fs::path a = fs::weakly_canonical(out, ec1), b = fs::weakly_canonical(resume, ec2);
  if (ec1 || ec2 || a != b)
    throw UsageError(fmt::format(
        "--out '{}' is not the resumed run's directory '{}': a resumed run writes where it ran",
        out, resume));
}

// A run's progress as its training checkpoint's counters (train/checkpoint.h), which are
// integers: an int64 is stored as it is, a double as its bit pattern under "<key>.bits" (a resumed
// run must sum the same losses bit for bit). Reading a counter the file lacks names both.
class Counters {
 public:
  Counters() = default;
  Counters(std::map<std::string, int64_t> values, std::string path)
      : values_(std::move(values)), path_(std::move(path)) {}

  void put(const std::string& key, int64_t v) { values_[key] = v; }
  void put_real(const std::string& key, double v) {
    values_[key + ".bits"] = std::bit_cast<int64_t>(v);
  }
  int64_t get(const std::string& key) const {
    const auto it = values_.find(key);
    EMBER_CHECK(it != values_.end(), "--resume: '{}' has no counter '{}'", path_, key);
    return it->second;
  }
  double get_real(const std::string& key) const {
    return std::bit_cast<double>(get(key + ".bits"));
  }
  const std::map<std::string, int64_t>& values() const { return values_; }

 private:
  std::map<std::string, int64_t> values_;
  std::string path_;
};

// --- output

// Creates the output directory `dir` and checks, before any work, that `files` can be written
// into it: the directory is writable and none of them is a directory or a read-only file.
inline void prepare_out_dir(const std::string& dir, std::initializer_list<const char*> files) {
  namespace fs = std::filesystem;
  if (dir.empty()) throw UsageError("--out: the output directory is an empty path");
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (!fs::is_directory(dir))
    throw UsageError(
        ec ? fmt::format("--out '{}': cannot create the directory: {}", dir, ec.message())
           : fmt::format("--out '{}' is not a directory", dir));
  const std::string probe = (fs::path(dir) / fmt::format(".ember_probe_{}", ::getpid())).string();
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0600);
  if (fd < 0)
    throw UsageError(fmt::format("--out '{}' is not writable: {}", dir, std::strerror(errno)));
  ::close(fd);
  ::unlink(probe.c_str());
  for (const char* name : files) {
    const fs::path file = fs::path(dir) / name;
    if (fs::is_directory(file))
      throw UsageError(
          fmt::format("--out: '{}' is a directory, where a file is written", file.string()));
    if (fs::exists(file) && ::access(file.c_str(), W_OK) != 0)
      throw UsageError(fmt::format("--out: '{}' is not writable", file.string()));
  }
}

// Writes text to path, or throws naming the file.
inline void write_text(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
  if (!out.flush()) throw std::runtime_error(fmt::format("cannot write '{}'", path));
}

// --- memory

// The machine's physical memory in bytes (sysconf).
inline double physical_memory() {
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? static_cast<double>(pages) * static_cast<double>(page) : HUGE_VAL;
}

// Refuses `what` (throws E) when `bytes`, its estimated need, is more than the machine's memory:
// refusing up front beats an allocation failing (or the kernel killing the process) halfway.
template <class E = UsageError>
void check_memory(double bytes, const std::string& what) {
  constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
  if (!(bytes <= physical_memory()))
    throw E(fmt::format("{} needs about {:.3g} GiB of memory, more than the machine's {:.1f} GiB",
                        what, bytes / kGiB, physical_memory() / kGiB));
}

// --- non-finite losses and parameters

// Every element is finite (any dtype that is not floating is). On a GPU the count of the others
// is made there and read back: one small copy.
inline bool all_finite(const ember::Tensor& t) {
  using ember::kFloat32;
  using ember::kFloat64;
  if (t.dtype() != kFloat32 && t.dtype() != kFloat64) return true;
  if (!t.device().is_cpu()) {
    ember::NoGradGuard no_grad;
    return ember::sum(ember::logical_not(ember::isfinite(t))).item<int64_t>() == 0;
  }
  const ember::Tensor c = t.contiguous();
  const auto check = [&](const auto* d) {
    for (int64_t i = 0; i < c.numel(); ++i)
      if (!std::isfinite(d[i])) return false;
    return true;
  };
  return t.dtype() == kFloat32 ? check(c.data<float>()) : check(c.data<double>());
}

// What a trainer does on a non-finite loss or gradient (--on-nonfinite): stop with an error
// (the default), or skip that step's update and go on.
enum class OnNonfinite { kStop, kSkip };

inline void add_on_nonfinite_option(CLI::App& app, OnNonfinite& mode) {
  app.add_option_function<std::string>(
         "--on-nonfinite",
         [&mode](const std::string& v) {
           mode = v == "skip" ? OnNonfinite::kSkip : OnNonfinite::kStop;
         },
         "on a non-finite loss or gradient: stop (exit 1, the default) or skip the step")
      ->check(CLI::IsMember({"stop", "skip"}));
}

// Watches a training run: each step's loss, the gradients when steps may be skipped, and the
// parameters after each epoch and before saving. Stopping throws Diverged.
class NonfiniteGuard {
 public:
  NonfiniteGuard(OnNonfinite mode, std::vector<ember::Tensor> parameters)
      : mode_(mode), parameters_(std::move(parameters)) {}

  // Before backward: true to take the step; false to skip it (counted); throws to stop. `where`
  // names the step, e.g. "epoch 3, step 2".
  template <class Where>
  bool loss_ok(double loss, const Where& where) {
    if (std::isfinite(loss)) return true;
    return skip_or_stop(fmt::format("the loss is {} at {}", loss, where()));
  }
  // After backward, before the optimizer's step; checked only when steps may be skipped (when
  // stopping, a non-finite gradient shows as a non-finite loss or parameter soon after).
  template <class Where>
  bool gradients_ok(const Where& where) {
    if (mode_ == OnNonfinite::kStop) return true;
    for (const ember::Tensor& p : parameters_)
      if (p.grad().defined() && !all_finite(p.grad()))
        return skip_or_stop(fmt::format("a gradient is not finite at {}", where()));
    return true;
  }
  // A loss over a whole epoch is finite, or training stops: an evaluation loss (the parameters
  // give non-finite outputs), or a training loss whose every step was skipped.
  void check_loss(double loss, const std::string& what) const {
    if (!std::isfinite(loss))
      throw Diverged(
          fmt::format("training diverged: {} is {}; nothing saved (lower --lr)", what, loss));
  }
  // The parameters are finite, or training stops: after each epoch and before saving, so that a
  // NaN model never replaces a good checkpoint.
  void check_parameters(const std::string& when) const {
    for (const ember::Tensor& p : parameters_)
      if (!all_finite(p))
        throw Diverged(fmt::format(
            "training diverged: the parameters are not finite {}; nothing saved (lower --lr)",
            when));
  }
  int64_t skipped() const { return skipped_; }

 private:
  bool skip_or_stop(const std::string& what) {
    if (mode_ == OnNonfinite::kStop)
      throw Diverged(fmt::format(
          "training diverged: {}; nothing saved (lower --lr, or --on-nonfinite skip)", what));
    ++skipped_;
    return false;
  }

  OnNonfinite mode_;
  std::vector<ember::Tensor> parameters_;
  int64_t skipped_ = 0;
};

}  // namespace program
