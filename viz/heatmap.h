// Heatmaps as D2L's show_heatmaps draws them with matplotlib (imshow, sharex/sharey subplots,
// one colorbar), written as SVG; and the colormaps they use.
#pragma once

#include <string>
#include <vector>

#include "graph/tensor.h"

namespace ember::viz {

// Draws `matrices` (rows, cols, queries, keys) as a rows x cols grid of heatmaps into the SVG
// file `path`: shared axes with tick labels on the outer panels, `xlabel` under the bottom row,
// `ylabel` beside the first column, `titles` (one per column, or none) above each panel, and one
// colorbar spanning min..max of all finite values. NaN/Inf cells are left blank.
void show_heatmaps(const Tensor& matrices, const std::string& path, const std::string& xlabel,
                   const std::string& ylabel, const std::vector<std::string>& titles = {},
                   const std::string& cmap = "Reds");

// The colour of t in [0, 1] under matplotlib's colormap `cmap` ("Reds", "Blues", "viridis"),
// as "#rrggbb", quantised to 256 levels as matplotlib does.
std::string colormap_color(const std::string& cmap, double t);

}  // namespace ember::viz
