// The thread's dual levels and the tangents of dual tensors (Note [Forward grads] in
// graph/forward_ad.h).
#include "graph/forward_ad.h"

#include <atomic>
#include <memory>

#include "graph/autograd.h"
#include "graph/creation.h"

namespace ember {

namespace detail {
thread_local uint32_t t_fw_visible = 0;
}  // namespace detail

namespace fwd {

namespace {

struct Level {
  uint64_t id;
  // The TensorImpls given a tangent at this level, dropped from them when it closes.
  std::vector<std::weak_ptr<TensorImpl>> dual;
};

std::atomic<uint64_t> g_next_level{1};
thread_local std::vector<Level> t_levels;

bool alive(const ForwardGrad& g) {
  return g.depth < t_levels.size() && t_levels[g.depth].id == g.level;
}

// True when the tangent t a rule gave for output `out` shares memory with an input's tangent while
// `out` shares none with that input: an identity rule (x + 0, a copy) of an op that is no view.
// The output then gets its own copy, so an in-place op on it cannot write through into the
// input's tangent (Note [Forward grads]).
bool shares_input_tangent(const Tensor& t, const std::vector<Tensor>& in,
                          const std::vector<Tensor>& tangents, const Tensor& out) {
  for (size_t i = 0; i < in.size(); ++i) {
    if (!tangents[i].defined() || tangents[i].impl()->storage != t.impl()->storage) continue;
    if (in[i].impl()->storage != out.impl()->storage) return true;
  }
  return false;
}

}  // namespace

uint32_t open_levels() { return static_cast<uint32_t>(t_levels.size()); }

uint32_t open_level() {
  EMBER_CHECK(detail::t_fw_visible == t_levels.size(),
              "DualLevel: a dual level cannot be opened inside a forward-mode rule");
  t_levels.push_back({g_next_level.fetch_add(1), {}});
  detail::t_fw_visible = open_levels();
  return open_levels() - 1;
}

void close_level(uint32_t depth) {
  EMBER_CHECK(depth + 1 == t_levels.size(),
              "DualLevel: levels close innermost first (closing depth {} of {})", depth,
              t_levels.size());
  const uint64_t id = t_levels.back().id;
  for (const std::weak_ptr<TensorImpl>& weak : t_levels.back().dual) {
    if (const std::shared_ptr<TensorImpl> impl = weak.lock()) {
      std::erase_if(impl->forward_grads, [&](const ForwardGrad& g) { return g.level == id; });
    }
  }
  t_levels.pop_back();
  detail::t_fw_visible = open_levels();
}

Tensor tangent(const Tensor& t, uint32_t depth) {
  if (!t.defined()) return {};
  for (const ForwardGrad& g : t.impl()->forward_grads)
    if (g.depth == depth && alive(g)) return Tensor(g.tangent);
  return {};
}

void set_tangent(const Tensor& t, uint32_t depth, const Tensor& tangent) {
  EMBER_CHECK(depth < t_levels.size(), "forward-mode autograd: no dual level of depth {} is open",
              depth);
  EMBER_CHECK(tangent.shape() == t.shape() && tangent.dtype() == t.dtype() &&
                  tangent.device() == t.device(),
              "forward-mode autograd: a tangent of shape {} ({}, {}) for a tensor of shape {} "
              "({}, {})",
              tangent.shape(), tangent.dtype(), tangent.device(), t.shape(), t.dtype(), t.device());
  std::vector<ForwardGrad>& grads = t.impl()->forward_grads;
  const uint64_t id = t_levels[depth].id;
  std::erase_if(grads, [&](const ForwardGrad& g) { return !alive(g) || g.depth == depth; });
  auto at = grads.begin();
  while (at != grads.end() && at->depth < depth) ++at;
  grads.insert(at, {id, depth, tangent.impl_ptr()});
  t_levels[depth].dual.push_back(t.impl_ptr());
}

void copy_tangents(const Tensor& from, const Tensor& to) {
  if (!from.defined() || from.impl()->forward_grads.empty() || from.same(to)) return;
  const std::vector<ForwardGrad> grads = from.impl()->forward_grads;
  for (const ForwardGrad& g : grads)
    if (alive(g)) set_tangent(to, g.depth, Tensor(g.tangent));
}

void clear_tangent(const Tensor& t, uint32_t depth) {
  if (t.defined())
    std::erase_if(t.impl()->forward_grads, [&](const ForwardGrad& g) { return g.depth == depth; });
}

bool any_visible_tangent(const Tensor* inputs, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    if (!inputs[i].defined()) continue;
    for (const ForwardGrad& g : inputs[i].impl()->forward_grads)
      if (g.depth < detail::t_fw_visible && alive(g)) return true;
  }
  return false;
}

void step(Node& node, const Tensor* inputs, size_t n, Tensor* const* outputs, size_t m) {
  const std::vector<Tensor> in(inputs, inputs + n);
  std::vector<Tensor> out(m);
  for (size_t k = 0; k < m; ++k) out[k] = *outputs[k];
  const uint32_t visible = detail::t_fw_visible;
  for (uint32_t depth = 0; depth < visible; ++depth) {
    std::vector<Tensor> tangents(n);
    bool any = false;
    for (size_t i = 0; i < n; ++i) {
      tangents[i] = tangent(in[i], depth);
      any = any || tangents[i].defined();
    }
    if (!any) continue;
    std::vector<Tensor> results;
    {
      VisibleLevels scope(depth);
      results = node.jvp(in, tangents, out);
    }
    EMBER_CHECK(results.size() <= m, "{}: its forward rule gave {} tangents for {} outputs",
                node.op(), results.size(), m);
    for (size_t k = 0; k < results.size(); ++k) {
      if (!results[k].defined() || !out[k].defined() || !is_floating(out[k].dtype())) continue;
      EMBER_CHECK(results[k].shape() == out[k].shape(),
                  "{}: its forward rule gave a tangent of shape {} for output {} of shape {}",
                  node.op(), results[k].shape(), k, out[k].shape());
      Tensor t = results[k].dtype() == out[k].dtype() ? results[k] : results[k].to(out[k].dtype());
      if (shares_input_tangent(t, in, tangents, out[k])) {
        VisibleLevels scope(depth);
        t = t.clone();
      }
      set_tangent(out[k], depth, t);
      node.give_saved_output_tangent(static_cast<uint32_t>(k), depth, t);
    }
  }
}

Tensor add_tangents(const Tensor& a, const Tensor& b) {
  if (!a.defined()) return b;
  if (!b.defined()) return a;
  return add(a, b);
}

Tensor broadcast_tangent(const Tensor& t, const Shape& shape) {
  if (!t.defined() || t.shape() == shape) return t;
  return expand(t, shape);
}

Tensor tangent_or_zeros(const Tensor& t, const Tensor& like) {
  return t.defined() ? t : zeros_like(like);
}

}  // namespace fwd
}  // namespace ember
