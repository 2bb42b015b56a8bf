// A small XML 1.0 parser for tests (elements, attributes, text, comments and the <?xml?>
// prolog), so that checking an SVG file is well-formed needs no XML library.
#pragma once

#include <cctype>
#include <map>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace ember::testing {

struct XmlElement {
  std::string name;
  std::map<std::string, std::string> attrs;
  std::string text;  // decoded character data directly inside the element
  int parent = -1;
  std::string attr(const std::string& key) const {
    const auto it = attrs.find(key);
    return it == attrs.end() ? "" : it->second;
  }
};

class XmlParser {
 public:
  explicit XmlParser(const std::string& s) : s_(s) {}

  // All elements in document order; throws std::runtime_error on anything malformed.
  std::vector<XmlElement> parse() {
    if (s_.compare(0, 5, "<?xml") == 0) skip_past("?>");
    std::vector<int> open;
    bool had_root = false;
    while (i_ < s_.size()) {
      if (s_[i_] != '<') {
        const size_t end = std::min(s_.find('<', i_), s_.size());
        const std::string text = decode(s_.substr(i_, end - i_));
        if (open.empty() && text.find_first_not_of(" \t\r\n") != std::string::npos)
          fail("text outside the root element");
        if (!open.empty()) out_[open.back()].text += text;
        i_ = end;
      } else if (s_.compare(i_, 4, "<!--") == 0) {
        skip_past("-->");
      } else if (s_.compare(i_, 2, "</") == 0) {
        i_ += 2;
        const std::string name = read_name();
        skip_space();
        expect('>');
        if (open.empty() || out_[open.back()].name != name) fail("mismatched </" + name + ">");
        open.pop_back();
      } else if (s_.compare(i_, 2, "<?") == 0 || s_.compare(i_, 2, "<!") == 0) {
        fail("unexpected markup");
      } else {
        if (open.empty() && had_root) fail("a second root element");
        had_root = true;
        ++i_;
        XmlElement e;
        e.name = read_name();
        e.parent = open.empty() ? -1 : open.back();
        const bool closed = read_attributes(e);
        out_.push_back(std::move(e));
        if (!closed) open.push_back(static_cast<int>(out_.size()) - 1);
      }
    }
    if (!open.empty()) fail("unclosed <" + out_[open.back()].name + ">");
    if (!had_root) fail("no root element");
    return std::move(out_);
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw std::runtime_error("xml: " + what + " at offset " + std::to_string(i_));
  }
  void expect(char c) {
    if (i_ >= s_.size() || s_[i_] != c) fail(std::string("expected '") + c + "'");
    ++i_;
  }
  void skip_past(const std::string& end) {
    const size_t at = s_.find(end, i_);
    if (at == std::string::npos) fail("unterminated " + end);
    i_ = at + end.size();
  }
  bool skip_space() {
    const size_t start = i_;
    while (i_ < s_.size() && std::isspace(static_cast<unsigned char>(s_[i_]))) ++i_;
    return i_ > start;
  }
  std::string read_name() {
    const size_t start = i_;
    while (i_ < s_.size() && (std::isalnum(static_cast<unsigned char>(s_[i_])) ||
                              std::string_view("-_:.").find(s_[i_]) != std::string_view::npos))
      ++i_;
    if (i_ == start || std::isdigit(static_cast<unsigned char>(s_[start]))) fail("bad name");
    return s_.substr(start, i_ - start);
  }
  // Attributes up to '>' or '/>'; true when the element closed itself.
  bool read_attributes(XmlElement& e) {
    while (true) {
      const bool spaced = skip_space();
      if (s_.compare(i_, 2, "/>") == 0) return i_ += 2, true;
      if (i_ < s_.size() && s_[i_] == '>') return ++i_, false;
      if (!spaced) fail("attributes must be separated by space");
      const std::string key = read_name();
      skip_space();
      expect('=');
      skip_space();
      if (i_ >= s_.size() || (s_[i_] != '"' && s_[i_] != '\'')) fail("unquoted attribute");
      const char quote = s_[i_++];
      const size_t end = s_.find(quote, i_);
      if (end == std::string::npos) fail("unterminated attribute");
      if (!e.attrs.emplace(key, decode(s_.substr(i_, end - i_))).second)
        fail("duplicate attribute " + key);
      i_ = end + 1;
    }
  }
  // Character data with its entity references replaced; a bare '<' or '&' is an error.
  std::string decode(const std::string& raw) const {
    static const std::map<std::string, std::string> entities = {
        {"amp", "&"}, {"lt", "<"}, {"gt", ">"}, {"quot", "\""}, {"apos", "'"}};
    std::string out;
    for (size_t k = 0; k < raw.size(); ++k) {
      if (raw[k] == '<') fail("'<' in character data");
      if (raw[k] != '&') {
        out += raw[k];
        continue;
      }
      const size_t semi = raw.find(';', k);
      if (semi == std::string::npos) fail("bare '&'");
      const std::string name = raw.substr(k + 1, semi - k - 1);
      if (entities.count(name))
        out += entities.at(name);
      else if (name.size() > 1 && name[0] == '#')
        out += '?';  // character reference
      else
        fail("unknown entity &" + name + ";");
      k = semi;
    }
    return out;
  }

  const std::string& s_;
  size_t i_ = 0;
  std::vector<XmlElement> out_;
};

// The elements of the document `s`; throws std::runtime_error when it is not well-formed.
inline std::vector<XmlElement> parse_xml(const std::string& s) { return XmlParser(s).parse(); }

}  // namespace ember::testing
