// The op profiler's records: one table of (calls, total, self) per name behind a mutex (only
// touched while profiling), the per-thread stack of open scopes for self time, EMBER_PROFILE and
// the report printed at exit.
#include "graph/profile.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <unordered_map>

#include <fmt/format.h>

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

Records& records() {
  static Records r;
  return r;
}

thread_local Scope* t_open = nullptr;  // the innermost open scope on this thread

const bool g_from_env = [] {
  const char* env = std::getenv("EMBER_PROFILE");
  if (env && *env && std::strcmp(env, "0") != 0) enable();
  return true;
}();

}  // namespace

void enable(bool on) {
  if (on) records();  // constructed before the first record, so destroyed after the last
  detail::g_enabled.store(on, std::memory_order_relaxed);
}

void reset() { records().clear(); }

std::vector<Entry> entries() { return records().entries(); }

std::string report() {
  const std::vector<Entry> rows = entries();
  if (rows.empty()) return {};
  double self_sum = 0;
  size_t width = 4;
  for (const Entry& e : rows) {
    self_sum += e.self_ms;
    width = std::max(width, e.name.size());
  }
  std::string out = fmt::format("{:<{}}  {:>9}  {:>11}  {:>11}  {:>11}  {:>6}\n", "name", width,
                                "calls", "total ms", "self ms", "mean us", "self%");
  for (const Entry& e : rows)
    out += fmt::format("{:<{}}  {:>9}  {:>11.3f}  {:>11.3f}  {:>11.3f}  {:>5.1f}%\n", e.name, width,
                       e.calls, e.total_ms, e.self_ms, 1e3 * e.total_ms / e.calls,
                       self_sum > 0 ? 100 * e.self_ms / self_sum : 0.0);
  out += fmt::format("{:<{}}  {:>9}  {:>11}  {:>11.3f}\n", "(profiled)", width, "", "", self_sum);
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
