#!/usr/bin/env bash
# e2e: `moetrain fwdbwd` on the moe_untied transformers fixture (its two documents, without the
# fixture's extra masked label) writes loss, logits and every gradient; checked here for names,
# shapes, per-expert naming, the loss against an independent log-softmax of the written logits,
# and bad input failing with a message. Usage: fwdbwd.sh path/to/moetrain
set -euo pipefail
MT="$1"
FIX="tests/reference/fixtures/model/moe_untied"
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT

# The fixture's documents, read from its reference file (python3 standard library only).
IDS=$(python3 - "$FIX/reference.safetensors" <<'PY'
import json, struct, sys
b = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", b[:8])[0]; h = json.loads(b[8:8 + n]); base = 8 + n
def get(name, fmt):
    e = h[name]; s, t = e["data_offsets"]
    return list(struct.unpack("<%d%s" % ((t - s) // 4, fmt), b[base + s:base + t]))
ids, cu = get("input_ids", "i"), get("cu_seqlens", "i")
print(" | ".join(" ".join(str(x) for x in ids[cu[d]:cu[d + 1]]) for d in range(len(cu) - 1)))
PY
)
"$MT" fwdbwd --model "$FIX" --ids "$IDS" --output "$TMP/out.safetensors"
printf '%s\n' "${IDS// | /$'\n'}" > "$TMP/ids.txt"
"$MT" fwdbwd --model "$FIX" --tokens "$TMP/ids.txt" --output "$TMP/pe.safetensors" --expert-layout per-expert --no-logits

python3 - "$TMP/out.safetensors" "$TMP/pe.safetensors" <<'PY'
import json, math, struct, sys
def load(p):
    b = open(p, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]; h = json.loads(b[8:8 + n]); base = 8 + n
    meta = h.pop("__metadata__", {})
    out = {}
    for k, e in h.items():
        s, t = e["data_offsets"]; fmt = {"F32": "f", "I32": "i"}[e["dtype"]]
        out[k] = (e["shape"], struct.unpack("<%d%s" % ((t - s) // 4, fmt), b[base + s:base + t]))
    return out, meta
o, meta = load(sys.argv[1])
pe, _ = load(sys.argv[2])
assert meta["expert_layout"] == "fused", meta
(T, V), logits = o["logits"]
labels = o["labels"][1]
ce, n = 0.0, 0
for t in range(T):
    if labels[t] == -100: continue
    row = logits[t * V:(t + 1) * V]; m = max(row)
    ce += m + math.log(sum(math.exp(x - m) for x in row)) - row[labels[t]]; n += 1
ce /= n
assert abs(ce - o["ce_loss"][1][0]) < 1e-5 * ce, (ce, o["ce_loss"])
loss, aux = o["loss"][1][0], o["aux_loss"][1][0]
assert abs(loss - (ce + 0.05 * aux)) < 1e-5 * loss, (loss, ce, aux)
assert o["grad.model.layers.0.mlp.experts.gate_up_proj"][0] == [6, 48, 32]
assert "logits" not in pe and "grad.model.layers.1.mlp.experts.5.up_proj.weight" in pe
gu = o["grad.model.layers.1.mlp.experts.gate_up_proj"][1]
up5 = pe["grad.model.layers.1.mlp.experts.5.up_proj.weight"][1]
assert list(gu[5 * 48 * 32 + 24 * 32:6 * 48 * 32]) == list(up5)
n_grads = sum(1 for k in o if k.startswith("grad."))
assert n_grads == 25, n_grads  # 2 layers x 11 + embed, norm, lm_head
print("fwdbwd e2e ok: loss %.6f ce %.6f aux %.6f, %d gradients" % (loss, ce, aux, n_grads))
PY

# Bad input: a token id past the vocabulary, and a non-number.
if "$MT" fwdbwd --model "$FIX" --ids "1 2 500" --output "$TMP/bad.safetensors" 2> "$TMP/err"; then
  echo "expected failure for an out-of-vocabulary id"; exit 1
fi
grep -q "outside the vocabulary" "$TMP/err"
if "$MT" fwdbwd --model "$FIX" --ids "1 x 3" --output "$TMP/bad.safetensors" 2> "$TMP/err"; then
  echo "expected failure for a non-numeric id"; exit 1
fi
grep -q "is not a token id" "$TMP/err"
test ! -e "$TMP/bad.safetensors"
echo "fwdbwd e2e passed"
