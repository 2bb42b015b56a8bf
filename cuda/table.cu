// The GPU's table of kernels (cuda/kernels.h).
#include "cuda/launch.h"

namespace ember::cuda::kernels {

const Table& device_table() {
  static const Table table = [] {
    Table t;
    t.fill = fill_on_device;
    t.elementwise = elementwise_on_device;
    t.sum = sum_on_device;
    t.gemm = gemm_on_device;
    t.rows = rows_on_device;
    t.index = index_on_device;
    t.dropout_mask = dropout_mask_on_device;
    t.optim = optim_on_device;
    return t;
  }();
  return table;
}

}  // namespace ember::cuda::kernels
