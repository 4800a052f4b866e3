#!/usr/bin/env python3
# Builds the DPO reference fixtures: a small random Qwen3-MoE run by Hugging Face transformers
# (float32, CPU, eager attention and experts), each sequence of each preference pair on its own;
# sequence log-probs = sums of log_softmax over response tokens (mask 1, the first token never
# scored); the DPO loss written out plainly in PyTorch (SPEC.md section 7: sigmoid with label
# smoothing, or IPO), mean over pairs, plus router_aux_loss_coef * the HF global aux loss over the
# router logits of every sequence; then backward. The reference log-probs come from a second
# model (the policy with small noise) so that deltas are not zero.
# Needs torch + transformers 5.x (the GPU machine). Usage:
#   python3 tests/reference/make_dpo_fixtures.py --out DIR
# Writes DIR/<case>/{config.json, model.safetensors (the policy), reference.safetensors}.
import argparse
import json
import os
import shutil
import sys

import torch
import torch.nn.functional as F
import transformers
from safetensors.torch import save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_model_fixtures as mmf  # noqa: E402  (model building, init, router taps, grads)

CASES = [
    dict(name="sigmoid_smoothed", loss="sigmoid", beta=0.5, eps=0.1,
         model=dict(kind="moe", vocab=96, hidden=32, layers=2, heads=4, kv=2, head_dim=16, inter=40,
                    moe_inter=24, experts=6, topk=2, norm_topk=True, tie=False, sparse_step=1,
                    mlp_only=[], theta=10000.0, coef=0.05),
         pairs=[(4, 3, 5), (2, 6, 1), (5, 2, 2)]),  # (prompt, chosen response, rejected response)
    dict(name="ipo_tied", loss="ipo", beta=0.4, eps=0.0,
         model=dict(kind="moe", vocab=80, hidden=32, layers=3, heads=4, kv=1, head_dim=8, inter=40,
                    moe_inter=16, experts=5, topk=3, norm_topk=False, tie=True, sparse_step=1,
                    mlp_only=[1], theta=1000000.0, coef=0.1),
         pairs=[(3, 4, 4), (1, 1, 3)]),
]


def make_pairs(c, seed):
    g = torch.Generator().manual_seed(seed + 77)
    V = c["model"]["vocab"]
    pairs = []
    for np_, nc, nr in c["pairs"]:
        prompt = torch.randint(3, V, (np_,), generator=g)
        sides = []
        for n in (nc, nr):
            ids = torch.cat([prompt, torch.randint(3, V, (n,), generator=g)])
            mask = torch.cat([torch.zeros(np_, dtype=torch.int32), torch.ones(n, dtype=torch.int32)])
            sides.append((ids, mask))
        pairs.append(sides)
    return pairs


def seq_logp(model, ids, mask):
    """Sum over t >= 1 with mask[t] = 1 of log p(ids[t] | ids[:t]) for one sequence."""
    out = model(input_ids=ids[None], position_ids=torch.arange(ids.shape[0])[None], use_cache=False)
    logp = torch.log_softmax(out.logits[0].float(), dim=-1)  # [T, V]
    tok = logp[:-1].gather(1, ids[1:, None])[:, 0]           # [T-1] log p of the next token
    return (tok * mask[1:].float()).sum()


def dpo_loss(kind, beta, eps, pc, pr, rc, rr):
    """Plain PyTorch DPO over pairs: mean of the per-pair losses."""
    delta = beta * ((pc - rc) - (pr - rr))
    if kind == "sigmoid":
        per = -(1 - eps) * F.logsigmoid(delta) - eps * F.logsigmoid(-delta)
    else:
        per = (delta / beta - 1.0 / (2.0 * beta)) ** 2
    return per.mean(), delta


def run_case(c, out_dir):
    m = c["model"]
    for attempt in range(40):
        seed = 4321 + 131 * attempt
        policy = mmf.build_config(m)
        mmf.reinit(policy, seed)
        ref = mmf.build_config(m)
        ref.load_state_dict(policy.state_dict())
        g = torch.Generator().manual_seed(seed + 5)
        with torch.no_grad():
            for p in ref.parameters():
                p.add_(0.05 * p.abs().mean() * torch.randn(p.shape, generator=g))
        pairs = make_pairs(c, seed)
        gap = float("inf")
        for model in (policy, ref):
            tap = mmf.RouterTap(model)
            with torch.no_grad():
                for sides in pairs:
                    for ids, mask in sides:
                        seq_logp(model, ids, mask)
            gap = min(gap, mmf.min_topk_gap(tap.logits, m["topk"]))
            for h in tap.handles:
                h.remove()
        if gap > 2e-2:
            break
    else:
        raise RuntimeError(f"{c['name']}: no seed without near-tied routing")

    with torch.no_grad():
        rc = torch.stack([seq_logp(ref, s[0][0], s[0][1]) for s in pairs])
        rr = torch.stack([seq_logp(ref, s[1][0], s[1][1]) for s in pairs])
    tap = mmf.RouterTap(policy)
    pc = torch.stack([seq_logp(policy, s[0][0], s[0][1]) for s in pairs])
    pr = torch.stack([seq_logp(policy, s[1][0], s[1][1]) for s in pairs])
    loss, delta = dpo_loss(c["loss"], c["beta"], c["eps"], pc, pr, rc, rr)
    aux = mmf.aux_loss_spec(tap.logits, m["experts"], m["topk"])
    for h in tap.handles:
        h.remove()
    total = loss + m["coef"] * aux
    policy.zero_grad(set_to_none=True)
    total.backward()
    grads, mem_layout = mmf.fused_grads(policy, m)

    mdir = os.path.join(out_dir, c["name"])
    os.makedirs(mdir, exist_ok=True)
    policy.save_pretrained(mdir)
    for extra in ("generation_config.json",):
        p = os.path.join(mdir, extra)
        if os.path.exists(p):
            os.remove(p)
    tensors = {
        "policy_chosen": pc.detach().float().contiguous(), "policy_rejected": pr.detach().float().contiguous(),
        "ref_chosen": rc.float().contiguous(), "ref_rejected": rr.float().contiguous(),
        "rewards_chosen": (c["beta"] * (pc - rc)).detach().float().contiguous(),
        "rewards_rejected": (c["beta"] * (pr - rr)).detach().float().contiguous(),
        "delta": delta.detach().float().contiguous(),
        "dpo_loss": loss.detach().float().reshape(1).clone(), "aux_loss": aux.detach().float().reshape(1).clone(),
        "total_loss": total.detach().float().reshape(1).clone(),
    }
    for i, sides in enumerate(pairs):
        for name, (ids, mask) in zip(("chosen", "rejected"), sides):
            tensors[f"{name}_ids.{i}"] = ids.to(torch.int32).contiguous()
            tensors[f"{name}_mask.{i}"] = mask.to(torch.int32).contiguous()
    for name, gr in grads.items():
        tensors["grad." + name] = gr.float().contiguous()
    meta = {
        "generator": "tests/reference/make_dpo_fixtures.py",
        "torch_version": torch.__version__,
        "transformers_version": transformers.__version__,
        "case": json.dumps(c),
        "loss_type": c["loss"], "beta": repr(c["beta"]), "label_smoothing": repr(c["eps"]),
        "pairs": str(len(pairs)), "seed": str(seed), "min_topk_logit_gap": repr(gap),
        "experts_layout_in_memory": mem_layout,
        "loss_definition": "mean over pairs of the DPO pair loss on response-token log-prob sums "
                           "+ router_aux_loss_coef * HF global aux over all sequences' router logits",
    }
    save_file(tensors, os.path.join(mdir, "reference.safetensors"), metadata=meta)
    print(f"{c['name']}: pairs={len(pairs)} dpo={float(loss):.6f} aux={float(aux):.6f} total={float(total):.6f} "
          f"delta={[round(float(x), 4) for x in delta]} gap={gap:.4g} seed={seed}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    torch.set_num_threads(4)
    torch.use_deterministic_algorithms(True, warn_only=True)
    if os.path.isdir(args.out):
        shutil.rmtree(args.out)
    os.makedirs(args.out)
    print(f"torch {torch.__version__} transformers {transformers.__version__}")
    failed = []
    for c in CASES:
        try:
            run_case(c, args.out)
        except Exception:  # noqa: BLE001 - keep going so one bad case costs no other
            import traceback
            traceback.print_exc()
            failed.append(c["name"])
    if failed:
        print("FAILED cases: " + ", ".join(failed))
        sys.exit(1)


if __name__ == "__main__":
    main()
