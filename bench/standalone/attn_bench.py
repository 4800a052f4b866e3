#!/usr/bin/env python3
# Checks and times the fast attention kernels (attn_bench.so, built from attn_bench.cu) on the GPU:
# correctness of the sm80 and sm90 (warp-specialized) paths against torch fp64 math per document (out,
# lse, dq, dk, dv; one document, packed documents, odd T, d 64), bitwise determinism of the backward,
# with --ref-lib bitwise equality with a reference build (e.g. of the last commit), and CUDA-event
# timings (median of --reps after warm-up) next to torch flash sdpa (causal, GQA via enable_gqa).
# Driver: attn_run.sh.
import argparse
import ctypes
import math
import statistics
import sys

import torch
import torch.nn.functional as F

LIB = None
REF = None


def vp(t):
    return ctypes.c_void_p(t.data_ptr())


def stream():
    return ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)


class Lib:
    """An attn_bench.so. Builds from before 2026-11-22's removal of the cp.async sm90 kernels (commit
    7dd2f58 and older) have another knob API (attn_knobs / attn_knobs_ws, a key tile in attn_fwd)."""

    def __init__(self, path):
        self.so = ctypes.CDLL(path)
        self.legacy = not hasattr(self.so, "attn_set_knobs")
        L, I, P = ctypes.c_long, ctypes.c_int, ctypes.c_void_p
        fwd_head = [I, I] if self.legacy else [I]
        self.so.attn_fwd.argtypes = fwd_head + [P] * 4 + [L] * 4 + [I, ctypes.c_float, P, P, P]
        self.so.attn_bwd_workspace.restype = L
        self.so.attn_bwd_workspace.argtypes = [I, L, L, L, L, I]
        self.so.attn_bwd.argtypes = [I] + [P] * 4 + [L] * 4 + [I, ctypes.c_float] + [P] * 7 + [I, I, P]
        if self.legacy:
            self.so.attn_knobs.argtypes = [I] * 4
            self.so.attn_knobs_ws.argtypes = [I] * 4
        else:
            self.so.attn_set_knobs.argtypes = [I] * 3

    def knobs(self, stages, ctas, desc):
        """ws forward ring depth, backward CTAs per SM, descending deterministic order."""
        if self.legacy:
            self.so.attn_knobs(128, 128, ctas, 1)
            self.so.attn_knobs_ws(1, stages, 1, desc)
        else:
            self.so.attn_set_knobs(stages, ctas, desc)

    def fwd(self, arch, q, k, v, cu, scale, out, lse):
        T, nh, d = q.shape
        head = (arch, 128) if self.legacy else (arch,)
        rc = self.so.attn_fwd(*head, vp(q), vp(k), vp(v), vp(cu), T, nh, k.shape[1], d, cu.numel() - 1,
                              ctypes.c_float(scale), vp(out), vp(lse), stream())
        assert rc == 0, f"attn_fwd rc {rc}"

    def workspace(self, arch, q, k):
        T, nh, d = q.shape
        sms = torch.cuda.get_device_properties(0).multi_processor_count
        return torch.empty(self.so.attn_bwd_workspace(arch, T, nh, k.shape[1], d, sms), device="cuda",
                           dtype=torch.uint8)

    def bwd(self, arch, q, k, v, cu, scale, out, lse, dout, ws, det, dq, dk, dv):
        T, nh, d = q.shape
        sms = torch.cuda.get_device_properties(0).multi_processor_count
        rc = self.so.attn_bwd(arch, vp(q), vp(k), vp(v), vp(cu), T, nh, k.shape[1], d, cu.numel() - 1,
                              ctypes.c_float(scale), vp(out), vp(lse), vp(dout), vp(dq), vp(dk), vp(dv), vp(ws),
                              sms, det, stream())
        assert rc == 0, f"attn_bwd rc {rc}"


def ours_fwd(arch, q, k, v, cu, scale, bufs=None, lib=None):
    """bufs = (out, lse) preallocated (timing); else fresh NaN-filled outputs (checks)."""
    T, nh, d = q.shape
    if bufs is None:
        out = torch.full_like(q, float("nan"))
        lse = torch.full((nh, T), float("nan"), device="cuda", dtype=torch.float32)
    else:
        out, lse = bufs
    (lib or LIB).fwd(arch, q, k, v, cu, scale, out, lse)
    return out, lse


def ours_bwd(arch, q, k, v, cu, scale, out, lse, dout, ws=None, det=1, bufs=None, lib=None):
    lib = lib or LIB
    if ws is None:
        ws = lib.workspace(arch, q, k)
    if bufs is None:
        dq = torch.full_like(q, float("nan"))
        dk = torch.full_like(k, float("nan"))
        dv = torch.full_like(v, float("nan"))
    else:
        dq, dk, dv = bufs
    lib.bwd(arch, q, k, v, cu, scale, out, lse, dout, ws, det, dq, dk, dv)
    return dq, dk, dv


def reference(q, k, v, cu, scale, dout):
    """fp64 attention per document: out, lse [nh, T], dq, dk, dv."""
    T, nh, d = q.shape
    nkv = k.shape[1]
    g = nh // nkv
    outs, lses, dqs, dks, dvs = [], [], [], [], []
    cl = cu.tolist()
    for a, b in zip(cl[:-1], cl[1:]):
        if b == a:
            continue
        qd = q[a:b].double().transpose(0, 1).requires_grad_(True)  # [nh, L, d]
        kd = k[a:b].double().transpose(0, 1).requires_grad_(True)
        vd = v[a:b].double().transpose(0, 1).requires_grad_(True)
        ke = kd.repeat_interleave(g, 0)
        ve = vd.repeat_interleave(g, 0)
        s = torch.matmul(qd, ke.transpose(1, 2)) * scale
        L = b - a
        mask = torch.ones(L, L, dtype=torch.bool, device="cuda").tril()
        s = s.masked_fill(~mask, float("-inf"))
        lse = torch.logsumexp(s, -1)
        o = torch.matmul(torch.softmax(s, -1), ve)
        o.backward(dout[a:b].double().transpose(0, 1))
        outs.append(o.detach().transpose(0, 1))
        lses.append(lse.detach())
        dqs.append(qd.grad.transpose(0, 1))
        dks.append(kd.grad.transpose(0, 1))
        dvs.append(vd.grad.transpose(0, 1))
    return torch.cat(outs), torch.cat(lses, 1), torch.cat(dqs), torch.cat(dks), torch.cat(dvs)


def rel(x, ref):
    """||x - ref|| / ||ref||, the norm of ref floored at an RMS of 1e-3: at T 1 the exact dq and dk
    are 0 and bf16 rounding leaves ~1e-6 there."""
    x = x.double()
    if not torch.isfinite(x).all():
        return float("inf")
    return ((x - ref).norm() / ref.norm().clamp_min(1e-3 * math.sqrt(ref.numel()))).item()


# (label, arch, deterministic, ws forward stages, backward CTAs/SM, descending det order)
CHECKS = (("sm80", 80, 1, 3, 12, 1), ("ws-det", 90, 1, 2, 2, 1), ("ws-det-c12-s3-asc", 90, 1, 3, 12, 0),
          ("ws-nondet", 90, 0, 3, 2, 1))


def check_case(name, T, nh, nkv, d, cu_list, log):
    torch.manual_seed(hash(name) % 1000)
    q = torch.randn(T, nh, d, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(T, nkv, d, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(T, nkv, d, device="cuda", dtype=torch.bfloat16)
    dout = torch.randn(T, nh, d, device="cuda", dtype=torch.bfloat16)
    cu = torch.tensor(cu_list, device="cuda", dtype=torch.int32)
    scale = 1.0 / math.sqrt(d)
    ro, rl, rdq, rdk, rdv = reference(q, k, v, cu, scale, dout)
    ok = True
    for label, arch, want_det, stages, ctas, desc in CHECKS:
        LIB.knobs(stages, ctas, desc)
        out, lse = ours_fwd(arch, q, k, v, cu, scale)
        dq, dk, dv = ours_bwd(arch, q, k, v, cu, scale, out, lse, dout, det=want_det)
        dq2, dk2, dv2 = ours_bwd(arch, q, k, v, cu, scale, out, lse, dout, det=want_det)
        det = torch.equal(dq, dq2) and torch.equal(dk, dk2) and torch.equal(dv, dv2)
        errs = dict(out=rel(out, ro), dq=rel(dq, rdq), dk=rel(dk, rdk), dv=rel(dv, rdv))
        lse_err = (lse.double() - rl).abs().max().item() if torch.isfinite(lse).all() else float("inf")
        good = all(e < 1e-2 for e in errs.values()) and lse_err < 1e-3 and (det or not want_det)
        same = ""
        if REF is not None:  # bits of out, lse, dq, dk, dv against the reference build (dq: det only)
            REF.knobs(stages, ctas, desc)
            rout, rlse = ours_fwd(arch, q, k, v, cu, scale, lib=REF)
            rdq_, rdk_, rdv_ = ours_bwd(arch, q, k, v, cu, scale, out, lse, dout, det=want_det, lib=REF)
            pairs = ((out, rout), (lse, rlse), (dq, rdq_) if want_det else None, (dk, rdk_), (dv, rdv_))
            bits = "".join("-" if p is None else "1" if torch.equal(*p) else "0" for p in pairs)
            same = f" ref_bits={bits}"
            good &= "0" not in bits
        ok &= good
        msg = (f"check {name:<24} {label:<17} sm{arch} c{ctas:<2} d{want_det} "
               + " ".join(f"{k_}={e:.2e}" for k_, e in errs.items())
               + f" lse_maxabs={lse_err:.1e} det={det}{same} {'PASS' if good else 'FAIL'}")
        print(msg, flush=True)
        log.write(msg + "\n")
    return ok


def median_ms(fn, reps):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b))
    return statistics.median(ts), min(ts), max(ts)


def bench(T, reps, log, rows, doc=None):
    nh, nkv, d = 32, 4, 128
    torch.manual_seed(T)
    q = torch.randn(T, nh, d, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(T, nkv, d, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(T, nkv, d, device="cuda", dtype=torch.bfloat16)
    dout = torch.randn(T, nh, d, device="cuda", dtype=torch.bfloat16)
    doc = doc or T
    cu = torch.arange(0, T + 1, doc, device="cuda", dtype=torch.int32)
    scale = 1.0 / math.sqrt(d)
    f = 4.0 * (T // doc) * (doc * (doc + 1) / 2) * d * nh
    tag = f"T{T} doc{doc}"
    libs = {"": LIB} if REF is None else {"": LIB, "ref ": REF}
    fb = (torch.empty_like(q), torch.empty(nh, T, device="cuda", dtype=torch.float32))
    # (arch, stages, library): ws s2 (the default since round 29) and the reference twice, interleaved,
    # for the spread; s3 once
    for arch, st, lk in ((80, 3, ""), (90, 3, ""), (90, 2, ""), (90, 2, "ref "), (90, 2, ""), (90, 2, "ref ")):
        if lk not in libs:
            continue
        lib = libs[lk]
        lib.knobs(st, 2, 1)
        tf = median_ms(lambda: ours_fwd(arch, q, k, v, cu, scale, fb, lib), reps)
        rows.append((f"{lk}fwd {'ws s' + str(st) if arch == 90 else 'sm80'} {tag}", tf, f))
    LIB.knobs(3, 2, 1)
    out, lse = ours_fwd(90, q, k, v, cu, scale)
    bb = (torch.empty_like(q), torch.empty_like(k), torch.empty_like(v))
    # (arch, CTAs/SM, deterministic, descending det order, library)
    for arch, ctas, det, desc, lk in ((80, 12, 1, 1, ""), (90, 2, 1, 1, ""), (90, 2, 1, 1, "ref "),
                                      (90, 2, 1, 0, ""), (90, 12, 1, 1, ""), (90, 2, 0, 1, ""), (90, 12, 0, 1, ""),
                                      (90, 2, 1, 1, ""), (90, 2, 1, 1, "ref ")):
        if lk not in libs:
            continue
        lib = libs[lk]
        lib.knobs(3, ctas, desc)
        ws = lib.workspace(arch, q, k)
        tb = median_ms(lambda: ours_bwd(arch, q, k, v, cu, scale, out, lse, dout, ws, det, bb, lib), reps)
        name = "sm80 det" if arch == 80 else f"ws c{ctas} {'det' if det else 'nondet'}{'' if desc else ' asc'}"
        rows.append((f"{lk}bwd {name} {tag}", tb, 2.5 * f))
    LIB.knobs(3, 2, 1)
    if T == 4096 and doc == T:
        for arch in (80, 90):
            ws = LIB.workspace(arch, q, k)
            try:
                from torch.profiler import ProfilerActivity, profile
                with profile(activities=[ProfilerActivity.CUDA]) as prof:
                    for _ in range(5):
                        ours_bwd(arch, q, k, v, cu, scale, out, lse, dout, ws)
                    torch.cuda.synchronize()
                for ev in prof.key_averages():
                    if "attn" in ev.key:
                        tot = getattr(ev, "device_time_total", 0) or getattr(ev, "cuda_time_total", 0)
                        line = f"profile sm{arch} {ev.key[:60]:<60} {tot / ev.count / 1e3:8.3f} ms"
                        print(line, flush=True)
                        log.write(line + "\n")
            except Exception as e:  # noqa: BLE001
                print(f"profile failed: {e}", flush=True)
    if doc == T:
        from torch.nn.attention import SDPBackend, sdpa_kernel
        qt = q.transpose(0, 1).unsqueeze(0).detach().requires_grad_(True)
        kt_ = k.transpose(0, 1).unsqueeze(0).detach().requires_grad_(True)
        vt = v.transpose(0, 1).unsqueeze(0).detach().requires_grad_(True)
        gt = dout.transpose(0, 1).unsqueeze(0)
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            fwd = lambda: F.scaled_dot_product_attention(qt, kt_, vt, is_causal=True, enable_gqa=True)  # noqa: E731
            with torch.no_grad():
                rows.append((f"torch flash fwd {tag}", median_ms(fwd, reps), f))
            o = fwd()
            tb = median_ms(lambda: torch.autograd.grad(o, (qt, kt_, vt), gt, retain_graph=True), reps)
            rows.append((f"torch flash bwd {tag}", tb, 2.5 * f))


def main():
    global LIB, REF
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", default="./attn_bench.so")
    ap.add_argument("--ref-lib", default="", help="reference build: outputs must be bitwise equal, timed beside")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--log", default="attn_bench.log")
    ap.add_argument("--skip-check", action="store_true")
    ap.add_argument("--skip-bench", action="store_true")
    ap.add_argument("--once", type=int, default=-1, help="profiling: one fwd + det bwd at T 4096 on arch N (80 / 90)")
    ap.add_argument("--sweep-ctas", default="", help="e.g. 1,2,3,12: time the ws det backward at each "
                    "bwd_ctas_per_sm knob (it sets the head splits), twice in turn, at T 4096 and 8192")
    args = ap.parse_args()
    LIB = Lib(args.lib)
    REF = Lib(args.ref_lib) if args.ref_lib else None
    if args.once >= 0:  # for ncu: one forward and one deterministic backward
        T, nh, nkv, d = 4096, 32, 4, 128
        q, dout = (torch.randn(T, nh, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        k, v = (torch.randn(T, nkv, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        cu = torch.tensor([0, T], device="cuda", dtype=torch.int32)
        out, lse = ours_fwd(args.once, q, k, v, cu, 1.0 / math.sqrt(d))
        ours_bwd(args.once, q, k, v, cu, 1.0 / math.sqrt(d), out, lse, dout)
        torch.cuda.synchronize()
        return 0
    log = open(args.log, "w")
    if args.sweep_ctas:
        knobs = [int(c) for c in args.sweep_ctas.split(",")]
        nh, nkv, d = 32, 4, 128
        for T in (4096, 8192):
            torch.manual_seed(T)
            q, dout = (torch.randn(T, nh, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
            k, v = (torch.randn(T, nkv, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
            cu = torch.tensor([0, T], device="cuda", dtype=torch.int32)
            scale = 1.0 / math.sqrt(d)
            LIB.knobs(3, 12, 1)
            out, lse = ours_fwd(90, q, k, v, cu, scale)
            ref = ours_bwd(90, q, k, v, cu, scale, out, lse, dout)
            bb = tuple(torch.empty_like(t) for t in (q, k, v))
            f = 2.5 * 4.0 * (T * (T + 1) / 2) * d * nh
            for rnd in range(2):
                for c in knobs:
                    LIB.knobs(3, c, 1)
                    ws = LIB.workspace(90, q, k)
                    md, mn, mx = median_ms(lambda: ours_bwd(90, q, k, v, cu, scale, out, lse, dout, ws, 1, bb), args.reps)
                    got = ours_bwd(90, q, k, v, cu, scale, out, lse, dout, ws, 1)
                    errs = max(rel(a, b) for a, b in zip(got, ref))
                    line = (f"sweep T{T} ctas/SM {c:<3} round {rnd}: {md:.3f} ms (min {mn:.3f}, max {mx:.3f}) "
                            f"{f / (md * 1e-3) / 1e12:.0f} TFLOP/s, rel diff to c12 {errs:.1e}")
                    print(line, flush=True)
                    log.write(line + "\n")
        LIB.knobs(3, 2, 1)
        return 0
    print(torch.cuda.get_device_name(0), torch.__version__, f"ref: {args.ref_lib or '-'}", flush=True)
    ok = True
    if not args.skip_check:
        ok &= check_case("one doc T2048 g8 d128", 2048, 32, 4, 128, [0, 2048], log)
        ok &= check_case("packed T4096 g8 d128", 4096, 32, 4, 128, [0, 1, 1000, 1024, 3000, 4096], log)
        ok &= check_case("odd T1000 g4 d64", 1000, 8, 2, 64, [0, 300, 301, 1000], log)
        ok &= check_case("odd T777 g1 d128", 777, 4, 4, 128, [0, 777], log)
        ok &= check_case("docs of 64 T640 g2 d128", 640, 4, 2, 128, list(range(0, 641, 64)), log)
        ok &= check_case("T1 g8 d128", 1, 8, 1, 128, [0, 1], log)
        ok &= check_case("T5 g4 d64", 5, 8, 2, 64, [0, 2, 5], log)
        ok &= check_case("T200 docs g8 d128", 200, 16, 2, 128, [0, 3, 130, 131, 200], log)
    rows = []
    for T, doc in () if args.skip_bench else ((4096, None), (8192, None), (4096, 1024)):
        try:
            bench(T, args.reps, log, rows, doc)
        except Exception as e:  # noqa: BLE001
            print(f"bench T{T} failed: {type(e).__name__}: {e}", flush=True)
    print(f"\n{'case':<44} {'median ms':>10} {'min':>8} {'max':>8} {'TFLOP/s':>8}")
    for name, (md, mn, mx), f in rows:
        line = f"{name:<44} {md:10.3f} {mn:8.3f} {mx:8.3f} {f / (md * 1e-3) / 1e12:8.1f}"
        print(line)
        log.write(line + "\n")
    print("ALL CHECKS PASS" if ok else "SOME CHECKS FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
