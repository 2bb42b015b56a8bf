// ember::distributed: processes that train one model together over MPI (OpenMPI from Debian), as
// torch.distributed with its MPI backend. The process group is MPI_COMM_WORLD of the job that
// `mpirun -np N program …` starts; a program started without mpirun is one process (rank 0 of 1)
// and never touches MPI, so the same binary runs both ways.
//
// Collectives take Float32, Float64 and Int64 tensors of any layout (a non-contiguous tensor goes
// through a contiguous copy that is copied back) and must be called by every rank in the same
// order. Each begins with a handshake, one all-gather of a few integers, so that when the ranks
// disagree (another collective, dtype, shape or root) every rank throws an ember::Error naming
// the collective, the ranks and their shapes, instead of exchanging garbage or hanging.
//
// Note [Threads and MPI]
// MPI is initialised with MPI_THREAD_FUNNELED: only the thread that called init() makes MPI
// calls; the OpenMP threads inside ops never do. The collectives (and DDP's backward hooks) check
// that they run on that thread.
//
// Note [A failing rank]
// When one rank fails, the others would wait in their next collective forever. abort() ends the
// whole job at once (MPI_Abort: mpirun kills every process and exits non-zero). init() installs
// a std::terminate handler that prints the uncaught exception and aborts; a program that catches
// its exceptions itself prints the message and calls abort(status) (examples/data_parallel.h).
// A failing rank must not call MPI_Finalize, which waits for the other ranks, blocked in a
// collective: so Guard's destructor skips it when an exception is leaving its scope, and the
// process, once the exception is handled above and it exits, leaves without finalising, which
// mpirun takes as a failure of the job (it kills the other ranks, and exits non-zero, even when
// that process exits 0).
#pragma once

#include <string>
#include <vector>

#include "graph/tensor.h"

namespace ember::distributed {

// Initialises MPI (MPI_THREAD_FUNNELED or better) when the process was started by mpirun or
// another MPI launcher (its environment says so: OMPI_COMM_WORLD_SIZE, PMI_SIZE, PMIX_RANK);
// otherwise does nothing and the program is one process. argc/argv may be null. A second call
// does nothing. Throws when MPI cannot give FUNNELED.
void init(int* argc = nullptr, char*** argv = nullptr);
// MPI_Finalize when init() (or the program) initialised MPI; waits for every rank to get here.
void finalize();
// RAII: init() when made, finalize() when destroyed, except by an exception leaving its scope
// (Note [A failing rank]).
class Guard {
 public:
  explicit Guard(int* argc = nullptr, char*** argv = nullptr);
  ~Guard();
  Guard(const Guard&) = delete;
  Guard& operator=(const Guard&) = delete;

 private:
  int uncaught_;
};

// True between init() (or any MPI_Init) and finalize(). rank() is 0 and world_size() 1 when not
// initialized.
bool is_initialized();
int rank();
int world_size();

// Ends every process of the job with `status` (MPI_Abort), or just this one (std::exit) when not
// initialized. Print the message first: Note [A failing rank].
[[noreturn]] void abort(int status = 1);

enum class ReduceOp { Sum, Avg, Max };

// t becomes, on every rank, the elementwise reduction of every rank's t (in place). Avg needs a
// floating tensor. t may be a view, but not an expanded one (several elements in one place).
void all_reduce(Tensor& t, ReduceOp op = ReduceOp::Sum);
// t becomes rank root's t on every rank (in place; every rank's t has the same dtype and shape).
void broadcast(Tensor& t, int root = 0);
// Every rank's t (same dtype and shape on every rank), in rank order, as new contiguous tensors.
std::vector<Tensor> all_gather(const Tensor& t);
// Returns when every rank has called it.
void barrier();

}  // namespace ember::distributed
