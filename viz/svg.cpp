// The SVG writer: escaping, compact numbers, tick placement and labels, the atomic save.
#include "viz/svg.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>

#include "graph/error.h"

namespace ember::viz::svg {
namespace {

// Length of the well-formed UTF-8 sequence starting `s` (which starts with a byte >= 0x80),
// or 0 when it is malformed: a stray continuation byte, an overlong form, a surrogate, or a
// code point above U+10FFFF.
size_t utf8_length(std::string_view s) {
  const auto byte = [&](size_t i) { return static_cast<unsigned char>(s[i]); };
  const unsigned char lead = byte(0);
  size_t n = 0;
  unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (lead >= 0xC2 && lead <= 0xDF) {
    n = 2;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    n = 3;
    if (lead == 0xE0) lo = 0xA0;  // overlong
    if (lead == 0xED) hi = 0x9F;  // surrogates
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    n = 4;
    if (lead == 0xF0) lo = 0x90;  // overlong
    if (lead == 0xF4) hi = 0x8F;  // above U+10FFFF
  } else {
    return 0;
  }
  if (s.size() < n || byte(1) < lo || byte(1) > hi) return 0;
  for (size_t i = 2; i < n; ++i)
    if (byte(i) < 0x80 || byte(i) > 0xBF) return 0;
  return n;
}

}  // namespace

std::string escape(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c >= 0x80) {
      const size_t n = utf8_length(text.substr(i));
      if (n == 0) {
        out += "\xEF\xBF\xBD";  // U+FFFD REPLACEMENT CHARACTER
        ++i;
      } else {
        out.append(text.substr(i, n));
        i += n;
      }
      continue;
    }
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&apos;";
        break;
      default:
        if (c >= 0x20 || c == '\t' || c == '\n' || c == '\r') out += static_cast<char>(c);
    }
    ++i;
  }
  return out;
}

std::string num(double value) {
  EMBER_CHECK(std::isfinite(value), "svg: cannot write the non-finite number {}", value);
  std::string s = fmt::format("{:.2f}", value);
  s.erase(s.find_last_not_of('0') + 1);
  if (s.back() == '.') s.pop_back();
  if (s == "-0") s = "0";
  return s;
}

double text_width(std::string_view text, double size) {
  double em = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    if ((c & 0xC0) == 0x80) continue;  // UTF-8 continuation byte: same character
    if (std::string_view(" .,:;'!|()[]ijlft").find(static_cast<char>(c)) != std::string_view::npos)
      em += 0.32;
    else if (c == 'm' || c == 'w' || c == 'M' || c == 'W')
      em += 0.92;
    else if (c >= 'A' && c <= 'Z')
      em += 0.7;
    else if (c >= '0' && c <= '9')
      em += 0.64;
    else
      em += 0.62;
  }
  return em * size;
}

std::vector<double> nice_ticks(double lo, double hi, int max_ticks, bool integer) {
  if (!std::isfinite(lo) || !std::isfinite(hi)) return {};
  if (!(hi > lo)) return {lo};
  const double raw = (hi - lo) / std::max(1, max_ticks);
  const double scale = std::pow(10.0, std::floor(std::log10(raw)));
  double step = 10 * scale;
  for (const double m : {1.0, 2.0, 2.5, 5.0, 10.0}) {
    const double s = m * scale;
    if (integer && (s < 1 || std::fmod(s, 1.0) != 0)) continue;
    if (s >= raw * (1 - 1e-9)) {
      step = s;
      break;
    }
  }
  if (integer) step = std::max(step, 1.0);
  std::vector<double> ticks;
  const double eps = step * 1e-9;
  const double first = std::ceil((lo - eps) / step);
  for (int k = 0; k <= 2 * max_ticks + 2; ++k) {  // bounded even where k * step loses digits
    const double t = (first + k) * step;
    if (!(t <= hi + eps)) break;
    ticks.push_back(std::abs(t) < eps ? 0.0 : t);
  }
  return ticks;
}

std::vector<std::string> tick_labels(const std::vector<double>& ticks) {
  double biggest = 0;
  for (const double t : ticks) biggest = std::max(biggest, std::abs(t));
  const bool general = biggest >= 1e5 || (biggest > 0 && biggest < 1e-3);
  int decimals = 0;
  while (!general && decimals < 6) {
    const double scale = std::pow(10.0, decimals);
    const bool exact = std::all_of(ticks.begin(), ticks.end(), [&](double t) {
      return std::abs(t * scale - std::round(t * scale)) <
             1e-6 * std::max(1.0, std::abs(t * scale));
    });
    if (exact) break;
    ++decimals;
  }
  std::vector<std::string> labels;
  for (const double t : ticks) {
    std::string s = general ? fmt::format("{:g}", t) : fmt::format("{:.{}f}", t, decimals);
    if (s.front() == '-') s.replace(0, 1, "\u2212");  // matplotlib's Unicode minus
    labels.push_back(s);
  }
  return labels;
}

Writer::Writer(double width, double height) : width_(width), height_(height) {}

void Writer::raw(std::string_view markup) { body_ += markup; }

void Writer::open_group(std::string_view attributes) {
  body_ += attributes.empty() ? "<g>\n" : fmt::format("<g {}>\n", attributes);
  ++depth_;
}

void Writer::close_group() {
  EMBER_CHECK(depth_ > 0, "svg: close_group without an open group");
  body_ += "</g>\n";
  --depth_;
}

void Writer::rect(double x, double y, double w, double h, std::string_view fill,
                  std::string_view extra) {
  body_ += fmt::format(R"(<rect x="{}" y="{}" width="{}" height="{}" fill="{}"{}{}/>)", num(x),
                       num(y), num(w), num(h), fill, extra.empty() ? "" : " ", extra);
  body_ += '\n';
}

void Writer::line(double x1, double y1, double x2, double y2, std::string_view stroke,
                  double width) {
  body_ += fmt::format(R"(<line x1="{}" y1="{}" x2="{}" y2="{}" stroke="{}" stroke-width="{}"/>)",
                       num(x1), num(y1), num(x2), num(y2), stroke, num(width));
  body_ += '\n';
}

void Writer::circle(double cx, double cy, double r, std::string_view extra) {
  body_ += fmt::format(R"(<circle cx="{}" cy="{}" r="{}" {}/>)", num(cx), num(cy), num(r), extra);
  body_ += '\n';
}

void Writer::text(double x, double y, std::string_view content, const TextStyle& style) {
  std::string rotate;
  if (style.rotate != 0)
    rotate = fmt::format(" transform=\"rotate({} {} {})\"", num(style.rotate), num(x), num(y));
  body_ += fmt::format(R"(<text x="{}" y="{}" font-size="{}" text-anchor="{}"{}>{}</text>)", num(x),
                       num(y), num(style.size), style.anchor, rotate, escape(content));
  body_ += '\n';
}

std::string Writer::str() const {
  EMBER_CHECK(depth_ == 0, "svg: {} group(s) left open", depth_);
  return fmt::format(
      "<?xml version=\"1.0\" encoding=\"utf-8\" standalone=\"no\"?>\n"
      "<svg xmlns=\"http://www.w3.org/2000/svg\" version=\"1.1\" width=\"{0}pt\" "
      "height=\"{1}pt\" viewBox=\"0 0 {0} {1}\" "
      "font-family=\"DejaVu Sans, Bitstream Vera Sans, Arial, Helvetica, sans-serif\">\n"
      "<rect x=\"0\" y=\"0\" width=\"{0}\" height=\"{1}\" fill=\"#ffffff\"/>\n"
      "{2}</svg>\n",
      num(width_), num(height_), body_);
}

void Writer::save(const std::string& path, std::string_view who) const {
  write_file(path, str(), who);
}

void write_file(const std::string& path, std::string_view content, std::string_view who) {
  const std::string tmp = fmt::format("{}.{}.tmp", path, ::getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    EMBER_CHECK(out.good(), "{}: cannot write '{}'", who, path);
    out.write(content.data(), static_cast<std::streamsize>(content.size()));
    out.close();
    if (!out) {
      std::remove(tmp.c_str());
      EMBER_CHECK(false, "{}: cannot write '{}'", who, path);
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    EMBER_CHECK(false, "{}: cannot write '{}' (rename failed)", who, path);
  }
}

}  // namespace ember::viz::svg
