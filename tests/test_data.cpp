// The data layer: pad_sequence (values as torch's, gradients), Vocab (order, encode/decode, the
// text format), the reproducible shuffle (values from the Python transcription in
// data/sampler.h), and the DataLoader: padding and masks, every example once per epoch, the same
// seed giving the same batches, the token budget, drop_last, and its errors; DistributedSampler's
// shares (as torch's).
#include <algorithm>
#include <filesystem>
#include <numeric>
#include <set>

#include "helpers.h"

using namespace ember;
using namespace ember::testing;
using data::DataLoader;
using data::DataLoaderOptions;
using data::Example;
using data::Vocab;
using nn::utils::rnn::pad_sequence;

namespace {

// n examples with source lengths 1..12 and target lengths 2..9, tokens 4.. (no special).
std::shared_ptr<data::ExampleDataset> ragged_dataset(int64_t n) {
  std::vector<Example> examples;
  for (int64_t i = 0; i < n; ++i) {
    Example e;
    for (int64_t s = 0; s < 1 + (i * 7) % 12; ++s) e.src.push_back(4 + (i + s) % 9);
    e.tgt.push_back(Vocab::kBos);
    for (int64_t t = 0; t < (i * 5) % 8; ++t) e.tgt.push_back(4 + (i * t) % 7);
    e.tgt.push_back(Vocab::kEos);
    examples.push_back(e);
  }
  return std::make_shared<data::ExampleDataset>(examples);
}

int64_t padded_size(const data::ExampleDataset& ds, const std::vector<int64_t>& batch) {
  size_t longest = 0;
  for (int64_t i : batch) {
    const Example e = ds.get(i);
    longest = std::max({longest, e.src.size(), e.tgt.size()});
  }
  return static_cast<int64_t>(batch.size() * longest);
}

}  // namespace

BOOST_AUTO_TEST_SUITE(test_data)

BOOST_AUTO_TEST_CASE(pad_sequence_as_torch) {
  const Tensor a = tensor({1, 2, 3}), b = tensor({4}), c = tensor({5, 6});
  // torch.nn.utils.rnn.pad_sequence([a, b, c]) -> (3, 3), time first.
  expect_close(pad_sequence({a, b, c}),
               from_vector(std::vector<double>{1, 4, 5, 2, 0, 6, 3, 0, 0}, {3, 3}));
  expect_close(pad_sequence({a, b, c}, true, -1),
               from_vector(std::vector<double>{1, 2, 3, 4, -1, -1, 5, 6, -1}, {3, 3}));
  // Trailing dims ride along; Int64 stays Int64.
  const Tensor x = arange(0, 6).view({3, 2}), y = arange(6, 8).view({1, 2});
  const Tensor p = pad_sequence({x, y}, true);
  BOOST_TEST((p.shape() == Shape{2, 3, 2}));
  expect_close(p.narrow(1, 0, 1).squeeze(1), from_vector(std::vector<double>{0, 1, 6, 7}, {2, 2}));
  expect_close(p.narrow(0, 1, 1).squeeze(0).narrow(0, 1, 2), zeros({2, 2}));
  const Tensor ids = pad_sequence(
      {from_vector(std::vector<int64_t>{7, 8}, {2}), from_vector(std::vector<int64_t>{9}, {1})},
      true, 0);
  BOOST_TEST((ids.dtype() == kInt64));
  BOOST_TEST((ids.to_vector<int64_t>() == std::vector<int64_t>{7, 8, 9, 0}));
}

BOOST_AUTO_TEST_CASE(pad_sequence_gradient_and_errors) {
  manual_seed(3);
  check_gradient(
      [](const std::vector<Tensor>& in) { return (pad_sequence(in, true, 2.5) * 1.5).sum(); },
      {leaf({3, 2}), leaf({1, 2}), leaf({2, 2})}, "pad_sequence");
  expect_error([] { pad_sequence({}); }, {"pad_sequence", "empty"});
  expect_error(
      [] {
        pad_sequence({zeros({2, 3}), zeros({2, 4})});
      },
      {"pad_sequence", "sequence 1", "[2, 4]"});
  expect_error([] { pad_sequence({zeros({2}), zeros({2}, kInt64)}); }, {"pad_sequence", "dtype"});
}

BOOST_AUTO_TEST_CASE(vocab_orders_by_frequency_and_round_trips) {
  const Vocab v = Vocab::build({{"b", "a", "c"}, {"a", "b", "a"}, {"d"}});
  // specials, then a (3), b (2), c and d (1, byte order).
  BOOST_TEST((v.tokens() ==
              std::vector<std::string>{"<pad>", "<s>", "</s>", "<unk>", "a", "b", "c", "d"}));
  BOOST_TEST(v["a"] == 4);
  BOOST_TEST(v["zz"] == Vocab::kUnk);
  BOOST_TEST(v.token(7) == "d");
  BOOST_TEST((v.encode({"c", "zz"}, true, true) == std::vector<int64_t>{1, 6, 3, 2}));
  BOOST_TEST((v.decode({1, 6, 0, 4, 2, 5}) == std::vector<std::string>{"c", "a"}));
  BOOST_TEST(Vocab::build({{"a", "a", "b"}}, 2).size() == 5);

  const auto path = std::filesystem::temp_directory_path() / "ember_test_vocab.txt";
  v.save(path.string());
  BOOST_TEST((Vocab::load(path.string()) == v));
  BOOST_TEST((Vocab::from_text(v.to_text()) == v));
  std::filesystem::remove(path);

  expect_error([] { Vocab({"<pad>", "<s>", "</s>"}); }, {"Vocab", "4 specials"});
  expect_error([] { Vocab({"<pad>", "<s>", "<unk>", "</s>"}); }, {"Vocab", "id 2", "</s>"});
  expect_error(
      [] {
        Vocab({"<pad>", "<s>", "</s>", "<unk>", "x", "x"});
      },
      {"Vocab", "'x' appears twice"});
  expect_error([] { Vocab::from_text("<pad>\n<s>\n</s>\n", "phonemes.txt"); },
               {"phonemes.txt", "4 specials"});
  expect_error([] { Vocab::load("/nonexistent/vocab.txt"); }, {"Vocab::load", "/nonexistent"});
  expect_error([&] { v.token(8); }, {"Vocab", "id 8 out of range"});
}

BOOST_AUTO_TEST_CASE(shuffle_is_the_documented_algorithm) {
  // Values of the Python transcription of data/sampler.h's algorithm.
  BOOST_TEST(data::shuffle_key(42, 0, 0) == 0xbdd732262feb6e95ull);
  const data::RandomSampler sampler(10, 42);
  BOOST_TEST((sampler.indices(0) == std::vector<int64_t>{4, 6, 7, 0, 9, 5, 1, 2, 3, 8}));
  BOOST_TEST((sampler.indices(1) == std::vector<int64_t>{1, 3, 0, 4, 5, 8, 2, 7, 6, 9}));
  BOOST_TEST((data::SequentialSampler(3).indices(5) == std::vector<int64_t>{0, 1, 2}));
}

BOOST_AUTO_TEST_CASE(distributed_sampler_shards_as_torch) {
  // torch.utils.data.DistributedSampler(range(10), num_replicas=3, shuffle=False): the order
  // padded with its start to 12, then every third index from the rank.
  const auto share = [](int64_t rank, bool drop_last = false) {
    return data::DistributedSampler(10, 3, rank, /*shuffle=*/false, 0, drop_last).indices(0);
  };
  BOOST_TEST((share(0) == std::vector<int64_t>{0, 3, 6, 9}));
  BOOST_TEST((share(1) == std::vector<int64_t>{1, 4, 7, 0}));
  BOOST_TEST((share(2) == std::vector<int64_t>{2, 5, 8, 1}));
  BOOST_TEST((share(2, /*drop_last=*/true) == std::vector<int64_t>{2, 5, 8}));
  BOOST_TEST(data::DistributedSampler(10, 3, 0, false, 0, true).num_samples() == 3);
  // Padding repeats the order as often as it takes (torch's indices * ceil(...)).
  BOOST_TEST((data::DistributedSampler(2, 5, 4, false).indices(0) == std::vector<int64_t>{0}));

  // Shuffled: the shares interleave RandomSampler's permutation of the same seed and epoch, so
  // one replica is RandomSampler, and the shares of an epoch are disjoint and cover it.
  const data::RandomSampler whole(10, 42);
  BOOST_TEST((data::DistributedSampler(10, 1, 0, true, 42).indices(3) == whole.indices(3)));
  for (int64_t epoch : {0, 1}) {
    std::vector<int64_t> seen;
    for (int64_t rank = 0; rank < 2; ++rank) {
      const std::vector<int64_t> mine =
          data::DistributedSampler(10, 2, rank, true, 42).indices(epoch);
      BOOST_TEST(mine.size() == 5u);
      for (size_t i = 0; i < mine.size(); ++i)
        BOOST_TEST(mine[i] == whole.indices(epoch)[2 * i + static_cast<size_t>(rank)]);
      seen.insert(seen.end(), mine.begin(), mine.end());
    }
    std::sort(seen.begin(), seen.end());
    BOOST_TEST((seen == std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}));
  }
  BOOST_TEST((data::DistributedSampler(10, 2, 0, true, 42).indices(0) !=
              data::DistributedSampler(10, 2, 0, true, 42).indices(1)));

  // It plugs into the DataLoader: each rank batches its own share.
  const auto sampler = std::make_shared<data::DistributedSampler>(9, 2, 1, true, 7);
  const DataLoader loader(ragged_dataset(9), {.batch_tokens = 1000, .shuffle = false}, sampler);
  std::vector<int64_t> served;
  for (const auto& batch : loader.plan(0)) served.insert(served.end(), batch.begin(), batch.end());
  std::sort(served.begin(), served.end());
  std::vector<int64_t> expected = sampler->indices(0);
  std::sort(expected.begin(), expected.end());
  BOOST_TEST(served == expected);

  expect_error([] { data::DistributedSampler(10, 0, 0); }, {"DistributedSampler", "num_replicas"});
  expect_error([] { data::DistributedSampler(10, 2, 2); },
               {"DistributedSampler", "rank 2 out of range for 2"});
  expect_error([] { data::DistributedSampler(0, 2, 0); }, {"DistributedSampler", "empty"});
}

BOOST_AUTO_TEST_CASE(collate_pads_and_masks_as_batch) {
  auto ds = std::make_shared<data::ExampleDataset>(
      std::vector<Example>{{{5, 6, 7}, {1, 8, 2}}, {{9}, {1, 8, 9, 10, 2}}, {{4, 4}, {1, 2}}});
  const DataLoader loader(ds, {.shuffle = false});
  const nn::Batch b = loader.collate({0, 1, 2});
  BOOST_TEST((b.src.to_vector<int64_t>() == std::vector<int64_t>{5, 6, 7, 9, 0, 0, 4, 4, 0}));
  BOOST_TEST((b.src_mask.shape() == Shape{3, 1, 3}));
  BOOST_TEST((b.src_mask.to_vector<bool>() ==
              std::vector<bool>{true, true, true, true, false, false, true, true, false}));
  // tgt is the padded target without its last column, tgt_y without its first.
  const Tensor tgt = pad_sequence({from_vector(std::vector<int64_t>{1, 8, 2}, {3}),
                                   from_vector(std::vector<int64_t>{1, 8, 9, 10, 2}, {5}),
                                   from_vector(std::vector<int64_t>{1, 2}, {2})},
                                  true, 0);
  BOOST_TEST((b.tgt.to_vector<int64_t>() == tgt.narrow(1, 0, 4).to_vector<int64_t>()));
  BOOST_TEST((b.tgt_y.to_vector<int64_t>() == tgt.narrow(1, 1, 4).to_vector<int64_t>()));
  BOOST_TEST(b.ntokens == 2 + 4 + 1);
  BOOST_TEST(
      (b.tgt_mask.to_vector<bool>() == nn::Batch::make_std_mask(b.tgt, 0).to_vector<bool>()));
  // Row 2's decoder input is "1 2 0 0": query 3 sees keys 0 and 1 only.
  const std::vector<bool> row2 = b.tgt_mask.narrow(0, 2, 1).narrow(1, 3, 1).to_vector<bool>();
  BOOST_TEST((row2 == std::vector<bool>{true, true, false, false}));

  // Sources only.
  auto src_only =
      std::make_shared<data::ExampleDataset>(std::vector<Example>{{{5, 6}, {}}, {{7}, {}}});
  const nn::Batch s = DataLoader(src_only, {.shuffle = false}).collate({0, 1});
  BOOST_TEST(!s.tgt.defined());
  BOOST_TEST((s.src.to_vector<int64_t>() == std::vector<int64_t>{5, 6, 7, 0}));
  expect_error([&] { loader.collate({}); }, {"collate", "no examples"});
  auto bad =
      std::make_shared<data::ExampleDataset>(std::vector<Example>{{{5}, {1, 2}}, {{6}, {2}}});
  expect_error(
      [&] {
        DataLoader(bad, {.shuffle = false}).collate({0, 1});
      },
      {"collate", "example 1", "1 tokens"});
}

BOOST_AUTO_TEST_CASE(every_example_once_per_epoch) {
  const auto ds = ragged_dataset(257);
  for (int64_t pool : {0, 1, 40}) {
    const DataLoader loader(ds, {.batch_tokens = 48, .seed = 7, .pool_size = pool});
    for (int64_t epoch = 0; epoch < 3; ++epoch) {
      std::vector<int64_t> seen;
      for (const auto& batch : loader.plan(epoch))
        seen.insert(seen.end(), batch.begin(), batch.end());
      std::sort(seen.begin(), seen.end());
      std::vector<int64_t> all(257);
      std::iota(all.begin(), all.end(), 0);
      BOOST_TEST((seen == all), "pool " << pool << " epoch " << epoch);
    }
  }
  // And through the iterator, collated.
  const DataLoader loader(ds, {.batch_tokens = 64, .seed = 1});
  int64_t rows = 0;
  const auto epoch = loader.epoch(0);
  for (const nn::Batch& b : epoch) rows += b.src.size(0);
  BOOST_TEST(rows == 257);
}

BOOST_AUTO_TEST_CASE(same_seed_same_batches) {
  const auto ds = ragged_dataset(300);
  const DataLoaderOptions options{.batch_tokens = 60, .seed = 11, .pool_size = 100};
  const DataLoader a(ds, options), b(ds, options);
  BOOST_TEST((a.plan(0) == b.plan(0)));
  BOOST_TEST((a.plan(4) == b.plan(4)));
  BOOST_TEST((a.plan(0) != a.plan(1)));  // a new order every epoch
  DataLoaderOptions other = options;
  other.seed = 12;
  BOOST_TEST((DataLoader(ds, other).plan(0) != a.plan(0)));
  // The collated tensors agree too.
  const nn::Batch x = *a.epoch(2).begin(), y = *b.epoch(2).begin();
  BOOST_TEST((x.src.to_vector<int64_t>() == y.src.to_vector<int64_t>()));
  BOOST_TEST((x.tgt.to_vector<int64_t>() == y.tgt.to_vector<int64_t>()));
  // Without shuffling, the order is the dataset's, sorted by length in each pool.
  const DataLoader plain(ds, {.batch_tokens = 60, .shuffle = false});
  BOOST_TEST((plain.plan(0) == plain.plan(3)));
}

BOOST_AUTO_TEST_CASE(buckets_respect_the_token_budget) {
  const auto ds = ragged_dataset(500);
  for (int64_t budget : {12, 40, 100, 1000}) {
    const DataLoader loader(ds, {.batch_tokens = budget, .seed = 5});
    const auto plan = loader.plan(0);
    int64_t padded = 0, real = 0;
    for (const auto& batch : plan) {
      BOOST_TEST(padded_size(*ds, batch) <= budget, "budget " << budget);
      const nn::Batch b = loader.collate(batch);
      BOOST_TEST(b.src.numel() <= budget);
      BOOST_TEST(b.tgt.size(0) * (b.tgt.size(1) + 1) <= budget);
      padded += b.src.numel();
      for (int64_t i : batch) real += static_cast<int64_t>(ds->get(i).src.size());
    }
    // Bucketing keeps similar lengths together: little of the source is padding (where
    // unsorted batches of ragged_dataset's lengths 1..12 would be half padding).
    BOOST_TEST(static_cast<double>(real) / static_cast<double>(padded) > 0.8,
               "budget " << budget << ": " << real << " real of " << padded);
  }
  // At most batch_size examples; an example over the budget is a batch alone.
  const DataLoader capped(ds, {.batch_tokens = 1000, .batch_size = 7, .seed = 5});
  for (const auto& batch : capped.plan(0)) BOOST_TEST(batch.size() <= 7u);
  const DataLoader tiny(ds, {.batch_tokens = 5, .seed = 5});
  for (const auto& batch : tiny.plan(0))
    BOOST_TEST((batch.size() == 1 || padded_size(*ds, batch) <= 5));
}

BOOST_AUTO_TEST_CASE(drop_last_drops_incomplete_batches) {
  const auto ds = ragged_dataset(101);
  const DataLoader keep(ds, {.batch_tokens = 40, .seed = 2, .pool_size = 50});
  const DataLoader drop(ds, {.batch_tokens = 40, .seed = 2, .drop_last = true, .pool_size = 50});
  // drop_last serves the same batches but for incomplete ones, at most one per pool (3 pools):
  // one more example as long as the batch's longest would still have fit.
  const auto all = keep.plan(0), kept = drop.plan(0);
  std::multiset<std::vector<int64_t>> left(kept.begin(), kept.end());
  int64_t dropped = 0, examples = 0;
  for (const auto& b : all) {
    examples += static_cast<int64_t>(b.size());
    if (auto it = left.find(b); it != left.end()) {
      left.erase(it);
      continue;
    }
    ++dropped;
    const int64_t longest = padded_size(*ds, b) / static_cast<int64_t>(b.size());
    BOOST_TEST((static_cast<int64_t>(b.size()) + 1) * longest <= 40);
  }
  BOOST_TEST(left.empty());
  BOOST_TEST(examples == 101);
  BOOST_TEST(dropped >= 1);
  BOOST_TEST(dropped <= 3);
}

BOOST_AUTO_TEST_CASE(loader_errors) {
  const auto ds = ragged_dataset(4);
  expect_error([&] { DataLoader(ds, {.batch_tokens = 0}); }, {"DataLoader", "batch_tokens"});
  expect_error([] { DataLoader(nullptr); }, {"DataLoader", "no dataset"});
  // A sampler that does not fit the dataset.
  const auto sampler = std::make_shared<data::SequentialSampler>(9);
  expect_error([&] { DataLoader(ds, {}, sampler).plan(0); }, {"DataLoader", "index 4"});
  expect_error([] { data::ExampleDataset({}).get(0); }, {"ExampleDataset", "index 0"});
}

BOOST_AUTO_TEST_SUITE_END()
