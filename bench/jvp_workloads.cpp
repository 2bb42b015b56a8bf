// ember_bench's jvp/ rows (issue 46's speed workload): a Jacobian-vector product of an MLP
// 512-1024-1024-512 with tanh between its layers, batch 256, Float32, with respect to its input:
// the forward pass alone (no grad), the jvp in forward mode (one pass carrying the tangent:
// twice the forward's products) and by the double-vjp trick (a backward recorded with
// create_graph, then differentiated with respect to its dummy cotangent: about three times).
// Twins in bench/pytorch/bench_torch.py: the forward and torch.func.jvp.
// flops: the forward's products, 2·B·(512·1024 + 1024·1024 + 1024·512).
// The hvp/ rows: a Hessian-vector product of the PINN's MLP (examples/pinn: 9 Linear layers of
// width 20 with tanh, 10,000 points of (x, t)), loss mean(u²), with respect to its 18 parameter
// tensors, by reverse over reverse (functional::hvp) and by forward over reverse
// (functional::hvp_forward_over_reverse).
#include <cmath>

#include <fmt/format.h>

#include "bench/harness.h"
#include "ember.h"

namespace ember::bench {
namespace {

constexpr int64_t kBatch = 256;

struct Mlp {
  std::vector<std::shared_ptr<nn::Linear>> layers;
  Tensor forward(Tensor h) const {
    for (size_t i = 0; i < layers.size(); ++i) {
      h = layers[i]->forward(h);
      if (i + 1 < layers.size()) h = tanh(h);
    }
    return h;
  }
};

struct Setup {
  Mlp mlp;
  Tensor x, v;
};

Setup make(bool tiny) {
  const std::vector<int64_t> sizes =
      tiny ? std::vector<int64_t>{4, 6, 6, 4} : std::vector<int64_t>{512, 1024, 1024, 512};
  Setup s;
  for (size_t i = 0; i + 1 < sizes.size(); ++i)
    s.mlp.layers.push_back(std::make_shared<nn::Linear>(sizes[i], sizes[i + 1]));
  for (auto& layer : s.mlp.layers)
    for (Tensor& p : layer->parameters()) p.requires_grad_(false);
  s.x = randn({tiny ? 2 : kBatch, sizes.front()});
  s.v = randn({tiny ? 2 : kBatch, sizes.front()});
  return s;
}

// The PINN's MLP as a function of its parameters (weight, bias per layer) at fixed points.
Tensor pinn_mlp(const std::vector<Tensor>& params, const Tensor& points) {
  Tensor h = points;
  for (size_t i = 0; i < params.size(); i += 2) {
    h = linear(h, params[i], params[i + 1]);
    if (i + 2 < params.size()) h = tanh(h);
  }
  return pow(h, 2.0).mean();
}

template <class Hvp>
std::function<std::function<void()>(bool)> hvp_row(Hvp hvp) {
  return [hvp](bool tiny) {
    const int64_t layers = tiny ? 3 : 9, width = tiny ? 4 : 20, n = tiny ? 5 : 10000;
    std::vector<Tensor> params, v;
    for (int64_t i = 0; i < layers; ++i) {
      const int64_t in = i == 0 ? 2 : width, out = i + 1 == layers ? 1 : width;
      params.push_back(randn({out, in}) * (1.0 / std::sqrt(static_cast<double>(in))));
      params.push_back(zeros({out}));
    }
    for (const Tensor& p : params) v.push_back(randn(p.shape()));
    const Tensor points = rand({n, 2});
    return std::function<void()>([=] {
      (void)hvp([&](const std::vector<Tensor>& p) { return pinn_mlp(p, points); }, params, v,
                false);
    });
  };
}

}  // namespace

void add_jvp_workloads() {
  registry().push_back(
      {"hvp/pinn mlp 9x20 n10000 reverse-over-reverse", 0, hvp_row(autograd::functional::hvp)});
  registry().push_back({"hvp/pinn mlp 9x20 n10000 forward-over-reverse", 0,
                        hvp_row(autograd::functional::hvp_forward_over_reverse)});
  const double flops = 2.0 * kBatch * (512 * 1024 + 1024 * 1024 + 1024 * 512);
  const std::string name = "jvp/mlp 512-1024-1024-512 tanh b256";
  registry().push_back({name + " forward", flops, [](bool tiny) {
                          const Setup s = make(tiny);
                          return std::function<void()>([s] {
                            NoGradGuard no_grad;
                            (void)s.mlp.forward(s.x);
                          });
                        }});
  registry().push_back({name + " jvp forward mode", 2 * flops, [](bool tiny) {
                          const Setup s = make(tiny);
                          return std::function<void()>([s] {
                            NoGradGuard no_grad;
                            autograd::forward_ad::DualLevel level;
                            const Tensor y =
                                s.mlp.forward(autograd::forward_ad::make_dual(s.x, s.v));
                            (void)autograd::forward_ad::unpack_dual(y).tangent;
                          });
                        }});
  registry().push_back({name + " jvp double-vjp", 3 * flops, [](bool tiny) {
                          const Setup s = make(tiny);
                          return std::function<void()>([s] {
                            const Tensor x = s.x.detach().requires_grad_();
                            const Tensor y = s.mlp.forward(x);
                            const Tensor u = zeros_like(y).requires_grad_();
                            const Tensor g = autograd::grad({y}, {x}, {u}, true, true)[0];
                            (void)autograd::grad({g}, {u}, {s.v})[0];
                          });
                        }});
}

}  // namespace ember::bench
