// copy_into: the strided copy kernel behind clone, contiguous, to(DType) and copy_.
#pragma once

#include "graph/tensor.h"

namespace ember {

// Writes src into dst elementwise: src broadcasts to dst's shape and converts to dst's dtype.
// No autograd, no version bump (callers that write in place bump it).
void copy_into(const Tensor& dst, const Tensor& src);

}  // namespace ember
