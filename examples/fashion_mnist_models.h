// The two models of examples/fashion_mnist (issue 44), fixed so that others can reproduce them
// (their PyTorch twins are in bench/pytorch/fashion_mnist.py): the CNN and a ResNet of
// torchvision's BasicBlocks, each behind one forward of images (B, 1, 28, 28) -> logits (B, 10).
// Shared by examples/fashion_mnist.cpp and bench/conv_workloads.cpp (its training-step rows).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "ember.h"

namespace fashion_mnist {

using namespace ember;

constexpr int64_t kClasses = 10;

inline std::shared_ptr<nn::Conv2d> conv3x3(int64_t in, int64_t out, int64_t stride, bool bias) {
  return std::make_shared<nn::Conv2d>(
      in, out, IntList{3}, nn::ConvOptions{.stride = {stride}, .padding = 1, .bias = bias});
}

inline std::shared_ptr<nn::Sequential> make_cnn() {
  auto net = std::make_shared<nn::Sequential>();
  const auto conv_bn_relu = [&](int64_t in, int64_t out) {
    net->push_back(conv3x3(in, out, 1, true));
    net->push_back(std::make_shared<nn::BatchNorm2d>(out));
    net->push_back(std::make_shared<nn::ReLU>());
  };
  conv_bn_relu(1, 32);
  conv_bn_relu(32, 32);
  net->push_back(std::make_shared<nn::MaxPool2d>(IntList{2}));
  conv_bn_relu(32, 64);
  conv_bn_relu(64, 64);
  net->push_back(std::make_shared<nn::MaxPool2d>(IntList{2}));
  net->push_back(std::make_shared<nn::Flatten>());
  net->push_back(std::make_shared<nn::Linear>(64 * 7 * 7, 256));
  net->push_back(std::make_shared<nn::ReLU>());
  net->push_back(std::make_shared<nn::Dropout>(0.3));
  net->push_back(std::make_shared<nn::Linear>(256, kClasses));
  return net;
}

// torchvision's BasicBlock: relu(bn2(conv2(relu(bn1(conv1(x))))) + shortcut(x)), the shortcut a
// 1x1 convolution and BatchNorm ("downsample") where the shape changes, else x itself.
struct BasicBlock : nn::Cloneable<BasicBlock> {
  BasicBlock(int64_t in, int64_t out, int64_t stride) {
    register_module("conv1", conv1, conv3x3(in, out, stride, false));
    register_module("bn1", bn1, std::make_shared<nn::BatchNorm2d>(out));
    register_module("conv2", conv2, conv3x3(out, out, 1, false));
    register_module("bn2", bn2, std::make_shared<nn::BatchNorm2d>(out));
    if (stride != 1 || in != out) {
      downsample = std::make_shared<nn::Sequential>(
          std::make_shared<nn::Conv2d>(in, out, IntList{1},
                                       nn::ConvOptions{.stride = {stride}, .bias = false}),
          std::make_shared<nn::BatchNorm2d>(out));
      register_module("downsample", downsample);
    }
  }
  Tensor forward(const Tensor& x) {
    const Tensor h = bn1->forward_relu(conv1->forward(x));  // relu(bn1(...)) as one op
    const Tensor y = bn2->forward(conv2->forward(h));
    return relu(y + (downsample ? downsample->forward(x) : x));
  }
  std::shared_ptr<nn::Conv2d> conv1, conv2;
  std::shared_ptr<nn::BatchNorm2d> bn1, bn2;
  std::shared_ptr<nn::Sequential> downsample;
};

inline std::shared_ptr<nn::Sequential> make_stage(int64_t in, int64_t out, int64_t stride) {
  return std::make_shared<nn::Sequential>(std::make_shared<BasicBlock>(in, out, stride),
                                          std::make_shared<BasicBlock>(out, out, 1));
}

struct ResNet : nn::Cloneable<ResNet> {
  ResNet() {
    register_module("conv1", conv1, conv3x3(1, 16, 1, false));
    register_module("bn1", bn1, std::make_shared<nn::BatchNorm2d>(16));
    register_module("layer1", layer1, make_stage(16, 16, 1));
    register_module("layer2", layer2, make_stage(16, 32, 2));
    register_module("layer3", layer3, make_stage(32, 64, 2));
    register_module("fc", fc, std::make_shared<nn::Linear>(64, kClasses));
  }
  Tensor forward(const Tensor& x) {
    Tensor h = bn1->forward_relu(conv1->forward(x));
    h = layer3->forward(layer2->forward(layer1->forward(h)));
    return fc->forward(adaptive_avg_pool2d(h, {1}).flatten(1));
  }
  std::shared_ptr<nn::Conv2d> conv1;
  std::shared_ptr<nn::BatchNorm2d> bn1;
  std::shared_ptr<nn::Sequential> layer1, layer2, layer3;
  std::shared_ptr<nn::Linear> fc;
};

// Either model behind one forward: images (B, 1, 28, 28), normalised -> logits (B, 10).
struct Classifier {
  std::shared_ptr<nn::Module> module;
  std::function<Tensor(const Tensor&)> forward;
};

inline Classifier make_model(const std::string& name) {
  if (name == "resnet") {
    auto net = std::make_shared<ResNet>();
    return {net, [net](const Tensor& x) { return net->forward(x); }};
  }
  auto net = make_cnn();
  return {net, [net](const Tensor& x) { return net->forward(x); }};
}

}  // namespace fashion_mnist
