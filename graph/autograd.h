// Define-by-run reverse-mode autograd: the Node that an op records, the edges from a Node to the
// Nodes of its inputs, saved tensors with version checks, grad mode, and the backward engine.
//
// Note [Saved outputs]
// A Node saves its own outputs as data only: a SavedTensor of an output is an alias of the
// storage without grad_fn. Edges point from outputs to inputs only, so the graph holds no cycle
// and dropping the last handle of the loss frees every Node. An input that requires grad is saved
// as itself (its grad_fn, or the leaf): it points down the graph, never back at the Node, and a
// backward recorded under create_graph differentiates through it (Note [Double backward]).
// Anything else is saved as data only.
//
// Note [Double backward]
// With create_graph the engine runs each Node under grad mode, so the ops a Node's apply() calls
// record a graph of the backward pass, which can be differentiated again. A saved output then
// comes back (SavedTensor::get) as an output of the Node that saved it, so the second backward
// reaches the forward's inputs through it. A Node whose apply() is written in raw kernels (which
// record nothing) says so by not overriding differentiable_backward(); under create_graph the
// engine gives the gradients it returns a grad_fn that refuses a further backward, naming the
// Node, instead of letting them pass as constants (torch's once_differentiable).
//
// Note [Version counter]
// Every in-place write bumps its Storage's version. A SavedTensor remembers the version it saw;
// if it changed before backward reads it, the engine throws naming the Node.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "graph/forward_ad.h"
#include "graph/tensor.h"

namespace ember {

// --- grad mode
bool is_grad_enabled();
void set_grad_enabled(bool on);

// RAII: disables gradient recording on this thread while alive; nests.
class NoGradGuard {
 public:
  NoGradGuard() : prev_(is_grad_enabled()) { set_grad_enabled(false); }
  ~NoGradGuard() { set_grad_enabled(prev_); }
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool prev_;
};

// RAII: sets grad mode on this thread while alive (on or off), then puts the old mode back
// (torch's AutoGradMode).
class GradModeScope {
 public:
  explicit GradModeScope(bool on) : prev_(is_grad_enabled()) { set_grad_enabled(on); }
  ~GradModeScope() { set_grad_enabled(prev_); }
  GradModeScope(const GradModeScope&) = delete;
  GradModeScope& operator=(const GradModeScope&) = delete;

 private:
  bool prev_;
};

// Anomaly mode: every op's output and every gradient a Node produces is checked, and the op or
// Node that made the first NaN/Inf is named in an ember::Error.
void set_detect_anomaly(bool on);
namespace detail {
extern std::atomic<bool> g_anomaly;
// Set by the engine on its thread while a Node's apply() runs: bit i marks input i's gradient as
// one no target of the running backward needs (Node::needs_grad). Per thread, not per Node: a
// Node may be in several backward passes at once (a shared leaf's accumulator).
extern thread_local uint64_t t_unused_inputs;
// Likewise: bit i marks input i's gradient as one whose value nothing reads, only its graph
// (Node::value_unused).
extern thread_local uint64_t t_graph_only_inputs;
}  // namespace detail
inline bool is_anomaly_enabled() { return detail::g_anomaly.load(std::memory_order_relaxed); }

// A tensor kept for backward as data only, with the storage version it was saved at.
class SavedTensor {
 public:
  // The saved tensor; a saved output, under grad mode, as an output of the Node that saved it
  // (Note [Double backward]).
  Tensor get() const {
    if (output_of_ != nullptr && is_grad_enabled() && data_.defined()) [[unlikely]]
      return as_output();
    return data_;
  }
  bool defined() const { return data_.defined(); }

 private:
  friend class Node;
  Tensor as_output() const;
  Tensor data_;
  uint64_t version_ = 0;
  Node* output_of_ = nullptr;  // for a saved output: the Node it is an output of
  uint32_t output_nr_ = 0;
};

struct Edge {
  std::shared_ptr<Node> fn;  // null: that input needs no gradient
  uint32_t input_nr = 0;     // which output of fn the gradient is for
};

class Node : public std::enable_shared_from_this<Node> {
 public:
  Node();
  virtual ~Node();
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;

  // "MulBackward": the op's name in CamelCase + "Backward", made from the name record() gave.
  virtual std::string_view name() const;
  // The op that recorded this Node ("mul"), as given to record().
  std::string_view op() const { return op_; }
  // grads: one per output (undefined where no gradient flowed). Returns one gradient per input,
  // undefined for inputs that need none; the engine reduces each to its input's shape.
  virtual std::vector<Tensor> apply(std::vector<Tensor>& grads) = 0;

  // True when apply() is written in differentiable ops (or in ops whose own backward is), so
  // that under create_graph the gradients it returns can be differentiated again (Note [Double
  // backward]). A Node of raw kernels keeps the default.
  virtual bool differentiable_backward() const { return false; }

  // Forward mode (Note [Forward grads] in graph/forward_ad.h): the op's Jacobian times the
  // inputs' tangents, one tangent per output (undefined: zero). tangents[i] is input i's tangent,
  // undefined where it has none (a zero tangent); inputs and outputs are the op's own, carrying
  // the outer levels' tangents. Written in ops, beside apply(). The default throws naming the op:
  // an op without a rule never passes a silent zero.
  virtual std::vector<Tensor> jvp(const std::vector<Tensor>& inputs,
                                  const std::vector<Tensor>& tangents,
                                  const std::vector<Tensor>& outputs);

  // Which inputs need a gradient (so a Node can skip work for the others): those with an edge,
  // less those the running backward does not reach its targets through (autograd::grad asks for
  // some inputs only; torch's task_should_compute_output).
  bool needs_grad(size_t input) const {
    return input < next_edges.size() && next_edges[input].fn != nullptr &&
           !(input < 64 && (detail::t_unused_inputs >> input & 1));
  }

  // True when input `input`'s gradient will be differentiated but its value never read: under
  // create_graph, a result of a backward run for its graph alone (Note [Results for their graph
  // alone] in autograd/engine.cpp). A Node may return zeros there, recorded as it records the
  // real gradient, and skip the work of its value.
  bool value_unused(size_t input) const {
    return input < 64 && (detail::t_graph_only_inputs >> input & 1);
  }

  // Forward mode's bookkeeping: the Node's saved copies of output `output_nr` get its tangent
  // at depth `depth` (Note [Forward grads] in graph/forward_ad.h).
  void give_saved_output_tangent(uint32_t output_nr, uint32_t depth, const Tensor& tangent);

  // Engine bookkeeping.
  void check_saved() const;  // throws when freed or a saved tensor changed in place
  void release_saved();

  std::vector<Edge> next_edges;  // one per input
  std::vector<Shape> input_shapes;
  std::vector<DType> input_dtypes;
  uint32_t num_outputs = 1;

 protected:
  void save(SavedTensor& slot, const Tensor& t);  // an input (or any tensor but an output)
  // Output `output_nr` of this Node (Note [Saved outputs]).
  void save_output(SavedTensor& slot, const Tensor& out, uint32_t output_nr = 0);

 private:
  template <class N, class... Args>
  friend std::shared_ptr<N> make_node(std::string_view op, Args&&... args);

  std::vector<SavedTensor*> saved_;
  bool released_ = false;
  std::string_view op_;           // a string literal: op names live as long as the program
  mutable std::once_flag named_;  // name(), made on first use (profiler, errors), by one thread
  mutable std::string name_;
};

// A Node of type N recording op `op` (a string literal).
template <class N, class... Args>
std::shared_ptr<N> make_node(std::string_view op, Args&&... args) {
  auto node = std::make_shared<N>(std::forward<Args>(args)...);
  node->op_ = op;
  return node;
}

// Number of Nodes alive now (the leak tests count them).
int64_t live_nodes();

// True when grad mode is on and any of the tensors requires grad.
template <class... Ts>
bool any_requires_grad(const Ts&... ts) {
  return is_grad_enabled() && (ts.requires_grad() || ...);
}
bool any_requires_grad(const std::vector<Tensor>& ts);
bool any_requires_grad(std::initializer_list<Tensor> ts);

// Records op `op` for autograd, as tinygrad's Function.apply: when grad mode is on and an input
// requires grad, makes the Node N(args…), links it to the inputs (undefined ones get no edge)
// and makes it the grad_fn of `out`. Returns out. Nodes are made only when needed, so an op
// pays nothing for autograd under NoGradGuard or on constants.
// Anomaly mode's forward check: throws naming `op` when the floating tensor `out` holds a NaN
// or an Inf. record() calls it on every output while set_detect_anomaly(true).
void check_forward_finite(std::string_view op, const Tensor& out);

namespace detail {
// True when an op of these inputs must take forward mode's step (Note [Forward grads]).
inline bool forward_wanted(const Tensor* inputs, size_t n) {
  return t_fw_visible != 0 && fwd::any_visible_tangent(inputs, n);
}
}  // namespace detail

// True when an op of these tensors (undefined ones skipped) would record anything: a Node for
// reverse mode (grad mode on and one requires grad) or a tangent (one carries a tangent of a
// visible level). Where it is false a forward rule's result is a constant to autograd, and the
// rule may compute it by raw kernels from its Node's saved data (Note [Forward grads]).
inline bool records_graph(std::initializer_list<Tensor> ts) {
  return any_requires_grad(ts) ||
         (detail::t_fw_visible != 0 && fwd::any_visible_tangent(ts.begin(), ts.size()));
}

template <class N, class... Args>
Tensor record(std::string_view op, Tensor out, std::initializer_list<Tensor> inputs,
              Args&&... args) {
  if (is_anomaly_enabled()) [[unlikely]]
    check_forward_finite(op, out);
  const bool forward = detail::forward_wanted(inputs.begin(), inputs.size());
  if (any_requires_grad(inputs) || forward) {
    auto node = make_node<N>(op, std::forward<Args>(args)...);
    if (any_requires_grad(inputs)) connect(node, inputs, out);
    Tensor* outputs[] = {&out};
    if (forward) fwd::step(*node, inputs.begin(), inputs.size(), outputs, 1);
  }
  return out;
}
// As record, for ops of a variable number of inputs (cat, stack).
template <class N, class... Args>
Tensor record(std::string_view op, Tensor out, const std::vector<Tensor>& inputs, Args&&... args) {
  if (is_anomaly_enabled()) [[unlikely]]
    check_forward_finite(op, out);
  const bool forward = detail::forward_wanted(inputs.data(), inputs.size());
  if (any_requires_grad(inputs) || forward) {
    auto node = make_node<N>(op, std::forward<Args>(args)...);
    if (any_requires_grad(inputs)) connect(node, inputs, {&out});
    Tensor* outputs[] = {&out};
    if (forward) fwd::step(*node, inputs.data(), inputs.size(), outputs, 1);
  }
  return out;
}
// As record, for ops with several outputs (max's values and indices: only values get a grad_fn
// when indices is left out). An undefined output (one not computed) keeps its number; no
// gradient reaches the Node for it.
template <class N, class... Args>
void record(std::string_view op, std::initializer_list<Tensor*> outputs,
            std::initializer_list<Tensor> inputs, Args&&... args) {
  if (is_anomaly_enabled()) [[unlikely]]
    for (Tensor* out : outputs) check_forward_finite(op, *out);
  const bool forward = detail::forward_wanted(inputs.begin(), inputs.size());
  if (any_requires_grad(inputs) || forward) {
    auto node = make_node<N>(op, std::forward<Args>(args)...);
    if (any_requires_grad(inputs)) connect(node, inputs, outputs);
    if (forward) fwd::step(*node, inputs.begin(), inputs.size(), outputs.begin(), outputs.size());
  }
}

// As record, for ops with a variable number of outputs (split, chunk): one Node, whose output i
// each outputs[i] is.
template <class N, class... Args>
void record(std::string_view op, std::vector<Tensor>& outputs, std::initializer_list<Tensor> inputs,
            Args&&... args) {
  if (is_anomaly_enabled()) [[unlikely]]
    for (const Tensor& out : outputs) check_forward_finite(op, out);
  const bool forward = detail::forward_wanted(inputs.begin(), inputs.size());
  if (any_requires_grad(inputs) || forward) {
    auto node = make_node<N>(op, std::forward<Args>(args)...);
    if (any_requires_grad(inputs)) connect(node, inputs, outputs);
    if (forward) {
      std::vector<Tensor*> pointers;
      for (Tensor& out : outputs) pointers.push_back(&out);
      fwd::step(*node, inputs.begin(), inputs.size(), pointers.data(), pointers.size());
    }
  }
}

// The edge a gradient for `t` flows along: t's grad_fn, or its leaf accumulator (made on first
// use); empty when t needs no gradient.
Edge gradient_edge(const Tensor& t);

// Runs hook(leaf) each time a backward pass has accumulated a gradient into `leaf`'s .grad: once
// per backward that reaches the leaf, on the thread running it, after the leaf's accumulation
// (torch's register_post_accumulate_grad_hook). DistributedDataParallel starts its all-reduce from
// here. One hook per leaf: a new one replaces the old, an empty one removes it.
void set_post_accumulate_grad_hook(const Tensor& leaf, std::function<void(const Tensor&)> hook);

// Links `node` to the inputs (one edge each) and makes it the grad_fn of the outputs.
void connect(const std::shared_ptr<Node>& node, std::initializer_list<Tensor> inputs,
             std::initializer_list<Tensor*> outputs);
void connect(const std::shared_ptr<Node>& node, std::initializer_list<Tensor> inputs,
             Tensor& output);
void connect(const std::shared_ptr<Node>& node, const std::vector<Tensor>& inputs,
             std::initializer_list<Tensor*> outputs);
void connect(const std::shared_ptr<Node>& node, std::initializer_list<Tensor> inputs,
             std::vector<Tensor>& outputs);

}  // namespace ember
