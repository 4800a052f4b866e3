// Resumable packing loader: documents of an indexed dataset (plus its optional _mask dataset) are
// packed in a seeded per-epoch shuffled order into micro-batches of exactly seq_length tokens.
// A document is split across micro-batches only when it does not fit in a whole one; the tail of
// a micro-batch that cannot take the next document is padding, a segment of its own with labels
// -100. A cursor (epoch, position, offset) saved to JSON resumes the exact same batch stream.
#pragma once
#include "core/labels.h"
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace moetrain {

class IndexedDataset;


struct LoaderOptions {
  int64_t seq_length = 4096;  // tokens per micro-batch
  uint64_t seed = 1234;
  bool shuffle = true;        // shuffle document order each epoch (seeded by seed and epoch)
  int32_t pad_id = 0;         // token id written into padding
  int64_t max_epochs = 0;     // 0: endless; else next() returns false after this many epochs
  int dp_rank = 0, dp_size = 1;  // data parallel: rank r takes global micro-batches r, r+dp, ...
};

// One packed micro-batch. T = seq_length; segments are documents, chunks of long documents and
// (last, when present) the padding.
struct MicroBatch {
  std::vector<int32_t> tokens;      // [T]
  std::vector<int32_t> positions;   // [T] 0, 1, ... restarting at every segment
  std::vector<int32_t> cu_seqlens;  // [segments + 1] segment starts, first 0, last T
  std::vector<int32_t> labels;      // [T] next token of the same document, or kIgnoreLabel
  std::vector<float> loss_mask;     // [T] 1 where labels[t] != kIgnoreLabel, else 0
  int64_t num_trained_tokens = 0;   // sum of loss_mask
  int64_t num_padding = 0;          // padding tokens at the tail
  int64_t epoch = 0;                // epoch of the micro-batch's first token
  int64_t num_segments() const { return static_cast<int64_t>(cu_seqlens.size()) - 1; }
};

// Where the global micro-batch stream stands: the next token to pack is token `offset` of the
// document at `position` in epoch `epoch`'s order. `batches` counts global micro-batches made.
struct LoaderCursor {
  int64_t epoch = 0;
  int64_t position = 0;
  int64_t offset = 0;
  int64_t batches = 0;
  bool operator==(const LoaderCursor&) const = default;
};

class DataLoader {
 public:
  virtual ~DataLoader() = default;
  // Fills `out` with this rank's next micro-batch; false when max_epochs is exhausted.
  virtual bool next(MicroBatch& out) = 0;
  virtual LoaderCursor cursor() const = 0;
  virtual void restore(const LoaderCursor& c) = 0;
  // Cursor plus a fingerprint (dataset size, seed, seq_length) checked on load_state.
  virtual nlohmann::json state() const = 0;
  virtual void load_state(const nlohmann::json& state) = 0;
};

class PackedLoader final : public DataLoader {
 public:
  // Opens PREFIX.bin/.idx and, when present, PREFIX_mask.bin/.idx (else every token is trained).
  PackedLoader(const std::string& prefix, const LoaderOptions& opt);
  ~PackedLoader() override;
  bool next(MicroBatch& out) override;
  LoaderCursor cursor() const override { return cur_; }
  void restore(const LoaderCursor& c) override;
  nlohmann::json state() const override;
  void load_state(const nlohmann::json& state) override;

  int64_t num_documents() const { return static_cast<int64_t>(doc_len_.size()); }
  int64_t num_tokens() const { return total_tokens_; }
  // Document order of an epoch (for tests and inspection).
  std::vector<int64_t> epoch_order(int64_t epoch) const;

 private:
  struct Piece {
    int64_t doc, begin, end;  // tokens [begin, end) of document doc
  };
  bool pack(std::vector<Piece>* pieces, int64_t* epoch);  // advances cur_; false when exhausted
  void set_epoch(int64_t epoch);
  void fill(const std::vector<Piece>& pieces, int64_t epoch, MicroBatch& out) const;
  void read_doc(int64_t doc, int64_t begin, int64_t end, std::vector<int32_t>& tok, std::vector<int32_t>& mask) const;

  LoaderOptions opt_;
  std::unique_ptr<IndexedDataset> data_, mask_;
  std::vector<int64_t> doc_len_;  // [documents]
  int64_t total_tokens_ = 0;
  LoaderCursor cur_;
  int64_t order_epoch_ = -1;
  std::vector<int64_t> order_;  // [documents] this epoch's order
};

// Random tokens for benchmarks: every micro-batch is one document of seq_length uniformly random
// ids in [0, vocab_size), fully trained except the last position. Deterministic per (seed, batch).
class MockLoader final : public DataLoader {
 public:
  MockLoader(int64_t vocab_size, const LoaderOptions& opt);
  bool next(MicroBatch& out) override;
  LoaderCursor cursor() const override { return cur_; }
  void restore(const LoaderCursor& c) override { cur_ = c; }
  nlohmann::json state() const override;
  void load_state(const nlohmann::json& state) override;

 private:
  int64_t vocab_;
  LoaderOptions opt_;
  LoaderCursor cur_;
};

nlohmann::json cursor_to_json(const LoaderCursor& c);
LoaderCursor cursor_from_json(const nlohmann::json& j);

// A DPO pair of a preference dataset written by `moetrain prepare` (document i = sequence 2i
// chosen, 2i+1 rejected; masks 1 on response tokens).
struct PreferencePair {
  std::vector<int32_t> chosen, rejected;
  std::vector<int32_t> chosen_mask, rejected_mask;
};
class PreferenceDataset {
 public:
  explicit PreferenceDataset(const std::string& prefix);  // PREFIX and PREFIX_mask
  ~PreferenceDataset();
  int64_t size() const;
  PreferencePair get(int64_t i) const;

 private:
  std::unique_ptr<IndexedDataset> data_, mask_;
};

}  // namespace moetrain
