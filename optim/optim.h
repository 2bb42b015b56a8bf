// ember::optim: optimizers, learning-rate schedules and gradient clipping.
#pragma once

#include "optim/clip.h"
#include "optim/lbfgs.h"
#include "optim/optimizer.h"
#include "optim/schedule.h"
