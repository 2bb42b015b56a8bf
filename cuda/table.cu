// The GPU's table of kernels (cuda/kernels.h).
#include "cuda/launch.h"

namespace ember::cuda::kernels {

const Table& device_table() {
  static const Table table{fill_on_device,         elementwise_on_device, sum_on_device,
                           gemm_on_device,         rows_on_device,        index_on_device,
                           dropout_mask_on_device, optim_on_device};
  return table;
}

}  // namespace ember::cuda::kernels
