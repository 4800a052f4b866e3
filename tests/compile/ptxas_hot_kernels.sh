#!/usr/bin/env bash
# The Hopper kernels of the training step compile without register spills and without ptxas
# serializing their wgmma (its "(C7510..C7520) Potential Performance Loss" and "warpgroup.wait is
# injected" notes). Both leave the results right and only make the kernel slower, so no numeric
# test sees them; round 21 met each of them (docs/design/kernels.md, "Round 21"), and round 18 removed
# 316 bytes of spills from the RMSNorm backward at D 2048. Compiles the translation units of those
# kernels for sm_90a with `ptxas -v` and reads its report.
# Usage: ptxas_hot_kernels.sh <nvcc>   (registered in CMakeLists.txt when the CUDA backend is built)
set -euo pipefail
nvcc=${1:?usage: ptxas_hot_kernels.sh <nvcc>}
root=$(cd "$(dirname "$0")/../.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
flags=(-DFMT_SHARED -DMT_WITH_CUDA=1 -I"$root/src" -O3 -DNDEBUG -gencode=arch=compute_90a,code=sm_90a
       --expt-relaxed-constexpr -std=c++20 -x cu -Xptxas -v)
tus=(attention_flash.cu grouped_gemm_ws.cu grouped_matmul_adamw.cu rmsnorm.cu)
pids=()
for tu in "${tus[@]}"; do
  "$nvcc" "${flags[@]}" -c "$root/src/kernels/cuda/$tu" -o "$tmp/$tu.o" > "$tmp/$tu.log" 2>&1 &
  pids+=($!)
done
for i in "${!tus[@]}"; do
  if ! wait "${pids[$i]}"; then
    echo "ptxas_hot_kernels: compiling ${tus[$i]} failed:" >&2
    cat "$tmp/${tus[$i]}.log" >&2
    exit 1
  fi
done
# Spills are allowed only in these entries (mangled-name patterns): kernels off the Hopper step's
# default path (the sm80 attention backward, the 4-deep walk of a benchmark variant), the 2-stage attention
# forward (12 bytes; the default ring depth since round 29, measured faster than the 3-stage one without
# spills), the fused attention backward at head dim 128 (4 bytes since round 38's second dQ staging
# tile, measured 143 us a layer faster than without it), the bf16 dW kernel without the fused update
# (16 bytes, known since round 18; not its box-ring variant, the default without sums of squares since
# round 50, which has none), its tall 256 x 192
# benchmark variant (32 bytes; MT_DW_TALL, round 48) and the RMSNorm forward at D 512 and 1024 (8-12
# bytes; D 2048, the MoE models' width, has none).
allow='attn_dkdv_mma_kernel|attn_fwd_ws_kernelILi128ELi2E|attn_bwd_ws_kernelILi128E|AdamWEpilogueItttLi4E|gmm_ws_dw_kernelILi(256|192)E13__nv_bfloat16Li(64|32)ENS1_13StoreEpilogueELi(128|256)ELb0E|rmsnorm_fwd_vec_kernelILi(16|32)E'
status=0
for tu in "${tus[@]}"; do
  log=$tmp/$tu.log
  entries=$(grep -c "Compiling entry function" "$log" || true)
  if [[ "$entries" -lt 5 ]]; then
    echo "ptxas_hot_kernels: $tu: only $entries entries in the ptxas report (expected the sm_90a kernels)" >&2
    status=1
  fi
  if grep -E "\(C75[0-9][0-9]\)" "$log" > "$tmp/serial.txt"; then
    echo "ptxas_hot_kernels: $tu: ptxas serializes wgmma or injects waits:" >&2
    cat "$tmp/serial.txt" >&2
    status=1
  fi
  awk -v allow="$allow" -v tu="$tu" '
    /Compiling entry function/ { fn = $0; sub(/.*function .\047?/, "", fn); sub(/\047 for.*/, "", fn) }
    / bytes spill stores/ {
      n = $0; sub(/.*frame, /, "", n); sub(/ bytes spill stores.*/, "", n)
      if (n + 0 > 0 && fn !~ allow) { printf "ptxas_hot_kernels: %s: %s spills (%s)\n", tu, fn, $0; bad = 1 }
    }
    END { exit bad }' "$log" >&2 || status=1
done
if [[ $status -eq 0 ]]; then
  echo "ptxas_hot_kernels: ${tus[*]}: no wgmma serialization, no spills outside the allowed entries"
fi
exit $status
