"""The dense mat-vec alone on Qwen3-30B-A3B's non-expert shapes: native bf16 x f32 (weights as stored) vs torch on a
resident f32 copy (the old path), in ms per call, weight GB/s and % of the measured read bandwidth.

    python scripts/bench_dense.py [--threads 2] [--tokens 1 4 128] [--json]

Random bf16 weights; each figure is the best of several calls after a warm-up (weights larger than the caches stream
from memory on every call). Prints figures only; nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from tessera.engine import native

# name -> (out, in): Qwen3-30B-A3B (H 2048, 32 query heads, 4 kv heads, head_dim 128, 128 experts, V 151,936).
SHAPES = {
    "q_proj": (4096, 2048),
    "k_proj": (512, 2048),
    "o_proj": (2048, 4096),
    "router": (128, 2048),
    "lm_head": (151936, 2048),
}


def best_ms(fn, min_reps: int, budget_s: float = 1.5, max_reps: int = 50) -> float:
    """Best wall time of `fn` in ms after one warm-up: at least `min_reps` runs, more while under `budget_s` seconds
    (at most `max_reps`). scripts/bench_quant_dense.py times with it too."""
    fn()  # warm-up
    best, spent, n = float("inf"), 0.0, 0
    while n < min_reps or (spent < budget_s and n < max_reps):
        t = time.perf_counter()
        fn()
        dt = time.perf_counter() - t
        best, spent, n = min(best, dt), spent + dt, n + 1
    return best * 1e3


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=None, help="threads (default: physical cores)")
    p.add_argument("--tokens", type=int, nargs="+", default=[1, 4], help="T values (default 1 4)")
    p.add_argument("--no-torch", action="store_true", help="skip the torch f32 baseline")
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    threads = a.threads or native.physical_cores()
    torch.set_num_threads(threads)
    pool = native.make_pool(threads)
    bandwidth = native.read_bandwidth(threads, seconds=1.0)
    rows = []
    for name, (n, k) in SHAPES.items():
        w = (torch.randn(n, k) * 0.02).to(torch.bfloat16)  # [N, K]
        w32 = None if a.no_torch else w.float()  # [N, K] the old resident copy
        for T in a.tokens:
            x = torch.randn(T, k)  # [T, K]
            out = torch.empty(T, n)  # [T, N]
            reps = 3 if n * k > 50_000_000 else 10
            ms = best_ms(lambda w=w, x=x, out=out: native.dense_matvec(w, x, out, pool), reps)
            gbs = n * k * 2 / ms / 1e6
            row = dict(name=name, out=n, inp=k, T=T, native_ms=ms, native_gbs=gbs, pct_bandwidth=100 * gbs / bandwidth)
            if w32 is not None:
                row["torch_f32_ms"] = best_ms(lambda x=x, w32=w32: x @ w32.T, reps)
            rows.append(row)
        del w, w32
    result = dict(threads=threads, kernel=native.dense_kernel(), read_bandwidth_gbs=bandwidth, rows=rows)
    if a.json:
        print(json.dumps(result))
        return 0
    print(f"kernel {result['kernel']}, {threads} threads, read bandwidth {bandwidth:.1f} GB/s")
    print(f"{'matrix':<8} {'shape':>13} {'T':>4} {'native ms':>10} {'GB/s':>6} {'% bw':>5} {'torch f32 ms':>13}")
    for r in rows:
        torch_ms = f"{r['torch_f32_ms']:.3f}" if "torch_f32_ms" in r else "-"
        print(f"{r['name']:<8} {r['out']:>6}x{r['inp']:<6} {r['T']:>4} {r['native_ms']:>10.3f} {r['native_gbs']:>6.1f} "
              f"{r['pct_bandwidth']:>5.0f} {torch_ms:>13}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
