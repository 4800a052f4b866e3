#!/usr/bin/env bash
# prepare.sh (on the build machine): build test_backend with the CUDA backend and stage a slim
# bundle, gpu-bin/ = the binary + the non-system shared libraries it links (fmt, OpenBLAS,
# gfortran, libstdc++, ...), for a GPU machine that lacks our Debian libraries. CUDA runtime
# libraries (cudart, cuBLAS) are NOT bundled: the GPU machine's CUDA 13 provides them.
# Then run tests/gpu/run.sh (and tests/gpu/bench.sh) there. Env: BUILD_DIR (default build-gpu), SKIP_BUILD=1 to reuse it.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${BUILD_DIR:-$root/build-gpu}
case "$build" in /*) ;; *) build=$root/$build ;; esac
if [[ "${SKIP_BUILD:-0}" != 1 ]]; then
  cmake -S "$root" -B "$build" -G Ninja -DMT_CUDA=ON >/dev/null
  cmake --build "$build" --target test_backend kernel_bench -j2
fi
out=${GPU_BIN:-$root/gpu-bin}  # another folder keeps bundles of parallel work apart
case "$out" in /*) ;; *) out=$root/$out ;; esac
rm -rf "$out"
mkdir -p "$out/lib"
cp "$build/test_backend" "$build/kernel_bench" "$out/"  # kernel_bench: run by tests/gpu/bench.sh
strip --strip-debug "$out/test_backend" "$out/kernel_bench" 2>/dev/null || true
ldd "$build/test_backend" | awk '/=>/ {print $3}' | while read -r lib; do
  case "$lib" in
    */libc.so*|*/libm.so*|*/libdl.so*|*/libpthread.so*|*/librt.so*|*/ld-linux*|*/libcuda.so*) continue ;;
    */libcudart*|*/libcublas*|/usr/local/cuda*) continue ;;
  esac
  cp -L "$lib" "$out/lib/"
done
if [[ -d "$root/.git" ]]; then  # keep the bundle out of git status
  mkdir -p "$root/.git/info"
  name="$(basename "$out")/"
  grep -qsx "$name" "$root/.git/info/exclude" || echo "$name" >> "$root/.git/info/exclude"
fi
du -sh "$out"
ls "$out/lib"
