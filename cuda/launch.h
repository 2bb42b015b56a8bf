// What the GPU's kernels share (nvcc only): the launch shape of a grid-stride loop, and the
// entry points cuda/table.cu gathers into the device's table.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "cuda/kernels.h"

namespace ember::cuda::kernels {

inline constexpr int kThreads = 256;
inline constexpr int64_t kMaxBlocks = 65535;

// Blocks of kThreads for n elements, at most kMaxBlocks: a grid-stride loop covers any n.
inline unsigned blocks_for(int64_t n) {
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < kMaxBlocks ? blocks : kMaxBlocks);
}

__device__ inline int64_t first_index() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ inline int64_t grid_stride() { return static_cast<int64_t>(gridDim.x) * blockDim.x; }

// The kernel of an element-per-thread op: Body(args, i) for every i in [0, n), a grid-stride loop
// (Body: one of cuda/*.h's host-and-device element functions; cuda/host.cpp runs the same bodies
// in a plain loop).
template <class Args, void (*Body)(const Args&, int64_t)>
__global__ void grid_loop(const Args args, int64_t n) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) Body(args, i);
}

// Queues grid_loop<Args, Body> over n elements on `stream`: 0, or the launch's cudaError_t.
template <class Args, void (*Body)(const Args&, int64_t)>
int launch_grid_loop(const Args& args, int64_t n, void* stream) {
  if (n <= 0) return 0;
  grid_loop<Args, Body><<<blocks_for(n), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(args, n);
  return static_cast<int>(cudaGetLastError());
}

int fill_on_device(void* data, int64_t n, size_t element_size, uint64_t pattern, void* stream);
int elementwise_on_device(const Elementwise& args, void* stream);
int sum_on_device(const Reduce& args, void* stream);
int gemm_on_device(const Gemm& args, void* stream);
int rows_on_device(const Rows& args, void* stream);
int index_on_device(const IndexAlong& args, void* stream);
int dropout_mask_on_device(const DropoutMask& args, void* stream);
int optim_on_device(const OptimStep& args, void* stream);

}  // namespace ember::cuda::kernels
