// Line and scatter figures as D2L's d2l.plot draws them (3.5 x 2.5 in, grid, legend, the
// line styles '-', 'm--', 'g-.', 'r:' over matplotlib's colour cycle), and D2L's Animator,
// the training-curve helper that appends one point per series per epoch.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "graph/tensor.h"

namespace ember::viz {

// Axis limits (lo, hi); empty means "fit the data with 5% margins", as matplotlib does.
using Limits = std::optional<std::pair<double, double>>;

// One series of a Figure as drawn: its points, legend label, colour and dash pattern.
struct PlotSeries {
  std::vector<double> xs, ys;
  std::string label, color, dash;  // dash: SVG stroke-dasharray, empty for a solid line
  bool scatter = false;
  double alpha = 1.0;
};

class Figure {
 public:
  Figure(std::string xlabel, std::string ylabel);

  // A line through (xs[i], ys[i]); a non-finite value breaks it into pieces (a gap). Lines take
  // D2L's styles in turn: solid C0, dashed magenta, dash-dot green, dotted red. An empty label
  // leaves the line out of the legend.
  Figure& add_line(const std::vector<double>& xs, const std::vector<double>& ys,
                   const std::string& label = "");
  Figure& add_line(const Tensor& xs, const Tensor& ys, const std::string& label = "");
  // Circles at (xs[i], ys[i]) in the next colour of the cycle, with opacity `alpha`.
  Figure& add_scatter(const std::vector<double>& xs, const std::vector<double>& ys,
                      const std::string& label = "", double alpha = 1.0);
  Figure& add_scatter(const Tensor& xs, const Tensor& ys, const std::string& label = "",
                      double alpha = 1.0);
  // Visible data range; whatever falls outside is clipped.
  Figure& xlim(double lo, double hi);
  Figure& ylim(double lo, double hi);

  std::string to_svg() const;                // the SVG document
  void save(const std::string& path) const;  // to_svg() written atomically to `path`

 private:
  void add(PlotSeries series, const char* who);

  std::string xlabel_, ylabel_;
  Limits xlim_, ylim_;
  std::vector<PlotSeries> series_;
  int lines_ = 0;  // lines so far: picks the next D2L line style
  int cycle_ = 0;  // colours taken from matplotlib's cycle so far
};

// D2L's Animator: Animator("epoch", "loss", {"train"}, {{1, 5}}); then per epoch
// add(epoch, {loss}); save(path) draws every series so far as lines.
class Animator {
 public:
  Animator(std::string xlabel, std::string ylabel, std::vector<std::string> legend = {},
           Limits xlim = {}, Limits ylim = {});

  // Appends (x, ys[i]) to series i; a NaN in ys is a missing point (D2L's None). When
  // autosave() named a file, it is rewritten after every add so it can be watched.
  void add(double x, const std::vector<double>& ys);
  void save(const std::string& path) const;
  void autosave(std::string path) { autosave_ = std::move(path); }

 private:
  Figure figure() const;

  std::string xlabel_, ylabel_;
  std::vector<std::string> legend_;
  Limits xlim_, ylim_;
  std::vector<std::vector<double>> xs_, ys_;  // per series
  std::string autosave_;
};

}  // namespace ember::viz
