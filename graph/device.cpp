#include "graph/device.h"

#include <atomic>
#include <charconv>

#include "graph/error.h"

#ifdef EMBER_WITH_CUDA
#include <cuda_runtime_api.h>

#include <memory>
#include <mutex>
#include <vector>

#include "cuda/kernels.h"
#include "graph/caching_allocator.h"
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

// Makes device `index` the calling thread's current one while alive (the runtime keeps one per
// thread), and puts the previous one back.
class DeviceGuard {
 public:
  explicit DeviceGuard(int index) {
    check_cuda(cudaGetDevice(&previous_), "cudaGetDevice");
    if (previous_ != index) check_cuda(cudaSetDevice(index), "cudaSetDevice");
    changed_ = previous_ != index;
  }
  ~DeviceGuard() {
    if (changed_) cudaSetDevice(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = 0;
  bool changed_ = false;
};

// The caching allocator's backend: the driver's memory of one device.
struct DriverMemory {
  int index;
  void* alloc(size_t bytes) {
    DeviceGuard guard(index);
    void* p = nullptr;
    if (cudaMalloc(&p, bytes) == cudaSuccess) return p;
    cudaGetLastError();  // out of memory is not sticky: clear it, the allocator decides
    return nullptr;
  }
  void release(void* p) {
    DeviceGuard guard(index);
    check_cuda(cudaFree(p), "cudaFree");
  }
  std::string name() const { return fmt::format("cuda:{}", index); }
};

// A device's stream (every kernel and copy of Ember's on that device is queued on it, so they
// run in the order they were issued: Note [Caching allocator]) and its caching allocator.
struct DeviceState {
  explicit DeviceState(int index) : allocator(DriverMemory{index}) {
    DeviceGuard guard(index);
    check_cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking),
               "cudaStreamCreateWithFlags");
  }
  CachingAllocator<DriverMemory> allocator;
  cudaStream_t stream = nullptr;
};

// The devices' states, each made at its first use. Never destroyed: Storages of static tensors
// may be freed after static destruction.
std::mutex g_states_mutex;
std::vector<std::unique_ptr<DeviceState>>& states() {
  static auto* all = new std::vector<std::unique_ptr<DeviceState>>();
  return *all;
}

DeviceState& state(int index) {
  std::lock_guard lock(g_states_mutex);
  std::vector<std::unique_ptr<DeviceState>>& all = states();
  if (all.empty()) all.resize(static_cast<size_t>(probe().count));
  EMBER_CHECK(index >= 0 && index < static_cast<int>(all.size()),
              "cuda: device {} out of range for {} device(s)", index, all.size());
  std::unique_ptr<DeviceState>& s = all[static_cast<size_t>(index)];
  if (!s) s = std::make_unique<DeviceState>(index);
  return *s;
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

MemoryStats memory_stats(int device) {
  check_device(Device(DeviceType::CUDA, device), "cuda::memory_stats");
  return state(device).allocator.stats();
}

void empty_cache() {
  std::vector<DeviceState*> started;
  {
    std::lock_guard lock(g_states_mutex);
    for (const auto& s : states())
      if (s) started.push_back(s.get());
  }
  for (DeviceState* s : started) s->allocator.empty_cache();
}

namespace detail {

void* allocate(const Device& device, size_t nbytes) {
  return state(device.index()).allocator.allocate(nbytes);
}

void free(const Device& device, void* p) { state(device.index()).allocator.free(p); }

void copy_bytes(void* dst, const Device& dst_device, const void* src, const Device& src_device,
                size_t nbytes) {
  EMBER_CHECK(dst_device.is_cuda() || src_device.is_cuda(),
              "cuda::copy_bytes: neither {} nor {} is a CUDA device", dst_device, src_device);
  if (nbytes == 0) return;
  if (dst_device.is_cuda() && src_device.is_cuda() && dst_device != src_device) {
    // Between two GPUs: after the source's queued work, then wait for the copy.
    const int from = src_device.index(), to = dst_device.index();
    check_cuda(cudaStreamSynchronize(state(from).stream), "cudaStreamSynchronize");
    DeviceGuard guard(to);
    const cudaStream_t stream = state(to).stream;
    check_cuda(cudaMemcpyPeerAsync(dst, to, src, from, nbytes, stream), "cudaMemcpyPeerAsync");
    check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    return;
  }
  const int index = dst_device.is_cuda() ? dst_device.index() : src_device.index();
  DeviceGuard guard(index);
  const cudaStream_t stream = state(index).stream;
  // From pageable host memory the call returns once the source is staged (it may be freed); to
  // host memory the stream is waited for, so that the bytes are there on return.
  check_cuda(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDefault, stream), "cudaMemcpyAsync");
  if (dst_device.is_cpu()) check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
}

void fill_bytes(void* data, int64_t n, size_t element_size, uint64_t pattern,
                const Device& device) {
  DeviceGuard guard(device.index());
  const int status = kernels::fill(data, n, element_size, pattern, state(device.index()).stream);
  check_cuda(static_cast<cudaError_t>(status), "the fill kernel's launch");
}

}  // namespace detail

#else  // built without the CUDA toolkit

int device_count() { return 0; }

std::string unavailable_reason() {
  return "Ember was built without CUDA (CMake found no CUDA toolkit, or EMBER_CUDA=OFF)";
}

void synchronize() {
  throw Error(fmt::format("cuda::synchronize: no CUDA device: {}", unavailable_reason()));
}

MemoryStats memory_stats(int device) {
  check_device(Device(DeviceType::CUDA, device), "cuda::memory_stats");
  return {};
}

void empty_cache() {}

// No CUDA storage can be made in this build: check_device refuses first; these say so again.
namespace detail {

void* allocate(const Device& device, size_t) {
  throw Error(fmt::format("cuda: cannot allocate on {}: {}", device, unavailable_reason()));
}

void free(const Device& device, void*) {
  throw Error(fmt::format("cuda: cannot free on {}: {}", device, unavailable_reason()));
}

void copy_bytes(void*, const Device& dst_device, const void*, const Device& src_device, size_t) {
  throw Error(fmt::format("cuda: cannot copy from {} to {}: {}", src_device, dst_device,
                          unavailable_reason()));
}

void fill_bytes(void*, int64_t, size_t, uint64_t, const Device& device) {
  throw Error(fmt::format("cuda: cannot fill on {}: {}", device, unavailable_reason()));
}

}  // namespace detail

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
}

}  // namespace ember
