// Forward-mode autograd's core: the thread's stack of dual levels, the tangents a TensorImpl
// carries, and the step record<>() (graph/autograd.h) takes for an op while a level is open. The
// user's interface is autograd/forward_ad.h (DualLevel, make_dual, unpack_dual).
//
// Note [Forward grads]
// A dual tensor is a TensorImpl whose forward_grads hold one tangent per dual level, outermost
// first. A level is a DualLevel alive on this thread: levels nest, each with a process-unique id
// and its depth in the thread's stack. A tangent is alive while its level is open (its depth is
// below the stack's size and the level there has its id); when a level closes, every tangent
// made at it is dropped (the level keeps weak handles of the TensorImpls it gave one), and the
// outer levels' tangents stay.
//
// Invariants:
//   - A tangent has its tensor's shape and dtype, and lives on its device. A tensor without a
//     tangent at a level has a zero tangent there, and costs nothing: an op none of whose inputs
//     has a tangent makes none.
//   - Ops see the tangents of the outermost `visible` levels only (detail::t_fw_visible: all the
//     open levels, except while a forward rule runs). An op with inputs carrying visible tangents
//     makes its Node (as for reverse mode) and, level by level from the outermost, calls the
//     Node's jvp() with only the levels outside the one being computed visible. So the ops of a
//     rule at depth d carry the tangents of the levels outside d (the rule's inputs and outputs
//     have them: an output gets its tangents outermost first), and a jvp of a jvp gives second
//     derivatives, as JAX's nested jvp does. A rule's ops record for reverse mode as any op does:
//     a loss of tangents differentiates backward (reverse over forward), and a backward run with
//     create_graph inside a level carries tangents through its ops (forward over reverse). A
//     backward without create_graph runs fused first-order kernels that carry none: forward over
//     reverse asks for create_graph.
//   - A view's tangent is the same view of its base's tangent: the view ops' rules re-run the op
//     on the tangent. An in-place op updates the tangent in place (Note [Forward grads of in-place
//     ops] in ops/elementwise.cpp), so the views of a dual tensor see it; an in-place op that
//     gives a tangent to a tensor without one gives it a new tangent, which views made before
//     do not share (torch gives the base one; Ember does not track bases).
//   - A rule is written in ops, so that its result carries the outer levels' tangents and records
//     for reverse mode. Where none of its operands would record anything (records_graph() in
//     graph/autograd.h: no visible tangent among them, and no gradient wanted; a jvp without
//     create_graph at one level, say), a rule may instead compute the same tangent by raw kernels
//     from its Node's saved data (layer_norm's and head_attention's do).
//   - An op whose Node has no jvp() throws naming the op (Node::jvp), never a silent zero. Ops
//     without a gradient (comparisons, indices) make no Node and no tangent: their result is
//     constant.
//   - detach() drops the tangents (torch's too). A Node's saved tensors keep them (they are the
//     op's inputs and outputs, and its backward's ops run on them under forward over reverse):
//     Node::save copies an input's, and step() gives a saved output the output's.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "graph/tensor.h"

namespace ember {

class Node;

namespace detail {
// How many of the open dual levels ops see now (Note [Forward grads]); 0 outside any level.
extern thread_local uint32_t t_fw_visible;
}  // namespace detail

namespace fwd {

// The number of dual levels open on this thread.
uint32_t open_levels();
// Opens a level (the innermost); returns its depth. close_level(depth) ends it and drops its
// tangents; levels close innermost first.
uint32_t open_level();
void close_level(uint32_t depth);

// t's tangent at the level of depth `depth`, undefined where it has none (or that level closed).
Tensor tangent(const Tensor& t, uint32_t depth);
// Gives t the tangent at depth `depth` (replacing one it has); tangent has t's shape and dtype.
void set_tangent(const Tensor& t, uint32_t depth, const Tensor& tangent);
// Gives `to` (an alias of `from`'s data: a saved tensor) every live tangent `from` has.
void copy_tangents(const Tensor& from, const Tensor& to);
// Removes t's tangent at depth `depth`, if any.
void clear_tangent(const Tensor& t, uint32_t depth);

// True when a tangent of a visible level is on any of the inputs (undefined ones skipped).
bool any_visible_tangent(const Tensor* inputs, size_t n);
// The forward step of an op whose Node is `node` (Note [Forward grads]): fills the outputs'
// tangents level by level. Undefined outputs and non-floating ones get none.
void step(Node& node, const Tensor* inputs, size_t n, Tensor* const* outputs, size_t m);

// RAII: ops see only the outermost `visible` open levels while alive (a forward rule's scope).
class VisibleLevels {
 public:
  explicit VisibleLevels(uint32_t visible) : prev_(detail::t_fw_visible) {
    detail::t_fw_visible = visible;
  }
  ~VisibleLevels() { detail::t_fw_visible = prev_; }
  VisibleLevels(const VisibleLevels&) = delete;
  VisibleLevels& operator=(const VisibleLevels&) = delete;

 private:
  uint32_t prev_;
};

// Helpers for forward rules, an undefined tangent standing for zero:
// a + b (a, b, or undefined when both are);
Tensor add_tangents(const Tensor& a, const Tensor& b);
// t expanded to `shape` (a broadcasting op's output), undefined when t is;
Tensor broadcast_tangent(const Tensor& t, const Shape& shape);
// t, or zeros of like's shape, dtype and device where t is undefined.
Tensor tangent_or_zeros(const Tensor& t, const Tensor& like);

}  // namespace fwd
}  // namespace ember
