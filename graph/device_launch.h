// Queuing the CUDA backend's kernels (cuda/kernels.h) on a device's stream, and the device's
// check slot: what graph/device.cpp, which holds each device's kernel table, stream and books,
// offers the layer above it. Internal: included through graph/device_backend.h, which adds the
// helpers that hand the kernels tensors, and whose notes these declarations cite; not installed.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "cuda/elementwise.h"
#include "cuda/gemm.h"
#include "cuda/index.h"
#include "cuda/optim.h"
#include "cuda/random.h"
#include "cuda/reduce.h"
#include "cuda/rows.h"

namespace ember {

class Device;  // graph/device.h

namespace cuda::detail {

// True when EMBER_CUDA_EMULATE=1: cuda:0 is the host (Note [Host emulation of a GPU]).
bool emulated();

// Queues one elementwise kernel (cuda/elementwise.h) on `device`'s stream; an Error naming `op`
// when the device is unusable or the launch fails.
void launch_elementwise(const kernels::Elementwise& args, const Device& device,
                        std::string_view op);
// Queues one sum (cuda/reduce.h) likewise.
void launch_sum(const kernels::Reduce& args, const Device& device, std::string_view op);
// Queues one gather or scatter_add (cuda/index.h) likewise.
void launch_index(const kernels::IndexAlong& args, const Device& device, std::string_view op);
// Queues dropout's mask (cuda/random.h), or one optimizer update (cuda/optim.h), likewise.
void launch_dropout_mask(const kernels::DropoutMask& args, const Device& device,
                         std::string_view op);
void launch_optim(const kernels::OptimStep& args, const Device& device, std::string_view op);
// Queues one row kernel (cuda/rows.h) likewise.
void launch_rows(const kernels::Rows& args, const Device& device, std::string_view op);
// The id of `message` (a format with one "{}" for the bad value) among `device`'s checks, and the
// slot its kernels report into (Note [Checks on the device]).
int32_t register_check(const Device& device, const std::string& message);
kernels::DeviceCheck* check_slot(const Device& device);

// Queues one batch of products (cuda/gemm.h) likewise.
void launch_gemm(const kernels::Gemm& args, const Device& device, std::string_view op);
// While `into` is set (not null), every launch_gemm of any thread also appends its arguments
// there: bench/ replays a training step's products alone, to weigh them against the whole step.
void capture_products(std::vector<kernels::Gemm>* into);

}  // namespace cuda::detail

}  // namespace ember
