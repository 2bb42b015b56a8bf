// Ember's figures, as SVG files the way D2L draws them with matplotlib: heatmaps, line and
// scatter plots, and the Animator for training curves.
#pragma once

#include "viz/figure.h"
#include "viz/heatmap.h"
#include "viz/svg.h"
