// The Annotated Transformer's first example, the copy task, in Ember: a model of vocabulary 11
// learns to reproduce random sequences `1 x x x x x x x x x`. The steps follow the original's
// notebook: make_model, LabelSmoothing, Adam with the `rate` schedule, run_epoch over data_gen
// batches (train, then evaluate), then greedy_decode. Ember decodes `1 2 ... 10` from start symbol
// 1 (the 2018 edition's convention, the symbol training puts first; the 2022 edition decodes
// `0 ... 9` from start symbol 0, a token the decoder never sees first in training, and goes wrong
// right after the start: harvardnlp/annotated-transformer issue 127), then measures exact copies
// over fresh sequences, draws the loss curve and the attention maps, and writes everything to
// --out. The task's data_gen and SimpleLossCompute are in examples/copy_task.h. Failures end as
// one line on stderr and a non-zero exit (examples/program.h): flags and the --load file are
// checked, memory estimated, before anything is built, and training stops on a non-finite loss.
// Under mpirun each process trains on its share of every batch (examples/data_parallel.h): the
// same training as one process with the same --batch, rank 0 printing and writing the files.
// With --device cuda the model is moved to the GPU and each batch after it: the script is the
// same (metrics.json records the device and the GPU's name).
//
//   transformer_copy                          train the original's config (N=2, d_model=512, ...)
//   mpirun -np 2 transformer_copy --threads 1 the same on 2 processes, 40 sequences each per batch
//   transformer_copy --device cuda            the same on the GPU (model and batches moved there)
//   transformer_copy --load out/transformer_copy/model.safetensors --decode "1 5 2 7"
#include <charconv>
#include <chrono>
#include <ctime>
#include <sstream>

#include <sys/resource.h>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "copy_task.h"
#include "data_parallel.h"
#include "ember.h"
#include "program.h"

using namespace ember;
using nn::Batch;
using nn::EncoderDecoder;
using Clock = std::chrono::steady_clock;

namespace {

constexpr int64_t V = 11;            // vocabulary: 0 (padding) and 1 .. 10
constexpr int64_t kMaxDecode = 256;  // --decode tokens at most (400 take 11 s at the default size)

struct Config {
  int64_t layers = 2, d_model = 512, d_ff = 2048, heads = 8;
  double dropout = 0.1;
  int64_t batch = 80, batches = 20, eval_batches = 5, epochs = 20, warmup = 400;
  double lr = 0.5;
  uint64_t seed = 0;
  std::string matmul_precision = "highest";
  std::string device = "cpu";
  int threads = 0;
  int64_t log_every = 5;
  program::OnNonfinite on_nonfinite = program::OnNonfinite::kStop;
};

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

std::string format_duration(double s) {
  const auto total = static_cast<int64_t>(s + 0.5);
  if (total < 60) return fmt::format("{}s", total);
  if (total < 3600) return fmt::format("{}m{:02}s", total / 60, total % 60);
  return fmt::format("{}h{:02}m", total / 3600, total % 3600 / 60);
}

// The original's TrainState, plus the epoch (for messages) and the wall time spent in training
// steps.
struct TrainState {
  int64_t epoch = 0;       // the current epoch, from 1
  int64_t step = 0;        // steps in the current epoch
  int64_t samples = 0;     // examples used
  int64_t tokens = 0;      // target tokens processed
  int64_t accum_step = 0;  // optimizer steps
  double train_seconds = 0;
};

// Progress for the ETA: optimizer steps done of all planned, since the run began.
struct Progress {
  Clock::time_point start = Clock::now();
  int64_t total_steps = 0;
  std::string eta(int64_t done) const {
    const double elapsed = seconds_since(start);
    const double left = done > 0 ? elapsed / done * static_cast<double>(total_steps - done) : 0;
    return fmt::format("elapsed {} | ETA {}", format_duration(elapsed), format_duration(left));
  }
};

// One pass over `data`. In training mode (an optimizer is given), each batch is a step: forward,
// loss, backward, optimizer and schedule; every log_every steps a progress line. The guard stops
// training on a non-finite loss or gradient, or skips the step (not counted in the loss).
// Returns the loss per token. With several processes, each runs its share of every batch, its
// loss divided by the batch's tokens / processes so that the ranks' mean (the gradient DDP
// averages) is the batch's loss per token; the losses shown are the sums over the ranks.
double run_epoch(const std::vector<Batch>& data, EncoderDecoder& model,
                 copy_task::SimpleLossCompute& loss_compute, optim::Optimizer* optimizer,
                 optim::LambdaLR* scheduler, TrainState& state, const Progress& progress,
                 int64_t log_every, program::NonfiniteGuard& guard,
                 const data_parallel::Session& dp, const Device& device) {
  const bool train = optimizer != nullptr;
  auto start = Clock::now();
  double total_loss = 0;
  int64_t total_tokens = 0, tokens = 0;
  for (size_t i = 0; i < data.size(); ++i) {
    const Batch& batch = data[i];
    const auto step_start = Clock::now();
    std::optional<NoGradGuard> no_grad;
    if (!train) no_grad.emplace();
    const Batch mine = data_parallel::shard(batch, 0, dp.rank(), dp.size()).to(device);
    const Tensor out = model.forward(mine.src, mine.tgt, mine.src_mask, mine.tgt_mask);
    const copy_task::LossOutput loss = loss_compute(
        out, mine.tgt_y, static_cast<double>(batch.ntokens) / static_cast<double>(dp.size()));
    const double batch_loss = data_parallel::sum(loss.total);  // every rank decides alike
    if (train) {
      const auto where = [&] { return fmt::format("epoch {}, batch {}", state.epoch, i); };
      if (!guard.loss_ok(batch_loss, where)) continue;
      loss.loss.backward();
      if (!guard.gradients_ok(where)) {
        optimizer->zero_grad();
        continue;
      }
      optimizer->step();
      optimizer->zero_grad();
      scheduler->step();
      profile::step();  // EMBER_PROFILE's per-step shares
      state.train_seconds += seconds_since(step_start);
      state.step += 1;
      state.accum_step += 1;
      state.samples += batch.src.size(0);
      state.tokens += batch.ntokens;
    }
    total_loss += batch_loss;
    total_tokens += batch.ntokens;
    tokens += batch.ntokens;
    if (train && static_cast<int64_t>(i) % log_every == 1 % log_every) {
      const double elapsed = seconds_since(start);
      fmt::print(
          "Epoch Step: {:6d} | Accumulation Step: {:3d} | Loss: {:6.2f} | Tokens / Sec: {:7.1f} "
          "| Learning Rate: {:6.1e} | {}\n",
          i, state.accum_step, batch_loss / batch.ntokens, tokens / elapsed, optimizer->lr(),
          progress.eta(state.accum_step));
      std::fflush(stdout);
      start = Clock::now();
      tokens = 0;
    }
  }
  return total_loss / static_cast<double>(total_tokens);
}

// The model's configuration as safetensors metadata, so --load rebuilds the same model.
std::map<std::string, std::string> model_metadata(const Config& c) {
  return {{"format", "pt"},
          {"vocab", std::to_string(V)},
          {"layers", std::to_string(c.layers)},
          {"d_model", std::to_string(c.d_model)},
          {"d_ff", std::to_string(c.d_ff)},
          {"heads", std::to_string(c.heads)}};
}

// Tokens of --decode: 1 to kMaxDecode integers in [0, V) separated by spaces.
std::vector<int64_t> parse_tokens(const std::string& text) {
  std::istringstream in(text);
  std::vector<int64_t> tokens;
  std::string word;
  while (in >> word) {
    size_t used = 0;
    int64_t t = -1;
    try {
      t = std::stoll(word, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != word.size())
      throw CLI::ValidationError("--decode", fmt::format("'{}' is not a token number", word));
    if (t < 0 || t >= V)
      throw CLI::ValidationError(
          "--decode", fmt::format("token {} is outside the vocabulary 0 .. {}", t, V - 1));
    tokens.push_back(t);
    if (static_cast<int64_t>(tokens.size()) > kMaxDecode)
      throw CLI::ValidationError(
          "--decode",
          fmt::format("more than {} tokens (decoding takes quadratic time)", kMaxDecode));
  }
  if (tokens.empty()) throw CLI::ValidationError("--decode", "no tokens given");
  return tokens;
}

// greedy_decode of one sequence, from start symbol 1, to the source's length.
std::vector<int64_t> decode_sequence(EncoderDecoder& model, const std::vector<int64_t>& tokens,
                                     const Device& device = kCPU) {
  const auto n = static_cast<int64_t>(tokens.size());
  const Tensor src = from_vector(tokens, {1, n}, device);
  const Tensor src_mask = ones({1, 1, n}, kBool, device);
  return nn::greedy_decode(model, src, src_mask, n, 1).to_vector<int64_t>();
}

// Fraction of `n` fresh copy-task sequences decoded back exactly (decoded in batches of 100).
double exact_copy_accuracy(EncoderDecoder& model, int64_t n, const Device& device) {
  int64_t exact = 0;
  for (int64_t done = 0; done < n; done += 100) {
    const Batch batch = copy_task::data_gen(V, std::min<int64_t>(100, n - done), 1)[0].to(device);
    const Tensor ys = nn::greedy_decode(model, batch.src, batch.src_mask, batch.src.size(1), 1);
    const std::vector<int64_t> got = ys.to_vector<int64_t>(), want = batch.src.to_vector<int64_t>();
    const int64_t L = batch.src.size(1);
    for (int64_t r = 0; r < batch.src.size(0); ++r)
      exact += std::equal(got.begin() + r * L, got.begin() + (r + 1) * L, want.begin() + r * L);
  }
  return static_cast<double>(exact) / static_cast<double>(n);
}

// The original's visualisation: per layer, one figure with the heads side by side, of the
// encoder self-attention, the decoder self-attention and the decoder source attention.
void draw_attention(EncoderDecoder& model, const std::vector<int64_t>& src_tokens,
                    const std::vector<int64_t>& decoded, const std::string& out,
                    const Device& device) {
  NoGradGuard no_grad;
  const auto n = static_cast<int64_t>(src_tokens.size());
  const Tensor src = from_vector(src_tokens, {1, n}, device);
  const Tensor tgt = from_vector(decoded, {1, n}, device).narrow(1, 0, n - 1);
  model.forward(src, tgt, ones({1, 1, n}, kBool, device), nn::subsequent_mask(n - 1).to(device));
  std::vector<std::string> titles;
  const int64_t h = model.encoder->layer(0).self_attn->h;
  for (int64_t i = 1; i <= h; ++i) titles.push_back(fmt::format("head {}", i));
  for (size_t l = 0; l < model.encoder->layers->size(); ++l) {
    const auto save = [&](const Tensor& attn, const std::string& name, const char* xlabel,
                          const char* ylabel) {
      viz::show_heatmaps(attn.cpu(), fmt::format("{}/attn_{}_layer{}.svg", out, name, l + 1),
                         xlabel, ylabel, titles);
    };
    save(model.encoder->layer(l).self_attn->attn, "encoder_self", "source key", "source query");
    save(model.decoder->layer(l).self_attn->attn, "decoder_self", "target key", "target query");
    save(model.decoder->layer(l).src_attn->attn, "decoder_src", "source key", "target query");
  }
}

// Parameters of make_model(V, V, N, D, F, h): per layer the encoder's attention, feed-forward and
// two LayerNorms, the decoder's two attentions, feed-forward and three LayerNorms; then the final
// norms, the two embeddings and the generator.
double parameter_count(double N, double D, double F) {
  return N * (12 * D * D + 4 * D * F + 24 * D + 2 * F) + 4 * D + 3 * V * D + V;
}

// Bytes a training run needs, estimated from the flags before anything is allocated: the
// parameters five times (gradients, Adam's two moments, the update's temporaries), the two
// positional tables (5000 x d_model), one step's activations per token (10 tokens a sequence;
// coefficients measured on configs from d_model 16 to 2048, within about 20%) and an epoch's
// batches.
double training_bytes(const Config& c) {
  const double N = c.layers, D = c.d_model, F = c.d_ff, h = c.heads, L = 10;
  const double per_token = N * (20 * D + 6 * F + 11 * h * L) + 12 * D + 10 * V;
  const double data = static_cast<double>(std::max(c.batches, c.eval_batches)) * c.batch * 400;
  return 4 * (5 * parameter_count(N, D, F) + 2 * 5000 * D +
              per_token * static_cast<double>(c.batch) * L) +
         data;
}

// The model's configuration from the checkpoint's metadata, the flags where a key is missing. The
// file may come from anywhere: each value must be a whole integer from 1 to what the file implies
// (layers: its tensor count; widths and heads: its widest dim) and the model must fit in memory,
// all before anything is built ("layers": "100000000" built layers for 20 s and 3 GB before the
// tensors were compared; "abc" escaped as std::invalid_argument).
Config config_from_metadata(const nn::SafetensorsFile& file, Config c, const std::string& path) {
  int64_t widest = 0;
  for (const auto& [name, t] : file.tensors)
    for (const int64_t s : t.shape()) widest = std::max(widest, s);
  const auto read = [&](const char* key, int64_t& value, int64_t limit) {
    const auto it = file.metadata.find(key);
    if (it == file.metadata.end()) return;
    const std::string& text = it->second;
    const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
    if (ec != std::errc() || end != text.data() + text.size() || value < 1 || value > limit)
      throw Error(fmt::format("--load '{}': metadata {} = '{:.40}' is not an integer in 1 .. {}",
                              path, key, text, limit));
  };
  const auto tensors = static_cast<int64_t>(file.tensors.size());
  int64_t vocab = V;
  read("vocab", vocab, widest);
  EMBER_CHECK(vocab == V, "--load '{}': metadata vocab = {}, but the copy task's is {}", path,
              vocab, V);
  read("layers", c.layers, tensors);
  read("d_model", c.d_model, widest);
  read("d_ff", c.d_ff, widest);
  read("heads", c.heads, widest);
  EMBER_CHECK(c.d_model % c.heads == 0, "--load '{}': d_model {} is not a multiple of heads {}",
              path, c.d_model, c.heads);
  program::check_memory<Error>(
      4 * (parameter_count(c.layers, c.d_model, c.d_ff) + 2 * 5000.0 * c.d_model),
      fmt::format("--load '{}': a model of {} layers, d_model {}, d_ff {}", path, c.layers,
                  c.d_model, c.d_ff));
  return c;
}

int decode_only(const std::string& load, const std::string& decode, const Config& flags) {
  // Rebuild the saved model from its metadata (flags as fallback), then load its weights.
  // The file may come from anywhere: config_from_metadata checks every value before a layer is
  // built.
  const nn::SafetensorsFile file = nn::read_safetensors(load);
  const Config c = config_from_metadata(file, flags, load);
  auto model = nn::make_model(V, V, c.layers, c.d_model, c.d_ff, c.heads);
  nn::load(*model, load);
  model->eval();
  const std::vector<int64_t> tokens =
      decode.empty() ? std::vector<int64_t>{1, 2, 3, 4, 5, 6, 7, 8, 9, 10} : parse_tokens(decode);
  fmt::print("{}\n", fmt::join(decode_sequence(*model, tokens), " "));
  return 0;
}

// Trains the copy task with config c, decodes, and writes everything into out (rank 0 only).
int train(const Config& c, const std::string& out, const data_parallel::Session& dp) {
  const auto run_start = Clock::now();
  if (dp.is_main())
    program::prepare_out_dir(out, {"model.safetensors", "metrics.json", "loss.svg"});

  // Train the simple copy task.
  nn::LabelSmoothing criterion(V, /*padding_idx=*/0, /*smoothing=*/0.0);
  const Device device = program::device_of(c.device);
  auto model = nn::make_model(V, V, c.layers, c.d_model, c.d_ff, c.heads, c.dropout);
  model->to(device);
  const data_parallel::Replica replica(model);  // rank 0's weights; gradients averaged
  optim::Adam optimizer(model->parameters(),
                        {.lr = c.lr, .beta1 = 0.9, .beta2 = 0.98, .eps = 1e-9});
  const int64_t d_model = model->d_model();
  optim::LambdaLR lr_scheduler(
      optimizer, [&](int64_t step) { return optim::rate(step, d_model, 1.0, c.warmup); });
  copy_task::SimpleLossCompute loss_compute(*model->generator, criterion);
  program::NonfiniteGuard guard(c.on_nonfinite, model->parameters());

  fmt::print(
      "copy task: V={} N={} d_model={} d_ff={} h={} dropout={} | {} epochs x {} batches "
      "of {} | {} parameters{}\n",
      V, c.layers, c.d_model, c.d_ff, c.heads, c.dropout, c.epochs, c.batches, c.batch,
      [&] {
        int64_t n = 0;
        for (const Tensor& p : model->parameters()) n += p.numel();
        return n;
      }(),
      dp.size() > 1 ? fmt::format(" | {} processes, {} thread{} each", dp.size(), get_num_threads(),
                                  get_num_threads() > 1 ? "s" : "")
                    : "");
  TrainState state;
  Progress progress;
  progress.total_steps = c.epochs * c.batches;
  viz::Animator animator("epoch", "loss per token", {"train", "eval"},
                         std::pair<double, double>{1, std::max<double>(2, c.epochs)});
  if (dp.is_main()) animator.autosave(out + "/loss.svg");
  std::vector<double> train_losses, eval_losses;
  for (int64_t epoch = 0; epoch < c.epochs; ++epoch) {
    state.epoch = epoch + 1;
    model->train();
    const double train_loss =
        run_epoch(copy_task::data_gen(V, c.batch, c.batches), *model, loss_compute, &optimizer,
                  &lr_scheduler, state, progress, c.log_every, guard, dp, device);
    guard.check_loss(train_loss, fmt::format("the training loss of epoch {}", epoch + 1));
    guard.check_parameters(fmt::format("after epoch {}", epoch + 1));
    model->eval();
    const double eval_loss =
        run_epoch(copy_task::data_gen(V, c.batch, c.eval_batches), *model, loss_compute, nullptr,
                  nullptr, state, progress, c.log_every, guard, dp, device);
    guard.check_loss(eval_loss, fmt::format("the evaluation loss of epoch {}", epoch + 1));
    train_losses.push_back(train_loss);
    eval_losses.push_back(eval_loss);
    animator.add(static_cast<double>(epoch + 1), {train_loss, eval_loss});
    fmt::print(
        "epoch {}/{} | train loss {:.4f} | eval loss {:.4f} | {:.0f} tokens/s | lr {:.2e} "
        "| {}\n",
        epoch + 1, c.epochs, train_loss, eval_loss,
        state.tokens / std::max(state.train_seconds, 1e-9), optimizer.lr(),
        progress.eta(state.accum_step));
    std::fflush(stdout);
  }

  // Decode 1 .. 10, then fresh random sequences: rank 0 alone, as it writes the files.
  if (!dp.is_main()) return 0;
  model->eval();
  const std::vector<int64_t> source{1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
  const std::vector<int64_t> decoded = decode_sequence(*model, source, device);
  fmt::print("greedy decode of {}\n               -> {}{}\n", fmt::join(source, " "),
             fmt::join(decoded, " "), decoded == source ? "  (copied)" : "  (NOT copied)");
  const double accuracy = exact_copy_accuracy(*model, 200, device);
  fmt::print("exact-copy accuracy over 200 fresh sequences: {:.3f}\n", accuracy);

  guard.check_parameters("before saving");
  nn::write_safetensors(out + "/model.safetensors", model->state_dict(), model_metadata(c));
  animator.save(out + "/loss.svg");
  draw_attention(*model, source, decoded, out, device);

  const double total_seconds = seconds_since(run_start);
  const nlohmann::ordered_json metrics = {
      {"config",
       {{"vocab", V},
        {"layers", c.layers},
        {"d_model", c.d_model},
        {"d_ff", c.d_ff},
        {"heads", c.heads},
        {"dropout", c.dropout},
        {"batch", c.batch},
        {"batches", c.batches},
        {"eval_batches", c.eval_batches},
        {"epochs", c.epochs},
        {"warmup", c.warmup},
        {"lr", c.lr},
        {"betas", {0.9, 0.98}},
        {"eps", 1e-9},
        {"smoothing", 0.0},
        {"seed", c.seed},
        {"matmul_precision", c.matmul_precision},
        {"bfloat16_products", float32_matmul_uses_bfloat16()},
        {"threads", get_num_threads()},
        {"device", device.str()},
        {"gpu", program::device_model(device)},
        {"processes", dp.size()},
        {"on_nonfinite", c.on_nonfinite == program::OnNonfinite::kStop ? "stop" : "skip"}}},
      {"skipped_steps", guard.skipped()},
      {"train_loss", train_losses},
      {"eval_loss", eval_losses},
      {"decoded", decoded},
      {"exact_copy_accuracy", accuracy},
      {"train_seconds", state.train_seconds},
      {"train_steps", state.accum_step},
      {"tokens_per_second", state.tokens / std::max(state.train_seconds, 1e-9)},
      {"total_seconds", total_seconds},
      {"cpu_seconds", static_cast<double>(std::clock()) / CLOCKS_PER_SEC},  // all threads
      {"max_rss_mb", [] {
         rusage usage{};
         getrusage(RUSAGE_SELF, &usage);
         return static_cast<double>(usage.ru_maxrss) / 1024;
       }()}};
  program::write_text(out + "/metrics.json", metrics.dump(2) + "\n");
  fmt::print("wrote {}/{{metrics.json, model.safetensors, loss.svg, attn_*.svg}} in {}\n", out,
             format_duration(total_seconds));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  data_parallel::Session session(argc, argv);  // mpirun's processes, or a world of one
  Config c;
  std::string out = "out/transformer_copy", load, decode;
  CLI::App app{"The Annotated Transformer's copy task: train, decode, draw attention"};
  const CLI::Validator positive = program::count(1);
  app.add_option("--layers", c.layers, "encoder and decoder layers (N)")->check(positive);
  app.add_option("--d-model", c.d_model, "model width")->check(positive);
  app.add_option("--d-ff", c.d_ff, "feed-forward width")->check(positive);
  app.add_option("--heads", c.heads, "attention heads (h)")->check(positive);
  app.add_option("--dropout", c.dropout, "dropout probability")->check(program::finite_in(0, 0.99));
  app.add_option("--batch", c.batch, "sequences per batch")->check(positive);
  app.add_option("--batches", c.batches, "training batches per epoch")->check(positive);
  app.add_option("--eval-batches", c.eval_batches, "evaluation batches per epoch")->check(positive);
  app.add_option("--epochs", c.epochs, "epochs")->check(program::count(0));
  app.add_option("--warmup", c.warmup, "warmup steps of the rate schedule")->check(positive);
  app.add_option("--lr", c.lr, "base learning rate (times rate(step))")->check(program::positive());
  program::add_on_nonfinite_option(app, c.on_nonfinite);
  app.add_option("--seed", c.seed, "random seed");
  program::add_threads_option(app, c.threads);
  program::add_matmul_precision_option(app, c.matmul_precision);
  program::add_device_option(app, c.device);
  app.add_option("--log-every", c.log_every, "steps between progress lines")->check(positive);
  app.add_option("--out", out, "output directory");
  app.add_option("--load", load, "decode with this saved model instead of training")
      ->check(CLI::ExistingFile);
  app.add_option(
         "--decode", decode,
         fmt::format("tokens to decode, e.g. \"1 5 2 7\" (needs --load; at most {})", kMaxDecode))
      ->needs("--load");
  return session.finish(program::run("transformer_copy", app, argc, argv, [&] {
    if (c.d_model % c.heads != 0)
      throw CLI::ValidationError(
          "--d-model", fmt::format("{} is not a multiple of --heads {}", c.d_model, c.heads));
    if (c.batch < session.size())
      throw CLI::ValidationError(
          "--batch",
          fmt::format("{} is fewer sequences than the {} processes that share each batch", c.batch,
                      session.size()));
    if (!decode.empty()) parse_tokens(decode);
    if (c.device != "cpu" && session.size() > 1)
      throw CLI::ValidationError("--device", "a GPU run is one process (mpirun shares CPUs)");
    set_num_threads(c.threads);
    set_float32_matmul_precision(c.matmul_precision);
    manual_seed(c.seed);
    if (!load.empty()) return decode_only(load, decode, c);
    program::check_memory(
        training_bytes(c),
        fmt::format("training with --layers {} --d-model {} --d-ff {} --heads {} --batch {}",
                    c.layers, c.d_model, c.d_ff, c.heads, c.batch));
    return train(c, out, session);
  }));
}
