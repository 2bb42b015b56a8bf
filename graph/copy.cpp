// The strided copy kernel with broadcasting and dtype conversion.
#include "graph/copy.h"

#include <algorithm>

#include "graph/device_backend.h"
#include "graph/strided.h"

namespace ember {

Shape broadcast_shapes(const Shape& a, const Shape& b, std::string_view op) {
  const size_t n = std::max(a.size(), b.size());
  Shape out(n);
  for (size_t i = 0; i < n; ++i) {
    const int64_t da = i < n - a.size() ? 1 : a[i - (n - a.size())];
    const int64_t db = i < n - b.size() ? 1 : b[i - (n - b.size())];
    EMBER_CHECK(da == db || da == 1 || db == 1,
                "{}: shapes {} and {} cannot be broadcast (dim {}: {} vs {})", op, a, b, i, da, db);
    out[i] = da == 1 ? db : da;
  }
  return out;
}

Shape broadcast_strides(const Tensor& t, const Shape& shape) {
  const size_t lead = shape.size() - t.shape().size();
  Shape strides(shape.size(), 0);
  for (size_t d = 0; d < t.shape().size(); ++d)
    strides[lead + d] = t.shape()[d] == 1 && shape[lead + d] != 1 ? 0 : t.strides()[d];
  return strides;
}

void copy_into(const Tensor& dst, const Tensor& src) {
  const Shape target = broadcast_shapes(dst.shape(), src.shape(), "copy_");
  EMBER_CHECK(target == dst.shape(), "copy_: source of shape {} does not broadcast to {}",
              src.shape(), dst.shape());
  if (!dst.device().is_cpu() || !src.device().is_cpu()) {
    elementwise_on_device(dst, cuda::kernels::Op::Copy, dst.dtype(), {src}, "copy_");
    return;
  }
  dispatch_all(dst.dtype(), [&]<class D>() {
    dispatch_all(src.dtype(), [&]<class S>() {
      D* out = dst.data<D>();
      const S* in = src.data<S>();
      if (dst.is_contiguous() && src.is_contiguous() && src.shape() == dst.shape()) {
        const int64_t n = dst.numel();
        if constexpr (std::is_same_v<D, S>) {
          std::copy(in, in + n, out);
        } else {
          parallel_for(n, [&](int64_t begin, int64_t end) {
            for (int64_t i = begin; i < end; ++i) out[i] = cast_value<D>(in[i]);
          });
        }
        return;
      }
      StridedLoop<2> loop(dst.shape(), {dst.strides(), broadcast_strides(src, dst.shape())});
      loop.run([&](const auto& off, int64_t n, const auto& st) {
        D* o = out + off[0];
        const S* s = in + off[1];
        const int64_t so = st[0], si = st[1];  // locals: loops reading them vectorise
        if (so == 1 && si == 1) {
          for (int64_t i = 0; i < n; ++i) o[i] = cast_value<D>(s[i]);
        } else {
          for (int64_t i = 0; i < n; ++i) o[i * so] = cast_value<D>(s[i * si]);
        }
      });
    });
  });
}

}  // namespace ember
