// Annotated Transformer training steps (issue 7, workloads A, B, C): forward, label-smoothed KL
// divided by ntokens, backward, Adam + LambdaLR (the Noam rate), dropout 0.1, Float32, on one
// fixed batch of the copy task's kind (rows from randint(1, V), the first token 1, pad 0). The
// PyTorch twin is transformer_step in bench/pytorch/bench_torch.py. This file registers its
// workloads itself when the program starts; bench/CMakeLists.txt builds it only where the
// copy task's pieces (examples/copy_task.h) exist.
//
// With --device cuda the steps run on the GPU (model and batch moved there), and "products
// alone" replays one step's products (captured as they were launched: the same shapes,
// transposes and batches) through cuBLAS on scratch buffers: the step's time against its
// products' alone is issue 35's "at least 80% of the products' throughput".
#include <algorithm>

#include <fmt/format.h>

#include "bench/harness.h"
#include "ember.h"
#include "examples/copy_task.h"
#include "graph/device_backend.h"

namespace ember::bench {

namespace {

struct Config {
  const char* name;
  int64_t V, N, d_model, d_ff, h, batch, length;
};

// Multiply-adds of the forward's products (projections, attention, feed-forward, generator),
// times 2 flops, times 3 for forward + backward; S source and T = S - 1 target tokens per row.
double step_flops(const Config& c) {
  const double D = c.d_model, F = c.d_ff, S = c.length, T = c.length - 1;
  const double enc = S * (4 * D * D + 2 * D * F) + 2 * S * S * D;
  const double dec =
      T * (4 * D * D + 2 * D * F) + 2 * T * T * D + T * 2 * D * D + S * 2 * D * D + 2 * T * S * D;
  return 3.0 * 2 * c.batch * (c.N * (enc + dec) + T * D * c.V);
}

// Everything one training step touches, kept alive by the step closure.
struct Trainer {
  std::shared_ptr<nn::EncoderDecoder> model;
  std::unique_ptr<nn::LabelSmoothing> criterion;
  std::unique_ptr<optim::Adam> optimizer;
  std::unique_ptr<optim::LambdaLR> scheduler;
  std::unique_ptr<copy_task::SimpleLossCompute> loss_compute;
  std::unique_ptr<nn::Batch> batch;

  // The original's step; its loss as loss_compute's (generator, label smoothing, / ntokens)
  // without reading the value back, which would wait for a device.
  void step() {
    const Tensor out = model->forward(batch->src, batch->tgt, batch->src_mask, batch->tgt_mask);
    const Tensor logits = model->generator->forward(out);
    const Tensor loss = (*criterion)(logits.contiguous().view({-1, logits.size(-1)}),
                                     batch->tgt_y.contiguous().view({-1})) /
                        static_cast<double>(batch->ntokens);
    loss.backward();
    optimizer->step();
    optimizer->zero_grad();
    scheduler->step();
  }
};

std::shared_ptr<Trainer> make_trainer(Config c, bool tiny) {
  if (tiny) c = {c.name, 11, 1, 16, 32, 2, 2, 5};
  auto t = std::make_shared<Trainer>();
  t->model = nn::make_model(c.V, c.V, c.N, c.d_model, c.d_ff, c.h, 0.1);
  t->model->train();
  t->model->to(bench_device());
  t->criterion = std::make_unique<nn::LabelSmoothing>(c.V, 0, 0.1);
  t->optimizer = std::make_unique<optim::Adam>(
      t->model->parameters(),
      optim::AdamOptions{.lr = 0.5, .beta1 = 0.9, .beta2 = 0.98, .eps = 1e-9});
  const int64_t d_model = c.d_model;
  t->scheduler = std::make_unique<optim::LambdaLR>(
      *t->optimizer, [d_model](int64_t step) { return optim::rate(step, d_model, 1.0, 400); });
  t->loss_compute =
      std::make_unique<copy_task::SimpleLossCompute>(*t->model->generator, *t->criterion);
  Tensor data = randint(1, c.V, {c.batch, c.length});
  data.narrow(1, 0, 1).fill_(1);
  t->batch =
      std::make_unique<nn::Batch>(nn::Batch(data.clone(), data.clone(), 0).to(bench_device()));
  return t;
}

std::function<void()> make_step(Config c, bool tiny) {
  auto t = make_trainer(c, tiny);
  return [t] { t->step(); };
}

// Bytes a product reads or writes of one operand: its last element's offset plus one, in
// elements of the product's type.
int64_t extent(int64_t batch, int64_t stride, int64_t rows, int64_t ld, int64_t cols) {
  if (batch <= 0 || rows <= 0 || cols <= 0) return 0;
  return (batch - 1) * stride + (rows - 1) * ld + cols;
}

// One step's products alone (Float32 or Float64 as launched), replayed on zeroed scratch
// operands as large as the largest each needs: cuBLAS's time for exactly the step's products.
std::function<void()> make_products_alone(Config c, bool tiny) {
  auto t = make_trainer(c, tiny);
  for (int i = 0; i < 2; ++i) t->step();  // Adam's state made, the allocator warm
  auto products = std::make_shared<std::vector<cuda::kernels::Gemm>>();
  cuda::detail::capture_products(products.get());
  t->step();
  cuda::detail::capture_products(nullptr);
  int64_t a_size = 1, b_size = 1, c_size = 1;
  for (const cuda::kernels::Gemm& g : *products) {
    a_size = std::max(
        a_size, extent(g.batch, g.stride_a, g.trans_a ? g.k : g.m, g.lda, g.trans_a ? g.m : g.k));
    b_size = std::max(
        b_size, extent(g.batch, g.stride_b, g.trans_b ? g.n : g.k, g.ldb, g.trans_b ? g.k : g.n));
    c_size = std::max(c_size, extent(g.batch, g.stride_c, g.m, g.ldc, g.n));
  }
  // Float64 storage holds either type's operands
  auto scratch = std::make_shared<std::vector<Tensor>>(std::vector<Tensor>{
      zeros({a_size}, kFloat64, bench_device()), zeros({b_size}, kFloat64, bench_device()),
      zeros({c_size}, kFloat64, bench_device())});
  for (cuda::kernels::Gemm& g : *products) {
    g.a = (*scratch)[0].data_bytes();
    g.b = (*scratch)[1].data_bytes();
    g.c = (*scratch)[2].data_bytes();
  }
  return [products, scratch, device = bench_device()] {
    for (const cuda::kernels::Gemm& g : *products)
      cuda::detail::launch_gemm(g, device, "products alone");
  };
}

// Step B's model and batch without the optimizer (dropout 0.1, train mode), its loss, its
// parameters (named) and a direction v of their shapes.
struct SecondOrder {
  std::shared_ptr<nn::EncoderDecoder> model;
  std::shared_ptr<nn::LabelSmoothing> criterion;
  std::shared_ptr<nn::Batch> batch;
  nn::NamedTensors named;
  std::vector<Tensor> params, v;

  SecondOrder(Config c, bool tiny) {
    if (tiny) c = {c.name, 11, 1, 16, 32, 2, 2, 5};
    model = nn::make_model(c.V, c.V, c.N, c.d_model, c.d_ff, c.h, 0.1);
    model->train();
    criterion = std::make_shared<nn::LabelSmoothing>(c.V, 0, 0.1);
    Tensor data = randint(1, c.V, {c.batch, c.length});
    data.narrow(1, 0, 1).fill_(1);
    model->to(bench_device());
    batch =
        std::make_shared<nn::Batch>(nn::Batch(data.clone(), data.clone(), 0).to(bench_device()));
    named = model->named_parameters();
    for (const auto& [name, p] : named) {
      params.push_back(p);
      v.push_back(randn(p.shape()).to(bench_device()));
    }
  }
  Tensor loss() const {
    copy_task::SimpleLossCompute loss_compute(*model->generator, *criterion);
    const Tensor out = model->forward(batch->src, batch->tgt, batch->src_mask, batch->tgt_mask);
    return loss_compute(out, batch->tgt_y, batch->ntokens).loss;
  }
};

// The gradient of step B's loss with respect to every parameter, or a Hessian-vector product of
// it (issue 34: at most 3x the gradient's time): the gradient recorded (create_graph), then the
// gradient of g·v (H is symmetric, so this is H v).
std::function<void()> make_second_order(Config c, bool tiny, bool hvp) {
  const auto s = std::make_shared<SecondOrder>(c, tiny);
  return [s, hvp] {
    const std::vector<Tensor> g = autograd::grad({s->loss()}, s->params, {}, std::nullopt, hvp);
    if (hvp) autograd::grad(g, s->params, s->v);
  };
}

// Step B's loss as a function of its parameters (nn::functional_call, torch.func's).
autograd::functional::Fn loss_of_params(const std::shared_ptr<SecondOrder>& s) {
  return [s](const std::vector<Tensor>& xs) {
    nn::NamedTensors given;
    for (size_t i = 0; i < xs.size(); ++i) given.emplace_back(s->named[i].first, xs[i]);
    return nn::functional_call(*s->model, given, [&] { return s->loss(); });
  };
}

// The same product as autograd::functional::vhp(f, params, v) takes it, f the loss as a function
// of the parameters (nn::functional_call, torch.func's): its first gradient is only
// differentiated, never read (Note [Results for their graph alone]).
std::function<void()> make_functional_vhp(Config c, bool tiny) {
  const auto s = std::make_shared<SecondOrder>(c, tiny);
  const autograd::functional::Fn loss = loss_of_params(s);
  return [s, loss] { (void)autograd::functional::vhp(loss, s->params, s->v); };
}

// Issue 46's jvp/ rows on step B's model: the loss's derivative along a direction v (torch.func.jvp
// of functional_call in the twin) of the input embeddings (v on the two embedding tables alone,
// the tokens being integers: every product then carries one tangent operand, as an MLP's jvp in
// its input) or of every parameter (the products of weights carry two: X·tWᵀ and tX·Wᵀ). Rows:
// the loss alone (no grad), the jvp in forward mode (functional::jvp: one pass carrying the
// tangents), and the double-vjp trick (the gradient recorded against a dummy cotangent u, then
// differentiated with respect to u along v).
enum class JvpKind { kForward, kForwardMode, kDoubleVjp };

std::function<void()> make_jvp(Config c, bool tiny, bool embeddings_only, JvpKind kind) {
  const auto s = std::make_shared<SecondOrder>(c, tiny);
  if (embeddings_only) {  // only the embedding tables are the function's inputs
    nn::NamedTensors named;
    std::vector<Tensor> params, v;
    for (size_t i = 0; i < s->named.size(); ++i) {
      if (s->named[i].first.find(".lut.") == std::string::npos) continue;
      named.push_back(s->named[i]), params.push_back(s->params[i]), v.push_back(s->v[i]);
    }
    s->named = named, s->params = params, s->v = v;
  }
  const autograd::functional::Fn loss = loss_of_params(s);
  switch (kind) {
    case JvpKind::kForward:
      return [s] {
        NoGradGuard no_grad;
        (void)s->loss();
      };
    case JvpKind::kForwardMode:
      return [s, loss] { (void)autograd::functional::jvp(loss, s->params, s->v); };
    case JvpKind::kDoubleVjp:
      break;
  }
  return [s] {
    const Tensor y = s->loss();
    const Tensor u = zeros_like(y).requires_grad_();
    const std::vector<Tensor> g = autograd::grad({y}, s->params, {u}, true, true);
    (void)autograd::grad(g, {u}, s->v)[0];
  };
}

void add_transformer_workloads() {
  const Config b{"transformer/B small V=11 N=2 d=64 b=80 len=10", 11, 2, 64, 256, 4, 80, 10};
  // a forward's flops: a third of the step's
  registry().push_back({"jvp/B loss forward", step_flops(b) / 3,
                        [b](bool tiny) { return make_jvp(b, tiny, false, JvpKind::kForward); }});
  for (const bool embeddings_only : {true, false}) {
    const std::string jvp =
        embeddings_only ? "jvp/B loss, input embeddings" : "jvp/B loss, all parameters";
    const double products = embeddings_only ? 2 : 3;  // the forward's, times
    registry().push_back(
        {jvp + " jvp forward mode", products * step_flops(b) / 3, [b, embeddings_only](bool tiny) {
           return make_jvp(b, tiny, embeddings_only, JvpKind::kForwardMode);
         }});
    registry().push_back({jvp + " jvp double-vjp", step_flops(b), [b, embeddings_only](bool tiny) {
                            return make_jvp(b, tiny, embeddings_only, JvpKind::kDoubleVjp);
                          }});
  }
  registry().push_back({"second-order/B hvp (functional)", step_flops(b), [b](bool tiny) {
                          const auto s = std::make_shared<SecondOrder>(b, tiny);
                          const autograd::functional::Fn loss = loss_of_params(s);
                          return std::function<void()>([s, loss] {
                            (void)autograd::functional::hvp(loss, s->params, s->v);
                          });
                        }});
  registry().push_back(
      {"second-order/B hvp forward-over-reverse (functional)", step_flops(b), [b](bool tiny) {
         const auto s = std::make_shared<SecondOrder>(b, tiny);
         const autograd::functional::Fn loss = loss_of_params(s);
         return std::function<void()>([s, loss] {
           (void)autograd::functional::hvp_forward_over_reverse(loss, s->params, s->v);
         });
       }});
  registry().push_back({"second-order/B gradient", step_flops(b),
                        [b](bool tiny) { return make_second_order(b, tiny, false); }, 0, true});
  registry().push_back({"second-order/B hvp", step_flops(b),
                        [b](bool tiny) { return make_second_order(b, tiny, true); }, 0, true});
  registry().push_back({"second-order/B vhp (functional)", step_flops(b),
                        [b](bool tiny) { return make_functional_vhp(b, tiny); }, 0, true});
  const Config a{"transformer/A copy V=11 N=2 d=512 b=80 len=10", 11, 2, 512, 2048, 8, 80, 10};
  const Config c{"transformer/C base V=1000 N=6 d=512 b=32 len=32", 1000, 6, 512, 2048, 8, 32, 32};
  for (const Config& w : {a, b, c})
    registry().push_back(
        {w.name, step_flops(w), [w](bool tiny) { return make_step(w, tiny); }, 0, true});
  // on a device only (the products go through cuBLAS there)
  for (const Config& w : {a, c})
    registry().push_back({fmt::format("{} products alone", w.name), step_flops(w),
                          [w](bool tiny) { return make_products_alone(w, tiny); }, 0, true, true});
}

const bool g_registered = (add_transformer_workloads(), true);

}  // namespace

}  // namespace ember::bench
