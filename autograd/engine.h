// The backward engine (autograd/engine.cpp), above ops/: Tensor::backward calls run_backward,
// and autograd::grad (torch.autograd.grad) runs the same engine returning the gradients of the
// inputs instead of accumulating them. With create_graph the pass is recorded, so gradients can
// be differentiated again (Note [Double backward] in graph/autograd.h).
#pragma once

#include <functional>
#include <optional>
#include <vector>

#include "graph/autograd.h"

namespace ember {

// Runs backward from `root` (seeded with `grad`, or 1 for a one-element root), accumulating into
// the leaves' .grad; create_graph records the pass and retains the graph.
void run_backward(const Tensor& root, const Tensor& grad, bool retain_graph,
                  bool create_graph = false);

namespace autograd {
// torch.autograd.grad: d(outputs)/d(inputs), returned and not accumulated into .grad.
// grad_outputs: one per output (undefined = ones for a one-element output); retain_graph defaults
// to create_graph; an input the outputs do not reach is an Error naming it, or an undefined
// Tensor with allow_unused. Only the Nodes between the outputs and the inputs run.
std::vector<Tensor> grad(const std::vector<Tensor>& outputs, const std::vector<Tensor>& inputs,
                         const std::vector<Tensor>& grad_outputs = {},
                         std::optional<bool> retain_graph = std::nullopt, bool create_graph = false,
                         bool allow_unused = false);

namespace detail {
// autograd::grad under create_graph (allow_unused) for results that will be differentiated and
// never read (autograd::functional's vhp, hvp, jvp, hessian): a Node may leave such a result's
// value as zeros and skip its work (Note [Results for their graph alone] in autograd/engine.cpp).
std::vector<Tensor> grad_for_graph(const std::vector<Tensor>& outputs,
                                   const std::vector<Tensor>& inputs,
                                   const std::vector<Tensor>& grad_outputs);
}  // namespace detail
}  // namespace autograd

// Queues fn to run once the backward pass running on this thread has run every Node, before that
// backward returns (torch's Variable._execution_engine.queue_callback). Callable only from inside
// a backward (a Node, a leaf's post-accumulate-grad hook); callbacks run in the order queued, and
// one may queue more. DistributedDataParallel waits for its all-reduces here.
void queue_callback(std::function<void()> fn);

}  // namespace ember
