// ember_bench's rnn/ rows: one LSTM layer and one GRU layer over a whole sequence (input 256,
// hidden 256, batch 64, 32 steps, Float32; issue 45's speed workload), the forward alone (no
// grad) and forward + backward through time (the gradients of the input and of the four
// parameters), against the nn.LSTM / nn.GRU twins in bench/pytorch/bench_torch.py.
// flops: per step the input and hidden products 2·B·G·H·(I + H), G gates (LSTM 4, GRU 3); times
// 3 with the backward's two products per product.
#include <fmt/format.h>

#include "bench/harness.h"
#include "ember.h"

namespace ember::bench {
namespace {

constexpr int64_t kInput = 256, kHidden = 256, kBatch = 64, kSteps = 32;

template <class Layer>
void add_rnn_layer(const char* kind, int64_t gates) {
  const double flops = 2.0 * kSteps * kBatch * gates * kHidden * (kInput + kHidden);
  const auto make = [](bool tiny, bool grad) {
    const int64_t steps = tiny ? 3 : kSteps, batch = tiny ? 2 : kBatch;
    const int64_t input = tiny ? 4 : kInput, hidden = tiny ? 5 : kHidden;
    auto layer = std::make_shared<Layer>(input, hidden);
    Tensor x = rand({steps, batch, input}) * 2 - 1;
    if (grad) x.requires_grad_();
    return std::pair{layer, x};
  };
  registry().push_back(
      {fmt::format("rnn/{} 256x256 b64 t32 forward", kind), flops, [make](bool tiny) {
         auto [layer, x] = make(tiny, false);
         return std::function<void()>([layer, x] {
           NoGradGuard no_grad;
           (void)layer->forward(x).output;
         });
       }});
  registry().push_back(
      {fmt::format("rnn/{} 256x256 b64 t32 fwd+bwd", kind), 3 * flops, [make](bool tiny) {
         auto [layer, x] = make(tiny, true);
         const Tensor grad_out = rand(layer->forward(x).output.sizes());
         return std::function<void()>([layer, x, grad_out] {
           layer->forward(x).output.backward(grad_out);
           x.set_grad(Tensor());
           layer->zero_grad();
         });
       }});
}

}  // namespace

void add_rnn_workloads() {
  add_rnn_layer<nn::LSTM>("lstm", 4);
  add_rnn_layer<nn::GRU>("gru", 3);
}

}  // namespace ember::bench
