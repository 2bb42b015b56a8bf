// CachingAllocator: device memory handed out in blocks that are kept for reuse when freed, over a
// backend that gets and returns memory from the driver (cudaMalloc/cudaFree for a CUDA device).
// The logic is the backend's-free part, so the CPU tests drive it with a counting backend.
//
// Note [Caching allocator]
// Getting memory from a GPU's driver is slow (cudaMalloc takes tens of microseconds and may
// synchronise the device; cudaFree does synchronise it), and a training step frees and requests
// the same sizes every iteration. So, as PyTorch's CUDA allocator: a freed block is kept, by its
// rounded size, and the next request of that size takes it; memory goes back to the driver only
// on demand: when the driver refuses an allocation, every cached block is returned and the
// allocation tried once more, and empty_cache() returns them at the caller's word. Sizes are
// rounded so that requests of nearby sizes share blocks: to 512 bytes below 1 MiB, and above it
// to a quarter of the power of two below (1 MiB, 1.25, 1.5, 1.75, 2, 2.5, ...: at most 25% more
// than asked; torch's roundup_power2_divisions = 4). One stream per device (Note [CUDA
// availability]) makes reuse safe without events: a block freed by a kernel queued on the stream
// is next written by a kernel queued after it. Thread-safe: one mutex. A device's allocator
// lives as long as the process; its end returns nothing to the driver.
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <unordered_map>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "graph/error.h"
#include "graph/memory_stats.h"

namespace ember {

// What the allocator counts (cuda::MemoryStats, graph/memory_stats.h).
using AllocatorStats = cuda::MemoryStats;

// Backend: void* alloc(size_t bytes) (nullptr when out of memory), void release(void* p), and
// std::string name() for messages ("cuda:0").
template <class Backend>
class CachingAllocator {
 public:
  explicit CachingAllocator(Backend backend) : backend_(std::move(backend)) {}
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  static size_t rounded_size(size_t nbytes) {
    constexpr size_t kSmall = 512, kLarge = size_t(1) << 20;
    if (nbytes < kLarge) return nbytes == 0 ? kSmall : (nbytes + kSmall - 1) / kSmall * kSmall;
    size_t power = kLarge;  // the largest power of two <= nbytes
    while (power <= nbytes / 2) power *= 2;
    const size_t step = power / 4;
    return (nbytes + step - 1) / step * step;
  }

  // A block of at least nbytes; an Error naming the device when the driver has no more even
  // after the cache was returned to it.
  void* allocate(size_t nbytes) {
    const size_t size = rounded_size(nbytes);
    std::lock_guard lock(mutex_);
    ++stats_.requests;
    void* p = nullptr;
    if (auto it = free_.find(size); it != free_.end() && !it->second.empty()) {
      p = it->second.back();
      it->second.pop_back();
      ++stats_.cache_hits;
    } else {
      p = backend_.alloc(size);
      if (p == nullptr && stats_.reserved_bytes > stats_.allocated_bytes) {
        release_cached();  // free on demand, then once more
        p = backend_.alloc(size);
      }
      if (p == nullptr)
        throw Error(fmt::format(
            "{}: out of memory: cannot allocate {} bytes ({:.2f} GiB); {:.2f} GiB held by "
            "tensors, none cached",
            backend_.name(), nbytes, size / 1073741824.0, stats_.allocated_bytes / 1073741824.0));
      ++stats_.driver_allocs;
      stats_.reserved_bytes += size;
    }
    live_.emplace(p, size);
    stats_.allocated_bytes += size;
    return p;
  }

  // Takes back a block from allocate(), to the cache. Anything else is an Error.
  void free(void* p) {
    std::lock_guard lock(mutex_);
    const auto it = live_.find(p);
    EMBER_CHECK(it != live_.end(), "{}: freeing {} which this allocator did not hand out",
                backend_.name(), p);
    free_[it->second].push_back(p);
    stats_.allocated_bytes -= it->second;
    live_.erase(it);
  }

  // Returns every cached block to the driver (torch.cuda.empty_cache).
  void empty_cache() {
    std::lock_guard lock(mutex_);
    release_cached();
  }

  AllocatorStats stats() const {
    std::lock_guard lock(mutex_);
    return stats_;
  }

  Backend& backend() { return backend_; }

 private:
  void release_cached() {
    for (auto& [size, blocks] : free_) {
      for (void* p : blocks) backend_.release(p);
      stats_.driver_frees += static_cast<int64_t>(blocks.size());
      stats_.reserved_bytes -= size * blocks.size();
    }
    free_.clear();
  }

  mutable std::mutex mutex_;
  Backend backend_;
  std::unordered_map<size_t, std::vector<void*>> free_;  // cached blocks by rounded size
  std::unordered_map<void*, size_t> live_;               // handed out: rounded size
  AllocatorStats stats_;
};

}  // namespace ember
