"""From how many tokens the AVX2 quantized GEMM (native/src/quant_gemm_avx2.cpp) beats the AVX2 row tiles, per type:
`engine.native.quant_matmul` on one expert-sized matrix (768 x 2048: a Qwen3-30B-A3B gate), ISA avx2, run alternately
in child processes with TESSERA_AVX2_GEMM_MIN_T=65 (the GEMM never runs: the row path) and =2 (the GEMM from 2 tokens,
the smallest it takes: one token is decode and stays on the row path), median of the rounds, microseconds per call.

    python scripts/bench_avx2_gemm_threshold.py [--threads 2] [--tokens 2 3 4 6 8] [--rounds 3]

quant_kernels.h's avx2_gemm_min_tokens holds the per-type result (docs/BENCHMARKS.md, "AVX2 quantized prefill GEMM").
Prints figures only; nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

TYPES = ("Q4_0", "Q8_0", "Q4_K", "Q5_K", "Q6_K", "IQ4_XS")


def child(threads: int, tokens: list[int]) -> dict:
    """{type: {T: us per call}} in this process (its TESSERA_AVX2_GEMM_MIN_T picks the path)."""
    import numpy as np
    from gguf import GGMLQuantizationType as Q

    import tessera.engine.native as N
    from tessera.engine.quantize import quantize

    rng = np.random.default_rng(0)
    pool = N.make_pool(threads)
    result: dict = {}
    for name in TYPES:
        w = quantize(rng.standard_normal((768, 2048), dtype=np.float32) * 0.02, Q[name])  # [rows, row_bytes]
        result[name] = {}
        for T in tokens:
            x = rng.standard_normal((T, 2048)).astype(np.float32)
            out = np.empty((T, 768), np.float32)
            N.quant_matmul(Q[name], w, x, out, pool, "avx2")  # warm-up
            times = []
            for _ in range(15):
                t0 = time.perf_counter()
                for _ in range(5):
                    N.quant_matmul(Q[name], w, x, out, pool, "avx2")
                times.append((time.perf_counter() - t0) / 5 * 1e6)
            result[name][T] = statistics.median(times)
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokens", type=int, nargs="+", default=[2, 3, 4, 6, 8])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.threads, args.tokens)))
        return
    runs: dict = {"row": [], "gemm": []}
    for _ in range(args.rounds):
        for path, knob in (("row", "65"), ("gemm", "2")):
            cmd = [sys.executable, __file__, "--child", "--threads", str(args.threads), "--tokens",
                   *map(str, args.tokens)]
            env = dict(os.environ, TESSERA_AVX2_GEMM_MIN_T=knob)
            runs[path].append(json.loads(subprocess.run(cmd, env=env, capture_output=True, text=True,
                                                        check=True).stdout))
    print(f"quant_matmul 768 x 2048, avx2, {args.threads} threads, us per call (median of {args.rounds} rounds), "
          "row tiles / GEMM")
    for name in TYPES:
        cells = []
        for T in args.tokens:
            row = statistics.median(r[name][str(T)] for r in runs["row"])
            gemm = statistics.median(r[name][str(T)] for r in runs["gemm"])
            cells.append(f"T={T} {row:.0f}/{gemm:.0f}")
        print(f"{name:7s} " + "  ".join(cells))


if __name__ == "__main__":
    main()
