// A long fuzzing campaign of the checkpoint reader (tests/checkpoint_fuzz.h):
//   fuzz_checkpoint --iterations N --seed S   the structural attacks, then N inputs of campaign S
//   fuzz_checkpoint --seed S --only I         input I alone (to reproduce a failure)
//   fuzz_checkpoint --file F                  F through each reader, saying what happened
// Options: --scratch PATH (the file inputs are written to; default under /dev/shm), --timeout
// SECONDS (an input taking longer aborts the campaign as a hang, leaving it in the scratch file;
// default 10). A failing input is written to fuzz_checkpoint_failure_S_I.safetensors. The summary
// gives inputs, rate, outcomes, the slowest input, peak memory, and the open file descriptors
// before and after (leaked memory shows in a sanitizer build, at exit).
#include <dirent.h>
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>

#include "tests/checkpoint_fuzz.h"

using namespace ember;
using Clock = std::chrono::steady_clock;

namespace {

int open_fds() {
  int n = 0;
  if (DIR* d = opendir("/proc/self/fd")) {
    while (readdir(d) != nullptr) ++n;
    closedir(d);
    n -= 3;  // ".", ".." and the DIR itself
  }
  return n;
}

void on_alarm(int) {
  const char msg[] =
      "fuzz_checkpoint: HANG: an input ran past --timeout (left in the scratch file)\n";
  [[maybe_unused]] const ssize_t n = write(2, msg, sizeof(msg) - 1);
  _exit(3);
}

struct Options {
  uint64_t iterations = 100'000, seed = 1, only = UINT64_MAX;
  unsigned timeout = 10;
  std::string scratch, file;
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (i + 1 >= argc) throw std::invalid_argument("missing value after " + arg);
    const std::string value = argv[++i];
    if (arg == "--iterations")
      o.iterations = std::stoull(value);
    else if (arg == "--seed")
      o.seed = std::stoull(value);
    else if (arg == "--only")
      o.only = std::stoull(value);
    else if (arg == "--timeout")
      o.timeout = static_cast<unsigned>(std::stoul(value));
    else if (arg == "--scratch")
      o.scratch = value;
    else if (arg == "--file")
      o.file = value;
    else
      throw std::invalid_argument("unknown option " + arg);
  }
  if (o.scratch.empty()) {
    std::error_code ec;
    const auto dir = std::filesystem::is_directory("/dev/shm", ec)
                         ? std::filesystem::path("/dev/shm")
                         : std::filesystem::temp_directory_path();
    o.scratch = (dir / fmt::format("ember_fuzz_checkpoint_{}.safetensors", getpid())).string();
  }
  return o;
}

// F through each reader.
int run_file(const Options& o) {
  testing::Block target(3);
  for (int which = 0; which < 2; ++which) {
    const auto start = Clock::now();
    try {
      if (which == 0) {
        const nn::SafetensorsFile f = nn::read_safetensors(o.file);
        fmt::print("read_safetensors: {} tensors, {} metadata keys", f.tensors.size(),
                   f.metadata.size());
      } else {
        nn::load(target, o.file, /*strict=*/false);
        fmt::print("load (into a test Block, not strict): loaded");
      }
    } catch (const Error& e) {
      fmt::print("ember::Error of {} characters: {}", std::string_view(e.what()).size(), e.what());
    }
    fmt::print(" ({:.3f} s)\n", std::chrono::duration<double>(Clock::now() - start).count());
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  try {
    o = parse(argc, argv);
  } catch (const std::exception& e) {
    fmt::print(stderr,
               "fuzz_checkpoint: {}\nusage: fuzz_checkpoint [--iterations N] [--seed S] "
               "[--only I] [--timeout SECONDS] [--scratch PATH] [--file F]\n",
               e.what());
    return 2;
  }
  if (!o.file.empty()) return run_file(o);
  signal(SIGALRM, on_alarm);
  const int fds_before = open_fds();
  int64_t failures = 0;
  double slowest = 0;
  std::string slowest_input;
  uint64_t inputs = 0;
  const auto start = Clock::now();
  {
    fuzz::Fuzzer fuzzer(o.scratch);
    const auto run = [&](const std::string& bytes, uint64_t which, const std::string& name) {
      const auto t0 = Clock::now();
      alarm(o.timeout);
      const std::string failure = fuzzer.check(bytes, which);
      alarm(0);
      const double took = std::chrono::duration<double>(Clock::now() - t0).count();
      if (took > slowest) slowest = took, slowest_input = name;
      ++inputs;
      if (failure.empty()) return;
      ++failures;
      const std::string keep =
          fmt::format("fuzz_checkpoint_failure_{}_{}.safetensors", o.seed, name);
      std::ofstream(keep, std::ios::binary).write(bytes.data(), std::streamsize(bytes.size()));
      fmt::print(stderr, "FAILURE on input {} (kept as {}): {}\n", name, keep, failure);
    };
    if (o.only != UINT64_MAX) {
      run(fuzzer.input(o.seed, o.only), o.only, std::to_string(o.only));
    } else {
      for (const auto& [name, bytes] : fuzz::structural_attacks())
        for (uint64_t which = 0; which < 3; ++which) run(bytes, which, "'" + name + "'");
      for (uint64_t i = 0; i < o.iterations; ++i) {
        run(fuzzer.input(o.seed, i), i, std::to_string(i));
        if ((i + 1) % 1'000'000 == 0) {
          const double s = std::chrono::duration<double>(Clock::now() - start).count();
          fmt::print(stderr, "fuzz_checkpoint: {} inputs, {:.0f}/s, {} failures\n", inputs,
                     inputs / s, failures);
        }
      }
    }
    const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    rusage usage{};
    getrusage(RUSAGE_SELF, &usage);
    fmt::print(
        "fuzz_checkpoint: seed {}: {} inputs in {:.1f} s ({:.0f}/s): {} loaded, {} rejected with "
        "ember::Error, {} failures; slowest input {} took {:.3f} s; peak RSS {} MB\n",
        o.seed, inputs, seconds, inputs / seconds, fuzzer.loaded, fuzzer.rejected, failures,
        slowest_input, slowest, usage.ru_maxrss / 1024);
  }
  const int fds_after = open_fds();
  fmt::print("fuzz_checkpoint: open file descriptors {} before, {} after\n", fds_before, fds_after);
  return failures == 0 && fds_after == fds_before ? 0 : 1;
}
