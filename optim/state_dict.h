// StateDict: an optimizer's or a scheduler's state as named tensors (numbers as 0-d tensors), so
// it saves as safetensors; the helpers that build one and StateReader, which reads one back with
// every check before anything is applied.
#pragma once

#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "graph/tensor.h"

namespace ember::optim {

// torch's state_dict() flattened to dotted names: "state.0.exp_avg", "param_groups.0.lr", …
using StateDict = std::vector<std::pair<std::string, Tensor>>;

Tensor state_number(double value);                     // 0-d Float64
Tensor state_integer(int64_t value);                   // 0-d Int64
Tensor state_flag(bool value);                         // 0-d Bool
Tensor state_numbers(const std::vector<double>& v);    // 1-D Float64
Tensor state_integers(const std::vector<int64_t>& v);  // 1-D Int64

// Reads named entries of a StateDict, checking each one's dtype and shape. Problems (a missing
// name, a wrong dtype or shape, a bad value reported with fail()) are collected, and the reads
// return zeros meanwhile; finish() throws one ember::Error naming them all and every entry never
// read (unexpected). Read everything, call finish(), and only then apply what was read.
class StateReader {
 public:
  StateReader(const StateDict& state, std::string op);

  bool contains(const std::string& name) const { return entries_.contains(name); }
  double number(const std::string& name);
  int64_t integer(const std::string& name);
  bool flag(const std::string& name);
  std::vector<double> numbers(const std::string& name, size_t size);
  std::vector<int64_t> integers(const std::string& name, size_t size);
  // A copy with its own contiguous storage of `name`, which must have `shape` and `dtype`, on
  // `device` (its parameter's: a checkpoint loads onto a GPU optimizer's device).
  Tensor tensor(const std::string& name, const Shape& shape, DType dtype,
                const Device& device = kCPU);

  void fail(std::string problem) { problems_.push_back(std::move(problem)); }
  void finish() const;

 private:
  const Tensor* find(const std::string& name, DType dtype, const Shape& shape);

  std::string op_;
  std::map<std::string, Tensor> entries_;
  std::set<std::string> read_;
  std::vector<std::string> missing_, problems_;
};

}  // namespace ember::optim
