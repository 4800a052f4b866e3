// TensorBoard writer: CRC32C against the RFC 3720 / iSCSI vectors, the TFRecord frame of the
// standard first record (every TensorBoard event file starts with the same 12 bytes), and the
// protobuf bytes of a scalar Event encoded by hand from the wire-format rules.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "train/tensorboard.h"

using namespace moetrain;

namespace {
std::string hex(const std::string& s) {
  static const char* d = "0123456789abcdef";
  std::string o;
  for (unsigned char c : s) o += d[c >> 4], o += d[c & 15];
  return o;
}
uint32_t u32_at(const std::string& s, size_t off) {
  uint32_t v;
  std::memcpy(&v, s.data() + off, 4);
  return v;
}
}  // namespace

TEST(TensorBoard, Crc32cKnownVectors) {
  EXPECT_EQ(crc32c("123456789", 9), 0xE3069283u);
  std::string zeros(32, '\0'), ones(32, '\xff'), inc(32, '\0');
  for (int i = 0; i < 32; ++i) inc[i] = static_cast<char>(i);
  EXPECT_EQ(crc32c(zeros.data(), 32), 0x8A9136AAu);
  EXPECT_EQ(crc32c(ones.data(), 32), 0x62A8AB43u);
  EXPECT_EQ(crc32c(inc.data(), 32), 0x46DD794Eu);
  EXPECT_EQ(crc32c("", 0), 0u);
  // Incremental use gives the same result.
  EXPECT_EQ(crc32c("6789", 4, crc32c("12345", 5)), 0xE3069283u);
  EXPECT_EQ(masked_crc32c("123456789", 9), 0xC78AB0E5u);
}

TEST(TensorBoard, FirstRecordFramingMatchesRealEventFiles) {
  const std::string ev = encode_event_file_version(1.5, "brain.Event:2");
  // wall_time: field 1 fixed64 (0x09) + 1.5 LE; file_version: field 3 bytes (0x1a), length 13.
  EXPECT_EQ(hex(ev), "09000000000000f83f1a0d" + hex("brain.Event:2"));
  const std::string rec = tfrecord_frame(ev);
  ASSERT_EQ(rec.size(), 8 + 4 + ev.size() + 4);
  // Length 24 and its masked CRC32C: the first 12 bytes of every TensorBoard event file.
  EXPECT_EQ(hex(rec.substr(0, 12)), "1800000000000000a37f4b22");
  EXPECT_EQ(rec.substr(12, ev.size()), ev);
  EXPECT_EQ(u32_at(rec, 12 + ev.size()), masked_crc32c(ev.data(), ev.size()));
}

TEST(TensorBoard, ScalarEventBytes) {
  const std::string ev = encode_event_scalars(1.5, 3, {{"a", 1.0f}});
  // 09 <1.5> | 10 03 (step) | 2a 0a (summary, 10 bytes) 0a 08 (value, 8 bytes) 0a 01 'a' 15 <1.0f>
  EXPECT_EQ(hex(ev), "09000000000000f83f" "1003" "2a0a" "0a08" "0a0161" "150000803f");
  // Multi-byte varint step (300 = ac 02) and two values (summary = 2 + 8 + 2 + 9 = 21 bytes).
  const std::string ev2 = encode_event_scalars(0.0, 300, {{"x", 2.0f}, {"yy", -1.0f}});
  EXPECT_EQ(hex(ev2), "090000000000000000" "10ac02" "2a15" "0a08" "0a0178" "1500000040" "0a09" "0a027979" "15000080bf");
}

TEST(TensorBoard, WriterProducesAReadableFile) {
  const std::string dir = testing::TempDir() + "/tb_test";
  std::filesystem::remove_all(dir);
  std::string path;
  {
    TensorBoardWriter w(dir);
    w.add_scalars(1, {{"train/loss", 2.5f}});
    w.add_scalars(2, {{"train/loss", 2.0f}, {"train/lr", 1e-4f}});
    path = w.path();
  }
  EXPECT_NE(path.find("events.out.tfevents."), std::string::npos);
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string data = ss.str();
  // Walk the frames, checking both CRCs of each record.
  size_t off = 0;
  int records = 0;
  while (off < data.size()) {
    ASSERT_LE(off + 12, data.size());
    uint64_t len;
    std::memcpy(&len, data.data() + off, 8);
    EXPECT_EQ(u32_at(data, off + 8), masked_crc32c(data.data() + off, 8));
    ASSERT_LE(off + 12 + len + 4, data.size());
    EXPECT_EQ(u32_at(data, off + 12 + len), masked_crc32c(data.data() + off + 12, len));
    off += 12 + len + 4;
    ++records;
  }
  EXPECT_EQ(records, 3);
  EXPECT_NE(data.find("brain.Event:2"), std::string::npos);
  EXPECT_NE(data.find("train/lr"), std::string::npos);
}
