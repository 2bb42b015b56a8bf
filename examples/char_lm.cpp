// A character-level GPT on real text (issue 16): the decoder-only model the Annotated
// Transformer closes on, built from Ember's pieces as nanoGPT's model.py builds it. Token and
// learned position embeddings, pre-norm blocks (x + attn(ln_1(x)), x + mlp(ln_2(x))) of causal
// self-attention and a GELU MLP, a final LayerNorm, and an output layer tied to the token
// embedding; weights N(0, 0.02), the residual projections N(0, 0.02 / sqrt(2 layers)), no biases.
// Trained as nanoGPT's train.py: AdamW (betas 0.9 / 0.99, decay 0.1 on the matrices only), linear
// warmup then cosine decay to --min-lr, gradient clipping at 1, random windows of the text.
//
// The text: every fortune file of Debian's `fortunes` package (the files in --data without a
// dot in their name, in name order, concatenated), about 2.6 million characters; the first 90%
// is train, the rest validation; the vocabulary is the text's distinct characters (UTF-8 code
// points), in code point order.
//
// A run saves a training checkpoint (train/checkpoint.h) after every evaluation; `--resume DIR`
// continues it up to --iters, bit for bit as a run never stopped. `--load DIR --sample N
// --prompt TEXT` generates text without training.
//
//   char_lm --out out/char_lm                                  train (nanoGPT's CPU config)
//   char_lm --resume out/char_lm --iters 4000                  continue, further
//   char_lm --load out/char_lm --sample 300 --prompt "Love"     generate
//   char_lm --device cuda --out out/char_lm_gpu                  train on the GPU
#include <sys/resource.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <numbers>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "ember.h"
#include "program.h"
#include "train/checkpoint.h"

using namespace ember;
using Clock = std::chrono::steady_clock;
using Json = nlohmann::ordered_json;

namespace {

struct Config {
  // The model (nanoGPT's CPU config of its README).
  int64_t layers = 4, heads = 4, d_model = 128, block = 64;
  double dropout = 0.0;
  // Training.
  int64_t batch = 12, iters = 2000, warmup = 100, lr_decay_iters = 0;  // 0: --iters
  double lr = 1e-3, min_lr = 1e-4, weight_decay = 0.1, beta2 = 0.99, clip = 1.0;
  int64_t eval_interval = 250, eval_iters = 20;
  uint64_t seed = 1337;
  std::string data = "/usr/share/games/fortunes";
  std::string matmul_precision = "highest";
  // How this process runs, not what it computes: may change on --resume.
  int threads = 0;
  std::string device = "cpu";
  int64_t log_every = 50, max_steps = 0;
  program::OnNonfinite on_nonfinite = program::OnNonfinite::kStop;
  // Sampling (nanoGPT's sample.py).
  int64_t sample = 300, top_k = 200;
  double temperature = 0.8;
  std::string prompt = "\n";
};

// What a run computes with: metrics.json's "config" and DIR/run.json, which --resume reads
// (program::config_to_json / resume_config; --iters may change on --resume, so a run can be
// extended; threads, logging and --max-steps are the process's own).
template <class F>
void config_fields(Config& c, F&& f) {
  f("data", c.data);
  f("layers", c.layers);
  f("heads", c.heads);
  f("d_model", c.d_model);
  f("block", c.block);
  f("dropout", c.dropout);
  f("batch", c.batch);
  f("iters", c.iters);
  f("warmup", c.warmup);
  f("lr_decay_iters", c.lr_decay_iters);
  f("lr", c.lr);
  f("min_lr", c.min_lr);
  f("weight_decay", c.weight_decay);
  f("beta2", c.beta2);
  f("clip", c.clip);
  f("eval_interval", c.eval_interval);
  f("eval_iters", c.eval_iters);
  f("seed", c.seed);
  f("matmul_precision", c.matmul_precision);
}

Json config_json(const Config& c) {
  return program::config_to_json(c, [](Config& x, auto f) { config_fields(x, f); });
}

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// --- the text

// The UTF-8 code points of text, one string each (a stray byte stands for itself).
std::vector<std::string> characters(const std::string& text) {
  std::vector<std::string> out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    const auto lead = static_cast<unsigned char>(text[i]);
    size_t n = lead < 0x80           ? 1
               : (lead >> 5) == 0x6  ? 2
               : (lead >> 4) == 0xE  ? 3
               : (lead >> 3) == 0x1E ? 4
                                     : 1;
    if (i + n > text.size()) n = 1;
    out.push_back(text.substr(i, n));
    i += n;
  }
  return out;
}

// The character vocabulary: itos in code point order (UTF-8 byte order is the same).
struct Vocabulary {
  std::vector<std::string> itos;
  std::map<std::string, int64_t> stoi;

  explicit Vocabulary(std::vector<std::string> chars) : itos(std::move(chars)) {
    for (size_t i = 0; i < itos.size(); ++i) stoi[itos[i]] = static_cast<int64_t>(i);
  }
  int64_t size() const { return static_cast<int64_t>(itos.size()); }
  std::vector<int64_t> encode(const std::string& text, const std::string& what) const {
    std::vector<int64_t> ids;
    for (const std::string& ch : characters(text)) {
      const auto it = stoi.find(ch);
      EMBER_CHECK(it != stoi.end(), "{}: the character '{}' is not in the vocabulary", what, ch);
      ids.push_back(it->second);
    }
    return ids;
  }
  std::string decode(const std::vector<int64_t>& ids) const {
    std::string s;
    for (int64_t id : ids) s += itos.at(static_cast<size_t>(id));
    return s;
  }
};

struct Text {
  std::vector<std::string> files;
  Vocabulary vocab{{}};
  std::vector<int64_t> train, val;
};

// Reads --data (a directory of fortune files, or one file), splits 90/10 and encodes.
Text read_text(const std::string& data) {
  namespace fs = std::filesystem;
  Text t;
  if (fs::is_directory(data)) {
    for (const auto& entry : fs::directory_iterator(data))
      if (entry.is_regular_file() && !entry.is_symlink() &&
          entry.path().filename().string().find('.') == std::string::npos)
        t.files.push_back(entry.path().string());
    std::sort(t.files.begin(), t.files.end());
  } else if (fs::is_regular_file(data)) {
    t.files.push_back(data);
  }
  EMBER_CHECK(!t.files.empty(),
              "char_lm: no text in {}; install the Debian package fortunes (make deps) or point "
              "--data at a text file or directory",
              data);
  std::string text;
  for (const std::string& f : t.files) {
    std::ifstream in(f, std::ios::binary);
    EMBER_CHECK(in.good(), "char_lm: cannot read {}", f);
    text.append(std::istreambuf_iterator<char>(in), {});
  }
  const std::vector<std::string> chars = characters(text);
  std::set<std::string> distinct(chars.begin(), chars.end());
  t.vocab = Vocabulary({distinct.begin(), distinct.end()});
  const size_t n_train = chars.size() * 9 / 10;
  for (size_t i = 0; i < chars.size(); ++i)
    (i < n_train ? t.train : t.val).push_back(t.vocab.stoi.at(chars[i]));
  return t;
}

// --- the model (nanoGPT's model.py)

struct CausalSelfAttention : nn::Cloneable<CausalSelfAttention> {
  CausalSelfAttention(int64_t d_model, int64_t heads, double dropout)
      : heads(heads), dropout(dropout) {
    register_module("c_attn", c_attn, std::make_shared<nn::Linear>(d_model, 3 * d_model, false));
    register_module("c_proj", c_proj, std::make_shared<nn::Linear>(d_model, d_model, false));
    register_module("resid_dropout", resid_dropout, std::make_shared<nn::Dropout>(dropout));
  }
  // (B, T, C) -> (B, T, C): heads of causal attention over C / heads features each.
  Tensor forward(const Tensor& x) const {
    const int64_t B = x.size(0), T = x.size(1), C = x.size(2);
    const std::vector<Tensor> qkv = c_attn->forward(x).split(C, 2);
    const auto by_head = [&](const Tensor& t) {
      return t.reshape({B, T, heads, C / heads}).transpose(1, 2);  // (B, heads, T, C / heads)
    };
    const Tensor y = scaled_dot_product_attention(by_head(qkv[0]), by_head(qkv[1]), by_head(qkv[2]),
                                                  {}, is_training() ? dropout : 0.0, true);
    return resid_dropout->forward(c_proj->forward(y.transpose(1, 2).reshape({B, T, C})));
  }
  int64_t heads;
  double dropout;
  std::shared_ptr<nn::Linear> c_attn, c_proj;
  std::shared_ptr<nn::Dropout> resid_dropout;
};

struct MLP : nn::Cloneable<MLP> {
  MLP(int64_t d_model, double dropout) {
    register_module("c_fc", c_fc, std::make_shared<nn::Linear>(d_model, 4 * d_model, false));
    register_module("c_proj", c_proj, std::make_shared<nn::Linear>(4 * d_model, d_model, false));
    register_module("dropout", dropout_, std::make_shared<nn::Dropout>(dropout));
  }
  Tensor forward(const Tensor& x) const {
    return dropout_->forward(c_proj->forward(gelu(c_fc->forward(x))));
  }
  std::shared_ptr<nn::Linear> c_fc, c_proj;
  std::shared_ptr<nn::Dropout> dropout_;
};

struct Block : nn::Cloneable<Block> {
  Block(int64_t d_model, int64_t heads, double dropout) {
    register_module("ln_1", ln_1, std::make_shared<nn::LayerNorm>(d_model, 1e-5, true, false));
    register_module("attn", attn, std::make_shared<CausalSelfAttention>(d_model, heads, dropout));
    register_module("ln_2", ln_2, std::make_shared<nn::LayerNorm>(d_model, 1e-5, true, false));
    register_module("mlp", mlp, std::make_shared<MLP>(d_model, dropout));
  }
  Tensor forward(const Tensor& x) const {
    const Tensor h = x + attn->forward(ln_1->forward(x));
    return h + mlp->forward(ln_2->forward(h));
  }
  std::shared_ptr<nn::LayerNorm> ln_1, ln_2;
  std::shared_ptr<CausalSelfAttention> attn;
  std::shared_ptr<MLP> mlp;
};

struct GPT : nn::Cloneable<GPT> {
  GPT(int64_t vocab, int64_t block, int64_t layers, int64_t heads, int64_t d_model, double dropout)
      : block(block) {
    register_module("wte", wte, std::make_shared<nn::Embedding>(vocab, d_model));
    register_module("wpe", wpe, std::make_shared<nn::Embedding>(block, d_model));
    register_module("drop", drop, std::make_shared<nn::Dropout>(dropout));
    register_module("h", h, std::make_shared<nn::ModuleList>());
    for (int64_t i = 0; i < layers; ++i)
      h->push_back(std::make_shared<Block>(d_model, heads, dropout));
    register_module("ln_f", ln_f, std::make_shared<nn::LayerNorm>(d_model, 1e-5, true, false));
    // nanoGPT's _init_weights, then the residual projections scaled by 1 / sqrt(2 layers).
    NoGradGuard no_grad;
    for (auto& [name, p] : named_parameters()) {
      if (name.ends_with("c_proj.weight"))
        nn::init::normal_(p, 0.0, 0.02 / std::sqrt(2.0 * static_cast<double>(layers)));
      else if (p.dim() == 2)
        nn::init::normal_(p, 0.0, 0.02);
    }
  }
  // idx (B, T) Int64, T <= block -> logits (B, T, vocab); the output layer is wte's weight.
  Tensor forward(const Tensor& idx) const {
    const int64_t T = idx.size(1);
    EMBER_CHECK(T <= block, "GPT: a sequence of {} tokens is longer than the block size {}", T,
                block);
    Tensor x =
        drop->forward(wte->forward(idx) + wpe->forward(arange(0, T, 1, kInt64, idx.device())));
    for (const auto& layer : *h) x = static_cast<const Block&>(*layer).forward(x);
    return linear(ln_f->forward(x), wte->weight);
  }
  int64_t block;
  std::shared_ptr<nn::Embedding> wte, wpe;
  std::shared_ptr<nn::Dropout> drop;
  std::shared_ptr<nn::ModuleList> h;
  std::shared_ptr<nn::LayerNorm> ln_f;
};

// nanoGPT's get_lr: linear warmup over `warmup` iterations, then cosine decay to min_lr at
// lr_decay_iters, min_lr after.
double learning_rate(int64_t it, const Config& c) {
  const int64_t decay_iters = c.lr_decay_iters > 0 ? c.lr_decay_iters : c.iters;
  if (it < c.warmup) return c.lr * static_cast<double>(it + 1) / static_cast<double>(c.warmup + 1);
  if (it > decay_iters) return c.min_lr;
  const double ratio = static_cast<double>(it - c.warmup) /
                       static_cast<double>(std::max<int64_t>(decay_iters - c.warmup, 1));
  return c.min_lr + 0.5 * (1.0 + std::cos(std::numbers::pi * ratio)) * (c.lr - c.min_lr);
}

// Random windows of `data`: x (batch, block) and y, x shifted by one (nanoGPT's get_batch),
// offsets from the global generator, on `device`.
std::pair<Tensor, Tensor> get_batch(const std::vector<int64_t>& data, const Config& c,
                                    const Device& device) {
  const auto n = static_cast<int64_t>(data.size());
  const std::vector<int64_t> offsets = randint(0, n - c.block, {c.batch}).to_vector<int64_t>();
  std::vector<int64_t> x, y;
  x.reserve(c.batch * c.block);
  y.reserve(c.batch * c.block);
  for (int64_t i : offsets) {
    x.insert(x.end(), data.begin() + i, data.begin() + i + c.block);
    y.insert(y.end(), data.begin() + i + 1, data.begin() + i + 1 + c.block);
  }
  return {from_vector(x, {c.batch, c.block}, device), from_vector(y, {c.batch, c.block}, device)};
}

Tensor lm_loss(const GPT& model, const Tensor& x, const Tensor& y) {
  const Tensor logits = model.forward(x);
  return cross_entropy(logits.reshape({-1, logits.size(-1)}), y.reshape({-1}));
}

// Text after `prompt`: each step the model's next-character distribution over the last block
// characters, divided by the temperature, cut to the top_k most likely (0: all), sampled with
// multinomial from the global generator.
std::string generate(GPT& model, const Vocabulary& vocab, const std::string& prompt, int64_t n,
                     double temperature, int64_t top_k) {
  NoGradGuard no_grad;
  model.eval();
  std::vector<int64_t> ids = vocab.encode(prompt, "--prompt");
  EMBER_CHECK(!ids.empty(), "--prompt: an empty prompt gives the model nothing to continue");
  const size_t start = ids.size();
  for (int64_t i = 0; i < n; ++i) {
    const auto T = std::min<int64_t>(static_cast<int64_t>(ids.size()), model.block);
    const std::vector<int64_t> window(ids.end() - T, ids.end());
    const Device device = model.wte->weight.device();
    Tensor logits =
        model.forward(from_vector(window, {1, T}, device)).select(1, T - 1) / temperature;
    if (top_k > 0) {
      const Tensor values = topk(logits, std::min(top_k, vocab.size())).values;
      logits = logits.masked_fill(logits < values.narrow(-1, values.size(-1) - 1, 1), -INFINITY);
    }
    ids.push_back(multinomial(softmax(logits, -1), 1).item<int64_t>());
  }
  return vocab.decode({ids.begin() + static_cast<std::ptrdiff_t>(start), ids.end()});
}

// --- a run

// Where a run is, besides model, optimizer, schedule and generator: its checkpoint's counters
// (program::Counters: doubles travel as their bit patterns).
struct Progress {
  int64_t iter = 0;              // training steps done
  double train_seconds = 0;      // their time
  std::vector<int64_t> eval_at;  // iterations evaluated
  std::vector<double> train_loss, val_loss;

  std::map<std::string, int64_t> counters() const {
    program::Counters c;
    c.put("iter", iter);
    c.put("evals", static_cast<int64_t>(eval_at.size()));
    c.put_real("train_seconds", train_seconds);
    for (size_t i = 0; i < eval_at.size(); ++i) {
      c.put(fmt::format("eval.{}.iter", i), eval_at[i]);
      c.put_real(fmt::format("eval.{}.train_loss", i), train_loss[i]);
      c.put_real(fmt::format("eval.{}.val_loss", i), val_loss[i]);
    }
    return c.values();
  }
  static Progress from(std::map<std::string, int64_t> m, const std::string& path) {
    const program::Counters c(std::move(m), path);
    Progress p;
    p.iter = c.get("iter");
    p.train_seconds = c.get_real("train_seconds");
    const int64_t evals = c.get("evals");
    EMBER_CHECK(p.iter >= 0 && evals >= 0 && evals <= p.iter + 1,
                "--resume: '{}' has iter {} and {} evaluations", path, p.iter, evals);
    for (int64_t i = 0; i < evals; ++i) {
      p.eval_at.push_back(c.get(fmt::format("eval.{}.iter", i)));
      p.train_loss.push_back(c.get_real(fmt::format("eval.{}.train_loss", i)));
      p.val_loss.push_back(c.get_real(fmt::format("eval.{}.val_loss", i)));
    }
    return p;
  }
  bool evaluated(int64_t it) const { return !eval_at.empty() && eval_at.back() == it; }
};

std::map<std::string, std::string> model_metadata(const Config& c, const Vocabulary& vocab) {
  return {{"format", "pt"},
          {"layers", std::to_string(c.layers)},
          {"heads", std::to_string(c.heads)},
          {"d_model", std::to_string(c.d_model)},
          {"block", std::to_string(c.block)},
          {"vocab", Json(vocab.itos).dump()}};
}

class Trainer {
 public:
  Trainer(const Config& c, const Text& text, std::string out)
      : c_(c),
        text_(text),
        out_(std::move(out)),
        device_(program::device_of(c.device)),
        model_(std::make_shared<GPT>(text.vocab.size(), c.block, c.layers, c.heads, c.d_model,
                                     c.dropout)),
        optimizer_(groups(*model_, c)),
        scheduler_(optimizer_, [&c](int64_t it) { return learning_rate(it, c) / c.lr; }),
        guard_(c.on_nonfinite, model_->parameters()) {
    model_->to(device_);  // in place: the optimizer's parameters go with it
  }

  Progress progress;
  GPT& model() { return *model_; }

  std::string checkpoint_path() const { return out_ + "/checkpoint.safetensors"; }
  void checkpoint() {
    save_checkpoint(checkpoint_path(), *model_, optimizer_, &scheduler_, progress.counters());
  }
  // Continues the checkpointed run. An evaluation the run made only because it ended there (an
  // earlier --iters) is not one this run makes, so it is dropped: a run extended from any
  // iteration ends as one never stopped.
  void resume() {
    progress = Progress::from(load_checkpoint(checkpoint_path(), *model_, optimizer_, &scheduler_),
                              checkpoint_path());
    Progress& p = progress;
    for (size_t i = p.eval_at.size(); i-- > 0;) {
      if (evaluates_at(p.eval_at[i])) continue;
      p.eval_at.erase(p.eval_at.begin() + static_cast<std::ptrdiff_t>(i));
      p.train_loss.erase(p.train_loss.begin() + static_cast<std::ptrdiff_t>(i));
      p.val_loss.erase(p.val_loss.begin() + static_cast<std::ptrdiff_t>(i));
    }
  }
  // Whether this run evaluates at iteration `it`: every --eval-interval and at the end.
  bool evaluates_at(int64_t it) const { return it % c_.eval_interval == 0 || it == c_.iters; }

  // Trains up to --iters, evaluating every --eval-interval iterations and at the end. False when
  // --max-steps stopped it first (after a checkpoint).
  bool train() {
    Progress& p = progress;
    int64_t steps = 0;
    double window_seconds = 0;
    for (;; ++p.iter) {
      if (evaluates_at(p.iter) && !p.evaluated(p.iter)) {
        evaluate();
        checkpoint();
      }
      if (p.iter >= c_.iters) return true;
      if (c_.max_steps > 0 && steps == c_.max_steps) {
        checkpoint();
        return false;
      }
      const auto start = Clock::now();
      model_->train();
      const auto [x, y] = get_batch(text_.train, c_, device_);
      const Tensor loss = lm_loss(*model_, x, y);
      const double value = loss.item<double>();
      const auto where = [&] { return fmt::format("iteration {}", p.iter); };
      if (guard_.loss_ok(value, where)) {
        loss.backward();
        if (guard_.gradients_ok(where)) {
          optim::clip_grad_norm_(model_->parameters(), c_.clip);
          optimizer_.step();
        }
        optimizer_.zero_grad();
      }
      scheduler_.step();
      profile::step();  // EMBER_PROFILE's per-step shares
      const double seconds = seconds_since(start);
      p.train_seconds += seconds;
      window_seconds += seconds;
      ++steps;
      if ((p.iter + 1) % c_.log_every == 0) {
        fmt::print("iter {}: loss {:.4f}, {:.1f} ms/iter, lr {:.2e}\n", p.iter + 1, value,
                   1e3 * window_seconds / static_cast<double>(c_.log_every), optimizer_.lr());
        std::fflush(stdout);
        window_seconds = 0;
      }
    }
  }

  // Mean loss over --eval-iters random batches of each split (eval mode, no graph). The batches
  // come from a stream of their own, seeded by --seed and the iteration, and the training
  // stream is put back after: where a run evaluates (or ends, or is stopped) changes no training
  // batch, so a run stopped anywhere and resumed trains as one never stopped. (nanoGPT's
  // estimate_loss draws from the training stream.)
  void evaluate() {
    NoGradGuard no_grad;
    model_->eval();
    const Tensor training_stream = get_rng_state();
    manual_seed(counter_bits(c_.seed, static_cast<uint64_t>(progress.iter)));
    double mean[2] = {0, 0};
    for (int s = 0; s < 2; ++s) {
      for (int64_t i = 0; i < c_.eval_iters; ++i) {
        const auto [x, y] = get_batch(s == 0 ? text_.train : text_.val, c_, device_);
        mean[s] += lm_loss(*model_, x, y).item<double>();
      }
      mean[s] /= static_cast<double>(c_.eval_iters);
    }
    set_rng_state(training_stream);
    guard_.check_loss(mean[1], fmt::format("the validation loss at iteration {}", progress.iter));
    progress.eval_at.push_back(progress.iter);
    progress.train_loss.push_back(mean[0]);
    progress.val_loss.push_back(mean[1]);
    fmt::print("step {}: train loss {:.4f}, val loss {:.4f}\n", progress.iter, mean[0], mean[1]);
    std::fflush(stdout);
  }

 private:
  // Two AdamW groups, as nanoGPT's configure_optimizers: weight decay on the matrices
  // (embeddings and linear weights), none on the LayerNorm weights.
  static std::vector<optim::ParamGroup<optim::AdamWOptions>> groups(const GPT& model,
                                                                    const Config& c) {
    std::vector<Tensor> decay, no_decay;
    for (const Tensor& p : model.parameters()) (p.dim() >= 2 ? decay : no_decay).push_back(p);
    const optim::AdamWOptions o{.lr = c.lr, .beta1 = 0.9, .beta2 = c.beta2, .eps = 1e-8};
    optim::AdamWOptions d = o, n = o;
    d.weight_decay = c.weight_decay;
    n.weight_decay = 0;
    return {{decay, d}, {no_decay, n}};
  }

  const Config& c_;
  const Text& text_;
  std::string out_;
  Device device_;  // --device: the model and every batch live there
  std::shared_ptr<GPT> model_;
  optim::AdamW optimizer_;
  optim::LambdaLR scheduler_;
  program::NonfiniteGuard guard_;
};

double peak_rss_mb() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_maxrss) / 1024.0;
}

int train(const Config& c, const std::string& out, bool resume) {
  const Text text = read_text(c.data);
  fmt::print("{} files, {} characters: train {}, val {}; vocabulary {}\n", text.files.size(),
             text.train.size() + text.val.size(), text.train.size(), text.val.size(),
             text.vocab.size());
  EMBER_CHECK(static_cast<int64_t>(text.val.size()) > c.block,
              "char_lm: the validation text ({} characters) is not longer than --block {}",
              text.val.size(), c.block);
  Trainer trainer(c, text, out);
  if (resume) {
    trainer.resume();
    fmt::print("resumed {} at iteration {}\n", out, trainer.progress.iter);
  } else {
    program::write_text(out + "/run.json", config_json(c).dump(2) + "\n");
  }
  if (!trainer.train()) {
    fmt::print("stopped after --max-steps {} steps; continue with --resume {}\n", c.max_steps, out);
    return 0;
  }
  const Progress& p = trainer.progress;
  nn::write_safetensors(out + "/model.safetensors", trainer.model().state_dict(),
                        model_metadata(c, text.vocab));
  viz::Animator animator("iteration", "loss", {"train", "val"},
                         std::pair<double, double>{0, static_cast<double>(c.iters)});
  for (size_t i = 0; i < p.eval_at.size(); ++i)
    animator.add(static_cast<double>(p.eval_at[i]), {p.train_loss[i], p.val_loss[i]});
  animator.save(out + "/loss.svg");
  const std::string sample =
      generate(trainer.model(), text.vocab, c.prompt, c.sample, c.temperature, c.top_k);
  fmt::print("sample:\n{}{}\n", c.prompt, sample);
  const double per_iter = p.train_seconds / static_cast<double>(std::max<int64_t>(p.iter, 1));
  Json config = config_json(c);
  config["threads"] = get_num_threads();
  config["device"] = c.device;
  config["gpu"] = program::device_model(program::device_of(c.device));
  config["bfloat16_products"] = float32_matmul_uses_bfloat16();
  const Json metrics = {{"config", config},
                        {"vocab_size", text.vocab.size()},
                        {"train_chars", text.train.size()},
                        {"val_chars", text.val.size()},
                        {"eval_iter", p.eval_at},
                        {"train_loss", p.train_loss},
                        {"val_loss", p.val_loss},
                        {"iters", p.iter},
                        {"train_seconds", p.train_seconds},
                        {"ms_per_iter", 1e3 * per_iter},
                        {"tokens_per_second", static_cast<double>(c.batch * c.block) / per_iter},
                        {"peak_rss_mb", peak_rss_mb()},
                        {"prompt", c.prompt},
                        {"sample", sample}};
  program::write_text(out + "/metrics.json", metrics.dump(2) + "\n");
  fmt::print(
      "val loss {:.4f} after {} iterations, {:.1f} ms/iter; wrote {}/{{metrics.json, "
      "loss.svg, model.safetensors, checkpoint.safetensors, run.json}}\n",
      p.val_loss.back(), p.iter, 1e3 * per_iter, out);
  return 0;
}

// --load DIR: rebuilds the saved model from its metadata and prints --sample characters.
int sample_only(const std::string& dir, const Config& flags) {
  const std::string path = dir + "/model.safetensors";
  const nn::SafetensorsFile file = nn::read_safetensors(path);
  const auto meta = [&](const char* key) -> const std::string& {
    const auto it = file.metadata.find(key);
    EMBER_CHECK(it != file.metadata.end(), "--load: {} has no metadata '{}'", path, key);
    return it->second;
  };
  const auto count = [&](const char* key) {
    const int64_t v = std::stoll(meta(key));
    EMBER_CHECK(v >= 1 && v <= 65536, "--load: {} has {} = {}", path, key, v);
    return v;
  };
  const Vocabulary vocab(Json::parse(meta("vocab")).get<std::vector<std::string>>());
  const int64_t d_model = count("d_model"), heads = count("heads");
  EMBER_CHECK(d_model % heads == 0, "--load: {} has d_model {} and heads {}", path, d_model, heads);
  GPT model(vocab.size(), count("block"), count("layers"), heads, d_model, 0.0);
  nn::load(model, path);
  fmt::print("{}{}\n", flags.prompt,
             generate(model, vocab, flags.prompt, flags.sample, flags.temperature, flags.top_k));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Config c;
  std::string out = "out/char_lm", load, resume;
  CLI::App app{"A character-level GPT (nanoGPT's model) on the fortunes text"};
  const CLI::Validator positive = program::count(1), count = program::count(0);
  const std::vector<CLI::Option*> run_options = {
      app.add_option("--data", c.data, "a text file, or a directory of fortune files"),
      app.add_option("--layers", c.layers, "transformer blocks")->check(positive),
      app.add_option("--heads", c.heads, "attention heads")->check(positive),
      app.add_option("--d-model", c.d_model, "embedding width")->check(positive),
      app.add_option("--block", c.block, "context length")->check(positive),
      app.add_option("--dropout", c.dropout, "dropout probability")
          ->check(program::finite_in(0, 0.99)),
      app.add_option("--batch", c.batch, "sequences per batch")->check(positive),
      app.add_option("--warmup", c.warmup, "warmup iterations")->check(count),
      app.add_option("--lr-decay-iters", c.lr_decay_iters,
                     "iteration where the cosine reaches --min-lr (0: --iters)")
          ->check(count),
      app.add_option("--lr", c.lr, "peak learning rate")->check(program::positive()),
      app.add_option("--min-lr", c.min_lr, "final learning rate")->check(program::finite_in(0, 1)),
      app.add_option("--weight-decay", c.weight_decay, "AdamW decay of the matrices")
          ->check(program::finite_in(0, 1)),
      app.add_option("--beta2", c.beta2, "AdamW beta2")->check(program::finite_in(0, 0.9999)),
      app.add_option("--clip", c.clip, "gradient norm clipping")->check(program::positive()),
      app.add_option("--eval-interval", c.eval_interval, "iterations between evaluations")
          ->check(positive),
      app.add_option("--eval-iters", c.eval_iters, "batches per evaluation")->check(positive),
      app.add_option("--seed", c.seed, "random seed"),
      program::add_matmul_precision_option(app, c.matmul_precision)};
  CLI::Option* iters = app.add_option("--iters", c.iters, "training iterations")->check(count);
  app.add_option("--log-every", c.log_every, "iterations between progress lines")->check(positive);
  app.add_option("--max-steps", c.max_steps,
                 "stop after this many steps of this process (0: no limit); --resume continues")
      ->check(count);
  app.add_option("--sample", c.sample, "characters to generate")->check(count);
  app.add_option("--prompt", c.prompt, "text the sample continues");
  app.add_option("--temperature", c.temperature, "sampling temperature")
      ->check(program::finite_in(1e-3, 100));
  app.add_option("--top-k", c.top_k, "sample among the k likeliest characters (0: all)")
      ->check(count);
  program::add_on_nonfinite_option(app, c.on_nonfinite);
  program::add_threads_option(app, c.threads);
  program::add_device_option(app, c.device);
  CLI::Option* out_option = app.add_option("--out", out, "output directory");
  app.add_option("--resume", resume, "continue the run saved in this directory")
      ->check(CLI::ExistingDirectory);
  app.add_option("--load", load, "generate with the model saved in this directory")
      ->check(CLI::ExistingDirectory)
      ->excludes(out_option);
  return program::run("char_lm", app, argc, argv, [&] {
    if (!resume.empty()) {
      program::check_resume_out(out_option, out, resume);
      c = program::resume_config(
          resume, c, [](Config& x, auto f) { config_fields(x, f); }, run_options,
          iters->count() > 0 ? "iters" : "");
      out = resume;
    }
    if (c.d_model % c.heads != 0)
      throw CLI::ValidationError(
          "--d-model", fmt::format("{} is not a multiple of --heads {}", c.d_model, c.heads));
    set_num_threads(c.threads);
    set_float32_matmul_precision(c.matmul_precision);
    manual_seed(c.seed);
    if (!load.empty()) return sample_only(load, c);
    const double D = static_cast<double>(c.d_model), N = static_cast<double>(c.layers);
    const double tokens = static_cast<double>(c.batch) * static_cast<double>(c.block);
    program::check_memory(
        4 * (5 * 12 * N * D * D + tokens * N * (30 * D + 3 * c.heads * c.block)),
        fmt::format("training with --layers {} --d-model {} --block {} --batch {}", c.layers,
                    c.d_model, c.block, c.batch));
    if (resume.empty())
      program::prepare_out_dir(out, {"model.safetensors", "metrics.json", "loss.svg",
                                     "checkpoint.safetensors", "run.json"});
    return train(c, out, !resume.empty());
  });
}
