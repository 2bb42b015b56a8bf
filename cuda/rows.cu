// The GPU's row kernel (cuda/rows.h): a thread per row over a grid-stride loop.
#include <cuda_runtime.h>

#include "cuda/launch.h"
#include "cuda/rows.h"

namespace ember::cuda::kernels {

namespace {

__global__ void rows_kernel(const Rows r) {
  for (int64_t i = first_index(); i < r.rows; i += grid_stride()) row_element(r, i);
}

}  // namespace

int rows_on_device(const Rows& r, void* stream) {
  if (!supported(r)) return kUnsupported;
  if (r.rows <= 0) return 0;
  rows_kernel<<<blocks_for(r.rows), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(r);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace ember::cuda::kernels
