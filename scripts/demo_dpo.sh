#!/usr/bin/env bash
# The two-stage demo: SFT of the demo model on the dictionary chats (examples/demo.yaml, skipped
# when runs/demo/hf already exists), then DPO of its export on 500 dictionary preference pairs
# (examples/demo_dpo.yaml), printing the held-out preference accuracy and reward margin before and
# after. Extra arguments are overrides for the DPO stage, e.g. ./scripts/demo_dpo.sh training.train_iters=30
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${MT_BUILD_DIR:-build}/moetrain
[[ -x "$BIN" ]] || ./scripts/setup.sh
[[ -f data/examples/dict_pref.jsonl && -f data/examples/dict_sft.jsonl ]] || "$BIN" examples --output data/examples
if [[ ! -f runs/demo/hf/config.json ]]; then
  "$BIN" train examples/demo.yaml
fi
awk 'NR % 6 == 0' data/examples/dict_pref.jsonl > data/examples/dict_pref_demo.jsonl
"$BIN" train examples/demo_dpo.yaml "$@"
RUN=runs/demo_dpo
echo
python3 - "$RUN/metrics.jsonl" <<'PY'
import json, sys
v = [json.loads(l) for l in open(sys.argv[1]) if '"type":"valid"' in l]
for r in v:
    print(f"demo_dpo: step {r['step']:4d}  held-out accuracy {r['rewards/accuracy']:.3f}  margin {r['rewards/margins']:+.4f}"
          f"  chosen reward {r['rewards/chosen']:+.4f}  rejected reward {r['rewards/rejected']:+.4f}  ({r['pairs']} pairs)")
PY
echo "demo_dpo: run directory   $(pwd)/$RUN"
echo "demo_dpo: picture         $(pwd)/$RUN/training.svg (loss, accuracy, margins)"
echo "demo_dpo: metrics         $(pwd)/$RUN/metrics.jsonl (TensorBoard: $(pwd)/$RUN/tensorboard)"
echo "demo_dpo: HF export       $(pwd)/$RUN/hf"
