// fill: every element of a contiguous buffer set to one bit pattern (zeros, ones, full on a GPU).
#include <cuda_runtime.h>

#include "cuda/launch.h"

namespace ember::cuda::kernels {

namespace {

template <class T>
__global__ void fill_kernel(T* data, int64_t n, T value) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) data[i] = value;
}

template <class T>
int launch(void* data, int64_t n, uint64_t pattern, cudaStream_t stream) {
  T value;
  __builtin_memcpy(&value, &pattern, sizeof(T));  // the low bytes on little-endian x86-64
  fill_kernel<T><<<blocks_for(n), kThreads, 0, stream>>>(static_cast<T*>(data), n, value);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace

int fill_on_device(void* data, int64_t n, size_t element_size, uint64_t pattern, void* stream) {
  if (n <= 0) return 0;
  const auto s = static_cast<cudaStream_t>(stream);
  switch (element_size) {
    case 1:
      return launch<uint8_t>(data, n, pattern, s);
    case 2:
      return launch<uint16_t>(data, n, pattern, s);
    case 4:
      return launch<uint32_t>(data, n, pattern, s);
    case 8:
      return launch<uint64_t>(data, n, pattern, s);
    default:
      return static_cast<int>(cudaErrorInvalidValue);
  }
}

}  // namespace ember::cuda::kernels
