// ember::nn: modules, layers, initialisers, safetensors checkpoints, D2L attention pooling,
// the Annotated Transformer with its Batch and LabelSmoothing, greedy and beam search, and
// pad_sequence.
#pragma once

#include "nn/attention.h"
#include "nn/conv.h"
#include "nn/decoding.h"
#include "nn/init.h"
#include "nn/layers.h"
#include "nn/module.h"
#include "nn/norm.h"
#include "nn/nw_regression.h"
#include "nn/pooling.h"
#include "nn/resample.h"
#include "nn/rnn.h"
#include "nn/rnn_utils.h"
#include "nn/serialization.h"
#include "nn/transformer.h"
