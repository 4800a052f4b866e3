// Batch construction from documents (packing, per-document positions, shifted labels, mean
// weights) and validation of a batch against the model's vocabulary.
#include "model/batch.h"

#include <algorithm>

#include "core/check.h"

namespace moetrain {

Batch Batch::from_documents(const std::vector<std::vector<int32_t>>& docs, Device device,
                            const std::vector<std::vector<uint8_t>>* loss_mask, float weight_scale) {
  MT_CHECK(!docs.empty(), "[batch] no documents given");
  if (loss_mask) {
    MT_CHECK(loss_mask->size() == docs.size(), "[batch] {} loss masks for {} documents", loss_mask->size(),
             docs.size());
  }
  std::vector<int32_t> tokens, positions, labels, cu{0};
  int max_len = 0;
  for (size_t d = 0; d < docs.size(); ++d) {
    const auto& doc = docs[d];
    MT_CHECK(!doc.empty(), "[batch] document {} is empty", d);
    if (loss_mask) {
      MT_CHECK((*loss_mask)[d].size() == doc.size(), "[batch] document {} has {} tokens but {} mask values", d,
               doc.size(), (*loss_mask)[d].size());
    }
    for (size_t t = 0; t < doc.size(); ++t) {
      tokens.push_back(doc[t]);
      positions.push_back(static_cast<int32_t>(t));
      bool has_label = t + 1 < doc.size() && (!loss_mask || (*loss_mask)[d][t + 1] != 0);
      labels.push_back(has_label ? doc[t + 1] : kIgnoreLabel);
    }
    cu.push_back(static_cast<int32_t>(tokens.size()));
    max_len = std::max(max_len, static_cast<int>(doc.size()));
  }
  const int64_t T = static_cast<int64_t>(tokens.size());
  int64_t n_lab = std::count_if(labels.begin(), labels.end(), [](int32_t l) { return l != kIgnoreLabel; });
  const float w = weight_scale > 0.0f ? weight_scale : (n_lab > 0 ? 1.0f / static_cast<float>(n_lab) : 0.0f);
  std::vector<float> weights(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) weights[t] = labels[t] != kIgnoreLabel ? w : 0.0f;

  Batch b;
  b.tokens = Tensor::from_ints(tokens, {T});
  b.positions = Tensor::from_ints(positions, {T});
  b.cu_seqlens = Tensor::from_ints(cu, {static_cast<int64_t>(cu.size())});
  b.labels = Tensor::from_ints(labels, {T});
  b.loss_weights = Tensor::from_floats(weights, {T});
  b.max_seqlen = max_len;
  return device.is_cpu() ? b : b.to(device);
}

int64_t Batch::num_labelled() const {
  if (!labels.device().is_cpu() && host) return host->num_labelled();
  Tensor l = labels.device().is_cpu() ? labels : labels.to(Device::cpu());
  const int32_t* p = l.data<int32_t>();
  int64_t n = 0;
  for (int64_t i = 0; i < l.numel(); ++i) n += p[i] != kIgnoreLabel;
  return n;
}

void Batch::validate(int64_t vocab_size) const {
  MT_CHECK(tokens.defined() && tokens.dim() == 1 && tokens.dtype() == DType::kI32,
           "[batch] tokens must be a 1-D i32 tensor, got {}", tokens.defined() ? tokens.desc() : "none");
  const int64_t T = tokens.numel();
  MT_CHECK(T > 0, "[batch] no tokens");
  check_shape(positions, {T}, "batch", "positions");
  check_dtype(positions, DType::kI32, "batch", "positions");
  check_shape(labels, {T}, "batch", "labels");
  check_dtype(labels, DType::kI32, "batch", "labels");
  check_shape(loss_weights, {T}, "batch", "loss_weights");
  check_dtype(loss_weights, DType::kF32, "batch", "loss_weights");
  MT_CHECK(cu_seqlens.defined() && cu_seqlens.dim() == 1 && cu_seqlens.numel() >= 2 &&
               cu_seqlens.dtype() == DType::kI32,
           "[batch] cu_seqlens must be a 1-D i32 tensor of docs+1 offsets");
  MT_CHECK(tokens.device() == positions.device() && tokens.device() == cu_seqlens.device() &&
               tokens.device() == labels.device() && tokens.device() == loss_weights.device(),
           "[batch] all batch tensors must be on one device (tokens are on {})", tokens.device().str());
  // Value checks on the host: the CPU copy this batch was uploaded from when there is one.
  const bool use_host = !tokens.device().is_cpu() && host;
  if (use_host) {
    MT_CHECK(host->num_tokens() == T && host->cu_seqlens.numel() == cu_seqlens.numel(),
             "[batch] the host copy ({} tokens) does not describe this batch ({} tokens)", host->num_tokens(), T);
  }
  const Batch& src = use_host ? *host : *this;
  Tensor tok = src.tokens.to(Device::cpu()), pos = src.positions.to(Device::cpu());
  Tensor cu = src.cu_seqlens.to(Device::cpu()), lab = src.labels.to(Device::cpu());
  const int32_t* c = cu.data<int32_t>();
  MT_CHECK(c[0] == 0 && c[cu.numel() - 1] == T, "[batch] cu_seqlens must start at 0 and end at T={}, got {}..{}",
           T, c[0], c[cu.numel() - 1]);
  int longest = 0;
  for (int64_t d = 0; d + 1 < cu.numel(); ++d) {
    MT_CHECK(c[d + 1] > c[d], "[batch] document {} is empty (cu_seqlens {} -> {})", d, c[d], c[d + 1]);
    longest = std::max(longest, c[d + 1] - c[d]);
    for (int32_t t = c[d]; t < c[d + 1]; ++t) {
      MT_CHECK(pos.data<int32_t>()[t] == t - c[d], "[batch] position {} of document {} is {}, expected {}", t, d,
               pos.data<int32_t>()[t], t - c[d]);
    }
  }
  MT_CHECK(max_seqlen >= longest, "[batch] max_seqlen {} is below the longest document ({})", max_seqlen, longest);
  for (int64_t t = 0; t < T; ++t) {
    const int32_t id = tok.data<int32_t>()[t], l = lab.data<int32_t>()[t];
    MT_CHECK(id >= 0 && id < vocab_size, "[batch] token {} at position {} is outside the vocabulary [0, {})", id, t,
             vocab_size);
    MT_CHECK(l == kIgnoreLabel || (l >= 0 && l < vocab_size),
             "[batch] label {} at position {} is outside the vocabulary [0, {}) and is not -100", l, t, vocab_size);
  }
}

Batch Batch::to(Device device) const {
  Batch b = *this;
  if (tokens.device().is_cpu() && !device.is_cpu()) b.host = std::make_shared<const Batch>(*this);
  if (device.is_cpu()) b.host.reset();
  b.tokens = tokens.to(device, MemCategory::kActivations);
  b.positions = positions.to(device, MemCategory::kActivations);
  b.cu_seqlens = cu_seqlens.to(device, MemCategory::kActivations);
  b.labels = labels.to(device, MemCategory::kActivations);
  b.loss_weights = loss_weights.to(device, MemCategory::kActivations);
  return b;
}

}  // namespace moetrain
