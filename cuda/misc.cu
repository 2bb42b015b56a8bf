// The GPU's dropout masks (cuda/random.h) and optimizer updates (cuda/optim.h, several tensors a
// launch): an element per thread over a grid-stride loop.
#include <cuda_runtime.h>

#include "cuda/launch.h"
#include "cuda/optim.h"
#include "cuda/random.h"

namespace ember::cuda::kernels {

namespace {

__global__ void dropout_mask_kernel(const DropoutMask m) {
  for (int64_t i = first_index(); i < m.n; i += grid_stride()) dropout_mask_element(m, i);
}

__global__ void optim_kernel(const OptimStep s) { optim_elements(s, first_index(), grid_stride()); }

}  // namespace

int dropout_mask_on_device(const DropoutMask& m, void* stream) {
  if (m.n <= 0) return 0;
  dropout_mask_kernel<<<blocks_for(m.n), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(m);
  return static_cast<int>(cudaGetLastError());
}

int optim_on_device(const OptimStep& s, void* stream) {
  if (s.type != ScalarType::Float32 && s.type != ScalarType::Float64) return kUnsupported;
  if (s.numel() <= 0) return 0;
  optim_kernel<<<blocks_for(s.numel()), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(s);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace ember::cuda::kernels
