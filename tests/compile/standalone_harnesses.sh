#!/usr/bin/env bash
# The standalone GPU harnesses of bench/standalone/ still compile and link. They build the project's
# kernels (src/kernels/cuda/) against the stub headers of bench/standalone/gemm_stub/ instead of the
# project libraries, and only on a GPU machine, so nothing noticed when they rotted (the GEMM kernels
# began calling pdl.cuh's functions and env_int, which the stubs lacked; fixed in 50b531d, and this
# script fails on the tree before it). Builds each harness for sm_90a as its driver script (*_run.sh,
# gemm_ws_ab.sh, adamw_math_ab.sh) or, without one, its header's build line does, with the same flags
# (less -Xptxas -v, which only prints), and runs nothing. The drivers' optional A/B builds too:
# adamw_math_ab.sh's two patched adamw_math.h (made by its own python) and -DMT_DW_OLD, with today's
# dW headers standing in for the earlier snapshot. At most MT_STANDALONE_JOBS (default 2) compiles at
# once: CI has 2 cores and 24 GiB.
# Usage: standalone_harnesses.sh <nvcc>   (no GPU needed)
set -euo pipefail
nvcc=${1:?usage: standalone_harnesses.sh <nvcc>}
root=$(cd "$(dirname "$0")/../.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cd "$root"  # the driver scripts' paths are relative to the repository root
max=${MT_STANDALONE_JOBS:-2}
sa=bench/standalone
k=src/kernels/cuda
arch=-gencode=arch=compute_90a,code=sm_90a
flags=(-O3 -std=c++17 "$arch" -lineinfo -I"$sa/gemm_stub" -Isrc)

names=()
declare -A what
# job <name> <what it builds, for the failure message> <command...>: in the background, at most $max
# at once; output in $tmp/<name>.log, exit status in $tmp/<name>.rc.
job() {
  local name=$1
  what[$name]=$2
  shift 2
  while (( $(jobs -rp | wc -l) >= max )); do wait -n || true; done
  { "$@" > "$tmp/$name.log" 2>&1 && echo 0 || echo 1; } > "$tmp/$name.rc" &
  names+=("$name")
}
failed=()
# finish: waits for every job and names the failed ones with their logs.
finish() {
  wait
  local n
  for n in "${names[@]}"; do
    if [[ "$(cat "$tmp/$n.rc" 2>/dev/null)" != 0 ]]; then
      echo "standalone_harnesses: ${what[$n]} failed:" >&2
      cat "$tmp/$n.log" >&2
      failed+=("$n")
    fi
  done
  names=()
}
ok() { [[ "$(cat "$tmp/$1.rc" 2>/dev/null)" == 0 ]]; }

# adamw_math_ab.sh's variants of src/kernels/adamw_math.h (1: MUFU sqrt/div, 2: plus FMA contraction).
awk '/<<.EOF.$/ { f = 1; next } /^EOF$/ { f = 0 } f' "$sa/adamw_math_ab.sh" > "$tmp/adamw_math_patch.py"
for v in 1 2; do
  mkdir -p "$tmp/a$v/kernels"
  if ! python3 "$tmp/adamw_math_patch.py" "$v" src/kernels/adamw_math.h "$tmp/a$v/kernels/adamw_math.h" \
      > "$tmp/patch$v.log" 2>&1; then
    echo "standalone_harnesses: adamw_math_ab.sh: its patch of src/kernels/adamw_math.h (variant $v) failed:" >&2
    cat "$tmp/patch$v.log" >&2
    exit 1
  fi
done
# -DMT_DW_OLD builds (gemm_ws_dw_run.sh, gemm_ws_dw_adamw_run.sh): the snapshot renamed as they rename it.
mkdir -p "$tmp/old/kernels/cuda"
for f in grouped_gemm_ws_dw grouped_gemm_ws_dw_stage grouped_gemm_ws_dw_adamw; do
  sed -e 's/namespace moetrain::cuda::gwd\b/namespace moetrain::cuda::gwd_old/' \
      -e 's|kernels/cuda/grouped_gemm_ws_dw.cuh|kernels/cuda/grouped_gemm_ws_dw_old.cuh|' \
      -e 's|kernels/cuda/grouped_gemm_ws_dw_stage.cuh|kernels/cuda/grouped_gemm_ws_dw_stage_old.cuh|' \
      "$k/$f.cuh" > "$tmp/old/kernels/cuda/${f}_old.cuh"
done

# Compiles, longest first.
job dw_adamw "gemm_ws_dw_adamw_run.sh: $sa/gemm_ws_dw_adamw.cu" \
  "$nvcc" "${flags[@]}" "$sa/gemm_ws_dw_adamw.cu" -o "$tmp/gemm_ws_dw_adamw"
job dw_adamw_old "gemm_ws_dw_adamw_run.sh: $sa/gemm_ws_dw_adamw.cu with -DMT_DW_OLD" \
  "$nvcc" "${flags[@]}" -DMT_DW_OLD -I"$tmp/old" "$sa/gemm_ws_dw_adamw.cu" -o "$tmp/gemm_ws_dw_adamw_old"
for v in 1 2; do
  job approx$v "adamw_math_ab.sh: $sa/gemm_ws_dw_adamw.cu with adamw_math.h variant approx$v" \
    "$nvcc" -O3 -std=c++17 "$arch" -lineinfo -I"$sa/gemm_stub" -I"$tmp/a$v" -Isrc "$sa/gemm_ws_dw_adamw.cu" \
    -o "$tmp/approx$v"
done
job ws "gemm_ws_run.sh / gemm_ws_ab.sh / overlap_run.sh: compiling $k/grouped_gemm_ws.cu" \
  "$nvcc" "${flags[@]}" -c "$k/grouped_gemm_ws.cu" -o "$tmp/ws.o"
job wgmma "gemm_run.sh / gemm_ws_run.sh / gemm_ws_ab.sh / gemm_ws_dw_run.sh: compiling $k/grouped_gemm_wgmma.cu" \
  "$nvcc" "${flags[@]}" -c "$k/grouped_gemm_wgmma.cu" -o "$tmp/wgmma.o"
job attn "attn_run.sh: building attn_bench.so from $sa/attn_bench.cu" \
  "$nvcc" -O3 -std=c++17 "$arch" -lineinfo -Isrc -shared -Xcompiler -fPIC "$sa/attn_bench.cu" \
  -o "$tmp/attn_bench.so"
job dw "gemm_ws_dw_run.sh: compiling $sa/gemm_ws_dw.cu" \
  "$nvcc" "${flags[@]}" -c "$sa/gemm_ws_dw.cu" -o "$tmp/dw.o"
job dw_old "gemm_ws_dw_run.sh: compiling $sa/gemm_ws_dw.cu with -DMT_DW_OLD" \
  "$nvcc" "${flags[@]}" -DMT_DW_OLD -I"$tmp/old" -c "$sa/gemm_ws_dw.cu" -o "$tmp/dw_old.o"
job mma "gemm_run.sh: compiling $k/grouped_gemm_mma.cu" \
  "$nvcc" "${flags[@]}" -c "$k/grouped_gemm_mma.cu" -o "$tmp/mma.o"
job gemm_bench "gemm_run.sh: compiling $sa/gemm_bench.cu" \
  "$nvcc" "${flags[@]}" -c "$sa/gemm_bench.cu" -o "$tmp/gemm_bench.o"
job gemm_ws "gemm_ws_run.sh / gemm_ws_ab.sh: compiling $sa/gemm_ws.cu" \
  "$nvcc" "${flags[@]}" -c "$sa/gemm_ws.cu" -o "$tmp/gemm_ws.o"
job overlap "overlap_run.sh: compiling $sa/overlap.cu" \
  "$nvcc" "${flags[@]}" -c "$sa/overlap.cu" -o "$tmp/overlap.o"
job store_bw "store_bw_run.sh: $sa/store_bw.cu" \
  "$nvcc" -O3 -std=c++17 -arch=sm_90a -Isrc "$sa/store_bw.cu" -o "$tmp/store_bw"
# Harnesses without a driver script, as their header's build line says.
job adamw_multi "$sa/adamw_multi.cu (its header's build line)" \
  "$nvcc" -O3 -std=c++17 -arch=sm_90a -Isrc "$sa/adamw_multi.cu" -o "$tmp/adamw_multi"
job adamw_precision "$sa/adamw_precision.cu (its header's build line)" \
  "$nvcc" -O3 -std=c++17 -arch=sm_90a -lineinfo -Isrc "$sa/adamw_precision.cu" -o "$tmp/adamw_precision"
job gather "$sa/gather_bench.cu (its header's build line)" \
  "$nvcc" -O3 -std=c++17 "$arch" "$sa/gather_bench.cu" -o "$tmp/gather_bench"
job sweep "$sa/cublaslt_sweep.cu (its header's build line)" \
  "$nvcc" -O2 -std=c++17 -arch=sm_90a "$sa/cublaslt_sweep.cu" -lcublasLt -lcublas -o "$tmp/cublaslt_sweep"
job lmhead "$sa/lmhead_overlap.cu (its header's build line)" \
  "$nvcc" -O3 -std=c++17 -arch=sm_90a "$sa/lmhead_overlap.cu" -lcublas -o "$tmp/lmhead_overlap"
finish

# Links, as the driver scripts link (each only when its objects, <job name>.o, built).
link() {  # link <executable> <what> <compile jobs...> -- <more link arguments...>
  local name=$1 desc=$2 objs=()
  shift 2
  while [[ $1 != -- ]]; do objs+=("$tmp/$1"); ok "$1" || return 0; shift; done
  shift
  job "link_$name" "$desc" "$nvcc" "$arch" "${objs[@]/%/.o}" "$@" -o "$tmp/$name"
}
link gemm_bench_exe "gemm_run.sh: linking gemm_bench" gemm_bench mma wgmma --
link gemm_ws_exe "gemm_ws_run.sh / gemm_ws_ab.sh: linking gemm_ws" gemm_ws ws wgmma --
link gemm_ws_dw_exe "gemm_ws_dw_run.sh: linking gemm_ws_dw" dw wgmma -- -lcublasLt -lcublas
link gemm_ws_dw_old_exe "gemm_ws_dw_run.sh: linking gemm_ws_dw with -DMT_DW_OLD" dw_old wgmma -- -lcublasLt -lcublas
link overlap_exe "overlap_run.sh: linking overlap" overlap ws --
finish
# attn_bench.py opens the library with ctypes: every symbol must resolve, and its entry points be there.
if ok attn; then
  so=$tmp/attn_bench.so
  if ldd -r "$so" 2>&1 | grep -i "undefined symbol" > "$tmp/attn_undef.txt"; then
    echo "standalone_harnesses: attn_run.sh: attn_bench.so has undefined symbols:" >&2
    c++filt < "$tmp/attn_undef.txt" >&2
    failed+=(attn_undefined)
  fi
  for s in attn_fwd attn_bwd attn_bwd_workspace attn_set_knobs; do
    if ! nm -D --defined-only "$so" | grep -q " T $s\$"; then
      echo "standalone_harnesses: attn_run.sh: attn_bench.so lacks $s (attn_bench.py calls it)" >&2
      failed+=(attn_$s)
    fi
  done
fi
if (( ${#failed[@]} )); then
  echo "standalone_harnesses: ${#failed[@]} build step(s) failed: ${failed[*]}" >&2
  exit 1
fi
echo "standalone_harnesses: every harness of $sa compiles and links for sm_90a (drivers' A/B builds included)"
