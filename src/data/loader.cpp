// Packing loader, mock loader and preference-pair reader (see loader.h). Packing is greedy in the
// epoch's document order and looks only at document lengths, so ranks of a data-parallel group
// advance the shared cursor without reading tokens of micro-batches that are not theirs.
#include "data/loader.h"

#include <algorithm>

#include "core/check.h"
#include "core/philox.h"
#include "data/indexed_dataset.h"

namespace moetrain {

using json = nlohmann::json;

json cursor_to_json(const LoaderCursor& c) {
  return json{{"epoch", c.epoch}, {"position", c.position}, {"offset", c.offset}, {"batches", c.batches}};
}

LoaderCursor cursor_from_json(const json& j) {
  LoaderCursor c;
  for (auto [key, field] : {std::pair{"epoch", &c.epoch}, std::pair{"position", &c.position},
                            std::pair{"offset", &c.offset}, std::pair{"batches", &c.batches}}) {
    MT_CHECK(j.is_object() && j.contains(key) && j[key].is_number_integer(),
             "[loader] data cursor needs an integer '{}', got {}", key, j.dump());
    *field = j[key].get<int64_t>();
  }
  return c;
}

namespace {

void check_options(const LoaderOptions& o) {
  MT_CHECK(o.seq_length >= 2, "[loader] seq_length {} must be at least 2", o.seq_length);
  MT_CHECK(o.dp_size >= 1 && o.dp_rank >= 0 && o.dp_rank < o.dp_size, "[loader] dp_rank {} outside dp_size {}",
           o.dp_rank, o.dp_size);
  MT_CHECK(o.max_epochs >= 0, "[loader] max_epochs {} must be >= 0", o.max_epochs);
}

// Checks a saved value against the current one, naming the key.
template <typename T>
void expect_same(const json& s, const char* key, T now, const std::string& what) {
  MT_CHECK(s.contains(key), "[loader] saved data state lacks '{}'", key);
  const T saved = s[key].get<T>();
  MT_CHECK(saved == now, "[loader] saved data state has {}={} but {} has {}; resuming would not give the same "
           "batches", key, saved, what, now);
}

void start_batch(MicroBatch& out, int64_t T) {
  out.tokens.clear();
  out.positions.clear();
  out.labels.clear();
  out.loss_mask.clear();
  out.cu_seqlens.assign(1, 0);
  out.tokens.reserve(T);
  out.positions.reserve(T);
  out.labels.reserve(T);
  out.loss_mask.reserve(T);
  out.num_trained_tokens = 0;
  out.num_padding = 0;
}

void pad_batch(MicroBatch& out, int64_t T, int32_t pad_id) {
  const int64_t used = static_cast<int64_t>(out.tokens.size());
  if (used >= T) return;
  for (int64_t t = used; t < T; ++t) {
    out.tokens.push_back(pad_id);
    out.positions.push_back(static_cast<int32_t>(t - used));
    out.labels.push_back(kIgnoreLabel);
    out.loss_mask.push_back(0.0f);
  }
  out.cu_seqlens.push_back(static_cast<int32_t>(T));
  out.num_padding = T - used;
}

}  // namespace

// ---- PackedLoader ------------------------------------------------------------------------------

PackedLoader::PackedLoader(const std::string& prefix, const LoaderOptions& opt) : opt_(opt) {
  check_options(opt);
  data_ = std::make_unique<IndexedDataset>(prefix);
  const std::string mp = mask_prefix(prefix);
  if (indexed_dataset_exists(mp)) {
    mask_ = std::make_unique<IndexedDataset>(mp);
    MT_CHECK(mask_->num_sequences() == data_->num_sequences() && mask_->num_documents() == data_->num_documents(),
             "[loader] mask dataset {} has {} sequences / {} documents but {} has {} / {}", mp,
             mask_->num_sequences(), mask_->num_documents(), prefix, data_->num_sequences(), data_->num_documents());
    for (int64_t i = 0; i < data_->num_sequences(); ++i)
      MT_CHECK(mask_->sequence_length(i) == data_->sequence_length(i),
               "[loader] mask dataset {} sequence {} has length {}, tokens have {}", mp, i, mask_->sequence_length(i),
               data_->sequence_length(i));
    for (int64_t d = 0; d < data_->num_documents(); ++d)
      MT_CHECK(mask_->document_begin(d) == data_->document_begin(d),
               "[loader] mask dataset {} groups sequences into documents differently at document {}", mp, d);
  }
  const int64_t n = data_->num_documents();
  doc_len_.resize(n);
  for (int64_t d = 0; d < n; ++d) total_tokens_ += doc_len_[d] = data_->document_length(d);
  MT_CHECK(total_tokens_ > 0, "[loader] dataset {} holds no tokens", prefix);
  set_epoch(0);
}

PackedLoader::~PackedLoader() = default;

std::vector<int64_t> PackedLoader::epoch_order(int64_t epoch) const {
  const int64_t n = num_documents();
  std::vector<int64_t> order(n);
  for (int64_t i = 0; i < n; ++i) order[i] = i;
  if (!opt_.shuffle) return order;
  // Fisher-Yates; draw i comes from Philox(seed; epoch, i), so an epoch's order is a pure
  // function of (seed, epoch). The modulo bias (< n / 2^64) is negligible.
  for (int64_t i = n - 1; i > 0; --i) {
    const Philox4 r = philox4x32(opt_.seed, static_cast<uint64_t>(epoch), static_cast<uint64_t>(i));
    const uint64_t x = (static_cast<uint64_t>(r.v[0]) << 32) | r.v[1];
    std::swap(order[i], order[static_cast<int64_t>(x % static_cast<uint64_t>(i + 1))]);
  }
  return order;
}

void PackedLoader::set_epoch(int64_t epoch) {
  if (order_epoch_ == epoch) return;
  order_ = epoch_order(epoch);
  order_epoch_ = epoch;
}

bool PackedLoader::pack(std::vector<Piece>* pieces, int64_t* epoch) {
  const int64_t T = opt_.seq_length, n = num_documents();
  int64_t used = 0;
  bool first = true;
  if (pieces) pieces->clear();
  while (used < T) {
    if (cur_.position >= n) {
      if (opt_.max_epochs > 0 && cur_.epoch + 1 >= opt_.max_epochs) break;
      ++cur_.epoch;
      cur_.position = 0;
      cur_.offset = 0;
      set_epoch(cur_.epoch);
    }
    if (first) {
      *epoch = cur_.epoch;
      first = false;
    }
    const int64_t d = order_[cur_.position], len = doc_len_[d];
    const int64_t rem = len - cur_.offset, space = T - used;
    if (rem <= space) {  // the rest of the document fits (empty documents are skipped)
      if (rem > 0 && pieces) pieces->push_back({d, cur_.offset, len});
      used += rem;
      ++cur_.position;
      cur_.offset = 0;
    } else if (len > T) {  // too long for any micro-batch: fill this one and continue later
      if (pieces) pieces->push_back({d, cur_.offset, cur_.offset + space});
      cur_.offset += space;
      used = T;
    } else {
      break;  // fits in a fresh micro-batch: pad this one
    }
  }
  if (used == 0) return false;
  ++cur_.batches;
  return true;
}

void PackedLoader::read_doc(int64_t doc, int64_t begin, int64_t end, std::vector<int32_t>& tok,
                            std::vector<int32_t>& mask) const {
  tok.clear();
  mask.clear();
  int64_t base = 0;  // document offset of the current sequence
  for (int64_t s = data_->document_begin(doc); s < data_->document_end(doc) && base < end; ++s) {
    const int64_t len = data_->sequence_length(s);
    const int64_t a = std::max(begin, base), b = std::min(end, base + len);
    if (a < b) {
      data_->read(s, a - base, b - a, tok);
      if (mask_) mask_->read(s, a - base, b - a, mask);
    }
    base += len;
  }
  if (!mask_) mask.assign(tok.size(), 1);
}

void PackedLoader::fill(const std::vector<Piece>& pieces, int64_t epoch, MicroBatch& out) const {
  const int64_t T = opt_.seq_length;
  start_batch(out, T);
  out.epoch = epoch;
  std::vector<int32_t> tok, mask;
  for (const Piece& p : pieces) {
    // One token past the piece (when the document has it) supplies the last label.
    const int64_t stop = std::min(p.end + 1, doc_len_[p.doc]);
    read_doc(p.doc, p.begin, stop, tok, mask);
    for (int64_t t = p.begin; t < p.end; ++t) {
      const int64_t k = t - p.begin;
      out.tokens.push_back(tok[k]);
      out.positions.push_back(static_cast<int32_t>(k));
      // The label at t is token t+1, trained iff the mask of token t+1 is set.
      const bool trained = t + 1 < stop && mask[k + 1] != 0;
      out.labels.push_back(trained ? tok[k + 1] : kIgnoreLabel);
      out.loss_mask.push_back(trained ? 1.0f : 0.0f);
      out.num_trained_tokens += trained;
    }
    out.cu_seqlens.push_back(static_cast<int32_t>(out.tokens.size()));
  }
  pad_batch(out, T, opt_.pad_id);
}

bool PackedLoader::next(MicroBatch& out) {
  // The data-parallel group consumes dp_size global micro-batches per step; this rank keeps its own.
  std::vector<Piece> mine;
  int64_t my_epoch = cur_.epoch;
  bool any = false, have_mine = false;
  for (int r = 0; r < opt_.dp_size; ++r) {
    std::vector<Piece> pieces;
    int64_t epoch = cur_.epoch;
    const bool ok = pack(r == opt_.dp_rank ? &pieces : nullptr, &epoch);
    if (r == 0) any = ok;
    if (r == opt_.dp_rank) {
      have_mine = ok;
      mine = std::move(pieces);
      my_epoch = epoch;
    }
  }
  if (!any) return false;
  // When the data runs out part way through a group, the ranks left over get an all-padding
  // micro-batch (nothing trained), so that every rank still takes the same number of steps.
  fill(have_mine ? mine : std::vector<Piece>{}, my_epoch, out);
  return true;
}

void PackedLoader::restore(const LoaderCursor& c) {
  const int64_t n = num_documents();
  MT_CHECK(c.epoch >= 0 && c.position >= 0 && c.position <= n && c.batches >= 0,
           "[loader] cursor (epoch {}, position {}) outside the dataset of {} documents", c.epoch, c.position, n);
  set_epoch(c.epoch);
  const int64_t len = c.position < n ? doc_len_[order_[c.position]] : 0;
  MT_CHECK(c.offset >= 0 && (c.offset == 0 || c.offset < len),
           "[loader] cursor offset {} outside document of {} tokens", c.offset, len);
  cur_ = c;
}

json PackedLoader::state() const {
  return json{{"kind", "packed"}, {"cursor", cursor_to_json(cur_)}, {"documents", num_documents()},
              {"tokens", total_tokens_}, {"seed", opt_.seed}, {"seq_length", opt_.seq_length},
              {"shuffle", opt_.shuffle}};
}

void PackedLoader::load_state(const json& s) {
  MT_CHECK(s.is_object() && s.value("kind", "") == "packed", "[loader] saved data state is not a packed-loader state: {}",
           s.dump());
  const std::string what = "dataset " + data_->prefix();
  expect_same<int64_t>(s, "documents", num_documents(), what);
  expect_same<int64_t>(s, "tokens", total_tokens_, what);
  expect_same<uint64_t>(s, "seed", opt_.seed, "this run's data seed");
  expect_same<int64_t>(s, "seq_length", opt_.seq_length, "this run's seq_length");
  expect_same<bool>(s, "shuffle", opt_.shuffle, "this run's shuffle setting");
  restore(cursor_from_json(s.at("cursor")));
}

// ---- MockLoader --------------------------------------------------------------------------------

MockLoader::MockLoader(int64_t vocab_size, const LoaderOptions& opt) : vocab_(vocab_size), opt_(opt) {
  check_options(opt);
  MT_CHECK(vocab_size >= 1, "[loader] mock data needs vocab_size >= 1, got {}", vocab_size);
}

bool MockLoader::next(MicroBatch& out) {
  const int64_t T = opt_.seq_length;
  const uint64_t b = static_cast<uint64_t>(cur_.batches + opt_.dp_rank);
  cur_.batches += opt_.dp_size;
  start_batch(out, T);
  out.epoch = 0;
  for (int64_t t = 0; t < T; t += 4) {
    const Philox4 r = philox4x32(opt_.seed ^ 0x6d6f636bull, b, static_cast<uint64_t>(t / 4));
    for (int64_t k = 0; k < 4 && t + k < T; ++k)
      out.tokens.push_back(static_cast<int32_t>(r.v[k] % static_cast<uint64_t>(vocab_)));
  }
  for (int64_t t = 0; t < T; ++t) {
    out.positions.push_back(static_cast<int32_t>(t));
    const bool trained = t + 1 < T;
    out.labels.push_back(trained ? out.tokens[t + 1] : kIgnoreLabel);
    out.loss_mask.push_back(trained ? 1.0f : 0.0f);
  }
  out.num_trained_tokens = T - 1;
  out.cu_seqlens.push_back(static_cast<int32_t>(T));
  return true;
}

json MockLoader::state() const {
  return json{{"kind", "mock"}, {"cursor", cursor_to_json(cur_)}, {"vocab_size", vocab_}, {"seed", opt_.seed},
              {"seq_length", opt_.seq_length}};
}

void MockLoader::load_state(const json& s) {
  MT_CHECK(s.is_object() && s.value("kind", "") == "mock", "[loader] saved data state is not a mock-loader state");
  expect_same<int64_t>(s, "vocab_size", vocab_, "this run's mock vocab_size");
  expect_same<uint64_t>(s, "seed", opt_.seed, "this run's data seed");
  expect_same<int64_t>(s, "seq_length", opt_.seq_length, "this run's seq_length");
  restore(cursor_from_json(s.at("cursor")));
}

// ---- PreferenceDataset -------------------------------------------------------------------------

PreferenceDataset::PreferenceDataset(const std::string& prefix) {
  data_ = std::make_unique<IndexedDataset>(prefix);
  mask_ = std::make_unique<IndexedDataset>(mask_prefix(prefix));
  const int64_t n = data_->num_documents();
  MT_CHECK(data_->num_sequences() == 2 * n && mask_->num_sequences() == 2 * n,
           "[loader] {} is not a preference dataset: {} documents but {} sequences (expected 2 per document: "
           "chosen, rejected)", prefix, n, data_->num_sequences());
  for (int64_t d = 0; d < n; ++d)
    MT_CHECK(data_->document_begin(d) == 2 * d, "[loader] {}: document {} does not hold exactly 2 sequences", prefix, d);
  for (int64_t i = 0; i < 2 * n; ++i)
    MT_CHECK(mask_->sequence_length(i) == data_->sequence_length(i), "[loader] {}: mask sequence {} has length {}, "
             "tokens have {}", prefix, i, mask_->sequence_length(i), data_->sequence_length(i));
}

PreferenceDataset::~PreferenceDataset() = default;

int64_t PreferenceDataset::size() const { return data_->num_documents(); }

PreferencePair PreferenceDataset::get(int64_t i) const {
  MT_CHECK(i >= 0 && i < size(), "[loader] preference pair {} outside [0, {})", i, size());
  PreferencePair p;
  p.chosen = data_->sequence(2 * i);
  p.rejected = data_->sequence(2 * i + 1);
  p.chosen_mask = mask_->sequence(2 * i);
  p.rejected_mask = mask_->sequence(2 * i + 1);
  return p;
}

}  // namespace moetrain
