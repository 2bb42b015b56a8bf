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

void run_backward(const Tensor& root, const Tensor& grad, bool retain_graph) {
  EMBER_CHECK(root.defined(), "backward: undefined tensor");
  EMBER_CHECK(root.requires_grad(),
              "backward: tensor of shape {} does not require grad and has no grad_fn",
              root.shape());
  Tensor seed = grad;
  if (!seed.defined()) {
    EMBER_CHECK(root.numel() == 1,
                "backward: grad can be implied only for one-element outputs, got shape {}; "
                "pass a gradient of that shape",
                root.shape());
    seed = ones_like(root);
  }
  EMBER_CHECK(seed.shape() == root.shape(),
              "backward: gradient of shape {} for an output of shape {}", seed.shape(),
              root.shape());

  NoGradGuard no_grad;
  std::vector<std::function<void()>> callbacks;
  CallbackScope callback_scope(&callbacks);
  const Edge root_edge = gradient_edge(root);
  Node* const start = root_edge.fn.get();

  // Count, for every reachable node, how many edges point at it (explicit stack, no recursion).
  std::unordered_map<Node*, int64_t> dependencies{{start, 0}};
  std::vector<Node*> stack{start};
  while (!stack.empty()) {
    Node* node = stack.back();
    stack.pop_back();
    for (const Edge& e : node->next_edges) {
      if (!e.fn) continue;
      auto [it, inserted] = dependencies.try_emplace(e.fn.get(), 0);
      ++it->second;
      if (inserted) stack.push_back(e.fn.get());
    }
  }

  // Run each node once all its consumers have contributed to its gradient buffer.
  std::unordered_map<Node*, std::vector<Tensor>> buffers;
  buffers[start].resize(start->num_outputs);
  buffers[start][root_edge.input_nr] = seed;
  std::vector<Node*> ready{start};
  while (!ready.empty()) {
    Node* node = ready.back();
    ready.pop_back();
    node->check_saved();
    std::vector<Tensor> grads_out = std::move(buffers[node]);
    buffers.erase(node);
    bool any_grad = false;
    for (const Tensor& g : grads_out) any_grad = any_grad || g.defined();
    std::vector<Tensor> grads_in;
    if (any_grad) {
      profile::Scope scope(profile::is_enabled() ? node->name() : std::string_view());
      grads_in = node->apply(grads_out);
    }
    if (!retain_graph) node->release_saved();

    for (size_t i = 0; i < node->next_edges.size(); ++i) {
      const Edge& e = node->next_edges[i];
      if (!e.fn) continue;
      if (i < grads_in.size() && grads_in[i].defined()) {
        Tensor g = grads_in[i];
        if (g.shape() != node->input_shapes[i]) g = sum_to(g, node->input_shapes[i]);
        if (is_anomaly_enabled()) check_finite(g, *node, i);
        std::vector<Tensor>& buffer = buffers[e.fn.get()];
        buffer.resize(e.fn->num_outputs);
        Tensor& slot = buffer[e.input_nr];
        slot = slot.defined() ? ember::add(slot, g) : g;
      }
      if (--dependencies[e.fn.get()] == 0) ready.push_back(e.fn.get());
    }
  }
  for (size_t i = 0; i < callbacks.size(); ++i) {
    const std::function<void()> fn = std::move(callbacks[i]);  // fn may queue more (reallocate)
    fn();
  }
}

void Tensor::backward(const Tensor& grad, bool retain_graph, bool create_graph) const {
  EMBER_CHECK(!create_graph,
              "backward: create_graph=true is not supported: backward runs under NoGradGuard "
              "with kernels that record no graph, so gradients of gradients (double backward) "
              "cannot be taken");
  run_backward(*this, grad, retain_graph);
}

}  // namespace ember
