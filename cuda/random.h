// Random numbers of the CUDA backend: counter-based, as the CPU's (graph/random.h), so that one
// seed gives the same numbers on any device and thread count. dropout's mask: with n elements
// and h = n / 2, element i < h keeps when the low 32 bits of counter_bits(key, i) reach the
// threshold, element h + i by the high 32 bits of the same draw, an odd last element by the low
// bits of counter_bits(key, h) (Note [Dropout masks] in ops/dropout_mask.h).
#pragma once

#include "cuda/elementwise.h"

namespace ember::cuda::kernels {

// SplitMix64's output for key + (counter + 1) * 2^64 / φ: graph/random.h's counter_bits, bit for
// bit (tests/test_device.cpp checks that they agree).
EMBER_HD inline uint64_t counter_bits(uint64_t key, uint64_t counter) {
  uint64_t z = key + (counter + 1) * 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

struct DropoutMask {
  uint64_t key = 0;
  uint32_t threshold = 0;  // p · 2^32: an element drops when its 32 bits are below
  int64_t n = 0;
  bool* keep = nullptr;  // n elements, contiguous
};

EMBER_HD inline void dropout_mask_element(const DropoutMask& m, int64_t i) {
  const int64_t half = m.n / 2;
  uint32_t bits;
  if (i < half)
    bits = static_cast<uint32_t>(counter_bits(m.key, static_cast<uint64_t>(i)));
  else if (i < 2 * half)
    bits = static_cast<uint32_t>(counter_bits(m.key, static_cast<uint64_t>(i - half)) >> 32);
  else
    bits = static_cast<uint32_t>(counter_bits(m.key, static_cast<uint64_t>(half)));
  m.keep[i] = bits >= m.threshold;
}

}  // namespace ember::cuda::kernels
