#!/usr/bin/env bash
# The main job on its built-in default: set up, build the example datasets from Debian packages,
# then SFT a small Qwen3-MoE (demo-moe: 4 layers, 8 experts, top-2) with the real Qwen3 tokenizer
# on English->German dictionary chats (GPU when visible, else CPU), export it, and print where
# everything went. Extra arguments are passed to `moetrain train` as overrides, e.g.
#   ./scripts/demo.sh training.train_iters=50
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
BIN=${MT_BUILD_DIR:-build}/moetrain
"$BIN" examples --output data/examples
"$BIN" train examples/demo.yaml "$@"
RUN=runs/demo
echo
echo "demo: run directory   $(pwd)/$RUN"
echo "demo: loss picture    $(pwd)/$RUN/training.svg"
echo "demo: metrics         $(pwd)/$RUN/metrics.jsonl (TensorBoard: $(pwd)/$RUN/tensorboard)"
echo "demo: HF export       $(pwd)/$RUN/hf"
