// ember_bench: Ember's side of the benchmark suite (issue 7). Each workload has a twin with the
// same shapes, steps and timing method in bench/pytorch/bench_torch.py; bench/compare.py joins
// the two JSON files into one table and bench/run.sh runs both at 1 and 2 threads.
//
//   ember_bench [--threads N] [--filter substr]... [--exact name]... [--json out.json] [--time s]
//               [--matmul-precision highest|high|medium] [--device cpu|cuda] [--list] [--smoke]
//
// --device cuda runs the workloads that can run on a GPU there (the transformer steps and the
// second-order rows, and the steps' products alone), each timed sample ending in a wait for the
// device; before the timing it counts what a steady-state step asks of the device (kernels,
// products, host waits, cudaMalloc calls: bench_torch.py's twin has no such books).
//
// Workloads: op level forward+backward (softmax, layer_norm, bmm, linear, causal attention, and
// elementwise math functions, also forward alone), the per-op overhead of `x + 1` on one element, a
// sgemm reference rate, one epoch of D2L's parametric Nadaraya-Watson regression, and
// (bench/transformer_steps.cpp) Annotated Transformer training steps.
#include <sys/resource.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <string>
#include <string_view>
#include <utility>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "bench/harness.h"
#include "ember.h"

namespace ember::bench {

std::vector<Workload>& registry() {
  static std::vector<Workload> workloads;
  return workloads;
}

namespace {

void add(std::string name, double flops, std::function<std::function<void()>(bool)> make,
         double bytes = 0) {
  registry().push_back({std::move(name), flops, std::move(make), bytes});
}

// Bytes of `passes` passes over a Float32 tensor of `elements` (a read or a write each).
constexpr double passes(int count, double elements) { return count * 4.0 * elements; }

// A leaf of `shape` with values ~ U(-1, 1) that requires grad.
Tensor leaf(const Shape& shape) { return (rand(shape) * 2 - 1).requires_grad_(); }

// y = f(inputs); y.backward(grad_out) with a fixed random grad_out; the inputs' grads are
// dropped after each step (set_to_none), so every step does the same work.
std::function<void()> forward_backward(std::vector<Tensor> inputs,
                                       std::function<Tensor(const std::vector<Tensor>&)> f,
                                       const Shape& out_shape) {
  Tensor grad_out = rand(out_shape);
  return [inputs = std::move(inputs), f = std::move(f), grad_out] {
    f(inputs).backward(grad_out);
    for (const Tensor& t : inputs) t.set_grad(Tensor());
  };
}

}  // namespace

// --- op level: forward + backward of the hot ops, and the per-op overhead

void add_op_workloads() {
  // The memory bandwidth the rows below are held against (issue 17): STREAM's triad, in place
  // (b += s·c, torch's add_ with alpha: read b and c, write b), over arrays of 128 MB, each at
  // least 4x the last-level cache as STREAM requires (32 MB on the machines here), so that no
  // thread count is served by the L3; in place, as a fresh output that large would be a new
  // mapping page-faulted in every step.
  constexpr int64_t kTriad = int64_t{1} << 25;
  add(
      "bandwidth/triad b += s*c (2^25 floats)", 0,
      [](bool tiny) {
        Tensor b = rand({tiny ? 8 : kTriad}), c = rand({tiny ? 8 : kTriad});
        return std::function<void()>([b, c]() mutable { b.add_(c, 3.0); });
      },
      passes(3, kTriad));
  // Forward + backward passes: softmax and layer_norm read x and write y, then read dy and y
  // (x) and write dx: 5; dropout 4 (x, y, dy, dx; its mask of a byte an element, a quarter
  // pass written and one read, not counted: a regenerated mask needs none).
  add(
      "op/softmax (64,8,32,32) dim -1", 0,
      [](bool tiny) {
        const Shape s = tiny ? Shape{2, 2, 4, 4} : Shape{64, 8, 32, 32};
        return forward_backward(
            {leaf(s)}, [](auto& v) { return softmax(v[0], -1); }, s);
      },
      passes(5, 64 * 8 * 32 * 32));
  add(
      "op/layer_norm (1024,512)", 0,
      [](bool tiny) {
        const int64_t m = tiny ? 4 : 1024, n = tiny ? 8 : 512;
        return forward_backward(
            {leaf({m, n}), ones({n}).requires_grad_(), zeros({n}).requires_grad_()},
            [n](auto& v) { return layer_norm(v[0], {n}, v[1], v[2]); }, {m, n});
      },
      passes(5, 1024 * 512));
  add(
      "op/dropout p=0.1 (1024,512)", 0,
      [](bool tiny) {
        const int64_t m = tiny ? 4 : 1024, n = tiny ? 8 : 512;
        return forward_backward({leaf({m, n})}, [](auto& v) { return dropout(v[0], 0.1, true); },
                                {m, n});
      },
      passes(4, 1024 * 512));
  // Forward m·n·k multiply-adds, backward twice that: 3 · 2mnk per matrix.
  add("op/bmm (256,32,64)x(256,64,32)", 3.0 * 2 * 256 * 32 * 64 * 32, [](bool tiny) {
    const int64_t b = tiny ? 2 : 256;
    return forward_backward({leaf({b, 32, 64}), leaf({b, 64, 32})},
                            [](auto& v) { return bmm(v[0], v[1]); }, {b, 32, 32});
  });
  add("op/linear 512->2048 on (1024,512)", 3.0 * 2 * 1024 * 512 * 2048, [](bool tiny) {
    const int64_t m = tiny ? 4 : 1024, k = tiny ? 8 : 512, n = tiny ? 16 : 2048;
    return forward_backward({leaf({m, k}), leaf({n, k}), leaf({n})},
                            [](auto& v) { return linear(v[0], v[1], v[2]); }, {m, n});
  });
  // The GPT-style char LM's causal attention (batch 12, heads 4, T 64, head dim 32): two
  // products forward, four backward, 2·T·T·d each per head. PyTorch's side (1.13, before
  // F.scaled_dot_product_attention) is the math formula with a precomputed causal mask.
  add("op/sdpa causal (12,4,64,32)", 3.0 * 2 * 2 * 48 * 64 * 64 * 32, [](bool tiny) {
    const Shape s = tiny ? Shape{1, 2, 4, 2} : Shape{12, 4, 64, 32};
    return forward_backward(
        {leaf(s), leaf(s), leaf(s)},
        [](auto& v) { return scaled_dot_product_attention(v[0], v[1], v[2], {}, 0.0, true); }, s);
  });
  // Elementwise math on a (12, 64, 512) Float32 activation (an attention block's size), alone
  // and forward + backward: the vectorised kernels of ops/vec_math.h. log reads U(0.5, 1.5).
  using Unary = Tensor (*)(const Tensor&);
  const std::pair<const char*, Unary> unary[] = {
      {"exp", [](const Tensor& x) { return exp(x); }},
      {"log", [](const Tensor& x) { return log(x); }},
      {"tanh", [](const Tensor& x) { return tanh(x); }},
      {"sigmoid", [](const Tensor& x) { return sigmoid(x); }},
      {"gelu", [](const Tensor& x) { return gelu(x); }},
      {"gelu tanh", [](const Tensor& x) { return gelu(x, "tanh"); }},
      {"silu", [](const Tensor& x) { return silu(x); }},
  };
  for (const auto& [name, f] : unary) {
    const bool positive = std::string_view(name) == "log";
    const auto input = [positive](const Shape& s) {
      return positive ? (rand(s) + 0.5).requires_grad_() : leaf(s);
    };
    add(fmt::format("op/{} (12,64,512)", name), 0, [f, input](bool tiny) {
      const Shape s = tiny ? Shape{2, 3, 4} : Shape{12, 64, 512};
      return forward_backward(
          {input(s)}, [f](auto& v) { return f(v[0]); }, s);
    });
    add(fmt::format("op/{} forward (12,64,512)", name), 0, [f, input](bool tiny) {
      const Tensor x = input(tiny ? Shape{2, 3, 4} : Shape{12, 64, 512}).detach();
      return std::function<void()>([f, x] { (void)f(x); });
    });
  }
  add("overhead/x+1 forward", 0, [](bool) {
    Tensor x = rand({1});
    return std::function<void()>([x] { (void)(x + 1); });
  });
  // What an inference_mode guard could save over NoGradGuard: the op on a requires_grad input
  // under NoGradGuard against the same op on a plain tensor (the row above).
  add("overhead/x+1 requires_grad under no_grad", 0, [](bool) {
    Tensor x = rand({1}).requires_grad_();
    return std::function<void()>([x] {
      NoGradGuard no_grad;
      (void)(x + 1);
    });
  });
  add("overhead/x+1 requires_grad fwd+bwd", 0, [](bool) {
    Tensor x = rand({1}).requires_grad_();
    return std::function<void()>([x] {
      (x + 1).backward();
      x.set_grad(Tensor());
    });
  });
  // The reference rate: one (m, k) x (k, n) sgemm through ember::gemm (no autograd), at the
  // sizes of the linear layers above and in the transformer steps.
  for (const auto [m, k, n] :
       {std::array<int64_t, 3>{1024, 512, 2048}, std::array<int64_t, 3>{800, 512, 2048},
        std::array<int64_t, 3>{1024, 512, 512}}) {
    add(fmt::format("sgemm/{}x{}x{}", m, k, n), 2.0 * m * k * n, [m, k, n](bool tiny) {
      const int64_t s = tiny ? 16 : 1;
      Tensor a = rand({m / s, k / s}), b = rand({k / s, n / s}), c = empty({m / s, n / s});
      return std::function<void()>([a, b, c] { gemm(a, b, c); });
    });
  }
}

// --- Where a second thread starts to pay (issue 17): the sizes at which parallel_for and the
// products split their work, measured at 1 and 2 threads (no PyTorch twin).

void add_grain_workloads() {
  for (const int64_t n : {8192, 16384, 32768, 65536, 131072, 262144, 524288}) {
    add(fmt::format("grain/x*y n={}", n), 0, [n](bool tiny) {
      Tensor x = rand({tiny ? 8 : n}), y = rand({tiny ? 8 : n});
      return std::function<void()>([x, y] { (void)(x * y); });
    });
    add(fmt::format("grain/exp n={}", n), 0, [n](bool tiny) {
      Tensor x = rand({tiny ? 8 : n});
      return std::function<void()>([x] { (void)exp(x); });
    });
  }
  // The products of small transformers: rows x d_model by d_model x d_model (or d_ff).
  for (const auto [m, k, n] :
       {std::array<int64_t, 3>{80, 64, 64}, std::array<int64_t, 3>{200, 64, 64},
        std::array<int64_t, 3>{800, 64, 64}, std::array<int64_t, 3>{800, 64, 256},
        std::array<int64_t, 3>{800, 256, 64}, std::array<int64_t, 3>{800, 128, 128},
        std::array<int64_t, 3>{768, 128, 512}, std::array<int64_t, 3>{2048, 256, 256},
        std::array<int64_t, 3>{2048, 256, 1024}}) {
    add(fmt::format("grain/sgemm {}x{}x{}", m, k, n), 2.0 * m * k * n, [m, k, n](bool tiny) {
      const int64_t s = tiny ? 16 : 1;
      Tensor a = rand({m / s + 1, k / s + 1}), b = rand({k / s + 1, n / s + 1}),
             c = empty({m / s + 1, n / s + 1});
      return std::function<void()>([a, b, c] { gemm(a, b, c); });
    });
  }
}

// --- D2L 11.2 parametric attention pooling: one epoch of training

namespace {

struct NWData {
  Tensor x_train, y_train, keys, values;
};

// As D2L: sorted x ~ 5·U(0,1), y = 2 sin x + x^0.8 + N(0, 0.5²); each training point's keys and
// values are all the other points (the diagonal of the (n, n) tile masked out).
NWData nw_data(int64_t n_train) {
  NWData d;
  d.x_train = sort(rand({n_train}) * 5).values;
  d.y_train = 2 * sin(d.x_train) + pow(d.x_train, 0.8) + normal(0.0, 0.5, {n_train});
  const Tensor off_diagonal = logical_not(eye(n_train).to(kBool));
  d.keys = masked_select(d.x_train.repeat({n_train, 1}), off_diagonal).reshape({n_train, -1});
  d.values = masked_select(d.y_train.repeat({n_train, 1}), off_diagonal).reshape({n_train, -1});
  return d;
}

// NWKernelRegression.forward: queries (n), keys and values (n, m):
//   attention_weights = softmax(-((queries - keys) * w)² / 2, dim 1);  y = Σ_j weights · values
Tensor nw_forward(const Tensor& w, const Tensor& queries, const Tensor& keys,
                  const Tensor& values) {
  const int64_t m = keys.size(1);
  const Tensor q = queries.repeat_interleave(m).reshape({-1, m});
  const Tensor attention_weights = softmax(-pow((q - keys) * w, 2) / 2, 1);
  return bmm(attention_weights.unsqueeze(1), values.unsqueeze(-1)).reshape({-1});
}

}  // namespace

void add_nw_workloads() {
  for (const int64_t n : {50, 1000, 4000}) {
    add(fmt::format("nw/epoch n_train={}", n), 0, [n](bool tiny) {
      const NWData d = nw_data(tiny ? 5 : n);
      Tensor w = rand({1}).requires_grad_();
      auto trainer = std::make_shared<optim::SGD>(std::vector<Tensor>{w}, optim::SGDOptions{0.5});
      return std::function<void()>([d, w, trainer] {
        trainer->zero_grad();
        const Tensor l =
            mse_loss(nw_forward(w, d.x_train, d.keys, d.values), d.y_train, Reduction::None);
        l.sum().backward();
        trainer->step();
      });
    });
  }
}

}  // namespace ember::bench

namespace {

struct Options {
  int threads = 1;
  std::vector<std::string> filters;
  std::vector<std::string> exact;  // names run when given (repeatable), instead of the filters
  std::string json;
  double target = 1.0;
  std::string matmul_precision = "highest";  // set_float32_matmul_precision for every workload
  std::string device = "cpu";
  bool list = false, smoke = false;
  bool paired = false;  // the two selected workloads in turns (time_paired)
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "ember_bench: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--threads")
      o.threads = std::atoi(value().c_str());
    else if (a == "--filter")
      o.filters.push_back(value());
    else if (a == "--exact")
      o.exact.push_back(value());
    else if (a == "--json")
      o.json = value();
    else if (a == "--time")
      o.target = std::atof(value().c_str());
    else if (a == "--matmul-precision")
      o.matmul_precision = value();
    else if (a == "--device")
      o.device = value();
    else if (a == "--list")
      o.list = true;
    else if (a == "--smoke")
      o.smoke = true;
    else if (a == "--paired")
      o.paired = true;
    else {
      std::fprintf(
          stderr,
          "usage: ember_bench [--threads N] [--filter substr]... [--exact name]... "
          "[--json out.json] [--time seconds] [--matmul-precision P] [--device D] [--list] "
          "[--smoke] [--paired]\n");
      std::exit(a == "--help" || a == "-h" ? 0 : 2);
    }
  }
  return o;
}

bool selected(const Options& o, const ember::bench::Workload& w) {
  const bool device = ember::bench::bench_device().is_cuda();
  if (device ? !w.on_device : w.device_only) return false;
  const std::string& name = w.name;
  if (!o.exact.empty()) return std::find(o.exact.begin(), o.exact.end(), name) != o.exact.end();
  if (o.filters.empty()) return true;
  for (const std::string& f : o.filters)
    if (name.find(f) != std::string::npos) return true;
  return false;
}

int64_t max_rss_kb() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_maxrss;
}

// --paired: the two selected workloads timed in turns (time_paired), each one's median and min
// and the median (and quartiles) of the rounds' ratios, second over first.
int run_paired(const Options& o) {
  using namespace ember::bench;
  std::vector<const Workload*> chosen;
  for (const Workload& w : registry())
    if (selected(o, w)) chosen.push_back(&w);
  if (chosen.size() != 2) {
    std::fprintf(stderr, "ember_bench: --paired needs two workloads selected, got %zu\n",
                 chosen.size());
    return 2;
  }
  ember::manual_seed(0);
  const std::function<void()> a = chosen[0]->make(false);
  ember::manual_seed(0);
  const std::function<void()> b = chosen[1]->make(false);
  const PairedTiming t = time_paired(a, b, o.target);
  nlohmann::json results = nlohmann::json::array();
  for (const auto& [w, timing] : {std::pair{chosen[0], t.a}, std::pair{chosen[1], t.b}}) {
    std::cout << fmt::format("{:<44} median {:>11.3f} us  min {:>11.3f} us  ({} rounds)\n", w->name,
                             timing.median_s * 1e6, timing.min_s * 1e6, t.rounds);
    results.push_back({{"name", w->name},
                       {"median_s", timing.median_s},
                       {"min_s", timing.min_s},
                       {"samples", timing.samples}});
  }
  std::cout << fmt::format("ratio (second / first) median {:.3f}  quartiles {:.3f} {:.3f}\n",
                           t.ratio_median, t.ratio_low, t.ratio_high)
            << std::flush;
  if (!o.json.empty()) {
    const nlohmann::json doc = {{"side", "ember"},
                                {"threads", o.threads},
                                {"paired", true},
                                {"ratio_median", t.ratio_median},
                                {"ratio_quartiles", {t.ratio_low, t.ratio_high}},
                                {"rounds", t.rounds},
                                {"results", results}};
    std::ofstream(o.json) << doc.dump(2) << '\n';
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace ember::bench;
  const Options o = parse(argc, argv);
  ember::set_num_threads(o.threads);
  ember::set_float32_matmul_precision(o.matmul_precision);
  try {
    bench_device() = ember::Device(o.device);
    if (bench_device().is_cuda()) ember::check_device(bench_device(), "ember_bench --device");
  } catch (const ember::Error& e) {
    std::fprintf(stderr, "ember_bench: %s\n", e.what());
    return 2;
  }
  add_op_workloads();
  add_nw_workloads();
  add_grain_workloads();
  add_conv_workloads();
  add_rnn_workloads();
  add_jvp_workloads();
  add_product_workloads();

  // the product library of every CPU product below (ops/blas.cpp), as the profiler names it
  if (!o.list) std::cout << "products: " << ember::blas_library_info() << '\n';
  if (o.paired && !o.list && !o.smoke) return run_paired(o);
  nlohmann::json results = nlohmann::json::array();
  for (const Workload& w : registry()) {
    if (!selected(o, w)) continue;
    if (o.list) {
      std::cout << w.name << '\n';
      continue;
    }
    ember::manual_seed(0);
    const std::function<void()> step = w.make(o.smoke);
    if (o.smoke) {
      step();
      std::cout << fmt::format("{:<44} ok\n", w.name);
      continue;
    }
    nlohmann::json device_books;
    if (bench_device().is_cuda()) {
      // what a step asks of the device once warm: the mean of five steps after three
      constexpr int kWarm = 3, kCounted = 5;
      for (int i = 0; i < kWarm; ++i) step();
      ember::cuda::synchronize();
      const int index = bench_device().index();
      const auto memory = ember::cuda::memory_stats(index);
      const auto launches = ember::cuda::launch_stats(index);
      for (int i = 0; i < kCounted; ++i) step();
      ember::cuda::synchronize();
      const auto memory_after = ember::cuda::memory_stats(index);
      const auto launches_after = ember::cuda::launch_stats(index);
      const auto per_step = [&](int64_t before, int64_t after) {
        return static_cast<double>(after - before) / kCounted;
      };
      device_books = {
          {"kernels_per_step", per_step(launches.kernels, launches_after.kernels)},
          {"products_per_step", per_step(launches.products, launches_after.products)},
          // less the one synchronize() that ended the counted steps
          {"host_waits_per_step", per_step(launches.host_waits + 1, launches_after.host_waits)},
          {"driver_allocs_in_steady_steps", memory_after.driver_allocs - memory.driver_allocs},
          {"reserved_bytes", memory_after.reserved_bytes}};
      std::cout << fmt::format(
          "{:<44} device per step: {} kernels, {} products, {} host waits; "
          "{} cudaMalloc in {} steady steps\n",
          w.name, device_books["kernels_per_step"].get<double>(),
          device_books["products_per_step"].get<double>(),
          device_books["host_waits_per_step"].get<double>(),
          device_books["driver_allocs_in_steady_steps"].get<int64_t>(), kCounted);
    }
    const Timing t = time_steps(step, o.target);
    const int64_t rss = max_rss_kb();
    std::string rate;
    if (w.flops > 0) rate = fmt::format("{:8.1f} GFLOP/s", w.flops / t.median_s * 1e-9);
    if (w.bytes > 0) rate = fmt::format("{:8.1f} GB/s", w.bytes / t.median_s * 1e-9);
    std::cout << fmt::format(
                     "{:<44} median {:>11.3f} us  min {:>11.3f} us  cpu {:>11.3f} us  "
                     "({}x{})  {}\n",
                     w.name, t.median_s * 1e6, t.min_s * 1e6, t.cpu_s * 1e6, t.samples, t.inner,
                     rate)
              << std::flush;
    results.push_back({{"name", w.name},
                       {"median_s", t.median_s},
                       {"min_s", t.min_s},
                       {"cpu_s", t.cpu_s},
                       {"samples", t.samples},
                       {"inner", t.inner},
                       {"flops", w.flops},
                       {"bytes", w.bytes},
                       {"max_rss_kb", rss}});
    if (!device_books.is_null()) results.back()["device"] = device_books;
  }
  if (!o.json.empty() && !o.list && !o.smoke) {
    const nlohmann::json doc = {
        {"side", "ember"},
        {"threads", o.threads},
        {"device", bench_device().str()},
        {"gpu", bench_device().is_cuda() ? ember::cuda::get_device_name(bench_device().index())
                                         : std::string()},
        {"matmul_precision", o.matmul_precision},
        {"bfloat16_products", ember::float32_matmul_uses_bfloat16()},
        {"blas", ember::get_blas_library()},
        {"blas_info", ember::blas_library_info()},
        {"results", results}};
    std::ofstream(o.json) << doc.dump(2) << '\n';
  }
  return 0;
}
