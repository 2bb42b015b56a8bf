// ember::nn: modules, layers, D2L attention pooling, initialisers and safetensors checkpoints.
#pragma once

#include "nn/init.h"
#include "nn/layers.h"
#include "nn/module.h"
#include "nn/nw_regression.h"
#include "nn/serialization.h"
