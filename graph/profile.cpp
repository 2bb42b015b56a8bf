// The op profiler's records: one table of (calls, total, self) per name behind a mutex (only
// touched while profiling), the per-thread stack of open scopes for self time, EMBER_PROFILE and
// the report printed at exit.
#include "graph/profile.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <unordered_map>

#include <fmt/format.h>
#include <omp.h>

namespace ember::profile {

namespace detail {
std::atomic<bool> g_enabled{false};
}  // namespace detail

namespace {

struct Stat {
  int64_t calls = 0, total_ns = 0, self_ns = 0;
};

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};

// The records, and the report printed when the program ends (a static destructor, so it runs
// after main returns and before the records themselves go).
class Records {
 public:
  ~Records() {
    const std::string table = report();
    if (!table.empty()) std::fputs(table.c_str(), stderr);
  }
  void add(std::string_view name, int64_t total_ns, int64_t self_ns) {
    std::lock_guard lock(mutex_);
    auto it = stats_.find(name);
    if (it == stats_.end()) it = stats_.emplace(std::string(name), Stat{}).first;
    ++it->second.calls;
    it->second.total_ns += total_ns;
    it->second.self_ns += self_ns;
  }
  void clear() {
    std::lock_guard lock(mutex_);
    stats_.clear();
  }
  std::vector<Entry> entries() {
    std::lock_guard lock(mutex_);
    std::vector<Entry> out;
    out.reserve(stats_.size());
    for (const auto& [name, s] : stats_)
      out.push_back({name, s.calls, s.total_ns * 1e-6, s.self_ns * 1e-6});
    std::sort(out.begin(), out.end(), [](const Entry& a, const Entry& b) {
      return a.total_ms != b.total_ms ? a.total_ms > b.total_ms : a.name < b.name;
    });
    return out;
  }

 private:
  std::mutex mutex_;
  std::unordered_map<std::string, Stat, StringHash, std::equal_to<>> stats_;
};

class Steps;
Steps& steps();

Records& records() {
  steps();  // constructed first, so still there when ~Records prints the report at exit
  static Records r;
  return r;
}

thread_local Scope* t_open = nullptr;  // the innermost open scope on this thread

using Clock = std::chrono::steady_clock;
int64_t ns_since(Clock::time_point start) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - start).count();
}

// Note [Step shares]: the time of each kind counted so far, and the steps marked.
std::array<std::atomic<int64_t>, 3> g_kind_ns{};
thread_local int t_timer_depth = 0;       // KernelTimers open on this thread
thread_local Kind t_kind = Kind::Kernel;  // the kind of a region opened here
thread_local int64_t t_wait_ns = 0;       // waiting recorded on this thread

void add(Kind kind, int64_t ns) {
  g_kind_ns[static_cast<size_t>(kind)].fetch_add(ns, std::memory_order_relaxed);
}

class Steps {
 public:
  void mark(bool end_of_step) {
    std::lock_guard lock(mutex_);
    const Clock::time_point now = Clock::now();
    std::array<int64_t, 3> kinds;
    for (size_t k = 0; k < 3; ++k) kinds[k] = g_kind_ns[k].load(std::memory_order_relaxed);
    if (end_of_step && marked_) {
      std::array<double, 4>& into = count_ == 0 ? first_ : sum_;
      into[0] += std::chrono::duration<double, std::milli>(now - mark_).count();
      for (size_t k = 0; k < 3; ++k) into[k + 1] += (kinds[k] - kinds_at_mark_[k]) * 1e-6;
      ++count_;
    }
    marked_ = true;
    mark_ = now;
    kinds_at_mark_ = kinds;
  }
  void clear() {
    {
      std::lock_guard lock(mutex_);
      count_ = 0;
      first_ = sum_ = {};
    }
    mark(false);
  }
  StepSummary summary() {
    std::lock_guard lock(mutex_);
    if (count_ == 0) return {};
    const int64_t n = count_ == 1 ? 1 : count_ - 1;
    const std::array<double, 4>& s = count_ == 1 ? first_ : sum_;
    return {n, s[0] / n, s[1] / n, s[2] / n, s[3] / n};
  }

 private:
  std::mutex mutex_;
  bool marked_ = false;
  Clock::time_point mark_;
  std::array<int64_t, 3> kinds_at_mark_{};
  int64_t count_ = 0;
  std::array<double, 4> first_{}, sum_{};  // step, gemm, kernel, wait (ms)
};

Steps& steps() {
  static Steps s;
  return s;
}

const bool g_from_env = [] {
  const char* env = std::getenv("EMBER_PROFILE");
  if (env && *env && std::strcmp(env, "0") != 0) enable();
  return true;
}();

}  // namespace

void enable(bool on) {
  if (on) {
    records();  // constructed before the first record, so destroyed after the last
    steps().mark(false);
  }
  detail::g_enabled.store(on, std::memory_order_relaxed);
}

void reset() {
  records().clear();
  steps().clear();
}

void step() {
  if (is_enabled()) steps().mark(true);
}

StepSummary step_summary() { return steps().summary(); }

Kind current_kind() { return t_kind; }

void KernelTimer::start(Kind kind) {
  active_ = true;
  kind_ = kind;
  outer_kind_ = t_kind;
  t_kind = kind;
  counting_ = t_timer_depth++ == 0 && !omp_in_parallel();
  if (counting_) {
    wait_at_start_ = t_wait_ns;
    start_ = Clock::now();
  }
}

void KernelTimer::stop() {
  if (counting_) add(kind_, ns_since(start_) - (t_wait_ns - wait_at_start_));
  --t_timer_depth;
  t_kind = outer_kind_;
}

void RegionTimer::start() {
  if (omp_in_parallel()) return;
  active_ = true;
  start_ = Clock::now();
}

void RegionTimer::stop() {
  const int64_t wait = std::max<int64_t>(0, ns_since(start_) - own_ns_);
  t_wait_ns += wait;
  add(Kind::Wait, wait);
}

std::vector<Entry> entries() { return records().entries(); }

namespace {
// Never destroyed: the report printed at exit reads it after other statics have gone.
std::vector<std::function<std::string()>>& report_headers() {
  static auto* headers = new std::vector<std::function<std::string()>>;
  return *headers;
}
std::mutex g_headers_mutex;
}  // namespace

void add_report_header(std::function<std::string()> line) {
  std::lock_guard lock(g_headers_mutex);
  report_headers().push_back(std::move(line));
}

std::string report() {
  const std::vector<Entry> rows = entries();
  if (rows.empty()) return {};
  std::string out;
  {
    std::lock_guard lock(g_headers_mutex);
    for (const auto& line : report_headers()) out += line() + '\n';
  }
  double self_sum = 0;
  size_t width = 4;
  for (const Entry& e : rows) {
    self_sum += e.self_ms;
    width = std::max(width, e.name.size());
  }
  out += fmt::format("{:<{}}  {:>9}  {:>11}  {:>11}  {:>11}  {:>6}\n", "name", width, "calls",
                     "total ms", "self ms", "mean us", "self%");
  for (const Entry& e : rows)
    out += fmt::format("{:<{}}  {:>9}  {:>11.3f}  {:>11.3f}  {:>11.3f}  {:>5.1f}%\n", e.name, width,
                       e.calls, e.total_ms, e.self_ms, 1e3 * e.total_ms / e.calls,
                       self_sum > 0 ? 100 * e.self_ms / self_sum : 0.0);
  out += fmt::format("{:<{}}  {:>9}  {:>11}  {:>11.3f}\n", "(profiled)", width, "", "", self_sum);
  const StepSummary st = step_summary();
  if (st.steps > 0 && st.step_ms > 0) {
    const auto share = [&](double ms) { return 100 * ms / st.step_ms; };
    out += fmt::format(
        "per step (mean of {} steps{}): {:.3f} ms = products {:.1f}% + other kernels {:.1f}% + "
        "waiting for threads {:.1f}% + framework and the rest {:.1f}%\n",
        st.steps, st.steps > 1 ? " after the first" : "", st.step_ms, share(st.gemm_ms),
        share(st.kernel_ms), share(st.wait_ms), share(st.overhead_ms()));
  }
  return out;
}

void Scope::start(std::string_view name) {
  name_ = name;
  parent_ = t_open;
  t_open = this;
  active_ = true;
  start_ = std::chrono::steady_clock::now();
}

void Scope::stop() {
  const int64_t ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                         std::chrono::steady_clock::now() - start_)
                         .count();
  t_open = parent_;
  if (parent_) parent_->child_ns_ += ns;
  records().add(name_, ns, ns - child_ns_);
}

}  // namespace ember::profile
