#include "graph/device.h"

#include <atomic>
#include <charconv>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <unordered_map>
#include <vector>

#ifdef EMBER_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

#include "cuda/elementwise.h"
#include "cuda/index.h"
#include "cuda/kernels.h"
#include "cuda/reduce.h"
#include "cuda/rows.h"
#include "graph/caching_allocator.h"
#include "graph/device_launch.h"
#include "graph/error.h"

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

namespace {

#ifdef EMBER_WITH_CUDA

void check_cuda(cudaError_t status, std::string_view what) {
  if (status != cudaSuccess)
    throw Error(fmt::format("cuda: {} failed: {} ({})", what, cudaGetErrorString(status),
                            cudaGetErrorName(status)));
}

// Makes device `index` the calling thread's current one while alive (the runtime keeps one per
// thread), and puts the previous one back. Nothing on the emulated device.
class DeviceGuard {
 public:
  explicit DeviceGuard(int index) {
    if (detail::emulated()) return;
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

#endif

// The driver's answer to "how many devices?", asked once: the count, or why there are none.
struct Probe {
  int count = 0;
  std::string reason;
};

const Probe& probe() {
  static const Probe p = [] {
    Probe r;
    if (detail::emulated()) {
      r.count = 1;
      return r;
    }
#ifdef EMBER_WITH_CUDA
    const cudaError_t status = cudaGetDeviceCount(&r.count);
    if (status != cudaSuccess) {
      r.count = 0;
      r.reason = fmt::format("the CUDA runtime found no usable device: {} ({})",
                             cudaGetErrorString(status), cudaGetErrorName(status));
      cudaGetLastError();  // clear the sticky error
    } else if (r.count == 0) {
      r.reason = "the CUDA driver reports no device";
    }
#else
    r.reason = "Ember was built without CUDA (CMake found no CUDA toolkit, or EMBER_CUDA=OFF)";
#endif
    return r;
  }();
  return p;
}

// The caching allocator's backend: the driver's memory of one device, or host memory for the
// emulated one.
struct DeviceMemory {
  int index;
  void* alloc(size_t bytes) {
    if (detail::emulated()) return std::aligned_alloc(64, (bytes + 63) / 64 * 64);
#ifdef EMBER_WITH_CUDA
    DeviceGuard guard(index);
    void* p = nullptr;
    if (cudaMalloc(&p, bytes) == cudaSuccess) return p;
    cudaGetLastError();  // out of memory is not sticky: clear it, the allocator decides
#endif
    return nullptr;
  }
  void release(void* p) {
    if (detail::emulated()) return std::free(p);
#ifdef EMBER_WITH_CUDA
    DeviceGuard guard(index);
    check_cuda(cudaFree(p), "cudaFree");
#endif
  }
  std::string name() const { return fmt::format("cuda:{}", index); }
};

// A device's stream (every kernel and copy of Ember's on that device is queued on it, so they
// run in the order they were issued: Note [Caching allocator]) and its caching allocator.
struct DeviceState {
  explicit DeviceState(int index) : index(index), allocator(DeviceMemory{index}) {
    host_slot = device_slot = &emulated_slot;
#ifdef EMBER_WITH_CUDA
    if (detail::emulated()) return;
    DeviceGuard guard(index);
    cudaStream_t s = nullptr;
    check_cuda(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
    stream = s;
    // the check slot in mapped host memory: kernels write it, the host reads it after a wait
    void* host = nullptr;
    check_cuda(cudaHostAlloc(&host, sizeof(kernels::DeviceCheck), cudaHostAllocMapped),
               "cudaHostAlloc");
    host_slot = new (host) kernels::DeviceCheck();
    void* device = nullptr;
    check_cuda(cudaHostGetDevicePointer(&device, host, 0), "cudaHostGetDevicePointer");
    device_slot = static_cast<kernels::DeviceCheck*>(device);
#endif
  }

  // After the host waited for this device: throws what a kernel reported into the check slot,
  // clearing it (Note [Checks on the device]).
  void report_checks() {
    const kernels::DeviceCheck found = *host_slot;
    if (found.check == 0) return;
    *host_slot = {};
    std::string message;
    {
      std::lock_guard lock(checks_mutex);
      message = messages.at(static_cast<size_t>(found.check - 1));
    }
    throw Error(
        fmt::format("{} (found on cuda:{} by a kernel, reported at the host's next wait "
                    "for the device)",
                    fmt::format(fmt::runtime(message), found.value), index));
  }

  int32_t register_check(const std::string& message) {
    std::lock_guard lock(checks_mutex);
    const auto [at, added] = check_ids.try_emplace(message, int32_t(messages.size()) + 1);
    if (added) messages.push_back(message);
    return at->second;
  }

  int index;
  CachingAllocator<DeviceMemory> allocator;
  void* stream = nullptr;  // cudaStream_t; none on the emulated device
  std::atomic<int64_t> kernels{0}, products{0}, host_waits{0};  // cuda::launch_stats
  // Note [Checks on the device]: the slot as the host and as kernels see it, and the messages
  // its ids stand for (id k: messages[k - 1])
  kernels::DeviceCheck emulated_slot;
  kernels::DeviceCheck* host_slot = nullptr;
  kernels::DeviceCheck* device_slot = nullptr;
  std::mutex checks_mutex;
  std::unordered_map<std::string, int32_t> check_ids;
  std::vector<std::string> messages;
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

const kernels::Table& table() {
#ifdef EMBER_WITH_CUDA
  if (!detail::emulated()) return kernels::device_table();
#endif
  return kernels::host_table();
}

// A kernel's status as an Error naming `op`.
void check_launch(int status, std::string_view what, std::string_view op) {
  if (status == 0) return;
  if (status == kernels::kUnsupported)
    throw Error(fmt::format("{}: the CUDA backend's {} kernel does not support this op or dtype",
                            op, what));
  if (status >= kernels::kCublasError)
    throw Error(
        fmt::format("{}: cuBLAS failed with status {}", op, status - kernels::kCublasError));
#ifdef EMBER_WITH_CUDA
  const auto error = static_cast<cudaError_t>(status);
  throw Error(fmt::format("{}: the CUDA {} kernel's launch failed: {} ({})", op, what,
                          cudaGetErrorString(error), cudaGetErrorName(error)));
#else
  throw Error(fmt::format("{}: the {} kernel failed with status {}", op, what, status));
#endif
}

// Runs the table's `entry` on `device`'s stream with `args`; an Error naming `op` when the
// device is unusable or the kernel (`what`) refuses or fails to launch.
template <class Args>
void launch(int (*kernels::Table::*entry)(const Args&, void*), const Args& args,
            const Device& device, std::string_view what, std::string_view op) {
  check_device(device, op);
#ifdef EMBER_WITH_CUDA
  DeviceGuard guard(device.index());
#endif
  DeviceState& s = state(device.index());
  check_launch((table().*entry)(args, s.stream), what, op);
  s.kernels.fetch_add(1, std::memory_order_relaxed);
}

std::atomic<std::vector<kernels::Gemm>*> g_captured_products{nullptr};

}  // namespace

int device_count() { return probe().count; }

std::string unavailable_reason() { return probe().reason; }

std::string get_device_name(int device) {
  check_device(Device(DeviceType::CUDA, device), "cuda::get_device_name");
  if (detail::emulated()) return "the host, emulating a CUDA device (EMBER_CUDA_EMULATE=1)";
#ifdef EMBER_WITH_CUDA
  cudaDeviceProp prop{};
  check_cuda(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties");
  return prop.name;
#else
  return {};  // unreachable: check_device refused
#endif
}

void synchronize() {
  EMBER_CHECK(is_available(), "cuda::synchronize: no CUDA device: {}", unavailable_reason());
  for (int d = 0; d < device_count(); ++d) state(d).host_waits.fetch_add(1);
#ifdef EMBER_WITH_CUDA
  if (!detail::emulated()) {  // every emulated kernel ran when it was launched
    int current = 0;
    check_cuda(cudaGetDevice(&current), "cudaGetDevice");
    for (int d = 0; d < device_count(); ++d) {
      check_cuda(cudaSetDevice(d), "cudaSetDevice");
      check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    }
    check_cuda(cudaSetDevice(current), "cudaSetDevice");
  }
#endif
  for (int d = 0; d < device_count(); ++d) state(d).report_checks();
}

LaunchStats launch_stats(int device) {
  check_device(Device(DeviceType::CUDA, device), "cuda::launch_stats");
  const DeviceState& s = state(device);
  return {s.kernels.load(), s.products.load(), s.host_waits.load()};
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

bool emulated() {
  static const bool on = [] {
    const char* v = std::getenv("EMBER_CUDA_EMULATE");
    return v != nullptr && std::string_view(v) == "1";
  }();
  return on;
}

void* allocate(const Device& device, size_t nbytes) {
  check_device(device, "cuda: allocate");
  return state(device.index()).allocator.allocate(nbytes);
}

void free(const Device& device, void* p) { state(device.index()).allocator.free(p); }

void copy_bytes(void* dst, const Device& dst_device, const void* src, const Device& src_device,
                size_t nbytes) {
  EMBER_CHECK(dst_device.is_cuda() || src_device.is_cuda(),
              "cuda::copy_bytes: neither {} nor {} is a CUDA device", dst_device, src_device);
  check_device(dst_device.is_cuda() ? dst_device : src_device, "cuda: copy");
  if (nbytes == 0) return;
  // To the host or another device the host waits for the source's stream, and so hears of its
  // checks (Note [Checks on the device])
  DeviceState* waited = dst_device.is_cpu() || (src_device.is_cuda() && src_device != dst_device)
                            ? &state(src_device.index())
                            : nullptr;
  if (waited != nullptr) waited->host_waits.fetch_add(1);
  if (emulated()) {
    std::memcpy(dst, src, nbytes);
    if (waited != nullptr) waited->report_checks();
    return;
  }
#ifdef EMBER_WITH_CUDA
  if (dst_device.is_cuda() && src_device.is_cuda() && dst_device != src_device) {
    // Between two GPUs: after the source's queued work, then wait for the copy.
    const int from = src_device.index(), to = dst_device.index();
    check_cuda(cudaStreamSynchronize(static_cast<cudaStream_t>(state(from).stream)),
               "cudaStreamSynchronize");
    DeviceGuard guard(to);
    const auto stream = static_cast<cudaStream_t>(state(to).stream);
    check_cuda(cudaMemcpyPeerAsync(dst, to, src, from, nbytes, stream), "cudaMemcpyPeerAsync");
    check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    waited->report_checks();
    return;
  }
  const int index = dst_device.is_cuda() ? dst_device.index() : src_device.index();
  DeviceGuard guard(index);
  const auto stream = static_cast<cudaStream_t>(state(index).stream);
  // From pageable host memory the call returns once the source is staged (it may be freed); to
  // host memory the stream is waited for, so that the bytes are there on return.
  check_cuda(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDefault, stream), "cudaMemcpyAsync");
  if (dst_device.is_cpu()) check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  if (waited != nullptr) waited->report_checks();
#endif
}

void fill_bytes(void* data, int64_t n, size_t element_size, uint64_t pattern,
                const Device& device) {
  check_device(device, "cuda: fill");
#ifdef EMBER_WITH_CUDA
  DeviceGuard guard(device.index());
#endif
  DeviceState& s = state(device.index());
  check_launch(table().fill(data, n, element_size, pattern, s.stream), "fill", "fill");
  s.kernels.fetch_add(1, std::memory_order_relaxed);
}

void launch_elementwise(const kernels::Elementwise& args, const Device& device,
                        std::string_view op) {
  launch(&kernels::Table::elementwise, args, device, "elementwise", op);
}

void launch_gemm(const kernels::Gemm& args, const Device& device, std::string_view op) {
  launch(&kernels::Table::gemm, args, device, "gemm", op);
  state(device.index()).products.fetch_add(1, std::memory_order_relaxed);
  if (std::vector<kernels::Gemm>* into = g_captured_products.load()) [[unlikely]]
    into->push_back(args);
}

void capture_products(std::vector<kernels::Gemm>* into) { g_captured_products.store(into); }

int32_t register_check(const Device& device, const std::string& message) {
  return state(device.index()).register_check(message);
}

kernels::DeviceCheck* check_slot(const Device& device) { return state(device.index()).device_slot; }

void launch_index(const kernels::IndexAlong& args, const Device& device, std::string_view op) {
  launch(&kernels::Table::index, args, device, "index", op);
}

void launch_dropout_mask(const kernels::DropoutMask& args, const Device& device,
                         std::string_view op) {
  launch(&kernels::Table::dropout_mask, args, device, "dropout", op);
}

void launch_optim(const kernels::OptimStep& args, const Device& device, std::string_view op) {
  launch(&kernels::Table::optim, args, device, "optimizer", op);
}

void launch_rows(const kernels::Rows& args, const Device& device, std::string_view op) {
  launch(&kernels::Table::rows, args, device, "row", op);
}

void launch_sum(const kernels::Reduce& args, const Device& device, std::string_view op) {
  launch(&kernels::Table::sum, args, device, "sum", op);
}

}  // namespace detail

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
