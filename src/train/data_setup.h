// The trainer's data: resolves data.data_path (a prepared dataset prefix, PREFIX with
// PREFIX_train/PREFIX_valid from `moetrain prepare`, or a JSONL file prepared on the fly into
// <run_dir>/data with the model's tokenizer) and opens the training and validation loaders
// (or the mock loader). A train micro-batch of micro_batch_size sequences is the concatenation
// of that many packed rows of seq_length tokens.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "data/loader.h"

#include "train/config.h"

namespace moetrain {

struct TrainData {
  std::unique_ptr<DataLoader> train;
  std::string train_prefix;  // "" for mock data
  std::string valid_prefix;  // "" when there is no validation data
  std::string description;   // one line for the log
};

// `vocab_size` checks token ids; `run_dir` receives prepared JSONL data.
TrainData open_train_data(const TrainConfig& cfg, int64_t vocab_size, const std::string& run_dir);

// A fresh, unshuffled, one-pass loader over the validation split (nullptr when none): each
// evaluation reads the same first eval_iters micro-batches.
std::unique_ptr<DataLoader> open_valid_loader(const TrainConfig& cfg, const TrainData& data, int64_t vocab_size);

// Concatenation of rows (each one packed seq_length row): tokens, positions, labels and loss
// masks appended; cu_seqlens shifted.
void append_micro_batch(MicroBatch& into, const MicroBatch& row);

}  // namespace moetrain
