// TensorBoard event files written natively: TFRecord framing (u64 length, masked CRC32C of the
// length, data, masked CRC32C of the data) around hand-encoded Event protobufs. The first record
// is file_version "brain.Event:2"; each scalar is Event{wall_time, step, summary{value{tag,
// simple_value}}}. TensorBoard and W&B's tensorboard sync read these files.
#pragma once
#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

namespace moetrain {

// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), as in iSCSI and TFRecord.
uint32_t crc32c(const void* data, size_t n, uint32_t crc = 0);
// TFRecord's mask: rotate right by 15 and add 0xa282ead8.
uint32_t masked_crc32c(const void* data, size_t n);

// One TFRecord frame around `payload`.
std::string tfrecord_frame(const std::string& payload);

// Protobuf encodings of tensorboard's Event (fields 1 wall_time double, 2 step int64,
// 3 file_version string, 5 summary) and Summary.Value (1 tag, 2 simple_value float).
std::string encode_event_file_version(double wall_time, const std::string& version);
std::string encode_event_scalars(double wall_time, int64_t step,
                                 const std::vector<std::pair<std::string, float>>& scalars);

class TensorBoardWriter {
 public:
  // Creates `dir` and a new events.out.tfevents.<seconds>.<host>.<pid> file in it.
  explicit TensorBoardWriter(const std::string& dir);
  ~TensorBoardWriter();
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;

  void add_scalars(int64_t step, const std::vector<std::pair<std::string, float>>& scalars);
  void flush();
  const std::string& path() const { return path_; }

 private:
  void write_record_(const std::string& payload);
  std::string path_;
  std::FILE* file_ = nullptr;
};

}  // namespace moetrain
