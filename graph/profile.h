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
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
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
// The table: name, calls, total ms, self ms, mean us (total / calls), % of the summed self time.
std::string report();

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
