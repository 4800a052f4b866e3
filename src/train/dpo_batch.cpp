// Pair loader and pair micro-batches (see dpo_batch.h). The epoch order is a Fisher-Yates
// shuffle driven by Philox keyed by (seed, epoch), so it is the same on every machine and rank;
// ranks of a data-parallel group advance the same cursor and keep every dp-th micro-batch.
#include "train/dpo_batch.h"

#include <algorithm>
#include <numeric>

#include "core/check.h"
#include "core/philox.h"

namespace moetrain {

namespace {
constexpr uint64_t kShuffleStream = 0xd90b5a11ull;  // Philox counter_hi of the pair shuffle
}

PairLoader::PairLoader(int64_t num_pairs, const PairLoaderOptions& opt) : n_(num_pairs), opt_(opt) {
  MT_CHECK(n_ > 0, "[dpo] the preference dataset holds no pairs");
  MT_CHECK(opt.pairs_per_batch > 0, "[dpo] pairs per micro-batch must be > 0, got {}", opt.pairs_per_batch);
  MT_CHECK(opt.dp_size > 0 && opt.dp_rank >= 0 && opt.dp_rank < opt.dp_size, "[dpo] data-parallel rank {} of {}",
           opt.dp_rank, opt.dp_size);
  MT_CHECK(!opt.shuffle || n_ >= opt.pairs_per_batch,
           "[dpo] the preference dataset holds {} pairs, fewer than one micro-batch of {}", n_, opt.pairs_per_batch);
}

std::vector<int64_t> PairLoader::epoch_order(int64_t epoch) const {
  std::vector<int64_t> order(static_cast<size_t>(n_));
  std::iota(order.begin(), order.end(), int64_t{0});
  if (!opt_.shuffle) return order;
  const uint64_t key = opt_.seed * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(epoch);
  for (int64_t i = n_ - 1; i > 0; --i) {
    const Philox4 r = philox4x32(key, kShuffleStream, static_cast<uint64_t>(i));
    const uint64_t bits = (static_cast<uint64_t>(r.v[0]) << 32) | r.v[1];
    std::swap(order[i], order[bits % static_cast<uint64_t>(i + 1)]);
  }
  return order;
}

bool PairLoader::next_global(std::vector<int64_t>* ids) {
  const int64_t P = opt_.pairs_per_batch;
  for (;;) {
    if (opt_.max_epochs > 0 && epoch_ >= opt_.max_epochs) return false;
    const int64_t left = n_ - position_;
    if (left >= P || (!opt_.shuffle && left > 0)) break;
    ++epoch_, position_ = 0;  // drop the short tail (shuffled) or finish the pass
  }
  const int64_t take = std::min(P, n_ - position_);
  if (ids) {
    if (order_epoch_ != epoch_) order_ = epoch_order(epoch_), order_epoch_ = epoch_;
    ids->assign(order_.begin() + position_, order_.begin() + position_ + take);
  }
  position_ += take;
  ++batches_;
  return true;
}

bool PairLoader::next(std::vector<int64_t>* pair_ids) {
  // Skip the micro-batches of the ranks before this one, take ours, skip the ones after.
  while (batches_ % opt_.dp_size != opt_.dp_rank) {
    if (!next_global(nullptr)) return false;
  }
  if (!next_global(pair_ids)) return false;
  while (batches_ % opt_.dp_size != 0) {
    if (!next_global(nullptr)) break;
  }
  return true;
}

nlohmann::json PairLoader::state() const {
  return {{"epoch", epoch_}, {"position", position_}, {"batches", batches_}, {"num_pairs", n_},
          {"seed", opt_.seed}, {"pairs_per_batch", opt_.pairs_per_batch}, {"shuffle", opt_.shuffle}};
}

void PairLoader::load_state(const nlohmann::json& st) {
  auto want = [&](const char* key, const nlohmann::json& v) {
    MT_CHECK(st.contains(key) && st[key] == v, "[dpo] the saved pair-loader state has {} = {}, this run has {}; "
             "the data, seed or micro_batch_size changed since the checkpoint", key,
             st.contains(key) ? st[key].dump() : "nothing", v.dump());
  };
  want("num_pairs", n_);
  want("seed", opt_.seed);
  want("pairs_per_batch", opt_.pairs_per_batch);
  want("shuffle", opt_.shuffle);
  epoch_ = st.at("epoch").get<int64_t>();
  position_ = st.at("position").get<int64_t>();
  batches_ = st.at("batches").get<int64_t>();
  MT_CHECK(epoch_ >= 0 && position_ >= 0 && position_ <= n_ && batches_ >= 0, "[dpo] corrupt pair-loader state {}",
           st.dump());
}

PairBatch make_pair_batch(const std::vector<PreferencePair>& pairs, const std::vector<int64_t>& pair_ids,
                          Device device) {
  MT_CHECK(!pairs.empty() && pairs.size() == pair_ids.size(), "[dpo] {} pairs with {} ids", pairs.size(),
           pair_ids.size());
  PairBatch pb;
  pb.pair_ids = pair_ids;
  std::vector<int32_t> tokens, positions;
  pb.cu_seqlens.push_back(0);
  int max_len = 0;
  for (size_t i = 0; i < pairs.size(); ++i) {
    const PreferencePair& p = pairs[i];
    for (int side = 0; side < 2; ++side) {
      const auto& ids = side == 0 ? p.chosen : p.rejected;
      const auto& mask = side == 0 ? p.chosen_mask : p.rejected_mask;
      const char* name = side == 0 ? "chosen" : "rejected";
      MT_CHECK(!ids.empty() && mask.size() == ids.size(), "[dpo] pair {}: {} has {} tokens and {} mask values",
               pair_ids[i], name, ids.size(), mask.size());
      int64_t labelled = 0;
      for (size_t t = 0; t < ids.size(); ++t) {
        tokens.push_back(ids[t]);
        positions.push_back(static_cast<int32_t>(t));
        const bool lab = t + 1 < ids.size() && mask[t + 1] != 0;
        pb.labels.push_back(lab ? ids[t + 1] : kIgnoreLabel);
        labelled += lab;
      }
      MT_CHECK(labelled > 0, "[dpo] pair {}: the {} side has no response token to score (mask is 0 past the first "
               "token)", pair_ids[i], name);
      pb.response_tokens.push_back(labelled);
      pb.cu_seqlens.push_back(static_cast<int32_t>(tokens.size()));
      max_len = std::max(max_len, static_cast<int>(ids.size()));
    }
  }
  const int64_t T = static_cast<int64_t>(tokens.size());
  Batch& b = pb.batch;
  b.tokens = Tensor::from_ints(tokens, {T});
  b.positions = Tensor::from_ints(positions, {T});
  b.cu_seqlens = Tensor::from_ints(pb.cu_seqlens, {static_cast<int64_t>(pb.cu_seqlens.size())});
  b.labels = Tensor::from_ints(pb.labels, {T});
  b.loss_weights = Tensor::zeros({T}, DType::kF32);
  b.max_seqlen = max_len;
  if (!device.is_cpu()) b = b.to(device);
  return pb;
}

PairBatch make_pair_batch(const PreferenceDataset& data, const std::vector<int64_t>& pair_ids, Device device) {
  std::vector<PreferencePair> pairs;
  pairs.reserve(pair_ids.size());
  for (int64_t i : pair_ids) pairs.push_back(data.get(i));
  return make_pair_batch(pairs, pair_ids, device);
}

std::vector<double> sequence_logps(const Tensor& token_logps, const std::vector<int32_t>& cu_seqlens) {
  const std::vector<float> lp = token_logps.to_floats();
  MT_CHECK(!cu_seqlens.empty() && static_cast<int64_t>(lp.size()) == cu_seqlens.back(),
           "[dpo] {} token log-probs for {} tokens", lp.size(), cu_seqlens.empty() ? 0 : cu_seqlens.back());
  std::vector<double> out(cu_seqlens.size() - 1, 0.0);
  for (size_t d = 0; d + 1 < cu_seqlens.size(); ++d) {
    for (int32_t t = cu_seqlens[d]; t < cu_seqlens[d + 1]; ++t) out[d] += lp[t];
  }
  return out;
}

std::vector<float> dpo_token_weights(const PairBatch& pb, const std::vector<double>& dlogp_per_doc) {
  MT_CHECK(dlogp_per_doc.size() + 1 == pb.cu_seqlens.size(), "[dpo] {} document coefficients for {} documents",
           dlogp_per_doc.size(), pb.cu_seqlens.size() - 1);
  std::vector<float> w(pb.labels.size(), 0.0f);
  for (size_t d = 0; d + 1 < pb.cu_seqlens.size(); ++d) {
    for (int32_t t = pb.cu_seqlens[d]; t < pb.cu_seqlens[d + 1]; ++t) {
      if (pb.labels[t] != kIgnoreLabel) w[t] = static_cast<float>(-dlogp_per_doc[d]);
    }
  }
  return w;
}

}  // namespace moetrain
