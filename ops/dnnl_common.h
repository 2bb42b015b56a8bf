// What ops/conv_dnnl.cpp and ops/gemm_amx.cpp share in calling oneDNN: its CPU engine, and
// OpenMP's thread count held at a value for a call (oneDNN sizes its work from
// omp_get_max_threads(), which Ember pins at one: graph/parallel.cpp). Include only where
// EMBER_HAVE_DNNL.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>

#include <omp.h>
#include <oneapi/dnnl/dnnl.hpp>

namespace ember::detail {

// The one CPU engine of the process.
inline const dnnl::engine& dnnl_cpu_engine() {
  static const dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

// OpenMP's count on this thread set to `threads` while alive.
class OmpThreads {
 public:
  explicit OmpThreads(int threads) : prev_(omp_get_max_threads()) { omp_set_num_threads(threads); }
  ~OmpThreads() { omp_set_num_threads(prev_); }
  OmpThreads(const OmpThreads&) = delete;
  OmpThreads& operator=(const OmpThreads&) = delete;

 private:
  int prev_;
};

// Primitives made once and kept, by key, under one mutex: making a primitive descriptor and
// JIT-compiling its kernel costs 0.1-10 ms. An entry may be null (oneDNN had none for the key:
// asked once, the caller computes otherwise). A program that meets ever new shapes (growing
// sequences, say) would keep every primitive it made; past kCapacity the cache starts again.
template <class Key, class Entry>
class PrimitiveCache {
 public:
  // The entry for key, made by make() (a shared_ptr<const Entry>, null allowed) on first use; an
  // exception from make() leaves nothing cached.
  template <class Make>
  std::shared_ptr<const Entry> get(const Key& key, Make make) {
    std::lock_guard lock(mutex_);
    if (auto it = entries_.find(key); it != entries_.end()) return it->second;
    if (entries_.size() >= kCapacity) entries_.clear();
    std::shared_ptr<const Entry> made = make();
    entries_.emplace(key, made);
    return made;
  }
  int64_t size() {
    std::lock_guard lock(mutex_);
    return static_cast<int64_t>(entries_.size());
  }

 private:
  static constexpr size_t kCapacity = 1024;
  std::mutex mutex_;
  std::map<Key, std::shared_ptr<const Entry>> entries_;
};

}  // namespace ember::detail
