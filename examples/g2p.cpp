// Grapheme-to-phoneme conversion on the CMU Pronouncing Dictionary with the Annotated
// Transformer (issue 14) or D2L's Bahdanau attention model (issue 45, --model bahdanau): spelling
// in, pronunciation out. The split is fixed by FNV-1a of the word (examples/g2p_task.h); the model
// is nn::make_model, or g2p::Bahdanau (examples/g2p_bahdanau.h: a GRU encoder and a GRU decoder
// with additive attention over the graphemes), over grapheme and phoneme vocabularies built from
// the train split; either model's training is the original's recipe (label smoothing, Adam with the
// Noam rate, here plus gradient clipping) over token-budget batches of similar lengths
// (data::DataLoader). Every epoch measures dev WER with greedy decoding, keeps the best model and
// stops when dev WER has not improved for --patience epochs. At the end the best model decodes
// the test split greedily and with beam search: WER, PER, predictions, plots, attention maps.
//
// A run is resumable: every --checkpoint-every steps and after every epoch it saves a training
// checkpoint (train/checkpoint.h: model, Adam's moments, the schedule, the random generator and
// the run's counters) to OUT/checkpoint.safetensors, and its configuration to OUT/run.json;
// `--resume OUT` continues it, and a resumed run gives the same losses, WERs and model, bit for
// bit, as one never stopped (tests/test_g2p.cpp stops one with --max-steps).
//
//   g2p --out out/g2p                                  train (the default config)
//   g2p --model bahdanau --out out/g2p_bahdanau        the same task with D2L's Bahdanau model
//   g2p --resume out/g2p                               continue a stopped run
//   g2p --device cuda --out out/g2p_gpu                the same on a GPU (model and batches there)
//   g2p --load out/g2p --predict hello world           pronounce words with a trained model
//   echo hello | g2p --load out/g2p                    words from standard input
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "ember.h"
#include "g2p_bahdanau.h"
#include "g2p_task.h"
#include "program.h"
#include "train/checkpoint.h"

using namespace ember;
using data::Vocab;
using nn::EncoderDecoder;
using Clock = std::chrono::steady_clock;
using Json = nlohmann::ordered_json;

namespace {

// Defaults: the 3-layer, 256-wide, 4-head transformer of CMU Sphinx's g2p-seq2seq. An epoch is
// about 260 steps of 4096 tokens, so the Noam warmup is 1000 steps (4 epochs; the original's 4000
// would be 15). --model bahdanau has defaults of its own (kBahdanauDefaults) where --layers,
// --d-model and --dropout are not given; --d-ff and --heads are the transformer's alone.
struct Config {
  std::string model = "transformer";  // or "bahdanau"
  int64_t layers = 3, d_model = 256, d_ff = 1024, heads = 4;
  double dropout = 0.1, smoothing = 0.1, lr_factor = 1.0, clip = 1.0, alpha = 0.6;
  int64_t batch_tokens = 4096, epochs = 32, warmup = 1000, patience = 4, beam = 5;
  int64_t limit = 0, eval_limit = 0;
  uint64_t seed = 0;
  std::string data = g2p::kDefaultDict;
  std::string matmul_precision = "highest";
  // How this process runs, not what it computes: may change on --resume (a run stopped on the
  // CPU may go on on a GPU: its checkpoint loads onto the model's device).
  int threads = 0;
  std::string device = "cpu";
  int64_t log_every = 200, checkpoint_every = 200, max_steps = 0;
  program::OnNonfinite on_nonfinite = program::OnNonfinite::kStop;
};

// What a run computes with: metrics.json's "config" and DIR/run.json, which --resume reads
// (program::config_to_json / resume_config; --epochs may change on --resume, so a run can be
// extended; threads, logging and --max-steps are the process's own).
template <class F>
void config_fields(Config& c, F&& f) {
  f("data", c.data);
  f("model", c.model);
  f("layers", c.layers);
  f("d_model", c.d_model);
  f("d_ff", c.d_ff);
  f("heads", c.heads);
  f("dropout", c.dropout);
  f("smoothing", c.smoothing);
  f("batch_tokens", c.batch_tokens);
  f("warmup", c.warmup);
  f("lr_factor", c.lr_factor);
  f("clip", c.clip);
  f("beam", c.beam);
  f("alpha", c.alpha);
  f("patience", c.patience);
  f("epochs", c.epochs);
  f("limit", c.limit);
  f("eval_limit", c.eval_limit);
  f("seed", c.seed);
  f("matmul_precision", c.matmul_precision);
}

Json config_json(const Config& c) {
  return program::config_to_json(c, [](Config& x, auto f) { config_fields(x, f); });
}

// --model bahdanau's --layers, --d-model and --dropout where not given: D2L's two GRU layers of
// 256 (the embedding and hidden size) and dropout 0.2.
struct BahdanauDefaults {
  int64_t layers = 2, d_model = 256;
  double dropout = 0.2;
};
constexpr BahdanauDefaults kBahdanauDefaults;

// The run's model, the Annotated Transformer or D2L's Bahdanau model, as training, decoding and
// the attention maps use it.
struct Model {
  std::shared_ptr<EncoderDecoder> transformer;
  std::shared_ptr<g2p::Bahdanau> bahdanau;

  nn::Module& module() const {
    if (transformer) return *transformer;
    return *bahdanau;
  }
  // Teacher forcing: log-probabilities (B, T, V) of the batch's next phonemes.
  Tensor log_probs(const nn::Batch& batch) const {
    if (transformer)
      return transformer->generator->forward(
          transformer->forward(batch.src, batch.tgt, batch.src_mask, batch.tgt_mask));
    return bahdanau->forward(batch.src, g2p::source_lengths(batch.src_mask), batch.tgt)
        .log_softmax(-1);
  }
  // The best hypothesis of each row: greedy when beam is 1, else beam search.
  std::vector<nn::Hypothesis> decode(const nn::Batch& batch, int64_t max_len, int64_t beam,
                                     double alpha) const {
    if (bahdanau)
      return g2p::bahdanau_search(*bahdanau, batch.src, g2p::source_lengths(batch.src_mask),
                                  max_len, Vocab::kBos, Vocab::kEos, beam, alpha);
    return beam == 1 ? nn::greedy_search(*transformer, batch.src, batch.src_mask, max_len,
                                         Vocab::kBos, Vocab::kEos, alpha)
                     : nn::beam_search(*transformer, batch.src, batch.src_mask, max_len,
                                       Vocab::kBos, Vocab::kEos, beam, alpha);
  }
};

// A fresh model of kind c.model (dropout as given: 0 to predict).
Model build_model(const std::string& kind, int64_t graphemes, int64_t phonemes, int64_t layers,
                  int64_t d_model, int64_t d_ff, int64_t heads, double dropout) {
  if (kind == "bahdanau")
    return {nullptr,
            std::make_shared<g2p::Bahdanau>(graphemes, phonemes, d_model, layers, dropout)};
  EMBER_CHECK(kind == "transformer", "g2p: unknown model '{}'", kind);
  return {nn::make_model(graphemes, phonemes, layers, d_model, d_ff, heads, dropout), nullptr};
}

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// A split's words as source-only examples, and their reference pronunciations as phoneme ids.
struct EvalSet {
  std::vector<std::string> words;
  std::vector<std::vector<std::vector<int64_t>>> references;
  std::shared_ptr<data::ExampleDataset> dataset;
};
EvalSet eval_set(const std::vector<g2p::Entry>& entries, const Vocab& graphemes,
                 const Vocab& phonemes) {
  EvalSet set;
  std::vector<data::Example> examples;
  for (const g2p::Entry& e : entries) {
    set.words.push_back(e.word);
    examples.push_back({graphemes.encode(g2p::graphemes(e.word)), {}});
    auto& refs = set.references.emplace_back();
    for (const auto& p : e.pronunciations) refs.push_back(phonemes.encode(p));
  }
  set.dataset = std::make_shared<data::ExampleDataset>(std::move(examples));
  return set;
}

// Decodes every example of dataset (greedy when beam is 1), batch by batch in length order; the
// bound is the batch's longest word + 5 phonemes. Returns phoneme ids per example, without </s>.
std::vector<std::vector<int64_t>> decode_all(const Model& model,
                                             std::shared_ptr<const data::ExampleDataset> dataset,
                                             const Config& c, int64_t beam) {
  model.module().eval();
  const Device device(c.device);
  const data::DataLoader loader(dataset, {.batch_tokens = c.batch_tokens, .shuffle = false});
  std::vector<std::vector<int64_t>> out(static_cast<size_t>(dataset->size()));
  for (const auto& indices : loader.plan(0)) {
    const nn::Batch batch = loader.collate(indices).to(device);
    const int64_t max_len = batch.src.size(1) + 6;
    const auto hyps = model.decode(batch, max_len, beam, c.alpha);
    for (size_t i = 0; i < indices.size(); ++i) {
      std::vector<int64_t> tokens = hyps[i].tokens;
      if (!tokens.empty() && tokens.back() == Vocab::kEos) tokens.pop_back();
      out[indices[i]] = std::move(tokens);
    }
  }
  return out;
}

g2p::ErrorRates score(const EvalSet& set, const std::vector<std::vector<int64_t>>& predictions) {
  g2p::ErrorRates rates;
  for (size_t i = 0; i < predictions.size(); ++i) rates.add(predictions[i], set.references[i]);
  return rates;
}

struct Evaluation {
  g2p::ErrorRates rates;
  std::vector<std::vector<int64_t>> predictions;
};
Evaluation evaluate(const Model& model, const EvalSet& set, const Config& c, int64_t beam) {
  Evaluation e;
  e.predictions = decode_all(model, set.dataset, c, beam);
  e.rates = score(set, e.predictions);
  return e;
}

std::map<std::string, std::string> model_metadata(const Config& c, const Vocab& graphemes,
                                                  const Vocab& phonemes) {
  return {{"format", "pt"},
          {"model", c.model},
          {"layers", std::to_string(c.layers)},
          {"d_model", std::to_string(c.d_model)},
          {"d_ff", std::to_string(c.d_ff)},
          {"heads", std::to_string(c.heads)},
          {"graphemes", graphemes.to_text()},
          {"phonemes", phonemes.to_text()}};
}

void save_model(const std::string& dir, const nn::Module& model, const Config& c,
                const Vocab& graphemes, const Vocab& phonemes) {
  nn::write_safetensors(dir + "/model.safetensors", model.state_dict(),
                        model_metadata(c, graphemes, phonemes));
  graphemes.save(dir + "/graphemes.txt");
  phonemes.save(dir + "/phonemes.txt");
}

// Source-attention maps (phonemes x graphemes) for the first `count` test words, teacher-forced
// with their predictions: attn_src_<n>.svg. The transformer's are its last decoder layer's, heads
// side by side; the Bahdanau model's are its additive attention's, one map as D2L draws them.
void draw_attention(const Model& m, const EvalSet& test,
                    const std::vector<std::vector<int64_t>>& predictions, const Vocab& phonemes,
                    const std::string& out, size_t count, const Device& device) {
  NoGradGuard no_grad;
  m.module().eval();
  for (size_t i = 0; i < std::min(count, test.words.size()); ++i) {
    const data::Example e = test.dataset->get(static_cast<int64_t>(i));
    std::vector<int64_t> tgt{Vocab::kBos};
    tgt.insert(tgt.end(), predictions[i].begin(), predictions[i].end());
    const auto S = static_cast<int64_t>(e.src.size()), T = static_cast<int64_t>(tgt.size());
    const std::string path = fmt::format("{}/attn_src_{}.svg", out, i + 1);
    const std::string ylabel =
        fmt::format("phoneme ({})", fmt::join(phonemes.decode(predictions[i]), " "));
    if (m.bahdanau) {
      m.bahdanau->forward(from_vector(e.src, {1, S}, device), from_vector(std::vector{S}, {1}),
                          from_vector(tgt, {1, T}, device));
      // (1, T, S) -> (1, 1, T, S): one map
      viz::show_heatmaps(m.bahdanau->decoder->attention_weights.cpu().unsqueeze(0), path,
                         "grapheme", ylabel, {test.words[i]});
      continue;
    }
    EncoderDecoder& model = *m.transformer;
    model.forward(from_vector(e.src, {1, S}, device), from_vector(tgt, {1, T}, device),
                  ones({1, 1, S}, kBool, device), nn::subsequent_mask(T).to(device));
    const auto& layer = model.decoder->layer(model.decoder->layers->size() - 1);
    std::vector<std::string> titles;
    for (int64_t h = 0; h < layer.src_attn->h; ++h)
      titles.push_back(fmt::format("{} head {}", test.words[i], h + 1));
    viz::show_heatmaps(layer.src_attn->attn.cpu(), path, "grapheme", ylabel, titles);
  }
}

// --load DIR: rebuilds the saved model and pronounces words (from --predict, else stdin lines).
int predict(const std::string& dir, std::vector<std::string> words, const Config& c) {
  const nn::SafetensorsFile file = nn::read_safetensors(dir + "/model.safetensors");
  const auto meta = [&](const char* key) { return std::stoll(file.metadata.at(key)); };
  const Vocab graphemes = Vocab::load(dir + "/graphemes.txt");
  const Vocab phonemes = Vocab::load(dir + "/phonemes.txt");
  // The model kind is the saved run's (a model saved before there were two is a transformer).
  const auto kind = file.metadata.find("model");
  const Model model = build_model(kind == file.metadata.end() ? "transformer" : kind->second,
                                  graphemes.size(), phonemes.size(), meta("layers"),
                                  meta("d_model"), meta("d_ff"), meta("heads"), 0.0);
  nn::load(model.module(), dir + "/model.safetensors");
  model.module().to(program::device_of(c.device));
  if (words.empty())
    for (std::string line; std::getline(std::cin, line);) words.push_back(line);
  std::vector<data::Example> examples;
  for (std::string& w : words) {
    w.erase(0, w.find_first_not_of(" \t\r"));
    w.erase(w.find_last_not_of(" \t\r") + 1);
    EMBER_CHECK(!w.empty(), "predict: an empty word cannot be pronounced");
    for (char& ch : w) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    for (const std::string& g : g2p::graphemes(w))
      if (!graphemes.contains(g))
        fmt::print(stderr, "g2p: warning: '{}' in '{}' is not in the training graphemes (<unk>)\n",
                   g, w);
    examples.push_back({graphemes.encode(g2p::graphemes(w)), {}});
  }
  const auto dataset = std::make_shared<data::ExampleDataset>(std::move(examples));
  const auto predictions = decode_all(model, dataset, c, c.beam);
  for (size_t i = 0; i < words.size(); ++i)
    fmt::print("{}\t{}\n", words[i], fmt::join(phonemes.decode(predictions[i]), " "));
  return 0;
}

// The first `limit` entries (all when 0): a slice of a split for quick runs.
std::vector<g2p::Entry> head(std::vector<g2p::Entry> entries, int64_t limit) {
  if (limit > 0 && static_cast<size_t>(limit) < entries.size()) entries.resize(limit);
  return entries;
}

// The data of a run: the dictionary's splits (sliced by --limit, --eval-limit), the vocabularies
// of the train split, one training example per pronunciation, and the dev and test sets.
struct Task {
  g2p::CmuDict dict;
  std::vector<g2p::Entry> train_words;
  Vocab graphemes, phonemes;
  std::shared_ptr<data::ExampleDataset> train;
  EvalSet dev, test;
};

Task load_task(const Config& c) {
  Task t;
  t.dict = g2p::read_cmudict(c.data);
  t.train_words = head(t.dict.train, c.limit);
  std::vector<std::vector<std::string>> spellings, pronunciations;
  for (const g2p::Entry& e : t.train_words) {
    spellings.push_back(g2p::graphemes(e.word));
    for (const auto& p : e.pronunciations) pronunciations.push_back(p);
  }
  t.graphemes = Vocab::build(spellings);
  t.phonemes = Vocab::build(pronunciations);
  std::vector<data::Example> examples;
  for (const g2p::Entry& e : t.train_words)
    for (const auto& p : e.pronunciations)
      examples.push_back(
          {t.graphemes.encode(g2p::graphemes(e.word)), t.phonemes.encode(p, true, true)});
  const auto dev_words = head(t.dict.dev, c.eval_limit),
             test_words = head(t.dict.test, c.eval_limit);
  fmt::print(
      "{}: {} lines; words train {} / dev {} / test {} (using {} / {} / {}); {} training "
      "pronunciations; {} graphemes, {} phonemes (with 4 specials)\n",
      c.data, t.dict.lines, t.dict.train.size(), t.dict.dev.size(), t.dict.test.size(),
      t.train_words.size(), dev_words.size(), test_words.size(), examples.size(),
      t.graphemes.size(), t.phonemes.size());
  t.train = std::make_shared<data::ExampleDataset>(std::move(examples));
  t.dev = eval_set(dev_words, t.graphemes, t.phonemes);
  t.test = eval_set(test_words, t.graphemes, t.phonemes);
  return t;
}

// Where a run is, besides its model, optimizer, schedule and random generator: the counters of
// its training checkpoint (program::Counters: the doubles travel as their bit patterns).
struct Progress {
  int64_t epoch = 0;                           // epochs finished
  int64_t step = 0;                            // batches of epoch `epoch` done
  double epoch_loss = 0;                       // their summed loss
  int64_t epoch_tokens = 0;                    // and target tokens
  double epoch_seconds = 0;                    // and training time
  int64_t tokens = 0;                          // target tokens of the finished epochs
  double train_seconds = 0;                    // and their training time
  int64_t best_epoch = 0;                      // the epoch of model.safetensors (0: none yet)
  double best_wer = 2, best_per = 2;           // its dev error rates
  bool stopped = false;                        // early stopping ended training
  std::vector<double> train_losses, dev_wers;  // per finished epoch

  std::map<std::string, int64_t> counters() const {
    program::Counters c;
    c.put("epoch", epoch);
    c.put("step", step);
    c.put("epoch_tokens", epoch_tokens);
    c.put("tokens", tokens);
    c.put("best_epoch", best_epoch);
    c.put("stopped", stopped);
    c.put_real("epoch_loss", epoch_loss);
    c.put_real("epoch_seconds", epoch_seconds);
    c.put_real("train_seconds", train_seconds);
    c.put_real("best_wer", best_wer);
    c.put_real("best_per", best_per);
    for (size_t i = 0; i < train_losses.size(); ++i) {
      c.put_real(fmt::format("train_loss.{}", i), train_losses[i]);
      c.put_real(fmt::format("dev_wer.{}", i), dev_wers[i]);
    }
    return c.values();
  }

  static Progress from(std::map<std::string, int64_t> m, const std::string& path) {
    const program::Counters c(std::move(m), path);
    Progress p;
    p.epoch = c.get("epoch");
    p.step = c.get("step");
    p.epoch_tokens = c.get("epoch_tokens");
    p.tokens = c.get("tokens");
    p.best_epoch = c.get("best_epoch");
    p.stopped = c.get("stopped") != 0;
    p.epoch_loss = c.get_real("epoch_loss");
    p.epoch_seconds = c.get_real("epoch_seconds");
    p.train_seconds = c.get_real("train_seconds");
    p.best_wer = c.get_real("best_wer");
    p.best_per = c.get_real("best_per");
    EMBER_CHECK(p.epoch >= 0 && p.epoch <= program::kMaxCount && p.step >= 0,
                "--resume: '{}' has epoch {} and step {}", path, p.epoch, p.step);
    for (int64_t i = 0; i < p.epoch; ++i) {
      p.train_losses.push_back(c.get_real(fmt::format("train_loss.{}", i)));
      p.dev_wers.push_back(c.get_real(fmt::format("dev_wer.{}", i)));
    }
    return p;
  }
};

// A training run: the model and everything that trains it. train_epoch() and end_epoch() move
// `progress` on; checkpoint() saves it all.
class Trainer {
 public:
  Trainer(const Config& c, const Task& task, std::string out)
      : c_(c),
        task_(task),
        out_(std::move(out)),
        model_(make_model(c, task)),
        criterion_(task.phonemes.size(), Vocab::kPad, c.smoothing),
        optimizer_(model_.module().parameters(),
                   {.lr = 1.0, .beta1 = 0.9, .beta2 = 0.98, .eps = 1e-9}),
        scheduler_(optimizer_, [d = c.d_model, f = c.lr_factor,
                                w = c.warmup](int64_t step) { return optim::rate(step, d, f, w); }),
        guard_(c.on_nonfinite, model_.module().parameters()),
        loader_(task.train, {.batch_tokens = c.batch_tokens, .seed = c.seed}) {}

  const Model& model() const { return model_; }
  Progress progress;

  std::string checkpoint_path() const { return out_ + "/checkpoint.safetensors"; }
  void checkpoint() {
    save_checkpoint(checkpoint_path(), model_.module(), optimizer_, &scheduler_,
                    progress.counters());
  }
  void resume() {
    progress =
        Progress::from(load_checkpoint(checkpoint_path(), model_.module(), optimizer_, &scheduler_),
                       checkpoint_path());
  }

  // Trains the rest of epoch progress.epoch. False when --max-steps stopped it first (after
  // saving a checkpoint).
  bool train_epoch() {
    model_.module().train();
    const auto plan = loader_.plan(progress.epoch);
    auto& p = progress;
    while (static_cast<size_t>(p.step) < plan.size()) {
      if (c_.max_steps > 0 && steps_ == c_.max_steps) {
        checkpoint();
        return false;
      }
      const auto step_start = Clock::now();
      const nn::Batch batch = loader_.collate(plan[static_cast<size_t>(p.step)]).to(device_);
      const Tensor logits = model_.log_probs(batch);
      const Tensor loss = criterion_(logits.contiguous().view({-1, logits.size(-1)}),
                                     batch.tgt_y.contiguous().view({-1})) /
                          static_cast<double>(batch.ntokens);
      const double summed = loss.item<double>() * static_cast<double>(batch.ntokens);
      const auto where = [&] { return fmt::format("epoch {}, step {}", p.epoch + 1, p.step + 1); };
      if (guard_.loss_ok(summed, where)) {
        loss.backward();
        if (guard_.gradients_ok(where)) {
          optim::clip_grad_norm_(model_.module().parameters(), c_.clip);
          optimizer_.step();
          scheduler_.step();
          p.epoch_loss += summed;
          p.epoch_tokens += batch.ntokens;
        }
        optimizer_.zero_grad();
        profile::step();  // EMBER_PROFILE's per-step shares
      }
      p.epoch_seconds += seconds_since(step_start);
      ++p.step;
      ++steps_;
      if (p.step % c_.log_every == 0) {
        fmt::print("  epoch {} step {:5d}/{} | loss {:.4f} | {:.0f} tokens/s | lr {:.2e}\n",
                   p.epoch + 1, p.step, plan.size(),
                   p.epoch_loss / static_cast<double>(std::max<int64_t>(p.epoch_tokens, 1)),
                   static_cast<double>(p.epoch_tokens) / p.epoch_seconds, optimizer_.lr());
        std::fflush(stdout);
      }
      if (p.step % c_.checkpoint_every == 0 && static_cast<size_t>(p.step) < plan.size())
        checkpoint();
    }
    return true;
  }

  // After an epoch: dev WER with greedy decoding, the best model kept, early stopping, the plot
  // and a checkpoint.
  void end_epoch() {
    auto& p = progress;
    guard_.check_parameters(fmt::format("after epoch {}", p.epoch + 1));
    const double loss = p.epoch_loss / static_cast<double>(std::max<int64_t>(p.epoch_tokens, 1));
    guard_.check_loss(p.epoch_tokens > 0 ? loss : NAN, fmt::format("epoch {}'s loss", p.epoch + 1));
    const g2p::ErrorRates rates = evaluate(model_, task_.dev, c_, 1).rates;
    const double wer = rates.wer();
    // Better: a lower dev WER, or the same and a lower PER.
    const bool better = std::pair(wer, rates.per()) < std::pair(p.best_wer, p.best_per);
    p.train_losses.push_back(loss);
    p.dev_wers.push_back(wer);
    p.tokens += p.epoch_tokens;
    p.train_seconds += p.epoch_seconds;
    fmt::print(
        "epoch {}/{} | train loss {:.4f} | {:.0f} tokens/s | lr {:.2e} | dev WER {:.4f}{} "
        "| trained {:.0f}s | ETA {:.0f}s\n",
        p.epoch + 1, c_.epochs, loss, static_cast<double>(p.epoch_tokens) / p.epoch_seconds,
        optimizer_.lr(), wer, better ? " (best)" : "", p.train_seconds,
        p.train_seconds / static_cast<double>(p.epoch + 1) *
            static_cast<double>(c_.epochs - p.epoch - 1));
    std::fflush(stdout);
    ++p.epoch;
    p.step = 0;
    p.epoch_loss = p.epoch_seconds = 0;
    p.epoch_tokens = 0;
    if (better) {
      p.best_wer = wer;
      p.best_per = rates.per();
      p.best_epoch = p.epoch;
      save_model(out_, model_.module(), c_, task_.graphemes, task_.phonemes);
    } else if (p.epoch - p.best_epoch >= c_.patience) {
      fmt::print("dev WER has not improved for {} epochs: stopping\n", c_.patience);
      p.stopped = true;
    }
    plot();
    checkpoint();
  }

  // loss.svg: train loss and dev WER by epoch.
  void plot() const {
    viz::Animator animator("epoch", "value", {"train loss", "dev WER"},
                           std::pair<double, double>{1, std::max<double>(2, c_.epochs)});
    for (size_t i = 0; i < progress.train_losses.size(); ++i)
      animator.add(static_cast<double>(i + 1), {progress.train_losses[i], progress.dev_wers[i]});
    animator.save(out_ + "/loss.svg");
  }

 private:
  // The model, initialised on the host (the same weights for any --device) and moved to the
  // run's device before the optimizer sees its parameters.
  static Model make_model(const Config& c, const Task& task) {
    Model model = build_model(c.model, task.graphemes.size(), task.phonemes.size(), c.layers,
                              c.d_model, c.d_ff, c.heads, c.dropout);
    model.module().to(Device(c.device));
    return model;
  }

  const Config& c_;
  const Task& task_;
  Device device_{c_.device};
  std::string out_;
  Model model_;
  nn::LabelSmoothing criterion_;
  optim::Adam optimizer_;
  optim::LambdaLR scheduler_;
  program::NonfiniteGuard guard_;
  data::DataLoader loader_;
  int64_t steps_ = 0;  // training steps taken by this process (for --max-steps)
};

// The best model on the test split, greedy and beam; the setting better on dev writes
// predictions.tsv; metrics.json and the attention maps.
void test_and_report(Trainer& trainer, const Task& task, const Config& c, const std::string& out,
                     double run_seconds) {
  const Progress& p = trainer.progress;
  const Model& model = trainer.model();
  if (p.best_epoch > 0)
    nn::load(model.module(), out + "/model.safetensors");
  else
    save_model(out, model.module(), c, task.graphemes, task.phonemes);
  const Evaluation greedy = evaluate(model, task.test, c, 1),
                   beam = evaluate(model, task.test, c, c.beam);
  const double dev_beam_wer = evaluate(model, task.dev, c, c.beam).rates.wer();
  const bool use_beam = dev_beam_wer <= p.best_wer;
  const Evaluation& chosen = use_beam ? beam : greedy;
  fmt::print(
      "test (best epoch {}): greedy WER {:.4f} PER {:.4f} | beam {} WER {:.4f} PER {:.4f} | "
      "predictions by {} (dev WER greedy {:.4f}, beam {:.4f})\n",
      p.best_epoch, greedy.rates.wer(), greedy.rates.per(), c.beam, beam.rates.wer(),
      beam.rates.per(), use_beam ? "beam" : "greedy", p.best_wer, dev_beam_wer);
  std::string tsv;
  for (size_t i = 0; i < task.test.words.size(); ++i)
    tsv += fmt::format("{}\t{}\n", task.test.words[i],
                       fmt::join(task.phonemes.decode(chosen.predictions[i]), " "));
  program::write_text(out + "/predictions.tsv", tsv);
  draw_attention(model, task.test, chosen.predictions, task.phonemes, out, 3, Device(c.device));
  Json config = config_json(c);
  config["threads"] = get_num_threads();
  config["device"] = Device(c.device).str();
  config["gpu"] = program::device_model(Device(c.device));
  config["bfloat16_products"] = float32_matmul_uses_bfloat16();
  const Json metrics = {
      {"config", config},
      {"split_sizes",
       {{"train", task.dict.train.size()},
        {"dev", task.dict.dev.size()},
        {"test", task.dict.test.size()},
        {"train_used", task.train_words.size()},
        {"dev_used", task.dev.words.size()},
        {"test_used", task.test.words.size()}}},
      {"train_loss", p.train_losses},
      {"dev_wer", p.dev_wers},
      {"best_epoch", p.best_epoch},
      {"decoding", use_beam ? "beam" : "greedy"},
      {"test_wer", chosen.rates.wer()},
      {"test_per", chosen.rates.per()},
      {"test_wer_greedy", greedy.rates.wer()},
      {"test_per_greedy", greedy.rates.per()},
      {"test_wer_beam", beam.rates.wer()},
      {"test_per_beam", beam.rates.per()},
      {"train_seconds", p.train_seconds},
      {"epochs", p.epoch},
      {"tokens_per_second", static_cast<double>(p.tokens) / std::max(p.train_seconds, 1e-9)},
      {"total_seconds", run_seconds}};
  program::write_text(out + "/metrics.json", metrics.dump(2) + "\n");
  fmt::print(
      "wrote {}/{{metrics.json, predictions.tsv, model.safetensors, graphemes.txt, "
      "phonemes.txt, loss.svg, attn_src_*.svg, checkpoint.safetensors, run.json}}\n",
      out);
}

// Trains (or continues, with resume) the run in `out`, then tests it.
int train(const Config& c, const std::string& out, bool resume) {
  const auto run_start = Clock::now();
  const Task task = load_task(c);
  Trainer trainer(c, task, out);
  if (resume) {
    trainer.resume();
    fmt::print("resumed {} at epoch {}, step {}\n", out, trainer.progress.epoch + 1,
               trainer.progress.step);
  } else {
    program::write_text(out + "/run.json", config_json(c).dump(2) + "\n");
  }
  while (!trainer.progress.stopped && trainer.progress.epoch < c.epochs) {
    if (!trainer.train_epoch()) {
      fmt::print("stopped after --max-steps {} steps; continue with --resume {}\n", c.max_steps,
                 out);
      return 0;
    }
    trainer.end_epoch();
  }
  test_and_report(trainer, task, c, out, seconds_since(run_start));
  return 0;
}

// Bytes a training run needs, roughly: the parameters five times (gradients, Adam's moments,
// temporaries) and a batch's activations (per token and layer about 40 d_model + 6 d_ff floats,
// with the attention scores of 64-token rows).
double training_bytes(const Config& c) {
  const double N = c.layers, D = c.d_model, F = c.d_ff;
  if (c.model == "bahdanau") {
    // Two GRU stacks, the attention's three maps and the decoder's wider input; per target token
    // and layer the gates and states, and the attention's tanh features over up to 32 graphemes.
    const double parameters = N * 12 * D * D + 6 * D * D + 200 * D;
    const double per_token = N * 40 * D + 3 * 32 * D;
    return 4 * (5 * parameters + per_token * static_cast<double>(c.batch_tokens));
  }
  const double parameters = N * (12 * D * D + 4 * D * F) + 200 * D;
  const double per_token = N * (40 * D + 6 * F + 3 * c.heads * 64);
  return 4 * (5 * parameters + per_token * static_cast<double>(c.batch_tokens));
}

}  // namespace

int main(int argc, char** argv) {
  Config c;
  std::string out = "out/g2p", load, resume;
  std::vector<std::string> words;
  CLI::App app{
      "Grapheme-to-phoneme on CMUdict with the Annotated Transformer or D2L's Bahdanau model"};
  const CLI::Validator positive = program::count(1), count = program::count(0);
  // The options that set what a run computes: --resume takes them from the run's run.json.
  const std::vector<CLI::Option*> run_options = {
      app.add_option("--data", c.data, "CMUdict file (Debian's pocketsphinx-en-us by default)"),
      app.add_option("--model", c.model,
                     "transformer (the Annotated Transformer) or bahdanau (D2L's GRU "
                     "encoder-decoder with additive attention)")
          ->check(CLI::IsMember({"transformer", "bahdanau"})),
      app.add_option("--layers", c.layers,
                     "encoder and decoder layers (N; bahdanau: GRU layers, default 2)")
          ->check(positive),
      app.add_option("--d-model", c.d_model,
                     "model width (bahdanau: the embedding and hidden size, default 256)")
          ->check(positive),
      app.add_option("--d-ff", c.d_ff, "feed-forward width (transformer)")->check(positive),
      app.add_option("--heads", c.heads, "attention heads (h; transformer)")->check(positive),
      app.add_option("--dropout", c.dropout, "dropout probability (bahdanau: default 0.2)")
          ->check(program::finite_in(0, 0.99)),
      app.add_option("--smoothing", c.smoothing, "label smoothing")
          ->check(program::finite_in(0, 0.99)),
      app.add_option("--batch-tokens", c.batch_tokens, "padded tokens per batch")->check(positive),
      app.add_option("--warmup", c.warmup, "warmup steps of the Noam rate")->check(positive),
      app.add_option("--lr-factor", c.lr_factor, "factor of the Noam rate")
          ->check(program::positive()),
      app.add_option("--clip", c.clip, "gradient norm clipping")->check(program::positive()),
      app.add_option("--patience", c.patience, "epochs without a better dev WER before stopping")
          ->check(positive),
      app.add_option("--beam", c.beam, "beam size")->check(program::finite_in(1, 64)),
      app.add_option("--alpha", c.alpha, "GNMT length penalty exponent")
          ->check(program::finite_in(0, 5)),
      app.add_option("--limit", c.limit, "train on the first N train words only (0: all)")
          ->check(count),
      app.add_option("--eval-limit", c.eval_limit, "evaluate the first N dev/test words (0: all)")
          ->check(count),
      app.add_option("--seed", c.seed, "random seed"),
      program::add_matmul_precision_option(app, c.matmul_precision)};
  CLI::Option* epochs = app.add_option("--epochs", c.epochs, "most epochs")->check(count);
  app.add_option("--log-every", c.log_every, "steps between progress lines")->check(positive);
  app.add_option("--checkpoint-every", c.checkpoint_every,
                 "steps between training checkpoints (also after every epoch)")
      ->check(positive);
  app.add_option("--max-steps", c.max_steps,
                 "stop after this many training steps of this process (0: no limit); "
                 "--resume continues")
      ->check(count);
  program::add_on_nonfinite_option(app, c.on_nonfinite);
  program::add_threads_option(app, c.threads);
  program::add_device_option(app, c.device);
  CLI::Option* out_option = app.add_option("--out", out, "output directory");
  app.add_option("--resume", resume, "continue the run saved in this directory")
      ->check(CLI::ExistingDirectory);
  app.add_option("--load", load, "pronounce words with the model saved in this directory")
      ->check(CLI::ExistingDirectory);
  app.add_option("--predict", words, "words to pronounce (needs --load; else read stdin)")
      ->needs("--load");
  return program::run("g2p", app, argc, argv, [&] {
    if (!resume.empty()) {
      program::check_resume_out(out_option, out, resume);
      c = program::resume_config(
          resume, c, [](Config& x, auto f) { config_fields(x, f); }, run_options,
          epochs->count() > 0 ? "epochs" : "");
      out = resume;
    }
    if (resume.empty() && c.model == "bahdanau") {
      // --model bahdanau's defaults where no flag sets them; --d-ff and --heads have no meaning
      const auto given = [&](const char* flag) { return app.get_option(flag)->count() > 0; };
      for (const char* flag : {"--d-ff", "--heads"})
        if (given(flag))
          throw CLI::ValidationError(flag, "sets the transformer's size: not for --model bahdanau");
      if (!given("--layers")) c.layers = kBahdanauDefaults.layers;
      if (!given("--d-model")) c.d_model = kBahdanauDefaults.d_model;
      if (!given("--dropout")) c.dropout = kBahdanauDefaults.dropout;
    }
    if (c.model == "transformer" && c.d_model % c.heads != 0)
      throw CLI::ValidationError(
          "--d-model", fmt::format("{} is not a multiple of --heads {}", c.d_model, c.heads));
    set_num_threads(c.threads);
    set_float32_matmul_precision(c.matmul_precision);
    (void)program::device_of(c.device);  // one line, before any work, when it is not usable
    manual_seed(c.seed);
    if (!load.empty()) return predict(load, words, c);
    program::check_memory(
        training_bytes(c),
        fmt::format("training --model {} with --layers {} --d-model {}{} --batch-tokens {}",
                    c.model, c.layers, c.d_model,
                    c.model == "transformer" ? fmt::format(" --d-ff {}", c.d_ff) : "",
                    c.batch_tokens));
    if (resume.empty())
      program::prepare_out_dir(out, {"model.safetensors", "metrics.json", "loss.svg",
                                     "predictions.tsv", "checkpoint.safetensors", "run.json"});
    return train(c, out, !resume.empty());
  });
}
