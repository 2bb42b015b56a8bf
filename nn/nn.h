// ember::nn: modules, layers, initialisers, safetensors checkpoints, D2L attention pooling
// and the Annotated Transformer with its Batch and LabelSmoothing.
#pragma once

#include "nn/init.h"
#include "nn/layers.h"
#include "nn/module.h"
#include "nn/nw_regression.h"
#include "nn/serialization.h"
#include "nn/transformer.h"
