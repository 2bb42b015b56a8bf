// The autograd Node, grad mode, leaf accumulation and recording (connect). The engine that runs
// backward sits above ops/, in autograd/engine.cpp.
#include "graph/autograd.h"

#include <atomic>
#include <cctype>
#include <cmath>
#include <mutex>
#include <unordered_map>

#include "graph/creation.h"
#include "graph/profile.h"

namespace ember {

namespace {
thread_local bool t_grad_enabled = true;
std::atomic<int64_t> g_live_nodes{0};
}  // namespace

bool is_grad_enabled() { return t_grad_enabled; }
void set_grad_enabled(bool on) { t_grad_enabled = on; }
std::atomic<bool> detail::g_anomaly{false};
thread_local uint64_t detail::t_unused_inputs = 0;
thread_local uint64_t detail::t_graph_only_inputs = 0;
void set_detect_anomaly(bool on) { detail::g_anomaly = on; }
int64_t live_nodes() { return g_live_nodes.load(); }

Node::Node() { ++g_live_nodes; }

std::vector<Tensor> Node::jvp(const std::vector<Tensor>&, const std::vector<Tensor>&,
                              const std::vector<Tensor>&) {
  throw Error(
      fmt::format("{}: forward-mode autograd has no rule for this op (a dual input's "
                  "tangent would be lost); see Note [Forward grads] in graph/forward_ad.h",
                  op()));
}

// A long chain of Nodes would be freed by recursive destructors and overflow the stack, so
// each destructor hands the next Nodes it was the last owner of to one loop on this thread.
Node::~Node() {
  thread_local std::vector<std::shared_ptr<Node>> pending;
  thread_local bool draining = false;
  for (Edge& e : next_edges)
    if (e.fn && e.fn.use_count() == 1) pending.push_back(std::move(e.fn));
  --g_live_nodes;
  if (draining) return;
  draining = true;
  while (!pending.empty()) {
    std::shared_ptr<Node> next = std::move(pending.back());
    pending.pop_back();
    next.reset();
  }
  draining = false;
}

// Note [Saved outputs]: an input that requires grad as itself, anything else as data only.
void Node::save(SavedTensor& slot, const Tensor& t) {
  if (t.defined()) {
    slot.data_ = t.requires_grad() ? t : t.detach();
    if (!t.requires_grad()) fwd::copy_tangents(t, slot.data_);  // detach dropped them
    slot.version_ = t.impl()->storage->version();
  }
  saved_.push_back(&slot);
}

void Node::save_output(SavedTensor& slot, const Tensor& out, uint32_t output_nr) {
  if (out.defined()) {
    slot.data_ = out.detach();  // never the grad_fn: that would be this Node (a cycle)
    slot.version_ = out.impl()->storage->version();
    slot.output_of_ = this;
    slot.output_nr_ = output_nr;
  }
  saved_.push_back(&slot);
}

// An alias of the saved data whose grad_fn is the Node that saved it: made while that Node runs
// under create_graph, so the Node is alive and owned by a shared_ptr.
Tensor SavedTensor::as_output() const {
  Tensor out = data_.detach();
  TensorImpl* impl = out.impl();
  impl->requires_grad = true;
  impl->grad_fn = output_of_->shared_from_this();
  impl->output_nr = output_nr_;
  fwd::copy_tangents(data_, out);
  return out;
}

void Node::give_saved_output_tangent(uint32_t output_nr, uint32_t depth, const Tensor& tangent) {
  for (SavedTensor* s : saved_)
    if (s->output_of_ == this && s->output_nr_ == output_nr && s->data_.defined())
      fwd::set_tangent(s->data_, depth, tangent);
}

void Node::check_saved() const {
  EMBER_CHECK(!released_ || saved_.empty(),
              "backward: {} was already run and its saved tensors freed; trying to backward "
              "through the graph a second time? Pass retain_graph=true to the first backward",
              name());
  for (const SavedTensor* s : saved_) {
    if (!s->data_.defined()) continue;
    const uint64_t now = s->data_.impl()->storage->version();
    EMBER_CHECK(now == s->version_,
                "backward: a tensor of shape {} saved by {} was modified by an in-place "
                "operation (version {} now, {} when saved)",
                s->data_.shape(), name(), now, s->version_);
  }
}

void Node::release_saved() {
  // A Node that saved nothing is left untouched: leaves' AccumulateGrad nodes are shared by the
  // graphs of concurrent backward passes (Note [Concurrent backward]).
  if (saved_.empty()) return;
  for (SavedTensor* s : saved_) s->data_ = Tensor();
  released_ = true;
}

namespace {

// The leaf's Node: adds the incoming gradient to the leaf's .grad. Note [Concurrent backward]:
// threads running backward through graphs that share a leaf (one model, several threads) meet
// here, so the update of .grad holds the node's mutex; gradient_edge() gives a leaf one
// AccumulateGrad at a time (under g_accumulator_mutex), so that mutex covers every writer.
class AccumulateGrad final : public Node {
 public:
  explicit AccumulateGrad(std::shared_ptr<TensorImpl> leaf) : leaf_(std::move(leaf)) {}
  std::string_view name() const override { return "AccumulateGrad"; }
  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    Tensor g = grads[0];
    if (!g.defined()) return {};
    if (g.dtype() != leaf_->dtype) g = g.to(leaf_->dtype);
    {
      std::lock_guard lock(mutex_);
      if (is_grad_enabled()) {
        // create_graph: .grad keeps the gradient's graph, summed out of place (as torch).
        leaf_->grad = (leaf_->grad ? Tensor(leaf_->grad).add(g) : g).impl_ptr();
      } else if (!leaf_->grad) {
        // Own the buffer: later accumulation writes into it in place.
        const bool owned = g.impl_ptr().use_count() <= 2 && g.impl()->storage.use_count() == 1 &&
                           g.is_contiguous();
        leaf_->grad = (owned ? g : g.clone()).impl_ptr();
      } else {
        Tensor(leaf_->grad).add_(g);
      }
    }
    if (leaf_->post_accumulate_grad_hook) leaf_->post_accumulate_grad_hook(Tensor(leaf_));
    return {};
  }

 private:
  std::shared_ptr<TensorImpl> leaf_;
  std::mutex mutex_;
};

std::mutex g_accumulator_mutex;  // guards TensorImpl::grad_accumulator of every leaf

}  // namespace

Edge gradient_edge(const Tensor& t) {
  if (!t.requires_grad()) return {};
  if (t.grad_fn()) return {t.grad_fn(), t.impl()->output_nr};
  std::lock_guard lock(g_accumulator_mutex);
  std::shared_ptr<Node> acc = t.impl()->grad_accumulator.lock();
  if (!acc) {
    acc = std::make_shared<AccumulateGrad>(t.impl_ptr());
    acc->input_shapes = {t.shape()};
    acc->input_dtypes = {t.dtype()};
    t.impl()->grad_accumulator = acc;
  }
  return {acc, 0};
}

void set_post_accumulate_grad_hook(const Tensor& leaf, std::function<void(const Tensor&)> hook) {
  EMBER_CHECK(leaf.defined() && leaf.is_leaf() && leaf.requires_grad(),
              "set_post_accumulate_grad_hook: needs a leaf that requires grad");
  leaf.impl()->post_accumulate_grad_hook = std::move(hook);
}

bool any_requires_grad(const std::vector<Tensor>& ts) {
  if (!is_grad_enabled()) return false;
  for (const Tensor& t : ts)
    if (t.requires_grad()) return true;
  return false;
}

bool any_requires_grad(std::initializer_list<Tensor> ts) {
  if (!is_grad_enabled()) return false;
  for (const Tensor& t : ts)
    if (t.requires_grad()) return true;
  return false;
}

namespace {

void link(const std::shared_ptr<Node>& node, const Tensor* begin, const Tensor* end,
          Tensor* const* outputs, size_t num_outputs) {
  node->next_edges.reserve(end - begin);
  for (const Tensor* t = begin; t != end; ++t) {
    node->next_edges.push_back(t->defined() ? gradient_edge(*t) : Edge{});
    node->input_shapes.push_back(t->defined() ? t->shape() : Shape{});
    node->input_dtypes.push_back(t->defined() ? t->dtype() : kFloat32);
  }
  node->num_outputs = static_cast<uint32_t>(num_outputs);
  for (uint32_t nr = 0; nr < num_outputs; ++nr) {
    if (!outputs[nr]->defined()) continue;  // an output not computed: no gradient flows to it
    TensorImpl* out = outputs[nr]->impl();
    out->requires_grad = true;
    out->grad_fn = node;
    out->output_nr = nr;
  }
}

}  // namespace

void connect(const std::shared_ptr<Node>& node, std::initializer_list<Tensor> inputs,
             std::initializer_list<Tensor*> outputs) {
  link(node, inputs.begin(), inputs.end(), outputs.begin(), outputs.size());
}

void connect(const std::shared_ptr<Node>& node, std::initializer_list<Tensor> inputs,
             Tensor& output) {
  Tensor* out = &output;
  link(node, inputs.begin(), inputs.end(), &out, 1);
}

void connect(const std::shared_ptr<Node>& node, const std::vector<Tensor>& inputs,
             std::initializer_list<Tensor*> outputs) {
  link(node, inputs.data(), inputs.data() + inputs.size(), outputs.begin(), outputs.size());
}

void connect(const std::shared_ptr<Node>& node, std::initializer_list<Tensor> inputs,
             std::vector<Tensor>& outputs) {
  std::vector<Tensor*> out;
  out.reserve(outputs.size());
  for (Tensor& t : outputs) out.push_back(&t);
  link(node, inputs.begin(), inputs.end(), out.data(), out.size());
}

void check_forward_finite(std::string_view op, const Tensor& out) {
  if (!out.defined() || !is_floating(out.dtype())) return;
  const Tensor c = out.contiguous();
  int64_t bad = -1;
  dispatch_float(c.dtype(), op, [&]<class T>() {
    const T* p = c.data<T>();
    for (int64_t i = 0; i < c.numel() && bad < 0; ++i)
      if (!std::isfinite(p[i])) bad = i;
  });
  EMBER_CHECK(bad < 0,
              "{}: produced a NaN/Inf in its output of shape {} (element {}) while anomaly "
              "detection is on",
              op, out.shape(), bad);
}

// "log_softmax" -> "LogSoftmaxBackward".
std::string_view Node::name() const {
  std::call_once(named_, [this] {
    bool upper = true;
    for (char c : op_) {
      if (c == '_') {
        upper = true;
        continue;
      }
      name_ += upper ? static_cast<char>(std::toupper(static_cast<unsigned char>(c))) : c;
      upper = false;
    }
    name_ += "Backward";
  });
  return name_;
}

}  // namespace ember
