// The global random generator (std::mt19937_64) and the random tensors drawn from it. Numbers
// are drawn serially, so one seed gives the same tensors on every run and thread count.
//
// Note [Generator lock]
// One generator serves every thread, as torch's default CPU generator: each draw of a tensor (or
// of a dropout key) holds its mutex, so threads never race on its state and each tensor's
// numbers are one contiguous run of the stream. Which thread gets which run depends on the
// order the threads come in; a program that needs the same numbers per thread seeds and draws
// on one thread.
#pragma once

#include <cstdint>
#include <mutex>
#include <random>

#include "graph/tensor.h"

namespace ember {

// The engine behind every random op; seeded with 0 at start, reseeded by manual_seed. Hold a
// GeneratorGuard while using it (Note [Generator lock]).
std::mt19937_64& global_generator();
void manual_seed(uint64_t seed);

// The global generator's whole state as an opaque 1-D Int64 tensor (the mt19937_64 words and
// position, as torch.get_rng_state's ByteTensor), and back: set_rng_state(get_rng_state())
// continues the same stream. A tensor that is not such a state is an error.
Tensor get_rng_state();
void set_rng_state(const Tensor& state);

// Holds the global generator's lock while alive; gen() is the generator.
class GeneratorGuard {
 public:
  GeneratorGuard();
  std::mt19937_64& gen() { return global_generator(); }

 private:
  std::unique_lock<std::mutex> lock_;
};

// 64 bits from the global generator, under its lock (a dropout call's key).
uint64_t random_bits();

// One uniform double in [0, 1) with 53 random bits.
double next_uniform(std::mt19937_64& gen);

// 64 random bits that are a pure function of (key, counter): SplitMix64's output for the state
// key + (counter + 1) * golden gamma. Counter-based streams let a kernel draw element i's bits
// without drawing 0..i-1 first, so it can split across threads and vectorise and still give
// the same numbers for one seed on any thread count (dropout draws one key per call).
// Counter c's state is key + (c + 1) * kCounterGamma, so a loop over consecutive counters can step
// the state by kCounterGamma and mix it (dropout's masks): a multiply fewer per draw.
inline constexpr uint64_t kCounterGamma = 0x9e3779b97f4a7c15ull;  // 2^64 / the golden ratio

// SplitMix64's output for the state z.
inline uint64_t counter_mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

inline uint64_t counter_bits(uint64_t key, uint64_t counter) {
  return counter_mix(key + (counter + 1) * kCounterGamma);
}

// Random tensors, drawn on the host from the global generator; the device comes after the dtype
// (randint has none: Int64), as in graph/creation.h.
Tensor rand(Shape shape, DType dtype = kFloat32, const Device& device = kCPU);   // U[0, 1)
Tensor randn(Shape shape, DType dtype = kFloat32, const Device& device = kCPU);  // N(0, 1)
Tensor normal(double mean, double std, Shape shape, DType dtype = kFloat32,
              const Device& device = kCPU);
// Int64 in [low, high)
Tensor randint(int64_t low, int64_t high, Shape shape, const Device& device = kCPU);

}  // namespace ember
