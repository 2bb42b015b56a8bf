// The global random generator (std::mt19937_64) and the random tensors drawn from it. Numbers
// are drawn serially, so one seed gives the same tensors on every run and thread count.
#pragma once

#include <cstdint>
#include <random>

#include "graph/tensor.h"

namespace ember {

// The engine behind every random op; seeded with 0 at start, reseeded by manual_seed.
std::mt19937_64& global_generator();
void manual_seed(uint64_t seed);

// One uniform double in [0, 1) with 53 random bits.
double next_uniform(std::mt19937_64& gen);

Tensor rand(Shape shape, DType dtype = kFloat32);   // U[0, 1)
Tensor randn(Shape shape, DType dtype = kFloat32);  // N(0, 1)
Tensor normal(double mean, double std, Shape shape, DType dtype = kFloat32);
Tensor randint(int64_t low, int64_t high, Shape shape);  // Int64 in [low, high)

}  // namespace ember
