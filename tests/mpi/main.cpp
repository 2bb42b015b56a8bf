// The Boost.Test entry point of `ember_mpi_tests`, the suites of ember::distributed. CTest runs it
// under `mpirun -np 2`, `mpirun -np 1` and alone (one process, MPI never initialised); every case
// holds for any number of ranks. Each rank runs every case, and a case's collectives must match
// across ranks, so the cases use non-fatal checks only (a rank leaving a case early would leave
// the others waiting).
#define BOOST_TEST_MODULE ember_mpi
#define BOOST_TEST_NO_MAIN
#include <boost/test/unit_test.hpp>

#include "distributed/distributed.h"

int main(int argc, char* argv[]) {
  ember::distributed::Guard mpi(&argc, &argv);
  // A rank whose checks failed exits non-zero after the others finished: mpirun then fails too.
  return boost::unit_test::unit_test_main(&init_unit_test, argc, argv);
}
