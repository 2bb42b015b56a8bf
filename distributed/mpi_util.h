// What collectives.cpp and ddp.cpp share inside the library: MPI's types for Ember's dtypes, a
// checked MPI call, the thread check (Note [Threads and MPI]). Not installed: it includes mpi.h.
#pragma once

#include <string_view>

#include <mpi.h>

#include "graph/dtype.h"
#include "graph/tensor.h"

namespace ember::distributed::detail {

// MPI_FLOAT, MPI_DOUBLE or MPI_INT64_T; throws naming `op` for another dtype.
MPI_Datatype mpi_type(DType dtype, std::string_view op);
// Throws an ember::Error "op: <MPI's message> (rank r)" when rc is not MPI_SUCCESS.
void check_mpi(int rc, std::string_view op);
// The address of t's first element, whatever its dtype.
inline char* bytes(const Tensor& t) {
  EMBER_CHECK(t.device().is_cpu(), "distributed: a tensor on {}: only CPU tensors so far",
              t.device());
  return static_cast<char*>(t.data_bytes());
}
// Throws naming `op` unless this thread may call MPI (the one that initialised it under
// MPI_THREAD_FUNNELED, any under MPI_THREAD_MULTIPLE).
void check_thread(std::string_view op);

}  // namespace ember::distributed::detail
