// The emulated device's kernels (Note [Host emulation of a GPU] in graph/device_backend.h): the
// GPU's kernel bodies (cuda/elementwise.h) run by a plain host loop, one element after another
// as a grid-stride loop's threads would, on memory the emulated device holds in host RAM.
#include <cstring>

#include "cuda/elementwise.h"
#include "cuda/gemm.h"
#include "cuda/index.h"
#include "cuda/kernels.h"
#include "cuda/optim.h"
#include "cuda/random.h"
#include "cuda/reduce.h"
#include "cuda/rows.h"

namespace ember::cuda::kernels {

namespace {

// Body(args, i) for i in [0, n): a grid-stride loop's threads one after another.
template <class Args, void (*Body)(const Args&, int64_t)>
int host_loop(const Args& args, int64_t n) {
  for (int64_t i = 0; i < n; ++i) Body(args, i);
  return 0;
}

int fill_on_host(void* data, int64_t n, size_t element_size, uint64_t pattern, void*) {
  if (element_size != 1 && element_size != 2 && element_size != 4 && element_size != 8)
    return kUnsupported;
  auto* bytes = static_cast<unsigned char*>(data);
  for (int64_t i = 0; i < n; ++i)
    std::memcpy(bytes + static_cast<size_t>(i) * element_size, &pattern, element_size);
  return 0;
}

int elementwise_on_host(const Elementwise& args, void*) {
  if (!supported(args.op, args.compute)) return kUnsupported;
  return host_loop<Elementwise, elementwise_element>(args, args.numel);
}

int sum_on_host(const Reduce& r, void*) {
  for (int64_t j = 0; j < r.out_numel; ++j) {
    if (reduce_in_double(r))
      reduce_store<double>(r, j, reduce_partial<double>(r, j, 0, 1));
    else
      reduce_store<int64_t>(r, j, reduce_partial<int64_t>(r, j, 0, 1));
  }
  return 0;
}

int gemm_on_host(const Gemm& g, void*) {
  if (g.type == ScalarType::Float32) return gemm_reference<float>(g), 0;
  if (g.type == ScalarType::Float64) return gemm_reference<double>(g), 0;
  return kUnsupported;
}

int rows_on_host(const Rows& r, void*) {
  if (!supported(r)) return kUnsupported;
  return host_loop<Rows, row_element>(r, r.rows);
}

int index_on_host(const IndexAlong& a, void*) {
  return host_loop<IndexAlong, index_element>(a, a.numel);
}

int dropout_mask_on_host(const DropoutMask& m, void*) {
  return host_loop<DropoutMask, dropout_mask_element>(m, m.n);
}

int optim_on_host(const OptimStep& s, void*) {
  if (s.type != ScalarType::Float32 && s.type != ScalarType::Float64) return kUnsupported;
  optim_elements(s, 0, 1);
  return 0;
}

}  // namespace

const Table& host_table() {
  static const Table table{fill_on_host, elementwise_on_host, sum_on_host,          gemm_on_host,
                           rows_on_host, index_on_host,       dropout_mask_on_host, optim_on_host};
  return table;
}

}  // namespace ember::cuda::kernels
