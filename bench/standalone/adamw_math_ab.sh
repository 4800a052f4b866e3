#!/usr/bin/env bash
# What the bit-exact AdamW math costs the fused expert update (experiment, GPU machine, repo root).
# update8 (src/kernels/adamw_math.h) emulates IEEE sqrt.rn and div.rn with MUFU plus Newton steps and
# range tests, and keeps every op an explicit __f*_rn (no FMA contraction), so that the GPU's bits
# equal the CPU twin's. This builds the gemm_ws_dw_adamw harness three times: as committed (exact), with
# MUFU sqrt.approx / div.approx instead (approx1: other bits, no range tests, no redo path), and with
# that plus plain float operators that nvcc may contract into FMAs (approx2). The variants differ only
# by a copy of adamw_math.h put first on the include path; nothing in src/ changes. Then the harness's
# `skewloop` (the fused gate_up launch, all-bf16, stochastic rounding; even and the proxy's routing)
# runs for each build in turn, ROUNDS times. Logs in $OUT/adamw_ab/.
set -uo pipefail
OUT=${OUT:-/tmp/adamw_ab_out}/adamw_ab
B=/tmp/adamw_ab_build
mkdir -p "$OUT" "$B"
export PATH=/usr/local/cuda/bin:$PATH
FLAGS="-O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -lineinfo -Ibench/standalone/gemm_stub"
for v in 1 2; do
  mkdir -p "$B/a$v/kernels"
  python3 - "$v" src/kernels/adamw_math.h "$B/a$v/kernels/adamw_math.h" <<'EOF'
import sys
v, src, dst = int(sys.argv[1]), sys.argv[2], sys.argv[3]
s = open(src).read()
head = "__device__ __forceinline__ void update8(const Consts& c, const float (&grad)[8], float (&m)[8], float (&v)[8],\n                                        float (&w)[8]) {\n"
assert head in s, "update8's signature moved: update this script"
if v == 1:
    body = """  // experiment: MUFU square root and divide, every other op as committed
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const float g = mul(grad[j], c.grad_scale);
    m[j] = add(mul(c.b1, m[j]), mul(c.one_minus_b1, g));
    v[j] = add(mul(c.b2, v[j]), mul(mul(c.one_minus_b2, g), g));
    float s;
    asm("sqrt.approx.ftz.f32 %0, %1;" : "=f"(s) : "f"(v[j]));
    const float denom = add(mul(s, c.inv_sqrt_bc2), c.eps);
    float q;
    asm("div.approx.ftz.f32 %0, %1, %2;" : "=f"(q) : "f"(mul(m[j], c.inv_bc1)), "f"(denom));
    w[j] = sub(w[j], mul(c.lr, add(q, mul(c.wd, w[j]))));
  }
  return;
"""
else:
    body = """  // experiment: MUFU square root and divide, plain operators (FMA contraction allowed)
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const float g = grad[j] * c.grad_scale;
    m[j] = c.b1 * m[j] + c.one_minus_b1 * g;
    v[j] = c.b2 * v[j] + c.one_minus_b2 * g * g;
    float s;
    asm("sqrt.approx.ftz.f32 %0, %1;" : "=f"(s) : "f"(v[j]));
    const float denom = s * c.inv_sqrt_bc2 + c.eps;
    w[j] = w[j] - c.lr * (__fdividef(m[j] * c.inv_bc1, denom) + c.wd * w[j]);
  }
  return;
"""
s = s.replace(head, head + body, 1)
open(dst, "w").write(s)
EOF
done
nvcc $FLAGS -Isrc bench/standalone/gemm_ws_dw_adamw.cu -o $B/exact > "$OUT/build_exact.log" 2>&1 &
nvcc $FLAGS -I$B/a1 -Isrc -Xptxas -v bench/standalone/gemm_ws_dw_adamw.cu -o $B/approx1 > "$OUT/build_a1.log" 2>&1 &
nvcc $FLAGS -I$B/a2 -Isrc bench/standalone/gemm_ws_dw_adamw.cu -o $B/approx2 > "$OUT/build_a2.log" 2>&1 &
wait
for b in exact approx1 approx2; do [[ -x $B/$b ]] || { echo "build $b failed"; tail -20 "$OUT"/build_*.log; exit 1; }; done
for b in exact approx1 approx2; do
  cuobjdump --dump-sass $B/$b 2>/dev/null | awk '/Function : .*gmm_ws_dw_kernel/{f=1} /Function : /&&!/gmm_ws_dw_kernel/{f=0} f' > $B/$b.sass
  echo "$b: SASS lines of the dW kernels $(wc -l < $B/$b.sass), MUFU $(grep -c MUFU $B/$b.sass), FFMA $(grep -c FFMA $B/$b.sass), FMUL $(grep -c FMUL $B/$b.sass)"
done
nvidia-smi --query-gpu=name,clocks.sm,power.draw --format=csv,noheader
for r in $(seq 1 "${ROUNDS:-2}"); do
  for b in exact approx1 approx2; do
    timeout 60 $B/$b 20 skewloop > "$OUT/$b.r$r.log" 2>&1
    echo "round $r $b (rc $?):"
    grep -E "medians" "$OUT/$b.r$r.log" | sed -E 's/ +medians of 23 launches each \(3 warm-up\), in order://' | head -2
  done
done
