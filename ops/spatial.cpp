// IntList arguments expanded to the spatial dims, and unbatched inputs given a batch of one.
#include "ops/spatial.h"

#include "ops/common.h"

namespace ember {

IntList expand_param(const IntList& values, int64_t n, std::string_view op, std::string_view arg) {
  const int64_t count = static_cast<int64_t>(values.size());
  EMBER_CHECK(count == 1 || count == n, "{}: {} must have 1 or {} values, got {} ({})", op, arg, n,
              count, values);
  return count == n ? values : IntList(static_cast<size_t>(n), values[0]);
}

SpatialInput batched_input(const Tensor& x, int64_t n, std::string_view op) {
  check_floating(x, op);
  EMBER_CHECK(x.dim() == n + 1 || x.dim() == n + 2,
              "{}: expected a {}-D (unbatched) or {}-D (batched) input, got shape {}", op, n + 1,
              n + 2, x.shape());
  if (x.dim() == n + 2) return {x, false};
  return {x.unsqueeze(0), true};
}

}  // namespace ember
