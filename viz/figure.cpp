// Figure and Animator. A figure is drawn as matplotlib draws D2L's plots: white axes with a
// light grid at the ticks, data clipped to the axes, black spines with outward ticks, axis
// labels, and a legend placed where it covers the least data (matplotlib's loc='best').
#include "viz/figure.h"

#include <algorithm>
#include <cmath>

#include "graph/error.h"
#include "viz/svg.h"

namespace ember::viz {
namespace {

constexpr double kWidth = 252, kHeight = 180;  // 3.5 x 2.5 in, D2L's set_figsize default
constexpr double kFont = 10, kPad = 6, kTickLen = 3.5, kTickPad = 3.5, kLineWidth = 1.5;

// matplotlib's default colour cycle, C0..C9.
constexpr const char* kCycle[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
                                  "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};

// D2L's plot formats '-', 'm--', 'g-.', 'r:': a colour (empty: the next of the cycle) and
// matplotlib's dash pattern for the style, scaled by the 1.5 pt line width.
struct LineStyle {
  const char* color;
  const char* dash;
};
constexpr LineStyle kLineStyles[] = {
    {"", ""}, {"#bf00bf", "5.55 2.4"}, {"#008000", "9.6 2.4 1.5 2.4"}, {"#ff0000", "1.5 2.48"}};

struct Box {
  double x0, y0, x1, y1;  // points, y grows downwards
  bool contains(double x, double y) const { return x >= x0 && x <= x1 && y >= y0 && y <= y1; }
};

// Liang-Barsky: clips the segment a-b to `box` in place; false when none of it is inside.
bool clip_segment(double& ax, double& ay, double& bx, double& by, const Box& box) {
  const double dx = bx - ax, dy = by - ay;
  const double p[] = {-dx, dx, -dy, dy};
  const double q[] = {ax - box.x0, box.x1 - ax, ay - box.y0, box.y1 - ay};
  double t0 = 0, t1 = 1;
  for (int i = 0; i < 4; ++i) {
    if (p[i] == 0) {
      if (q[i] < 0) return false;
      continue;
    }
    const double t = q[i] / p[i];
    if (p[i] < 0)
      t0 = std::max(t0, t);
    else
      t1 = std::min(t1, t);
    if (t0 > t1) return false;
  }
  const double x0 = ax, y0 = ay;
  ax = x0 + t0 * dx, ay = y0 + t0 * dy;
  bx = x0 + t1 * dx, by = y0 + t1 * dy;
  return true;
}

// The axes: data coordinates -> points inside `box`, and the ticks of both axes.
struct Axes {
  Box box;
  double xlo, xhi, ylo, yhi;
  std::vector<double> x_ticks, y_ticks;
  std::vector<std::string> x_labels, y_labels;
  double px(double x) const { return box.x0 + (x - xlo) / (xhi - xlo) * (box.x1 - box.x0); }
  double py(double y) const { return box.y1 - (y - ylo) / (yhi - ylo) * (box.y1 - box.y0); }
};

// The visible range of one axis: the limits if set, else the data's range plus 5% margins
// (a single value widened by 5% first, as matplotlib's nonsingular does).
std::pair<double, double> axis_range(const std::vector<PlotSeries>& series, bool x,
                                     const Limits& limits) {
  if (limits) return *limits;
  double lo = INFINITY, hi = -INFINITY;
  for (const PlotSeries& s : series)
    for (const double v : x ? s.xs : s.ys)
      if (std::isfinite(v)) lo = std::min(lo, v), hi = std::max(hi, v);
  if (lo > hi) return {0, 1};
  if (hi - lo <= 1e-12 * std::max(1.0, std::abs(lo))) {
    const double e = lo == 0 ? 0.05 : 0.05 * std::abs(lo);
    lo -= e, hi += e;
  }
  const double margin = 0.05 * (hi - lo);
  return {lo - margin, hi + margin};
}

double widest(const std::vector<std::string>& labels) {
  double w = 0;
  for (const std::string& s : labels) w = std::max(w, svg::text_width(s, kFont));
  return w;
}

// The SVG attributes that draw a line of this series' style.
std::string stroke_of(const PlotSeries& s) {
  std::string a =
      fmt::format(R"(fill="none" stroke="{}" stroke-width="{}" stroke-linejoin="round")", s.color,
                  svg::num(kLineWidth));
  a += s.dash.empty() ? R"( stroke-linecap="square")"
                      : fmt::format(R"( stroke-dasharray="{}")", s.dash);
  return a;
}

std::string marker_of(const PlotSeries& s) {
  if (s.alpha >= 1) return fmt::format(R"(fill="{0}" stroke="{0}" stroke-width="1")", s.color);
  return fmt::format(
      R"(fill="{0}" fill-opacity="{1}" stroke="{0}" stroke-opacity="{1}" stroke-width="1")",
      s.color, svg::num(s.alpha));
}

// The path of a line: segments clipped to a box a little larger than the axes (the clip path
// trims the rest), a new subpath after every gap or clipped end.
std::string line_path(const PlotSeries& s, const Axes& a) {
  const Box near{a.box.x0 - 10, a.box.y0 - 10, a.box.x1 + 10, a.box.y1 + 10};
  std::string d;
  bool pen = false;
  double pen_x = 0, pen_y = 0;
  for (size_t i = 1; i < s.xs.size(); ++i) {
    double ax = a.px(s.xs[i - 1]), ay = a.py(s.ys[i - 1]), bx = a.px(s.xs[i]), by = a.py(s.ys[i]);
    const bool finite =
        std::isfinite(ax) && std::isfinite(ay) && std::isfinite(bx) && std::isfinite(by);
    if (!finite || !clip_segment(ax, ay, bx, by, near)) {
      pen = false;
      continue;
    }
    if (!pen || ax != pen_x || ay != pen_y)
      d += fmt::format("{}M{} {}", d.empty() ? "" : " ", svg::num(ax), svg::num(ay));
    d += fmt::format(" L{} {}", svg::num(bx), svg::num(by));
    pen = true, pen_x = bx, pen_y = by;
  }
  return d;
}

// How much data a legend at `box` would hide: points inside plus line segments crossing it.
int covered(const std::vector<PlotSeries>& series, const Axes& a, const Box& box) {
  int count = 0;
  for (const PlotSeries& s : series) {
    for (size_t i = 0; i < s.xs.size(); ++i) {
      const double x = a.px(s.xs[i]), y = a.py(s.ys[i]);
      if (!std::isfinite(x) || !std::isfinite(y)) continue;
      count += box.contains(x, y);
      if (s.scatter || i == 0) continue;
      double px = a.px(s.xs[i - 1]), py = a.py(s.ys[i - 1]), qx = x, qy = y;
      if (std::isfinite(px) && std::isfinite(py)) count += clip_segment(px, py, qx, qy, box);
    }
  }
  return count;
}

// The legend: labelled series in order, each with its line or marker, in a translucent box
// at matplotlib's 'best' location (the first of its candidates covering the least data).
void draw_legend(svg::Writer& svg, const std::vector<PlotSeries>& series, const Axes& a) {
  std::vector<const PlotSeries*> entries;
  double text_w = 0;
  for (const PlotSeries& s : series)
    if (!s.label.empty())
      entries.push_back(&s), text_w = std::max(text_w, svg::text_width(s.label, kFont));
  if (entries.empty()) return;
  const double pad = 0.4 * kFont, handle = 2 * kFont, gap = 0.8 * kFont, spacing = 0.5 * kFont;
  const double n = static_cast<double>(entries.size());
  const double w = 2 * pad + handle + gap + text_w, h = 2 * pad + n * kFont + (n - 1) * spacing;
  const Box& b = a.box;
  const double m = 0.5 * kFont, l = b.x0 + m, r = b.x1 - m - w, t = b.y0 + m, d = b.y1 - m - h;
  const double cx = (b.x0 + b.x1 - w) / 2, cy = (b.y0 + b.y1 - h) / 2;
  // upper right, upper left, lower left, lower right, right, center left, center right,
  // lower center, upper center, center
  const std::pair<double, double> candidates[] = {{r, t},  {l, t},  {l, d},  {r, d},  {r, cy},
                                                  {l, cy}, {r, cy}, {cx, d}, {cx, t}, {cx, cy}};
  int best = -1;
  double x = r, y = t;
  for (const auto& [cx0, cy0] : candidates) {
    const int c = covered(series, a, Box{cx0, cy0, cx0 + w, cy0 + h});
    if (best < 0 || c < best) best = c, x = cx0, y = cy0;
  }
  svg.open_group(R"(class="legend")");
  svg.rect(x, y, w, h, "#ffffff",
           R"(rx="2" fill-opacity="0.8" stroke="#cccccc" stroke-opacity="0.8" stroke-width="0.8")");
  for (size_t i = 0; i < entries.size(); ++i) {
    const PlotSeries& s = *entries[i];
    const double row = y + pad + kFont / 2 + static_cast<double>(i) * (kFont + spacing);
    if (s.scatter)
      svg.circle(x + pad + handle / 2, row, 3, marker_of(s));
    else
      svg.raw(fmt::format(R"(<path d="M{} {} L{} {}" {}/>)", svg::num(x + pad), svg::num(row),
                          svg::num(x + pad + handle), svg::num(row), stroke_of(s)) +
              "\n");
    svg.text(x + pad + handle + gap, row + kFont * 0.36, s.label, {kFont, "start"});
  }
  svg.close_group();
}

// Lays out the figure as matplotlib's tight bbox would: the y ticks depend on the axes'
// height, the left margin on the y tick labels, the x ticks on the width that is left
// (about one tick per 20 points vertically and 30 points horizontally, as matplotlib).
Axes make_axes(double xlo, double xhi, double ylo, double yhi, bool has_xlabel, bool has_ylabel) {
  Axes a{};
  a.xlo = xlo, a.xhi = xhi, a.ylo = ylo, a.yhi = yhi;
  const double top = kPad + kFont / 2;
  const double bottom = kTickLen + kTickPad + kFont + (has_xlabel ? 4 + kFont * 1.2 : 0) + kPad;
  const double axes_h = kHeight - top - bottom;
  a.y_ticks = svg::nice_ticks(ylo, yhi, std::clamp(static_cast<int>(axes_h / 20), 1, 9));
  a.y_labels = svg::tick_labels(a.y_ticks);
  const double left =
      kPad + (has_ylabel ? kFont * 1.2 + 4 : 0) + widest(a.y_labels) + kTickLen + kTickPad;
  const double axes_w = kWidth - left - kPad - kFont;
  a.x_ticks = svg::nice_ticks(xlo, xhi, std::clamp(static_cast<int>(axes_w / 30), 1, 9));
  a.x_labels = svg::tick_labels(a.x_ticks);
  a.box = {left, top, left + axes_w, top + axes_h};
  return a;
}

// D2L's axes.grid(): light lines at the ticks, under the data.
void draw_grid(svg::Writer& svg, const Axes& a) {
  const Box& b = a.box;
  svg.open_group(R"(class="grid")");
  for (const double x : a.x_ticks) svg.line(a.px(x), b.y0, a.px(x), b.y1, "#b0b0b0", 0.8);
  for (const double y : a.y_ticks) svg.line(b.x0, a.py(y), b.x1, a.py(y), "#b0b0b0", 0.8);
  svg.close_group();
}

// Lines and scatters in the order added, clipped to the axes.
void draw_data(svg::Writer& svg, const std::vector<PlotSeries>& series, const Axes& a) {
  const Box& b = a.box;
  svg.raw(fmt::format(R"(<defs><clipPath id="axes"><rect x="{}" y="{}" width="{}" height="{}"/>)"
                      "</clipPath></defs>\n",
                      svg::num(b.x0), svg::num(b.y0), svg::num(b.x1 - b.x0),
                      svg::num(b.y1 - b.y0)));
  svg.open_group("clip-path=\"url(#axes)\"");
  const Box near{b.x0 - 5, b.y0 - 5, b.x1 + 5, b.y1 + 5};
  for (const PlotSeries& s : series) {
    if (!s.scatter) {
      const std::string d = line_path(s, a);
      if (!d.empty())
        svg.raw(fmt::format(R"(<path class="line" d="{}" {}/>)", d, stroke_of(s)) + "\n");
      continue;
    }
    svg.open_group(R"(class="scatter")");
    for (size_t i = 0; i < s.xs.size(); ++i) {
      const double x = a.px(s.xs[i]), y = a.py(s.ys[i]);
      if (std::isfinite(x) && std::isfinite(y) && near.contains(x, y))
        svg.circle(x, y, 3, marker_of(s));
    }
    svg.close_group();
  }
  svg.close_group();
}

// Spines, outward ticks with their labels, and the axis labels.
void draw_frame(svg::Writer& svg, const Axes& a, const std::string& xlabel,
                const std::string& ylabel) {
  const Box& b = a.box;
  svg.open_group(R"(class="axes")");
  svg.rect(b.x0, b.y0, b.x1 - b.x0, b.y1 - b.y0, "none", R"(stroke="#000000" stroke-width="0.8")");
  for (size_t i = 0; i < a.x_ticks.size(); ++i) {
    const double x = a.px(a.x_ticks[i]);
    svg.line(x, b.y1, x, b.y1 + kTickLen, "#000000", 0.8);
    svg.text(x, b.y1 + kTickLen + kTickPad + kFont * 0.76, a.x_labels[i], {kFont});
  }
  for (size_t i = 0; i < a.y_ticks.size(); ++i) {
    const double y = a.py(a.y_ticks[i]);
    svg.line(b.x0 - kTickLen, y, b.x0, y, "#000000", 0.8);
    svg.text(b.x0 - kTickLen - kTickPad, y + kFont * 0.36, a.y_labels[i], {kFont, "end"});
  }
  if (!xlabel.empty())
    svg.text((b.x0 + b.x1) / 2, b.y1 + kTickLen + kTickPad + kFont + 4 + kFont * 0.9, xlabel,
             {kFont});
  if (!ylabel.empty())
    svg.text(kPad + kFont * 0.9, (b.y0 + b.y1) / 2, ylabel, {kFont, "middle", -90});
  svg.close_group();
}

std::vector<double> values_of(const Tensor& t, const char* who, const char* name) {
  EMBER_CHECK(t.defined(), "{}: {} is an undefined tensor", who, name);
  EMBER_CHECK(t.dim() == 1, "{}: {} must be a 1-D tensor, got shape {}", who, name, t.shape());
  return t.to_vector<double>();
}

void check_limits(double lo, double hi, const char* who) {
  EMBER_CHECK(std::isfinite(lo) && std::isfinite(hi) && lo < hi,
              "{}: limits must be finite with lo < hi, got ({}, {})", who, lo, hi);
}

}  // namespace

Figure::Figure(std::string xlabel, std::string ylabel)
    : xlabel_(std::move(xlabel)), ylabel_(std::move(ylabel)) {}

void Figure::add(PlotSeries series, const char* who) {
  EMBER_CHECK(series.xs.size() == series.ys.size(), "{}: xs has {} values but ys has {}", who,
              series.xs.size(), series.ys.size());
  EMBER_CHECK(series.alpha >= 0 && series.alpha <= 1, "{}: alpha must be in [0, 1], got {}", who,
              series.alpha);
  if (series.scatter) {
    series.color = kCycle[cycle_++ % 10];
  } else {
    const LineStyle& style = kLineStyles[lines_++ % 4];
    series.color = *style.color ? style.color : kCycle[cycle_++ % 10];
    series.dash = style.dash;
  }
  series_.push_back(std::move(series));
}

Figure& Figure::add_line(const std::vector<double>& xs, const std::vector<double>& ys,
                         const std::string& label) {
  add(PlotSeries{xs, ys, label, "", "", false, 1.0}, "Figure.add_line");
  return *this;
}

Figure& Figure::add_line(const Tensor& xs, const Tensor& ys, const std::string& label) {
  const char* who = "Figure.add_line";
  return add_line(values_of(xs, who, "xs"), values_of(ys, who, "ys"), label);
}

Figure& Figure::add_scatter(const std::vector<double>& xs, const std::vector<double>& ys,
                            const std::string& label, double alpha) {
  add(PlotSeries{xs, ys, label, "", "", true, alpha}, "Figure.add_scatter");
  return *this;
}

Figure& Figure::add_scatter(const Tensor& xs, const Tensor& ys, const std::string& label,
                            double alpha) {
  const char* who = "Figure.add_scatter";
  return add_scatter(values_of(xs, who, "xs"), values_of(ys, who, "ys"), label, alpha);
}

Figure& Figure::xlim(double lo, double hi) {
  check_limits(lo, hi, "Figure.xlim");
  xlim_ = {{lo, hi}};
  return *this;
}

Figure& Figure::ylim(double lo, double hi) {
  check_limits(lo, hi, "Figure.ylim");
  ylim_ = {{lo, hi}};
  return *this;
}

std::string Figure::to_svg() const {
  const auto [xlo, xhi] = axis_range(series_, true, xlim_);
  const auto [ylo, yhi] = axis_range(series_, false, ylim_);
  const Axes a = make_axes(xlo, xhi, ylo, yhi, !xlabel_.empty(), !ylabel_.empty());
  svg::Writer svg(kWidth, kHeight);
  draw_grid(svg, a);
  draw_data(svg, series_, a);
  draw_frame(svg, a, xlabel_, ylabel_);
  draw_legend(svg, series_, a);
  return svg.str();
}

void Figure::save(const std::string& path) const { svg::write_file(path, to_svg(), "Figure.save"); }

Animator::Animator(std::string xlabel, std::string ylabel, std::vector<std::string> legend,
                   Limits xlim, Limits ylim)
    : xlabel_(std::move(xlabel)),
      ylabel_(std::move(ylabel)),
      legend_(std::move(legend)),
      xlim_(xlim),
      ylim_(ylim) {
  if (xlim_) check_limits(xlim_->first, xlim_->second, "Animator");
  if (ylim_) check_limits(ylim_->first, ylim_->second, "Animator");
}

void Animator::add(double x, const std::vector<double>& ys) {
  EMBER_CHECK(!ys.empty(), "Animator.add: no y values for x = {}", x);
  if (xs_.empty()) {
    EMBER_CHECK(legend_.empty() || legend_.size() == ys.size(),
                "Animator.add: {} y values but {} legend names", ys.size(), legend_.size());
    xs_.resize(ys.size());
    ys_.resize(ys.size());
  }
  EMBER_CHECK(ys.size() == ys_.size(), "Animator.add: {} y values, but the first add had {}",
              ys.size(), ys_.size());
  for (size_t i = 0; i < ys.size(); ++i) xs_[i].push_back(x), ys_[i].push_back(ys[i]);
  if (!autosave_.empty()) save(autosave_);
}

Figure Animator::figure() const {
  Figure f(xlabel_, ylabel_);
  if (xlim_) f.xlim(xlim_->first, xlim_->second);
  if (ylim_) f.ylim(ylim_->first, ylim_->second);
  for (size_t i = 0; i < ys_.size(); ++i)
    f.add_line(xs_[i], ys_[i], i < legend_.size() ? legend_[i] : "");
  return f;
}

void Animator::save(const std::string& path) const {
  svg::write_file(path, figure().to_svg(), "Animator.save");
}

}  // namespace ember::viz
