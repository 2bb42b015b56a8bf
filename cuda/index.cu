// The GPU's gather and scatter_add (cuda/index.h): a thread per index position.
#include <cuda_runtime.h>

#include "cuda/index.h"
#include "cuda/launch.h"

namespace ember::cuda::kernels {

int index_on_device(const IndexAlong& a, void* stream) {
  return launch_grid_loop<IndexAlong, index_element>(a, a.numel, stream);
}

}  // namespace ember::cuda::kernels
