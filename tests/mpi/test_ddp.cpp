// DistributedDataParallel on any number of ranks N: N ranks with a batch of B/N rows each train
// to the parameters of one process with the whole batch of B (5 Adam steps; Float64 to 1e-12,
// Float32 within rounding), for a Linear net and a small transformer, with the parameters
// bit-identical across ranks after every step; the same data on every rank (or N = 1) gives bits
// identical to no DDP; bucket layouts (several buckets, a parameter larger than a bucket) change
// no bit; unused parameters; no_sync; rank 0's weights at construction; and the errors.
#include <thread>

#include "distributed/distributed.h"
#include "examples/copy_task.h"
#include "helpers.h"
#include "mpi_helpers.h"

using namespace ember;
using namespace ember::testing;
namespace dist = ember::distributed;
using dist::DistributedDataParallel;

namespace {

constexpr int64_t kSteps = 5;

// Rows [lo, hi) of B that are rank r's of n: sizes differ by one at most.
std::pair<int64_t, int64_t> share(int64_t B, int r, int n) { return {B * r / n, B * (r + 1) / n}; }

std::shared_ptr<nn::Sequential> mlp(DType dtype) {
  auto m = std::make_shared<nn::Sequential>(std::make_shared<nn::Linear>(5, 8),
                                            std::make_shared<nn::Tanh>(),
                                            std::make_shared<nn::Linear>(8, 3));
  m->to(dtype);
  return m;
}

void expect_params_close(const nn::Module& a, const nn::Module& b, double atol,
                         const std::string& what) {
  const auto pa = a.named_parameters(), pb = b.named_parameters();
  BOOST_TEST(pa.size() == pb.size());
  for (size_t i = 0; i < std::min(pa.size(), pb.size()); ++i)
    expect_close(pa[i].second, pb[i].second, 0, atol, what + " " + pa[i].first);
}

bool params_identical(const nn::Module& a, const nn::Module& b) {
  const auto pa = a.parameters(), pb = b.parameters();
  bool same = pa.size() == pb.size();
  for (size_t i = 0; same && i < pa.size(); ++i) same = identical(pa[i], pb[i]);
  return same;
}

// kSteps Adam steps of the MLP on rows [lo, hi) of (x, y), mean squared error. With `ddp`, the
// parameters are checked to be the same bits on every rank after every step.
void train_mlp(nn::Sequential& model, const Tensor& x, const Tensor& y, int64_t lo, int64_t hi,
               DistributedDataParallel* ddp) {
  optim::Adam optimizer(model.parameters(), {.lr = 0.01});
  for (int64_t step = 0; step < kSteps; ++step) {
    mse_loss(model.forward(x.narrow(0, lo, hi - lo)), y.narrow(0, lo, hi - lo)).backward();
    optimizer.step();
    optimizer.zero_grad();
    if (ddp != nullptr)
      BOOST_TEST(same_on_every_rank(model.parameters()), "after step " << step + 1);
  }
}

// The copy-task transformer of tests/test_transformer.cpp's size, without dropout.
std::shared_ptr<nn::EncoderDecoder> small_transformer(DType dtype) {
  auto m = nn::make_model(11, 11, /*N=*/2, /*d_model=*/16, /*d_ff=*/32, /*h=*/2, /*dropout=*/0.0);
  m->to(dtype);
  return m;
}

// kSteps Adam steps on rows [lo, hi) of `data` (copy-task rows), loss per target token.
// Adam's eps is 1e-4, not the copy task's 1e-9: the key projection's bias has an exactly zero
// gradient (softmax ignores a shift of a query's scores), so what backward computes for it is
// rounding noise, which differs with the batch's split and which Adam, dividing by its own
// magnitude, would turn into steps of size lr (0.01 apart in Float32) with a tiny eps.
void train_transformer(nn::EncoderDecoder& model, const Tensor& data, int64_t lo, int64_t hi,
                       DistributedDataParallel* ddp) {
  nn::LabelSmoothing criterion(11, 0, 0.1);
  copy_task::SimpleLossCompute loss_compute(*model.generator, criterion);
  optim::Adam optimizer(model.parameters(), {.lr = 0.01, .beta1 = 0.9, .beta2 = 0.98, .eps = 1e-4});
  const nn::Batch batch(data.narrow(0, lo, hi - lo).contiguous(),
                        data.narrow(0, lo, hi - lo).contiguous(), 0);
  for (int64_t step = 0; step < kSteps; ++step) {
    const Tensor out = model.forward(batch.src, batch.tgt, batch.src_mask, batch.tgt_mask);
    loss_compute(out, batch.tgt_y, batch.ntokens).loss.backward();
    optimizer.step();
    optimizer.zero_grad();
    if (ddp != nullptr)
      BOOST_TEST(same_on_every_rank(model.parameters()), "after step " << step + 1);
  }
}

// Copy-task rows: randint(1, 11), the first token 1.
Tensor copy_rows(int64_t B) { return copy_task::data_gen(11, B, 1)[0].src; }

}  // namespace

BOOST_AUTO_TEST_SUITE(test_ddp)

BOOST_AUTO_TEST_CASE(n_ranks_with_b_over_n_rows_equal_one_process_with_b_rows_linear) {
  const int r = dist::rank(), n = dist::world_size();
  for (const DType dtype : {kFloat64, kFloat32}) {
    manual_seed(1);
    const auto reference = mlp(dtype);
    const auto model = std::static_pointer_cast<nn::Sequential>(reference->clone());
    const int64_t B = 12;
    const Tensor x = randn({B, 5}, dtype), y = randn({B, 3}, dtype);
    DistributedDataParallel ddp(model);
    train_mlp(*reference, x, y, 0, B, nullptr);
    const auto [lo, hi] = share(B, r, n);
    train_mlp(*model, x, y, lo, hi, &ddp);
    expect_params_close(*model, *reference, dtype == kFloat64 ? 1e-12 : 1e-5,
                        fmt::format("{}", dtype));
  }
}

BOOST_AUTO_TEST_CASE(n_ranks_with_b_over_n_rows_equal_one_process_with_b_rows_transformer) {
  const int r = dist::rank(), n = dist::world_size();
  for (const DType dtype : {kFloat64, kFloat32}) {
    // Small buckets too: gradients then travel in several all-reduces during backward.
    for (const double cap : {25.0, 0.004}) {
      manual_seed(2);
      const auto reference = small_transformer(dtype);
      const auto model = std::static_pointer_cast<nn::EncoderDecoder>(reference->clone());
      const int64_t B = 8;
      const Tensor data = copy_rows(B);
      DistributedDataParallel ddp(model, {.bucket_cap_mb = cap});
      if (cap < 1 && dist::is_initialized()) BOOST_TEST(ddp.buckets().size() > 5u);
      train_transformer(*reference, data, 0, B, nullptr);
      const auto [lo, hi] = share(B, r, n);
      train_transformer(*model, data, lo, hi, &ddp);
      expect_params_close(*model, *reference, dtype == kFloat64 ? 1e-12 : 1e-5,
                          fmt::format("{} cap {}", dtype, cap));
    }
  }
}

// Every rank on the same rows: the mean of N equal gradients is that gradient (exactly, for
// N = 1 and 2), so DDP must change no bit; at N = 1 (mpirun -np 1) this is "world size 1 is
// bit-identical to no DDP".
BOOST_AUTO_TEST_CASE(same_rows_on_every_rank_are_bit_identical_to_no_ddp) {
  if (dist::world_size() > 2) return;
  manual_seed(3);
  const auto reference = mlp(kFloat64);
  const auto model = std::static_pointer_cast<nn::Sequential>(reference->clone());
  const Tensor x = randn({6, 5}, kFloat64), y = randn({6, 3}, kFloat64);
  DistributedDataParallel ddp(model);
  train_mlp(*reference, x, y, 0, 6, nullptr);
  train_mlp(*model, x, y, 0, 6, &ddp);
  BOOST_TEST(params_identical(*model, *reference));

  manual_seed(4);
  const auto t_reference = small_transformer(kFloat32);
  const auto t_model = std::static_pointer_cast<nn::EncoderDecoder>(t_reference->clone());
  const Tensor data = copy_rows(4);
  DistributedDataParallel t_ddp(t_model, {.bucket_cap_mb = 0.01});
  train_transformer(*t_reference, data, 0, 4, nullptr);
  train_transformer(*t_model, data, 0, 4, &t_ddp);
  BOOST_TEST(params_identical(*t_model, *t_reference));
}

// Note [Gradient buckets]: reverse registration order, closed at the cap; the layout changes no
// bit of the result.
BOOST_AUTO_TEST_CASE(bucket_layouts_change_no_bit) {
  const int r = dist::rank(), n = dist::world_size();
  // Parameters 0 weight (8, 5), 1 bias (8), 2 weight (3, 8), 3 bias (3), Float64: 320, 64, 192
  // and 24 bytes. 1e-4 MiB is 104.9 bytes: {3, 2} and {1, 0}; 1e-5 MiB (10.5 bytes) is smaller
  // than every parameter: one bucket each.
  using Layout = std::vector<std::vector<size_t>>;
  const std::vector<std::pair<double, Layout>> layouts = {
      {25, {{3, 2, 1, 0}}}, {1e-4, {{3, 2}, {1, 0}}}, {1e-5, {{3}, {2}, {1}, {0}}}};
  std::shared_ptr<nn::Sequential> first;
  for (const auto& [cap, layout] : layouts) {
    manual_seed(5);
    const auto model = mlp(kFloat64);
    const Tensor x = randn({12, 5}, kFloat64), y = randn({12, 3}, kFloat64);
    DistributedDataParallel ddp(model, {.bucket_cap_mb = cap});
    if (dist::is_initialized()) BOOST_TEST((ddp.buckets() == layout), "cap " << cap);
    const auto [lo, hi] = share(12, r, n);
    train_mlp(*model, x, y, lo, hi, &ddp);
    // Rebuilt after the first backward in the order the gradients came: the last layer's bias,
    // then its weight (linear's backward), then the first layer's.
    if (dist::is_initialized() && cap == 25) BOOST_TEST((ddp.buckets() == Layout{{3, 2, 1, 0}}));
    if (dist::is_initialized() && cap == 1e-5)
      BOOST_TEST((ddp.buckets() == Layout{{3}, {2}, {1}, {0}}));
    if (first)
      BOOST_TEST(params_identical(*model, *first), "cap " << cap);
    else
      first = model;
  }
}

namespace {

// `always` is in every rank's graph, `rank0` only in rank 0's, `never` in none.
struct Branchy : nn::Cloneable<Branchy> {
  Branchy() {
    register_module("always", always, std::make_shared<nn::Linear>(4, 2));
    register_module("rank0", rank0, std::make_shared<nn::Linear>(4, 2));
    register_module("never", never, std::make_shared<nn::Linear>(4, 2));
    to(kFloat64);
  }
  Tensor forward(const Tensor& x, bool use_rank0) const {
    const Tensor y = always->forward(x);
    return use_rank0 ? y + rank0->forward(x) : y;
  }
  std::shared_ptr<nn::Linear> always, rank0, never;
};

}  // namespace

// A parameter no gradient reached on some rank counts as zeros there (every rank makes the same
// calls); one that no rank used keeps an undefined grad, so the optimizer leaves it alone.
BOOST_AUTO_TEST_CASE(unused_parameters) {
  const int r = dist::rank(), n = dist::world_size();
  manual_seed(6);
  const auto model = std::make_shared<Branchy>();
  const Tensor x = randn({4 * n, 4}, kFloat64);
  const auto rows = [&](int q) { return x.narrow(0, 4 * q, 4); };
  // What each rank's gradients would be alone, from the same initial weights.
  std::vector<Tensor> always_w, rank0_w;
  for (int q = 0; q < n; ++q) {
    manual_seed(6);
    Branchy alone;
    alone.forward(rows(q), q == 0).pow(2).sum().backward();
    always_w.push_back(alone.always->weight.grad());
    if (q == 0) rank0_w.push_back(alone.rank0->weight.grad());
  }
  Tensor mean_always = zeros_like(always_w[0]);
  for (const Tensor& g : always_w) mean_always = mean_always + g;
  mean_always = mean_always / n;

  DistributedDataParallel ddp(model, {.bucket_cap_mb = 1e-5});  // one bucket per parameter
  model->forward(rows(r), r == 0).pow(2).sum().backward();
  expect_close(model->always->weight.grad(), mean_always, 0, 1e-12, "always");
  BOOST_TEST(model->rank0->weight.grad().defined());
  if (model->rank0->weight.grad().defined())
    expect_close(model->rank0->weight.grad(), rank0_w[0] / n, 0, 1e-12, "rank 0 only");
  BOOST_TEST(!model->never->weight.grad().defined());
  BOOST_TEST(!model->never->bias.grad().defined());

  const Tensor never_before = model->never->weight.clone();
  optim::Adam optimizer(model->parameters(), {.lr = 0.1});
  optimizer.step();
  optimizer.zero_grad();
  BOOST_TEST(identical(model->never->weight, never_before));
  BOOST_TEST(same_on_every_rank(model->parameters()));

  // A step where rank0 is unused everywhere: its grad stays undefined on every rank.
  model->forward(rows(r), false).pow(2).sum().backward();
  BOOST_TEST(!model->rank0->weight.grad().defined());
  BOOST_TEST(model->always->weight.grad().defined());
}

// no_sync: backward only accumulates locally (the bits of no DDP); the next synchronised backward
// averages the accumulated sums.
BOOST_AUTO_TEST_CASE(no_sync_accumulates_locally_then_averages) {
  const int r = dist::rank(), n = dist::world_size();
  manual_seed(7);
  const auto model = mlp(kFloat64);
  const Tensor x = randn({6 * n, 5}, kFloat64), y = randn({6 * n, 3}, kFloat64);
  // Rank q's micro-batches: rows [6q, 6q + 3) then [6q + 3, 6q + 6).
  const auto loss = [&](nn::Sequential& m, int q, int micro) {
    return mse_loss(m.forward(x.narrow(0, 6 * q + 3 * micro, 3)),
                    y.narrow(0, 6 * q + 3 * micro, 3));
  };
  std::vector<std::vector<Tensor>> first, both;  // per rank q: grads after micro 0, after both
  for (int q = 0; q < n; ++q) {
    const auto alone = std::static_pointer_cast<nn::Sequential>(model->clone());
    loss(*alone, q, 0).backward();
    first.emplace_back();
    for (const Tensor& p : alone->parameters()) first.back().push_back(p.grad().clone());
    loss(*alone, q, 1).backward();
    both.emplace_back();
    for (const Tensor& p : alone->parameters()) both.back().push_back(p.grad().clone());
  }

  DistributedDataParallel ddp(model);
  {
    auto no_sync = ddp.no_sync();
    loss(*model, r, 0).backward();
  }
  const std::vector<Tensor> params = model->parameters();
  for (size_t i = 0; i < params.size(); ++i)
    BOOST_TEST(identical(params[i].grad(), first[r][i]), "local gradient " << i);
  loss(*model, r, 1).backward();
  for (size_t i = 0; i < params.size(); ++i) {
    Tensor mean = zeros_like(both[0][i]);
    for (int q = 0; q < n; ++q) mean = mean + both[q][i];
    expect_close(params[i].grad(), mean / n, 0, 1e-12, fmt::format("averaged gradient {}", i));
  }
  BOOST_TEST(same_on_every_rank(model->parameters()));
}

BOOST_AUTO_TEST_CASE(construction_gives_every_rank_rank_0s_weights) {
  const int r = dist::rank();
  manual_seed(100 + static_cast<uint64_t>(r));  // every rank draws other weights
  const auto model = mlp(kFloat32);
  const auto before = std::static_pointer_cast<nn::Sequential>(model->clone());
  DistributedDataParallel ddp(model);
  BOOST_TEST(same_on_every_rank(model->parameters()));
  if (r == 0) BOOST_TEST(params_identical(*model, *before));
  BOOST_TEST(ddp.module() == model);
}

BOOST_AUTO_TEST_CASE(errors) {
  const int r = dist::rank(), n = dist::world_size();
  expect_error([] { DistributedDataParallel ddp(nullptr); }, {"DistributedDataParallel", "null"});
  expect_error([] { DistributedDataParallel ddp(mlp(kFloat32), {.bucket_cap_mb = 0}); },
               {"DistributedDataParallel", "bucket_cap_mb", "positive"});
  if (!dist::is_initialized()) return;

  // Wrapping a module twice would average twice.
  const auto model = mlp(kFloat32);
  DistributedDataParallel ddp(model);
  expect_error([&] { DistributedDataParallel again(model); },
               {"DistributedDataParallel", "already has a post-accumulate-grad hook"});

  // Backward on another thread: MPI is FUNNELED (Note [Threads and MPI]).
  std::string message;
  std::thread([&] {
    try {
      mse_loss(model->forward(ones({2, 5})), zeros({2, 3})).backward();
    } catch (const Error& e) {
      message = e.what();
    }
  }).join();
  BOOST_TEST(message.find("other than the one that initialised MPI") != std::string::npos, message);
  model->zero_grad();
  mse_loss(model->forward(ones({2, 5})), zeros({2, 3})).backward();  // still works here
  BOOST_TEST(same_on_every_rank({model->parameters()[0].grad()}));

  if (n < 2) return;
  // Ranks whose modules differ: the handshake names the parameter and the shapes.
  const auto odd = std::make_shared<nn::Linear>(3, 2 + r);
  expect_error([&] { DistributedDataParallel bad(odd); },
               {"DistributedDataParallel: 'weight'", "broadcast",
                "rank 0: broadcast(root 0) of "
                "Float32 [2, 3]",
                "rank 1: broadcast(root 0) of Float32 [3, 3]"});
  const auto more =
      r == 0 ? std::make_shared<nn::Sequential>(std::make_shared<nn::Linear>(3, 2)) : mlp(kFloat32);
  expect_error([&] { DistributedDataParallel bad(more); },
               {"DistributedDataParallel", "rank 1's module has 4 parameters", "rank 0's 2"});
}

BOOST_AUTO_TEST_SUITE_END()
