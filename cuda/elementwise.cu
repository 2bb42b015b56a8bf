// The GPU's elementwise kernel: cuda/elementwise.h's loop body over a grid-stride loop, the
// launch's arguments passed by value (a few hundred bytes of kernel parameters).
#include <cuda_runtime.h>

#include "cuda/elementwise.h"
#include "cuda/launch.h"

namespace ember::cuda::kernels {

int elementwise_on_device(const Elementwise& args, void* stream) {
  if (!supported(args.op, args.compute)) return kUnsupported;
  return launch_grid_loop<Elementwise, elementwise_element>(args, args.numel, stream);
}

}  // namespace ember::cuda::kernels
