// Define-by-run reverse-mode autograd: the Node that an op records, the edges from a Node to the
// Nodes of its inputs, saved tensors with version checks, grad mode, and the backward engine.
//
// Note [Saved outputs]
// A Node saves tensors as data only: a SavedTensor is an alias of the storage without grad_fn.
// Edges point from outputs to inputs only, so the graph holds no cycle and dropping the last
// handle of the loss frees every Node.
//
// Note [Version counter]
// Every in-place write bumps its Storage's version. A SavedTensor remembers the version it saw;
// if it changed before backward reads it, the engine throws naming the Node.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string_view>
#include <vector>

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

// Backward checks each gradient a Node produces and names the Node that made a NaN/Inf.
void set_detect_anomaly(bool on);
bool is_anomaly_enabled();

// A tensor kept for backward as data only, with the storage version it was saved at.
class SavedTensor {
 public:
  const Tensor& get() const { return data_; }
  bool defined() const { return data_.defined(); }

 private:
  friend class Node;
  Tensor data_;
  uint64_t version_ = 0;
};

struct Edge {
  std::shared_ptr<Node> fn;  // null: that input needs no gradient
  uint32_t input_nr = 0;     // which output of fn the gradient is for
};

class Node {
 public:
  Node();
  virtual ~Node();
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;

  virtual std::string_view name() const = 0;
  // grads: one per output (undefined where no gradient flowed). Returns one gradient per input,
  // undefined for inputs that need none; the engine reduces each to its input's shape.
  virtual std::vector<Tensor> apply(std::vector<Tensor>& grads) = 0;

  // Which inputs need a gradient (so a Node can skip work for the others).
  bool needs_grad(size_t input) const {
    return input < next_edges.size() && next_edges[input].fn != nullptr;
  }

  // Engine bookkeeping.
  void check_saved() const;  // throws when freed or a saved tensor changed in place
  void release_saved();

  std::vector<Edge> next_edges;  // one per input
  std::vector<Shape> input_shapes;
  std::vector<DType> input_dtypes;
  uint32_t num_outputs = 1;

 protected:
  void save(SavedTensor& slot, const Tensor& t);

 private:
  std::vector<SavedTensor*> saved_;
  bool released_ = false;
};

// Number of Nodes alive now (the leak tests count them).
int64_t live_nodes();

// True when grad mode is on and any of the tensors requires grad.
template <class... Ts>
bool any_requires_grad(const Ts&... ts) {
  return is_grad_enabled() && (ts.requires_grad() || ...);
}
bool any_requires_grad(const std::vector<Tensor>& ts);

// Links `node` to the inputs (one edge each) and makes it the grad_fn of the outputs.
void connect(const std::shared_ptr<Node>& node, const std::vector<Tensor>& inputs,
             std::initializer_list<Tensor*> outputs);
void connect(const std::shared_ptr<Node>& node, const std::vector<Tensor>& inputs, Tensor& output);

// Runs backward from `root` (seeded with `grad`, or 1 for a one-element root).
void run_backward(const Tensor& root, const Tensor& grad, bool retain_graph);

}  // namespace ember
