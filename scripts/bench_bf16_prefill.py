"""bf16 prefill kernels as a share of this machine's vdpbf16ps register peak: the dense GEMM (native.dense_gemm_bf16,
bf16 weights as stored) against the exact mat-vec and torch on Qwen3-30B-A3B's attention shapes, and the AVX512
expert backend's prefill on one 30B-A3B MoE layer, at several prompt lengths.

    python scripts/bench_bf16_prefill.py [--threads 2] [--part dense moe] [--tokens 16 128 512] \
        [--moe-tokens 128 512 2048 4096] [--json]

The peak is native.peak_gflops("bf16_dot") (probe_avx512_bf16.cpp: bf16_dot_loop_avx512, 24 independent zmm
accumulators per thread), probed before and after, the best kept. Dense figures are the best of several calls
(scripts/bench_dense.best_ms); MoE figures are the mean over a few forwards with fresh random routing each (weights
stream from memory: a 30B-A3B layer is 1.2 GB). With --threads 1 every figure also comes as GFLOP/s per second of
this thread's CPU time (time.thread_time: the whole kernel runs on the calling thread then), which a shared machine's
other processes do not shrink, against the one-thread peak. Prints figures only; nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(__file__))
from bench_dense import SHAPES, best_ms  # noqa: E402

from tessera.engine import native  # noqa: E402

MOE = dict(E=128, H=2048, I=768, k=8)  # Qwen3-30B-A3B


def best_cpu_ms(fn, reps: int) -> float:
    """Best thread CPU time of `fn` in ms over `reps` runs after a warm-up (meaningful with a one-thread pool)."""
    fn()
    best = float("inf")
    for _ in range(reps):
        t = time.thread_time()
        fn()
        best = min(best, time.thread_time() - t)
    return best * 1e3


def bench_dense(tokens, threads, pool, peak, torch_too):
    rows = []
    for name, (n, k) in SHAPES.items():
        if name == "lm_head":  # prefill computes the lm_head on the last token only
            continue
        w = (torch.randn(n, k) * 0.02).to(torch.bfloat16)  # [N, K]
        for T in tokens:
            x = torch.randn(T, k)  # [T, K]
            out = torch.empty(T, n)  # [T, N]
            flop = 2.0 * n * k * T
            gemm = best_ms(lambda w=w, x=x, out=out: native.dense_gemm_bf16(w, x, out, pool), 5)
            matvec = best_ms(lambda w=w, x=x, out=out: native.dense_matvec(w, x, out, pool), 3, budget_s=1.0)
            row = dict(name=name, out=n, inp=k, T=T, gemm_ms=gemm, gemm_gflops=flop / gemm / 1e6,
                       gemm_pct_peak=100 * flop / gemm / 1e6 / peak, matvec_ms=matvec)
            if threads == 1:
                row["gemm_cpu_gflops"] = flop / best_cpu_ms(lambda w=w, x=x, out=out: native.dense_gemm_bf16(
                    w, x, out, pool), 5) / 1e6
            if torch_too:
                # what beyond the mat-vec's cap ran before, and torch's own bf16 GEMM
                row["torch_upcast_ms"] = best_ms(lambda w=w, x=x: x @ w.float().T, 3, budget_s=1.0)
                xb = x.to(torch.bfloat16)
                row["torch_bf16_ms"] = best_ms(lambda w=w, xb=xb: xb @ w.T, 3, budget_s=1.0)
            rows.append(row)
    return rows


def bench_moe(tokens, threads, peak):
    from tessera.engine.experts import LayerExperts

    E, H, I, k = MOE["E"], MOE["H"], MOE["I"], MOE["k"]
    gen = torch.Generator().manual_seed(0)

    def weights(*shape):
        return (torch.randn(*shape, generator=gen) * shape[-1] ** -0.5).to(torch.bfloat16)

    layers = {0: LayerExperts(gate_proj=weights(E, I, H), up_proj=weights(E, I, H), down_proj=weights(E, H, I))}
    backend = native.make_backend("AVX512", layers, threads=threads)
    rows = []
    for T in tokens:
        x = torch.randn(T, H, generator=gen)
        w = torch.softmax(torch.randn(T, k, generator=gen), -1)

        def ids(T=T):
            return torch.argsort(torch.rand(T, E, generator=gen), dim=1)[:, :k].contiguous()

        backend.forward(0, x, ids(), w)  # warm-up
        n, spent, best, cpu = 0, 0.0, float("inf"), float("inf")
        while n < 2 or (n < 5 and spent < 3.0):
            i = ids()
            t0, c0 = time.perf_counter(), time.thread_time()
            backend.forward(0, x, i, w)
            dt = time.perf_counter() - t0
            n, spent, best, cpu = n + 1, spent + dt, min(best, dt), min(cpu, time.thread_time() - c0)
        flop = 2.0 * k * 3 * H * I * T
        row = dict(T=T, mean_ms=spent / n * 1e3, best_ms=best * 1e3, gflops=flop / (spent / n) / 1e9,
                   best_gflops=flop / best / 1e9, pct_peak=100 * flop / (spent / n) / 1e9 / peak,
                   best_pct_peak=100 * flop / best / 1e9 / peak)
        if threads == 1:
            row["cpu_gflops"] = flop / cpu / 1e9
        rows.append(row)
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=None, help="threads (default: physical cores)")
    p.add_argument("--part", nargs="+", choices=["dense", "moe"], default=["dense", "moe"])
    p.add_argument("--tokens", type=int, nargs="+", default=[16, 128, 512], help="dense T values")
    p.add_argument("--moe-tokens", type=int, nargs="+", default=[128, 512, 2048, 4096], help="MoE T values")
    p.add_argument("--no-torch", action="store_true", help="skip the torch baselines of the dense part")
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    if not native.dense_gemm_bf16_available():
        print("this CPU has no avx512_bf16: nothing to measure", file=sys.stderr)
        return 1
    threads = a.threads or native.physical_cores()
    torch.set_num_threads(threads)
    pool = native.make_pool(threads)
    peak0 = native.peak_gflops("bf16_dot", threads, seconds=0.5)
    result = dict(threads=threads, cpu=native.cpu_features().get("brand", "?"))
    if "dense" in a.part:
        result["dense"] = bench_dense(a.tokens, threads, pool, peak0, not a.no_torch)
    if "moe" in a.part:
        result["moe"] = bench_moe(a.moe_tokens, threads, peak0)
    peak = max(peak0, native.peak_gflops("bf16_dot", threads, seconds=0.5))
    for r in result.get("dense", []):
        r["gemm_pct_peak"] = 100 * r["gemm_gflops"] / peak
        if "gemm_cpu_gflops" in r:
            r["gemm_cpu_pct_peak"] = 100 * r["gemm_cpu_gflops"] / peak
    for r in result.get("moe", []):
        r["pct_peak"], r["best_pct_peak"] = 100 * r["gflops"] / peak, 100 * r["best_gflops"] / peak
        if "cpu_gflops" in r:
            r["cpu_pct_peak"] = 100 * r["cpu_gflops"] / peak
    result["peak_bf16_gflops"] = peak
    if a.json:
        print(json.dumps(result))
        return 0
    print(f"{result['cpu']}, {threads} threads, vdpbf16ps peak {peak:.0f} GFLOP/s (best of two probes)")
    if "dense" in result:
        print(f"{'matrix':<7} {'shape':>11} {'T':>4} {'gemm ms':>8} {'GFLOP/s':>8} {'% peak':>6} {'matvec ms':>9} "
              f"{'torch f32 upcast':>16} {'torch bf16':>10}")
        for r in result["dense"]:
            print(f"{r['name']:<7} {r['out']:>5}x{r['inp']:<5} {r['T']:>4} {r['gemm_ms']:>8.3f} "
                  f"{r['gemm_gflops']:>8.0f} {r['gemm_pct_peak']:>6.0f} {r['matvec_ms']:>9.3f} "
                  f"{r.get('torch_upcast_ms', float('nan')):>16.3f} "
                  f"{r.get('torch_bf16_ms', float('nan')):>10.3f}"
                  + (f"  | CPU time {r['gemm_cpu_gflops']:.0f} GFLOP/s ({r['gemm_cpu_pct_peak']:.0f} %)"
                     if "gemm_cpu_gflops" in r else ""))
    if "moe" in result:
        print("AVX512 expert backend, one 30B-A3B MoE layer (E 128, H 2048, I 768, k 8):")
        for r in result["moe"]:
            print(f"  T={r['T']:>5}: mean {r['mean_ms']:8.1f} ms {r['gflops']:6.0f} GFLOP/s "
                  f"({r['pct_peak']:3.0f} % of peak); "
                  f"best {r['best_ms']:8.1f} ms ({r['best_pct_peak']:3.0f} %)"
                  + (f" | CPU time {r['cpu_gflops']:.0f} GFLOP/s ({r['cpu_pct_peak']:.0f} %)"
                     if "cpu_gflops" in r else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
