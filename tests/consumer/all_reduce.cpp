// A user's program against the installed ember::distributed: each rank adds rank + 1 into an
// all-reduce and checks the sum; prints one line per rank. Runs with or without mpirun.
#include <cstdio>

#include "distributed/distributed.h"
#include "ember.h"

using namespace ember;

int main(int argc, char** argv) {
  distributed::Guard guard(&argc, &argv);
  const int rank = distributed::rank(), size = distributed::world_size();
  Tensor t = full({3}, static_cast<double>(rank + 1));
  distributed::all_reduce(t, distributed::ReduceOp::Sum);
  const double expected = size * (size + 1) / 2.0;
  std::printf("all_reduce: rank %d of %d, sum %g (expected %g)\n", rank, size,
              t.sum().item<double>() / 3, expected);
  return t.sum().item<double>() == 3 * expected ? 0 : 1;
}
