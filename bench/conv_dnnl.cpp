// conv_dnnl: what Ember would gain by calling oneDNN for its convolutions. Times oneDNN's
// convolution forward, backward-data and backward-weights (f32) on the layer shapes of
// examples/fashion_mnist at batch 128 (bench/conv_shapes.h), beside Ember's own conv2d (im2col +
// bmm, Note [Convolution as products] in ops/conv.cpp) in the same process, interleaved round by
// round so that a busy phase of a shared machine slows every candidate alike. Built only where
// oneDNN is installed (bench/CMakeLists.txt); the library never links it.
//
//   conv_dnnl [--threads N] [--rounds R] [--chunk seconds] [--filter substr] [--json out.json]
//
// Candidates per shape (times per call, the median over rounds of chunks of ~`chunk` seconds):
//   ember  fwd: conv2d without grad; bwd_d / bwd_w: autograd::grad of a retained conv2d output
//          with respect to the input alone / the weight (and bias) alone; step: forward +
//          backward of everything (ember_bench's "fwd+bwd" row).
//   nchw   oneDNN on the user layout (src nchw, weights oihw): no reorders at all.
//   blk    oneDNN with format_tag::any (its blocked layouts, e.g. nChw16c / OIhw16i16o), the
//          operands already in those layouts: the primitive alone, as in a network that keeps
//          activations blocked between layers.
//   blk+r  the same with the reorders from and to the nchw/oihw user layout counted in every call
//          (forward: src, weights in, dst out; backward-data: diff_dst, weights in, diff_src out;
//          backward-weights: src, diff_dst in, diff_weights out), what a drop-in replacement of
//          Ember's conv2d on NCHW tensors would cost.
// oneDNN runs on `threads` OpenMP threads (omp_set_num_threads around each call: Ember pins
// OpenMP's count to 1 and sizes its own regions). The first check compares oneDNN's forward, input
// and weight gradients with Ember's.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <omp.h>
#include <oneapi/dnnl/dnnl.hpp>

#include "bench/conv_shapes.h"
#include "ember.h"

namespace {

using namespace ember;
using namespace ember::bench;
using dnnl::memory;
using tag = memory::format_tag;

struct Candidate {
  std::string name;
  std::function<void()> run;
  Candidate(std::string n, std::function<void()> f) : name(std::move(n)), run(std::move(f)) {}
  int64_t iters = 1;          // calls per timed chunk
  std::vector<double> times;  // seconds per call, one a round
};

double seconds_of(const std::function<void()>& f, int64_t iters) {
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < iters; ++i) f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() /
         static_cast<double>(iters);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// One oneDNN primitive and its arguments, plus the reorders around it for the blk+r variant.
struct Prim {
  dnnl::primitive prim;
  std::unordered_map<int, memory> args;
  std::vector<std::pair<dnnl::reorder, std::pair<memory, memory>>> before, after;
  std::string impl;
};

// A memory in `want`'s layout, and the reorder from the user's `user` to it (or back) if they
// differ.
memory in_layout(const memory& user, const memory::desc& want, const dnnl::engine& eng) {
  return user.get_desc() == want ? user : memory(want, eng);
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 1, rounds = 15;
  double chunk = 0.01;
  std::string filter, json_path;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const auto value = [&] { return i + 1 < argc ? std::string(argv[++i]) : std::string(); };
    if (a == "--threads")
      threads = std::atoi(value().c_str());
    else if (a == "--rounds")
      rounds = std::atoi(value().c_str());
    else if (a == "--chunk")
      chunk = std::atof(value().c_str());
    else if (a == "--filter")
      filter = value();
    else if (a == "--json")
      json_path = value();
    else {
      std::fprintf(stderr,
                   "usage: conv_dnnl [--threads N] [--rounds R] [--chunk s] [--filter substr] "
                   "[--json out.json]\n");
      return a == "--help" ? 0 : 2;
    }
  }
  set_num_threads(threads);
  dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  dnnl::stream strm(eng);
  std::string json = "[\n";
  fmt::print("oneDNN {}.{}.{}, {} thread(s), {} rounds of ~{} s chunks; times in us per call\n",
             dnnl_version()->major, dnnl_version()->minor, dnnl_version()->patch, threads, rounds,
             chunk);

  for (const ConvShape& c : kConvShapes) {
    if (!filter.empty() && c.name().find(filter) == std::string::npos) continue;
    manual_seed(0);
    const int64_t N = kConvBatch, O = c.out(), P = c.pad();
    Tensor x = rand({N, c.c_in, c.size, c.size}) * 2 - 1;
    Tensor w = (rand({c.c_out, c.c_in, c.kernel, c.kernel}) * 2 - 1) * 0.1;
    Tensor b = c.bias ? rand({c.c_out}) * 0.1 : Tensor();
    Tensor gy = rand({N, c.c_out, O, O});
    // oneDNN's own outputs (user layout), written by its primitives
    Tensor y_d = empty({N, c.c_out, O, O}), gx_d = empty(x.sizes()), gw_d = empty(w.sizes());
    Tensor gb_d = empty({c.c_out});

    const memory::dims src_dims{N, c.c_in, c.size, c.size},
        w_dims{c.c_out, c.c_in, c.kernel, c.kernel}, dst_dims{N, c.c_out, O, O}, b_dims{c.c_out},
        strides{c.stride, c.stride}, pad{P, P};
    // right padding as oneDNN wants it: (O - 1)·s + k - size - P
    const int64_t pr = (O - 1) * c.stride + c.kernel - c.size - P;
    const memory::dims pad_r{pr, pr};
    const auto f32 = memory::data_type::f32;
    const memory::desc user_src(src_dims, f32, tag::nchw), user_w(w_dims, f32, tag::oihw),
        user_dst(dst_dims, f32, tag::nchw), user_b(b_dims, f32, tag::x);
    memory m_src(user_src, eng, x.data<float>()), m_w(user_w, eng, w.data<float>()),
        m_b(user_b, eng, c.bias ? b.data<float>() : nullptr), m_gy(user_dst, eng, gy.data<float>()),
        m_y(user_dst, eng, y_d.data<float>()), m_gx(user_src, eng, gx_d.data<float>()),
        m_gw(user_w, eng, gw_d.data<float>()), m_gb(user_b, eng, gb_d.data<float>());
    const memory::desc no_bias;

    // The three primitives for one choice of layouts: `any` true lets oneDNN pick.
    const auto build = [&](bool any) {
      const auto md = [&](const memory::dims& d, tag user) {
        return memory::desc(d, f32, any ? tag::any : user);
      };
      const auto src = md(src_dims, tag::nchw), wt = md(w_dims, tag::oihw),
                 dst = md(dst_dims, tag::nchw);
      const auto bias_md = c.bias ? user_b : no_bias;
      dnnl::convolution_forward::primitive_desc fwd(
          {dnnl::prop_kind::forward_training, dnnl::algorithm::convolution_direct, src, wt, bias_md,
           dst, strides, pad, pad_r},
          eng);
      dnnl::convolution_backward_data::primitive_desc bwd_d(
          {dnnl::algorithm::convolution_direct, src, wt, dst, strides, pad, pad_r}, eng, fwd);
      dnnl::convolution_backward_weights::primitive_desc bwd_w(
          {dnnl::algorithm::convolution_direct, src, wt, bias_md, dst, strides, pad, pad_r}, eng,
          fwd);
      std::array<Prim, 3> p;
      // each operand in the primitive's layout, with the reorders from (in) or to (out) the user's
      const auto operand = [&](Prim& q, int arg, memory user, const memory::desc& want, bool in) {
        memory m = in_layout(user, want, eng);
        if (m.get_data_handle() != user.get_data_handle()) {
          if (in)
            q.before.push_back({dnnl::reorder(user, m), {user, m}});
          else
            q.after.push_back({dnnl::reorder(m, user), {m, user}});
          if (in) dnnl::reorder(user, m).execute(strm, user, m);  // blk: operands already there
        }
        q.args[arg] = m;
      };
      p[0].prim = dnnl::convolution_forward(fwd);
      p[0].impl = fwd.impl_info_str();
      operand(p[0], DNNL_ARG_SRC, m_src, fwd.src_desc(), true);
      operand(p[0], DNNL_ARG_WEIGHTS, m_w, fwd.weights_desc(), true);
      if (c.bias) p[0].args[DNNL_ARG_BIAS] = m_b;
      operand(p[0], DNNL_ARG_DST, m_y, fwd.dst_desc(), false);
      p[1].prim = dnnl::convolution_backward_data(bwd_d);
      p[1].impl = bwd_d.impl_info_str();
      operand(p[1], DNNL_ARG_DIFF_DST, m_gy, bwd_d.diff_dst_desc(), true);
      operand(p[1], DNNL_ARG_WEIGHTS, m_w, bwd_d.weights_desc(), true);
      operand(p[1], DNNL_ARG_DIFF_SRC, m_gx, bwd_d.diff_src_desc(), false);
      p[2].prim = dnnl::convolution_backward_weights(bwd_w);
      p[2].impl = bwd_w.impl_info_str();
      operand(p[2], DNNL_ARG_SRC, m_src, bwd_w.src_desc(), true);
      operand(p[2], DNNL_ARG_DIFF_DST, m_gy, bwd_w.diff_dst_desc(), true);
      operand(p[2], DNNL_ARG_DIFF_WEIGHTS, m_gw, bwd_w.diff_weights_desc(), false);
      if (c.bias) p[2].args[DNNL_ARG_DIFF_BIAS] = m_gb;
      strm.wait();
      return p;
    };
    std::array<Prim, 3> plain = build(false), blocked = build(true);
    const auto exec = [&](Prim& q, bool reorders) {
      return [&q, &strm, reorders, threads] {
        // Ember keeps OpenMP's own count at 1 (graph/parallel.cpp, for OpenBLAS) and gives its
        // regions their thread count; oneDNN's OpenMP build reads omp_get_max_threads().
        omp_set_num_threads(threads);
        if (reorders)
          for (auto& [r, io] : q.before) r.execute(strm, io.first, io.second);
        q.prim.execute(strm, q.args);
        if (reorders)
          for (auto& [r, io] : q.after) r.execute(strm, io.first, io.second);
        strm.wait();
        omp_set_num_threads(1);
      };
    };

    // Ember's side, and the check of oneDNN's results against it
    Tensor xg = x.detach().requires_grad_(), wg = w.detach().requires_grad_(),
           bg = c.bias ? b.detach().requires_grad_() : Tensor();
    const Tensor y_e = conv2d(xg, wg, bg, {c.stride}, P);
    const std::vector<Tensor> all =
        c.bias ? std::vector<Tensor>{xg, wg, bg} : std::vector<Tensor>{xg, wg};
    const std::vector<Tensor> weights(all.begin() + 1, all.end());
    {
      for (Prim* q : {&plain[0], &plain[1], &plain[2]}) exec(*q, true)();
      const std::vector<Tensor> g = autograd::grad({y_e}, all, {gy}, true);
      const auto diff = [](const Tensor& a, const Tensor& e) {
        return (a - e).abs().max().item<double>() / std::max(1e-30, e.abs().max().item<double>());
      };
      const double worst = std::max({diff(y_d, y_e.detach()), diff(gx_d, g[0]), diff(gw_d, g[1])});
      for (Prim* q : {&blocked[0], &blocked[1], &blocked[2]}) exec(*q, true)();
      const double worst_blk =
          std::max({diff(y_d, y_e.detach()), diff(gx_d, g[0]), diff(gw_d, g[1])});
      if (worst > 1e-4 || worst_blk > 1e-4) {
        fmt::print(stderr, "conv_dnnl: {}: oneDNN differs from Ember by {} / {} (relative)\n",
                   c.name(), worst, worst_blk);
        return 1;
      }
    }
    std::vector<Candidate> cands{
        {"ember fwd",
         [&] {
           NoGradGuard g;
           (void)conv2d(x, w, b, {c.stride}, P);
         }},
        {"ember bwd_d", [&] { (void)autograd::grad({y_e}, {xg}, {gy}, true); }},
        {"ember bwd_w", [&] { (void)autograd::grad({y_e}, weights, {gy}, true); }},
        {"ember step",
         [&] {
           conv2d(xg, wg, bg, {c.stride}, P).backward(gy);
           for (const Tensor& t : all) t.set_grad(Tensor());
         }},
        {"nchw fwd", exec(plain[0], false)},
        {"nchw bwd_d", exec(plain[1], false)},
        {"nchw bwd_w", exec(plain[2], false)},
        {"blk fwd", exec(blocked[0], false)},
        {"blk bwd_d", exec(blocked[1], false)},
        {"blk bwd_w", exec(blocked[2], false)},
        {"blk+r fwd", exec(blocked[0], true)},
        {"blk+r bwd_d", exec(blocked[1], true)},
        {"blk+r bwd_w", exec(blocked[2], true)},
    };
    for (Candidate& k : cands) {  // warm-up, and calls per chunk
      k.run();
      const double t = seconds_of(k.run, 2);
      k.iters = std::max<int64_t>(1, static_cast<int64_t>(chunk / t));
    }
    for (int r = 0; r < rounds; ++r)  // each round in another order
      for (size_t i = 0; i < cands.size(); ++i) {
        Candidate& k = cands[(i + static_cast<size_t>(r) * 5) % cands.size()];
        k.times.push_back(seconds_of(k.run, k.iters));
      }
    std::unordered_map<std::string, double> med;
    for (const Candidate& k : cands) med[k.name] = median(k.times);
    // the median over rounds of the ratio Ember / oneDNN (blk+r), fwd + bwd_d + bwd_w summed
    std::vector<double> ratio_blk_r, ratio_blk, ratio_nchw;
    const auto at = [&](const std::string& name) -> const std::vector<double>& {
      for (const Candidate& k : cands)
        if (k.name == name) return k.times;
      std::abort();
    };
    for (int r = 0; r < rounds; ++r) {
      const auto sum = [&](const std::string& p) {
        return at(p + " fwd")[r] + at(p + " bwd_d")[r] + at(p + " bwd_w")[r];
      };
      ratio_blk_r.push_back(at("ember step")[r] / sum("blk+r"));
      ratio_blk.push_back(at("ember step")[r] / sum("blk"));
      ratio_nchw.push_back(at("ember step")[r] / sum("nchw"));
    }
    fmt::print("\n{}  ({:.1f} MFLOP forward)\n", c.name(), c.flops(N) * 1e-6);
    for (const char* p : {"ember", "nchw", "blk", "blk+r"}) {
      const std::string s = p;
      fmt::print("  {:<6} fwd {:>9.0f}  bwd_d {:>9.0f}  bwd_w {:>9.0f}", s, med[s + " fwd"] * 1e6,
                 med[s + " bwd_d"] * 1e6, med[s + " bwd_w"] * 1e6);
      if (s == "ember") fmt::print("  step {:>9.0f}", med["ember step"] * 1e6);
      fmt::print("\n");
    }
    fmt::print("  impl nchw: {} / {} / {};  any: {} / {} / {}\n", plain[0].impl, plain[1].impl,
               plain[2].impl, blocked[0].impl, blocked[1].impl, blocked[2].impl);
    fmt::print("  ember step / oneDNN (fwd+bwd_d+bwd_w): nchw {:.2f}  blk {:.2f}  blk+r {:.2f}\n",
               median(ratio_nchw), median(ratio_blk), median(ratio_blk_r));
    json += fmt::format("  {{\"name\": \"{}\", \"threads\": {}, \"flops\": {}", c.name(), threads,
                        c.flops(N));
    for (const auto& [k, v] : med) json += fmt::format(", \"{}\": {}", k, v);
    json += fmt::format(
        ", \"ratio_nchw\": {}, \"ratio_blk\": {}, \"ratio_blk_r\": {}, \"impl_nchw\": "
        "\"{}/{}/{}\", "
        "\"impl_any\": \"{}/{}/{}\"}},\n",
        median(ratio_nchw), median(ratio_blk), median(ratio_blk_r), plain[0].impl, plain[1].impl,
        plain[2].impl, blocked[0].impl, blocked[1].impl, blocked[2].impl);
    std::fflush(stdout);
  }
  if (json.size() > 2) json.erase(json.size() - 2, 1);
  json += "]\n";
  if (!json_path.empty()) std::ofstream(json_path) << json;
  return 0;
}
