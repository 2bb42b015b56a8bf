// Tensor creation from host data, constants, ranges and the identity.
#include "graph/creation.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace ember {

namespace {

template <class S>
Tensor from_host(const std::vector<S>& data, Shape shape, DType dtype, const Device& device) {
  check_device(device, "from_vector");
  const int64_t n = shape_numel(shape);
  EMBER_CHECK(static_cast<int64_t>(data.size()) == n,
              "from_vector: {} values cannot fill shape {} ({} elements)", data.size(), shape, n);
  Tensor out = empty(shape, dtype);
  dispatch_all(dtype, [&]<class T>() {
    T* p = out.data<T>();
    for (int64_t i = 0; i < n; ++i) {
      if constexpr (std::is_same_v<T, bool>)
        p[i] = data[i] != S(0);
      else
        p[i] = static_cast<T>(data[i]);
    }
  });
  return out.to(device);
}

}  // namespace

Tensor from_vector(const std::vector<double>& data, Shape shape, DType dtype,
                   const Device& device) {
  return from_host(data, std::move(shape), dtype, device);
}
Tensor from_vector(const std::vector<float>& data, Shape shape, const Device& device) {
  return from_host(data, std::move(shape), kFloat32, device);
}
Tensor from_vector(const std::vector<int64_t>& data, Shape shape, const Device& device) {
  return from_host(data, std::move(shape), kInt64, device);
}

Tensor tensor(std::initializer_list<double> data, DType dtype, const Device& device) {
  return from_vector(std::vector<double>(data), {static_cast<int64_t>(data.size())}, dtype, device);
}

Tensor scalar_tensor(double value, DType dtype, const Device& device) {
  return full({}, value, dtype, device);
}

Tensor full(Shape shape, double value, DType dtype, const Device& device) {
  check_device(device, "full");
  Tensor out = empty(shape, dtype, device);
  if (device.is_cuda()) {  // one kernel on the device: the value's bits, as the host lays them out
    const uint64_t pattern = dispatch_all(dtype, [&]<class T>() {
      const T v = cast_value<T>(value);
      uint64_t bits = 0;
      std::memcpy(&bits, &v, sizeof(T));
      return bits;
    });
    cuda::detail::fill_bytes(out.data_bytes(), out.numel(), element_size(dtype), pattern, device);
    return out;
  }
  dispatch_all(dtype, [&]<class T>() {
    T* p = out.data<T>();
    std::fill(p, p + out.numel(), cast_value<T>(value));
  });
  return out;
}

Tensor zeros(Shape shape, DType dtype, const Device& device) {
  return full(std::move(shape), 0.0, dtype, device);
}
Tensor ones(Shape shape, DType dtype, const Device& device) {
  return full(std::move(shape), 1.0, dtype, device);
}
Tensor zeros_like(const Tensor& t) { return zeros(t.shape(), t.dtype(), t.device()); }
Tensor ones_like(const Tensor& t) { return ones(t.shape(), t.dtype(), t.device()); }
Tensor full_like(const Tensor& t, double value) {
  return full(t.shape(), value, t.dtype(), t.device());
}

Tensor arange(double start, double end, double step, DType dtype, const Device& device) {
  check_device(device, "arange");
  EMBER_CHECK(step != 0, "arange: step must be nonzero");
  EMBER_CHECK(std::isfinite(start) && std::isfinite(end) && std::isfinite(step),
              "arange: start {}, end {} and step {} must be finite", start, end, step);
  EMBER_CHECK((end - start) / step >= 0,
              "arange: end {} is not reachable from start {} with step {}", end, start, step);
  const double count = std::ceil((end - start) / step);
  EMBER_CHECK(count < 0x1p62, "arange: [{}, {}) in steps of {} has {:g} elements, too many", start,
              end, step, count);
  const auto n = static_cast<int64_t>(count);
  Tensor out = empty({n}, dtype);
  dispatch_numeric(dtype, "arange", [&]<class T>() {
    T* p = out.data<T>();
    for (int64_t i = 0; i < n; ++i) p[i] = cast_value<T>(start + static_cast<double>(i) * step);
  });
  return out.to(device);
}

Tensor eye(int64_t n, DType dtype, const Device& device) {
  check_device(device, "eye");
  EMBER_CHECK(n >= 0, "eye: n must be non-negative, got {}", n);
  Tensor out = zeros({n, n}, dtype);
  dispatch_all(dtype, [&]<class T>() {
    T* p = out.data<T>();
    for (int64_t i = 0; i < n; ++i) p[i * n + i] = static_cast<T>(1);
  });
  return out.to(device);
}

}  // namespace ember
