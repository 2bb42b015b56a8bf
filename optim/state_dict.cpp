// StateDict builders and StateReader: every problem of a state dict is collected and reported
// at once, before its owner changes anything.
#include "optim/state_dict.h"

#include "graph/creation.h"

namespace ember::optim {

Tensor state_number(double value) { return scalar_tensor(value, kFloat64); }

Tensor state_integer(int64_t value) { return from_vector(std::vector<int64_t>{value}, {}); }

Tensor state_flag(bool value) { return scalar_tensor(value ? 1 : 0, kBool); }

Tensor state_numbers(const std::vector<double>& v) {
  return from_vector(v, {static_cast<int64_t>(v.size())}, kFloat64);
}

Tensor state_integers(const std::vector<int64_t>& v) {
  return from_vector(v, {static_cast<int64_t>(v.size())});
}

StateReader::StateReader(const StateDict& state, std::string op) : op_(std::move(op)) {
  for (const auto& [name, t] : state) {
    if (!t.defined())
      fail(fmt::format("'{}' is an undefined tensor", name));
    else if (!entries_.emplace(name, t).second)
      fail(fmt::format("'{}' appears twice", name));
  }
}

const Tensor* StateReader::find(const std::string& name, DType dtype, const Shape& shape) {
  const auto it = entries_.find(name);
  if (it == entries_.end()) {
    missing_.push_back(name);
    return nullptr;
  }
  read_.insert(name);
  const Tensor& t = it->second;
  if (t.dtype() != dtype || t.shape() != shape) {
    fail(fmt::format("'{}' is {} of shape {}, expected {} of shape {}", name, t.dtype(), t.shape(),
                     dtype, shape));
    return nullptr;
  }
  return &t;
}

double StateReader::number(const std::string& name) {
  const Tensor* t = find(name, kFloat64, {});
  return t ? t->item<double>() : 0.0;
}

int64_t StateReader::integer(const std::string& name) {
  const Tensor* t = find(name, kInt64, {});
  return t ? t->item<int64_t>() : 0;
}

bool StateReader::flag(const std::string& name) {
  const Tensor* t = find(name, kBool, {});
  return t ? t->item<bool>() : false;
}

std::vector<double> StateReader::numbers(const std::string& name, size_t size) {
  const Tensor* t = find(name, kFloat64, {static_cast<int64_t>(size)});
  return t ? t->to_vector<double>() : std::vector<double>(size);
}

std::vector<int64_t> StateReader::integers(const std::string& name, size_t size) {
  const Tensor* t = find(name, kInt64, {static_cast<int64_t>(size)});
  return t ? t->to_vector<int64_t>() : std::vector<int64_t>(size);
}

Tensor StateReader::tensor(const std::string& name, const Shape& shape, DType dtype,
                           const Device& device) {
  const Tensor* t = find(name, dtype, shape);
  if (!t) return Tensor();
  return t->device() == device ? t->detach().clone() : t->detach().to(device);
}

void StateReader::finish() const {
  std::vector<std::string> unexpected;
  for (const auto& [name, t] : entries_)
    if (!read_.contains(name)) unexpected.push_back(name);
  if (missing_.empty() && unexpected.empty() && problems_.empty()) return;
  std::string message = fmt::format("{}: the state dict does not match", op_);
  if (!missing_.empty()) message += fmt::format("; missing {}", fmt::join(missing_, ", "));
  if (!unexpected.empty()) message += fmt::format("; unexpected {}", fmt::join(unexpected, ", "));
  if (!problems_.empty()) message += fmt::format("; {}", fmt::join(problems_, "; "));
  throw Error(message);
}

}  // namespace ember::optim
