// The GPU's elementwise kernel: cuda/elementwise.h's loop body over a grid-stride loop, the
// launch's arguments passed by value (a few hundred bytes of kernel parameters).
#include <cuda_runtime.h>

#include "cuda/elementwise.h"
#include "cuda/launch.h"

namespace ember::cuda::kernels {

namespace {

__global__ void elementwise_kernel(const Elementwise args) {
  for (int64_t i = first_index(); i < args.numel; i += grid_stride()) elementwise_element(args, i);
}

}  // namespace

int elementwise_on_device(const Elementwise& args, void* stream) {
  if (!supported(args.op, args.compute)) return kUnsupported;
  if (args.numel <= 0) return 0;
  elementwise_kernel<<<blocks_for(args.numel), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      args);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace ember::cuda::kernels
