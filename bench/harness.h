// The benchmark harness: a registry of named workloads and a steady_clock timer that warms a
// workload up, picks how many repetitions fill about `target` seconds, and reports the median
// and the minimum of the timed samples (the same method as bench/pytorch/bench_torch.py).
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <ctime>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "graph/device.h"
#include "graph/profile.h"

namespace ember::bench {

// One benchmark: make(tiny) sets up its tensors and returns the step to time. `tiny` shrinks the
// shapes for the --smoke run. flops: floating-point operations per step for GEMM-bound
// workloads; bytes: the bytes a step must move for bandwidth-bound ones, each tensor pass once
// (0: not reported).
struct Workload {
  std::string name;
  double flops = 0;
  std::function<std::function<void()>(bool tiny)> make;
  double bytes = 0;
  // Runs on bench_device() (--device): a CUDA run runs only these; the others are the CPU's.
  bool on_device = false;
  bool device_only = false;  // and only there
};

// Where the workloads that can run on a device run (ember_bench --device; the CPU by default).
inline Device& bench_device() {
  static Device device = kCPU;
  return device;
}

// Waits for the device's queued work, so that a step's time is its device time too.
inline void wait_for_device() {
  if (bench_device().is_cuda()) cuda::synchronize();
}

// Every workload, in the order they run; each family's file appends its own.
std::vector<Workload>& registry();
void add_op_workloads();
void add_nw_workloads();
void add_grain_workloads();
void add_conv_workloads();  // bench/conv_workloads.cpp
void add_rnn_workloads();   // bench/rnn_workloads.cpp
void add_jvp_workloads();   // bench/jvp_workloads.cpp
void add_product_workloads();

struct Timing {
  double median_s = 0, min_s = 0;  // wall time per step
  double cpu_s = 0;                // process CPU time per step (all threads), mean
  int64_t samples = 0, inner = 0;  // samples, each of `inner` steps
};

// CPU time of the whole process (every thread): on a loaded machine the wall clock also counts
// the time other processes held the cores, the CPU time does not.
inline double process_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

inline double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Warm-up (at least one step and ~10% of the target), then `samples` timed samples of `inner`
// steps each, inner chosen so a sample lasts at least a millisecond and target / 200 (timer
// resolution and the loop itself stay negligible for sub-microsecond steps), samples so that all
// of them last about `target` seconds (at least 3, at most 200). Also the mean CPU time per step.
inline Timing time_steps(const std::function<void()>& step, double target) {
  using clock = std::chrono::steady_clock;
  const auto w0 = clock::now();
  int64_t warm = 0;
  do {
    step();
    ++warm;
    wait_for_device();
  } while (seconds_since(w0) < 0.1 * target && warm < 100000);
  const double estimate = std::max(seconds_since(w0) / static_cast<double>(warm), 1e-9);

  Timing t;
  t.inner = static_cast<int64_t>(std::ceil(std::max(1e-3, target / 200) / estimate));
  t.samples = std::clamp<int64_t>(static_cast<int64_t>(target / (estimate * t.inner)), 3, 200);
  std::vector<double> per_step;
  per_step.reserve(t.samples);
  const double cpu0 = process_cpu_seconds();
  for (int64_t s = 0; s < t.samples; ++s) {
    const auto t0 = clock::now();
    for (int64_t i = 0; i < t.inner; ++i) {
      step();
      profile::step();  // EMBER_PROFILE=1: the per-step shares of the timed steps
    }
    wait_for_device();  // one wait a sample: the steps queue ahead as a training loop's do
    per_step.push_back(seconds_since(t0) / static_cast<double>(t.inner));
  }
  t.cpu_s = (process_cpu_seconds() - cpu0) / static_cast<double>(t.samples * t.inner);
  std::sort(per_step.begin(), per_step.end());
  const size_t n = per_step.size();
  t.median_s = n % 2 ? per_step[n / 2] : 0.5 * (per_step[n / 2 - 1] + per_step[n / 2]);
  t.min_s = per_step.front();
  return t;
}

// Two steps timed in turns (one of each a round, after a warm-up of 0.1 target), for `target`
// seconds in all: on a shared machine a slow phase slows both alike, so the median of the rounds'
// ratios (b's time over a's) holds still where the ratio of two separate runs' medians does not.
struct PairedTiming {
  Timing a, b;
  double ratio_median = 0, ratio_low = 0, ratio_high = 0;  // the rounds' median, quartiles
  int64_t rounds = 0;
};

inline PairedTiming time_paired(const std::function<void()>& a, const std::function<void()>& b,
                                double target) {
  using clock = std::chrono::steady_clock;
  const auto timed = [](const std::function<void()>& step) {
    const auto t0 = clock::now();
    step();
    wait_for_device();
    return seconds_since(t0);
  };
  const auto w0 = clock::now();
  do timed(a), timed(b);
  while (seconds_since(w0) < 0.1 * target);
  std::vector<double> ta, tb, ratio;
  const auto t0 = clock::now();
  do {
    ta.push_back(timed(a));
    tb.push_back(timed(b));
    ratio.push_back(tb.back() / ta.back());
  } while (seconds_since(t0) < target || ta.size() < 3);
  const auto quantile = [](std::vector<double> v, double q) {
    std::sort(v.begin(), v.end());
    return v[static_cast<size_t>(q * static_cast<double>(v.size() - 1) + 0.5)];
  };
  PairedTiming t;
  t.rounds = static_cast<int64_t>(ratio.size());
  for (auto [times, out] : {std::pair{&ta, &t.a}, std::pair{&tb, &t.b}}) {
    out->samples = t.rounds, out->inner = 1;
    out->median_s = quantile(*times, 0.5);
    out->min_s = *std::min_element(times->begin(), times->end());
  }
  t.ratio_median = quantile(ratio, 0.5);
  t.ratio_low = quantile(ratio, 0.25), t.ratio_high = quantile(ratio, 0.75);
  return t;
}

}  // namespace ember::bench
