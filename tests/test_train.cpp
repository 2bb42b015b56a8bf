// Training checkpoints: a run stopped and resumed from save_checkpoint/load_checkpoint is
// bit-identical to one never stopped (losses, parameters, dropout masks and batches from the
// restored generator); the file's tensor names; every refusal leaves everything unchanged.
#include <unistd.h>

#include <filesystem>

#include "helpers.h"

using namespace ember;
using namespace ember::testing;
namespace fs = std::filesystem;

namespace {

struct TempDir {
  fs::path dir = fs::temp_directory_path() / fmt::format("ember_test_train_{}", getpid());
  TempDir() { fs::create_directories(dir); }
  ~TempDir() { fs::remove_all(dir); }
  std::string operator/(const std::string& name) const { return (dir / name).string(); }
};

// Linear -> tanh -> dropout -> Linear, and a buffer counting the batches seen.
struct Net : nn::Module {
  Net() {
    fc1 = register_module("fc1", std::make_shared<nn::Linear>(4, 8));
    drop = register_module("drop", std::make_shared<nn::Dropout>(0.3));
    fc2 = register_module("fc2", std::make_shared<nn::Linear>(8, 1));
    batches = register_buffer("batches", zeros({}, kInt64));
  }
  Tensor forward(const Tensor& x) {
    batches.add_(1.0);
    return fc2->forward(drop->forward(tanh(fc1->forward(x))));
  }
  std::shared_ptr<nn::Linear> fc1, fc2;
  std::shared_ptr<nn::Dropout> drop;
  Tensor batches;
};

constexpr int kSteps = 12;

// A model (initialised from `seed`), its optimizer and scheduler; kind picks the pair.
struct Run {
  std::shared_ptr<Net> model;
  std::unique_ptr<optim::Optimizer> optimizer;
  std::unique_ptr<optim::LRScheduler> scheduler;
};

Run make_run(const std::string& kind, uint64_t seed) {
  manual_seed(seed);
  Run r;
  r.model = std::make_shared<Net>();
  if (kind == "adam_onecycle") {
    r.optimizer = std::make_unique<optim::Adam>(r.model->parameters(), optim::AdamOptions{});
    r.scheduler = std::make_unique<optim::OneCycleLR>(*r.optimizer, 0.05, kSteps);
  } else {  // two groups with AdamW, warmup then cosine
    r.optimizer =
        std::make_unique<optim::AdamW>(std::vector<optim::ParamGroup<optim::AdamWOptions>>{
            {r.model->fc1->parameters(), {.lr = 0.02}},
            {r.model->fc2->parameters(), {.lr = 0.01, .weight_decay = 0.1}}});
    auto& o = *r.optimizer;
    r.scheduler = std::make_unique<optim::SequentialLR>(
        o,
        std::vector<std::shared_ptr<optim::LRScheduler>>{
            std::make_shared<optim::LinearLR>(o, 0.1, 1.0, 3),
            std::make_shared<optim::CosineAnnealingLR>(o, kSteps - 4, 1e-4)},
        std::vector<int64_t>{4});
  }
  return r;
}

// One step on a batch drawn from the global generator; returns the loss.
float train_step(Run& r) {
  const Tensor x = randn({16, 4});
  const Tensor y = x.sum({1}, true).sin();
  r.optimizer->zero_grad();
  const Tensor loss = mse_loss(r.model->forward(x), y);
  loss.backward();
  r.optimizer->step();
  r.scheduler->step();
  return loss.item<float>();
}

std::map<std::string, std::vector<double>> contents(const nn::NamedTensors& tensors) {
  std::map<std::string, std::vector<double>> out;
  for (const auto& [name, t] : tensors) out[name] = t.to_vector<double>();
  return out;
}

// Everything a failed load must leave alone.
struct Snapshot {
  std::map<std::string, std::vector<double>> model, optimizer, scheduler;
  std::vector<int64_t> rng;
  explicit Snapshot(const Run& r)
      : model(contents(r.model->state_dict())),
        optimizer(contents(r.optimizer->state_dict())),
        scheduler(contents(r.scheduler->state_dict())),
        rng(get_rng_state().to_vector<int64_t>()) {}
  bool operator==(const Snapshot&) const = default;
};

}  // namespace

BOOST_AUTO_TEST_SUITE(test_train)

BOOST_AUTO_TEST_CASE(resumed_run_is_bit_identical) {
  TempDir tmp;
  for (const std::string kind : {"adam_onecycle", "adamw_groups_sequential"}) {
    Run whole = make_run(kind, 0);
    std::vector<float> losses;
    for (int i = 0; i < kSteps; ++i) losses.push_back(train_step(whole));

    Run first = make_run(kind, 0);
    for (int i = 0; i < kSteps / 2; ++i) BOOST_TEST(train_step(first) == losses[i], kind << i);
    const std::string path = tmp / (kind + ".safetensors");
    save_checkpoint(path, *first.model, *first.optimizer, first.scheduler.get(),
                    {{"step", kSteps / 2}, {"epoch", 3}});
    first = {};
    randn({100});  // the generator moves on: the checkpoint must bring it back

    Run resumed = make_run(kind, 123);  // other initial parameters, lrs and momenta
    const auto counters =
        load_checkpoint(path, *resumed.model, *resumed.optimizer, resumed.scheduler.get());
    BOOST_TEST((counters == std::map<std::string, int64_t>{{"step", kSteps / 2}, {"epoch", 3}}));
    BOOST_TEST(resumed.scheduler->last_epoch() == kSteps / 2);
    for (int i = kSteps / 2; i < kSteps; ++i)
      BOOST_TEST(train_step(resumed) == losses[i], kind << " step " << i);
    BOOST_TEST((contents(resumed.model->state_dict()) == contents(whole.model->state_dict())),
               kind);
    BOOST_TEST(
        (contents(resumed.optimizer->state_dict()) == contents(whole.optimizer->state_dict())),
        kind);
    BOOST_TEST((resumed.scheduler->get_last_lr() == whole.scheduler->get_last_lr()), kind);
    BOOST_TEST((get_rng_state().to_vector<int64_t>() ==
                [&] {
                  Run again = make_run(kind, 0);
                  for (int i = 0; i < kSteps; ++i) train_step(again);
                  return get_rng_state().to_vector<int64_t>();
                }()),
               kind);
  }
}

BOOST_AUTO_TEST_CASE(file_names_as_api) {
  TempDir tmp;
  Run r = make_run("adam_onecycle", 0);
  for (int i = 0; i < 2; ++i) train_step(r);
  save_checkpoint(tmp / "ckpt.safetensors", *r.model, *r.optimizer, r.scheduler.get(),
                  {{"step", 2}, {"best", -7}});
  const nn::SafetensorsFile file = nn::read_safetensors(tmp / "ckpt.safetensors");
  std::set<std::string> expected = {"rng.state"};
  for (const auto& [name, t] : r.model->state_dict()) expected.insert("model." + name);
  for (const auto& [name, t] : r.optimizer->state_dict()) expected.insert("optimizer." + name);
  for (const auto& [name, t] : r.scheduler->state_dict()) expected.insert("scheduler." + name);
  std::set<std::string> stored;
  for (const auto& [name, t] : file.tensors) stored.insert(name);
  BOOST_TEST((stored == expected));
  for (const std::string name :
       {"model.fc1.weight", "model.fc2.bias", "model.batches", "optimizer.state.0.exp_avg",
        "optimizer.state.3.exp_avg_sq", "optimizer.state.1.step", "optimizer.param_groups.0.lr",
        "optimizer.param_groups.0.betas", "optimizer.param_groups.0.params", "scheduler.last_epoch",
        "scheduler.base_lrs", "rng.state"})
    BOOST_TEST(stored.contains(name), name);
  BOOST_TEST(file.tensors.at("optimizer.state.1.step").item<int64_t>() == 2);
  expect_close(file.tensors.at("model.fc1.weight"), r.model->fc1->weight, 0, 0);
  BOOST_TEST(
      (file.tensors.at("rng.state").to_vector<int64_t>() == get_rng_state().to_vector<int64_t>()));
  BOOST_TEST((file.metadata == std::map<std::string, std::string>{{"step", "2"}, {"best", "-7"}}));

  // Without a scheduler: no scheduler.* names, and no counters.
  save_checkpoint(tmp / "plain.safetensors", *r.model, *r.optimizer);
  const nn::SafetensorsFile plain = nn::read_safetensors(tmp / "plain.safetensors");
  for (const auto& [name, t] : plain.tensors) BOOST_TEST(!name.starts_with("scheduler."), name);
  BOOST_TEST(plain.metadata.empty());
  BOOST_TEST(load_checkpoint(tmp / "plain.safetensors", *r.model, *r.optimizer).empty());
}

BOOST_AUTO_TEST_CASE(refused_loads_change_nothing) {
  TempDir tmp;
  Run saved = make_run("adam_onecycle", 0);
  for (int i = 0; i < 3; ++i) train_step(saved);
  const std::string path = tmp / "good.safetensors";
  save_checkpoint(path, *saved.model, *saved.optimizer, saved.scheduler.get(), {{"step", 3}});
  save_checkpoint(tmp / "no_scheduler.safetensors", *saved.model, *saved.optimizer);

  Run other = make_run("adam_onecycle", 6);
  Run target = make_run("adam_onecycle", 5);
  train_step(target);
  const Snapshot before(target);
  const auto refused = [&](const std::string& file, std::initializer_list<std::string> parts,
                           Run& r, optim::LRScheduler* scheduler) {
    const Snapshot was(r);
    expect_error([&] { load_checkpoint(file, *r.model, *r.optimizer, scheduler); }, parts);
    BOOST_TEST((Snapshot(r) == was), file);
  };
  const auto rewrite = [&](const std::string& name,
                           const std::function<void(nn::SafetensorsFile&)>& edit) {
    nn::SafetensorsFile f = nn::read_safetensors(path);
    edit(f);
    const nn::NamedTensors tensors(f.tensors.begin(), f.tensors.end());
    nn::write_safetensors(tmp / name, tensors, f.metadata);
    return tmp / name;
  };

  refused(tmp / "missing.safetensors", {"load_checkpoint", "cannot open"}, target,
          target.scheduler.get());
  refused(tmp / "no_scheduler.safetensors", {"load_checkpoint", "holds no scheduler state"}, target,
          target.scheduler.get());
  refused(path, {"load_checkpoint", "scheduler state", "no scheduler was given"}, target, nullptr);
  refused(rewrite("shape.safetensors", [](auto& f) { f.tensors["model.fc2.bias"] = zeros({2}); }),
          {"load_checkpoint", "'model.fc2.bias' is Float32 [2] in the file"}, target,
          target.scheduler.get());
  refused(rewrite("extra.safetensors", [](auto& f) { f.tensors["model.fc3.weight"] = zeros({1}); }),
          {"unexpected model.fc3.weight"}, target, target.scheduler.get());
  refused(rewrite("stray.safetensors", [](auto& f) { f.tensors["notes"] = zeros({1}); }),
          {"unexpected tensors notes"}, target, target.scheduler.get());
  refused(rewrite("optimizer.safetensors",
                  [](auto& f) { f.tensors.erase("optimizer.state.2.exp_avg"); }),
          {"Adam::load_state_dict", "missing state.2.exp_avg"}, target, target.scheduler.get());
  refused(rewrite("scheduler.safetensors",
                  [](auto& f) { f.tensors["scheduler.total_steps"] = optim::state_integer(99); }),
          {"OneCycleLR::load_state_dict", "'total_steps' is 99"}, target, target.scheduler.get());
  refused(rewrite("no_rng.safetensors", [](auto& f) { f.tensors.erase("rng.state"); }),
          {"no rng.state"}, target, target.scheduler.get());
  refused(rewrite("bad_rng.safetensors",
                  [](auto& f) {
                    Tensor rng = f.tensors["rng.state"].clone();
                    rng.narrow(0, rng.numel() - 1, 1).fill_(1e9);  // an impossible position
                    f.tensors["rng.state"] = rng;
                  }),
          {"set_rng_state", "position"}, target, target.scheduler.get());
  refused(rewrite("counter.safetensors", [](auto& f) { f.metadata["step"] = "three"; }),
          {"the counter 'step' is 'three'"}, target, target.scheduler.get());
  expect_error(
      [&] { load_checkpoint(path, *target.model, *target.optimizer, other.scheduler.get()); },
      {"load_checkpoint", "another optimizer"});
  BOOST_TEST((Snapshot(target) == before));

  // The good file loads, into the same state as the saved run.
  BOOST_TEST(
      load_checkpoint(path, *target.model, *target.optimizer, target.scheduler.get()).at("step") ==
      3);
  BOOST_TEST((Snapshot(target) == Snapshot(saved)));
}

BOOST_AUTO_TEST_SUITE_END()
