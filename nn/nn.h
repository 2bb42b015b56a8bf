// ember::nn: modules, layers, initialisers and safetensors checkpoints.
#pragma once

#include "nn/init.h"
#include "nn/layers.h"
#include "nn/module.h"
#include "nn/serialization.h"
