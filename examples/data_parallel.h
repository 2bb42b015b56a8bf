// Data parallelism for the example programs: under `mpirun -np N program …` each of N processes
// trains the same model on 1/N of every global batch, and DistributedDataParallel averages the
// gradients (distributed/ddp.h), so N processes follow one process's training with the same
// global batch. Built without MPI (EMBER_HAVE_MPI unset), or started without mpirun, the same
// calls make a world of one process and change nothing.
//
// What a trainer does with it: a Session first thing in main; its finish() on the exit status
// (a failed rank must end the others: Note [A failing rank] in distributed/collectives.h);
// replicate() on the model before its optimizer; every rank draws the whole global batch (same
// seed) and trains on shard() of it, with the loss normalised by the global batch's tokens over
// N (then the mean over ranks is the global batch's loss); sums of the ranks' losses through
// sum(); files written by the main rank only. Only rank 0 prints: Session sends the other ranks'
// standard output to /dev/null (their errors still reach stderr).
#pragma once

#include <cstdio>
#include <memory>

#include "ember.h"
#ifdef EMBER_HAVE_MPI
#include "distributed/distributed.h"
#endif

namespace data_parallel {

class Session {
 public:
  Session(int& argc, char**& argv)
#ifdef EMBER_HAVE_MPI
      : mpi_(&argc, &argv) {
    if (rank() != 0 && std::freopen("/dev/null", "w", stdout) == nullptr) std::fclose(stdout);
  }
#else
  {
    (void)argc;
    (void)argv;
  }
#endif
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  int rank() const {
#ifdef EMBER_HAVE_MPI
    return ember::distributed::rank();
#else
    return 0;
#endif
  }
  int size() const {
#ifdef EMBER_HAVE_MPI
    return ember::distributed::world_size();
#else
    return 1;
#endif
  }
  bool is_main() const { return rank() == 0; }

  // The program's exit status, for `return session.finish(status);`: a failure ends every rank
  // of the job at once (the others may be waiting for this one in a collective).
  int finish(int status) {
#ifdef EMBER_HAVE_MPI
    if (status != 0 && size() > 1) ember::distributed::abort(status);
#endif
    return status;
  }

 private:
#ifdef EMBER_HAVE_MPI
  ember::distributed::Guard mpi_;  // finalises when main returns
#endif
};

// v summed over the ranks (v itself in a world of one).
inline double sum(double v) {
#ifdef EMBER_HAVE_MPI
  ember::Tensor t = ember::scalar_tensor(v, ember::kFloat64);
  ember::distributed::all_reduce(t);
  return t.item<double>();
#else
  return v;
#endif
}

// Rank 0's v on every rank: a decision rank 0 alone can make (early stopping on its evaluation)
// that every rank must follow.
inline double from_main(double v) {
#ifdef EMBER_HAVE_MPI
  ember::Tensor t = ember::scalar_tensor(v, ember::kFloat64);
  ember::distributed::broadcast(t, 0);
  return t.item<double>();
#else
  return v;
#endif
}

// The model trained data-parallel: its gradients averaged over the ranks after each backward,
// rank 0's weights on every rank from the start. Nothing in a world of one.
class Replica {
 public:
  explicit Replica(std::shared_ptr<ember::nn::Module> model) {
#ifdef EMBER_HAVE_MPI
    if (ember::distributed::is_initialized())
      ddp_ = std::make_unique<ember::distributed::DistributedDataParallel>(std::move(model));
#else
    (void)model;
#endif
  }

 private:
#ifdef EMBER_HAVE_MPI
  std::unique_ptr<ember::distributed::DistributedDataParallel> ddp_;
#endif
};

// Rows [B r / N, B (r + 1) / N) of a global batch of B rows: rank r's share (sizes differ by one
// at most; every rank needs B >= N). ntokens counts the share's targets that are not `pad`.
inline ember::nn::Batch shard(const ember::nn::Batch& batch, int64_t pad, int rank, int size) {
  const int64_t B = batch.src.size(0), lo = B * rank / size, hi = B * (rank + 1) / size;
  if (rank == 0 && size == 1) return batch;
  ember::nn::Batch mine = batch;
  const auto rows = [&](const ember::Tensor& t) {
    return t.defined() && t.dim() > 0 && t.size(0) == B ? t.narrow(0, lo, hi - lo) : t;
  };
  mine.src = rows(batch.src);
  mine.src_mask = rows(batch.src_mask);
  mine.tgt = rows(batch.tgt);
  mine.tgt_y = rows(batch.tgt_y);
  mine.tgt_mask = rows(batch.tgt_mask);
  mine.ntokens = 0;
  if (mine.tgt_y.defined())
    for (const int64_t token : mine.tgt_y.to_vector<int64_t>()) mine.ntokens += token != pad;
  return mine;
}

}  // namespace data_parallel
