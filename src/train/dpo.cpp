// The DPO objective (see dpo.h). One policy forward per micro-batch serves both the loss and the
// backward: the forward runs with zero CE weights and returns the per-token NLL (= -logp), and the
// DPO weights are then written into the loss_weights storage that the model's saved batch shares;
// its backward recomputes the loss head with them (qwen3_model.h), i.e. differentiates the DPO loss.
#include "train/dpo.h"

#include <algorithm>
#include <filesystem>
#include <map>

#include "core/check.h"
#include "core/log.h"

namespace moetrain {

const char* dpo_reference_name(DpoReference r) { return r == DpoReference::kPrecomputed ? "precomputed" : "online"; }

DpoReference parse_dpo_reference(const std::string& s) {
  if (s == "precomputed") return DpoReference::kPrecomputed;
  if (s == "online") return DpoReference::kOnline;
  MT_FAIL("[dpo] reference '{}' is not one of precomputed, online", s);
}

namespace {

// Pair losses of a batch from per-document policy sums; fills the per-document derivative.
DpoMetrics pair_losses(const std::vector<double>& pol, const std::vector<double>& ref_c,
                       const std::vector<double>& ref_r, const DpoOptions& opt, std::vector<double>* dlogp) {
  const size_t P = pol.size() / 2;
  MT_CHECK(ref_c.size() == P && ref_r.size() == P, "[dpo] {} pairs but {}/{} reference log-probs", P, ref_c.size(),
           ref_r.size());
  DpoMetrics m;
  if (dlogp) dlogp->assign(2 * P, 0.0);
  for (size_t i = 0; i < P; ++i) {
    PairLogps p{pol[2 * i], pol[2 * i + 1], ref_c[i], ref_r[i]};
    const PairLoss l = dpo_pair_loss(opt, p);
    m.add(p, l);
    if (dlogp) (*dlogp)[2 * i] = l.d_chosen, (*dlogp)[2 * i + 1] = l.d_rejected;
  }
  return m;
}

}  // namespace

DpoMicroResult dpo_forward_backward(Context& ctx, Qwen3Model& policy, ModelParams& grads, PairBatch& pb,
                                    const std::vector<double>& ref_chosen, const std::vector<double>& ref_rejected,
                                    const DpoOptions& opt, double pair_scale) {
  DpoMicroResult res;
  pb.batch.loss_weights.zero_();
  res.forward = policy.forward(ctx, pb.batch, Pass::kTrain);
  std::vector<double> pol = sequence_logps(res.forward.nll, pb.cu_seqlens);  // sums of -logp
  for (double& v : pol) v = -v;
  std::vector<double> dlogp;
  res.metrics = pair_losses(pol, ref_chosen, ref_rejected, opt, &dlogp);
  for (double& d : dlogp) d *= pair_scale;
  const std::vector<float> w = dpo_token_weights(pb, dlogp);
  pb.batch.loss_weights.copy_from(Tensor::from_floats(w, {static_cast<int64_t>(w.size())}));
  policy.backward(ctx, grads);
  return res;
}

DpoMetrics dpo_evaluate_batch(Context& ctx, Qwen3Model& policy, const PairBatch& pb,
                              const std::vector<double>& ref_chosen, const std::vector<double>& ref_rejected,
                              const DpoOptions& opt) {
  const std::vector<double> pol = sequence_logps(policy.token_logprobs(ctx, pb.batch), pb.cu_seqlens);
  return pair_losses(pol, ref_chosen, ref_rejected, opt, nullptr);
}

double pair_batch_mean_attended(const PairBatch& pb) {
  double keys = 0, toks = 0;
  for (size_t d = 0; d + 1 < pb.cu_seqlens.size(); ++d) {
    const double L = pb.cu_seqlens[d + 1] - pb.cu_seqlens[d];
    keys += L * (L + 1) / 2, toks += L;
  }
  return toks > 0 ? keys / toks : 0.0;
}

ModelParams clone_params(const ModelParams& p, MemCategory cat) {
  ModelParams c = ModelParams::allocate(p.config, p.embed.dtype(), p.embed.device(), cat);
  std::map<std::string, Tensor> dst;
  c.for_each([&](const std::string& n, Tensor& t) { dst[n] = t; });
  p.for_each([&](const std::string& n, const Tensor& t) {
    auto it = dst.find(n);
    MT_CHECK(it != dst.end(), "[dpo] clone: no tensor {}", n);
    it->second.copy_from(t.contiguous());
  });
  return c;
}

DpoObjective::DpoObjective(const DpoSettings& s, const std::string& train_prefix, const std::string& valid_prefix,
                           const PairLoaderOptions& loader, const std::string& run_dir, Device device)
    : s_(s), train_prefix_(train_prefix), valid_prefix_(valid_prefix), run_dir_(run_dir), device_(device),
      loader_opt_(loader) {
  s_.loss.validate(s.source.empty() ? run_dir : s.source);
  MT_CHECK(!train_prefix.empty(), "[dpo] DPO needs a preference dataset (data.data_path); mock data has no pairs");
  train_ = std::make_unique<PreferenceDataset>(train_prefix);
  if (!valid_prefix.empty()) valid_ = std::make_unique<PreferenceDataset>(valid_prefix);
  loader_ = std::make_unique<PairLoader>(train_->size(), loader);
}

DpoObjective::~DpoObjective() = default;

int64_t DpoObjective::num_train_pairs() const { return train_->size(); }

void DpoObjective::prepare_reference(Context& ctx, const ModelParams& start, const std::string& model_fingerprint,
                                     int64_t max_tokens, const ModelOptions& model_options) {
  ModelOptions mo = model_options;
  mo.router_stats = false;
  mo.recompute = Recompute::kNone;  // forward-only passes save nothing anyway
  if (s_.reference == DpoReference::kOnline) {
    frozen_ = clone_params(start);
    frozen_model_ = std::make_unique<Qwen3Model>(frozen_, mo);
    MT_LOG_INFO("[dpo] online reference: a frozen copy of the starting model stays resident");
  } else {
    Qwen3Model ref(start, mo);
    const std::string dir = run_dir_ + "/dpo_reference";
    ref_train_ = ensure_reference_logps(ctx, ref, train_prefix_, model_fingerprint, dir + "/train.safetensors",
                                        max_tokens, device_);
    if (valid_)
      ref_valid_ = ensure_reference_logps(ctx, ref, valid_prefix_, model_fingerprint, dir + "/valid.safetensors",
                                          max_tokens, device_);
  }
  prepared_ = true;
}

void DpoObjective::reference_of(Context& ctx, const PairBatch& pb, bool valid, std::vector<double>* c,
                                std::vector<double>* r) {
  MT_CHECK(prepared_, "[dpo] prepare_reference() must run before training or evaluation");
  c->clear(), r->clear();
  if (s_.reference == DpoReference::kOnline) {
    const std::vector<double> lp = sequence_logps(frozen_model_->token_logprobs(ctx, pb.batch), pb.cu_seqlens);
    for (size_t i = 0; 2 * i < lp.size(); ++i) c->push_back(lp[2 * i]), r->push_back(lp[2 * i + 1]);
    return;
  }
  const ReferenceLogps& ref = valid ? ref_valid_ : ref_train_;
  for (int64_t id : pb.pair_ids) {
    MT_CHECK(id >= 0 && id < ref.size(), "[dpo] pair {} has no reference log-prob ({} stored)", id, ref.size());
    c->push_back(ref.chosen[id]), r->push_back(ref.rejected[id]);
  }
}

bool DpoObjective::next_batch(PairBatch* out) {
  std::vector<int64_t> ids;
  if (!loader_->next(&ids)) return false;
  *out = make_pair_batch(*train_, ids, device_);
  return true;
}

DpoMicroResult DpoObjective::forward_backward(Context& ctx, Qwen3Model& policy, ModelParams& grads, PairBatch& pb,
                                              double pair_scale) {
  std::vector<double> c, r;
  reference_of(ctx, pb, false, &c, &r);
  return dpo_forward_backward(ctx, policy, grads, pb, c, r, s_.loss, pair_scale);
}

DpoMetrics DpoObjective::evaluate(Context& ctx, Qwen3Model& policy, int64_t max_batches) {
  DpoMetrics m;
  if (!valid_) return m;
  PairLoaderOptions o = loader_opt_;
  o.shuffle = false;
  o.max_epochs = 1;
  PairLoader loader(valid_->size(), o);
  std::vector<int64_t> ids;
  std::vector<double> c, r;
  for (int64_t b = 0; (max_batches <= 0 || b < max_batches) && loader.next(&ids); ++b) {
    const PairBatch pb = make_pair_batch(*valid_, ids, device_);
    reference_of(ctx, pb, true, &c, &r);
    m.merge(dpo_evaluate_batch(ctx, policy, pb, c, r, s_.loss));
  }
  return m;
}

}  // namespace moetrain
