#include "graph/device.h"

#include <atomic>
#include <charconv>

#include "graph/error.h"

#ifdef EMBER_WITH_CUDA
#include <cuda_runtime_api.h>

#include <mutex>
#endif

namespace ember {

namespace {

constexpr int kMaxDeviceIndex = 1 << 16;

// "cuda:N"'s N, or -1 when `digits` is not a decimal number in range.
int parse_index(std::string_view digits) {
  int index = -1;
  const char* end = digits.data() + digits.size();
  const auto [ptr, ec] = std::from_chars(digits.data(), end, index);
  if (digits.empty() || ec != std::errc() || ptr != end || index < 0 || index >= kMaxDeviceIndex)
    return -1;
  return index;
}

}  // namespace

Device::Device(DeviceType type, int index) : type_(type), index_(index) {
  EMBER_CHECK(type == DeviceType::CPU || type == DeviceType::CUDA, "Device: unknown device type {}",
              static_cast<int>(type));
  EMBER_CHECK(index >= 0 && index < kMaxDeviceIndex, "Device: index {} out of range for {}", index,
              type == DeviceType::CPU ? "cpu" : "cuda");
  EMBER_CHECK(type == DeviceType::CUDA || index == 0, "Device: cpu has no index {} (only 0)",
              index);
}

Device::Device(const std::string& name) : type_(DeviceType::CPU), index_(0) {
  const std::string_view s = name;
  if (s == "cpu" || s == "cpu:0") return;
  type_ = DeviceType::CUDA;
  if (s == "cuda") return;
  if (s.starts_with("cuda:")) {
    index_ = parse_index(s.substr(5));
    if (index_ >= 0) return;
  }
  throw Error(fmt::format(
      "Device: '{}' is not a device (expected \"cpu\", \"cuda\" or \"cuda:N\" with N in [0, {}))",
      name, kMaxDeviceIndex));
}

std::string Device::str() const {
  return is_cpu() ? std::string("cpu") : fmt::format("cuda:{}", index_);
}

std::ostream& operator<<(std::ostream& os, const Device& device) { return os << device.str(); }

namespace cuda {

#ifdef EMBER_WITH_CUDA

namespace {

// The driver's answer to "how many devices?", asked once: the count, or why there are none.
struct Probe {
  int count = 0;
  std::string reason;
};

const Probe& probe() {
  static const Probe p = [] {
    Probe r;
    const cudaError_t status = cudaGetDeviceCount(&r.count);
    if (status != cudaSuccess) {
      r.count = 0;
      r.reason = fmt::format("the CUDA runtime found no usable device: {} ({})",
                             cudaGetErrorString(status), cudaGetErrorName(status));
      cudaGetLastError();  // clear the sticky error
    } else if (r.count == 0) {
      r.reason = "the CUDA driver reports no device";
    }
    return r;
  }();
  return p;
}

void check_cuda(cudaError_t status, std::string_view what) {
  if (status != cudaSuccess)
    throw Error(fmt::format("cuda: {} failed: {} ({})", what, cudaGetErrorString(status),
                            cudaGetErrorName(status)));
}

}  // namespace

int device_count() { return probe().count; }

std::string unavailable_reason() { return probe().reason; }

void synchronize() {
  EMBER_CHECK(is_available(), "cuda::synchronize: no CUDA device: {}", unavailable_reason());
  int current = 0;
  check_cuda(cudaGetDevice(&current), "cudaGetDevice");
  for (int d = 0; d < device_count(); ++d) {
    check_cuda(cudaSetDevice(d), "cudaSetDevice");
    check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  }
  check_cuda(cudaSetDevice(current), "cudaSetDevice");
}

#else  // built without the CUDA toolkit

int device_count() { return 0; }

std::string unavailable_reason() {
  return "Ember was built without CUDA (CMake found no CUDA toolkit, or EMBER_CUDA=OFF)";
}

void synchronize() {
  throw Error(fmt::format("cuda::synchronize: no CUDA device: {}", unavailable_reason()));
}

#endif

bool is_available() { return device_count() > 0; }

namespace {
std::atomic<uint64_t> g_seed{0};
}  // namespace

// The seed the devices' counter-based generators start their streams from, kept with or
// without a device (torch's is lazy too).
void manual_seed(uint64_t seed) { g_seed.store(seed, std::memory_order_relaxed); }

uint64_t initial_seed() { return g_seed.load(std::memory_order_relaxed); }

}  // namespace cuda

void check_device(const Device& device, std::string_view op) {
  if (device.is_cpu()) return;
  EMBER_CHECK(cuda::is_available(), "{}: cannot use {}: {}", op, device,
              cuda::unavailable_reason());
  EMBER_CHECK(device.index() < cuda::device_count(),
              "{}: cannot use {}: there are {} CUDA device(s)", op, device, cuda::device_count());
  throw Error(
      fmt::format("{}: tensors on {} are not supported yet: Ember's CUDA backend has no "
                  "storage or kernels in this build",
                  op, device));
}

}  // namespace ember
