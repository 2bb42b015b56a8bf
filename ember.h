// Ember: a small, fast, define-by-run autograd framework. This header brings the whole API.
#pragma once

#include "graph/autograd.h"
#include "graph/creation.h"
#include "graph/dtype.h"
#include "graph/error.h"
#include "graph/gradcheck.h"
#include "graph/parallel.h"
#include "graph/random.h"
#include "graph/tensor.h"
#include "ops/elementwise.h"
#include "ops/index.h"
#include "ops/linalg.h"
#include "ops/loss.h"
#include "ops/nn_functional.h"
#include "ops/reduce.h"
#include "ops/shape.h"
#include "viz/viz.h"
