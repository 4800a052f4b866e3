// Data resolution for the trainer (see data_setup.h). JSONL inputs are prepared once per run
// directory (<run_dir>/data/<stem>_{train,valid}), reused when the prepared files are already
// there, so resumes read exactly the same tokens. Objective dpo prepares preference pairs
// (format auto means preference there); the other objectives refuse them.
#include "train/data_setup.h"

#include <filesystem>

#include "core/check.h"
#include "core/log.h"
#include "data/indexed_dataset.h"
#include "data/prepare.h"
#include "tokenizer/tokenizer.h"

namespace moetrain {

namespace fs = std::filesystem;

namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

double valid_fraction_of(const std::string& split, const std::string& source) {
  std::vector<double> w;
  size_t start = 0;
  while (start <= split.size()) {
    size_t comma = split.find(',', start);
    const std::string part = split.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    try {
      size_t pos = 0;
      w.push_back(std::stod(part, &pos));
      MT_CHECK(pos == part.size() && w.back() >= 0, "");
    } catch (...) {
      MT_FAIL("[config] {}: data.split '{}' must be comma-separated non-negative weights like 98,2,0", source, split);
    }
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  MT_CHECK(w.size() >= 2 && w.size() <= 3 && w[0] > 0, "[config] {}: data.split '{}' needs train,valid[,test] weights with train > 0",
           source, split);
  double sum = 0;
  for (double x : w) sum += x;
  return w[1] / sum;
}

std::string prepare_jsonl(const TrainConfig& cfg, const std::string& jsonl, const std::string& run_dir, bool split) {
  MT_CHECK(fs::is_regular_file(jsonl), "[data] data file {} does not exist", jsonl);
  const std::string prefix = run_dir + "/data/" + fs::path(jsonl).stem().string();
  if (indexed_dataset_exists(prefix + "_train")) {
    MT_LOG_INFO("[data] reusing {}_train prepared earlier from {}", prefix, jsonl);
    return prefix;
  }
  const std::string tok_dir = !cfg.model.tokenizer.empty() ? cfg.model.tokenizer : cfg.model.path;
  MT_CHECK(!tok_dir.empty(), "[data] {} is JSONL and needs a tokenizer: set model.tokenizer (or model.path)", jsonl);
  auto tok = Tokenizer::load(tok_dir);
  auto enc = make_tokenizer_encoder(*tok);
  PrepareOptions opt;
  opt.input = jsonl;
  opt.output_prefix = prefix;
  opt.format = parse_record_format(cfg.data.format);
  // DPO reads preference pairs only; the other objectives read documents.
  const bool dpo = cfg.training.objective == "dpo";
  if (dpo && opt.format == RecordFormat::kAuto) opt.format = RecordFormat::kPreference;
  MT_CHECK(!dpo || opt.format == RecordFormat::kPreference,
           "[config] {}: training.objective dpo needs preference records (data.format preference or auto), got data.format {}",
           cfg.source, cfg.data.format);
  MT_CHECK(dpo || opt.format != RecordFormat::kPreference,
           "[config] {}: data.format preference is for training.objective dpo (objective is {})", cfg.source,
           cfg.training.objective);
  opt.valid_fraction = split ? valid_fraction_of(cfg.data.split, cfg.source) : 0.0;
  opt.seed = static_cast<uint64_t>(cfg.training.seed);
  opt.max_length = cfg.training.seq_length;
  fs::create_directories(run_dir + "/data");
  PrepareStats st = prepare_dataset(opt, *enc);
  MT_LOG_INFO("[data] prepared {}: {} train / {} valid records, {} tokens ({} trained)", jsonl, st.train_records,
              st.valid_records, st.tokens, st.trained_tokens);
  return prefix;
}

// A prefix as given: PREFIX_train exists -> (PREFIX_train, PREFIX_valid if present); PREFIX itself.
std::pair<std::string, std::string> resolve_prefix(const std::string& p) {
  if (indexed_dataset_exists(p + "_train"))
    return {p + "_train", indexed_dataset_exists(p + "_valid") ? p + "_valid" : ""};
  MT_CHECK(indexed_dataset_exists(p),
           "[data] data.data_path '{}' is neither a JSONL file nor a prepared dataset ({}.bin/.idx or {}_train.bin/.idx)", p, p, p);
  return {p, ""};
}

LoaderOptions loader_options(const TrainConfig& cfg, bool shuffle) {
  LoaderOptions o;
  o.seq_length = cfg.training.seq_length;
  o.seed = static_cast<uint64_t>(cfg.training.seed);
  o.shuffle = shuffle;
  return o;
}

}  // namespace

TrainData open_train_data(const TrainConfig& cfg, int64_t vocab_size, const std::string& run_dir) {
  TrainData d;
  if (cfg.data.mock_data) {
    d.train = std::make_unique<MockLoader>(vocab_size, loader_options(cfg, true));
    d.description = fmt::format("mock data (random tokens, vocab {})", vocab_size);
    return d;
  }
  MT_CHECK(cfg.data.data_path.size() == 1, "[config] {}: data.data_path holds {} entries; blending several datasets is not supported yet",
           cfg.source, cfg.data.data_path.size());
  const bool own_valid = !cfg.data.valid_data_path.empty();
  std::string p = cfg.data.data_path[0];
  if (ends_with(p, ".jsonl")) p = prepare_jsonl(cfg, p, run_dir, !own_valid);
  auto [train, valid] = resolve_prefix(p);
  if (own_valid) {
    MT_CHECK(cfg.data.valid_data_path.size() == 1, "[config] {}: data.valid_data_path must hold one entry", cfg.source);
    std::string v = cfg.data.valid_data_path[0];
    if (ends_with(v, ".jsonl")) v = prepare_jsonl(cfg, v, run_dir + "/valid", false);
    valid = resolve_prefix(v).first;
  }
  d.train_prefix = train;
  d.valid_prefix = valid;
  d.train = std::make_unique<PackedLoader>(train, loader_options(cfg, true));
  d.description = fmt::format("{} ({} documents, {} tokens){}", train, static_cast<PackedLoader&>(*d.train).num_documents(),
                              static_cast<PackedLoader&>(*d.train).num_tokens(),
                              valid.empty() ? ", no validation split" : ", validation " + valid);
  return d;
}

std::unique_ptr<DataLoader> open_valid_loader(const TrainConfig& cfg, const TrainData& data, int64_t vocab_size) {
  if (cfg.data.mock_data) {
    LoaderOptions o = loader_options(cfg, false);
    o.seed = static_cast<uint64_t>(cfg.training.seed) + 0x5eed;  // a stream the training data never reads
    o.max_epochs = 1;
    return std::make_unique<MockLoader>(vocab_size, o);
  }
  if (data.valid_prefix.empty()) return nullptr;
  LoaderOptions o = loader_options(cfg, false);
  o.max_epochs = 1;
  return std::make_unique<PackedLoader>(data.valid_prefix, o);
}

void append_micro_batch(MicroBatch& into, const MicroBatch& row) {
  const int32_t base = static_cast<int32_t>(into.tokens.size());
  into.tokens.insert(into.tokens.end(), row.tokens.begin(), row.tokens.end());
  into.positions.insert(into.positions.end(), row.positions.begin(), row.positions.end());
  into.labels.insert(into.labels.end(), row.labels.begin(), row.labels.end());
  into.loss_mask.insert(into.loss_mask.end(), row.loss_mask.begin(), row.loss_mask.end());
  if (into.cu_seqlens.empty()) into.cu_seqlens.push_back(0);
  for (size_t i = 1; i < row.cu_seqlens.size(); ++i) into.cu_seqlens.push_back(base + row.cu_seqlens[i]);
  into.num_trained_tokens += row.num_trained_tokens;
  into.num_padding += row.num_padding;
}

}  // namespace moetrain
