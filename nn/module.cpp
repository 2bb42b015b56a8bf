// Module's registry walks, train/eval, dtype conversion and cloning; ModuleList and Sequential.
#include "nn/module.h"

#include <cxxabi.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <typeinfo>
#include <unordered_set>
#include <utility>

#include "graph/autograd.h"

namespace ember::nn {

void CloneMap::operator()(Tensor& t) const {
  if (!t.defined()) return;
  const auto it = tensors_.find(t.impl());
  if (it != tensors_.end()) t = it->second;
}

namespace {

thread_local int copy_scopes = 0;  // CopyScopes alive on this thread

void repoint_tensor(void* member, const CloneMap& map) { map(*static_cast<Tensor*>(member)); }

// The address offset bytes past m.
std::uintptr_t address_in(const Module& m, std::ptrdiff_t offset) {
  return reinterpret_cast<std::uintptr_t>(&m) + static_cast<std::uintptr_t>(offset);
}

}  // namespace

Module::~Module() = default;

Module::CopyScope::CopyScope() { ++copy_scopes; }
Module::CopyScope::~CopyScope() { --copy_scopes; }

Module::Module(const Module& other)
    : parameters_(other.parameters_),
      buffers_(other.buffers_),
      children_(other.children_),
      members_(other.members_),
      training_(other.training_) {
  EMBER_CHECK(copy_scopes > 0,
              "{}: a module cannot be copied (the copy would share the original's tensors and "
              "children); use clone()",
              other.type_name());
}

std::string Module::type_name() const {
  const char* mangled = typeid(*this).name();
  int status = 0;
  char* demangled = abi::__cxa_demangle(mangled, nullptr, nullptr, &status);
  std::string name = status == 0 && demangled ? demangled : mangled;
  std::free(demangled);
  const size_t colon = name.rfind("::");
  return colon == std::string::npos ? name : name.substr(colon + 2);
}

// --- registration

void Module::check_new_name(const std::string& name, std::string_view op) const {
  EMBER_CHECK(!name.empty(), "{}: empty name in {}", op, type_name());
  EMBER_CHECK(name.find('.') == std::string::npos, "{}: name '{}' must not contain '.'", op, name);
  const auto taken = [&](const auto& entries) {
    for (const auto& e : entries)
      if (e.first == name) return true;
    return false;
  };
  EMBER_CHECK(!taken(parameters_) && !taken(buffers_) && !taken(children_),
              "{}: {} already has a member named '{}'", op, type_name(), name);
}

Tensor Module::register_parameter(std::string name, Tensor t) {
  check_new_name(name, "register_parameter");
  EMBER_CHECK(t.defined(), "register_parameter: '{}' is an undefined tensor", name);
  EMBER_CHECK(t.is_leaf(),
              "register_parameter: '{}' of shape {} is not a leaf (it was computed by {}); "
              "register t.detach()",
              name, t.shape(), t.is_leaf() ? "" : t.grad_fn()->name());
  EMBER_CHECK(is_floating(t.dtype()),
              "register_parameter: '{}' must be Float32 or Float64, got {} of shape {}", name,
              t.dtype(), t.shape());
  t.requires_grad_(true);
  parameters_.emplace_back(std::move(name), t);
  return t;
}

Tensor Module::register_buffer(std::string name, Tensor t) {
  check_new_name(name, "register_buffer");
  EMBER_CHECK(t.defined(), "register_buffer: '{}' is an undefined tensor", name);
  buffers_.emplace_back(std::move(name), t);
  return t;
}

Tensor& Module::register_parameter(std::string name, Tensor& member, Tensor t) {
  member = register_parameter(name, std::move(t));
  add_member(std::move(name), &member, repoint_tensor);
  return member;
}

Tensor& Module::register_buffer(std::string name, Tensor& member, Tensor t) {
  member = register_buffer(name, std::move(t));
  add_member(std::move(name), &member, repoint_tensor);
  return member;
}

void Module::add_member(std::string name, const void* member,
                        void (*repoint)(void* member, const CloneMap& map)) {
  const auto offset = static_cast<std::ptrdiff_t>(reinterpret_cast<std::uintptr_t>(member) -
                                                  reinterpret_cast<std::uintptr_t>(this));
  members_.push_back({std::move(name), offset, repoint});
}

void Module::add_child(std::string name, std::shared_ptr<Module> m) {
  check_new_name(name, "register_module");
  EMBER_CHECK(m != nullptr, "register_module: '{}' is a null module", name);
  EMBER_CHECK(m.get() != this, "register_module: '{}' cannot be the module itself", name);
  children_.emplace_back(std::move(name), std::move(m));
}

// --- walks

void Module::collect(const std::string& prefix, bool recurse, bool buffers,
                     NamedTensors& out) const {
  for (const auto& [name, t] : buffers ? buffers_ : parameters_) out.emplace_back(prefix + name, t);
  if (!recurse) return;
  for (const auto& [name, child] : children_)
    child->collect(prefix + name + ".", true, buffers, out);
}

namespace {

// Keeps the first name of each tensor, as PyTorch's remove_duplicate.
NamedTensors unique(NamedTensors all) {
  std::unordered_set<const TensorImpl*> seen;
  NamedTensors out;
  for (auto& entry : all)
    if (seen.insert(entry.second.impl()).second) out.push_back(std::move(entry));
  return out;
}

}  // namespace

NamedTensors Module::named_parameters(bool recurse) const {
  NamedTensors all;
  collect("", recurse, false, all);
  return unique(std::move(all));
}

NamedTensors Module::named_buffers(bool recurse) const {
  NamedTensors all;
  collect("", recurse, true, all);
  return unique(std::move(all));
}

std::vector<Tensor> Module::parameters(bool recurse) const {
  std::vector<Tensor> out;
  for (auto& entry : named_parameters(recurse)) out.push_back(std::move(entry.second));
  return out;
}

NamedTensors Module::state_dict() const {
  NamedTensors out;
  for (const auto& [prefix, m] : named_modules()) {
    const std::string dot = prefix.empty() ? "" : prefix + ".";
    for (const auto& [name, t] : m->parameters_) out.emplace_back(dot + name, t);
    for (const auto& [name, t] : m->buffers_) out.emplace_back(dot + name, t);
  }
  return out;
}

std::vector<std::pair<std::string, const Module*>> Module::named_modules() const {
  std::vector<std::pair<std::string, const Module*>> out{{"", this}};
  for (const auto& [name, child] : children_)
    for (const auto& [sub, m] : child->named_modules())
      out.emplace_back(sub.empty() ? name : name + "." + sub, m);
  return out;
}

// --- state

void Module::train(bool on) {
  training_ = on;
  for (const auto& entry : children_) entry.second->train(on);
}

void Module::zero_grad() {
  for (const Tensor& p : parameters()) p.set_grad(Tensor());
}

namespace {

// Every parameter and buffer of `m` to `device` (when given), the floating ones to `dtype` (when
// given), in place: every handle (members, optimizers) shares the TensorImpl, so its data is
// swapped under it. Each is converted before any is swapped, so a refusal leaves `m` as it was.
void convert_in_place(Module& m, const std::optional<Device>& device, std::optional<DType> dtype) {
  EMBER_CHECK(!dtype || is_floating(*dtype), "Module::to: only Float32 or Float64 modules, got {}",
              *dtype);
  NoGradGuard no_grad;
  NamedTensors all = m.named_parameters();
  for (auto& b : m.named_buffers()) all.push_back(std::move(b));
  const auto convert = [&](const Tensor& t) {
    const DType target = dtype && is_floating(t.dtype()) ? *dtype : t.dtype();
    return t.detach().to(device.value_or(t.device()), target);
  };
  std::vector<std::pair<Tensor, Tensor>> done;        // (tensor, its converted data)
  std::vector<std::pair<TensorImpl*, Tensor>> grads;  // (tensor, its converted gradient)
  for (const auto& [name, t] : all) {
    const Tensor converted = convert(t);
    if (converted.impl()->storage == t.impl()->storage && converted.dtype() == t.dtype()) continue;
    done.emplace_back(t, converted);
    if (t.impl()->grad) grads.emplace_back(t.impl(), convert(Tensor(t.impl()->grad)));
  }
  for (const auto& [t, converted] : done) {
    TensorImpl& impl = *t.impl();
    impl.storage = converted.impl()->storage;
    impl.offset = converted.storage_offset();
    impl.strides = converted.strides();
    impl.dtype = converted.dtype();
  }
  for (const auto& [impl, grad] : grads) impl->grad = grad.impl_ptr();
}

}  // namespace

Module& Module::to(DType dtype) {
  convert_in_place(*this, std::nullopt, dtype);
  return *this;
}

Module& Module::to(const Device& device) {
  convert_in_place(*this, device, std::nullopt);
  return *this;
}

Module& Module::to(const Device& device, DType dtype) {
  convert_in_place(*this, device, dtype);
  return *this;
}

// --- cloning: see Note [Cloning modules]

std::shared_ptr<Module> Module::clone() const {
  throw Error(fmt::format(
      "clone: {} cannot be cloned; derive it from nn::Cloneable<{}> instead of nn::Module",
      type_name(), type_name()));
}

std::vector<long> Module::registry_use_counts() const {
  std::vector<long> counts;
  for (const auto& e : parameters_) counts.push_back(e.second.impl_ptr().use_count());
  for (const auto& e : buffers_) counts.push_back(e.second.impl_ptr().use_count());
  for (const auto& e : children_) counts.push_back(e.second.use_count());
  return counts;
}

std::shared_ptr<Module> Module::finish_clone(const Module& original,
                                             const std::vector<long>& use_counts_before,
                                             std::shared_ptr<Module> copy, size_t object_size) {
  // Cloneable<Base>::clone of a class derived from Base would copy only its Base part.
  EMBER_CHECK(typeid(original) == typeid(*copy),
              "clone: a {} cannot be cloned as the {} it derives from (the copy would lose what {} "
              "adds); derive {} from nn::Cloneable<{}> instead",
              original.type_name(), copy->type_name(), original.type_name(), original.type_name(),
              original.type_name());
  NoGradGuard no_grad;
  CloneMap map;
  const auto deep_copy = [&](Tensor& t) {
    auto [it, fresh] = map.tensors_.try_emplace(t.impl());
    if (fresh) {
      Tensor c = t.detach().clone();
      if (t.requires_grad()) c.requires_grad_(true);
      if (t.grad().defined()) c.set_grad(t.grad().clone());
      it->second = c;
    }
    t = it->second;
  };
  for (auto& entry : copy->parameters_) deep_copy(entry.second);
  for (auto& entry : copy->buffers_) deep_copy(entry.second);
  for (auto& [name, child] : copy->children_) {
    auto [it, fresh] = map.modules_.try_emplace(child.get());
    if (fresh) it->second = child->clone();
    child = it->second;
  }
  // Registered members lie inside the object; anything else would be written at random.
  const auto begin = reinterpret_cast<std::uintptr_t>(dynamic_cast<const void*>(&original));
  for (const Member& m : original.members_) {
    const std::uintptr_t at = address_in(original, m.offset);
    EMBER_CHECK(at >= begin && at < begin + object_size,
                "clone: {} registered '{}' with a handle that is not one of its data members",
                original.type_name(), m.name);
    m.repoint(reinterpret_cast<void*>(address_in(*copy, m.offset)), map);
  }
  copy->rebind(map);

  // A handle of the original that gained an owner is still held by a member of the copy.
  const std::vector<long> after = original.registry_use_counts();
  const size_t np = original.parameters_.size(), nb = original.buffers_.size();
  for (size_t i = 0; i < after.size(); ++i) {
    if (after[i] <= use_counts_before[i]) continue;
    const std::string& what = i < np        ? original.parameters_[i].first
                              : i < np + nb ? original.buffers_[i - np].first
                                            : original.children_[i - np - nb].first;
    throw Error(fmt::format(
        "clone: a member of the copy of {} still shares '{}' with the original; register it "
        "with its member (register_parameter(name, member, tensor)) or point it at the copy in "
        "{}::rebind (map(member);)",
        original.type_name(), what, original.type_name()));
  }
  return copy;
}

void Module::repoint_tensors(const CloneMap& map) {
  std::unordered_set<const Module*> seen;
  const auto walk = [&](auto&& self, Module& m) -> void {
    if (!seen.insert(&m).second) return;
    for (auto& entry : m.parameters_) map(entry.second);
    for (auto& entry : m.buffers_) map(entry.second);
    for (const Member& member : m.members_)
      member.repoint(reinterpret_cast<void*>(address_in(m, member.offset)), map);
    for (auto& child : m.children_) self(self, *child.second);
  };
  walk(walk, *this);
}

ParameterSwap::ParameterSwap(Module& module, const NamedTensors& tensors) : module_(module) {
  constexpr std::string_view op = "functional_call";
  NamedTensors own = module.state_dict();
  CloneMap forward;
  for (const auto& [name, t] : tensors) {
    const auto it =
        std::find_if(own.begin(), own.end(), [&](const auto& e) { return e.first == name; });
    EMBER_CHECK(it != own.end(), "{}: {} has no parameter or buffer named '{}'", op,
                module.type_name(), name);
    EMBER_CHECK(t.defined(), "{}: the tensor given for '{}' is undefined", op, name);
    const auto mine = std::find_if(own.begin(), own.end(),
                                   [&](const auto& e) { return e.second.impl() == t.impl(); });
    EMBER_CHECK(mine == own.end() || mine->second.impl() == it->second.impl(),
                "{}: the tensor given for '{}' is the module's own '{}'; give a separate tensor "
                "(e.g. its detach())",
                op, name, mine->first);
    const auto [f, fresh] = forward.tensors_.try_emplace(it->second.impl(), t);
    EMBER_CHECK(fresh || f->second.impl() == t.impl(),
                "{}: '{}' is tied to another name given a different tensor; give tied names "
                "the same one",
                op, name);
    const auto [b, new_back] = back_.tensors_.try_emplace(t.impl(), it->second);
    EMBER_CHECK(new_back || b->second.impl() == it->second.impl(),
                "{}: one tensor given for '{}' and for another name that is not tied to it", op,
                name);
  }
  module.repoint_tensors(forward);
}

ParameterSwap::~ParameterSwap() { module_.repoint_tensors(back_); }

// --- ModuleList

ModuleList::ModuleList(std::vector<std::shared_ptr<Module>> modules) {
  for (auto& m : modules) push_back(std::move(m));
}

void ModuleList::push_back(std::shared_ptr<Module> m) {
  EMBER_CHECK(m != nullptr, "ModuleList: cannot add a null module at {}", size());
  register_module(std::to_string(size()), std::move(m));
}

const std::shared_ptr<Module>& ModuleList::operator[](size_t i) const {
  EMBER_CHECK(i < size(), "ModuleList: index {} out of range for {} modules", i, size());
  return named_children()[i].second;
}

// --- Sequential

const std::shared_ptr<Module>& Sequential::operator[](size_t i) const {
  EMBER_CHECK(i < size(), "Sequential: index {} out of range for {} modules", i, size());
  return named_children()[i].second;
}

Tensor Sequential::forward(const Tensor& x) const {
  Tensor y = x;
  const size_t n = size();
  for (size_t i = 0; i < n; ++i) {
    Module& module = *named_children()[i].second;
    if (calls_[i].with_relu && i + 1 < n && calls_[i + 1].is_relu)
      y = calls_[i++].with_relu(module, y);  // the ReLU at i + 1 runs inside
    else
      y = calls_[i].forward(module, y);
  }
  return y;
}

}  // namespace ember::nn
