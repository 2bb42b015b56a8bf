// A program in which rank 1 fails while rank 0 waits in a collective (tests/mpi/check_abort.cmake
// runs it under mpirun): the whole job must end, non-zero, with rank 1's message, in seconds
// (Note [A failing rank] in distributed/collectives.h). The mode says how rank 1 fails:
//   uncaught  an exception leaves main (the std::terminate handler aborts)
//   caught    main catches it, prints it and calls distributed::abort (as the example programs)
//   unwound   an exception leaves the scope of a distributed::Guard and is caught above it,
//             printed, and the program returns 0: leaving without MPI_Finalize still ends the
//             job non-zero
#include <cstdio>
#include <stdexcept>
#include <string>

#include "distributed/distributed.h"
#include "ember.h"

using namespace ember;

namespace {

void work(const std::string& mode) {
  if (distributed::rank() == 1)
    throw std::runtime_error("rank 1 cannot read shard-1.txt (" + mode + ")");
  Tensor t = ones({4});
  distributed::all_reduce(t);  // rank 0 waits here for a rank that will never come
  distributed::barrier();
}

void guarded(int* argc, char*** argv, const std::string& mode) {
  distributed::Guard mpi(argc, argv);
  work(mode);
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "uncaught";
  if (mode == "unwound") {
    try {
      guarded(&argc, &argv, mode);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "after the guard: %s\n", e.what());
      return 0;
    }
    return 0;
  }
  distributed::Guard mpi(&argc, &argv);
  if (mode == "caught") {
    try {
      work(mode);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "fail_rank: %s\n", e.what());
      distributed::abort(1);
    }
    return 0;
  }
  work(mode);
  return 0;
}
