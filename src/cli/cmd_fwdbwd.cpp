// `moetrain fwdbwd`: one forward/backward of a Hugging Face model directory on given token ids
// (documents packed into one sequence, labels shifted inside each document, mean CE over the
// labelled tokens + router_aux_loss_coef * aux [+ z-loss]) on the CPU in fp32, written to a
// safetensors file: loss, ce_loss, aux_loss, z_loss [1], logits [T,V], the batch (input_ids,
// positions, labels, cu_seqlens) and every parameter gradient as "grad.<transformers name>".
// Experts are fused (mlp.experts.gate_up_proj [E,2I,H], down_proj [E,H,I], as transformers 5
// holds them in memory) unless --expert-layout per-expert asks for experts.<e>.{gate,up,down}_proj.
#include <fstream>
#include <sstream>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "cli/command.h"
#include "core/check.h"
#include "core/log.h"
#include "io/safetensors.h"
#include "model/hf_checkpoint.h"
#include "model/qwen3_model.h"

namespace moetrain::cli {
namespace {

// "1 2 3 | 4 5" or a file: documents separated by '|' or newlines, ids by whitespace.
std::vector<std::vector<int32_t>> parse_documents(const std::string& text, const std::string& source) {
  std::vector<std::vector<int32_t>> docs(1);
  std::string word;
  int line = 1;
  auto flush_word = [&]() {
    if (word.empty()) return;
    size_t used = 0;
    long long v = 0;
    try {
      v = std::stoll(word, &used);
    } catch (...) {
      used = 0;
    }
    MT_CHECK(used == word.size() && v >= 0 && v <= INT32_MAX,
             "[fwdbwd] {} line {}: '{}' is not a token id (a non-negative integer)", source, line, word);
    docs.back().push_back(static_cast<int32_t>(v));
    word.clear();
  };
  for (char ch : text) {
    if (ch == '|' || ch == '\n') {
      flush_word();
      if (!docs.back().empty()) docs.emplace_back();
      if (ch == '\n') ++line;
    } else if (std::isspace(static_cast<unsigned char>(ch))) {
      flush_word();
    } else {
      word.push_back(ch);
    }
  }
  flush_word();
  if (docs.back().empty()) docs.pop_back();
  MT_CHECK(!docs.empty(), "[fwdbwd] {} holds no token ids", source);
  return docs;
}

Tensor scalar1(double v) { return Tensor::from_floats({static_cast<float>(v)}, {1}); }

int run_fwdbwd(int argc, char** argv) {
  std::string model_dir, tokens_file, ids, output, aux_type = "global", recompute = "none", layout = "fused";
  float aux_coef = -1.0f, zloss_coef = 0.0f;
  bool no_logits = false;
  CLI::App app{"One forward/backward on given token ids; writes loss, logits and every gradient (fp32, CPU).",
               "moetrain fwdbwd"};
  app.add_option("--model", model_dir, "Hugging Face model directory (config.json + safetensors)")->required();
  auto* tf = app.add_option("--tokens", tokens_file, "text file of token ids: one document per line (or '|')");
  auto* io = app.add_option("--ids", ids, "token ids inline, documents separated by '|', e.g. \"1 2 3 | 4 5\"");
  tf->excludes(io);
  app.add_option("--output", output, "output .safetensors file")->required();
  app.add_option("--aux-coef", aux_coef, "aux loss coefficient (default: router_aux_loss_coef of config.json)");
  app.add_option("--aux-loss", aux_type, "aux loss form: global (HF, default) or per_layer (Megatron)")
      ->check(CLI::IsMember({"global", "per_layer"}));
  app.add_option("--zloss-coef", zloss_coef, "router z-loss coefficient (default 0)");
  app.add_option("--recompute", recompute, "none (default) or full")->check(CLI::IsMember({"none", "full"}));
  app.add_option("--expert-layout", layout, "gradient names for experts: fused (default) or per-expert")
      ->check(CLI::IsMember({"fused", "per-expert"}));
  app.add_flag("--no-logits", no_logits, "do not write the logits");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  MT_CHECK(!tokens_file.empty() || !ids.empty(), "[fwdbwd] give the token ids with --tokens FILE or --ids \"...\"");
  std::vector<std::vector<int32_t>> docs;
  if (!tokens_file.empty()) {
    std::ifstream f(tokens_file);
    MT_CHECK(f.good(), "[fwdbwd] cannot read --tokens file {}", tokens_file);
    std::stringstream ss;
    ss << f.rdbuf();
    docs = parse_documents(ss.str(), tokens_file);
  } else {
    docs = parse_documents(ids, "--ids");
  }

  ModelParams params = load_hf_checkpoint(model_dir, DType::kF32, Device::cpu());
  Batch batch = Batch::from_documents(docs);
  ModelOptions mo;
  mo.aux_coef = aux_coef;
  mo.aux_type = parse_aux_loss_type(aux_type);
  mo.zloss_coef = zloss_coef;
  mo.recompute = parse_recompute(recompute);
  Qwen3Model model(params, mo);
  ModelParams grads = allocate_gradients(params.config, Device::cpu());
  Context ctx;
  ForwardResult r = model.forward_backward(ctx, batch, grads, !no_logits);
  MT_LOG_INFO("[fwdbwd] {} tokens in {} documents, {} labelled: loss {:.6f} (ce {:.6f}, aux {:.6f} x {}, z {:.6f} x {})",
              batch.num_tokens(), batch.num_docs(), r.num_labelled, r.loss, r.ce, r.aux, model.aux_coef(), r.z,
              zloss_coef);
  nlohmann::json stats = nlohmann::json::array();
  for (const auto& s : r.router) {
    MT_LOG_INFO("[fwdbwd] layer {}: max/mean load {:.3f}, experts used {:.3f}, entropy {:.4f}", s.layer,
                s.max_mean_load, s.frac_active, s.entropy);
    stats.push_back({{"layer", s.layer}, {"tokens_per_expert", s.tokens_per_expert},
                     {"max_mean_load", s.max_mean_load}, {"frac_active", s.frac_active}, {"entropy", s.entropy},
                     {"aux", s.aux}, {"z", s.z}});
  }

  std::vector<TensorWriteSpec> specs;
  specs.push_back(tensor_write_spec("loss", scalar1(r.loss)));
  specs.push_back(tensor_write_spec("ce_loss", scalar1(r.ce)));
  specs.push_back(tensor_write_spec("aux_loss", scalar1(r.aux)));
  specs.push_back(tensor_write_spec("z_loss", scalar1(r.z)));
  if (!no_logits) specs.push_back(tensor_write_spec("logits", r.logits));
  specs.push_back(tensor_write_spec("input_ids", batch.tokens));
  specs.push_back(tensor_write_spec("positions", batch.positions));
  specs.push_back(tensor_write_spec("labels", batch.labels));
  specs.push_back(tensor_write_spec("cu_seqlens", batch.cu_seqlens));
  const bool per_expert = layout == "per-expert";
  for_each_hf_named(grads, [&](const std::string& name, const Tensor& g) {
    const std::string suffix_gu = "mlp.experts.gate_up_proj", suffix_dn = "mlp.experts.down_proj";
    const bool is_gu = name.size() > suffix_gu.size() && name.compare(name.size() - suffix_gu.size(), suffix_gu.size(), suffix_gu) == 0;
    const bool is_dn = name.size() > suffix_dn.size() && name.compare(name.size() - suffix_dn.size(), suffix_dn.size(), suffix_dn) == 0;
    if (!per_expert || (!is_gu && !is_dn)) {
      specs.push_back(tensor_write_spec("grad." + name, g));
      return;
    }
    const std::string pre = name.substr(0, name.size() - (is_gu ? suffix_gu : suffix_dn).size()) + "mlp.experts.";
    for (int64_t e = 0; e < g.size(0); ++e) {
      const Tensor ge = g.select(0, e);
      const std::string ep = "grad." + pre + std::to_string(e) + ".";
      if (is_gu) {
        const int64_t I = ge.size(0) / 2;
        specs.push_back(tensor_write_spec(ep + "gate_proj.weight", ge.slice(0, 0, I)));
        specs.push_back(tensor_write_spec(ep + "up_proj.weight", ge.slice(0, I, 2 * I)));
      } else {
        specs.push_back(tensor_write_spec(ep + "down_proj.weight", ge));
      }
    }
  });
  std::map<std::string, std::string> meta = {
      {"format", "pt"},
      {"generator", "moetrain fwdbwd"},
      {"model", model_dir},
      {"expert_layout", layout},
      {"aux_loss_type", aux_type},
      {"aux_coef", std::to_string(model.aux_coef())},
      {"zloss_coef", std::to_string(zloss_coef)},
      {"loss_definition", "mean CE over labelled tokens + aux_coef * aux + zloss_coef * z"},
      {"router_stats", stats.dump()},
  };
  write_safetensors(output, specs, meta);
  MT_LOG_INFO("[fwdbwd] wrote {} ({} tensors)", output, specs.size());
  return 0;
}

}  // namespace

MT_COMMAND("fwdbwd", "one forward/backward on token ids; writes loss, logits and all gradients", run_fwdbwd);

}  // namespace moetrain::cli
