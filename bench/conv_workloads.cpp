// ember_bench's conv/ rows: each convolution layer of examples/fashion_mnist (bench/conv_shapes.h)
// at batch 128, the forward alone (inputs without grad) and forward + backward (the gradients of
// the input, the weight and the bias where the layer has one), against the twins in
// bench/pytorch/bench_torch.py (NCHW and channels_last) and oneDNN in bench/conv_dnnl.cpp.
// flops: the forward's 2·N·C_out·OH·OW·C_in·k², times 3 with the two backward products.
// And the fashion/ rows: one training step of each whole model (examples/fashion_mnist_models.h)
// at batch 128, forward, cross-entropy, backward and Adam's update, on random images and labels:
// the step whose images/s the example reports, timed in one process, median over many steps.
#include <memory>

#include <fmt/format.h>

#include "bench/conv_shapes.h"
#include "bench/harness.h"
#include "ember.h"
#include "examples/fashion_mnist_models.h"

namespace ember::bench {

void add_conv_workloads() {
  for (const ConvShape& c : kConvShapes) {
    const auto tensors = [c](bool tiny) {
      const int64_t n = tiny ? 2 : kConvBatch, size = tiny ? 5 : c.size;
      std::vector<Tensor> v{rand({n, c.c_in, size, size}) * 2 - 1,
                            (rand({c.c_out, c.c_in, c.kernel, c.kernel}) * 2 - 1) * 0.1};
      if (c.bias) v.push_back(rand({c.c_out}) * 0.1);
      return v;
    };
    const auto conv = [c](const std::vector<Tensor>& v) {
      return conv2d(v[0], v[1], v.size() > 2 ? v[2] : Tensor(), {c.stride}, c.pad());
    };
    registry().push_back(
        {fmt::format("conv/{} forward", c.name()), c.flops(kConvBatch), [tensors, conv](bool tiny) {
           const std::vector<Tensor> v = tensors(tiny);
           return std::function<void()>([v, conv] { (void)conv(v); });
         }});
    registry().push_back({fmt::format("conv/{} fwd+bwd", c.name()), 3 * c.flops(kConvBatch),
                          [tensors, conv](bool tiny) {
                            std::vector<Tensor> v = tensors(tiny);
                            for (Tensor& t : v) t.requires_grad_();
                            const Tensor grad_out = rand(conv(v).sizes());
                            return std::function<void()>([v, conv, grad_out] {
                              conv(v).backward(grad_out);
                              for (const Tensor& t : v) t.set_grad(Tensor());
                            });
                          }});
  }
  for (const char* model : {"cnn", "resnet"})
    registry().push_back(
        {fmt::format("fashion/{} train step b{}", model, kConvBatch), 0, [model](bool tiny) {
           const int64_t n = tiny ? 2 : kConvBatch;
           const auto net =
               std::make_shared<fashion_mnist::Classifier>(fashion_mnist::make_model(model));
           const auto adam = std::make_shared<optim::Adam>(net->module->parameters());
           const Tensor x = (rand({n, 1, 28, 28}) - 0.2860) / 0.3530;
           const Tensor y = randint(0, fashion_mnist::kClasses, {n});
           return std::function<void()>([net, adam, x, y] {
             adam->zero_grad();
             cross_entropy(net->forward(x), y).backward();
             adam->step();
           });
         }});
}

}  // namespace ember::bench
