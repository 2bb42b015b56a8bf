// The GPU's row kernel (cuda/rows.h): a thread per row over a grid-stride loop.
#include <cuda_runtime.h>

#include "cuda/launch.h"
#include "cuda/rows.h"

namespace ember::cuda::kernels {

int rows_on_device(const Rows& r, void* stream) {
  if (!supported(r)) return kUnsupported;
  return launch_grid_loop<Rows, row_element>(r, r.rows, stream);
}

}  // namespace ember::cuda::kernels
