// Data-parallel training steps (issue 15): the copy-task step A (N=2, d_model=512, a global batch
// of 80 rows of 10 tokens, dropout 0.1, Adam + the rate schedule: bench/transformer_steps.cpp's
// workload) and an epoch of the small copy model (step B's model, 20 batches of 80), run by one
// process or under `mpirun -np N` with DistributedDataParallel, each rank on 80 / N rows.
// bench/ddp.sh runs it as 1 process x 2 threads and 2 processes x 1 thread.
//
// For each: wall time per step (median over the timed steps, taken with the profiler off); then,
// in a second pass with the profiler on and the ranks meeting before each backward, the time per
// step that backward spent waiting at its end for the all-reduces it had not finished
// ("ddp_allreduce_wait") and copying gradients in and out of the buckets ("ddp_copy"); and, for
// comparison, a blocking all-reduce of the same bytes alone (all gradients, in 25 MiB pieces). What
// the overlap hides is the part of the lone all-reduce that backward did not wait for.
//
//   ddp_bench [--workload A|epoch|all] [--steps S] [--threads T]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "distributed/distributed.h"
#include "ember.h"
#include "examples/copy_task.h"

using namespace ember;
using Clock = std::chrono::steady_clock;

namespace {

struct Workload {
  std::string name;
  int64_t layers, d_model, d_ff, heads;
  double dropout;
  int64_t batch, batches;  // global rows per step, steps per timed unit (an epoch for "epoch")
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

double profiled_ms(const char* name) {
  for (const profile::Entry& e : profile::entries())
    if (e.name == name) return e.total_ms;
  return 0;
}

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

void run(const Workload& w, int64_t units) {
  const int rank = distributed::rank(), world = distributed::world_size();
  manual_seed(0);
  auto model = nn::make_model(11, 11, w.layers, w.d_model, w.d_ff, w.heads, w.dropout);
  model->train();
  distributed::DistributedDataParallel ddp(model);
  nn::LabelSmoothing criterion(11, 0, 0.1);
  copy_task::SimpleLossCompute loss_compute(*model->generator, criterion);
  optim::Adam optimizer(model->parameters(), {.lr = 0.5, .beta1 = 0.9, .beta2 = 0.98, .eps = 1e-9});
  const int64_t d_model = w.d_model;
  optim::LambdaLR scheduler(
      optimizer, [d_model](int64_t step) { return optim::rate(step, d_model, 1.0, 400); });
  // Every rank draws the same global batches and trains on its rows.
  const std::vector<nn::Batch> batches = copy_task::data_gen(11, w.batch, w.batches);
  const int64_t lo = w.batch * rank / world, hi = w.batch * (rank + 1) / world;
  std::vector<nn::Batch> mine;
  for (const nn::Batch& b : batches) {
    const Tensor rows = b.src.narrow(0, lo, hi - lo).contiguous();
    mine.emplace_back(rows, rows, 0);
  }
  // One step (A), or one epoch. `aligned`: the ranks meet before each backward, so that the wait
  // at its end is communication alone, not one rank's forward running late on a busy machine.
  const auto unit = [&](bool aligned) {
    for (size_t i = 0; i < mine.size(); ++i) {
      const nn::Batch& b = mine[i];
      const Tensor out = model->forward(b.src, b.tgt, b.src_mask, b.tgt_mask);
      const Tensor loss =
          loss_compute(out, b.tgt_y, static_cast<double>(batches[i].ntokens) / world).loss;
      if (aligned) distributed::barrier();
      loss.backward();
      optimizer.step();
      optimizer.zero_grad();
      scheduler.step();
    }
  };

  unit(false);  // warm-up
  std::vector<double> times;
  for (int64_t u = 0; u < units; ++u) {
    distributed::barrier();
    const auto t0 = Clock::now();
    unit(false);
    times.push_back(seconds_since(t0));
  }
  profile::reset();
  profile::enable();
  for (int64_t u = 0; u < units; ++u) unit(true);
  profile::disable();
  const double steps = static_cast<double>(units * w.batches);
  const double wait_ms = profiled_ms("ddp_allreduce_wait") / steps;
  const double copy_ms = profiled_ms("ddp_copy") / steps;
  profile::reset();  // nothing left for the profiler's report at exit

  // The same bytes all-reduced alone, blocking, in the buckets' 25 MiB pieces.
  int64_t numel = 0;
  for (const Tensor& p : model->parameters()) numel += p.numel();
  std::vector<double> alone;
  if (distributed::is_initialized()) {
    Tensor flat = zeros({numel});
    const int64_t piece = 25 * 1024 * 1024 / 4;
    for (int r = 0; r < 5; ++r) {
      distributed::barrier();
      const auto t0 = Clock::now();
      for (int64_t at = 0; at < numel; at += piece) {
        Tensor part = flat.narrow(0, at, std::min(piece, numel - at));
        distributed::all_reduce(part);
      }
      alone.push_back(seconds_since(t0));
    }
  }
  const double alone_ms = alone.empty() ? 0 : 1e3 * median(alone);
  const double per_step_ms = 1e3 * median(times) / static_cast<double>(w.batches);
  fmt::print(
      "{:<6} | {} process(es) x {} thread(s) | {:.2f} M parameters | step {:.1f} ms (median of "
      "{}{}) | waiting {:.1f} ms | bucket copies {:.1f} ms | all-reduce alone {:.1f} ms | hidden "
      "{}\n",
      w.name, world, get_num_threads(), numel / 1e6, per_step_ms, units,
      w.batches > 1 ? fmt::format(" epochs of {} steps", w.batches) : " steps", wait_ms, copy_ms,
      alone_ms,
      alone_ms > 0 ? fmt::format("{:.0f}%", 100 * std::max(0.0, 1 - wait_ms / alone_ms)) : "-");
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  distributed::Guard mpi(&argc, &argv);
  std::string which = "all";
  int64_t steps = 10;
  int threads = 1;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--workload") == 0)
      which = argv[i + 1];
    else if (std::strcmp(argv[i], "--steps") == 0)
      steps = std::max(1, std::atoi(argv[i + 1]));
    else if (std::strcmp(argv[i], "--threads") == 0)
      threads = std::max(1, std::atoi(argv[i + 1]));
  }
  set_num_threads(threads);
  if (distributed::rank() != 0 && std::freopen("/dev/null", "w", stdout) == nullptr) return 1;
  if (which == "A" || which == "all") run({"A", 2, 512, 2048, 8, 0.1, 80, 1}, steps);
  if (which == "epoch" || which == "all")
    run({"epoch", 2, 64, 256, 4, 0.1, 80, 20}, std::max<int64_t>(2, steps / 4));
  return 0;
}
