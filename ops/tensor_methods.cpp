// The Tensor methods of graph/tensor_ops.def: each forwards to the free op of its row.
#include "graph/tensor.h"
#include "ops/elementwise.h"
#include "ops/index.h"
#include "ops/linalg.h"
#include "ops/loss.h"
#include "ops/nn_functional.h"
#include "ops/reduce.h"
#include "ops/shape.h"

namespace ember {

#define EMBER_DEFAULT(...)
#define EMBER_OP(R, name, args, ...)  \
  R Tensor::name(__VA_ARGS__) const { \
    const Tensor& self = *this;       \
    return ember::name args;          \
  }
#include "graph/tensor_ops.def"
#undef EMBER_OP
#undef EMBER_DEFAULT

}  // namespace ember
