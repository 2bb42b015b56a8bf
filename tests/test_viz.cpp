// viz: every file parses as XML (the small checking parser of xml_check.h, so the test needs
// no XML library), heatmaps have one group per panel with one cell per value in the colormap's
// colours, labels sit on the outer panels, figures draw their series in D2L's styles, text is
// escaped, non-finite data leaves gaps, and every precondition fails with an ember::Error.
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <map>

#include "helpers.h"
#include "xml_check.h"

using namespace ember;
using ember::testing::expect_error;
using ember::testing::read_text;

namespace {

using ember::testing::parse_xml;
using ember::testing::XmlElement;

// A fresh directory for this test run's files.
std::string scratch(const std::string& name) {
  static const std::filesystem::path dir = [] {
    auto d =
        std::filesystem::temp_directory_path() / ("ember_test_viz_" + std::to_string(::getpid()));
    std::filesystem::create_directories(d);
    return d;
  }();
  return (dir / name).string();
}

// Parses the SVG file at `path` (failing the test when it is not well-formed XML) and checks
// every coordinate attribute is a finite number.
std::vector<XmlElement> load_svg(const std::string& path) {
  const std::string text = read_text(path);
  std::vector<XmlElement> doc;
  BOOST_REQUIRE_NO_THROW(doc = parse_xml(text));
  BOOST_TEST_REQUIRE(doc.front().name == "svg");
  BOOST_TEST(doc.front().attr("xmlns") == "http://www.w3.org/2000/svg");
  for (const XmlElement& e : doc) {
    if (e.name == "svg") continue;  // its width and height carry units
    for (const char* key : {"x", "y", "width", "height", "cx", "cy", "r", "x1", "y1", "x2", "y2"}) {
      const std::string v = e.attr(key);
      if (v.empty()) continue;
      size_t used = 0;
      const double d = std::stod(v, &used);
      BOOST_TEST((used == v.size() && std::isfinite(d)), "<" << e.name << " " << key << "=" << v);
    }
    if (e.name == "path")
      BOOST_TEST(e.attr("d").find_first_not_of("ML0123456789.- ") == std::string::npos,
                 "path d=" << e.attr("d"));
  }
  return doc;
}

// Elements named `name` whose class is `cls` (any class when empty).
std::vector<int> find(const std::vector<XmlElement>& doc, const std::string& name,
                      const std::string& cls = "") {
  std::vector<int> hits;
  for (size_t i = 0; i < doc.size(); ++i)
    if (doc[i].name == name && (cls.empty() || doc[i].attr("class") == cls))
      hits.push_back(static_cast<int>(i));
  return hits;
}

std::vector<int> children(const std::vector<XmlElement>& doc, int parent, const std::string& name) {
  std::vector<int> hits;
  for (size_t i = 0; i < doc.size(); ++i)
    if (doc[i].parent == parent && doc[i].name == name) hits.push_back(static_cast<int>(i));
  return hits;
}

std::vector<int> texts(const std::vector<XmlElement>& doc, const std::string& content) {
  std::vector<int> hits;
  for (const int i : find(doc, "text"))
    if (doc[i].text == content) hits.push_back(i);
  return hits;
}

double num_attr(const XmlElement& e, const std::string& key) { return std::stod(e.attr(key)); }

}  // namespace

BOOST_AUTO_TEST_SUITE(test_viz)

BOOST_AUTO_TEST_CASE(xml_checker_rejects_malformed_documents) {
  BOOST_CHECK_NO_THROW(parse_xml(R"(<?xml version="1.0"?><a x="1"><b/>t &amp; &lt;</a>)"));
  for (const char* bad : {"<a><b></a>", "<a>", R"(<a x="<"/>)", "<a>&</a>", "<a>&bogus;</a>",
                          "<a/><b/>", R"(<a x="1" x="2"/>)", R"(<a x="1"y="2"/>)", "text"})
    BOOST_CHECK_THROW(parse_xml(bad), std::runtime_error);
}

BOOST_AUTO_TEST_CASE(escape_and_numbers) {
  BOOST_TEST(viz::svg::escape("a<&>\"'b") == "a&lt;&amp;&gt;&quot;&apos;b");
  BOOST_TEST(viz::svg::escape("ok\x01\n") == "ok\n");                      // control char dropped
  BOOST_TEST(viz::svg::escape("\xC3\xA9") == "\xC3\xA9");                  // é kept
  BOOST_TEST(viz::svg::escape("x\xFFy") == "x\xEF\xBF\xBDy");              // malformed -> U+FFFD
  BOOST_TEST(viz::svg::escape("\xE2\x82") == "\xEF\xBF\xBD\xEF\xBF\xBD");  // truncated
  BOOST_TEST(viz::svg::num(12.5) == "12.5");
  BOOST_TEST(viz::svg::num(3.0) == "3");
  BOOST_TEST(viz::svg::num(-2.25) == "-2.25");
  BOOST_TEST(viz::svg::num(-0.001) == "0");
  BOOST_TEST(viz::svg::num(0.1 + 0.2) == "0.3");
  expect_error([] { viz::svg::num(NAN); }, {"svg", "nan"});
}

BOOST_AUTO_TEST_CASE(nice_ticks_and_labels) {
  using viz::svg::nice_ticks;
  BOOST_TEST((nice_ticks(0, 5, 6) == std::vector<double>{0, 1, 2, 3, 4, 5}));
  BOOST_TEST((nice_ticks(-1, 5, 6) == std::vector<double>{-1, 0, 1, 2, 3, 4, 5}));
  BOOST_TEST((nice_ticks(0, 1, 4) == std::vector<double>{0, 0.25, 0.5, 0.75, 1}));
  BOOST_TEST((nice_ticks(-0.5, 9.5, 5, true) == std::vector<double>{0, 2, 4, 6, 8}));
  BOOST_TEST((nice_ticks(-0.5, 49.5, 5, true) == std::vector<double>{0, 10, 20, 30, 40}));
  BOOST_TEST((nice_ticks(-0.5, 1.5, 5, true) == std::vector<double>{0, 1}));
  BOOST_TEST((nice_ticks(3, 3, 5) == std::vector<double>{3}));
  BOOST_TEST(nice_ticks(0, INFINITY, 5).empty());
  BOOST_TEST(nice_ticks(1e16, 1e16 + 4, 5).size() <= 12u);  // terminates where 1e16 + 1 == 1e16
  const auto labels = viz::svg::tick_labels({-1, 0, 0.2, 1});
  BOOST_TEST((labels == std::vector<std::string>{"\u22121.0", "0.0", "0.2", "1.0"}));
  BOOST_TEST((viz::svg::tick_labels({0, 10, 20}) == std::vector<std::string>{"0", "10", "20"}));
}

BOOST_AUTO_TEST_CASE(colormaps_match_matplotlib_at_the_ends) {
  BOOST_TEST(viz::colormap_color("Reds", 0) == "#fff5f0");
  BOOST_TEST(viz::colormap_color("Reds", 1) == "#67000d");
  BOOST_TEST(viz::colormap_color("Reds", 0.5) == "#fb694a");  // lut entry 128, between anchors
  BOOST_TEST(viz::colormap_color("Blues", 0) == "#f7fbff");
  BOOST_TEST(viz::colormap_color("Blues", 1) == "#08306b");
  BOOST_TEST(viz::colormap_color("viridis", 0) == "#440154");
  BOOST_TEST(viz::colormap_color("viridis", 1) == "#fde725");
  // viridis is a 256-entry table; ours interpolates 33 of its entries, within 2/255 of it.
  // matplotlib's viridis(0.5) is entry 128, (0.127568, 0.566949, 0.550556) = #21918c.
  const std::string mid = viz::colormap_color("viridis", 0.5);
  const int expected[] = {0x21, 0x91, 0x8c};
  for (int c = 0; c < 3; ++c)
    BOOST_TEST(std::abs(std::stoi(mid.substr(1 + 2 * c, 2), nullptr, 16) - expected[c]) <= 2, mid);
  BOOST_TEST(viz::colormap_color("Reds", -3) == "#fff5f0");  // clipped
  expect_error([] { viz::colormap_color("jet", 0.5); }, {"colormap_color", "'jet'"});
}

BOOST_AUTO_TEST_CASE(heatmap_of_eye_as_in_d2l) {
  const std::string path = scratch("eye.svg");
  viz::show_heatmaps(eye(10).reshape({1, 1, 10, 10}), path, "Keys", "Queries");
  const auto doc = load_svg(path);
  const auto groups = find(doc, "g", "heatmap");
  BOOST_TEST_REQUIRE(groups.size() == 1u);
  const auto cells = children(doc, groups[0], "rect");
  BOOST_TEST_REQUIRE(cells.size() == 100u);
  for (int q = 0; q < 10; ++q)
    for (int k = 0; k < 10; ++k)
      BOOST_TEST(doc[cells[q * 10 + k]].attr("fill") == (q == k ? "#67000d" : "#fff5f0"));
  // Rows go down, columns go right, cells are square.
  BOOST_TEST(num_attr(doc[cells[1]], "x") > num_attr(doc[cells[0]], "x"));
  BOOST_TEST(num_attr(doc[cells[10]], "y") > num_attr(doc[cells[0]], "y"));
  BOOST_TEST(doc[cells[0]].attr("width") == doc[cells[0]].attr("height"));
  BOOST_TEST(texts(doc, "Keys").size() == 1u);
  BOOST_TEST(texts(doc, "Queries").size() == 1u);
  BOOST_TEST(doc[texts(doc, "Queries")[0]].attr("transform").find("rotate(-90") == 0u);
  for (const char* tick : {"0", "2", "4", "6", "8"}) BOOST_TEST(texts(doc, tick).size() == 2u);
  // One colorbar: its gradient runs through Reds' nine anchors, its labels span 0..1.
  BOOST_TEST(find(doc, "g", "colorbar").size() == 1u);
  BOOST_TEST(find(doc, "stop").size() == 9u);
  BOOST_TEST(texts(doc, "0.00").size() == 1u);
  BOOST_TEST(texts(doc, "1.00").size() == 1u);
}

BOOST_AUTO_TEST_CASE(heatmap_grid_2x3_shares_axes_and_one_range) {
  // Values 0..23 over a (2, 3, 2, 2) grid: panel (i, j) holds 4 * (3i + j) .. +3.
  const Tensor m = arange(0, 24, 1, kFloat64).reshape({2, 3, 2, 2});
  const std::string path = scratch("grid.svg");
  viz::show_heatmaps(m, path, "Keys", "Queries", {"A<1>", "B&2", "C"});
  const auto doc = load_svg(path);
  const auto groups = find(doc, "g", "heatmap");
  BOOST_TEST_REQUIRE(groups.size() == 6u);
  double cells_bottom = 0, cells_left = 1e9;
  for (int p = 0; p < 6; ++p) {
    const auto cells = children(doc, groups[p], "rect");
    BOOST_TEST_REQUIRE(cells.size() == 4u);
    for (int c = 0; c < 4; ++c) {
      const double v = 4 * p + c;
      BOOST_TEST(doc[cells[c]].attr("fill") == viz::colormap_color("Reds", v / 23));
      cells_bottom =
          std::max(cells_bottom, num_attr(doc[cells[c]], "y") + num_attr(doc[cells[c]], "height"));
      cells_left = std::min(cells_left, num_attr(doc[cells[c]], "x"));
    }
  }
  BOOST_TEST(doc[children(doc, groups[0], "rect")[0]].attr("fill") == "#fff5f0");  // min
  BOOST_TEST(doc[children(doc, groups[5], "rect")[3]].attr("fill") == "#67000d");  // max
  // Panels in row-major order: (0,1) right of (0,0), (1,0) below it.
  const auto corner = [&](int p) { return doc[children(doc, groups[p], "rect")[0]]; };
  BOOST_TEST(num_attr(corner(1), "x") > num_attr(corner(0), "x"));
  BOOST_TEST(num_attr(corner(3), "y") > num_attr(corner(0), "y"));
  BOOST_TEST(num_attr(corner(3), "x") == num_attr(corner(0), "x"));
  // x label under each bottom-row panel only, y label beside each first-column panel only,
  // a title (escaped in the file, intact once parsed) above every panel of its column.
  const auto keys = texts(doc, "Keys"), queries = texts(doc, "Queries");
  BOOST_TEST(keys.size() == 3u);
  BOOST_TEST(queries.size() == 2u);
  for (const int k : keys) BOOST_TEST(num_attr(doc[k], "y") > cells_bottom);
  for (const int q : queries) BOOST_TEST(num_attr(doc[q], "x") < cells_left);
  BOOST_TEST(texts(doc, "A<1>").size() == 2u);
  BOOST_TEST(texts(doc, "B&2").size() == 2u);
  BOOST_TEST(read_text(path).find("A&lt;1&gt;") != std::string::npos);
  BOOST_TEST(find(doc, "g", "colorbar").size() == 1u);
}

BOOST_AUTO_TEST_CASE(heatmap_reads_views_and_leaves_nonfinite_cells_blank) {
  // A transposed view: cell (q, k) of the drawn (1, 1, 3, 2) matrix is m[k][q].
  Tensor m = from_vector(std::vector<double>{0, 1, 2, 3, 4, 5}, {1, 1, 2, 3}, kFloat64);
  m.requires_grad_();  // a tensor in a graph draws the same
  const std::string path = scratch("view.svg");
  viz::show_heatmaps(m.transpose(2, 3), path, "k", "q", {}, "Blues");
  auto doc = load_svg(path);
  auto cells = children(doc, find(doc, "g", "heatmap")[0], "rect");
  BOOST_TEST_REQUIRE(cells.size() == 6u);
  const double drawn[] = {0, 3, 1, 4, 2, 5};
  for (int c = 0; c < 6; ++c)
    BOOST_TEST(doc[cells[c]].attr("fill") == viz::colormap_color("Blues", drawn[c] / 5));
  // NaN and Inf cells are not drawn and do not stretch the range.
  const Tensor bad = from_vector(std::vector<double>{0, NAN, 2, INFINITY}, {1, 1, 2, 2}, kFloat64);
  viz::show_heatmaps(bad, path, "k", "q", {}, "viridis");
  doc = load_svg(path);
  cells = children(doc, find(doc, "g", "heatmap")[0], "rect");
  BOOST_TEST_REQUIRE(cells.size() == 2u);
  BOOST_TEST(doc[cells[0]].attr("fill") == "#440154");
  BOOST_TEST(doc[cells[1]].attr("fill") == "#fde725");
  // A constant matrix: every cell at the lightest colour, as matplotlib.
  viz::show_heatmaps(full({1, 1, 2, 2}, 0.3), path, "k", "q");
  doc = load_svg(path);
  for (const int c : children(doc, find(doc, "g", "heatmap")[0], "rect"))
    BOOST_TEST(doc[c].attr("fill") == "#fff5f0");
}

BOOST_AUTO_TEST_CASE(heatmap_errors) {
  const std::string path = scratch("err.svg");
  expect_error(
      [&] {
        viz::show_heatmaps(zeros({3, 3}), path, "k", "q");
      },
      {"show_heatmaps", "4-D", "[3, 3]"});
  expect_error(
      [&] {
        viz::show_heatmaps(zeros({1, 0, 2, 2}), path, "k", "q");
      },
      {"show_heatmaps", "[1, 0, 2, 2]"});
  expect_error(
      [&] {
        viz::show_heatmaps(zeros({1, 2, 2, 2}), path, "k", "q", {"only one"});
      },
      {"show_heatmaps", "1 titles for 2 columns"});
  expect_error(
      [&] {
        viz::show_heatmaps(zeros({1, 1, 2, 2}), path, "k", "q", {}, "x");
      },
      {"show_heatmaps: unknown colormap 'x'"});
  const std::string unwritable = "/nonexistent_ember_dir/out.svg";
  expect_error(
      [&] {
        viz::show_heatmaps(zeros({1, 1, 2, 2}), unwritable, "k", "q");
      },
      {"show_heatmaps", unwritable});
}

BOOST_AUTO_TEST_CASE(figure_as_d2l_plot) {
  // d2l.plot(x_test, [y_truth, y_hat], 'x', 'y', legend=['Truth', 'Pred'], xlim=[0, 5],
  // ylim=[-1, 5]); plt.plot(x_train, y_train, 'o', alpha=0.5)
  const Tensor x_test = arange(0, 5, 0.1, kFloat64);
  const Tensor y_truth = x_test.sin() * 2 + x_test;
  std::vector<double> x_train, y_train;
  for (int i = 0; i < 20; ++i) x_train.push_back(i * 0.25), y_train.push_back(std::cos(i) + 2);
  y_train[3] = 9;  // above ylim: clipped away
  viz::Figure fig("x <i>", "y");
  fig.add_line(x_test, y_truth, "Truth")
      .add_line(x_test, full({50}, 2.5, kFloat64), "Pred")
      .add_scatter(x_train, y_train, "", 0.5)
      .xlim(0, 5)
      .ylim(-1, 5);
  const std::string path = scratch("figure.svg");
  fig.save(path);
  const auto doc = load_svg(path);
  const auto lines = find(doc, "path", "line");
  BOOST_TEST_REQUIRE(lines.size() == 2u);
  BOOST_TEST(doc[lines[0]].attr("stroke") == "#1f77b4");  // '-' in C0
  BOOST_TEST(doc[lines[0]].attr("stroke-dasharray").empty());
  BOOST_TEST(doc[lines[1]].attr("stroke") == "#bf00bf");  // 'm--'
  BOOST_TEST(!doc[lines[1]].attr("stroke-dasharray").empty());
  const auto dots = find(doc, "circle");
  BOOST_TEST(dots.size() == 19u);  // 20 points, one far above the axes
  for (const int d : dots) {
    BOOST_TEST(doc[d].attr("fill") == "#ff7f0e");  // the next cycle colour, C1
    BOOST_TEST(doc[d].attr("fill-opacity") == "0.5");
  }
  // Legend: the two labelled lines, not the unlabelled scatter.
  const auto legend = find(doc, "g", "legend");
  BOOST_TEST_REQUIRE(legend.size() == 1u);
  BOOST_TEST(children(doc, legend[0], "text").size() == 2u);
  BOOST_TEST(texts(doc, "Truth").size() == 1u);
  BOOST_TEST(texts(doc, "Pred").size() == 1u);
  BOOST_TEST(texts(doc, "x <i>").size() == 1u);
  for (const char* tick : {"0", "1", "2", "3", "4", "5", "\u22121"})
    BOOST_TEST(!texts(doc, tick).empty(), "tick " << tick);
  // Everything drawn lies inside the figure (give or take the clip margin).
  for (const int d : dots) BOOST_TEST(num_attr(doc[d], "cy") >= 0);
}

BOOST_AUTO_TEST_CASE(figure_gaps_clipping_and_autoscale) {
  viz::Figure fig("x", "y");
  fig.add_line({0, 1, 2, NAN, 4, 5, INFINITY, 7}, {0, 1, 4, 9, 16, 25, 36, 49}, "squares");
  fig.add_line({0, 7}, {1e300, -1e300});  // far outside: clipped to a short segment
  fig.ylim(-10, 60);
  const std::string path = scratch("gaps.svg");
  fig.save(path);
  const std::string text = read_text(path);
  BOOST_TEST(text.find("nan") == std::string::npos);
  BOOST_TEST(text.find("inf") == std::string::npos);
  const auto doc = load_svg(path);
  const auto lines = find(doc, "path", "line");
  BOOST_TEST_REQUIRE(lines.size() == 2u);
  const std::string d = doc[lines[0]].attr("d");
  BOOST_TEST(std::count(d.begin(), d.end(), 'M') == 2);  // 0-1-2 and 4-5; 7 is alone
  BOOST_TEST(std::count(d.begin(), d.end(), 'L') == 3);
  BOOST_TEST(doc[lines[1]].attr("d").size() < 40u);
  BOOST_TEST(doc[lines[1]].attr("stroke") == "#bf00bf");
  // x autoscaled to the finite data with margins, y as set.
  BOOST_TEST(!texts(doc, "0").empty());
  BOOST_TEST(!texts(doc, "40").empty());
}

BOOST_AUTO_TEST_CASE(figure_errors) {
  viz::Figure fig("x", "y");
  expect_error([&] { fig.add_line({1, 2, 3}, {1, 2}); }, {"Figure.add_line", "3", "2"});
  expect_error([&] { fig.add_scatter({1}, {1}, "", 1.5); }, {"Figure.add_scatter", "alpha", "1.5"});
  expect_error(
      [&] {
        fig.add_line(zeros({2, 3}), zeros({2, 3}));
      },
      {"Figure.add_line", "1-D", "[2, 3]"});
  expect_error([&] { fig.xlim(2, 1); }, {"Figure.xlim", "2", "1"});
  expect_error([&] { fig.ylim(0, NAN); }, {"Figure.ylim"});
  const std::string unwritable = "/nonexistent_ember_dir/fig.svg";
  expect_error([&] { fig.save(unwritable); }, {"Figure.save", unwritable});
}

BOOST_AUTO_TEST_CASE(animator_as_d2l) {
  // animator = d2l.Animator(xlabel='epoch', ylabel='loss', xlim=[1, 5])
  viz::Animator single("epoch", "loss", {}, {{1, 5}});
  for (int epoch = 1; epoch <= 5; ++epoch) single.add(epoch, {10.0 / epoch});
  const std::string path = scratch("loss.svg");
  single.save(path);
  auto doc = load_svg(path);
  BOOST_TEST(find(doc, "path", "line").size() == 1u);
  BOOST_TEST(find(doc, "g", "legend").empty());
  BOOST_TEST(texts(doc, "epoch").size() == 1u);
  BOOST_TEST(texts(doc, "loss").size() == 1u);

  // Three series with a legend, rewritten after every add.
  viz::Animator multi("epoch", "value", {"train loss", "train acc", "test acc"}, {{1, 3}},
                      {{0, 1}});
  const std::string live = scratch("live.svg");
  multi.autosave(live);
  multi.add(1, {0.9, 0.3, 0.2});
  doc = load_svg(live);
  BOOST_TEST(find(doc, "path", "line").empty());  // one point per series: nothing to draw yet
  BOOST_TEST(texts(doc, "test acc").size() == 1u);
  multi.add(2, {0.5, 0.6, NAN});
  multi.add(3, {0.4, 0.7, 0.6});
  doc = load_svg(live);
  const auto lines = find(doc, "path", "line");
  BOOST_TEST_REQUIRE(lines.size() == 2u);  // test acc has a gap at epoch 2: no segment left
  BOOST_TEST(doc[lines[1]].attr("stroke") == "#bf00bf");

  expect_error([&] { multi.add(4, {0.1}); }, {"Animator.add", "1", "3"});
  expect_error(
      [] {
        viz::Animator("x", "y", {"a", "b"}).add(1, {1});
      },
      {"Animator.add", "2 legend names"});
  expect_error([] { viz::Animator("x", "y", {}, {{3, 1}}); }, {"Animator", "3", "1"});
  expect_error([&] { single.save("/nonexistent_ember_dir/a.svg"); },
               {"Animator.save", "/nonexistent_ember_dir/a.svg"});
}

BOOST_AUTO_TEST_CASE(cleanup) {
  std::filesystem::remove_all(std::filesystem::path(scratch("x")).parent_path());
}

BOOST_AUTO_TEST_SUITE_END()
