// show_heatmaps and the colormaps: matplotlib's published anchor colours, interpolated linearly
// and quantised to matplotlib's 256-entry lookup table. Layout follows a D2L heatmap: square
// cells (imshow), ticks at cell centres, labels only on the outer panels, a slim colorbar.
#include "viz/heatmap.h"

#include <algorithm>
#include <cmath>
#include <span>
#include <string_view>

#include "graph/error.h"
#include "viz/svg.h"

namespace ember::viz {
namespace {

struct Rgb {
  double r, g, b;
};

constexpr Rgb hex_rgb(unsigned v) {
  return {((v >> 16) & 0xFF) / 255.0, ((v >> 8) & 0xFF) / 255.0, (v & 0xFF) / 255.0};
}

// matplotlib's _Reds_data and _Blues_data (ColorBrewer), anchors evenly spaced over [0, 1].
constexpr Rgb kReds[] = {hex_rgb(0xfff5f0), hex_rgb(0xfee0d2), hex_rgb(0xfcbba1),
                         hex_rgb(0xfc9272), hex_rgb(0xfb6a4a), hex_rgb(0xef3b2c),
                         hex_rgb(0xcb181d), hex_rgb(0xa50f15), hex_rgb(0x67000d)};
constexpr Rgb kBlues[] = {hex_rgb(0xf7fbff), hex_rgb(0xdeebf7), hex_rgb(0xc6dbef),
                          hex_rgb(0x9ecae1), hex_rgb(0x6baed6), hex_rgb(0x4292c6),
                          hex_rgb(0x2171b5), hex_rgb(0x08519c), hex_rgb(0x08306b)};
// matplotlib's _viridis_data (256 entries) taken every 8th entry: linear interpolation between
// these 33 stays within 2/255 of the full table.
constexpr Rgb kViridis[] = {
    {0.267004, 0.004874, 0.329415}, {0.277018, 0.050344, 0.375715}, {0.282327, 0.094955, 0.417331},
    {0.282884, 0.135920, 0.453427}, {0.278826, 0.175490, 0.483397}, {0.270595, 0.214069, 0.507052},
    {0.258965, 0.251537, 0.524736}, {0.244972, 0.287675, 0.537260}, {0.229739, 0.322361, 0.545706},
    {0.214298, 0.355619, 0.551184}, {0.199430, 0.387607, 0.554642}, {0.185556, 0.418570, 0.556753},
    {0.172719, 0.448791, 0.557885}, {0.160665, 0.478540, 0.558115}, {0.149039, 0.508051, 0.557250},
    {0.137770, 0.537492, 0.554906}, {0.127568, 0.566949, 0.550556}, {0.121148, 0.592739, 0.544641},
    {0.120081, 0.622161, 0.534946}, {0.130067, 0.651384, 0.521608}, {0.153894, 0.680203, 0.504172},
    {0.191090, 0.708366, 0.482284}, {0.239374, 0.735588, 0.455688}, {0.296479, 0.761561, 0.424223},
    {0.360741, 0.785964, 0.387814}, {0.430983, 0.808473, 0.346476}, {0.506271, 0.828786, 0.300362},
    {0.585678, 0.846661, 0.249897}, {0.668054, 0.861999, 0.196293}, {0.751884, 0.874951, 0.143228},
    {0.835270, 0.886029, 0.102646}, {0.916242, 0.896091, 0.100717}, {0.993248, 0.906157, 0.143936}};

struct Colormap {
  std::string_view name;
  std::span<const Rgb> anchors;
};
constexpr Colormap kColormaps[] = {{"Reds", kReds}, {"Blues", kBlues}, {"viridis", kViridis}};

const Colormap& find_colormap(const std::string& name, std::string_view who) {
  for (const Colormap& c : kColormaps)
    if (c.name == name) return c;
  throw Error(fmt::format("{}: unknown colormap '{}' (known: Reds, Blues, viridis)", who, name));
}

std::string hex(const Rgb& c) {
  const auto byte = [](double v) {
    return static_cast<int>(std::lround(std::clamp(v, 0.0, 1.0) * 255));
  };
  return fmt::format("#{:02x}{:02x}{:02x}", byte(c.r), byte(c.g), byte(c.b));
}

// The colormap at x in [0, 1], interpolating between its evenly spaced anchors.
Rgb interpolate(const Colormap& cmap, double x) {
  const auto& a = cmap.anchors;
  const double pos = std::clamp(x, 0.0, 1.0) * static_cast<double>(a.size() - 1);
  const size_t k = std::min(static_cast<size_t>(pos), a.size() - 2);
  const double t = pos - static_cast<double>(k);
  return {a[k].r + (a[k + 1].r - a[k].r) * t, a[k].g + (a[k + 1].g - a[k].g) * t,
          a[k].b + (a[k + 1].b - a[k].b) * t};
}

// matplotlib's Colormap.__call__: index floor(t * 256) clipped to 0..255; entry i sits at i/255.
std::string color_at(const Colormap& cmap, double t) {
  const double index = std::clamp(std::floor(t * 256), 0.0, 255.0);
  return hex(interpolate(cmap, index / 255));
}

constexpr double kFont = 10, kTitleFont = 12, kPad = 6, kTickLen = 3.5, kTickPad = 3.5;
constexpr double kPanel = 120;  // side of a panel's longer edge, in points

// Where everything goes: panels of panel_w x panel_h (cells of cell_w x cell_h) in a grid
// from (left, top), spaced by pitch_x / pitch_y; the colorbar at (cbar_x, cbar_y), cbar_w x
// cbar_h; and the ticks of the panels' axes (in cells) and of the colorbar (in values).
struct Layout {
  double cell_w, cell_h, panel_w, panel_h, left, top, pitch_x, pitch_y;
  double cbar_x, cbar_y, cbar_w, cbar_h, width, height;
  std::vector<double> x_ticks, y_ticks, cbar_ticks;
  std::vector<std::string> x_labels, y_labels, cbar_labels;
};

double widest(const std::vector<std::string>& labels) {
  double w = 0;
  for (const std::string& s : labels) w = std::max(w, svg::text_width(s, kFont));
  return w;
}

// Ticks at the centres of n cells along an axis `length` points long, about one per 22 points.
std::vector<double> cell_ticks(int64_t n, double length) {
  return svg::nice_ticks(-0.5, static_cast<double>(n) - 0.5,
                         std::max(2, static_cast<int>(length / 22)), true);
}

Layout make_layout(int64_t rows, int64_t cols, int64_t queries, int64_t keys, bool titled,
                   bool has_xlabel, const std::string& ylabel, double lo, double hi) {
  const bool has_ylabel = !ylabel.empty();
  Layout l{};
  // Square cells as imshow draws them, unless one side would fall below a quarter panel.
  const double longest = static_cast<double>(std::max(queries, keys));
  l.panel_w = std::max(kPanel / 4, kPanel * static_cast<double>(keys) / longest);
  l.panel_h = std::max(kPanel / 4, kPanel * static_cast<double>(queries) / longest);
  l.cell_w = l.panel_w / static_cast<double>(keys);
  l.cell_h = l.panel_h / static_cast<double>(queries);
  l.x_ticks = cell_ticks(keys, l.panel_w);
  l.y_ticks = cell_ticks(queries, l.panel_h);
  l.x_labels = svg::tick_labels(l.x_ticks);
  l.y_labels = svg::tick_labels(l.y_ticks);

  const double title_h = titled ? kTitleFont * 1.2 + kPad : 0;
  l.left = kPad + (has_ylabel ? kFont * 1.2 + 4 : 0) + widest(l.y_labels) + kTickLen + kTickPad;
  // A y label longer than a panel is tall sticks out above and below it.
  const double overhang = std::max(0.0, (svg::text_width(ylabel, kFont) - l.panel_h) / 2);
  l.top = kPad + title_h + overhang;
  l.pitch_x = l.panel_w + 12;
  l.pitch_y = l.panel_h + kTickLen + 8 + title_h;
  const double grid_w = l.pitch_x * static_cast<double>(cols) - 12;
  const double grid_h = l.pitch_y * static_cast<double>(rows) - (l.pitch_y - l.panel_h);
  // matplotlib's fig.colorbar(shrink=0.6): 60% of the grid's height, aspect 20; here at least
  // 60 points (or the grid's height) so its labels stay apart.
  l.cbar_h = std::max(0.6 * grid_h, std::min(grid_h, 60.0));
  l.cbar_w = std::max(5.0, l.cbar_h / 20);
  l.cbar_x = l.left + grid_w + 14;
  l.cbar_y = l.top + (grid_h - l.cbar_h) / 2;
  l.cbar_ticks = svg::nice_ticks(lo, hi, std::clamp(static_cast<int>(l.cbar_h / 15), 2, 9));
  l.cbar_labels = svg::tick_labels(l.cbar_ticks);
  l.width = l.cbar_x + l.cbar_w + kTickLen + kTickPad + widest(l.cbar_labels) + kPad;
  l.height = l.top + grid_h + kTickLen + kTickPad + kFont + (has_xlabel ? 4 + kFont * 1.2 : 0) +
             kPad + overhang;
  return l;
}

// Frame, ticks at cell centres and, on the outer panels, tick labels of one heatmap at (x0, y0).
void draw_axes(svg::Writer& svg, double x0, double y0, const Layout& l, bool x_labels,
               bool y_labels) {
  const double bottom = y0 + l.panel_h;
  for (size_t i = 0; i < l.x_ticks.size(); ++i) {
    const double x = x0 + (l.x_ticks[i] + 0.5) * l.cell_w;
    svg.line(x, bottom, x, bottom + kTickLen, "#000000", 0.8);
    if (x_labels) svg.text(x, bottom + kTickLen + kTickPad + kFont * 0.76, l.x_labels[i], {kFont});
  }
  for (size_t i = 0; i < l.y_ticks.size(); ++i) {
    const double y = y0 + (l.y_ticks[i] + 0.5) * l.cell_h;
    svg.line(x0 - kTickLen, y, x0, y, "#000000", 0.8);
    if (y_labels)
      svg.text(x0 - kTickLen - kTickPad, y + kFont * 0.36, l.y_labels[i], {kFont, "end"});
  }
  svg.rect(x0, y0, l.panel_w, l.panel_h, "none", R"(stroke="#000000" stroke-width="0.8")");
}

// The colorbar: a vertical gradient through the colormap's anchors, framed, with tick labels
// for values lo..hi on its right.
void draw_colorbar(svg::Writer& svg, const Colormap& cmap, double lo, double hi, const Layout& l) {
  std::string gradient = R"(<defs><linearGradient id="colorbar" x1="0" y1="1" x2="0" y2="0">)";
  for (size_t i = 0; i < cmap.anchors.size(); ++i)
    gradient += fmt::format(R"(<stop offset="{}" stop-color="{}"/>)",
                            svg::num(static_cast<double>(i) / (cmap.anchors.size() - 1)),
                            hex(cmap.anchors[i]));
  svg.raw(gradient + "</linearGradient></defs>\n");
  svg.open_group(R"(class="colorbar")");
  svg.rect(l.cbar_x, l.cbar_y, l.cbar_w, l.cbar_h, "url(#colorbar)");
  const double right = l.cbar_x + l.cbar_w;
  for (size_t i = 0; i < l.cbar_ticks.size(); ++i) {
    const double y = l.cbar_y + l.cbar_h * (hi - l.cbar_ticks[i]) / (hi - lo);
    svg.line(right, y, right + kTickLen, y, "#000000", 0.8);
    svg.text(right + kTickLen + kTickPad, y + kFont * 0.36, l.cbar_labels[i], {kFont, "start"});
  }
  svg.rect(l.cbar_x, l.cbar_y, l.cbar_w, l.cbar_h, "none",
           R"(stroke="#000000" stroke-width="0.8")");
  svg.close_group();
}

}  // namespace

std::string colormap_color(const std::string& cmap, double t) {
  return color_at(find_colormap(cmap, "colormap_color"), t);
}

void show_heatmaps(const Tensor& matrices, const std::string& path, const std::string& xlabel,
                   const std::string& ylabel, const std::vector<std::string>& titles,
                   const std::string& cmap) {
  EMBER_CHECK(matrices.defined(), "show_heatmaps: the matrices tensor is undefined");
  EMBER_CHECK(matrices.dim() == 4,
              "show_heatmaps: expected a 4-D tensor (rows, cols, queries, keys), got shape {}",
              matrices.shape());
  EMBER_CHECK(matrices.numel() > 0, "show_heatmaps: nothing to draw in a tensor of shape {}",
              matrices.shape());
  const int64_t rows = matrices.size(0), cols = matrices.size(1);
  const int64_t queries = matrices.size(2), keys = matrices.size(3);
  EMBER_CHECK(titles.empty() || static_cast<int64_t>(titles.size()) == cols,
              "show_heatmaps: {} titles for {} columns (shape {})", titles.size(), cols,
              matrices.shape());
  const Colormap& colormap = find_colormap(cmap, "show_heatmaps");

  // One value range for the whole grid, over the finite values only.
  const std::vector<double> values = matrices.to_vector<double>();
  double lo = INFINITY, hi = -INFINITY;
  for (const double v : values)
    if (std::isfinite(v)) lo = std::min(lo, v), hi = std::max(hi, v);
  if (lo > hi) lo = 0, hi = 1;                  // nothing finite
  const double span = hi > lo ? hi - lo : 0.0;  // constant: every cell at the lightest colour
  const double bar_hi = hi > lo ? hi : lo + 1;

  const Layout l =
      make_layout(rows, cols, queries, keys, !titles.empty(), !xlabel.empty(), ylabel, lo, bar_hi);
  svg::Writer svg(l.width, l.height);
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < cols; ++j) {
      const double x0 = l.left + static_cast<double>(j) * l.pitch_x;
      const double y0 = l.top + static_cast<double>(i) * l.pitch_y;
      const double* m = values.data() + (i * cols + j) * queries * keys;
      svg.open_group(R"(class="heatmap" shape-rendering="crispEdges")");
      for (int64_t q = 0; q < queries; ++q) {
        for (int64_t k = 0; k < keys; ++k) {
          const double v = m[q * keys + k];
          if (!std::isfinite(v)) continue;
          svg.rect(x0 + static_cast<double>(k) * l.cell_w, y0 + static_cast<double>(q) * l.cell_h,
                   l.cell_w, l.cell_h, color_at(colormap, span > 0 ? (v - lo) / span : 0.0),
                   R"(class="cell")");
        }
      }
      svg.close_group();
      draw_axes(svg, x0, y0, l, i == rows - 1, j == 0);
      const double cx = x0 + l.panel_w / 2, cy = y0 + l.panel_h / 2;
      if (!titles.empty()) svg.text(cx, y0 - kPad, titles[j], {kTitleFont});
      if (i == rows - 1 && !xlabel.empty())
        svg.text(cx, y0 + l.panel_h + kTickLen + kTickPad + kFont + 4 + kFont * 0.9, xlabel,
                 {kFont});
      if (j == 0 && !ylabel.empty())
        svg.text(kPad + kFont * 0.9, cy, ylabel, {kFont, "middle", -90});
    }
  }
  draw_colorbar(svg, colormap, lo, bar_hi, l);
  svg.save(path, "show_heatmaps");
}

}  // namespace ember::viz
