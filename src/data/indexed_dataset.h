// Megatron indexed dataset (.bin/.idx), SPEC.md section 5: a reader that mmaps both files and a
// writer that streams tokens to temporary files and renames them into place on commit().
// .idx = "MMIDIDX\0\0", u64 version 1, u8 dtype code, u64 sequence_count, u64 document_count,
// i32 lengths[S], i64 byte offsets[S], i64 document indices[D] (0 .. S), optional i8 modes[S].
#pragma once
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace moetrain {

// Megatron's dtype codes, as stored in the .idx header.
enum class IdxDType : uint8_t {
  kU8 = 1, kI8 = 2, kI16 = 3, kI32 = 4, kI64 = 5, kF64 = 6, kF32 = 7, kU16 = 8
};
size_t idx_dtype_size(IdxDType t);
const char* idx_dtype_name(IdxDType t);
// The token dtype Megatron picks for a vocabulary: uint16 below 65500 ids, else int32.
IdxDType idx_dtype_for_vocab(int64_t vocab_size);

std::string idx_path(const std::string& prefix);   // prefix + ".idx"
std::string bin_path(const std::string& prefix);   // prefix + ".bin"
std::string mask_prefix(const std::string& prefix);  // prefix + "_mask": the loss-mask dataset
bool indexed_dataset_exists(const std::string& prefix);  // both .idx and .bin present

// Read-only view of one dataset. Sequences are the unit of storage; documents group consecutive
// sequences (one sequence per document for text and chat data, two for preference pairs).
class IndexedDataset {
 public:
  explicit IndexedDataset(const std::string& prefix);  // throws moetrain::Error naming the file
  ~IndexedDataset();
  IndexedDataset(const IndexedDataset&) = delete;
  IndexedDataset& operator=(const IndexedDataset&) = delete;

  const std::string& prefix() const { return prefix_; }
  IdxDType dtype() const { return dtype_; }
  int64_t num_sequences() const { return num_sequences_; }
  int64_t num_documents() const { return num_documents_; }
  int64_t num_tokens() const { return num_tokens_; }
  bool has_modes() const { return modes_ != nullptr; }

  // The .idx arrays start at byte 34, so they are unaligned: read them with memcpy.
  int32_t sequence_length(int64_t i) const { return load<int32_t>(lengths_, i); }
  int64_t sequence_offset(int64_t i) const { return load<int64_t>(offsets_, i); }  // into .bin
  int8_t sequence_mode(int64_t i) const;
  // Sequences of document d are [document_begin(d), document_end(d)).
  int64_t document_begin(int64_t d) const { return load<int64_t>(doc_index_, d); }
  int64_t document_end(int64_t d) const { return load<int64_t>(doc_index_, d + 1); }
  int64_t document_length(int64_t d) const;  // tokens over all its sequences

  // Elements [start, start+count) of sequence i converted to int32 (integer dtypes only; values
  // that do not fit int32 throw). Appends to `out`.
  void read(int64_t i, int64_t start, int64_t count, std::vector<int32_t>& out) const;
  std::vector<int32_t> sequence(int64_t i) const;
  // Raw bytes of sequence i (length * dtype size) inside the mapped .bin.
  const uint8_t* sequence_bytes(int64_t i) const;

 private:
  template <typename T>
  static T load(const uint8_t* base, int64_t i) {
    T v;
    std::memcpy(&v, base + i * static_cast<int64_t>(sizeof(T)), sizeof(T));
    return v;
  }
  struct Mapping;
  std::string prefix_;
  IdxDType dtype_ = IdxDType::kI32;
  int64_t num_sequences_ = 0;
  int64_t num_documents_ = 0;
  int64_t num_tokens_ = 0;
  std::unique_ptr<Mapping> idx_map_, bin_map_;
  const uint8_t* lengths_ = nullptr;    // i32[S]
  const uint8_t* offsets_ = nullptr;    // i64[S]
  const uint8_t* doc_index_ = nullptr;  // i64[D+1]
  const uint8_t* modes_ = nullptr;      // i8[S] or null
};

// Streams sequences into PREFIX.bin.tmp; finish() writes PREFIX.idx.tmp; commit() renames both
// into place. A writer destroyed before commit() removes its temporary files, so a failed run
// leaves no half dataset behind.
class IndexedDatasetWriter {
 public:
  IndexedDatasetWriter(const std::string& prefix, IdxDType dtype);
  ~IndexedDatasetWriter();
  IndexedDatasetWriter(const IndexedDatasetWriter&) = delete;
  IndexedDatasetWriter& operator=(const IndexedDatasetWriter&) = delete;

  // Appends one sequence; every value must be representable in the dataset's dtype.
  void add_sequence(std::span<const int32_t> tokens);
  void add_sequence(std::span<const uint8_t> values);
  void end_document();  // closes the current document (must hold at least one sequence)
  void set_mode(int8_t mode);  // optional per-sequence mode for the last added sequence

  int64_t num_sequences() const { return static_cast<int64_t>(lengths_.size()); }
  int64_t num_documents() const { return static_cast<int64_t>(doc_index_.size()) - 1; }
  int64_t num_tokens() const { return num_tokens_; }

  void finish();  // flushes .bin.tmp, writes .idx.tmp (idempotent)
  void commit();  // finish() then rename both temporaries to PREFIX.bin / PREFIX.idx
  void abort();   // removes the temporaries

 private:
  void append_raw(const void* data, size_t bytes, int64_t count);
  std::string prefix_;
  IdxDType dtype_;
  std::FILE* bin_ = nullptr;
  std::vector<int32_t> lengths_;
  std::vector<int64_t> offsets_;
  std::vector<int64_t> doc_index_{0};
  std::vector<int8_t> modes_;
  bool any_mode_ = false;
  int64_t bytes_ = 0;
  int64_t num_tokens_ = 0;
  bool finished_ = false, committed_ = false;
  std::vector<uint8_t> scratch_;
};

}  // namespace moetrain
