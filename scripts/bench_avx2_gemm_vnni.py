"""The AVX2 quantized prefill GEMM with and without AVX-VNNI (native/src/quant_gemm_avx_vnni.cpp against
quant_gemm_avx2.cpp's vpmaddubsw): `engine.native.quant_matmul` on ISA avx2, one matrix of ROWS x 2048 per type (8
Qwen3-30B-A3B gates: more than the caches hold, as an expert layer's weights are), the avx_vnni knob switched between
calls in one process, rounds interleaved, median GFLOP/s (2 T rows K per call). The GEMM runs from 2 tokens here
(avx2_gemm_min_tokens = 2) so both paths do the same work at every T.

    python scripts/bench_avx2_gemm_vnni.py [--threads 2] [--tokens 8 16 64] [--types Q4_K Q6_K Q8_0] [--rounds 3]

Needs a CPU with AVX-VNNI (Intel Core 12th generation on, or an AVX-512 CPU that also reports avx_vnni). Prints
figures only; nothing is asserted.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

ROWS, K = 768 * 8, 2048


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokens", type=int, nargs="+", default=[8, 16, 64])
    ap.add_argument("--types", nargs="+", default=["Q4_K", "Q6_K", "Q8_0"])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=0.3, help="timing per measurement")
    args = ap.parse_args()

    import numpy as np
    from gguf import GGMLQuantizationType as Q

    import tessera.engine.native as N
    from tessera.engine.quantize import quantize

    if not N.cpu_features()["flags"]["avx_vnni"]:
        print("this CPU has no AVX-VNNI: nothing to compare", file=sys.stderr)
        return 1
    pool = N.make_pool(args.threads)
    rng = np.random.default_rng(0)
    before = N.set_tuning_knob("avx2_gemm_min_tokens", 2), N.tuning()["avx_vnni"]
    print(f"quant_matmul {ROWS} x {K}, avx2, {args.threads} threads, GFLOP/s (median of {args.rounds} rounds): "
          "vpmaddubsw / AVX-VNNI")
    try:
        for name in args.types:
            w = quantize(rng.standard_normal((ROWS, K), dtype=np.float32) * 0.02, Q[name])  # [ROWS, row_bytes]
            cells = []
            for T in args.tokens:
                x = rng.standard_normal((T, K)).astype(np.float32)  # [T, K]
                out = np.empty((T, ROWS), np.float32)
                rates: dict[int, list[float]] = {0: [], 1: []}
                for r in range(args.rounds):
                    for v in ((0, 1) if r % 2 == 0 else (1, 0)):
                        N.set_tuning_knob("avx_vnni", v)
                        N.quant_matmul(Q[name], w, x, out, pool, "avx2")
                        t0, n = time.perf_counter(), 0
                        while time.perf_counter() - t0 < args.seconds:
                            N.quant_matmul(Q[name], w, x, out, pool, "avx2")
                            n += 1
                        rates[v].append(2 * T * ROWS * K * n / (time.perf_counter() - t0) / 1e9)
                cells.append(f"T={T} {statistics.median(rates[0]):.0f} / {statistics.median(rates[1]):.0f}")
            print(f"{name:7s} " + "  ".join(cells))
    finally:
        N.set_tuning_knob("avx2_gemm_min_tokens", before[0])
        N.set_tuning_knob("avx_vnni", before[1])
    return 0


if __name__ == "__main__":
    sys.exit(main())
