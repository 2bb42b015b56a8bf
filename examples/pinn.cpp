// A physics-informed neural network (Raissi, Perdikaris & Karniadakis, J. Comput. Phys. 378,
// 2019, the continuous-time Burgers example): an MLP u(x, t) fitted to 100 initial and boundary
// values and to the PDE's residual f = u_t + u u_x - (0.01/pi) u_xx at 10,000 collocation
// points. The residual holds the network's own derivatives with respect to its input, taken by
// autograd::grad with create_graph (--derivatives reverse) or by nested forward mode
// (--derivatives forward: u_x and u_xx from a jvp of a jvp along x, u_t from a jvp along t), so
// every training step differentiates through a second derivative. Adam first, then L-BFGS with the
// strong Wolfe line search; the relative L2 error against the exact solution (examples/burgers.h)
// on a 256 x 100 grid. Failures end as one line on stderr and a non-zero exit (examples/program.h).
#include <chrono>
#include <cmath>
#include <numbers>
#include <random>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "burgers.h"
#include "ember.h"
#include "program.h"

using namespace ember;
using Json = nlohmann::ordered_json;

namespace {

struct Config {
  int64_t layers = 9, width = 20, n_u = 100, n_f = 10000, adam_iters = 1000, lbfgs_iters = 5000,
          lbfgs_round = 0;
  double adam_lr = 1e-3;
  // L-BFGS keeps every curvature pair of positive curvature (LBFGSOptions::curvature_eps): torch's
  // fixed 1e-10 stops learning curvature once the loss is below ~1e-6.
  double lbfgs_curvature_eps = 0;
  DType dtype = kFloat32;
  uint64_t seed = 1234;
  int threads = 0;
  std::string device = "cpu";
  bool forward_derivatives = false;  // --derivatives forward
};

// u(x, t): `layers` Linear layers (layers - 1 hidden ones of `width` tanh units) on the inputs
// scaled to [-1, 1], Xavier-normal weights and zero biases as Raissi's. Parameters are named
// as a torch user's nn.ModuleList "layers" names them (layers.0.weight, ...).
struct Net : nn::Cloneable<Net> {
  Net(int64_t layers, int64_t width) {
    register_module("layers", list, std::make_shared<nn::ModuleList>());
    for (int64_t i = 0; i < layers; ++i) {
      auto linear = std::make_shared<nn::Linear>(i == 0 ? 2 : width, i + 1 == layers ? 1 : width);
      nn::init::normal_(
          linear->weight, 0.0,
          std::sqrt(2.0 / static_cast<double>(linear->in_features + linear->out_features)));
      nn::init::zeros_(linear->bias);
      list->push_back(linear);
    }
  }
  // xt: (n, 2), columns x in [-1, 1] and t in [0, 1].
  Tensor forward(const Tensor& xt) const {
    const auto row = [&](double a, double b) { return tensor({a, b}, xt.dtype()).to(xt.device()); };
    Tensor h = xt * row(1.0, 2.0) - row(0.0, 1.0);  // to [-1, 1]²
    for (size_t i = 0; i < list->size(); ++i) {
      h = list->at<nn::Linear>(i)->forward(h);
      if (i + 1 < list->size()) h = tanh(h);
    }
    return h;
  }
  std::shared_ptr<nn::ModuleList> list;
};

// The training data, as Raissi's: N_u points drawn from the initial line (256 x values at t = 0)
// and the two boundaries (100 t values each), and N_f Latin hypercube collocation points, to
// which the N_u points are added. Drawn on the host (the same points for any --device), then
// moved to the training device.
struct Data {
  Tensor xt_u, u, x_f, t_f;  // (N_u, 2), (N_u, 1); the collocation points' columns (N_f + N_u, 1)
};

// The evaluation grid: 256 x in [-1, 1] by 100 t in [0, 0.99], as the paper's data set.
constexpr int64_t kGridX = 256, kGridT = 100;
double grid_x(int64_t i) { return -1.0 + 2.0 * static_cast<double>(i) / (kGridX - 1); }
double grid_t(int64_t j) { return 0.01 * static_cast<double>(j); }

Data make_data(const Config& c, const Device& device, std::mt19937_64& gen) {
  std::vector<std::array<double, 3>> candidates;  // x, t, u
  for (int64_t i = 0; i < kGridX; ++i)
    candidates.push_back({grid_x(i), 0.0, -std::sin(std::numbers::pi * grid_x(i))});
  for (double side : {-1.0, 1.0})
    for (int64_t j = 0; j < kGridT; ++j) candidates.push_back({side, grid_t(j), 0.0});
  EMBER_CHECK(c.n_u <= static_cast<int64_t>(candidates.size()),
              "pinn: --n-u {} is more than the {} initial and boundary points", c.n_u,
              candidates.size());
  std::shuffle(candidates.begin(), candidates.end(), gen);
  std::vector<double> xt_u, u, x_f, t_f;
  for (int64_t i = 0; i < c.n_u; ++i) {
    const auto [x, t, value] = candidates[i];
    xt_u.insert(xt_u.end(), {x, t});
    u.push_back(value);
    x_f.push_back(x), t_f.push_back(t);
  }
  for (const auto& p : burgers::latin_hypercube(c.n_f, {{-1.0, 1.0}, {0.0, 1.0}}, gen))
    x_f.push_back(p[0]), t_f.push_back(p[1]);
  const int64_t n_f = static_cast<int64_t>(x_f.size());
  const auto on_device = [&](const std::vector<double>& v, Shape shape) {
    return from_vector(v, std::move(shape), c.dtype).to(device);
  };
  return {on_device(xt_u, {c.n_u, 2}), on_device(u, {c.n_u, 1}),
          on_device(x_f, {n_f, 1}).requires_grad_(), on_device(t_f, {n_f, 1}).requires_grad_()};
}

// The PDE's residual f = u_t + u u_x - nu u_xx at the collocation points, recorded (create_graph)
// so that the loss built on it can be differentiated with respect to the parameters.
Tensor residual(const Net& net, const Data& d) {
  const Tensor u = net.forward(cat({d.x_f, d.t_f}, 1));
  const std::vector<Tensor> du =
      autograd::grad({u}, {d.x_f, d.t_f}, {ones_like(u)}, std::nullopt, true);
  const Tensor& u_x = du[0];
  const Tensor& u_t = du[1];
  const Tensor u_xx = autograd::grad({u_x}, {d.x_f}, {ones_like(u_x)}, std::nullopt, true)[0];
  return u_t + u * u_x - u_xx * burgers::kNu;
}

// The same residual with the derivatives by forward mode: along x a jvp of a jvp (the inner
// level's tangent is u_x, and its tangent at the outer level u_xx), along t one jvp. The
// tangents' ops are recorded, so the loss differentiates with respect to the parameters.
Tensor residual_forward(const Net& net, const Data& d) {
  namespace fa = autograd::forward_ad;
  const Tensor x = d.x_f.detach(), t = d.t_f.detach(), one = ones_like(x);
  Tensor u, u_x, u_xx, u_t;
  {
    fa::DualLevel outer;
    const Tensor x_outer = fa::make_dual(x, one);
    Tensor du;  // u_x, carrying u_xx at the outer level
    {
      fa::DualLevel inner;
      const fa::UnpackedDual y =
          fa::unpack_dual(net.forward(cat({fa::make_dual(x_outer, one), t}, 1)));
      u = y.primal, du = y.tangent;
    }
    const fa::UnpackedDual second = fa::unpack_dual(du);
    u_x = second.primal, u_xx = second.tangent;
    u = fa::unpack_dual(u).primal;
  }
  {
    fa::DualLevel along_t;
    u_t = fa::unpack_dual(net.forward(cat({x, fa::make_dual(t, one)}, 1))).tangent;
  }
  return u_t + u * u_x - u_xx * burgers::kNu;
}

// MSE_u + MSE_f, as the paper's loss.
Tensor loss_of(const Net& net, const Data& d, bool forward_derivatives) {
  const Tensor f = forward_derivatives ? residual_forward(net, d) : residual(net, d);
  return mse_loss(net.forward(d.xt_u), d.u) + pow(f, 2).mean();
}

struct Evaluation {
  Tensor predicted, exact;  // (256, 100): x down, t across
  double rel_l2_error;
};

Evaluation evaluate(const Net& net, DType dtype, const Device& device) {
  NoGradGuard no_grad;
  const burgers::Quadrature q = burgers::gauss_hermite(200);
  std::vector<double> points, exact;
  for (int64_t i = 0; i < kGridX; ++i)
    for (int64_t j = 0; j < kGridT; ++j) {
      points.insert(points.end(), {grid_x(i), grid_t(j)});
      exact.push_back(burgers::exact(grid_t(j), grid_x(i), q));
    }
  Evaluation e{net.forward(from_vector(points, {kGridX * kGridT, 2}, dtype).to(device))
                   .reshape({kGridX, kGridT})
                   .cpu(),
               from_vector(exact, {kGridX, kGridT}, kFloat64), 0.0};
  const Tensor diff = e.predicted.to(kFloat64) - e.exact;
  e.rel_l2_error =
      std::sqrt((diff * diff).sum().item<double>() / (e.exact * e.exact).sum().item<double>());
  return e;
}

// solution.svg: the prediction beside the exact u(t, x) and their difference, as the paper's
// Figure 1; the difference is scaled by a power of ten (named in its title) to share the
// colour bar.
void draw_solution(const Evaluation& e, const std::string& path) {
  const Tensor diff = e.predicted.to(kFloat64) - e.exact;
  const double largest = diff.abs().max().item<double>();
  const int exponent = largest > 0 ? static_cast<int>(std::floor(-std::log10(largest))) : 0;
  const Tensor panels =
      stack({e.predicted.to(kFloat64), e.exact, diff * std::pow(10.0, exponent)}).unsqueeze(0);
  viz::show_heatmaps(
      panels, path, "t index j (t = 0.01 j)", "x index i (x = -1 + 2i / 255)",
      {"predicted u(t, x)", "exact u(t, x)",
       exponent == 0 ? std::string("difference") : fmt::format("difference x 1e{}", exponent)},
      "viridis");
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Physics-informed network for Burgers' equation (Raissi et al. 2019)"};
  Config c;
  std::string out = "out/pinn";
  app.add_option("--layers", c.layers, "Linear layers (layers - 1 hidden tanh layers)")
      ->check(program::finite_in(2, 64));
  app.add_option("--width", c.width, "units per hidden layer")->check(program::finite_in(1, 4096));
  app.add_option("--n-u", c.n_u, "initial and boundary training points (at most 456)")
      ->check(program::finite_in(1, 456));
  app.add_option("--n-f", c.n_f, "collocation points (Latin hypercube)")
      ->check(program::finite_in(1, 1e7));
  app.add_option("--adam-iters", c.adam_iters, "Adam steps first")->check(program::count(0));
  app.add_option("--adam-lr", c.adam_lr, "Adam learning rate")->check(program::positive());
  app.add_option("--lbfgs-iters", c.lbfgs_iters, "then L-BFGS iterations (strong Wolfe)")
      ->check(program::count(0));
  app.add_option("--lbfgs-round", c.lbfgs_round,
                 "restart L-BFGS (drop its history) every this many iterations; 0: never")
      ->check(program::count(0));
  app.add_option("--lbfgs-curvature-eps", c.lbfgs_curvature_eps,
                 "L-BFGS keeps a curvature pair when y.s exceeds this (torch: 1e-10)")
      ->check(program::finite_in(0, 1));
  std::string dtype = "float32";
  app.add_option("--dtype", dtype, "float32 (as the paper's) or float64")
      ->check(CLI::IsMember({"float32", "float64"}));
  app.add_option("--seed", c.seed, "random seed (data and initial weights)");
  std::string derivatives = "reverse";
  app.add_option("--derivatives", derivatives,
                 "the residual's u_t, u_x, u_xx by reverse mode (autograd::grad) or by nested "
                 "forward mode")
      ->check(CLI::IsMember({"forward", "reverse"}));
  program::add_threads_option(app, c.threads);
  program::add_device_option(app, c.device);
  app.add_option("--out", out, "output directory");
  return program::run("pinn", app, argc, argv, [&] {
    program::prepare_out_dir(out,
                             {"metrics.json", "model.safetensors", "solution.svg", "loss.svg"});
    set_num_threads(c.threads);
    c.dtype = dtype == "float64" ? kFloat64 : kFloat32;
    c.forward_derivatives = derivatives == "forward";
    const Device device = program::device_of(c.device);
    manual_seed(c.seed);
    std::mt19937_64 gen(c.seed);
    const Data data = make_data(c, device, gen);
    Net net(c.layers, c.width);  // initialised on the host: the same weights on any device
    net.to(c.dtype);
    net.to(device);
    const std::vector<Tensor> params = net.parameters();
    int64_t n_params = 0;
    for (const Tensor& p : params) n_params += p.numel();
    fmt::print("Burgers PINN: {} Linear layers of width {}, {} parameters; N_u {}, N_f {}; on {}\n",
               c.layers, c.width, n_params, c.n_u, c.n_f, device.str());

    std::vector<double> adam_loss, lbfgs_loss;
    const auto start = std::chrono::steady_clock::now();
    const auto check = [](double loss, std::string_view phase, size_t at) {
      if (!std::isfinite(loss))
        throw program::Diverged(
            fmt::format("training diverged: the loss is {} at {} evaluation {}; nothing saved "
                        "(lower --adam-lr)",
                        loss, phase, at));
    };
    optim::Adam adam(params, {.lr = c.adam_lr});
    for (int64_t it = 1; it <= c.adam_iters; ++it) {
      adam.zero_grad();
      Tensor loss = loss_of(net, data, c.forward_derivatives);
      adam_loss.push_back(loss.item<double>());
      check(adam_loss.back(), "Adam", adam_loss.size());
      loss.backward();
      adam.step();
      if (it % 500 == 0 || it == c.adam_iters)
        fmt::print("Adam {:>6}  loss {:.3e}\n", it, adam_loss.back());
    }
    // L-BFGS in rounds of at most --lbfgs-round iterations (0: one round), each a fresh optimizer:
    // its history dropped, where a long run's curvature pairs have gone stale.
    int64_t lbfgs_done = 0;
    while (lbfgs_done < c.lbfgs_iters) {
      const int64_t iters =
          std::min(c.lbfgs_iters - lbfgs_done, c.lbfgs_round > 0 ? c.lbfgs_round : c.lbfgs_iters);
      optim::LBFGS lbfgs(params, {.lr = 1,
                                  .max_iter = iters,
                                  .max_eval = iters * 5 / 4,
                                  .tolerance_grad = 1e-9,
                                  .tolerance_change = 1e-12,
                                  .history_size = 50,
                                  .line_search_fn = "strong_wolfe",
                                  .curvature_eps = c.lbfgs_curvature_eps});
      lbfgs.step([&] {
        lbfgs.zero_grad();
        Tensor loss = loss_of(net, data, c.forward_derivatives);
        lbfgs_loss.push_back(loss.item<double>());
        check(lbfgs_loss.back(), "L-BFGS", lbfgs_loss.size());
        loss.backward();
        if (lbfgs_loss.size() % 500 == 0)
          fmt::print("L-BFGS evaluation {:>6}  loss {:.3e}\n", lbfgs_loss.size(),
                     lbfgs_loss.back());
        return loss;
      });
      lbfgs_done += lbfgs.n_iter();
      // A round that stopped short converged or spent its evaluations: the last one, unless
      // rounds restart it.
      if (lbfgs.n_iter() == 0 || (lbfgs.n_iter() < iters && c.lbfgs_round == 0)) break;
    }
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

    const Evaluation e = evaluate(net, c.dtype, device);
    nn::save(net, out + "/model.safetensors");
    draw_solution(e, out + "/solution.svg");
    std::vector<double> adam_at, lbfgs_at, adam_log, lbfgs_log;
    for (size_t i = 0; i < adam_loss.size(); ++i)
      adam_at.push_back(static_cast<double>(i + 1)), adam_log.push_back(std::log10(adam_loss[i]));
    for (size_t i = 0; i < lbfgs_loss.size(); ++i)
      lbfgs_at.push_back(static_cast<double>(adam_loss.size() + i + 1)),
          lbfgs_log.push_back(std::log10(lbfgs_loss[i]));
    viz::Figure figure("loss evaluation", "log10 loss");
    if (!adam_log.empty()) figure.add_line(adam_at, adam_log, "Adam");
    if (!lbfgs_log.empty()) figure.add_line(lbfgs_at, lbfgs_log, "L-BFGS");
    figure.save(out + "/loss.svg");
    const Json metrics = {
        {"config",
         {{"layers", c.layers},
          {"width", c.width},
          {"n_u", c.n_u},
          {"n_f", c.n_f},
          {"adam_lr", c.adam_lr},
          {"lbfgs_round", c.lbfgs_round},
          {"lbfgs_curvature_eps", c.lbfgs_curvature_eps},
          {"dtype", dtype},
          {"derivatives", derivatives},
          {"seed", c.seed},
          {"threads", get_num_threads()},
          {"device", device.str()},
          {"gpu", program::device_model(device)}}},
        {"rel_l2_error", e.rel_l2_error},
        {"train_seconds", seconds},
        {"adam_iters", c.adam_iters},
        {"lbfgs_iters", lbfgs_done},
        {"lbfgs_evaluations", lbfgs_loss.size()},
        {"final_loss",
         lbfgs_loss.empty() ? (adam_loss.empty() ? NAN : adam_loss.back()) : lbfgs_loss.back()},
        {"loss_history", {{"adam", adam_loss}, {"lbfgs", lbfgs_loss}}}};
    program::write_text(out + "/metrics.json", metrics.dump(2) + "\n");
    fmt::print(
        "relative L2 error {:.3e} after {} Adam steps and {} L-BFGS iterations, {:.1f} s; wrote "
        "{}/{{metrics.json, model.safetensors, solution.svg, loss.svg}}\n",
        e.rel_l2_error, c.adam_iters, lbfgs_done, seconds, out);
    return 0;
  });
}
