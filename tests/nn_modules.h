// Small modules shared by the nn and serialization tests, built only from registration and
// elementwise ops: an Affine layer (parameters w, b and an Int64 buffer), a Block that nests an
// Affine, a ModuleList of Affines and its own parameter and buffers, and Open (public
// registration).
#pragma once

#include "ember.h"

namespace ember::testing {

// y = x * w + b over the last dim.
struct Affine : nn::Cloneable<Affine> {
  explicit Affine(int64_t n, DType dtype = kFloat32) {
    register_parameter("w", w, randn({n}, dtype));
    register_parameter("b", b, randn({n}, dtype));
    register_buffer("count", count, zeros({1}, kInt64));
  }
  Tensor forward(const Tensor& x) const { return x * w + b; }
  Tensor w, b, count;
};

struct Block : nn::Cloneable<Block> {
  explicit Block(int64_t n) {
    register_parameter("scale", scale, ones({n, n}, kFloat64));
    register_module("first", first, std::make_shared<Affine>(n));
    register_module("layers", layers, std::make_shared<nn::ModuleList>());
    layers->push_back(std::make_shared<Affine>(n));
    layers->push_back(std::make_shared<Affine>(n));
    register_buffer("mask", mask, tensor({1, 0, 1}, kBool));
    register_buffer("empty_table", empty_table, zeros({0, n}));
    register_buffer("step", step, scalar_tensor(7, kFloat64));
  }
  Tensor forward(const Tensor& x) const {
    Tensor y = first->forward(x);
    for (const auto& layer : *layers) y = static_cast<Affine&>(*layer).forward(y);
    return y;
  }
  Tensor scale, mask, empty_table, step;
  std::shared_ptr<Affine> first;
  std::shared_ptr<nn::ModuleList> layers;
};

// A module whose registration functions are public, to build modules in tests.
struct Open : nn::Cloneable<Open> {
  using Module::register_buffer;
  using Module::register_module;
  using Module::register_parameter;
};

// Every value of a module's state, by name, as doubles (bit-exact for Float32/Float64/Int64/Bool).
inline std::vector<std::pair<std::string, std::vector<double>>> snapshot(const nn::Module& m) {
  std::vector<std::pair<std::string, std::vector<double>>> out;
  for (const auto& [name, t] : m.state_dict()) out.emplace_back(name, t.to_vector<double>());
  return out;
}

}  // namespace ember::testing
