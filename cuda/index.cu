// The GPU's gather and scatter_add (cuda/index.h): a thread per index position.
#include <cuda_runtime.h>

#include "cuda/index.h"
#include "cuda/launch.h"

namespace ember::cuda::kernels {

namespace {

__global__ void index_kernel(const IndexAlong a) {
  for (int64_t i = first_index(); i < a.numel; i += grid_stride()) index_element(a, i);
}

}  // namespace

int index_on_device(const IndexAlong& a, void* stream) {
  if (a.numel <= 0) return 0;
  index_kernel<<<blocks_for(a.numel), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(a);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace ember::cuda::kernels
