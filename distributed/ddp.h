// DistributedDataParallel: data-parallel training over MPI, as torch's DDP. Every rank holds the
// same model and runs forward and backward on its share of the global batch; when backward
// returns, each parameter's .grad is the mean of the ranks' gradients, so the optimizer steps
// keep the replicas identical.
//
//   distributed::Guard mpi(&argc, &argv);
//   auto model = nn::make_model(...);
//   distributed::DistributedDataParallel ddp(model);     // rank 0's parameters on every rank
//   optim::Adam optimizer(model->parameters(), ...);
//   for (...) { loss(model->forward(my_share)).backward(); optimizer.step(); ... }
//
// Note [Gradient buckets]
// The trainable parameters are cut, in reverse registration order (a guess at the order backward
// produces their gradients), into buckets of about bucket_cap_mb each (one dtype per bucket; a
// parameter larger than the cap is a bucket of its own). After the first synchronised backward
// they are cut again in the order rank 0's gradients arrived in it, as torch rebuilds its
// buckets, so that each bucket fills up as early as it can. Each parameter has a
// post-accumulate-grad hook (graph/autograd.h): when backward has accumulated its gradient, the
// hook copies it into its bucket's buffer, and a bucket whose gradients are all in starts a
// non-blocking MPI_Iallreduce, so the sums travel while backward computes the earlier layers.
// Buckets start in index order, the same on every rank, as MPI requires. The first hook of a
// backward queues an end-of-backward callback (autograd/engine.h's queue_callback) that fills in
// the parameters no gradient reached (zeros: every rank then makes the same calls), starts the
// remaining buckets, waits for all (profiler scope "ddp_allreduce_wait") and copies the means back
// into .grad, all before backward returns. The buffer of each bucket carries, after the gradients,
// one count per parameter of the ranks that had a gradient for it: a parameter that no rank used
// keeps an undefined .grad, as without DDP, so the optimizer skips it.
//
// Every rank runs the same synchronised backwards in the same order, each reaching at least one
// of the model's parameters (a backward that reaches none makes no MPI call, and the other ranks
// would wait for it), as every rank makes the same collectives.
//
// MPI's non-blocking collectives advance only inside MPI calls (OpenMPI has no progress thread by
// default), so each hook also tests the buckets in flight. All MPI calls stay on the thread that
// initialised MPI: backward must run there (Note [Threads and MPI] in collectives.h).
//
// Not initialised (one process, no mpirun), DDP broadcasts nothing and installs no hook: the
// model trains exactly as without it. Under `mpirun -np 1` it takes the whole path and gives
// bit-identical results.
#pragma once

#include <memory>
#include <vector>

#include "distributed/collectives.h"
#include "nn/module.h"

namespace ember::distributed {

struct DDPOptions {
  double bucket_cap_mb = 25;  // MiB of gradients per bucket (torch's default)
};

class DistributedDataParallel {
 public:
  // Broadcasts the module's parameters and buffers from rank 0 (every rank's module must have the
  // same names, dtypes and shapes: the handshake names the first that differs) and hooks the
  // trainable parameters. Every rank constructs it at the same point, as any collective.
  explicit DistributedDataParallel(std::shared_ptr<nn::Module> module, DDPOptions options = {});
  // Removes the hooks.
  ~DistributedDataParallel();
  DistributedDataParallel(const DistributedDataParallel&) = delete;
  DistributedDataParallel& operator=(const DistributedDataParallel&) = delete;

  const std::shared_ptr<nn::Module>& module() const;

  // RAII (torch's no_sync): while alive, backward only accumulates gradients locally; the first
  // backward after it all-reduces the accumulated sums. `auto g = ddp.no_sync();`
  class NoSyncGuard {
   public:
    explicit NoSyncGuard(DistributedDataParallel& ddp);
    ~NoSyncGuard();
    NoSyncGuard(const NoSyncGuard&) = delete;
    NoSyncGuard& operator=(const NoSyncGuard&) = delete;

   private:
    DistributedDataParallel& ddp_;
    bool previous_;
  };
  [[nodiscard]] NoSyncGuard no_sync() { return NoSyncGuard(*this); }

  // The buckets, in the order they are all-reduced: each lists indices into
  // module()->parameters() (trainable ones only); the layout changes once, after the first
  // synchronised backward (Note [Gradient buckets]). Empty when not initialised.
  std::vector<std::vector<size_t>> buckets() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ember::distributed
