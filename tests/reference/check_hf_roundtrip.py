#!/usr/bin/env python3
# Hugging Face round trip on the GPU machine (needs torch + transformers + safetensors): the same
# token ids through `moetrain fwdbwd` (CPU, fp32) and transformers' AutoModelForCausalLM (fp32,
# TF32 off), logits compared per document. Cases: a given model directory (e.g. a training run's
# export); moetrain init -> moetrain export -> transformers; and a random Qwen3-MoE saved by
# transformers' save_pretrained plus the other expert layout written here with safetensors.
# Usage: check_hf_roundtrip.py --moetrain BIN --work DIR [--model DIR ...] [--saved] [--init PRESET]
# Prints one line per case and exits 1 if any case fails.
import argparse
import json
import os
import re
import shutil
import subprocess
import sys

import torch
import transformers
from safetensors import safe_open
from safetensors.torch import save_file, load_file

TOL = 1e-3  # max |dlogit| / max |logit|: both sides compute in fp32 from the same bf16/f32 weights


def hf_logits(model_dir, docs, device):
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    for setter in ("set_attn_implementation", "set_experts_implementation"):
        if hasattr(model, setter):
            try:
                getattr(model, setter)("eager")
            except Exception as e:  # noqa: BLE001 - the comparison below catches real faults
                print(f"note: {setter}: {e}", file=sys.stderr)
    model = model.to(device).eval()
    out = []
    with torch.no_grad():
        for d in docs:
            ids = torch.tensor([d], dtype=torch.long, device=device)
            out.append(model(input_ids=ids).logits[0].float().cpu())
    return torch.cat(out)


def mt_logits(moetrain, model_dir, docs, out_file):
    ids = " | ".join(" ".join(str(t) for t in d) for d in docs)
    r = subprocess.run([moetrain, "fwdbwd", "--model", model_dir, "--ids", ids, "--output", out_file],
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"moetrain fwdbwd failed on {model_dir}:\n{r.stdout}\n{r.stderr}")
    return load_file(out_file)["logits"].float()


def compare(name, moetrain, model_dir, work, device, seed=7, lens=(37, 20), ref_dir=None):
    cfg = json.load(open(os.path.join(model_dir, "config.json")))
    g = torch.Generator().manual_seed(seed)
    docs = [torch.randint(3, cfg["vocab_size"], (n,), generator=g).tolist() for n in lens]
    ref = hf_logits(ref_dir or model_dir, docs, device)  # ref_dir: same weights, layout HF reads
    got = mt_logits(moetrain, model_dir, docs, os.path.join(work, name + ".fwdbwd.safetensors"))
    ok_shape = tuple(ref.shape) == tuple(got.shape)
    err = ((got - ref).abs().max() / ref.abs().max().clamp_min(1e-12)).item() if ok_shape else float("inf")
    agree = (got.argmax(-1) == ref.argmax(-1)).float().mean().item() if ok_shape else 0.0
    ok = ok_shape and err < TOL and agree > 0.99
    print(f"roundtrip {name:<34} T={sum(lens):<4} V={cfg['vocab_size']:<7} norm.err {err:.2e} "
          f"argmax.agree {agree:.3f} {'ok' if ok else 'FAIL'}", flush=True)
    return ok


def expert_names(model_dir):
    names = []
    for f in sorted(os.listdir(model_dir)):
        if f.endswith(".safetensors"):
            with safe_open(os.path.join(model_dir, f), "pt") as s:
                names += list(s.keys())
    return names


def load_all(model_dir):
    t = {}
    for f in sorted(os.listdir(model_dir)):
        if f.endswith(".safetensors"):
            t.update(load_file(os.path.join(model_dir, f)))
    return t


def write_other_layout(src, dst):
    """Writes src's weights in the other expert layout: per-expert <-> fused
    (mlp.experts.gate_up_proj [E,2I,H] = gate rows then up rows, mlp.experts.down_proj [E,H,I])."""
    t = load_all(src)
    per = re.compile(r"^(model\.layers\.\d+\.mlp\.experts)\.(\d+)\.(gate|up|down)_proj\.weight$")
    out, groups = {}, {}
    fused_in = any(k.endswith("mlp.experts.gate_up_proj") for k in t)
    for k, v in t.items():
        m = per.match(k)
        if m:
            groups.setdefault(m.group(1), {})[(int(m.group(2)), m.group(3))] = v
        elif fused_in and (k.endswith("mlp.experts.gate_up_proj") or k.endswith("mlp.experts.down_proj")):
            pre, kind = k.rsplit(".", 1)
            for e in range(v.shape[0]):
                if kind == "gate_up_proj":
                    gate, up = v[e].chunk(2, dim=0)
                    out[f"{pre}.{e}.gate_proj.weight"] = gate.contiguous()
                    out[f"{pre}.{e}.up_proj.weight"] = up.contiguous()
                else:
                    out[f"{pre}.{e}.down_proj.weight"] = v[e].contiguous()
        else:
            out[k] = v
    for pre, g in groups.items():
        E = 1 + max(e for e, _ in g)
        out[pre + ".gate_up_proj"] = torch.stack([torch.cat([g[(e, "gate")], g[(e, "up")]], 0) for e in range(E)])
        out[pre + ".down_proj"] = torch.stack([g[(e, "down")] for e in range(E)])
    os.makedirs(dst, exist_ok=True)
    for f in os.listdir(src):
        if f.endswith(".json") and "index" not in f:
            shutil.copy(os.path.join(src, f), dst)
    save_file({k: v.contiguous() for k, v in out.items()}, os.path.join(dst, "model.safetensors"),
              metadata={"format": "pt"})
    return "fused" if groups else "per-expert"


def saved_model(work):
    kw = dict(vocab_size=320, hidden_size=64, intermediate_size=96, moe_intermediate_size=32,
              num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
              num_experts=6, num_experts_per_tok=2, norm_topk_prob=True, tie_word_embeddings=False,
              max_position_embeddings=512, rms_norm_eps=1e-6, router_aux_loss_coef=0.001)
    cfg = transformers.Qwen3MoeConfig(**kw)
    torch.manual_seed(3)
    model = transformers.Qwen3MoeForCausalLM(cfg)
    with torch.no_grad():  # O(1) activations and decisive routing
        for n, p in model.named_parameters():
            if n.endswith("mlp.gate.weight"):
                p.normal_(0, 0.5)
            elif not n.endswith("norm.weight"):
                p.normal_(0, 1.0 / p.shape[-1] ** 0.5)
    d = os.path.join(work, "hf_saved")
    shutil.rmtree(d, ignore_errors=True)
    model.save_pretrained(d)
    return d


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--moetrain", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--model", action="append", default=[], help="model directory to check (repeatable)")
    ap.add_argument("--init", default="", help="preset for moetrain init -> export -> transformers")
    ap.add_argument("--saved", action="store_true", help="transformers save_pretrained -> moetrain (both layouts)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    a = ap.parse_args()
    os.makedirs(a.work, exist_ok=True)
    print(f"torch {torch.__version__} transformers {transformers.__version__} device {a.device}", flush=True)
    results = []

    def run(name, fn):
        try:
            results.append(fn())
        except Exception as e:  # noqa: BLE001 - report and continue with the other cases
            print(f"roundtrip {name:<34} ERROR {type(e).__name__}: {str(e)[:800]}", flush=True)
            results.append(False)

    for i, m in enumerate(a.model):
        run(f"model{i}:{os.path.basename(os.path.normpath(os.path.dirname(m)))}",
            lambda m=m, i=i: compare(f"model{i}:{os.path.basename(os.path.normpath(os.path.dirname(m)))}",
                                     a.moetrain, m, a.work, a.device))
    if a.init:
        def init_case():
            d0, d1 = os.path.join(a.work, "init_fused"), os.path.join(a.work, "init_export")
            for cmd in ([a.moetrain, "init", "--preset", a.init, "--expert-layout", "fused", "--dtype", "f32",
                         "--output", d0, "--overwrite"],
                        [a.moetrain, "export", "--input", d0, "--output", d1, "--overwrite"]):
                r = subprocess.run(cmd, capture_output=True, text=True)
                if r.returncode != 0:
                    raise RuntimeError(" ".join(cmd) + "\n" + r.stderr)
            return compare(f"init({a.init})->export->hf", a.moetrain, d1, a.work, a.device)
        run("init", init_case)
    if a.saved:
        d = None

        def saved_case():
            nonlocal d
            d = saved_model(a.work)
            names = expert_names(d)
            lay = "fused" if any(n.endswith("gate_up_proj") for n in names) else "per-expert"
            print(f"note: save_pretrained wrote the {lay} expert layout, e.g. "
                  f"{[n for n in names if 'experts' in n][:2]}", flush=True)
            return compare(f"hf_saved({lay})->moetrain", a.moetrain, d, a.work, a.device)
        run("hf_saved", saved_case)

        def other_case():
            d2 = os.path.join(a.work, "hf_saved_other")
            lay = write_other_layout(d, d2)
            return compare(f"hf_saved->{lay}->moetrain", a.moetrain, d2, a.work, a.device, ref_dir=d)
        run("hf_saved_other", other_case)
    print(f"roundtrip summary: {sum(results)}/{len(results)} ok", flush=True)
    sys.exit(0 if all(results) else 1)


if __name__ == "__main__":
    main()
