// The global mt19937_64 generator and rand/randn/normal/randint. Normals use Box-Muller on two
// 53-bit uniforms; both outputs of each pair are used.
#include "graph/random.h"

#include <cmath>
#include <numbers>
#include <sstream>

#include "graph/creation.h"
#include "graph/device.h"

namespace ember {

std::mt19937_64& global_generator() {
  static std::mt19937_64 gen(0);
  return gen;
}

namespace {
std::mutex& generator_mutex() {
  static std::mutex m;
  return m;
}
}  // namespace

GeneratorGuard::GeneratorGuard() : lock_(generator_mutex()) {}

void manual_seed(uint64_t seed) {
  {
    GeneratorGuard guard;
    guard.gen().seed(seed);
  }
  cuda::manual_seed(seed);
}

// std::mt19937_64 writes its state as 312 words and a position, separated by spaces.
constexpr int64_t kStateWords = 313;

Tensor get_rng_state() {
  std::stringstream text;
  {
    GeneratorGuard guard;
    text << guard.gen();
  }
  std::vector<int64_t> words;
  uint64_t w = 0;
  while (text >> w) words.push_back(static_cast<int64_t>(w));
  EMBER_CHECK(static_cast<int64_t>(words.size()) == kStateWords,
              "get_rng_state: the generator wrote {} words, expected {}", words.size(),
              kStateWords);
  return from_vector(words, {kStateWords});
}

void set_rng_state(const Tensor& state) {
  EMBER_CHECK(state.defined() && state.dtype() == kInt64 && state.dim() == 1 &&
                  state.numel() == kStateWords,
              "set_rng_state: expected the Int64 tensor of shape [{}] that get_rng_state gives, "
              "got {}",
              kStateWords,
              state.defined() ? fmt::format("{} of shape {}", state.dtype(), state.shape())
                              : std::string("an undefined tensor"));
  const std::vector<int64_t> words = state.to_vector<int64_t>();
  EMBER_CHECK(words.back() >= 0 && words.back() <= kStateWords - 1,
              "set_rng_state: position {} is not a generator state's (0 to {})", words.back(),
              kStateWords - 1);
  std::stringstream text;
  for (int64_t w : words) text << static_cast<uint64_t>(w) << ' ';
  std::mt19937_64 restored;
  text >> restored;
  EMBER_CHECK(!text.fail(), "set_rng_state: the tensor is not a generator state");
  GeneratorGuard guard;
  guard.gen() = restored;
}

uint64_t random_bits() {
  GeneratorGuard guard;
  return guard.gen()();
}

double next_uniform(std::mt19937_64& gen) { return static_cast<double>(gen() >> 11) * 0x1.0p-53; }

Tensor rand(Shape shape, DType dtype, const Device& device) {
  check_device(device, "rand");
  Tensor out = empty(shape, dtype);
  GeneratorGuard guard;
  auto& gen = guard.gen();
  dispatch_float(dtype, "rand", [&]<class T>() {
    T* p = out.data<T>();
    for (int64_t i = 0; i < out.numel(); ++i) {
      T v = static_cast<T>(next_uniform(gen));
      p[i] = v < T(1) ? v : std::nextafter(T(1), T(0));  // rounding to float must stay below 1
    }
  });
  return out.to(device);
}

Tensor normal(double mean, double std, Shape shape, DType dtype, const Device& device) {
  check_device(device, "normal");
  EMBER_CHECK(std >= 0, "normal: std must be non-negative, got {}", std);
  Tensor out = empty(shape, dtype);
  GeneratorGuard guard;
  auto& gen = guard.gen();
  dispatch_float(dtype, "normal", [&]<class T>() {
    T* p = out.data<T>();
    const int64_t n = out.numel();
    for (int64_t i = 0; i < n; i += 2) {
      const double u1 = 1.0 - next_uniform(gen);  // (0, 1]: log stays finite
      const double u2 = next_uniform(gen);
      const double r = std::sqrt(-2.0 * std::log(u1));
      p[i] = static_cast<T>(mean + std * r * std::cos(2 * std::numbers::pi * u2));
      if (i + 1 < n)
        p[i + 1] = static_cast<T>(mean + std * r * std::sin(2 * std::numbers::pi * u2));
    }
  });
  return out.to(device);
}

Tensor randn(Shape shape, DType dtype, const Device& device) {
  check_device(device, "randn");
  return normal(0.0, 1.0, std::move(shape), dtype, device);
}

Tensor randint(int64_t low, int64_t high, Shape shape, const Device& device) {
  check_device(device, "randint");
  EMBER_CHECK(low < high, "randint: low {} must be less than high {}", low, high);
  Tensor out = empty(shape, kInt64);
  GeneratorGuard guard;
  auto& gen = guard.gen();
  const auto range = static_cast<uint64_t>(high - low);
  int64_t* p = out.data<int64_t>();
  for (int64_t i = 0; i < out.numel(); ++i) {
    // Rejection sampling keeps every value equally likely.
    const uint64_t limit = UINT64_MAX - UINT64_MAX % range;
    uint64_t r;
    do r = gen();
    while (r >= limit);
    p[i] = low + static_cast<int64_t>(r % range);
  }
  return out.to(device);
}

}  // namespace ember
