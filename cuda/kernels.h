// The CUDA kernels' entry points (cuda/*.cu, compiled by nvcc where CMake finds the toolkit). A
// leaf below the core: plain C++ types only, no Ember header, so nvcc never compiles Ember's
// (or fmt's) headers. Each queues its kernel on `stream` (the device's, cudaStream_t as void*)
// and returns the launch's cudaError_t as an int (0: queued); the caller turns a failure into an
// ember::Error (graph/device.cpp).
#pragma once

#include <cstddef>
#include <cstdint>

namespace ember::cuda::kernels {

// data[i] = pattern for i in [0, n): elements of element_size bytes (1, 2, 4 or 8), each the low
// element_size bytes of `pattern` (a value's bits as the host laid them out).
int fill(void* data, int64_t n, size_t element_size, uint64_t pattern, void* stream);

}  // namespace ember::cuda::kernels
