// MPI start and end, the failing-rank path, and the collectives with their handshake
// (distributed/collectives.h).
#include "distributed/collectives.h"

#include <array>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <exception>

#include "distributed/mpi_util.h"
#include "graph/autograd.h"
#include "graph/creation.h"
#include "graph/strided.h"

namespace ember::distributed {

// --- shared with ddp.cpp

namespace detail {

MPI_Datatype mpi_type(DType dtype, std::string_view op) {
  switch (dtype) {
    case kFloat32:
      return MPI_FLOAT;
    case kFloat64:
      return MPI_DOUBLE;
    case kInt64:
      return MPI_INT64_T;
    default:
      throw Error(fmt::format("{}: {} tensors are not supported (Float32, Float64 or Int64)", op,
                              dtype_name(dtype)));
  }
}

void check_mpi(int rc, std::string_view op) {
  if (rc == MPI_SUCCESS) [[likely]]
    return;
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(rc, text, &length);
  throw Error(fmt::format("{}: MPI failed on rank {}: {}", op, rank(), std::string(text, length)));
}

void check_thread(std::string_view op) {
  int level = MPI_THREAD_SINGLE, is_main = 0;
  MPI_Query_thread(&level);
  if (level == MPI_THREAD_MULTIPLE) return;
  MPI_Is_thread_main(&is_main);
  EMBER_CHECK(is_main,
              "{}: called on a thread other than the one that initialised MPI (rank {}); "
              "MPI runs with MPI_THREAD_FUNNELED, so every MPI call, backward of a "
              "DistributedDataParallel model included, must be made on that thread",
              op, rank());
}

}  // namespace detail

using detail::check_mpi;

// --- start and end

namespace {

bool launched_by_mpi() {
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMI_RANK", "PMIX_RANK"})
    if (std::getenv(name) != nullptr) return true;
  return false;
}

// Note [A failing rank]: an exception that nothing catches ends the whole job with its message.
void on_terminate() {
  std::string what = "terminate called without an active exception";
  if (const std::exception_ptr e = std::current_exception()) {
    try {
      std::rethrow_exception(e);
    } catch (const std::exception& x) {
      what = fmt::format("uncaught exception: {}", x.what());
    } catch (...) {
      what = "uncaught exception of an unknown type";
    }
  }
  std::fflush(stdout);
  fmt::print(stderr, "rank {}: {}\n", rank(), what);
  abort(1);
}

}  // namespace

void init(int* argc, char*** argv) {
  if (is_initialized()) return;
  int finalized = 0;
  MPI_Finalized(&finalized);
  EMBER_CHECK(!finalized, "distributed::init: MPI was finalized already and cannot start again");
  if (!launched_by_mpi()) return;
  int provided = MPI_THREAD_SINGLE;
  check_mpi(MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided), "distributed::init");
  std::set_terminate(on_terminate);
  EMBER_CHECK(provided >= MPI_THREAD_FUNNELED,
              "distributed::init: this MPI library gives thread level {} only; Ember needs "
              "MPI_THREAD_FUNNELED ({}) since ops run OpenMP threads",
              provided, MPI_THREAD_FUNNELED);
}

void finalize() {
  if (is_initialized()) check_mpi(MPI_Finalize(), "distributed::finalize");
}

Guard::Guard(int* argc, char*** argv) : uncaught_(std::uncaught_exceptions()) { init(argc, argv); }

Guard::~Guard() {
  // Note [A failing rank]: the other ranks may be blocked in a collective; finalising would wait.
  if (std::uncaught_exceptions() > uncaught_ && world_size() > 1) return;
  try {
    finalize();
  } catch (const std::exception& e) {
    fmt::print(stderr, "rank {}: {}\n", rank(), e.what());
  }
}

bool is_initialized() {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  return initialized && !finalized;
}

int rank() {
  int r = 0;
  if (is_initialized()) MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

int world_size() {
  int n = 1;
  if (is_initialized()) MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

void abort(int status) {
  std::fflush(stdout);
  std::fflush(stderr);
  if (is_initialized()) MPI_Abort(MPI_COMM_WORLD, status);
  std::exit(status);
}

// --- the handshake

namespace {

// What a rank is about to do, as integers every rank can compare: the collective, its argument
// (reduce op or root), then the tensor's dtype, rank and sizes (-1 without a tensor).
enum Collective : int64_t { kAllReduce = 1, kBroadcast, kAllGather, kBarrier };
constexpr size_t kHeader = 4;
using Call = std::array<int64_t, kHeader + kMaxDims>;

Call describe(Collective what, int64_t arg, const Tensor* t) {
  Call call{};
  call.fill(-1);
  call[0] = what;
  call[1] = arg;
  if (t != nullptr) {
    call[2] = static_cast<int64_t>(t->dtype());
    call[3] = t->dim();
    for (int64_t d = 0; d < t->dim(); ++d) call[kHeader + d] = t->size(d);
  }
  return call;
}

std::string to_text(const Call& call) {
  static constexpr const char* kOps[] = {"Sum", "Avg", "Max"};
  std::string text;
  switch (call[0]) {
    case kAllReduce:
      text = fmt::format("all_reduce({})", call[1] >= 0 && call[1] < 3 ? kOps[call[1]] : "?");
      break;
    case kBroadcast:
      text = fmt::format("broadcast(root {})", call[1]);
      break;
    case kAllGather:
      text = "all_gather";
      break;
    case kBarrier:
      return "barrier";
    default:
      return "an unknown call";
  }
  Shape shape(call.begin() + kHeader, call.begin() + kHeader + std::max<int64_t>(call[3], 0));
  return fmt::format("{} of {} {}", text, dtype_name(static_cast<DType>(call[2])), shape);
}

// Every rank learns every rank's call; when they differ, every rank throws the same message (no
// rank goes on to a collective the others are not in).
void handshake(std::string_view op, Collective what, int64_t arg, const Tensor* t) {
  const Call mine = describe(what, arg, t);
  const int n = world_size();
  std::vector<Call> all(static_cast<size_t>(n));
  check_mpi(MPI_Allgather(mine.data(), static_cast<int>(mine.size()), MPI_INT64_T, all.data(),
                          static_cast<int>(mine.size()), MPI_INT64_T, MPI_COMM_WORLD),
            op);
  std::vector<std::string> differ;
  for (int r = 1; r < n; ++r)
    if (all[r] != all[0] && differ.size() < 8)
      differ.push_back(fmt::format("rank {}: {}", r, to_text(all[r])));
  if (differ.empty()) return;
  throw Error(fmt::format("{}: the ranks disagree (this is rank {} of {}): rank 0: {}; {}", op,
                          rank(), n, to_text(all[0]), fmt::join(differ, "; ")));
}

// Checks a tensor a collective reads (and, when written, writes in place).
void check_tensor(const Tensor& t, std::string_view op, bool written) {
  EMBER_CHECK(t.defined(), "{}: undefined tensor", op);
  detail::mpi_type(t.dtype(), op);
  EMBER_CHECK(!written || !has_internal_overlap(t),
              "{}: the tensor of shape {} and strides {} is written in place, but several of its "
              "elements share one memory location (an expanded view); clone() it first",
              op, t.shape(), t.strides());
}

// Runs call(pointer, count) over the contiguous tensor c in pieces MPI's int count can hold.
template <class F>
void in_chunks(const Tensor& c, F&& call) {
  constexpr int64_t kChunk = int64_t{1} << 30;
  const auto size = static_cast<int64_t>(element_size(c.dtype()));
  for (int64_t done = 0; done < c.numel(); done += kChunk)
    call(detail::bytes(c) + done * size, static_cast<int>(std::min(kChunk, c.numel() - done)));
}

// t gets c's values (c is t, or its contiguous copy); either way t's version moves on.
void write_back(Tensor& t, const Tensor& c) {
  if (c.same(t)) {
    t.impl()->storage->bump_version();
    return;
  }
  NoGradGuard no_grad;
  t.copy_(c);
}

}  // namespace

// --- the collectives

void all_reduce(Tensor& t, ReduceOp op) {
  constexpr std::string_view name = "all_reduce";
  check_tensor(t, name, /*written=*/true);
  EMBER_CHECK(op != ReduceOp::Avg || is_floating(t.dtype()),
              "all_reduce: Avg needs a Float32 or Float64 tensor, got {}", t.dtype());
  if (!is_initialized()) return;  // one process: every reduction is t itself
  detail::check_thread(name);
  handshake(name, kAllReduce, static_cast<int64_t>(op), &t);
  const Tensor c = t.is_contiguous() ? t : t.contiguous();
  const MPI_Datatype type = detail::mpi_type(t.dtype(), name);
  in_chunks(c, [&](void* p, int count) {
    check_mpi(MPI_Allreduce(MPI_IN_PLACE, p, count, type, op == ReduceOp::Max ? MPI_MAX : MPI_SUM,
                            MPI_COMM_WORLD),
              name);
  });
  if (op == ReduceOp::Avg) {
    const int n = world_size();
    dispatch_float(c.dtype(), name, [&]<class T>() {
      T* p = c.data<T>();
      parallel_for(c.numel(), [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) p[i] /= static_cast<T>(n);
      });
    });
  }
  write_back(t, c);
}

void broadcast(Tensor& t, int root) {
  constexpr std::string_view name = "broadcast";
  check_tensor(t, name, /*written=*/true);
  EMBER_CHECK(root >= 0 && root < world_size(), "broadcast: root {} out of range for {} ranks",
              root, world_size());
  if (!is_initialized()) return;
  detail::check_thread(name);
  handshake(name, kBroadcast, root, &t);
  const Tensor c = t.is_contiguous() ? t : t.contiguous();
  const MPI_Datatype type = detail::mpi_type(t.dtype(), name);
  in_chunks(c, [&](void* p, int count) {
    check_mpi(MPI_Bcast(p, count, type, root, MPI_COMM_WORLD), name);
  });
  if (rank() != root) write_back(t, c);
}

std::vector<Tensor> all_gather(const Tensor& t) {
  constexpr std::string_view name = "all_gather";
  check_tensor(t, name, /*written=*/false);
  if (!is_initialized()) return {t.contiguous().clone()};
  detail::check_thread(name);
  handshake(name, kAllGather, 0, &t);
  EMBER_CHECK(t.numel() <= INT_MAX, "all_gather: {} elements per rank, more than MPI's count {}",
              t.numel(), INT_MAX);
  const Tensor c = t.contiguous();
  const int n = world_size();
  const auto count = static_cast<int>(t.numel());
  const MPI_Datatype type = detail::mpi_type(t.dtype(), name);
  const Tensor all = empty({n * t.numel()}, t.dtype());
  check_mpi(
      MPI_Allgather(detail::bytes(c), count, type, detail::bytes(all), count, type, MPI_COMM_WORLD),
      name);
  std::vector<Tensor> out;
  for (int r = 0; r < n; ++r)
    out.push_back(all.narrow(0, r * t.numel(), t.numel()).view(t.shape()));
  return out;
}

void barrier() {
  constexpr std::string_view name = "barrier";
  if (!is_initialized()) return;
  detail::check_thread(name);
  handshake(name, kBarrier, 0, nullptr);
  check_mpi(MPI_Barrier(MPI_COMM_WORLD), name);
}

}  // namespace ember::distributed
