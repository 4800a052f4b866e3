#!/usr/bin/env python3
# Builds the model reference fixtures: small random Qwen3-MoE / Qwen3 models run by Hugging Face
# transformers (float32, CPU, eager attention and eager experts) on two or three documents packed
# into one sequence, with the loss CE_mean + router_aux_loss_coef * aux (SPEC.md sections 2-3).
# Needs torch + transformers 5.x (present on the GPU machine only). Usage:
#   python3 tests/reference/make_model_fixtures.py --out DIR
# Writes DIR/<case>/{config.json, model.safetensors (as transformers saves it), reference.safetensors}.
import argparse
import inspect
import json
import math
import os
import shutil
import sys

import torch
import torch.nn.functional as F
import transformers
from safetensors import safe_open
from safetensors.torch import save_file

# One dict per model. Sizes are tiny (fixtures must stay small) but every feature the engine
# claims is exercised: GQA, head_dim != hidden/heads, tied/untied, norm_topk_prob on/off,
# decoder_sparse_step + mlp_only_layers (dense layers inside a MoE model), dense Qwen3.
CASES = [
    dict(name="moe_untied", kind="moe", vocab=96, hidden=32, layers=2, heads=4, kv=2, head_dim=16,
         inter=40, moe_inter=24, experts=6, topk=2, norm_topk=True, tie=False, sparse_step=1,
         mlp_only=[], theta=10000.0, coef=0.05, docs=[7, 6]),
    dict(name="moe_tied_nonorm", kind="moe", vocab=80, hidden=32, layers=2, heads=4, kv=1, head_dim=8,
         inter=40, moe_inter=16, experts=5, topk=3, norm_topk=False, tie=True, sparse_step=1,
         mlp_only=[], theta=1000000.0, coef=0.1, docs=[6, 1, 6]),
    dict(name="moe_sparse_step", kind="moe", vocab=64, hidden=24, layers=4, heads=2, kv=2, head_dim=12,
         inter=36, moe_inter=20, experts=4, topk=2, norm_topk=True, tie=False, sparse_step=2,
         mlp_only=[3], theta=500.0, coef=0.08, docs=[8, 5]),
    dict(name="dense", kind="dense", vocab=72, hidden=32, layers=2, heads=4, kv=2, head_dim=16,
         inter=48, tie=True, theta=10000.0, docs=[5, 8]),
]


def build_config(c):
    common = dict(vocab_size=c["vocab"], hidden_size=c["hidden"], intermediate_size=c["inter"],
                  num_hidden_layers=c["layers"], num_attention_heads=c["heads"],
                  num_key_value_heads=c["kv"], head_dim=c["head_dim"], hidden_act="silu",
                  max_position_embeddings=256, rms_norm_eps=1e-6,
                  tie_word_embeddings=c["tie"], attention_bias=False, attention_dropout=0.0,
                  use_cache=False, bos_token_id=1, eos_token_id=2, pad_token_id=None,
                  attn_implementation="eager")
    cls = transformers.Qwen3MoeConfig if c["kind"] == "moe" else transformers.Qwen3Config
    # transformers 5 takes rope_parameters; older versions take rope_theta.
    if "rope_parameters" in inspect.signature(cls.__init__).parameters:
        common["rope_parameters"] = {"rope_type": "default", "rope_theta": c["theta"]}
    else:
        common["rope_theta"] = c["theta"]
    if c["kind"] == "moe":
        # output_router_logits stays off in the forward: transformers' aux loss cannot take the
        # 4-D packed mask; the aux loss is computed below from hooked raw router logits with
        # transformers' own load_balancing_loss_func.
        cfg = cls(moe_intermediate_size=c["moe_inter"], num_experts=c["experts"],
                  num_experts_per_tok=c["topk"], norm_topk_prob=c["norm_topk"],
                  decoder_sparse_step=c["sparse_step"], mlp_only_layers=list(c["mlp_only"]),
                  router_aux_loss_coef=c["coef"], output_router_logits=False, **common)
        model = transformers.Qwen3MoeForCausalLM(cfg)
    else:
        cfg = cls(**common)
        model = transformers.Qwen3ForCausalLM(cfg)
    # Eager attention (the 4-D mask is added to the scores) and eager experts (a loop over experts).
    for setter, value in (("set_attn_implementation", "eager"), ("set_experts_implementation", "eager")):
        if hasattr(model, setter):
            try:
                getattr(model, setter)(value)
            except Exception as e:  # noqa: BLE001 - record and go on; checks below catch real faults
                print(f"note: {setter} failed: {e}", file=sys.stderr)
    for attr in ("_attn_implementation", "_experts_implementation"):
        try:
            setattr(model.config, attr, "eager")
        except Exception:  # noqa: BLE001
            pass
    return model.float().eval()


def reinit(model, seed):
    # Values chosen so activations are O(1), routing is decisive (router std 0.5 avoids near-ties
    # that fp32 rounding could flip) and norm weights are not all ones.
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
            elif name.endswith("embed_tokens.weight"):
                p.copy_(0.3 * torch.randn(p.shape, generator=g))
            elif name.endswith("mlp.gate.weight"):
                p.copy_(0.5 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(p.shape[-1]))


def make_batch(c, seed):
    g = torch.Generator().manual_seed(seed + 1000)
    docs = [torch.randint(3, c["vocab"], (n,), generator=g) for n in c["docs"]]
    ids = torch.cat(docs)
    positions = torch.cat([torch.arange(n) for n in c["docs"]])
    cu = [0]
    for n in c["docs"]:
        cu.append(cu[-1] + n)
    T = cu[-1]
    labels = torch.full((T,), -100, dtype=torch.long)
    for d in range(len(c["docs"])):
        for t in range(cu[d], cu[d + 1] - 1):
            labels[t] = ids[t + 1]
    labels[1] = -100  # a masked (prompt) position inside a document
    doc_of = torch.zeros(T, dtype=torch.long)
    for d in range(len(c["docs"])):
        doc_of[cu[d]:cu[d + 1]] = d
    allowed = (doc_of[:, None] == doc_of[None, :]) & (torch.arange(T)[None, :] <= torch.arange(T)[:, None])
    return ids, positions, torch.tensor(cu, dtype=torch.int32), labels, allowed


class RouterTap:
    """Captures the raw router logits of every sparse layer (hooks on mlp.gate) so that the aux loss
    uses one softmax whatever the router module returns (transformers 5 routers have returned
    probabilities as 'router_logits', which its aux loss then softmaxes again)."""

    def __init__(self, model):
        self.logits = []
        self.layers = []
        self.handles = []
        for i, layer in enumerate(model.model.layers):
            gate = getattr(layer.mlp, "gate", None)
            if gate is None or not hasattr(gate, "weight") or gate.weight.dim() != 2:
                continue
            if gate.weight.shape[0] != model.config.num_experts:
                continue
            self.layers.append(i)
            self.handles.append(gate.register_forward_hook(self._hook))

    def _hook(self, module, inputs, output):
        x = inputs[0]
        self.logits.append(F.linear(x.reshape(-1, x.shape[-1]), module.weight))

    def clear(self):
        self.logits = []


def aux_loss_spec(router_logits, num_experts, top_k):
    # SPEC 3 (HF load_balancing_loss_func without padding): rows of all sparse layers together.
    cat = torch.cat(router_logits, dim=0)
    probs = torch.softmax(cat.float(), dim=-1)
    _, sel = torch.topk(probs, top_k, dim=-1)
    mask = F.one_hot(sel, num_experts).float()              # [N, k, E]
    tokens_per_expert = mask.mean(dim=0)                     # [k, E]
    prob_per_expert = probs.mean(dim=0)                      # [E]
    return num_experts * torch.sum(tokens_per_expert * prob_per_expert[None, :])


def run_packed(model, ids, positions, allowed, mask_style):
    T = ids.shape[0]
    if mask_style == "float4d":
        m = torch.zeros(1, 1, T, T, dtype=torch.float32)
        m.masked_fill_(~allowed[None, None], torch.finfo(torch.float32).min)
    elif mask_style == "bool4d":
        m = allowed[None, None].clone()
    else:
        raise ValueError(mask_style)
    return model(input_ids=ids[None], position_ids=positions[None].long(), attention_mask=m,
                 output_hidden_states=True, use_cache=False)


def per_doc_logits(model, ids, cu):
    outs = []
    with torch.no_grad():
        for d in range(len(cu) - 1):
            s, e = int(cu[d]), int(cu[d + 1])
            o = model(input_ids=ids[None, s:e], position_ids=torch.arange(e - s)[None], use_cache=False)
            outs.append(o.logits[0])
    return torch.cat(outs, dim=0)


def fused_grads(model, c):
    """Parameter gradients under transformers' in-memory names, experts fused as
    [E, 2I, H] (gate rows first) and [E, H, I] whatever layout this transformers version uses."""
    out = {}
    per_expert = {}
    for name, p in model.named_parameters():
        g = p.grad if p.grad is not None else torch.zeros_like(p)
        parts = name.split(".")
        if ".mlp.experts." in name and parts[-1] == "weight" and parts[-3].isdigit():
            # model.layers.L.mlp.experts.E.{gate,up,down}_proj.weight
            layer, e, proj = int(parts[2]), int(parts[-3]), parts[-2]
            per_expert.setdefault(layer, {}).setdefault(proj, {})[e] = g.detach().clone()
            continue
        out[name] = g.detach().clone().contiguous()
    for layer, projs in per_expert.items():
        E = c["experts"]
        gate = torch.stack([projs["gate_proj"][e] for e in range(E)])
        up = torch.stack([projs["up_proj"][e] for e in range(E)])
        out[f"model.layers.{layer}.mlp.experts.gate_up_proj"] = torch.cat([gate, up], dim=1).contiguous()
        out[f"model.layers.{layer}.mlp.experts.down_proj"] = torch.stack(
            [projs["down_proj"][e] for e in range(E)]).contiguous()
    return out, ("per_expert" if per_expert else "fused")


def effective_theta(model, head_dim):
    rot = getattr(model.model, "rotary_emb", None)
    if rot is None:
        rot = model.model.layers[0].self_attn.rotary_emb
    inv = rot.inv_freq.double()
    return float(inv[1] ** (-head_dim / 2.0))


def min_topk_gap(router_logits, k):
    # Smallest gap between the k-th and (k+1)-th largest raw router logit (softmax is monotone,
    # so this is the margin of the top-k choice in log-probability units).
    gap = float("inf")
    for lg in router_logits:
        s, _ = torch.sort(lg.detach().double(), dim=-1, descending=True)
        if s.shape[1] > k:
            gap = min(gap, float((s[:, k - 1] - s[:, k]).min()))
    return gap


def make_case(c, out_dir):
    torch.manual_seed(0)
    for attempt in range(40):
        seed = 1234 + 97 * attempt
        model = build_config(c)
        reinit(model, seed)
        ids, positions, cu, labels, allowed = make_batch(c, seed)
        tap = RouterTap(model) if c["kind"] == "moe" else None
        per_doc_logits(model, ids, cu)
        gap = min_topk_gap(tap.logits, c["topk"]) if tap else float("inf")
        if tap:
            for h in tap.handles:
                h.remove()
        if gap > 2e-2:
            break
    else:
        raise RuntimeError(f"{c['name']}: no seed without near-tied routing")
    try:
        theta_eff = effective_theta(model, c["head_dim"])
    except Exception as e:  # noqa: BLE001
        theta_eff = float("nan")
        print(f"{c['name']}: could not read inv_freq: {e}", file=sys.stderr)
    if not math.isnan(theta_eff) and abs(theta_eff / c["theta"] - 1) > 1e-4:
        raise RuntimeError(f"{c['name']}: rope theta {theta_eff} != {c['theta']}")

    # Packed forward with a block-diagonal causal mask; check it against documents run one by one.
    ref_logits = per_doc_logits(model, ids, cu)
    chosen = None
    tap = None
    for style in ("float4d", "bool4d"):
        try:
            tap = RouterTap(model) if c["kind"] == "moe" else None
            out = run_packed(model, ids, positions, allowed, style)
            diff = float((out.logits[0].detach() - ref_logits).abs().max())
            if diff < 1e-4:
                chosen = style
                break
            print(f"{c['name']}: mask style {style} differs from per-document logits by {diff}", file=sys.stderr)
        except Exception as e:  # noqa: BLE001
            print(f"{c['name']}: mask style {style} failed: {e}", file=sys.stderr)
        if tap:
            for h in tap.handles:
                h.remove()
    if chosen is None:
        raise RuntimeError(f"{c['name']}: packed attention does not match per-document runs")
    if tap:
        for h in tap.handles:
            h.remove()

    logits = out.logits[0]                                        # [T, V]
    ce = F.cross_entropy(logits.float(), labels, ignore_index=-100, reduction="mean")
    meta_extra = {"max_abs_diff_packed_vs_per_doc": float((logits.detach() - ref_logits).abs().max())}
    if c["kind"] == "moe":
        aux = aux_loss_spec(tap.logits, c["experts"], c["topk"])
        # transformers' own function on the same raw logits (no padding mask) must agree.
        try:
            from transformers.models.qwen3_moe import modeling_qwen3_moe as mq
            hf_aux = mq.load_balancing_loss_func(tuple(tap.logits), c["experts"], c["topk"], None)
            meta_extra["hf_load_balancing_loss_func_on_raw_logits"] = float(hf_aux)
            if abs(float(hf_aux) - float(aux)) > 1e-5 * max(1.0, abs(float(aux))):
                raise RuntimeError(f"{c['name']}: spec aux {float(aux)} != transformers aux {float(hf_aux)}")
        except ImportError as e:
            meta_extra["hf_load_balancing_loss_func_error"] = str(e)[:200]
        loss = ce + c["coef"] * aux
        # For the record: what transformers itself reports with output_router_logits=True
        # (packing left to transformers' own detection from position_ids, no mask).
        try:
            with torch.no_grad():
                o3 = model(input_ids=ids[None], position_ids=positions[None].long(),
                           output_router_logits=True, use_cache=False)
            hf_rl = getattr(o3, "router_logits", None)
            if hf_rl is not None and len(hf_rl) > 0:
                rs = hf_rl[0].detach().float().reshape(-1, c["experts"]).sum(-1)
                meta_extra["hf_router_logits_are_probs"] = bool(torch.allclose(rs, torch.ones_like(rs), atol=1e-5))
            if getattr(o3, "aux_loss", None) is not None:
                meta_extra["hf_aux_loss_output_router_logits"] = float(o3.aux_loss)
            meta_extra["hf_logits_diff_position_ids_only"] = float((o3.logits[0] - logits).abs().max())
        except Exception as e:  # noqa: BLE001
            meta_extra["hf_output_router_logits_error"] = str(e)[:200]
    else:
        aux = torch.zeros(())
        loss = ce
    # transformers' own loss with unshifted labels (it shifts inside): must equal our CE.
    try:
        hf_labels = torch.cat([torch.tensor([-100]), labels[:-1]])
        with torch.no_grad():
            o2 = run_packed_with_labels(model, ids, positions, allowed, chosen, hf_labels)
        meta_extra["hf_ce_with_labels"] = float(o2.loss)
    except Exception as e:  # noqa: BLE001
        meta_extra["hf_ce_with_labels_error"] = str(e)[:200]

    model.zero_grad(set_to_none=True)
    loss.backward()
    grads, mem_layout = fused_grads(model, c)

    # Save the model as transformers saves it, then note the on-disk names.
    mdir = os.path.join(out_dir, c["name"])
    os.makedirs(mdir, exist_ok=True)
    model.save_pretrained(mdir)
    for extra in ("generation_config.json",):
        p = os.path.join(mdir, extra)
        if os.path.exists(p):
            os.remove(p)
    with safe_open(os.path.join(mdir, "model.safetensors"), "pt") as f:
        disk_keys = sorted(f.keys())
        disk_dtypes = sorted({str(f.get_tensor(k).dtype) for k in disk_keys})
    disk_layout = "fused" if any(k.endswith("experts.gate_up_proj") for k in disk_keys) else (
        "per_expert" if any(".experts.0." in k for k in disk_keys) else "none")

    tensors = {
        "input_ids": ids.to(torch.int32), "positions": positions.to(torch.int32),
        "cu_seqlens": cu, "labels": labels.to(torch.int32),
        "logits": logits.detach().float().contiguous(),
        "loss": loss.detach().float().reshape(1).clone(), "ce_loss": ce.detach().float().reshape(1).clone(),
        "aux_loss": aux.detach().float().reshape(1).clone(),
    }
    for i, h in enumerate(out.hidden_states):
        tensors[f"hidden_states.{i}"] = h[0].detach().float().contiguous()
    if c["kind"] == "moe":
        for layer, lg in zip(tap.layers, tap.logits):
            tensors[f"router_logits.{layer}"] = lg.detach().float().contiguous()
    for name, g in grads.items():
        tensors["grad." + name] = g.float().contiguous()
    meta = {
        "generator": "tests/reference/make_model_fixtures.py",
        "torch_version": torch.__version__,
        "transformers_version": transformers.__version__,
        "case": json.dumps(c),
        "config": model.config.to_json_string(use_diff=False),
        "seed": str(seed),
        "mask_style": chosen,
        "min_topk_logit_gap": str(gap),
        "rope_theta_effective": repr(theta_eff),
        "experts_layout_in_memory": mem_layout if c["kind"] == "moe" else "none",
        "experts_layout_on_disk": disk_layout,
        "disk_keys": json.dumps(disk_keys),
        "disk_dtypes": json.dumps(disk_dtypes),
        "param_names_in_memory": json.dumps([n for n, _ in model.named_parameters()]),
        "loss_definition": "mean CE over labels != -100 + router_aux_loss_coef * aux (single softmax, all rows of all sparse layers)",
    }
    for k, v in meta_extra.items():
        meta[k] = json.dumps(v)
    save_file(tensors, os.path.join(mdir, "reference.safetensors"), metadata=meta)
    print(f"{c['name']}: T={ids.shape[0]} loss={float(loss):.6f} ce={float(ce):.6f} aux={float(aux):.6f} "
          f"mask={chosen} gap={gap:.4g} mem={mem_layout} disk={disk_layout} extra={meta_extra}")


def run_packed_with_labels(model, ids, positions, allowed, style, hf_labels):
    T = ids.shape[0]
    if style == "float4d":
        m = torch.zeros(1, 1, T, T, dtype=torch.float32)
        m.masked_fill_(~allowed[None, None], torch.finfo(torch.float32).min)
    else:
        m = allowed[None, None].clone()
    return model(input_ids=ids[None], position_ids=positions[None].long(), attention_mask=m,
                 labels=hf_labels[None], use_cache=False)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--only", default="")
    args = ap.parse_args()
    torch.set_num_threads(4)
    torch.use_deterministic_algorithms(True, warn_only=True)
    if os.path.isdir(args.out):
        shutil.rmtree(args.out)
    os.makedirs(args.out)
    print(f"torch {torch.__version__} transformers {transformers.__version__}")
    failed = []
    for c in CASES:
        if args.only and c["name"] != args.only:
            continue
        try:
            make_case(c, args.out)
        except Exception as e:  # noqa: BLE001 - keep going so one bad case costs no other
            import traceback
            traceback.print_exc()
            failed.append(c["name"])
    if failed:
        print("FAILED cases: " + ", ".join(failed))
        sys.exit(1)


if __name__ == "__main__":
    main()
