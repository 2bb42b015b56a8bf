// save_checkpoint / load_checkpoint: one safetensors file through nn::write_safetensors and
// nn::read_safetensors; loading checks every part (model, optimizer, scheduler, generator,
// counters) before it applies any.
#include "train/checkpoint.h"

#include <charconv>
#include <set>

#include "graph/autograd.h"
#include "graph/random.h"
#include "nn/serialization.h"

namespace ember {

namespace {

void check_scheduler(const optim::Optimizer& optimizer, const optim::LRScheduler* scheduler,
                     std::string_view op) {
  EMBER_CHECK(scheduler == nullptr || &scheduler->optimizer() == &optimizer,
              "{}: the scheduler drives another optimizer than the one given", op);
}

// "a, b, c", or "none".
std::string list(const std::vector<std::string>& names) {
  return names.empty() ? "none" : fmt::format("{}", fmt::join(names, ", "));
}

// The parts of a checkpoint file, split by prefix.
struct Parts {
  std::map<std::string, Tensor> model;
  optim::StateDict optimizer, scheduler;
  Tensor rng;
};

Parts split(const std::map<std::string, Tensor>& tensors) {
  Parts parts;
  std::vector<std::string> unexpected;
  for (const auto& [name, t] : tensors) {
    if (name.starts_with("model."))
      parts.model.emplace(name.substr(6), t);
    else if (name.starts_with("optimizer."))
      parts.optimizer.emplace_back(name.substr(10), t);
    else if (name.starts_with("scheduler."))
      parts.scheduler.emplace_back(name.substr(10), t);
    else if (name == "rng.state")
      parts.rng = t;
    else
      unexpected.push_back(name);
  }
  EMBER_CHECK(unexpected.empty(),
              "unexpected tensors {} (a checkpoint holds model.*, optimizer.*, scheduler.* and "
              "rng.state)",
              list(unexpected));
  return parts;
}

// The model's names, shapes and dtypes against the file's, every problem at once.
void check_model(const nn::Module& model, const std::map<std::string, Tensor>& saved) {
  std::vector<std::string> missing, unexpected, mismatched;
  std::set<std::string> known;
  for (const auto& [name, t] : model.state_dict()) {
    known.insert(name);
    const auto it = saved.find(name);
    if (it == saved.end())
      missing.push_back("model." + name);
    else if (it->second.shape() != t.shape() || it->second.dtype() != t.dtype())
      mismatched.push_back(fmt::format("'model.{}' is {} {} in the file, {} {} in the model", name,
                                       it->second.dtype(), it->second.shape(), t.dtype(),
                                       t.shape()));
  }
  for (const auto& [name, t] : saved)
    if (!known.contains(name)) unexpected.push_back("model." + name);
  EMBER_CHECK(missing.empty() && unexpected.empty() && mismatched.empty(),
              "the model ({}) does not match: missing {}; unexpected {}; mismatched {}",
              model.type_name(), list(missing), list(unexpected), list(mismatched));
}

std::map<std::string, int64_t> parse_counters(const std::map<std::string, std::string>& metadata) {
  std::map<std::string, int64_t> counters;
  for (const auto& [key, text] : metadata) {
    int64_t value = 0;
    const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
    EMBER_CHECK(ec == std::errc() && end == text.data() + text.size() && !text.empty(),
                "the counter '{}' is '{}', not a 64-bit integer", key, text);
    counters[key] = value;
  }
  return counters;
}

}  // namespace

void save_checkpoint(const std::string& path, const nn::Module& model,
                     const optim::Optimizer& optimizer, const optim::LRScheduler* scheduler,
                     const std::map<std::string, int64_t>& counters) {
  check_scheduler(optimizer, scheduler, "save_checkpoint");
  nn::NamedTensors tensors;
  for (const auto& [name, t] : model.state_dict()) tensors.emplace_back("model." + name, t);
  for (const auto& [name, t] : optimizer.state_dict()) tensors.emplace_back("optimizer." + name, t);
  if (scheduler)
    for (const auto& [name, t] : scheduler->state_dict())
      tensors.emplace_back("scheduler." + name, t);
  tensors.emplace_back("rng.state", get_rng_state());
  std::map<std::string, std::string> metadata;
  for (const auto& [key, value] : counters) metadata[key] = std::to_string(value);
  nn::write_safetensors(path, tensors, metadata);
}

std::map<std::string, int64_t> load_checkpoint(const std::string& path, nn::Module& model,
                                               optim::Optimizer& optimizer,
                                               optim::LRScheduler* scheduler) {
  check_scheduler(optimizer, scheduler, "load_checkpoint");
  Parts parts;
  std::map<std::string, int64_t> counters;
  try {
    const nn::SafetensorsFile file = nn::read_safetensors(path);
    parts = split(file.tensors);
    check_model(model, parts.model);
    optimizer.check_state_dict(parts.optimizer);
    if (scheduler) {
      EMBER_CHECK(!parts.scheduler.empty(),
                  "the file holds no scheduler state, but a scheduler was given");
      scheduler->check_state_dict(parts.scheduler);
    } else {
      EMBER_CHECK(parts.scheduler.empty(),
                  "the file holds a scheduler state ({} tensors), but no scheduler was given",
                  parts.scheduler.size());
    }
    const Tensor rng = get_rng_state();
    EMBER_CHECK(parts.rng.defined(), "the file has no rng.state");
    EMBER_CHECK(parts.rng.dtype() == rng.dtype() && parts.rng.shape() == rng.shape(),
                "rng.state is {} of shape {}, the generator's state is {} of shape {}",
                parts.rng.dtype(), parts.rng.shape(), rng.dtype(), rng.shape());
    counters = parse_counters(file.metadata);
    // The generator goes first: its last check (the state's contents) is inside set_rng_state,
    // and nothing else has changed if it throws. Every other part was checked above.
    set_rng_state(parts.rng);
  } catch (const Error& e) {
    throw Error(fmt::format("load_checkpoint: '{}': {}", path, e.what()));
  }
  optimizer.load_state_dict(parts.optimizer);
  if (scheduler) scheduler->load_state_dict(parts.scheduler);
  NoGradGuard no_grad;
  for (auto& [name, t] : model.state_dict()) t.copy_(parts.model.at(name));
  return counters;
}

}  // namespace ember
