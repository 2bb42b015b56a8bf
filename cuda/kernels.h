// The CUDA backend's kernels, as a table of entry points: the GPU's (cuda/*.cu, compiled by nvcc
// where CMake finds the toolkit) and the emulated device's (cuda/host.cpp: the same kernel bodies
// run by a host loop, Note [Host emulation of a GPU] in graph/device_backend.h). A leaf below the
// core: plain C++ types only, no Ember header, so nvcc never compiles Ember's (or fmt's) headers.
// Each entry queues its kernel on `stream` (the device's, cudaStream_t as void*; unused by the
// host's) and returns 0 when queued, else a status the caller turns into an ember::Error: the
// launch's cudaError_t, or kUnsupported.
#pragma once

#include <cstddef>
#include <cstdint>

namespace ember::cuda::kernels {

struct Elementwise;  // cuda/elementwise.h
struct Reduce;       // cuda/reduce.h
struct Gemm;         // cuda/gemm.h
struct Rows;         // cuda/rows.h
struct IndexAlong;   // cuda/index.h
struct DropoutMask;  // cuda/random.h
struct OptimStep;    // cuda/optim.h

// An op asked in a type it is not defined in (cuda/elementwise.h's supported()).
inline constexpr int kUnsupported = -1;
// cuBLAS's status s comes back as kCublasError + s (cuda/gemm.cu).
inline constexpr int kCublasError = 100000;

// Each side fills it in the members' order (cuda/host.cpp, cuda/table.cu): every member has its
// own argument type, so an entry in the wrong place does not compile.
struct Table {
  // data[i] = pattern for i in [0, n): elements of element_size bytes (1, 2, 4 or 8), each the
  // low element_size bytes of `pattern` (a value's bits as the host laid them out).
  int (*fill)(void* data, int64_t n, size_t element_size, uint64_t pattern, void* stream);
  // One elementwise op over strided operands (cuda/elementwise.h).
  int (*elementwise)(const Elementwise& args, void* stream);
  // Sums over a set of dims into a contiguous output (cuda/reduce.h).
  int (*sum)(const Reduce& args, void* stream);
  // A batch of products at constant strides (cuda/gemm.h).
  int (*gemm)(const Gemm& args, void* stream);
  // An op along one dim, a row at a time (cuda/rows.h).
  int (*rows)(const Rows& args, void* stream);
  // gather or scatter_add along one dim (cuda/index.h).
  int (*index)(const IndexAlong& args, void* stream);
  // dropout's keep mask (cuda/random.h).
  int (*dropout_mask)(const DropoutMask& args, void* stream);
  // One optimizer update of up to kMaxOptimTensors parameters (cuda/optim.h).
  int (*optim)(const OptimStep& args, void* stream);
};

// The GPU's kernels: only in a build with CUDA (EMBER_WITH_CUDA).
const Table& device_table();
// The same kernels on the host, for the emulated device: in every build.
const Table& host_table();

}  // namespace ember::cuda::kernels
