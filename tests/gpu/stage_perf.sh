#!/usr/bin/env bash
# stage_perf.sh (on the build machine): stages the bundle tests/gpu/perf.sh runs from, GPU_BIN
# (default gpu-bin-perf/, kept out of git): the CUDA build's moetrain, the non-system shared
# libraries it links, and ../shared/bench/torch_anchor.py (a reference script, not our code),
# packed as bundle.tar.xz. bench/torch_kernels.py and tests/gpu/perf_table.py travel with the tree.
# Env: BUILD_DIR (default build-gpu; must hold a CUDA moetrain).
# Build first: cmake -S . -B build-gpu -G Ninja -DMT_CUDA=ON && cmake --build build-gpu --target moetrain
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${BUILD_DIR:-$root/build-gpu}
case "$build" in /*) ;; *) build=$root/$build ;; esac
out=${GPU_BIN:-$root/gpu-bin-perf}
case "$out" in /*) ;; *) out=$root/$out ;; esac
[[ -x "$build/moetrain" ]] || { echo "stage_perf.sh: no $build/moetrain (build it with -DMT_CUDA=ON first)"; exit 1; }
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/lib"
cp "$build/moetrain" "$stage/"
strip --strip-debug "$stage/moetrain" 2>/dev/null || true
ldd "$build/moetrain" | awk '/=>/ {print $3}' | sort -u | while read -r lib; do
  case "$lib" in
    */libc.so*|*/libm.so*|*/libdl.so*|*/libpthread.so*|*/librt.so*|*/ld-linux*|*/libcuda.so*) continue ;;
    */libcudart*|*/libcublas*|/usr/local/cuda*) continue ;;
  esac
  cp -L "$lib" "$stage/lib/"
done
cp "$root/../shared/bench/torch_anchor.py" "$stage/" 2>/dev/null || echo "note: no ../shared/bench/torch_anchor.py"
rm -rf "$out"; mkdir -p "$out"
tar -C "$stage" -cf - . | xz -T2 -6 > "$out/bundle.tar.xz"
if [[ -d "$root/.git" ]]; then  # keep the bundle out of git status
  mkdir -p "$root/.git/info"
  name="$(basename "$out")/"
  grep -qsx "$name" "$root/.git/info/exclude" || echo "$name" >> "$root/.git/info/exclude"
fi
du -sh "$out/bundle.tar.xz"
