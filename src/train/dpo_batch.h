// DPO pair batching: a resumable loader of preference-pair indices (seeded per-epoch shuffle,
// data-parallel striding) and the packed micro-batch of pairs: pair i of a micro-batch is
// documents 2i (chosen) and 2i+1 (rejected), so both sides go through the same forward. Labels
// are shifted inside each document and kept only where the predicted token is a response token
// (mask 1), so a document's sum of per-token log-probs is its response log-prob logp(y|x).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/batch.h"
#include "train/data_setup.h"  // data/loader.h (PreferenceDataset) without the kIgnoreLabel clash

namespace moetrain {

struct PairLoaderOptions {
  int64_t pairs_per_batch = 1;  // pairs in one micro-batch (training.micro_batch_size)
  uint64_t seed = 1234;
  bool shuffle = true;          // false: dataset order (validation, reference pass)
  int64_t max_epochs = 0;       // 0: endless; else next() returns false after this many epochs
  int dp_rank = 0, dp_size = 1; // rank r takes global micro-batches r, r + dp, ...
};

// Global micro-batch b of an epoch holds the pairs at positions [b*P, (b+1)*P) of the epoch's
// order. With shuffle on, an epoch's tail of fewer than P pairs is dropped (every micro-batch
// has P pairs, so every step weighs the same); with shuffle off the tail is a smaller batch.
class PairLoader {
 public:
  PairLoader(int64_t num_pairs, const PairLoaderOptions& opt);
  // Pair indices of this rank's next micro-batch; false when max_epochs is exhausted.
  bool next(std::vector<int64_t>* pair_ids);
  std::vector<int64_t> epoch_order(int64_t epoch) const;
  // {"epoch", "position", "batches", "num_pairs", "seed", "pairs_per_batch", "shuffle"}; load_state
  // checks the fingerprint fields and names the mismatch.
  nlohmann::json state() const;
  void load_state(const nlohmann::json& st);
  int64_t epoch() const { return epoch_; }

 private:
  bool next_global(std::vector<int64_t>* ids);  // advances the shared cursor by one micro-batch
  int64_t n_;
  PairLoaderOptions opt_;
  int64_t epoch_ = 0, position_ = 0, batches_ = 0;
  mutable int64_t order_epoch_ = -1;
  mutable std::vector<int64_t> order_;
};

// A packed micro-batch of pairs with the host-side facts the objective needs.
struct PairBatch {
  Batch batch;                      // loss_weights all zero until dpo_token_weights fills them
  std::vector<int64_t> pair_ids;    // [P] dataset indices
  std::vector<int32_t> cu_seqlens;  // [2P+1] host copy; document 2i chosen, 2i+1 rejected
  std::vector<int32_t> labels;      // [T] host copy
  std::vector<int64_t> response_tokens;  // [2P] labelled tokens per document
  int64_t num_pairs() const { return static_cast<int64_t>(pair_ids.size()); }
};

// Packs pairs (tokens and 0/1 response masks of equal length) into one Batch on `device`.
// A side with no labelled token (a response of one token at position 0 cannot be predicted) is
// an error naming the pair.
PairBatch make_pair_batch(const std::vector<PreferencePair>& pairs, const std::vector<int64_t>& pair_ids,
                          Device device);
PairBatch make_pair_batch(const PreferenceDataset& data, const std::vector<int64_t>& pair_ids, Device device);

// Per-document sums of per-token log-probs [T] (0 where unlabelled), in double: [docs].
std::vector<double> sequence_logps(const Tensor& token_logps, const std::vector<int32_t>& cu_seqlens);

// The per-token CE weights whose weighted-CE gradient is the gradient of the DPO loss:
// d loss / d logp_t = dlogp[doc(t)] on labelled tokens, and logp_t = -CE_t, so w_t = -dlogp[doc].
// [T] f32 on the host.
std::vector<float> dpo_token_weights(const PairBatch& pb, const std::vector<double>& dlogp_per_doc);

}  // namespace moetrain
