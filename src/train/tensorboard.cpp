// TensorBoard event-file writer (see tensorboard.h). CRC32C is a table-driven software CRC
// (slow but ample for a few hundred bytes per step). Protobuf wire format: tag = field << 3 |
// wire type (0 varint, 1 fixed64, 2 length-delimited, 5 fixed32), little-endian fixed fields.
#include "train/tensorboard.h"

#include <unistd.h>

#include <array>
#include <chrono>
#include <cstring>
#include <filesystem>

#include <fmt/format.h>

#include "core/check.h"

namespace moetrain {

namespace {

std::array<uint32_t, 256> make_crc32c_table() {
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    t[i] = c;
  }
  return t;
}

void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}

void put_fixed(std::string& out, const void* p, size_t n) { out.append(static_cast<const char*>(p), n); }  // LE host

void put_tag(std::string& out, uint32_t field, uint32_t wire) { put_varint(out, (field << 3) | wire); }

void put_bytes_field(std::string& out, uint32_t field, const std::string& bytes) {
  put_tag(out, field, 2);
  put_varint(out, bytes.size());
  out += bytes;
}

void put_event_header(std::string& out, double wall_time) {
  put_tag(out, 1, 1);
  put_fixed(out, &wall_time, 8);
}

}  // namespace

uint32_t crc32c(const void* data, size_t n, uint32_t crc) {
  static const std::array<uint32_t, 256> table = make_crc32c_table();
  const auto* p = static_cast<const uint8_t*>(data);
  crc = ~crc;
  for (size_t i = 0; i < n; ++i) crc = table[(crc ^ p[i]) & 0xff] ^ (crc >> 8);
  return ~crc;
}

uint32_t masked_crc32c(const void* data, size_t n) {
  const uint32_t c = crc32c(data, n);
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

std::string tfrecord_frame(const std::string& payload) {
  std::string out;
  const uint64_t len = payload.size();
  put_fixed(out, &len, 8);
  const uint32_t len_crc = masked_crc32c(&len, 8);
  put_fixed(out, &len_crc, 4);
  out += payload;
  const uint32_t data_crc = masked_crc32c(payload.data(), payload.size());
  put_fixed(out, &data_crc, 4);
  return out;
}

std::string encode_event_file_version(double wall_time, const std::string& version) {
  std::string e;
  put_event_header(e, wall_time);
  put_bytes_field(e, 3, version);
  return e;
}

std::string encode_event_scalars(double wall_time, int64_t step,
                                 const std::vector<std::pair<std::string, float>>& scalars) {
  std::string summary;
  for (const auto& [tag, value] : scalars) {
    std::string v;
    put_bytes_field(v, 1, tag);
    put_tag(v, 2, 5);
    put_fixed(v, &value, 4);
    put_bytes_field(summary, 1, v);
  }
  std::string e;
  put_event_header(e, wall_time);
  put_tag(e, 2, 0);
  put_varint(e, static_cast<uint64_t>(step));
  put_bytes_field(e, 5, summary);
  return e;
}

static double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

TensorBoardWriter::TensorBoardWriter(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  MT_CHECK(!ec, "[tensorboard] cannot create directory {}: {}", dir, ec.message());
  char host[256] = "localhost";
  gethostname(host, sizeof(host) - 1);
  const double t = now_seconds();
  path_ = fmt::format("{}/events.out.tfevents.{}.{}.{}", dir, static_cast<int64_t>(t), host, getpid());
  file_ = std::fopen(path_.c_str(), "wb");
  MT_CHECK(file_ != nullptr, "[tensorboard] cannot create {}", path_);
  write_record_(encode_event_file_version(t, "brain.Event:2"));
  flush();
}

TensorBoardWriter::~TensorBoardWriter() {
  if (file_) std::fclose(file_);
}

void TensorBoardWriter::write_record_(const std::string& payload) {
  const std::string rec = tfrecord_frame(payload);
  MT_CHECK(std::fwrite(rec.data(), 1, rec.size(), file_) == rec.size(), "[tensorboard] write to {} failed", path_);
}

void TensorBoardWriter::add_scalars(int64_t step, const std::vector<std::pair<std::string, float>>& scalars) {
  if (scalars.empty()) return;
  write_record_(encode_event_scalars(now_seconds(), step, scalars));
}

void TensorBoardWriter::flush() { std::fflush(file_); }

}  // namespace moetrain
