// random_horizontal_flip and random_crop: the draws (Note [Augmentation draws]), then copy loops
// over whole rows, by element size (the values are only moved, so any dtype of that size).
#include "data/image_transforms.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "graph/random.h"
#include "graph/strided.h"

namespace ember::data {

namespace {

// The images as a contiguous CPU tensor (N, C, H, W), whatever they came as; checks the rank.
Tensor batched(const Tensor& images, std::string_view op) {
  EMBER_CHECK(images.dim() == 3 || images.dim() == 4,
              "{}: images must be (N, C, H, W) or (C, H, W), got shape {}", op, images.shape());
  const Tensor x = images.detach().cpu().contiguous();
  return images.dim() == 3 ? x.unsqueeze(0) : x;
}

// out (N, C, H', W') back to the rank and device the images came in.
Tensor restore(const Tensor& out, const Tensor& images) {
  return (images.dim() == 3 ? out.squeeze(0) : out).to(images.device());
}

// body.template operator()<E>() with E an unsigned type of the dtype's element size.
template <class F>
void by_element_size(DType dtype, F&& body) {
  switch (element_size(dtype)) {
    case 1:
      return body.template operator()<uint8_t>();
    case 2:
      return body.template operator()<uint16_t>();
    case 4:
      return body.template operator()<uint32_t>();
    case 8:
      return body.template operator()<uint64_t>();
  }
  throw Error(fmt::format("image transforms: no copy loop for {}", dtype_name(dtype)));
}

// A uniform integer in [0, range), as randint draws it (rejection keeps every value as likely).
int64_t bounded(std::mt19937_64& gen, uint64_t range) {
  const uint64_t limit = UINT64_MAX - UINT64_MAX % range;
  uint64_t r;
  do r = gen();
  while (r >= limit);
  return static_cast<int64_t>(r % range);
}

}  // namespace

Tensor random_horizontal_flip(const Tensor& images, double p) {
  EMBER_CHECK(p >= 0 && p <= 1, "random_horizontal_flip: p must be in [0, 1], got {}", p);
  const Tensor x = batched(images, "random_horizontal_flip");
  const int64_t N = x.size(0), C = x.size(1), H = x.size(2), W = x.size(3);
  std::vector<uint8_t> flip(static_cast<size_t>(N));
  {
    GeneratorGuard guard;
    for (auto& f : flip) f = next_uniform(guard.gen()) < p;
  }
  Tensor out = empty(x.shape(), x.dtype());
  // x, out (N, C, H, W): image n's rows reversed where flip[n], else copied.
  by_element_size(x.dtype(), [&]<class E>() {
    const E* din = static_cast<const E*>(x.data_bytes());
    E* dout = static_cast<E*>(out.data_bytes());
    const int64_t image = C * H * W;
    parallel_for(
        N,
        [&](int64_t begin, int64_t end) {
          for (int64_t n = begin; n < end; ++n) {
            const E* src = din + n * image;
            E* dst = dout + n * image;
            if (!flip[static_cast<size_t>(n)]) {
              std::memcpy(dst, src, static_cast<size_t>(image) * sizeof(E));
              continue;
            }
            for (int64_t row = 0; row < C * H; ++row)
              std::reverse_copy(src + row * W, src + (row + 1) * W, dst + row * W);
          }
        },
        row_grain(image));
  });
  return restore(out, images);
}

Tensor random_crop(const Tensor& images, int64_t size, int64_t padding) {
  EMBER_CHECK(size >= 1, "random_crop: size must be at least 1, got {}", size);
  EMBER_CHECK(padding >= 0, "random_crop: padding must be non-negative, got {}", padding);
  const Tensor x = batched(images, "random_crop");
  const int64_t N = x.size(0), C = x.size(1), H = x.size(2), W = x.size(3);
  EMBER_CHECK(size <= H + 2 * padding && size <= W + 2 * padding,
              "random_crop: size {} is larger than the images {} x {} padded by {} ({} x {})", size,
              H, W, padding, H + 2 * padding, W + 2 * padding);
  std::vector<int64_t> top(static_cast<size_t>(N)), left(static_cast<size_t>(N));
  {
    GeneratorGuard guard;
    for (size_t n = 0; n < top.size(); ++n) {
      top[n] = bounded(guard.gen(), static_cast<uint64_t>(H + 2 * padding - size + 1));
      left[n] = bounded(guard.gen(), static_cast<uint64_t>(W + 2 * padding - size + 1));
    }
  }
  Tensor out = empty({N, C, size, size}, x.dtype());
  // x (N, C, H, W), out (N, C, S, S): out[n, c, y, j] = x[n, c, top + y - padding, left + j -
  // padding], zero outside x. Per image, the columns of x a row takes are one run [j0, j1).
  by_element_size(x.dtype(), [&]<class E>() {
    const E* din = static_cast<const E*>(x.data_bytes());
    E* dout = static_cast<E*>(out.data_bytes());
    parallel_for(
        N,
        [&](int64_t begin, int64_t end) {
          for (int64_t n = begin; n < end; ++n) {
            const int64_t row0 = top[static_cast<size_t>(n)] - padding;
            const int64_t col0 = left[static_cast<size_t>(n)] - padding;
            const int64_t j0 = std::clamp<int64_t>(-col0, 0, size);
            const int64_t j1 = std::clamp<int64_t>(W - col0, j0, size);
            for (int64_t c = 0; c < C; ++c) {
              const E* src = din + (n * C + c) * H * W;
              E* dst = dout + (n * C + c) * size * size;
              for (int64_t y = 0; y < size; ++y, dst += size) {
                const int64_t r = row0 + y;
                if (r < 0 || r >= H) {
                  std::fill(dst, dst + size, E{0});
                  continue;
                }
                std::fill(dst, dst + j0, E{0});
                if (j1 > j0) std::copy(src + r * W + col0 + j0, src + r * W + col0 + j1, dst + j0);
                std::fill(dst + j1, dst + size, E{0});
              }
            }
          }
        },
        row_grain(C * size * size));
  });
  return restore(out, images);
}

}  // namespace ember::data
