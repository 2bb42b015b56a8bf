// Module: the base of every layer. It holds named parameters, buffers and child modules in
// registration order, walks them recursively with dotted names ("encoder.layers.0.norm.weight"),
// propagates train/eval, converts dtypes and deep-copies (clone). ModuleList and Sequential hold
// indexed children named "0", "1", ...
//
// Note [Cloning modules]
// clone() is PyTorch's copy.deepcopy. A module derives from Cloneable<Derived>, whose clone()
// copy-constructs Derived (its members then alias the original's tensors and children), gives the
// copy's registry new storage and cloned children, and points the copy's members at them. A module
// names the member when it registers: `register_parameter("weight", weight, t)` sets `weight` and
// records where it sits in the object (its offset from the Module base, the same in every object
// of the class), which is how clone() finds the copy's `weight`. State the registry does not hold
// (the last attention map, handles kept in a vector) is the business of the virtual rebind(map),
// which runs last. If a member still shares a registered tensor or child with the original after
// that (registered without naming the member, and not rebound), clone() throws naming it, so a
// forgotten handle fails loudly instead of silently tying two layers together.
//
// Note [Modules are not copyable]
// A plain copy of a module would share the original's tensors and children (its members alias
// them), so clone() is the only copy. Every library module declares its copy constructor private,
// for Cloneable alone (`friend Cloneable;`), which makes `nn::Linear b = a;` a compile error. The
// language gives each class a public copy constructor unless it declares one, so a user module
// that does not is refused at run time instead: Module's copy constructor throws outside clone().
#pragma once

#include <cstddef>
#include <memory>
#include <ranges>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "graph/tensor.h"

namespace ember::nn {

class Module;

// The old-handle -> new-handle map given to Module::rebind during clone().
class CloneMap {
 public:
  // Points t at the copy's tensor when t is a registered tensor of the original; else keeps it.
  void operator()(Tensor& t) const;
  // Points m at the copy's child when m is a registered child of the original; else keeps it.
  template <class M>
  void operator()(std::shared_ptr<M>& m) const {
    if (!m) return;
    const auto it = modules_.find(static_cast<const Module*>(m.get()));
    if (it != modules_.end()) m = std::static_pointer_cast<M>(it->second);
  }

 private:
  friend class Module;
  friend class ParameterSwap;
  std::unordered_map<const TensorImpl*, Tensor> tensors_;
  std::unordered_map<const Module*, std::shared_ptr<Module>> modules_;
};

using NamedTensors = std::vector<std::pair<std::string, Tensor>>;
class ParameterSwap;
using NamedModules = std::vector<std::pair<std::string, std::shared_ptr<Module>>>;

class Module {
 public:
  Module() = default;
  virtual ~Module();
  Module& operator=(const Module&) = delete;

  // Parameters of this module and (recurse) its descendants, each tensor once, in registration
  // order: own parameters first, then each child's under "child.".
  std::vector<Tensor> parameters(bool recurse = true) const;
  NamedTensors named_parameters(bool recurse = true) const;
  NamedTensors named_buffers(bool recurse = true) const;
  // Parameters and buffers under every name (shared tensors repeat), in PyTorch's state_dict
  // order: a module's parameters, then its buffers, then each child's. What save() writes.
  NamedTensors state_dict() const;
  const NamedModules& named_children() const { return children_; }
  // This module ("") and every descendant, depth first.
  std::vector<std::pair<std::string, const Module*>> named_modules() const;

  void train(bool on = true);
  void eval() { train(false); }
  bool is_training() const { return training_; }
  // Gradients become undefined (PyTorch's set_to_none).
  void zero_grad();
  // Converts floating parameters and buffers (and their gradients) in place: every handle to
  // them (members, optimizers) sees the new dtype. to(Device) moves every parameter and buffer
  // to the device the same way; to(Device, DType) does both.
  Module& to(DType dtype);
  Module& to(const Device& device);
  Module& to(const Device& device, DType dtype);
  // A deep copy with new storage; see Note [Cloning modules].
  virtual std::shared_ptr<Module> clone() const;
  // Points every registered tensor of this module and its descendants, and every member
  // registered with one, at map's replacement where map has one (each module once):
  // functional_call's swap.
  void repoint_tensors(const CloneMap& map);
  // The class name, for messages ("Linear").
  std::string type_name() const;

 protected:
  // For Cloneable::clone only, inside a CopyScope; throws elsewhere (Note [Modules are not
  // copyable]). The copy's members alias the original's until finish_clone.
  Module(const Module& other);
  // Permits Module copies on this thread while it lives.
  class CopyScope {
   public:
    CopyScope();
    ~CopyScope();
    CopyScope(const CopyScope&) = delete;
    CopyScope& operator=(const CopyScope&) = delete;
  };
  // Registers a floating leaf as a parameter and sets its requires_grad; returns the same handle.
  Tensor register_parameter(std::string name, Tensor t);
  // Registers a tensor saved with the module but not trained (e.g. a positional table).
  Tensor register_buffer(std::string name, Tensor t);
  template <class M>
  std::shared_ptr<M> register_module(std::string name, std::shared_ptr<M> m) {
    add_child(std::move(name), m);
    return m;
  }
  // The same, also setting the data member `member` to the registered handle, which clone() then
  // points at the copy's version; see Note [Cloning modules].
  Tensor& register_parameter(std::string name, Tensor& member, Tensor t);
  Tensor& register_buffer(std::string name, Tensor& member, Tensor t);
  template <class M>
  std::shared_ptr<M>& register_module(std::string name, std::shared_ptr<M>& member,
                                      std::type_identity_t<std::shared_ptr<M>> m) {
    member = register_module(name, std::move(m));
    add_member(std::move(name), &member, [](void* slot, const CloneMap& map) {
      map(*static_cast<std::shared_ptr<M>*>(slot));
    });
    return member;
  }
  // Points the handles the registry does not know at the copy's versions, or resets them; see
  // Note [Cloning modules].
  virtual void rebind(const CloneMap&) {}
  // How many handles share each registered tensor and child (taken before copying).
  std::vector<long> registry_use_counts() const;
  // clone()'s work after Derived's copy constructor: new storage, cloned children, members
  // pointed at them, rebind, and the check that no member still shares the original's tensors or
  // children. object_size is sizeof(Derived), the extent the registered members lie in.
  static std::shared_ptr<Module> finish_clone(const Module& original,
                                              const std::vector<long>& use_counts_before,
                                              std::shared_ptr<Module> copy, size_t object_size);

 private:
  // A data member holding a registered handle: where it sits and how to point it at the copy's.
  struct Member {
    std::string name;
    std::ptrdiff_t offset;  // from this Module base to the member
    void (*repoint)(void* member, const CloneMap& map);
  };

  void check_new_name(const std::string& name, std::string_view op) const;
  void add_child(std::string name, std::shared_ptr<Module> m);
  void add_member(std::string name, const void* member,
                  void (*repoint)(void* member, const CloneMap& map));
  void collect(const std::string& prefix, bool recurse, bool buffers, NamedTensors& out) const;

  NamedTensors parameters_;
  NamedTensors buffers_;
  NamedModules children_;
  std::vector<Member> members_;
  bool training_ = true;
};

// Gives Derived a clone() built on its copy constructor (see Note [Cloning modules]) and a call
// operator: module(args...) is module.forward(args...), whatever forward's arguments.
template <class Derived>
class Cloneable : public Module {
 public:
  std::shared_ptr<Module> clone() const override {
    const std::vector<long> counts = registry_use_counts();
    std::shared_ptr<Derived> copy;
    {
      const CopyScope scope;
      copy.reset(new Derived(static_cast<const Derived&>(*this)));  // maybe private: no make_shared
    }
    return finish_clone(*this, counts, std::move(copy), sizeof(Derived));
  }

  // (D stands for Derived, named so that the return type waits for the call, when Derived is
  // complete; the const operator exists where forward is const.)
  template <class... Args, class D = Derived>
  auto operator()(Args&&... args)
      -> decltype(std::declval<D&>().forward(std::forward<Args>(args)...)) {
    return static_cast<D&>(*this).forward(std::forward<Args>(args)...);
  }
  template <class... Args, class D = Derived>
  auto operator()(Args&&... args) const
      -> decltype(std::declval<const D&>().forward(std::forward<Args>(args)...)) {
    return static_cast<const D&>(*this).forward(std::forward<Args>(args)...);
  }
};

// An indexed list of modules, named "0", "1", ... (layers.0.weight).
class ModuleList : public Cloneable<ModuleList> {
 public:
  ModuleList() = default;
  explicit ModuleList(std::vector<std::shared_ptr<Module>> modules);
  void push_back(std::shared_ptr<Module> m);
  const std::shared_ptr<Module>& operator[](size_t i) const;
  // The i-th module as an M (throws when it is another type).
  template <class M>
  std::shared_ptr<M> at(size_t i) const {
    auto m = std::dynamic_pointer_cast<M>((*this)[i]);
    EMBER_CHECK(m != nullptr, "ModuleList: item {} is a {}, not the requested type", i,
                (*this)[i]->type_name());
    return m;
  }
  size_t size() const { return named_children().size(); }
  // The modules, read from the registry (an elements_view iterator holds only the vector's).
  auto begin() const { return std::views::values(named_children()).begin(); }
  auto end() const { return std::views::values(named_children()).end(); }

 private:
  friend Cloneable;  // the only copier; see Note [Modules are not copyable]
  ModuleList(const ModuleList&) = default;
};

// Modules of one input applied in order; names "0", "1", ... as torch.nn.Sequential. A module
// with forward_relu(x) (relu(forward(x)) as one op: BatchNorm1d, BatchNorm2d) followed by a
// module marked kIsRelu (ReLU) runs as that one call, the same values and gradients with fewer
// passes over the activations (ops/norm.h, batch_norm_relu).
class Sequential : public Cloneable<Sequential> {
 public:
  Sequential() = default;
  template <class... Ms>
  explicit Sequential(std::shared_ptr<Ms>... modules) {
    (push_back(std::move(modules)), ...);
  }
  // M needs forward(const Tensor&) -> Tensor.
  template <class M>
  void push_back(std::shared_ptr<M> m) {
    EMBER_CHECK(m != nullptr, "Sequential: cannot add a null module at {}", size());
    Calls calls{+[](Module& module, const Tensor& x) -> Tensor {
                  return static_cast<M&>(module).forward(x);
                },
                nullptr, kReluModule<M>};
    if constexpr (kHasForwardRelu<M>)
      calls.with_relu = +[](Module& module, const Tensor& x) -> Tensor {
        return static_cast<M&>(module).forward_relu(x);
      };
    calls_.push_back(calls);
    register_module(std::to_string(size()), std::move(m));
  }
  const std::shared_ptr<Module>& operator[](size_t i) const;
  size_t size() const { return named_children().size(); }
  auto begin() const { return std::views::values(named_children()).begin(); }
  auto end() const { return std::views::values(named_children()).end(); }
  Tensor forward(const Tensor& x) const;

 private:
  friend Cloneable;  // the only copier; see Note [Modules are not copyable]
  Sequential(const Sequential&) = default;

  template <class M>
  static constexpr bool kReluModule = requires {
    M::kIsRelu;
  };
  template <class M>
  static constexpr bool kHasForwardRelu = requires(M& m, const Tensor& x) {
    m.forward_relu(x);
  };

  using Call = Tensor (*)(Module&, const Tensor&);
  struct Calls {
    Call forward;    // module i's forward, typed
    Call with_relu;  // its forward_relu, or null
    bool is_relu;
  };
  std::vector<Calls> calls_;
};

// torch.func.functional_call: fn() run with the parameters and buffers named in `tensors` (the
// dotted names of named_parameters() and state_dict()) replaced by the given tensors, the module's
// own put back afterwards (also when fn throws); returns what fn returns. The replacements are
// used as they are, so what fn computes is a function of them: differentiable with respect to
// them, as autograd::functional's transforms need (`vhp(f, params, v)` with f calling the model
// inside functional_call). Every handle the module registered sees a replacement; a tensor
// registered under several names (tied weights) is replaced under all of them, and giving its
// names different tensors is an Error, as is a name the module does not have.
class ParameterSwap {
 public:
  ParameterSwap(Module& module, const NamedTensors& tensors);
  ~ParameterSwap();
  ParameterSwap(const ParameterSwap&) = delete;
  ParameterSwap& operator=(const ParameterSwap&) = delete;

 private:
  Module& module_;
  CloneMap back_;  // replacement -> the module's own
};

template <class F>
decltype(auto) functional_call(Module& module, const NamedTensors& tensors, F&& fn) {
  const ParameterSwap swap(module, tensors);
  return std::forward<F>(fn)();
}

}  // namespace ember::nn
