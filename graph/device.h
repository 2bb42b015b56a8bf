// Device: where a tensor's storage lives, the CPU or one CUDA GPU (torch.device). Every tensor
// knows its device (Tensor::device()); ops run on their inputs' device.
//
// Note [CUDA availability]
// The CUDA backend is built when CMake finds the CUDA toolkit (option EMBER_CUDA); a build
// without it has the same API, with no device. Either way cuda::is_available() says whether a
// usable GPU is there (a driver and at least one device), and anything that needs one when there
// is none (a tensor moved or created on "cuda", synchronize()) is an ember::Error saying why,
// never a crash.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <string_view>

#include <fmt/format.h>

#include "graph/memory_stats.h"

namespace ember {

enum class DeviceType { CPU, CUDA };

class Device {
 public:
  // A CPU device has index 0; a CUDA device's index is in [0, 2^16): a negative one is an Error.
  Device(DeviceType type, int index = 0);
  // "cpu" (or "cpu:0"), "cuda" (device 0), "cuda:N"; anything else (as "gpu", "cuda:", "cpu:1",
  // "cuda:x", "CUDA") is an Error naming the string.
  Device(const std::string& name);
  Device(const char* name) : Device(std::string(name)) {}

  DeviceType type() const { return type_; }
  int index() const { return index_; }
  bool is_cpu() const { return type_ == DeviceType::CPU; }
  bool is_cuda() const { return type_ == DeviceType::CUDA; }
  std::string str() const;  // "cpu", "cuda:0"

  bool operator==(const Device&) const = default;

 private:
  DeviceType type_;
  int index_;
};

inline const Device kCPU{DeviceType::CPU};
inline const Device kCUDA{DeviceType::CUDA, 0};

std::ostream& operator<<(std::ostream& os, const Device& device);

namespace cuda {

// True when Ember was built with CUDA and a driver reports at least one device.
bool is_available();
// The number of usable devices: 0 without CUDA, a driver or a GPU.
int device_count();
// The device's name ("NVIDIA H200"; the emulated device says it is one), as
// torch.cuda.get_device_name; an Error without that device.
std::string get_device_name(int device = 0);
// Waits for everything queued on every device's stream; an Error without a usable device.
void synchronize();
// Seeds every device's generator (ember::manual_seed does too); without a device it is only
// kept, for when one is used. initial_seed() is the last seed (0 at start), as torch's.
void manual_seed(uint64_t seed);
uint64_t initial_seed();

// The caching allocator's books for one device (MemoryStats, graph/memory_stats.h; Note
// [Caching allocator] in graph/caching_allocator.h); an Error without that device. empty_cache()
// returns every cached block of every device to the driver (torch.cuda.empty_cache); without a
// device, nothing.
MemoryStats memory_stats(int device = 0);
void empty_cache();

// What the host asked of one device since the start (Ember's own books, no torch equivalent):
// kernels queued (products and fills included), of them cuBLAS products, and the times the host
// waited for the device's stream (a copy to host memory or to another device, synchronize()).
// A training step that asks for no value should wait none; an Error without that device.
struct LaunchStats {
  int64_t kernels = 0;
  int64_t products = 0;
  int64_t host_waits = 0;
};
LaunchStats launch_stats(int device = 0);

// Why no device can be used, for error messages: "Ember was built without CUDA", or the
// driver's answer ("no CUDA-capable device is detected"); empty when a device is usable.
std::string unavailable_reason();

namespace detail {
// The storage of tensors on a CUDA device (graph/tensor.cpp's Storage): a block of the device's
// caching allocator, and back.
void* allocate(const Device& device, size_t nbytes);
void free(const Device& device, void* p);
// nbytes from src on src_device to dst on dst_device, at least one of them a CUDA device, queued
// on the device's stream; returns once dst holds them where dst is host memory, and once src may
// be reused where src is.
void copy_bytes(void* dst, const Device& dst_device, const void* src, const Device& src_device,
                size_t nbytes);
// n elements of element_size bytes at data, on `device`, each set to the low bytes of pattern
// (cuda/fill.cu), queued on the device's stream.
void fill_bytes(void* data, int64_t n, size_t element_size, uint64_t pattern, const Device& device);
}  // namespace detail

}  // namespace cuda

// Throws an Error naming `op` unless `device` can hold tensors here: the CPU always can; a CUDA
// device needs a build with CUDA and a usable GPU with that index.
void check_device(const Device& device, std::string_view op);

}  // namespace ember

template <>
struct fmt::formatter<ember::Device> : fmt::formatter<std::string_view> {
  auto format(const ember::Device& d, fmt::format_context& ctx) const {
    return fmt::formatter<std::string_view>::format(d.str(), ctx);
  }
};
