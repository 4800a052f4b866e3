// Megatron indexed dataset reader (mmap) and writer (temporary files renamed on commit).
// Byte layout: SPEC.md section 5; everything little-endian, which is also the host order on the
// machines moetrain supports (checked at compile time).
#include "data/indexed_dataset.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <cstdio>
#include <limits>

#include "core/check.h"

static_assert(std::endian::native == std::endian::little, "indexed datasets assume a little-endian host");

namespace moetrain {
namespace {

constexpr char kMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', '\0', '\0'};
constexpr size_t kHeaderBytes = 9 + 8 + 1 + 8 + 8;

bool valid_code(uint8_t c) { return c >= 1 && c <= 8; }

bool file_exists(const std::string& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0;
}

}  // namespace

size_t idx_dtype_size(IdxDType t) {
  switch (t) {
    case IdxDType::kU8: case IdxDType::kI8: return 1;
    case IdxDType::kI16: case IdxDType::kU16: return 2;
    case IdxDType::kI32: case IdxDType::kF32: return 4;
    case IdxDType::kI64: case IdxDType::kF64: return 8;
  }
  return 0;
}

const char* idx_dtype_name(IdxDType t) {
  switch (t) {
    case IdxDType::kU8: return "uint8";
    case IdxDType::kI8: return "int8";
    case IdxDType::kI16: return "int16";
    case IdxDType::kI32: return "int32";
    case IdxDType::kI64: return "int64";
    case IdxDType::kF64: return "float64";
    case IdxDType::kF32: return "float32";
    case IdxDType::kU16: return "uint16";
  }
  return "?";
}

IdxDType idx_dtype_for_vocab(int64_t vocab_size) {
  return vocab_size < 65500 ? IdxDType::kU16 : IdxDType::kI32;
}

std::string idx_path(const std::string& prefix) { return prefix + ".idx"; }
std::string bin_path(const std::string& prefix) { return prefix + ".bin"; }
std::string mask_prefix(const std::string& prefix) { return prefix + "_mask"; }
bool indexed_dataset_exists(const std::string& prefix) {
  return file_exists(idx_path(prefix)) && file_exists(bin_path(prefix));
}

// ---- reader ------------------------------------------------------------------------------------

struct IndexedDataset::Mapping {
  const uint8_t* data = nullptr;
  size_t size = 0;
  explicit Mapping(const std::string& path) {
    int fd = ::open(path.c_str(), O_RDONLY);
    MT_CHECK(fd >= 0, "[dataset] cannot open {}: {}", path, std::strerror(errno));
    struct stat st;
    if (::fstat(fd, &st) != 0) {
      ::close(fd);
      MT_FAIL("[dataset] cannot stat {}", path);
    }
    size = static_cast<size_t>(st.st_size);
    if (size > 0) {
      void* p = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
      ::close(fd);
      MT_CHECK(p != MAP_FAILED, "[dataset] cannot mmap {}: {}", path, std::strerror(errno));
      data = static_cast<const uint8_t*>(p);
    } else {
      ::close(fd);
    }
  }
  ~Mapping() {
    if (data) ::munmap(const_cast<uint8_t*>(data), size);
  }
};

IndexedDataset::IndexedDataset(const std::string& prefix) : prefix_(prefix) {
  const std::string ip = idx_path(prefix), bp = bin_path(prefix);
  MT_CHECK(file_exists(ip), "[dataset] index file {} does not exist (expected PREFIX.idx and PREFIX.bin)", ip);
  MT_CHECK(file_exists(bp), "[dataset] data file {} does not exist (expected PREFIX.idx and PREFIX.bin)", bp);
  idx_map_ = std::make_unique<Mapping>(ip);
  bin_map_ = std::make_unique<Mapping>(bp);
  const uint8_t* p = idx_map_->data;
  const size_t n = idx_map_->size;
  MT_CHECK(n >= kHeaderBytes && std::memcmp(p, kMagic, 9) == 0,
           "[dataset] {} is not a Megatron index file (expected magic MMIDIDX\\0\\0)", ip);
  uint64_t version, seqs, docs;
  std::memcpy(&version, p + 9, 8);
  MT_CHECK(version == 1, "[dataset] {} has index version {}, expected 1", ip, version);
  const uint8_t code = p[17];
  MT_CHECK(valid_code(code), "[dataset] {} has unknown dtype code {} (expected 1..8)", ip, code);
  dtype_ = static_cast<IdxDType>(code);
  std::memcpy(&seqs, p + 18, 8);
  std::memcpy(&docs, p + 26, 8);
  MT_CHECK(docs >= 1, "[dataset] {} has document_count 0 (the document index always starts with 0)", ip);
  const uint64_t base = kHeaderBytes + 12 * seqs + 8 * docs;
  MT_CHECK(seqs < (uint64_t(1) << 40) && docs < (uint64_t(1) << 40) && (n == base || n == base + seqs),
           "[dataset] {} is {} bytes but its header (sequence_count {}, document_count {}) implies {} "
           "(or {} with modes)", ip, n, seqs, docs, base, base + seqs);
  num_sequences_ = static_cast<int64_t>(seqs);
  num_documents_ = static_cast<int64_t>(docs) - 1;
  lengths_ = p + kHeaderBytes;
  offsets_ = lengths_ + 4 * seqs;
  doc_index_ = offsets_ + 8 * seqs;
  if (n == base + seqs && seqs > 0) modes_ = doc_index_ + 8 * docs;

  MT_CHECK(document_begin(0) == 0 && load<int64_t>(doc_index_, num_documents_) == num_sequences_,
           "[dataset] {}: document indices must start at 0 and end at sequence_count {}", ip, num_sequences_);
  for (int64_t d = 0; d < num_documents_; ++d)
    MT_CHECK(document_begin(d) <= document_end(d), "[dataset] {}: document index {} decreases", ip, d + 1);
  const int64_t es = static_cast<int64_t>(idx_dtype_size(dtype_));
  const int64_t bin_size = static_cast<int64_t>(bin_map_->size);
  for (int64_t i = 0; i < num_sequences_; ++i) {
    const int64_t len = sequence_length(i), off = sequence_offset(i);
    MT_CHECK(len >= 0 && off >= 0 && off + len * es <= bin_size,
             "[dataset] {}: sequence {} (length {}, offset {}) lies outside {} ({} bytes)", ip, i, len,
             off, bp, bin_size);
    num_tokens_ += len;
  }
}

IndexedDataset::~IndexedDataset() = default;

int8_t IndexedDataset::sequence_mode(int64_t i) const {
  return modes_ ? static_cast<int8_t>(modes_[i]) : 0;
}

int64_t IndexedDataset::document_length(int64_t d) const {
  int64_t n = 0;
  for (int64_t s = document_begin(d); s < document_end(d); ++s) n += sequence_length(s);
  return n;
}

const uint8_t* IndexedDataset::sequence_bytes(int64_t i) const {
  return bin_map_->data + sequence_offset(i);
}

void IndexedDataset::read(int64_t i, int64_t start, int64_t count, std::vector<int32_t>& out) const {
  MT_CHECK(i >= 0 && i < num_sequences_, "[dataset] {}: sequence {} out of range [0, {})", prefix_, i,
           num_sequences_);
  MT_CHECK(start >= 0 && count >= 0 && start + count <= sequence_length(i),
           "[dataset] {}: range [{}, {}) outside sequence {} of length {}", prefix_, start, start + count,
           i, sequence_length(i));
  const uint8_t* p = sequence_bytes(i);
  const size_t old = out.size();
  out.resize(old + static_cast<size_t>(count));
  int32_t* o = out.data() + old;
  auto narrow = [&](int64_t v, int64_t k) {
    MT_CHECK(v >= std::numeric_limits<int32_t>::min() && v <= std::numeric_limits<int32_t>::max(),
             "[dataset] {}: value {} at sequence {} position {} does not fit int32", prefix_, v, i, k);
    return static_cast<int32_t>(v);
  };
  switch (dtype_) {
    case IdxDType::kU8:
      for (int64_t k = 0; k < count; ++k) o[k] = p[start + k];
      break;
    case IdxDType::kI8:
      for (int64_t k = 0; k < count; ++k) o[k] = static_cast<int8_t>(p[start + k]);
      break;
    case IdxDType::kU16:
      for (int64_t k = 0; k < count; ++k) o[k] = load<uint16_t>(p, start + k);
      break;
    case IdxDType::kI16:
      for (int64_t k = 0; k < count; ++k) o[k] = load<int16_t>(p, start + k);
      break;
    case IdxDType::kI32:
      std::memcpy(o, p + 4 * start, 4 * static_cast<size_t>(count));
      break;
    case IdxDType::kI64:
      for (int64_t k = 0; k < count; ++k) o[k] = narrow(load<int64_t>(p, start + k), start + k);
      break;
    case IdxDType::kF32: case IdxDType::kF64:
      MT_FAIL("[dataset] {} holds {} values; token and mask datasets must have an integer dtype", prefix_,
              idx_dtype_name(dtype_));
  }
}

std::vector<int32_t> IndexedDataset::sequence(int64_t i) const {
  std::vector<int32_t> v;
  read(i, 0, i < num_sequences_ && i >= 0 ? sequence_length(i) : 0, v);
  return v;
}

// ---- writer ------------------------------------------------------------------------------------

IndexedDatasetWriter::IndexedDatasetWriter(const std::string& prefix, IdxDType dtype)
    : prefix_(prefix), dtype_(dtype) {
  MT_CHECK(dtype != IdxDType::kF32 && dtype != IdxDType::kF64, "[dataset] writer supports integer dtypes only");
  const std::string tmp = bin_path(prefix_) + ".tmp";
  bin_ = std::fopen(tmp.c_str(), "wb");
  MT_CHECK(bin_ != nullptr, "[dataset] cannot create {}: {}", tmp, std::strerror(errno));
}

IndexedDatasetWriter::~IndexedDatasetWriter() {
  if (!committed_) abort();
}

void IndexedDatasetWriter::append_raw(const void* data, size_t bytes, int64_t count) {
  MT_CHECK(!finished_, "[dataset] {}: add_sequence after finish()", prefix_);
  MT_CHECK(count <= std::numeric_limits<int32_t>::max(), "[dataset] {}: sequence of {} tokens is too long",
           prefix_, count);
  if (bytes > 0)
    MT_CHECK(std::fwrite(data, 1, bytes, bin_) == bytes, "[dataset] write to {}.tmp failed: {}",
             bin_path(prefix_), std::strerror(errno));
  lengths_.push_back(static_cast<int32_t>(count));
  offsets_.push_back(bytes_);
  modes_.push_back(0);
  bytes_ += static_cast<int64_t>(bytes);
  num_tokens_ += count;
}

void IndexedDatasetWriter::add_sequence(std::span<const int32_t> tokens) {
  const size_t es = idx_dtype_size(dtype_), n = tokens.size();
  scratch_.resize(n * es);
  uint8_t* s = scratch_.data();
  auto check = [&](int64_t v, int64_t lo, int64_t hi, size_t k) {
    MT_CHECK(v >= lo && v <= hi, "[dataset] {}: value {} at position {} does not fit {}", prefix_, v, k,
             idx_dtype_name(dtype_));
  };
  for (size_t k = 0; k < n; ++k) {
    const int64_t v = tokens[k];
    switch (dtype_) {
      case IdxDType::kU8: check(v, 0, 255, k); s[k] = static_cast<uint8_t>(v); break;
      case IdxDType::kI8: check(v, -128, 127, k); s[k] = static_cast<uint8_t>(static_cast<int8_t>(v)); break;
      case IdxDType::kU16: { check(v, 0, 65535, k); uint16_t x = static_cast<uint16_t>(v); std::memcpy(s + 2 * k, &x, 2); break; }
      case IdxDType::kI16: { check(v, -32768, 32767, k); int16_t x = static_cast<int16_t>(v); std::memcpy(s + 2 * k, &x, 2); break; }
      case IdxDType::kI32: { int32_t x = static_cast<int32_t>(v); std::memcpy(s + 4 * k, &x, 4); break; }
      case IdxDType::kI64: std::memcpy(s + 8 * k, &v, 8); break;
      default: MT_FAIL("[dataset] unsupported writer dtype");
    }
  }
  append_raw(s, n * es, static_cast<int64_t>(n));
}

void IndexedDatasetWriter::add_sequence(std::span<const uint8_t> values) {
  if (dtype_ == IdxDType::kU8) {
    append_raw(values.data(), values.size(), static_cast<int64_t>(values.size()));
    return;
  }
  std::vector<int32_t> v(values.begin(), values.end());
  add_sequence(std::span<const int32_t>(v));
}

void IndexedDatasetWriter::set_mode(int8_t mode) {
  MT_CHECK(!modes_.empty(), "[dataset] set_mode before any sequence");
  modes_.back() = mode;
  any_mode_ = any_mode_ || mode != 0;
}

void IndexedDatasetWriter::end_document() {
  MT_CHECK(num_sequences() > doc_index_.back(), "[dataset] {}: end_document with no sequence in it", prefix_);
  doc_index_.push_back(num_sequences());
}

void IndexedDatasetWriter::finish() {
  if (finished_) return;
  MT_CHECK(num_sequences() == doc_index_.back(),
           "[dataset] {}: {} sequences after the last end_document()", prefix_, num_sequences() - doc_index_.back());
  const std::string bt = bin_path(prefix_) + ".tmp", it = idx_path(prefix_) + ".tmp";
  MT_CHECK(std::fflush(bin_) == 0 && ::fsync(::fileno(bin_)) == 0, "[dataset] cannot flush {}", bt);
  std::fclose(bin_);
  bin_ = nullptr;
  std::FILE* f = std::fopen(it.c_str(), "wb");
  MT_CHECK(f != nullptr, "[dataset] cannot create {}: {}", it, std::strerror(errno));
  const uint64_t version = 1, seqs = lengths_.size(), docs = doc_index_.size();
  const uint8_t code = static_cast<uint8_t>(dtype_);
  bool ok = std::fwrite(kMagic, 1, 9, f) == 9 && std::fwrite(&version, 8, 1, f) == 1 &&
            std::fwrite(&code, 1, 1, f) == 1 && std::fwrite(&seqs, 8, 1, f) == 1 &&
            std::fwrite(&docs, 8, 1, f) == 1 &&
            std::fwrite(lengths_.data(), 4, seqs, f) == seqs &&
            std::fwrite(offsets_.data(), 8, seqs, f) == seqs &&
            std::fwrite(doc_index_.data(), 8, docs, f) == docs;
  if (ok && any_mode_) ok = std::fwrite(modes_.data(), 1, seqs, f) == seqs;
  ok = ok && std::fflush(f) == 0 && ::fsync(::fileno(f)) == 0;
  std::fclose(f);
  MT_CHECK(ok, "[dataset] writing {} failed: {}", it, std::strerror(errno));
  finished_ = true;
}

void IndexedDatasetWriter::commit() {
  finish();
  for (const std::string& p : {bin_path(prefix_), idx_path(prefix_)}) {
    const std::string t = p + ".tmp";
    MT_CHECK(std::rename(t.c_str(), p.c_str()) == 0, "[dataset] cannot rename {} to {}: {}", t, p,
             std::strerror(errno));
  }
  committed_ = true;
}

void IndexedDatasetWriter::abort() {
  if (bin_) {
    std::fclose(bin_);
    bin_ = nullptr;
  }
  if (committed_) return;
  std::remove((bin_path(prefix_) + ".tmp").c_str());
  std::remove((idx_path(prefix_) + ".tmp").c_str());
  finished_ = true;
}

}  // namespace moetrain
