// Megatron .bin/.idx format: byte-exact writer output checked against bytes assembled by hand
// from SPEC.md section 5, a hand-built Megatron-style uint16 dataset (with modes) read back,
// round trips in every integer dtype, corrupt-file errors and writer atomicity.
#include <gtest/gtest.h>

#include <cstring>
#include <limits>

#include "core/check.h"
#include "data/indexed_dataset.h"
#include "data_test_util.h"

using namespace moetrain;
using namespace moetrain::testing;

namespace {

std::vector<uint8_t> header(uint8_t code, uint64_t seqs, uint64_t docs) {
  std::vector<uint8_t> b = {'M', 'M', 'I', 'D', 'I', 'D', 'X', 0, 0};
  put_le(b, 1, 8);  // version
  b.push_back(code);
  put_le(b, seqs, 8);
  put_le(b, docs, 8);
  return b;
}

}  // namespace

TEST(IndexedDataset, WriterBytesMatchSpecExactly) {
  TempDir dir;
  const std::string p = dir / "tiny";
  {
    IndexedDatasetWriter w(p, IdxDType::kU16);
    std::vector<int32_t> a = {1, 2, 300}, b = {65535, 0}, c = {7};
    w.add_sequence(std::span<const int32_t>(a));
    w.add_sequence(std::span<const int32_t>(b));
    w.end_document();
    w.add_sequence(std::span<const int32_t>(c));
    w.end_document();
    w.commit();
  }
  // .bin: uint16 little-endian, back to back.
  const std::vector<uint8_t> bin = {1, 0, 2, 0, 0x2c, 0x01, 0xff, 0xff, 0, 0, 7, 0};
  EXPECT_EQ(read_bytes(p + ".bin"), bin);
  // .idx: header, code 8 (uint16), 3 sequences, 3 document-index entries (2 documents + 1).
  std::vector<uint8_t> idx = header(8, 3, 3);
  ASSERT_EQ(idx.size(), 34u);
  for (uint64_t len : {3, 2, 1}) put_le(idx, len, 4);
  for (uint64_t off : {0, 6, 10}) put_le(idx, off, 8);
  for (uint64_t d : {0, 2, 3}) put_le(idx, d, 8);
  EXPECT_EQ(read_bytes(p + ".idx"), idx);
  EXPECT_EQ(dir.files(), (std::vector<std::string>{"tiny.bin", "tiny.idx"}));
}

TEST(IndexedDataset, ReadsHandBuiltMegatronUint16WithModes) {
  TempDir dir;
  const std::string p = dir / "megatron_text_document";
  // Three documents of one sequence each (Megatron's usual layout), plus a modes array.
  std::vector<std::vector<uint16_t>> seqs = {{10, 20, 30, 40}, {50000}, {1, 65000, 3}};
  std::vector<uint8_t> bin, idx = header(8, 3, 4);
  std::vector<uint64_t> offs;
  for (auto& s : seqs) {
    offs.push_back(bin.size());
    for (uint16_t v : s) put_le(bin, v, 2);
  }
  for (auto& s : seqs) put_le(idx, s.size(), 4);
  for (uint64_t o : offs) put_le(idx, o, 8);
  for (uint64_t d : {0, 1, 2, 3}) put_le(idx, d, 8);
  for (uint8_t m : {0, 1, 0}) idx.push_back(m);
  write_bytes(p + ".bin", bin);
  write_bytes(p + ".idx", idx);

  IndexedDataset ds(p);
  EXPECT_EQ(ds.dtype(), IdxDType::kU16);
  EXPECT_EQ(ds.num_sequences(), 3);
  EXPECT_EQ(ds.num_documents(), 3);
  EXPECT_EQ(ds.num_tokens(), 8);
  ASSERT_TRUE(ds.has_modes());
  EXPECT_EQ(ds.sequence_mode(1), 1);
  for (int i = 0; i < 3; ++i) {
    std::vector<int32_t> want(seqs[i].begin(), seqs[i].end());
    EXPECT_EQ(ds.sequence(i), want) << i;
    EXPECT_EQ(ds.document_begin(i), i);
    EXPECT_EQ(ds.document_end(i), i + 1);
  }
  std::vector<int32_t> part;
  ds.read(2, 1, 2, part);
  EXPECT_EQ(part, (std::vector<int32_t>{65000, 3}));
  EXPECT_THROW(ds.read(2, 2, 2, part), Error);
}

TEST(IndexedDataset, RoundTripAllIntegerDtypes) {
  TempDir dir;
  struct Case { IdxDType t; int32_t lo, hi; };
  for (Case c : {Case{IdxDType::kU8, 0, 255}, Case{IdxDType::kI8, -128, 127}, Case{IdxDType::kI16, -32768, 32767},
                 Case{IdxDType::kU16, 0, 65535},
                 Case{IdxDType::kI32, std::numeric_limits<int32_t>::min(), std::numeric_limits<int32_t>::max()},
                 Case{IdxDType::kI64, -5, 151935}}) {
    const std::string p = dir / std::string("rt_") + idx_dtype_name(c.t);
    std::vector<std::vector<int32_t>> seqs = {{c.lo, c.hi, 0}, {}, {1}, {c.hi, c.hi, c.lo, 2, 3}};
    {
      IndexedDatasetWriter w(p, c.t);
      for (size_t i = 0; i < seqs.size(); ++i) {
        w.add_sequence(std::span<const int32_t>(seqs[i]));
        if (i % 2 == 1) w.end_document();
      }
      w.commit();
    }
    IndexedDataset ds(p);
    EXPECT_EQ(ds.dtype(), c.t);
    ASSERT_EQ(ds.num_sequences(), 4);
    ASSERT_EQ(ds.num_documents(), 2);
    EXPECT_EQ(ds.document_length(0), 3);
    EXPECT_EQ(ds.document_length(1), 6);
    EXPECT_FALSE(ds.has_modes());
    for (size_t i = 0; i < seqs.size(); ++i) EXPECT_EQ(ds.sequence(i), seqs[i]) << idx_dtype_name(c.t) << " " << i;
    EXPECT_EQ(static_cast<int64_t>(read_bytes(p + ".bin").size()), 9 * static_cast<int64_t>(idx_dtype_size(c.t)));
  }
}

TEST(IndexedDataset, EmptyDatasetRoundTrips) {
  TempDir dir;
  const std::string p = dir / "empty";
  IndexedDatasetWriter(p, IdxDType::kI32).commit();
  IndexedDataset ds(p);
  EXPECT_EQ(ds.num_sequences(), 0);
  EXPECT_EQ(ds.num_documents(), 0);
  EXPECT_EQ(read_bytes(p + ".idx").size(), 34u + 8u);
}

TEST(IndexedDataset, WriterRejectsOutOfRangeAndOpenDocuments) {
  TempDir dir;
  IndexedDatasetWriter w(dir / "bad", IdxDType::kU16);
  std::vector<int32_t> big = {1, 70000};
  try {
    w.add_sequence(std::span<const int32_t>(big));
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("70000"), std::string::npos) << e.what();
  }
  EXPECT_THROW(w.end_document(), Error);  // no sequence in it
  std::vector<int32_t> ok = {1};
  w.add_sequence(std::span<const int32_t>(ok));
  EXPECT_THROW(w.finish(), Error);  // sequence after the last end_document
}

TEST(IndexedDataset, UncommittedWriterLeavesNothing) {
  TempDir dir;
  {
    IndexedDatasetWriter w(dir / "half", IdxDType::kI32);
    std::vector<int32_t> v = {1, 2, 3};
    w.add_sequence(std::span<const int32_t>(v));
    w.end_document();
    EXPECT_EQ(dir.files(), (std::vector<std::string>{"half.bin.tmp"}));
    w.finish();
    EXPECT_EQ(dir.files(), (std::vector<std::string>{"half.bin.tmp", "half.idx.tmp"}));
  }
  EXPECT_TRUE(dir.files().empty());
}

TEST(IndexedDataset, CorruptFilesNameTheProblem) {
  TempDir dir;
  const std::string p = dir / "c";
  auto expect_error = [&](const std::vector<uint8_t>& idx, const std::string& needle) {
    write_bytes(p + ".idx", idx);
    write_bytes(p + ".bin", std::vector<uint8_t>(8, 0));
    try {
      IndexedDataset ds(p);
      FAIL() << "expected an error mentioning " << needle;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  std::vector<uint8_t> good = header(4, 1, 2);
  put_le(good, 2, 4);
  put_le(good, 0, 8);
  put_le(good, 0, 8);
  put_le(good, 1, 8);
  write_bytes(p + ".idx", good);
  write_bytes(p + ".bin", std::vector<uint8_t>(8, 0));
  EXPECT_NO_THROW(IndexedDataset{p});

  std::vector<uint8_t> bad = good;
  bad[0] = 'X';
  expect_error(bad, "magic");
  bad = good;
  bad[9] = 2;
  expect_error(bad, "version 2");
  bad = good;
  bad[17] = 9;
  expect_error(bad, "dtype code 9");
  bad = good;
  bad.pop_back();
  expect_error(bad, "bytes");
  bad = good;
  bad[34] = 3;  // 3 int32 tokens = 12 bytes > 8-byte .bin
  expect_error(bad, "outside");
  bad = good;
  bad[34 + 4 + 8 + 8] = 0;  // document index ends at 0, not at sequence_count 1
  expect_error(bad, "document indices");
  try {
    IndexedDataset ds(dir / "missing");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("missing.idx"), std::string::npos) << e.what();
  }
}

TEST(IndexedDataset, VocabDtypeRule) {
  EXPECT_EQ(idx_dtype_for_vocab(32000), IdxDType::kU16);
  EXPECT_EQ(idx_dtype_for_vocab(65499), IdxDType::kU16);
  EXPECT_EQ(idx_dtype_for_vocab(65500), IdxDType::kI32);
  EXPECT_EQ(idx_dtype_for_vocab(151936), IdxDType::kI32);
  EXPECT_EQ(mask_prefix("out/sft_train"), "out/sft_train_mask");
}
