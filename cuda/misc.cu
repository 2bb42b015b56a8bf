// The GPU's dropout masks (cuda/random.h) and optimizer updates (cuda/optim.h, several tensors a
// launch): an element per thread over a grid-stride loop.
#include <cuda_runtime.h>

#include "cuda/launch.h"
#include "cuda/optim.h"
#include "cuda/random.h"

namespace ember::cuda::kernels {

namespace {

__global__ void optim_kernel(const OptimStep s) { optim_elements(s, first_index(), grid_stride()); }

}  // namespace

int dropout_mask_on_device(const DropoutMask& m, void* stream) {
  return launch_grid_loop<DropoutMask, dropout_mask_element>(m, m.n, stream);
}

int optim_on_device(const OptimStep& s, void* stream) {
  if (s.type != ScalarType::Float32 && s.type != ScalarType::Float64) return kUnsupported;
  if (s.numel() <= 0) return 0;
  optim_kernel<<<blocks_for(s.numel()), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(s);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace ember::cuda::kernels
