// The GPU's sum kernel (cuda/reduce.h): a block per output element (grid-stride over outputs),
// its threads striding over the summed elements, their partial sums added in shared memory by a
// fixed tree.
#include <cuda_runtime.h>

#include "cuda/launch.h"
#include "cuda/reduce.h"

namespace ember::cuda::kernels {

namespace {

template <class Acc>
__global__ void sum_kernel(const Reduce r) {
  __shared__ Acc partial[kThreads];
  for (int64_t j = blockIdx.x; j < r.out_numel; j += gridDim.x) {
    partial[threadIdx.x] = reduce_partial<Acc>(r, j, threadIdx.x, blockDim.x);
    __syncthreads();
    for (unsigned width = blockDim.x / 2; width > 0; width /= 2) {
      if (threadIdx.x < width) partial[threadIdx.x] += partial[threadIdx.x + width];
      __syncthreads();
    }
    if (threadIdx.x == 0) reduce_store<Acc>(r, j, partial[0]);
    __syncthreads();  // partial[0] read before the next output overwrites it
  }
}

}  // namespace

int sum_on_device(const Reduce& r, void* stream) {
  if (r.out_numel <= 0) return 0;
  const unsigned blocks =
      static_cast<unsigned>(r.out_numel < kMaxBlocks ? r.out_numel : kMaxBlocks);
  const auto s = static_cast<cudaStream_t>(stream);
  if (reduce_in_double(r))
    sum_kernel<double><<<blocks, kThreads, 0, s>>>(r);
  else
    sum_kernel<int64_t><<<blocks, kThreads, 0, s>>>(r);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace ember::cuda::kernels
