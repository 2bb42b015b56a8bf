// DistributedDataParallel: the bucketed, overlapped gradient all-reduce of Note [Gradient buckets]
// (distributed/ddp.h).
#include "distributed/ddp.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <map>

#include "autograd/engine.h"
#include "distributed/mpi_util.h"
#include "graph/autograd.h"
#include "graph/creation.h"
#include "graph/profile.h"
#include "graph/strided.h"

namespace ember::distributed {

using detail::check_mpi;

namespace {

constexpr std::string_view kOp = "DistributedDataParallel";

// A run of parameters whose gradients travel in one MPI_Iallreduce. buffer holds the gradients
// (numel elements, each parameter's at its offset), then one count per parameter: 1 when this
// rank had a gradient for it, so that after the sum it says how many ranks had one.
struct Bucket {
  DType dtype = kFloat32;
  std::vector<size_t> params;  // indices into Impl::params
  std::vector<int64_t> offsets;
  int64_t numel = 0;
  Tensor buffer;
  size_t pending = 0;  // parameters whose gradient this backward has not delivered yet
};

}  // namespace

struct DistributedDataParallel::Impl {
  std::shared_ptr<nn::Module> module;
  std::vector<Tensor> params;  // module->parameters()
  std::vector<std::string> names;
  std::vector<Bucket> buckets;
  std::vector<MPI_Request> requests;  // one per bucket, parallel to buckets
  // Where each parameter's gradient goes: (bucket, position in it); frozen ones have none.
  std::vector<std::pair<size_t, size_t>> slot;
  std::vector<char> ready;      // the parameter's gradient is in its bucket, this backward
  std::vector<size_t> arrival;  // the parameters in the order their gradients came, this backward
  bool rebuilt = false;         // the buckets follow the first backward's arrival order
  double cap_mb = 25;
  size_t next_launch = 0;    // buckets [0, next_launch) are in flight
  bool sync = true;          // false under no_sync()
  bool in_backward = false;  // a backward has started syncing: its finish() is queued
  std::weak_ptr<int> token;  // alive while that finish() is queued
  MPI_Comm comm = MPI_COMM_NULL;
  int world = 1;

  Impl() = default;
  ~Impl();
  Impl(const Impl&) = delete;
  Impl& operator=(const Impl&) = delete;

  void assign_buckets(const std::vector<size_t>& order);
  void rebuild_buckets();
  void on_gradient(size_t i);
  void pack(size_t i);
  void launch_ready();
  void poll();
  void finish();
  void unpack(const Bucket& b);
  void reset();
};

// Note [Gradient buckets]: the trainable parameters in `order`, one open bucket per dtype, closed
// once it holds cap_mb.
void DistributedDataParallel::Impl::assign_buckets(const std::vector<size_t>& order) {
  const double cap_bytes = cap_mb * 1024 * 1024;
  std::map<DType, size_t> open;
  buckets.clear();
  slot.assign(params.size(), {SIZE_MAX, 0});
  for (const size_t i : order) {
    const Tensor& p = params[i];
    auto it = open.find(p.dtype());
    if (it == open.end()) {
      it = open.emplace(p.dtype(), buckets.size()).first;
      buckets.emplace_back().dtype = p.dtype();
    }
    Bucket& b = buckets[it->second];
    slot[i] = {it->second, b.params.size()};
    b.params.push_back(i);
    b.offsets.push_back(b.numel);
    b.numel += p.numel();
    if (static_cast<double>(b.numel) * static_cast<double>(element_size(b.dtype)) >= cap_bytes)
      open.erase(it);
  }
  for (Bucket& b : buckets) {
    const int64_t n = b.numel + static_cast<int64_t>(b.params.size());
    EMBER_CHECK(n <= INT_MAX,
                "{}: a bucket of {} elements is more than one MPI call can carry ({}); a "
                "parameter that large is not supported",
                kOp, n, INT_MAX);
    b.buffer = zeros({n}, b.dtype);
  }
  requests.assign(buckets.size(), MPI_REQUEST_NULL);
}

// Note [Gradient buckets]: after the first synchronised backward, the buckets follow the order in
// which rank 0's gradients arrived (torch's bucket rebuild), the parameters that got none last.
// Reverse registration order only guesses it: the copy model registers its embeddings after the
// decoder, yet their gradients come last, and the bucket holding them held back every later one.
void DistributedDataParallel::Impl::rebuild_buckets() {
  rebuilt = true;
  std::vector<int64_t> order(arrival.begin(), arrival.end());
  for (size_t i = params.size(); i-- > 0;)
    if (slot[i].first != SIZE_MAX && std::find(arrival.begin(), arrival.end(), i) == arrival.end())
      order.push_back(static_cast<int64_t>(i));
  check_mpi(MPI_Bcast(order.data(), static_cast<int>(order.size()), MPI_INT64_T, 0, comm), kOp);
  assign_buckets(std::vector<size_t>(order.begin(), order.end()));
}

void DistributedDataParallel::Impl::reset() {
  ready.assign(params.size(), 0);
  arrival.clear();
  for (Bucket& b : buckets) b.pending = b.params.size();
  next_launch = 0;
  in_backward = false;
}

// The hook of parameter i: its gradient for this backward is complete.
void DistributedDataParallel::Impl::on_gradient(size_t i) {
  if (!sync) return;
  detail::check_thread(kOp);
  if (!in_backward) {
    EMBER_CHECK(is_initialized(), "{}: backward after distributed::finalize()", kOp);
    auto alive = std::make_shared<int>(0);
    token = alive;
    in_backward = true;
    queue_callback([this, alive] { finish(); });
  } else {
    EMBER_CHECK(!token.expired(),
                "{}: an earlier backward (rank {}) stopped with an exception after its gradient "
                "all-reduce began; the ranks are out of step, end the job (distributed::abort)",
                kOp, rank());
  }
  EMBER_CHECK(!ready[i], "{}: parameter '{}' received its gradient twice in one backward", kOp,
              names[i]);
  pack(i);
  arrival.push_back(i);
  if (--buckets[slot[i].first].pending == 0)
    launch_ready();
  else
    poll();
}

// Copies parameter i's gradient (zeros when it has none) and its count into its bucket.
void DistributedDataParallel::Impl::pack(size_t i) {
  profile::Scope scope("ddp_copy");
  Bucket& b = buckets[slot[i].first];
  const size_t k = slot[i].second;
  const Tensor& p = params[i];
  const Tensor g = p.grad();
  const int64_t n = (k + 1 < b.offsets.size() ? b.offsets[k + 1] : b.numel) - b.offsets[k];
  EMBER_CHECK(p.dtype() == b.dtype && p.numel() == n && (!g.defined() || g.dtype() == b.dtype),
              "{}: parameter '{}' is {} of shape {} (gradient {}), but it was wrapped as {} of {} "
              "elements (was the module changed after wrapping?)",
              kOp, names[i], p.dtype(), p.shape(), g.defined() ? dtype_name(g.dtype()) : "none",
              b.dtype, n);
  dispatch_float(b.dtype, kOp, [&]<class T>() {
    T* data = b.buffer.data<T>();
    T* dst = data + b.offsets[k];
    const Tensor c = g.defined() ? g.contiguous() : Tensor();
    const T* src = g.defined() ? c.data<T>() : nullptr;
    parallel_for(n, [&](int64_t begin, int64_t end) {
      if (src != nullptr)
        std::copy(src + begin, src + end, dst + begin);
      else
        std::fill(dst + begin, dst + end, T(0));
    });
    data[b.numel + static_cast<int64_t>(k)] = g.defined() ? T(1) : T(0);
  });
  ready[i] = 1;
}

// Starts, in index order, every bucket whose gradients are all in.
void DistributedDataParallel::Impl::launch_ready() {
  while (next_launch < buckets.size() && buckets[next_launch].pending == 0) {
    Bucket& b = buckets[next_launch];
    profile::Scope scope("ddp_allreduce_start");
    check_mpi(
        MPI_Iallreduce(MPI_IN_PLACE, detail::bytes(b.buffer), static_cast<int>(b.buffer.numel()),
                       detail::mpi_type(b.dtype, kOp), MPI_SUM, comm, &requests[next_launch]),
        kOp);
    ++next_launch;
  }
  poll();
}

// Lets MPI advance the buckets in flight (Note [Gradient buckets]: no progress thread).
void DistributedDataParallel::Impl::poll() {
  if (next_launch == 0) return;
  int done = 0;
  check_mpi(MPI_Testall(static_cast<int>(next_launch), requests.data(), &done, MPI_STATUSES_IGNORE),
            kOp);
}

// The end-of-backward callback: the parameters no gradient reached, the remaining buckets, the
// wait, and the means back into .grad.
void DistributedDataParallel::Impl::finish() {
  for (size_t i = 0; i < params.size(); ++i) {
    if (slot[i].first == SIZE_MAX || ready[i]) continue;
    pack(i);
    --buckets[slot[i].first].pending;
  }
  launch_ready();
  {
    profile::Scope scope("ddp_allreduce_wait");
    check_mpi(MPI_Waitall(static_cast<int>(requests.size()), requests.data(), MPI_STATUSES_IGNORE),
              kOp);
  }
  for (const Bucket& b : buckets) unpack(b);
  if (!rebuilt) rebuild_buckets();
  reset();
}

// Each parameter's .grad becomes the sum over ranks / world; one that no rank had a gradient
// for keeps an undefined .grad.
void DistributedDataParallel::Impl::unpack(const Bucket& b) {
  profile::Scope scope("ddp_copy");
  dispatch_float(b.dtype, kOp, [&]<class T>() {
    const T* data = b.buffer.data<T>();
    for (size_t k = 0; k < b.params.size(); ++k) {
      if (data[b.numel + static_cast<int64_t>(k)] == T(0)) continue;
      const Tensor& p = params[b.params[k]];
      Tensor g = p.grad();
      if (!g.defined() || !g.is_contiguous()) {
        g = empty(p.shape(), b.dtype);
        p.set_grad(g);
      }
      const T* src = data + b.offsets[k];
      T* dst = g.data<T>();
      const T n = static_cast<T>(world);
      parallel_for(p.numel(), [&](int64_t begin, int64_t end) {
        for (int64_t j = begin; j < end; ++j) dst[j] = src[j] / n;
      });
      g.impl()->storage->bump_version();
    }
  });
}

DistributedDataParallel::DistributedDataParallel(std::shared_ptr<nn::Module> module,
                                                 DDPOptions options)
    : impl_(std::make_unique<Impl>()) {
  EMBER_CHECK(module != nullptr, "{}: null module", kOp);
  EMBER_CHECK(std::isfinite(options.bucket_cap_mb) && options.bucket_cap_mb > 0,
              "{}: bucket_cap_mb must be a positive number, got {}", kOp, options.bucket_cap_mb);
  Impl& d = *impl_;
  d.module = std::move(module);
  if (!is_initialized()) return;  // one process: nothing to average
  detail::check_thread(kOp);
  d.world = world_size();

  // Rank 0's parameters and buffers everywhere: first the counts, then each tensor, whose
  // handshake names the first that differs.
  const nn::NamedTensors named = d.module->named_parameters();
  const nn::NamedTensors buffers = d.module->named_buffers();
  for (const auto& [name, p] : named)
    EMBER_CHECK(!p.impl()->post_accumulate_grad_hook,
                "{}: parameter '{}' already has a post-accumulate-grad hook (is the module "
                "wrapped twice?)",
                kOp, name);
  int64_t trainable = 0;
  for (const auto& [name, p] : named) trainable += p.requires_grad();
  const Tensor counts =
      from_vector(std::vector<int64_t>{static_cast<int64_t>(named.size()), trainable,
                                       static_cast<int64_t>(buffers.size())},
                  {3});
  const std::vector<Tensor> all = all_gather(counts);
  for (int r = 1; r < d.world; ++r)
    EMBER_CHECK(all[r].to_vector<int64_t>() == all[0].to_vector<int64_t>(),
                "{}: rank {}'s module has {} parameters ({} trainable) and {} buffers, rank 0's "
                "{} ({}) and {}",
                kOp, r, all[r].to_vector<int64_t>()[0], all[r].to_vector<int64_t>()[1],
                all[r].to_vector<int64_t>()[2], all[0].to_vector<int64_t>()[0],
                all[0].to_vector<int64_t>()[1], all[0].to_vector<int64_t>()[2]);
  for (const nn::NamedTensors* list : {&named, &buffers}) {
    for (auto [name, t] : *list) {
      try {
        broadcast(t, 0);
      } catch (const Error& e) {
        throw Error(fmt::format("{}: '{}': {}", kOp, name, e.what()));
      }
    }
  }

  std::vector<size_t> reverse;
  for (const auto& [name, p] : named) {
    if (p.requires_grad()) reverse.insert(reverse.begin(), d.params.size());
    d.names.push_back(name);
    d.params.push_back(p);
  }
  d.cap_mb = options.bucket_cap_mb;
  d.assign_buckets(reverse);
  check_mpi(MPI_Comm_dup(MPI_COMM_WORLD, &d.comm), kOp);  // DDP's traffic apart from the user's
  Impl* self = impl_.get();
  for (size_t i = 0; i < d.params.size(); ++i)
    if (d.slot[i].first != SIZE_MAX)
      set_post_accumulate_grad_hook(d.params[i],
                                    [self, i](const Tensor&) { self->on_gradient(i); });
  d.reset();
}

// Removes the hooks (those set so far, when the constructor threw) and frees the communicator.
DistributedDataParallel::Impl::~Impl() {
  for (size_t i = 0; i < params.size(); ++i)
    if (slot[i].first != SIZE_MAX) params[i].impl()->post_accumulate_grad_hook = nullptr;
  const bool in_flight = std::any_of(requests.begin(), requests.end(),
                                     [](MPI_Request r) { return r != MPI_REQUEST_NULL; });
  if (in_flight) {
    // A backward stopped by an exception left all-reduces running, and the job is about to end
    // (Note [A failing rank]): waiting could hang, so their buffers stay with MPI.
    static std::vector<Tensor> kept;
    for (const Bucket& b : buckets) kept.push_back(b.buffer);
  } else if (comm != MPI_COMM_NULL && is_initialized()) {
    MPI_Comm_free(&comm);
  }
}

DistributedDataParallel::~DistributedDataParallel() = default;

const std::shared_ptr<nn::Module>& DistributedDataParallel::module() const { return impl_->module; }

std::vector<std::vector<size_t>> DistributedDataParallel::buckets() const {
  std::vector<std::vector<size_t>> out;
  for (const Bucket& b : impl_->buckets) out.push_back(b.params);
  return out;
}

DistributedDataParallel::NoSyncGuard::NoSyncGuard(DistributedDataParallel& ddp)
    : ddp_(ddp), previous_(ddp.impl_->sync) {
  ddp_.impl_->sync = false;
}

DistributedDataParallel::NoSyncGuard::~NoSyncGuard() { ddp_.impl_->sync = previous_; }

}  // namespace ember::distributed
