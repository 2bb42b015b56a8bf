// Running the CUDA backend's kernels (cuda/kernels.h) on a device's tensors: the launches
// (graph/device_launch.h: the device's table of kernels, its stream, and a failed launch as an
// Error naming the op) and the helpers that hand them tensors. Internal: for ops/, not installed.
//
// Note [Host emulation of a GPU]
// With EMBER_CUDA_EMULATE=1 in its environment (read once, at the first question about
// devices), a process has one CUDA device, cuda:0, that is the host in disguise: its memory is
// host memory handed out by the same caching allocator, its copies are memcpy, and its kernels
// are the GPU's kernel bodies (cuda/elementwise.h and the like, written once as host-and-device
// code) run by a host loop (cuda/host.cpp). So everything between the API and the kernels runs,
// and is tested, on a machine without a GPU and in every build, the sanitizers' included (they
// then check the kernels' memory accesses too): each op's dispatch to the device's table, the
// strides and dtypes handed to a kernel, tensors, copies and the allocator's books on the
// device, backward on the device, Module::to and the optimizers on device parameters. What it
// cannot show is what only a GPU has: launch configurations, the device's math library, streams
// running ahead of the host. So a CUDA path counts as done once it has also run on a GPU
// (tools/gpu-check.sh). It takes the place of any real GPU; it is for tests, never for use.
//
// Note [Checks on the device]
// An op whose arguments are only valid for some values in a device's memory (indices in range)
// cannot check them on the host without copying them there and so waiting for the device: a
// wait inside every training step (an embedding's tokens, a loss's targets). Instead the kernel
// that reads them checks them: a bad one is skipped (its output left unwritten) and the first of
// them is reported into the device's check slot, with the id of a message the op registered
// (register_check: the op's name and its arguments' shapes, "{}" for the bad value). The host
// reads the slot whenever it next waits for the device (a copy to the host, synchronize()) and
// throws the message there, marked as found on the device: as torch's device-side asserts, the
// Error comes at the next synchronisation, not at the op, but it names the op and the value, and
// the device stays usable. On the emulated device the same (the check waits for a wait too).
// CPU tensors are checked on the host before the op runs, as always.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "graph/device.h"
#include "graph/device_launch.h"
#include "graph/tensor.h"

namespace ember {

// cuda/'s element type of a dtype (the same order).
inline cuda::kernels::ScalarType scalar_type_of(DType t) {
  return static_cast<cuda::kernels::ScalarType>(static_cast<int>(t));
}

// out = op(inputs...) elementwise on out's device (a CUDA one), the inputs on it too and
// broadcast to out's shape, each converted to `compute` and the result to out's dtype; p0, p1
// the op's parameters. `name` is the op named in errors. out may alias an input elementwise (an
// in-place op), never partially.
void elementwise_on_device(const Tensor& out, cuda::kernels::Op op, DType compute,
                           std::initializer_list<Tensor> inputs, std::string_view name,
                           double p0 = 0, double p1 = 0);

// out = the sum of x over the dims where reduce[d], on x's device (a CUDA one): out contiguous,
// of x's shape with the reduced dims of size 1 (keepdim) or gone, accumulated in double (floating
// x) or int64 and stored converted to out's dtype.
void sum_on_device(const Tensor& out, const Tensor& x, const std::vector<bool>& reduce,
                   std::string_view name);

// The row kernel `op` along `dim` of tensors all of one shape (views: an operand of one value
// per row has stride 0 along dim), on their device, computed in `compute`; outputs written in
// place (p0: Moments' eps, CrossEntropy's smoothing; i0: its ignore_index; reverse: Cumsum's
// direction). A bad value the kernel meets is reported with `check` (Note [Checks on the
// device]).
void rows_on_device(cuda::kernels::RowOp op, DType compute, int64_t dim,
                    std::initializer_list<Tensor> inputs, std::initializer_list<Tensor> outputs,
                    std::string_view name, bool reverse = false, double p0 = 0, int64_t i0 = 0,
                    const std::string& check = {});

// For every position p of `index` (Int64), with q = p at coordinate index[p] along dim: gather
// writes dense[p] = indexed[q], scatter_add adds indexed[q] += dense[p]. All on one device, of one
// dtype (index's aside), with as many dims. An index outside [0, indexed.size(dim)) is skipped;
// with a `check` message (a format with one "{}" for the index) it is reported at the host's next
// wait for the device (Note [Checks on the device]); without one the caller checked the indices.
void index_on_device(cuda::kernels::IndexOp op, const Tensor& dense, const Tensor& indexed,
                     int64_t dim, const Tensor& index, std::string_view name,
                     const std::string& check = {});

// t (with a size-1 dim `dim`, keepdim layout) seen with `shape` (t's with dim of the row's
// length) and stride 0 along dim: the one-value-per-row operand of rows_on_device.
Tensor per_row(const Tensor& t, const Shape& shape, int64_t dim);

}  // namespace ember
