// The backward engine: dependency counting over the Nodes reachable from the root, then one run
// of each Node with its summed incoming gradient, reduced to its input's shape (sum_to). It sits
// above ops/ because that bookkeeping uses ops (add, sum_to), as PyTorch's engine does.
#include "autograd/engine.h"

#include <cmath>
#include <unordered_map>

#include "graph/creation.h"
#include "graph/profile.h"
#include "ops/reduce.h"

namespace ember {

namespace {

void check_finite(const Tensor& g, const Node& node, size_t input) {
  const bool finite = dispatch_float(g.dtype(), "anomaly", [&]<class T>() {
    for (T v : g.contiguous().to_vector<T>())
      if (!std::isfinite(v)) return false;
    return true;
  });
  EMBER_CHECK(finite, "backward: {} returned a NaN/Inf gradient for its input {} (shape {})",
              node.name(), input, g.shape());
}

// Note [Results for their graph alone]
// autograd::functional's vhp, hvp, jvp and hessian take a first gradient under create_graph only
// to differentiate it: its value is never read (vhp returns the gradient of g·v, not g). They run
// it as detail::grad_for_graph, and the engine marks, for each Node it runs, the inputs whose
// gradient goes straight to a captured input that runs no further (a result):
// Node::value_unused. Such a Node may return zeros there, recorded exactly as the real gradient
// would be (the same Node, the same saved tensors), and skip computing the value: a linear
// layer's weight gradient dYᵀ X is one of the nine products an hvp makes per layer, and the one
// whose value nothing uses (what XLA would remove as dead code from jvp(grad(f))). The results
// then hold those zeros; grad_for_graph's callers never show them. Zeros rather than
// uninitialised memory: anomaly mode checks every gradient for NaN/Inf.

// Note [Accumulating in place]
// A gradient arriving where one already waits is added to it. Without create_graph (nothing to
// record), when the buffer holds the only handle to the waiting gradient and to its storage (no
// view of it, no Node saved it, no caller sees it) and the sum has its shape and dtype, the sum
// is taken in place, as torch's InputBuffer::accumulate steals its buffer: one pass over memory
// fewer and no new buffer (a Hessian-vector product adds ~200 gradients a step).
bool can_accumulate_in_place(const Tensor& slot, const Tensor& g) {
  return !is_grad_enabled() && slot.impl_ptr().use_count() == 1 &&
         slot.impl_ptr()->storage.use_count() == 1 && !slot.requires_grad() &&
         slot.is_contiguous() && slot.dtype() == g.dtype() && slot.shape() == g.shape() &&
         slot.device() == g.device();
}

// The callbacks of the backward running on this thread (queue_callback); null outside backward.
thread_local std::vector<std::function<void()>>* t_callbacks = nullptr;

// Installs a backward's callback list for its duration (restoring the outer one: a Node may run
// a backward of its own).
class CallbackScope {
 public:
  explicit CallbackScope(std::vector<std::function<void()>>* list) : prev_(t_callbacks) {
    t_callbacks = list;
  }
  ~CallbackScope() { t_callbacks = prev_; }
  CallbackScope(const CallbackScope&) = delete;
  CallbackScope& operator=(const CallbackScope&) = delete;

 private:
  std::vector<std::function<void()>>* prev_;
};

}  // namespace

void queue_callback(std::function<void()> fn) {
  EMBER_CHECK(t_callbacks != nullptr,
              "queue_callback: called outside backward (only a Node or a leaf's hook may queue a "
              "callback)");
  t_callbacks->push_back(std::move(fn));
}

namespace {

// The grad_fn of a gradient that a Node of raw kernels computed under create_graph: a further
// backward through it throws, naming that Node (Note [Double backward]; torch's DelayedError).
struct NotDifferentiableBackward final : Node {
  explicit NotDifferentiableBackward(std::string node) : node_(std::move(node)) {}
  std::string_view name() const override { return "NotDifferentiableBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>&) override {
    throw Error(fmt::format(
        "backward: the gradient computed by {} cannot be differentiated again: its backward is "
        "written in kernels that record no graph (double backward through it is not supported)",
        node_));
  }
  bool differentiable_backward() const override { return true; }
  std::string node_;
};

// Its edges are the Node's own (its forward inputs, which the gradient depends on), so that a
// backward from the gradient to those inputs reaches it and throws.
Tensor refuse_double_backward(const Tensor& g, const Node& node) {
  Tensor out = g.detach();
  const auto refuse =
      make_node<NotDifferentiableBackward>("not_differentiable", std::string(node.name()));
  connect(refuse, {}, out);
  refuse->next_edges = node.next_edges;
  refuse->input_shapes = node.input_shapes;
  refuse->input_dtypes = node.input_dtypes;
  return out;
}

// Where autograd::grad takes a gradient: the buffer slot (fn, input_nr) of an input's edge.
struct Capture {
  uint32_t input_nr;
  size_t index;
};

// One backward pass from `roots` seeded with `seeds`; with create_graph the Nodes run under grad
// mode and record the pass (Note [Double backward]). Without captures, leaves
// accumulate into .grad; with captures (autograd::grad), the gradient arriving at each captured
// edge is returned, only the Nodes on the way to a captured edge run, and no leaf accumulates.
std::vector<Tensor> execute(const std::vector<Edge>& roots, const std::vector<Tensor>& seeds,
                            bool retain_graph, bool create_graph, const std::vector<Edge>& captures,
                            bool results_for_graph = false) {
  GradModeScope grad_mode(create_graph);
  std::vector<std::function<void()>> callbacks;
  CallbackScope callback_scope(&callbacks);

  // Count, for every reachable node, how many edges point at it (explicit stack, no recursion);
  // with captures, also every node's parents, to find the nodes that lead to a captured edge.
  std::unordered_map<Node*, int64_t> dependencies;
  std::unordered_map<Node*, std::vector<Node*>> parents;
  std::vector<Node*> stack;
  for (const Edge& r : roots)
    if (dependencies.try_emplace(r.fn.get(), 0).second) stack.push_back(r.fn.get());
  while (!stack.empty()) {
    Node* node = stack.back();
    stack.pop_back();
    for (const Edge& e : node->next_edges) {
      if (!e.fn) continue;
      auto [it, inserted] = dependencies.try_emplace(e.fn.get(), 0);
      ++it->second;
      if (!captures.empty()) parents[e.fn.get()].push_back(node);
      if (inserted) stack.push_back(e.fn.get());
    }
  }
  std::unordered_map<Node*, std::vector<Capture>> captured;
  std::unordered_map<Node*, bool> needed;  // with captures: the nodes that must run
  for (size_t i = 0; i < captures.size(); ++i) {
    Node* fn = captures[i].fn.get();
    captured[fn].push_back({captures[i].input_nr, i});
    if (!dependencies.contains(fn)) continue;  // not reached: an unused input
    for (Node* parent : parents[fn])
      if (needed.try_emplace(parent, true).second) stack.push_back(parent);
  }
  while (!stack.empty()) {
    Node* node = stack.back();
    stack.pop_back();
    for (Node* parent : parents[node])
      if (needed.try_emplace(parent, true).second) stack.push_back(parent);
  }

  std::unordered_map<Node*, std::vector<Tensor>> buffers;
  const auto add_to = [&](Node* fn, uint32_t input_nr, const Tensor& g) {
    std::vector<Tensor>& buffer = buffers[fn];
    buffer.resize(fn->num_outputs);
    Tensor& slot = buffer[input_nr];
    if (!slot.defined())
      slot = g;
    else if (can_accumulate_in_place(slot, g))
      slot.add_(g);
    else
      slot = ember::add(slot, g);
  };
  for (size_t i = 0; i < roots.size(); ++i) add_to(roots[i].fn.get(), roots[i].input_nr, seeds[i]);
  std::vector<Node*> ready;  // the roots that no other root reaches, each once
  for (const auto& [fn, buffer] : buffers)
    if (dependencies[fn] == 0) ready.push_back(fn);

  std::vector<Tensor> results(captures.size());
  while (!ready.empty()) {
    Node* node = ready.back();
    ready.pop_back();
    std::vector<Tensor> grads_out = std::move(buffers[node]);
    buffers.erase(node);
    grads_out.resize(node->num_outputs);
    if (const auto it = captured.find(node); it != captured.end())
      for (const Capture& c : it->second) results[c.index] = grads_out[c.input_nr];
    const bool runs = captures.empty() || needed.contains(node);
    std::vector<Tensor> grads_in;
    if (runs) {
      node->check_saved();
      bool any_grad = false;
      for (const Tensor& g : grads_out) any_grad = any_grad || g.defined();
      if (any_grad) {
        profile::Scope scope(profile::is_enabled() ? node->name() : std::string_view());
        struct Unused {  // the gradients no captured input is reached through, for apply()
          uint64_t outer = detail::t_unused_inputs, outer_graph_only = detail::t_graph_only_inputs;
          ~Unused() {
            detail::t_unused_inputs = outer;
            detail::t_graph_only_inputs = outer_graph_only;
          }
        } unused;
        uint64_t mask = 0, graph_only = 0;
        if (!captures.empty())
          for (size_t i = 0; i < node->next_edges.size() && i < 64; ++i) {
            Node* fn = node->next_edges[i].fn.get();
            if (!fn || needed.contains(fn)) continue;
            if (!captured.contains(fn))
              mask |= 1ull << i;
            else if (results_for_graph && create_graph)
              graph_only |= 1ull << i;  // it ends as a result, whose value nobody reads
          }
        detail::t_unused_inputs = mask;
        detail::t_graph_only_inputs = graph_only;
        grads_in = node->apply(grads_out);
        if (create_graph && !node->differentiable_backward())
          for (Tensor& g : grads_in)
            if (g.defined()) g = refuse_double_backward(g, *node);
      }
      if (!retain_graph) node->release_saved();
    }

    for (size_t i = 0; i < node->next_edges.size(); ++i) {
      const Edge& e = node->next_edges[i];
      if (!e.fn) continue;
      if (i < grads_in.size() && grads_in[i].defined()) {
        Tensor g = grads_in[i];
        if (g.shape() != node->input_shapes[i]) g = sum_to(g, node->input_shapes[i]);
        if (is_anomaly_enabled()) check_finite(g, *node, i);
        add_to(e.fn.get(), e.input_nr, g);
      }
      if (--dependencies[e.fn.get()] == 0) ready.push_back(e.fn.get());
    }
  }
  for (size_t i = 0; i < callbacks.size(); ++i) {
    const std::function<void()> fn = std::move(callbacks[i]);  // fn may queue more (reallocate)
    fn();
  }
  return results;
}

// The edge a gradient for `t` starts from, or an Error naming `what`.
Edge root_edge(const Tensor& t, const Tensor& grad, std::string_view op, const std::string& what,
               Tensor& seed) {
  EMBER_CHECK(t.defined(), "{}: {} is an undefined tensor", op, what);
  EMBER_CHECK(t.requires_grad(), "{}: {} of shape {} does not require grad and has no grad_fn", op,
              what, t.shape());
  seed = grad;
  if (!seed.defined()) {
    EMBER_CHECK(t.numel() == 1,
                "{}: grad can be implied only for one-element outputs, got shape {} for {}; pass "
                "a gradient of that shape",
                op, t.shape(), what);
    seed = ones_like(t);
  }
  EMBER_CHECK(seed.shape() == t.shape(), "{}: gradient of shape {} for {} of shape {}", op,
              seed.shape(), what, t.shape());
  return gradient_edge(t);
}

}  // namespace

void run_backward(const Tensor& root, const Tensor& grad, bool retain_graph, bool create_graph) {
  EMBER_CHECK(root.defined(), "backward: undefined tensor");
  Tensor seed;
  const Edge edge = root_edge(root, grad, "backward", "the tensor", seed);
  execute({edge}, {seed}, retain_graph || create_graph, create_graph, {});
}

void Tensor::backward(const Tensor& grad, bool retain_graph, bool create_graph) const {
  run_backward(*this, grad, retain_graph, create_graph);
}

namespace autograd {

namespace {

std::vector<Tensor> grad_of(const std::vector<Tensor>& outputs, const std::vector<Tensor>& inputs,
                            const std::vector<Tensor>& grad_outputs,
                            std::optional<bool> retain_graph, bool create_graph, bool allow_unused,
                            bool results_for_graph) {
  constexpr std::string_view op = "autograd::grad";
  EMBER_CHECK(!outputs.empty(), "{}: no outputs", op);
  EMBER_CHECK(grad_outputs.empty() || grad_outputs.size() == outputs.size(),
              "{}: {} grad_outputs for {} outputs", op, grad_outputs.size(), outputs.size());
  std::vector<Edge> roots;
  std::vector<Tensor> seeds(outputs.size());
  for (size_t i = 0; i < outputs.size(); ++i)
    roots.push_back(root_edge(outputs[i], grad_outputs.empty() ? Tensor() : grad_outputs[i], op,
                              fmt::format("output {}", i), seeds[i]));
  std::vector<Edge> captures;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Tensor& x = inputs[i];
    EMBER_CHECK(x.defined(), "{}: input {} is an undefined tensor", op, i);
    EMBER_CHECK(x.requires_grad(), "{}: input {} of shape {} does not require grad", op, i,
                x.shape());
    captures.push_back(gradient_edge(x));
  }
  std::vector<Tensor> grads = execute(roots, seeds, retain_graph.value_or(create_graph),
                                      create_graph, captures, results_for_graph);
  for (size_t i = 0; i < grads.size(); ++i) {
    if (!grads[i].defined()) {
      EMBER_CHECK(allow_unused,
                  "{}: input {} of shape {} is not reached from the outputs (its gradient would "
                  "be undefined); pass allow_unused=true to get an undefined Tensor for it",
                  op, i, inputs[i].shape());
      continue;
    }
    if (grads[i].shape() != inputs[i].shape()) grads[i] = sum_to(grads[i], inputs[i].shape());
    if (grads[i].dtype() != inputs[i].dtype()) grads[i] = grads[i].to(inputs[i].dtype());
  }
  return grads;
}

}  // namespace

std::vector<Tensor> grad(const std::vector<Tensor>& outputs, const std::vector<Tensor>& inputs,
                         const std::vector<Tensor>& grad_outputs, std::optional<bool> retain_graph,
                         bool create_graph, bool allow_unused) {
  return grad_of(outputs, inputs, grad_outputs, retain_graph, create_graph, allow_unused, false);
}

namespace detail {

std::vector<Tensor> grad_for_graph(const std::vector<Tensor>& outputs,
                                   const std::vector<Tensor>& inputs,
                                   const std::vector<Tensor>& grad_outputs) {
  return grad_of(outputs, inputs, grad_outputs, true, true, true, true);
}

}  // namespace detail

}  // namespace autograd

}  // namespace ember
