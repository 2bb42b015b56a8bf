// Grapheme-to-phoneme conversion on the CMU Pronouncing Dictionary with the Annotated
// Transformer (issue 14): spelling in, pronunciation out. The split is fixed by FNV-1a of the
// word (examples/g2p_task.h); the model is nn::make_model over grapheme and phoneme vocabularies
// built from the train split; training is the original's recipe (label smoothing, Adam with the
// Noam rate, here plus gradient clipping) over token-budget batches of similar lengths
// (data::DataLoader). Every epoch measures dev WER with greedy decoding, keeps the best model and
// stops when dev WER has not improved for --patience epochs. At the end the best model decodes
// the test split greedily and with beam search: WER, PER, predictions, plots, attention maps.
// Not yet: --resume (it needs the training checkpoints of train/checkpoint.h).
//
//   g2p --epochs 30 --out out/g2p                       train (the default config)
//   g2p --load out/g2p --predict hello world            pronounce words with a trained model
//   echo hello | g2p --load out/g2p                     words from standard input
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "ember.h"
#include "g2p_task.h"

using namespace ember;
using data::Vocab;
using nn::EncoderDecoder;
using Clock = std::chrono::steady_clock;

namespace {

struct Config {
  int64_t layers = 3, d_model = 256, d_ff = 1024, heads = 4;
  double dropout = 0.1, smoothing = 0.1, lr_factor = 1.0, clip = 1.0, alpha = 0.6;
  int64_t batch_tokens = 4096, epochs = 30, warmup = 4000, patience = 4, beam = 5;
  int64_t limit = 0, eval_limit = 0, log_every = 200;
  uint64_t seed = 0;
  int threads = 0;
  std::string data = g2p::kDefaultDict;
};

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
std::vector<std::vector<int64_t>> decode_all(EncoderDecoder& model,
                                             std::shared_ptr<const data::ExampleDataset> dataset,
                                             const Config& c, int64_t beam) {
  model.eval();
  const data::DataLoader loader(dataset, {.batch_tokens = c.batch_tokens, .shuffle = false});
  std::vector<std::vector<int64_t>> out(static_cast<size_t>(dataset->size()));
  for (const auto& indices : loader.plan(0)) {
    const nn::Batch batch = loader.collate(indices);
    const int64_t max_len = batch.src.size(1) + 6;
    const auto hyps = beam == 1 ? nn::greedy_search(model, batch.src, batch.src_mask, max_len,
                                                    Vocab::kBos, Vocab::kEos, c.alpha)
                                : nn::beam_search(model, batch.src, batch.src_mask, max_len,
                                                  Vocab::kBos, Vocab::kEos, beam, c.alpha);
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

// One training epoch: loss per target token and tokens per second.
struct EpochStats {
  double loss, tokens_per_second, seconds;
  int64_t tokens;
};
EpochStats train_epoch(EncoderDecoder& model, const data::DataLoader& loader, int64_t epoch,
                       nn::LabelSmoothing& criterion, optim::Optimizer& optimizer,
                       optim::LambdaLR& scheduler, const Config& c) {
  model.train();
  const auto start = Clock::now();
  double total_loss = 0;
  int64_t total_tokens = 0, step = 0;
  const auto plan = loader.plan(epoch);
  for (const auto& indices : plan) {
    const nn::Batch batch = loader.collate(indices);
    const Tensor out = model.forward(batch.src, batch.tgt, batch.src_mask, batch.tgt_mask);
    const Tensor logits = model.generator->forward(out);
    const Tensor loss = criterion(logits.contiguous().view({-1, logits.size(-1)}),
                                  batch.tgt_y.contiguous().view({-1})) /
                        static_cast<double>(batch.ntokens);
    loss.backward();
    optim::clip_grad_norm_(model.parameters(), c.clip);
    optimizer.step();
    optimizer.zero_grad();
    scheduler.step();
    total_loss += loss.item<double>() * static_cast<double>(batch.ntokens);
    total_tokens += batch.ntokens;
    if (++step % c.log_every == 0) {
      fmt::print("  epoch {} step {:5d}/{} | loss {:.4f} | {:.0f} tokens/s | lr {:.2e}\n",
                 epoch + 1, step, plan.size(), total_loss / static_cast<double>(total_tokens),
                 static_cast<double>(total_tokens) / seconds_since(start), optimizer.lr());
      std::fflush(stdout);
    }
  }
  const double seconds = seconds_since(start);
  return {total_loss / static_cast<double>(std::max<int64_t>(total_tokens, 1)),
          static_cast<double>(total_tokens) / seconds, seconds, total_tokens};
}

std::map<std::string, std::string> model_metadata(const Config& c, const Vocab& graphemes,
                                                  const Vocab& phonemes) {
  return {{"format", "pt"},
          {"layers", std::to_string(c.layers)},
          {"d_model", std::to_string(c.d_model)},
          {"d_ff", std::to_string(c.d_ff)},
          {"heads", std::to_string(c.heads)},
          {"graphemes", graphemes.to_text()},
          {"phonemes", phonemes.to_text()}};
}

void save_model(const std::string& dir, const EncoderDecoder& model, const Config& c,
                const Vocab& graphemes, const Vocab& phonemes) {
  nn::write_safetensors(dir + "/model.safetensors", model.state_dict(),
                        model_metadata(c, graphemes, phonemes));
  graphemes.save(dir + "/graphemes.txt");
  phonemes.save(dir + "/phonemes.txt");
}

// Source-attention maps of the last decoder layer (heads side by side, phonemes x graphemes)
// for the first `count` test words, teacher-forced with their predictions: attn_src_<n>.svg.
void draw_attention(EncoderDecoder& model, const EvalSet& test,
                    const std::vector<std::vector<int64_t>>& predictions, const Vocab& phonemes,
                    const std::string& out, size_t count) {
  NoGradGuard no_grad;
  model.eval();
  for (size_t i = 0; i < std::min(count, test.words.size()); ++i) {
    const data::Example e = test.dataset->get(static_cast<int64_t>(i));
    std::vector<int64_t> tgt{Vocab::kBos};
    tgt.insert(tgt.end(), predictions[i].begin(), predictions[i].end());
    const auto S = static_cast<int64_t>(e.src.size()), T = static_cast<int64_t>(tgt.size());
    model.forward(from_vector(e.src, {1, S}), from_vector(tgt, {1, T}), ones({1, 1, S}, kBool),
                  nn::subsequent_mask(T));
    const auto& layer = model.decoder->layer(model.decoder->layers->size() - 1);
    std::vector<std::string> titles;
    for (int64_t h = 0; h < layer.src_attn->h; ++h)
      titles.push_back(fmt::format("{} head {}", test.words[i], h + 1));
    viz::show_heatmaps(
        layer.src_attn->attn, fmt::format("{}/attn_src_{}.svg", out, i + 1), "grapheme",
        fmt::format("phoneme ({})", fmt::join(phonemes.decode(predictions[i]), " ")), titles);
  }
}

// --load DIR: rebuilds the saved model and pronounces words (from --predict, else stdin lines).
int predict(const std::string& dir, std::vector<std::string> words, const Config& c) {
  const nn::SafetensorsFile file = nn::read_safetensors(dir + "/model.safetensors");
  const auto meta = [&](const char* key) { return std::stoll(file.metadata.at(key)); };
  const Vocab graphemes = Vocab::load(dir + "/graphemes.txt");
  const Vocab phonemes = Vocab::load(dir + "/phonemes.txt");
  auto model = nn::make_model(graphemes.size(), phonemes.size(), meta("layers"), meta("d_model"),
                              meta("d_ff"), meta("heads"), 0.0);
  nn::load(*model, dir + "/model.safetensors");
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
  const auto predictions = decode_all(*model, dataset, c, c.beam);
  for (size_t i = 0; i < words.size(); ++i)
    fmt::print("{}\t{}\n", words[i], fmt::join(phonemes.decode(predictions[i]), " "));
  return 0;
}

}  // namespace

namespace {

// The first `limit` entries (all when 0): a slice of a split for quick runs.
std::vector<g2p::Entry> head(std::vector<g2p::Entry> entries, int64_t limit) {
  if (limit > 0 && static_cast<size_t>(limit) < entries.size()) entries.resize(limit);
  return entries;
}

struct Evaluation {
  g2p::ErrorRates rates;
  std::vector<std::vector<int64_t>> predictions;
};
Evaluation evaluate(EncoderDecoder& model, const EvalSet& set, const Config& c, int64_t beam) {
  Evaluation e;
  e.predictions = decode_all(model, set.dataset, c, beam);
  e.rates = score(set, e.predictions);
  return e;
}

int run(const Config& c, const std::string& out) {
  const auto run_start = Clock::now();
  std::filesystem::create_directories(out);
  const g2p::CmuDict dict = g2p::read_cmudict(c.data);
  const auto train_words = head(dict.train, c.limit);
  const auto dev_words = head(dict.dev, c.eval_limit), test_words = head(dict.test, c.eval_limit);
  std::vector<std::vector<std::string>> spellings, pronunciations;
  std::vector<data::Example> examples;
  for (const g2p::Entry& e : train_words) {
    spellings.push_back(g2p::graphemes(e.word));
    for (const auto& p : e.pronunciations) pronunciations.push_back(p);
  }
  const Vocab graphemes = Vocab::build(spellings), phonemes = Vocab::build(pronunciations);
  for (const g2p::Entry& e : train_words)
    for (const auto& p : e.pronunciations)
      examples.push_back(
          {graphemes.encode(g2p::graphemes(e.word)), phonemes.encode(p, true, true)});
  fmt::print(
      "{}: {} lines; words train {} / dev {} / test {} (using {} / {} / {}); {} training "
      "pronunciations; {} graphemes, {} phonemes (with 4 specials)\n",
      c.data, dict.lines, dict.train.size(), dict.dev.size(), dict.test.size(), train_words.size(),
      dev_words.size(), test_words.size(), examples.size(), graphemes.size(), phonemes.size());
  const EvalSet dev = eval_set(dev_words, graphemes, phonemes);
  const EvalSet test = eval_set(test_words, graphemes, phonemes);
  const data::DataLoader loader(std::make_shared<data::ExampleDataset>(std::move(examples)),
                                {.batch_tokens = c.batch_tokens, .seed = c.seed});

  auto model = nn::make_model(graphemes.size(), phonemes.size(), c.layers, c.d_model, c.d_ff,
                              c.heads, c.dropout);
  nn::LabelSmoothing criterion(phonemes.size(), Vocab::kPad, c.smoothing);
  optim::Adam optimizer(model->parameters(), {.lr = 1.0, .beta1 = 0.9, .beta2 = 0.98, .eps = 1e-9});
  optim::LambdaLR scheduler(
      optimizer, [&](int64_t step) { return optim::rate(step, c.d_model, c.lr_factor, c.warmup); });
  viz::Animator animator("epoch", "value", {"train loss", "dev WER"},
                         std::pair<double, double>{1, std::max<double>(2, c.epochs)});
  std::vector<double> train_losses, dev_wers;
  double best_wer = 2, best_per = 2, train_seconds = 0;
  int64_t tokens = 0, best_epoch = 0, epochs = 0;
  for (int64_t epoch = 0; epoch < c.epochs; ++epoch) {
    const EpochStats s = train_epoch(*model, loader, epoch, criterion, optimizer, scheduler, c);
    train_seconds += s.seconds;
    tokens += s.tokens;
    const g2p::ErrorRates rates = evaluate(*model, dev, c, 1).rates;
    const double wer = rates.wer();
    // Better: a lower dev WER, or the same and a lower PER.
    const bool better = std::pair(wer, rates.per()) < std::pair(best_wer, best_per);
    train_losses.push_back(s.loss);
    dev_wers.push_back(wer);
    animator.add(static_cast<double>(epoch + 1), {s.loss, wer});
    epochs = epoch + 1;
    const double elapsed = seconds_since(run_start);
    fmt::print(
        "epoch {}/{} | train loss {:.4f} | {:.0f} tokens/s | lr {:.2e} | dev WER {:.4f}{} "
        "| elapsed {:.0f}s | ETA {:.0f}s\n",
        epoch + 1, c.epochs, s.loss, s.tokens_per_second, optimizer.lr(), wer,
        wer < best_wer ? " (best)" : "", elapsed,
        elapsed / static_cast<double>(epoch + 1) * static_cast<double>(c.epochs - epoch - 1));
    std::fflush(stdout);
    if (better) {
      best_wer = wer;
      best_per = rates.per();
      best_epoch = epoch + 1;
      save_model(out, *model, c, graphemes, phonemes);
    } else if (epoch + 1 - best_epoch >= c.patience) {
      fmt::print("dev WER has not improved for {} epochs: stopping\n", c.patience);
      break;
    }
  }
  animator.save(out + "/loss.svg");
  if (best_epoch > 0)
    nn::load(*model, out + "/model.safetensors");
  else
    save_model(out, *model, c, graphemes, phonemes);

  // Test: greedy and beam; the setting better on dev writes the predictions.
  const Evaluation greedy = evaluate(*model, test, c, 1), beam = evaluate(*model, test, c, c.beam);
  const double dev_beam_wer = evaluate(*model, dev, c, c.beam).rates.wer();
  const bool use_beam = dev_beam_wer <= best_wer;
  const Evaluation& chosen = use_beam ? beam : greedy;
  fmt::print(
      "test (best epoch {}): greedy WER {:.4f} PER {:.4f} | beam {} WER {:.4f} PER {:.4f} | "
      "predictions by {} (dev WER greedy {:.4f}, beam {:.4f})\n",
      best_epoch, greedy.rates.wer(), greedy.rates.per(), c.beam, beam.rates.wer(),
      beam.rates.per(), use_beam ? "beam" : "greedy", best_wer, dev_beam_wer);
  {
    std::ofstream tsv(out + "/predictions.tsv");
    for (size_t i = 0; i < test.words.size(); ++i)
      tsv << test.words[i] << '\t'
          << fmt::format("{}", fmt::join(phonemes.decode(chosen.predictions[i]), " ")) << '\n';
  }
  draw_attention(*model, test, chosen.predictions, phonemes, out, 3);
  const nlohmann::ordered_json metrics = {
      {"config",
       {{"data", c.data},
        {"layers", c.layers},
        {"d_model", c.d_model},
        {"d_ff", c.d_ff},
        {"heads", c.heads},
        {"dropout", c.dropout},
        {"smoothing", c.smoothing},
        {"batch_tokens", c.batch_tokens},
        {"warmup", c.warmup},
        {"lr_factor", c.lr_factor},
        {"clip", c.clip},
        {"beam", c.beam},
        {"alpha", c.alpha},
        {"patience", c.patience},
        {"limit", c.limit},
        {"eval_limit", c.eval_limit},
        {"seed", c.seed},
        {"threads", get_num_threads()}}},
      {"split_sizes",
       {{"train", dict.train.size()},
        {"dev", dict.dev.size()},
        {"test", dict.test.size()},
        {"train_used", train_words.size()},
        {"dev_used", dev_words.size()},
        {"test_used", test_words.size()}}},
      {"train_loss", train_losses},
      {"dev_wer", dev_wers},
      {"best_epoch", best_epoch},
      {"decoding", use_beam ? "beam" : "greedy"},
      {"test_wer", chosen.rates.wer()},
      {"test_per", chosen.rates.per()},
      {"test_wer_greedy", greedy.rates.wer()},
      {"test_per_greedy", greedy.rates.per()},
      {"test_wer_beam", beam.rates.wer()},
      {"test_per_beam", beam.rates.per()},
      {"train_seconds", train_seconds},
      {"epochs", epochs},
      {"tokens_per_second", static_cast<double>(tokens) / std::max(train_seconds, 1e-9)},
      {"total_seconds", seconds_since(run_start)}};
  std::ofstream(out + "/metrics.json") << metrics.dump(2) << "\n";
  fmt::print(
      "wrote {}/{{metrics.json, predictions.tsv, model.safetensors, graphemes.txt, "
      "phonemes.txt, loss.svg, attn_src_*.svg}}\n",
      out);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Config c;
  std::string out = "out/g2p", load;
  std::vector<std::string> words;
  CLI::App app{"Grapheme-to-phoneme on CMUdict with the Annotated Transformer"};
  app.add_option("--data", c.data, "CMUdict file (Debian's pocketsphinx-en-us by default)");
  app.add_option("--layers", c.layers, "encoder and decoder layers (N)")
      ->check(CLI::PositiveNumber);
  app.add_option("--d-model", c.d_model, "model width")->check(CLI::PositiveNumber);
  app.add_option("--d-ff", c.d_ff, "feed-forward width")->check(CLI::PositiveNumber);
  app.add_option("--heads", c.heads, "attention heads (h)")->check(CLI::PositiveNumber);
  app.add_option("--dropout", c.dropout, "dropout probability")->check(CLI::Range(0.0, 0.99));
  app.add_option("--smoothing", c.smoothing, "label smoothing")->check(CLI::Range(0.0, 0.99));
  app.add_option("--batch-tokens", c.batch_tokens, "padded tokens per batch")
      ->check(CLI::PositiveNumber);
  app.add_option("--epochs", c.epochs, "most epochs")->check(CLI::NonNegativeNumber);
  app.add_option("--warmup", c.warmup, "warmup steps of the Noam rate")->check(CLI::PositiveNumber);
  app.add_option("--lr-factor", c.lr_factor, "factor of the Noam rate")->check(CLI::PositiveNumber);
  app.add_option("--clip", c.clip, "gradient norm clipping")->check(CLI::PositiveNumber);
  app.add_option("--patience", c.patience, "epochs without a better dev WER before stopping")
      ->check(CLI::PositiveNumber);
  app.add_option("--beam", c.beam, "beam size")->check(CLI::PositiveNumber);
  app.add_option("--alpha", c.alpha, "GNMT length penalty exponent")->check(CLI::Range(0.0, 5.0));
  app.add_option("--limit", c.limit, "train on the first N train words only (0: all)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--eval-limit", c.eval_limit, "evaluate the first N dev/test words (0: all)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--log-every", c.log_every, "steps between progress lines")
      ->check(CLI::PositiveNumber);
  app.add_option("--seed", c.seed, "random seed");
  app.add_option("--threads", c.threads, "threads for OpenMP and OpenBLAS (0: all cores)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--out", out, "output directory");
  app.add_option("--load", load, "pronounce words with the model saved in this directory")
      ->check(CLI::ExistingDirectory);
  app.add_option("--predict", words, "words to pronounce (needs --load; else read stdin)")
      ->needs("--load");
  try {
    app.parse(argc, argv);
    if (c.d_model % c.heads != 0)
      throw CLI::ValidationError(
          "--d-model", fmt::format("{} is not a multiple of --heads {}", c.d_model, c.heads));
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    return code == 0 ? 0 : 2;
  }
  set_num_threads(c.threads);
  manual_seed(c.seed);
  try {
    return load.empty() ? run(c, out) : predict(load, words, c);
  } catch (const Error& e) {
    fmt::print(stderr, "g2p: {}\n", e.what());
    return 1;
  }
}
