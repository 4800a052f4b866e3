// Batch: one packed micro-batch as the model consumes it: a flat token stream with document
// boundaries (cu_seqlens), positions restarting at 0 in each document, already-shifted labels
// (label[t] = the token at t+1 of the same document, -100 = no loss) and per-token loss weights
// (the trainer puts mask / N_global_trained_tokens there, so the CE of a micro-batch is
// sum_t w_t * CE_t and micro-batches add up to the global mean).
#pragma once
#include "core/labels.h"
#include <cstdint>
#include <memory>
#include <vector>

#include "core/tensor.h"

namespace moetrain {


struct Batch {
  Tensor tokens;        // [T] i32
  Tensor positions;     // [T] i32, restart at 0 in each document
  Tensor cu_seqlens;    // [docs+1] i32, first 0, last T
  int max_seqlen = 0;   // longest document
  Tensor labels;        // [T] i32, kIgnoreLabel where no loss
  Tensor loss_weights;  // [T] f32
  // The CPU batch this one was uploaded from (set by to(device)): validation and label counting
  // read it instead of the device copy, so a step needs no device-to-host read for them. Device
  // tensors changed in place after the upload (DPO rewrites loss_weights) are not mirrored; only
  // tokens, positions, cu_seqlens and labels are read from here.
  std::shared_ptr<const Batch> host;

  int64_t num_tokens() const { return tokens.defined() ? tokens.numel() : 0; }
  int64_t num_docs() const { return cu_seqlens.defined() ? cu_seqlens.numel() - 1 : 0; }

  // Packs documents back to back. Labels are shifted inside each document (the last token of a
  // document gets none); loss_mask (optional, one vector per document, same lengths) zeroes the
  // label of position t when loss_mask[t+1] == 0 (the predicted token is not trained). Weights are
  // 1 / (number of labelled tokens), i.e. the mean over this batch, unless `weight_scale` > 0,
  // in which case each labelled token gets weight_scale (e.g. 1 / N_global).
  static Batch from_documents(const std::vector<std::vector<int32_t>>& docs, Device device = Device::cpu(),
                              const std::vector<std::vector<uint8_t>>* loss_mask = nullptr,
                              float weight_scale = 0.0f);
  // Number of labels != kIgnoreLabel (from the host copy when there is one, else a device read).
  int64_t num_labelled() const;
  // Checks shapes and dtypes, and that ids are in the vocabulary and cu_seqlens/positions describe
  // the documents: on the host copy when there is one, else by reading the device (synchronizes).
  void validate(int64_t vocab_size) const;
  Batch to(Device device) const;
};

}  // namespace moetrain
