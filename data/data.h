// ember::data: the data layer, in the spirit of torch.utils.data and torchtext: Vocab, the
// Dataset interface, samplers and the bucketing DataLoader (nn/rnn_utils.h has pad_sequence).
#pragma once

#include "data/dataloader.h"
#include "data/dataset.h"
#include "data/fashion_mnist.h"
#include "data/image_transforms.h"
#include "data/sampler.h"
#include "data/vocab.h"
