// Training checkpoints: a model, its optimizer, an optional learning-rate scheduler, the global
// random generator and the caller's counters (epoch, step, …) in one safetensors file, so that a
// run stopped and resumed from it continues exactly as one never stopped. Python reads the file
// with safetensors.torch.load_file:
//   model.<state_dict name>       the module's parameters and buffers
//   optimizer.<state name>        optim::Optimizer::state_dict(), e.g. optimizer.state.0.exp_avg
//   scheduler.<state name>        optim::LRScheduler::state_dict(), e.g. scheduler.last_epoch
//   rng.state                     get_rng_state()
//   __metadata__                  the counters, as decimal strings
// This layer sits above nn/ and optim/, which know nothing of each other.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "nn/module.h"
#include "optim/optimizer.h"
#include "optim/schedule.h"

namespace ember {

// Writes the checkpoint through a temporary file renamed into place (an old file survives a
// crash mid-save).
void save_checkpoint(const std::string& path, const nn::Module& model,
                     const optim::Optimizer& optimizer,
                     const optim::LRScheduler* scheduler = nullptr,
                     const std::map<std::string, int64_t>& counters = {});

// Restores model, optimizer, scheduler and the global generator from path and returns the
// counters. Everything is checked first (the file; names, shapes and dtypes against the model's,
// the optimizer's and the scheduler's; a scheduler state in the file exactly when a scheduler
// is given; integer counters): on error nothing has changed.
std::map<std::string, int64_t> load_checkpoint(const std::string& path, nn::Module& model,
                                               optim::Optimizer& optimizer,
                                               optim::LRScheduler* scheduler = nullptr);

}  // namespace ember
