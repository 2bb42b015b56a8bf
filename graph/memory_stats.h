// The books a caching allocator keeps of one device's memory (Note [Caching allocator] in
// graph/caching_allocator.h). A header of its own, below both the allocator, which keeps them,
// and graph/device.h, which hands them out as cuda::memory_stats().
#pragma once

#include <cstddef>
#include <cstdint>

namespace ember::cuda {

struct MemoryStats {
  size_t allocated_bytes = 0;  // in blocks held by tensors now (rounded sizes)
  size_t reserved_bytes = 0;   // got from the driver and not returned: allocated + cached
  int64_t driver_allocs = 0;   // cudaMalloc calls that succeeded, since the start
  int64_t driver_frees = 0;    // blocks returned to the driver (cudaFree)
  int64_t requests = 0;        // blocks asked of the allocator
  int64_t cache_hits = 0;      // of them, those a cached block served
};

}  // namespace ember::cuda
