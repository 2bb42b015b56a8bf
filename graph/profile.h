// The op profiler: wall time and call counts per op name, forward (a Scope at the top of each
// public op function) and backward (the engine times each Node's apply under its name()), printed
// at exit as a table sorted by total time, like torch.profiler's key_averages().
//
// Turn it on with EMBER_PROFILE=1 in the environment or profile::enable() in code. Off, a Scope
// costs one relaxed atomic load and a branch: nothing is read from the clock or recorded.
//
// Note [Self time]
// Scopes nest (softmax calls contiguous, a backward Node calls mul). `total` is inclusive, as
// torch's "CPU total"; `self` subtracts the time of the scopes opened inside it on the same
// thread, so the self times add up to the profiled time and their shares sum to 100%.
//
// Note [Step shares]
// step() marks the end of a training step, as torch.profiler's prof.step(). Between two marks
// the calling thread's time is split four ways: products (gemm, BLAS or the small-matrix loop);
// other kernels (the loops run through parallel_for and parallel_region, graph/strided.h); waiting
// for threads (what a parallel region takes beyond the calling thread's own share: waking the
// pool, imbalance, the last thread's finish); and the rest, framework overhead (graph building,
// allocation, shape checks, the engine) with the caller's own code. The report gives the mean
// step and these shares over the steps after the first (the first pays for warming up). Work
// is counted where it is called from outside any parallel region; the outermost timer on a
// thread counts it, so nothing is counted twice.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace ember::profile {

namespace detail {
extern std::atomic<bool> g_enabled;
}  // namespace detail

// Starts (or with false stops) recording; what was recorded is kept until reset().
void enable(bool on = true);
inline void disable() { enable(false); }
inline bool is_enabled() { return detail::g_enabled.load(std::memory_order_relaxed); }
// Forgets everything recorded so far.
void reset();

struct Entry {
  std::string name;
  int64_t calls = 0;
  double total_ms = 0, self_ms = 0;  // Note [Self time]
};
// What was recorded, sorted by total time, longest first.
std::vector<Entry> entries();
// The table: name, calls, total ms, self ms, mean us (total / calls), % of the summed self time,
// under the header lines (what ran the work, as the product library: ops/blas.cpp adds it).
std::string report();
// Adds a line, made when a report is, above every report's table.
void add_report_header(std::function<std::string()> line);

// Marks the end of a step (Note [Step shares]); does nothing while the profiler is off.
void step();
struct StepSummary {
  int64_t steps = 0;  // the steps averaged: all after the first (the only one, if one)
  double step_ms = 0, gemm_ms = 0, kernel_ms = 0, wait_ms = 0;  // means per step
  double overhead_ms() const { return step_ms - gemm_ms - kernel_ms - wait_ms; }
};
StepSummary step_summary();

enum class Kind : int { Gemm, Kernel, Wait };

// Times the enclosing block as work of `kind` on the calling thread (Note [Step shares]), and
// makes `kind` the kind of the parallel regions opened inside it. Off, or nested in another
// timer, or inside a parallel region, it records nothing.
class KernelTimer {
 public:
  explicit KernelTimer(Kind kind) {
    if (is_enabled()) start(kind);
  }
  ~KernelTimer() {
    if (active_) stop();
  }
  KernelTimer(const KernelTimer&) = delete;
  KernelTimer& operator=(const KernelTimer&) = delete;

 private:
  void start(Kind kind);
  void stop();

  std::chrono::steady_clock::time_point start_;
  int64_t wait_at_start_ = 0;
  Kind kind_ = Kind::Kernel, outer_kind_ = Kind::Kernel;
  bool active_ = false, counting_ = false;
};

// The kind of work a parallel region opened here does (Gemm inside a product, else Kernel).
Kind current_kind();

// Times one parallel region on the calling thread: construct it before the region, call
// own_start()/own_stop() around the calling thread's share (thread 0), and the rest of the
// region's wall time is recorded as waiting for threads when it goes out of scope.
class RegionTimer {
 public:
  RegionTimer() {
    if (is_enabled()) start();
  }
  ~RegionTimer() {
    if (active_) stop();
  }
  void own_start() {
    if (active_) own_start_ = std::chrono::steady_clock::now();
  }
  void own_stop() {
    if (active_)
      own_ns_ = std::chrono::duration_cast<std::chrono::nanoseconds>(
                    std::chrono::steady_clock::now() - own_start_)
                    .count();
  }
  RegionTimer(const RegionTimer&) = delete;
  RegionTimer& operator=(const RegionTimer&) = delete;

 private:
  void start();
  void stop();

  std::chrono::steady_clock::time_point start_, own_start_;
  int64_t own_ns_ = 0;
  bool active_ = false;
};

// Times the enclosing block under `name` while the profiler is on. `name` must outlive the
// scope (op names are string literals; Node names live as long as their Node).
class Scope {
 public:
  explicit Scope(std::string_view name) {
    if (is_enabled()) start(name);
  }
  ~Scope() {
    if (active_) stop();
  }
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;

 private:
  void start(std::string_view name);
  void stop();

  std::string_view name_;
  std::chrono::steady_clock::time_point start_;
  int64_t child_ns_ = 0;     // time of the scopes nested in this one
  Scope* parent_ = nullptr;  // the scope this one is nested in, on this thread
  bool active_ = false;
};

}  // namespace ember::profile
