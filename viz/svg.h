// A small SVG writer and the axis helpers the figures share: escaped text, numbers written
// compactly, a 1-2-2.5-5 tick locator as matplotlib's, tick labels, and an atomic save.
// Units are points (1/72 in), as matplotlib's SVG backend writes them.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace ember::viz::svg {

// Text made safe inside an XML element or attribute: & < > " ' become entities, control
// characters XML 1.0 forbids are dropped, malformed UTF-8 becomes U+FFFD.
std::string escape(std::string_view text);

// A finite number with at most two decimals and no trailing zeros: 12.5, 3, -0.25.
std::string num(double value);

// Estimated width of `text` set in DejaVu Sans at `size` points (for layout only).
double text_width(std::string_view text, double size);

// Nice tick positions inside [lo, hi]: multiples of a step from {1, 2, 2.5, 5} x 10^k, the
// smallest step giving at most `max_ticks` intervals (matplotlib's MaxNLocator). With
// `integer`, steps are whole numbers (heatmap rows and columns). None for a non-finite range.
std::vector<double> nice_ticks(double lo, double hi, int max_ticks, bool integer = false);

// Labels for `ticks`, all with the decimals the step needs (0.0 0.2 ... 1.0), and a Unicode
// minus as matplotlib writes it; very large or small magnitudes use the %g form.
std::vector<std::string> tick_labels(const std::vector<double>& ticks);

// Writes `content` to `path` through a temporary file renamed into place, so a reader never
// sees half a file; `who` names the caller in the ember::Error thrown when it cannot.
void write_file(const std::string& path, std::string_view content, std::string_view who);

// Text attributes: size in points, anchor start|middle|end, rotation in degrees about (x, y).
struct TextStyle {
  double size = 10;
  const char* anchor = "middle";
  double rotate = 0;
};

// Builds one SVG document. Every coordinate passes through num(); every text through escape().
class Writer {
 public:
  Writer(double width, double height);

  // Raw markup the caller built (already escaped), e.g. <defs> blocks.
  void raw(std::string_view markup);
  void open_group(std::string_view attributes = {});  // attributes written verbatim
  void close_group();
  void rect(double x, double y, double w, double h, std::string_view fill,
            std::string_view extra = {});
  void line(double x1, double y1, double x2, double y2, std::string_view stroke, double width);
  void circle(double cx, double cy, double r, std::string_view extra);
  void text(double x, double y, std::string_view content, const TextStyle& style);

  // The finished document.
  std::string str() const;
  // write_file(path, str(), who).
  void save(const std::string& path, std::string_view who) const;

 private:
  double width_, height_;
  std::string body_;
  int depth_ = 0;
};

}  // namespace ember::viz::svg
