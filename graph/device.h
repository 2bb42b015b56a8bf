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
// Waits for everything queued on every device's stream; an Error without a usable device.
void synchronize();
// Seeds every device's generator (ember::manual_seed does too); without a device it is only
// kept, for when one is used. initial_seed() is the last seed (0 at start), as torch's.
void manual_seed(uint64_t seed);
uint64_t initial_seed();

// Why no device can be used, for error messages: "Ember was built without CUDA", or the
// driver's answer ("no CUDA-capable device is detected"); empty when a device is usable.
std::string unavailable_reason();

}  // namespace cuda

// Throws an Error naming `op` unless `device` can hold tensors here: the CPU always can; a CUDA
// device needs a usable GPU with that index.
void check_device(const Device& device, std::string_view op);

}  // namespace ember

template <>
struct fmt::formatter<ember::Device> : fmt::formatter<std::string_view> {
  auto format(const ember::Device& d, fmt::format_context& ctx) const {
    return fmt::formatter<std::string_view>::format(d.str(), ctx);
  }
};
