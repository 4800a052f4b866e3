// Packing loader: every micro-batch is checked against the documents it came from (greedy packing
// characterised independently: consecutive documents of the epoch order, split only when longer
// than seq_length, padding only when the next document does not fit), labels/positions/cu_seqlens
// and trained-token counts recomputed from the raw documents and masks, determinism, cursor
// save/restore through JSON text, epoch rollover, data-parallel interleaving and mock data.
#include <gtest/gtest.h>

#include <map>
#include <numeric>
#include <random>

#include "core/check.h"
#include "data/indexed_dataset.h"
#include "data/loader.h"
#include "data_test_util.h"

using namespace moetrain;
using namespace moetrain::testing;

namespace {

struct Docs {
  std::vector<std::vector<int32_t>> tok;
  std::vector<std::vector<uint8_t>> mask;
};

// Writes docs (one sequence each, or split into two sequences when `split_sequences`).
void write_docs(const std::string& prefix, const Docs& d, bool with_mask, bool split_sequences = false) {
  IndexedDatasetWriter w(prefix, IdxDType::kI32);
  std::unique_ptr<IndexedDatasetWriter> m;
  if (with_mask) m = std::make_unique<IndexedDatasetWriter>(mask_prefix(prefix), IdxDType::kU8);
  for (size_t i = 0; i < d.tok.size(); ++i) {
    const size_t cut = split_sequences ? d.tok[i].size() / 2 : d.tok[i].size();
    std::span<const int32_t> t(d.tok[i]);
    w.add_sequence(t.subspan(0, cut));
    if (split_sequences) w.add_sequence(t.subspan(cut));
    w.end_document();
    if (m) {
      std::span<const uint8_t> mm(d.mask[i]);
      m->add_sequence(mm.subspan(0, cut));
      if (split_sequences) m->add_sequence(mm.subspan(cut));
      m->end_document();
    }
  }
  w.commit();
  if (m) m->commit();
}

// Document lengths include 1-token documents, one of exactly T and ones longer than 2T.
Docs make_docs(int n, int64_t T, uint32_t seed) {
  std::mt19937 rng(seed);
  Docs d;
  for (int i = 0; i < n; ++i) {
    int64_t len;
    if (i == 3) len = 1;
    else if (i == 5) len = T;
    else if (i == 7) len = 2 * T + 3;
    else if (i == 11) len = T + 1;
    else len = 1 + rng() % (T * 3 / 4);
    std::vector<int32_t> t(len);
    std::vector<uint8_t> m(len);
    for (int64_t k = 0; k < len; ++k) {
      t[k] = static_cast<int32_t>(1000 * i + k);  // identifies document and position
      m[k] = (rng() % 4) != 0;
    }
    d.tok.push_back(std::move(t));
    d.mask.push_back(std::move(m));
  }
  return d;
}

std::vector<MicroBatch> take(DataLoader& l, int n) {
  std::vector<MicroBatch> out;
  MicroBatch b;
  for (int i = 0; i < n && l.next(b); ++i) out.push_back(b);
  return out;
}

bool same(const MicroBatch& a, const MicroBatch& b) {
  return a.tokens == b.tokens && a.positions == b.positions && a.cu_seqlens == b.cu_seqlens && a.labels == b.labels &&
         a.loss_mask == b.loss_mask && a.num_trained_tokens == b.num_trained_tokens && a.epoch == b.epoch;
}

// Walks batches against the documents in `order` (repeated per epoch via order_of) and checks the
// packing rules and every label. Adds tokens seen per (epoch, document) to `seen`.
using Seen = std::map<std::pair<int64_t, int64_t>, int64_t>;
void verify(Seen& seen, const std::vector<MicroBatch>& batches, const Docs& d,
                                                       const std::function<std::vector<int64_t>(int64_t)>& order_of,
                                                       int64_t T, bool masked, int64_t max_epochs = 0) {
  int64_t epoch = 0, pos = 0, off = 0;
  std::vector<int64_t> order = order_of(0);
  auto advance_epoch_if_done = [&] {
    while (pos == static_cast<int64_t>(order.size())) {
      order = order_of(++epoch);
      pos = 0;
    }
  };
  for (size_t bi = 0; bi < batches.size(); ++bi) {
    const MicroBatch& b = batches[bi];
    SCOPED_TRACE("batch " + std::to_string(bi));
    ASSERT_EQ(static_cast<int64_t>(b.tokens.size()), T);
    ASSERT_EQ(b.positions.size(), b.tokens.size());
    ASSERT_EQ(b.labels.size(), b.tokens.size());
    ASSERT_EQ(b.loss_mask.size(), b.tokens.size());
    ASSERT_GE(b.cu_seqlens.size(), 2u);
    EXPECT_EQ(b.cu_seqlens.front(), 0);
    EXPECT_EQ(b.cu_seqlens.back(), T);
    int64_t trained = 0;
    for (int64_t t = 0; t < T; ++t) trained += b.loss_mask[t] != 0;
    EXPECT_EQ(b.num_trained_tokens, trained);
    advance_epoch_if_done();
    EXPECT_EQ(b.epoch, epoch);
    const int64_t real_segments = b.num_segments() - (b.num_padding > 0 ? 1 : 0);
    for (int64_t s = 0; s < b.num_segments(); ++s) {
      const int64_t a = b.cu_seqlens[s], e = b.cu_seqlens[s + 1];
      ASSERT_LT(a, e);
      for (int64_t t = a; t < e; ++t) ASSERT_EQ(b.positions[t], t - a);
      if (s >= real_segments) {  // padding segment
        EXPECT_EQ(e - a, b.num_padding);
        for (int64_t t = a; t < e; ++t) {
          EXPECT_EQ(b.labels[t], kIgnoreLabel);
          EXPECT_EQ(b.loss_mask[t], 0.0f);
        }
        // Padding only happens when the next document would not fit (it is at most T long) or
        // at the end of the last epoch.
        if (max_epochs > 0 && epoch + 1 == max_epochs && pos == static_cast<int64_t>(order.size())) {
          EXPECT_EQ(bi + 1, batches.size());
          continue;
        }
        advance_epoch_if_done();
        const int64_t next_len = static_cast<int64_t>(d.tok[order[pos]].size());
        EXPECT_EQ(off, 0);
        EXPECT_GT(next_len, e - a);
        EXPECT_LE(next_len, T);
        continue;
      }
      advance_epoch_if_done();
      const int64_t doc = order[pos];
      const auto& tok = d.tok[doc];
      const auto& mask = d.mask[doc];
      const int64_t len = static_cast<int64_t>(tok.size());
      for (int64_t t = a; t < e; ++t) {
        const int64_t k = off + (t - a);  // position in the document
        ASSERT_EQ(b.tokens[t], tok[k]) << "doc " << doc;
        const bool train = k + 1 < len && (!masked || mask[k + 1]);
        EXPECT_EQ(b.labels[t], train ? tok[k + 1] : kIgnoreLabel) << "doc " << doc << " k " << k;
        EXPECT_EQ(b.loss_mask[t], train ? 1.0f : 0.0f);
      }
      seen[{epoch, doc}] += e - a;
      off += e - a;
      if (off < len) {
        // Split: only documents longer than T, and only at the end of a micro-batch.
        EXPECT_GT(len, T) << "doc " << doc << " split although it fits";
        EXPECT_EQ(e, T);
      } else {
        ++pos;
        off = 0;
      }
    }
  }
}

}  // namespace

TEST(PackedLoader, PacksWholeEpochCorrectly) {
  TempDir dir;
  const int64_t T = 64;
  Docs d = make_docs(40, T, 1);
  write_docs(dir / "ds", d, true);
  LoaderOptions o;
  o.seq_length = T;
  o.seed = 7;
  o.max_epochs = 1;
  PackedLoader l(dir / "ds", o);
  auto batches = take(l, 1000);
  MicroBatch extra;
  EXPECT_FALSE(l.next(extra));
  Seen seen;
  verify(seen, batches, d, [&](int64_t e) { return l.epoch_order(e); }, T, true, 1);
  // Every token of every document exactly once.
  for (size_t i = 0; i < d.tok.size(); ++i) EXPECT_EQ((seen[{0, static_cast<int64_t>(i)}]), (int64_t)d.tok[i].size());
  int64_t real = 0;
  for (auto& b : batches) real += T - b.num_padding;
  EXPECT_EQ(real, l.num_tokens());
}

TEST(PackedLoader, MultiSequenceDocumentsAndNoMask) {
  TempDir dir;
  const int64_t T = 16;
  Docs d = make_docs(12, T, 2);
  write_docs(dir / "ds", d, /*with_mask=*/false, /*split_sequences=*/true);
  LoaderOptions o;
  o.seq_length = T;
  o.shuffle = false;
  o.max_epochs = 2;
  PackedLoader l(dir / "ds", o);
  auto batches = take(l, 1000);
  Seen seen;
  verify(seen, batches, d, [&](int64_t e) { return l.epoch_order(e); }, T, /*masked=*/false, 2);
  EXPECT_EQ(l.epoch_order(1), l.epoch_order(0));
  for (int64_t e : {0, 1})
    for (size_t i = 0; i < d.tok.size(); ++i) EXPECT_EQ((seen[{e, (int64_t)i}]), (int64_t)d.tok[i].size());
}

TEST(PackedLoader, ShuffleIsSeededPermutationPerEpoch) {
  TempDir dir;
  Docs d = make_docs(50, 32, 3);
  write_docs(dir / "ds", d, true);
  LoaderOptions o;
  o.seq_length = 32;
  o.seed = 11;
  PackedLoader a(dir / "ds", o), b(dir / "ds", o);
  o.seed = 12;
  PackedLoader c(dir / "ds", o);
  auto e0 = a.epoch_order(0), e1 = a.epoch_order(1);
  std::vector<int64_t> ident(50);
  std::iota(ident.begin(), ident.end(), 0);
  auto sorted = [](std::vector<int64_t> v) { std::sort(v.begin(), v.end()); return v; };
  EXPECT_EQ(sorted(e0), ident);
  EXPECT_EQ(sorted(e1), ident);
  EXPECT_NE(e0, e1);
  EXPECT_NE(e0, ident);
  EXPECT_EQ(e0, b.epoch_order(0));
  EXPECT_NE(e0, c.epoch_order(0));
  auto ba = take(a, 30), bb = take(b, 30), bc = take(c, 30);
  for (int i = 0; i < 30; ++i) EXPECT_TRUE(same(ba[i], bb[i])) << i;
  bool differs = false;
  for (int i = 0; i < 30; ++i) differs |= !same(ba[i], bc[i]);
  EXPECT_TRUE(differs);
}

TEST(PackedLoader, EpochRolloverContinuesStream) {
  TempDir dir;
  const int64_t T = 48;
  Docs d = make_docs(15, T, 4);
  write_docs(dir / "ds", d, true);
  LoaderOptions o;
  o.seq_length = T;
  o.seed = 5;
  PackedLoader l(dir / "ds", o);
  std::vector<MicroBatch> batches;
  MicroBatch b;
  while (l.cursor().epoch < 3 && l.next(b)) batches.push_back(b);
  ASSERT_GE(l.cursor().epoch, 3);
  Seen seen;
  verify(seen, batches, d, [&](int64_t e) { return l.epoch_order(e); }, T, true);
  for (int64_t e : {0, 1, 2})
    for (size_t i = 0; i < d.tok.size(); ++i) EXPECT_EQ((seen[{e, (int64_t)i}]), (int64_t)d.tok[i].size()) << e;
  EXPECT_EQ(batches.back().epoch >= 2, true);
}

TEST(PackedLoader, CursorSaveRestoreGivesSameBatches) {
  TempDir dir;
  const int64_t T = 40;
  Docs d = make_docs(25, T, 6);
  write_docs(dir / "ds", d, true);
  LoaderOptions o;
  o.seq_length = T;
  o.seed = 99;
  PackedLoader ref(dir / "ds", o);
  auto all = take(ref, 80);  // several epochs
  bool saw_mid_document = false;
  for (int k = 0; k < 80; ++k) {
    PackedLoader a(dir / "ds", o);
    take(a, k);
    saw_mid_document |= a.cursor().offset != 0;
    const std::string saved = a.state().dump();  // through text, as in a checkpoint
    PackedLoader b(dir / "ds", o);
    b.load_state(nlohmann::json::parse(saved));
    EXPECT_EQ(b.cursor(), a.cursor());
    auto rest = take(b, 80 - k);
    for (int i = 0; i < 80 - k; ++i) ASSERT_TRUE(same(rest[i], all[k + i])) << "resume at " << k << " batch " << i;
  }
  EXPECT_TRUE(saw_mid_document) << "test should cover resuming inside a long document";
}

TEST(PackedLoader, LoadStateRejectsMismatches) {
  TempDir dir;
  Docs d = make_docs(10, 32, 7);
  write_docs(dir / "ds", d, true);
  LoaderOptions o;
  o.seq_length = 32;
  PackedLoader a(dir / "ds", o);
  take(a, 3);
  nlohmann::json s = a.state();
  o.seq_length = 64;
  PackedLoader b(dir / "ds", o);
  try {
    b.load_state(s);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("seq_length=32"), std::string::npos) << e.what();
  }
  nlohmann::json bad = s;
  bad["cursor"]["position"] = 1000;
  o.seq_length = 32;
  PackedLoader c(dir / "ds", o);
  EXPECT_THROW(c.load_state(bad), Error);
  bad = s;
  bad["cursor"].erase("epoch");
  EXPECT_THROW(c.load_state(bad), Error);
}

TEST(PackedLoader, DataParallelRanksInterleaveTheGlobalStream) {
  TempDir dir;
  const int64_t T = 32;
  Docs d = make_docs(20, T, 8);
  write_docs(dir / "ds", d, true);
  LoaderOptions o;
  o.seq_length = T;
  o.max_epochs = 1;
  PackedLoader g(dir / "ds", o);
  auto global = take(g, 1000);
  o.dp_size = 3;
  for (int r = 0; r < 3; ++r) {
    o.dp_rank = r;
    PackedLoader l(dir / "ds", o);
    auto mine = take(l, 1000);
    EXPECT_EQ(mine.size(), (global.size() + 2) / 3);  // last group padded for missing ranks
    for (size_t i = 0; i < mine.size(); ++i) {
      const size_t gi = 3 * i + r;
      if (gi < global.size()) {
        EXPECT_TRUE(same(mine[i], global[gi])) << r << " " << i;
      } else {
        EXPECT_EQ(mine[i].num_trained_tokens, 0);
        EXPECT_EQ(mine[i].num_padding, T);
      }
    }
  }
}

TEST(MockLoader, DeterministicRandomTokens) {
  LoaderOptions o;
  o.seq_length = 37;
  o.seed = 3;
  MockLoader a(1000, o), b(1000, o);
  auto ba = take(a, 4), bb = take(b, 4);
  for (int i = 0; i < 4; ++i) {
    EXPECT_TRUE(same(ba[i], bb[i]));
    ASSERT_EQ(ba[i].tokens.size(), 37u);
    EXPECT_EQ(ba[i].cu_seqlens, (std::vector<int32_t>{0, 37}));
    EXPECT_EQ(ba[i].num_trained_tokens, 36);
    for (int t = 0; t < 37; ++t) {
      EXPECT_GE(ba[i].tokens[t], 0);
      EXPECT_LT(ba[i].tokens[t], 1000);
      EXPECT_EQ(ba[i].labels[t], t + 1 < 37 ? ba[i].tokens[t + 1] : kIgnoreLabel);
    }
  }
  EXPECT_NE(ba[0].tokens, ba[1].tokens);
  MockLoader c(1000, o);
  c.load_state(nlohmann::json::parse(a.state().dump()));
  MicroBatch x, y;
  a.next(x);
  c.next(y);
  EXPECT_TRUE(same(x, y));
}

TEST(PreferenceDataset, ReadsPairs) {
  TempDir dir;
  const std::string p = dir / "pref";
  IndexedDatasetWriter w(p, IdxDType::kU16), m(mask_prefix(p), IdxDType::kU8);
  std::vector<int32_t> c = {1, 2, 3}, r = {1, 2, 4, 5};
  std::vector<uint8_t> cm = {0, 1, 1}, rm = {0, 0, 1, 1};
  w.add_sequence(std::span<const int32_t>(c));
  w.add_sequence(std::span<const int32_t>(r));
  w.end_document();
  m.add_sequence(std::span<const uint8_t>(cm));
  m.add_sequence(std::span<const uint8_t>(rm));
  m.end_document();
  w.commit();
  m.commit();
  PreferenceDataset ds(p);
  ASSERT_EQ(ds.size(), 1);
  PreferencePair pair = ds.get(0);
  EXPECT_EQ(pair.chosen, c);
  EXPECT_EQ(pair.rejected, r);
  EXPECT_EQ(pair.rejected_mask, (std::vector<int32_t>{0, 0, 1, 1}));
  EXPECT_THROW(ds.get(1), Error);
}
