"""The quantized prefill GEMM on AMX int8 tiles vs the AVX-512 VNNI register GEMM, one matrix per call:
`engine.native.quant_matmul(..., isa)` with isa amx_int8 and avx512_vnni, calls interleaved (VNNI, AMX, VNNI, ...),
median ms per call of each, and the speed-up.

    python scripts/bench_quant_amx.py [--threads 2] [--tokens 128 512] [--types Q4_K Q6_K] [--shapes expert_gate ...]
                                      [--rounds 9] [--json]

Shapes are Qwen3-30B-A3B's (H 2048, I 768 per expert, 32 query heads / 4 kv heads of 128): one expert's gate/up
[768, 2048] and down [2048, 768], q_proj [4096, 2048], k_proj [512, 2048], o_proj [2048, 4096]. Random weights
quantized by Tessera's own quantizer. Needs a CPU where quant_isas() lists amx_int8 as available. Prints figures only.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np
from gguf import GGMLQuantizationType as Q

from tessera.engine import native
from tessera.engine.quantize import quantize

SHAPES = {  # name -> (rows N, K)
    "expert_gate": (768, 2048),
    "expert_down": (2048, 768),
    "q_proj": (4096, 2048),
    "k_proj": (512, 2048),
    "o_proj": (2048, 4096),
}
ISAS = ("avx512_vnni", "amx_int8")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=None, help="threads (default: physical cores)")
    p.add_argument("--tokens", type=int, nargs="+", default=[128, 512], help="T values (default 128 512)")
    p.add_argument("--types", nargs="+", default=["Q4_K", "Q6_K"], help="GGML types (default Q4_K Q6_K)")
    p.add_argument("--shapes", nargs="+", default=["expert_gate", "expert_down"], choices=list(SHAPES))
    p.add_argument("--rounds", type=int, default=9, help="interleaved rounds per case; the median is printed")
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    avail = {i["name"] for i in native.quant_isas() if i["available"]}
    missing = [i for i in ISAS if i not in avail]
    if missing:
        raise SystemExit(f"this CPU does not run {', '.join(missing)} (quant_isas: {sorted(avail)})")
    threads = a.threads or native.physical_cores()
    pool = native.make_pool(threads)
    rng = np.random.default_rng(0)
    rows = []
    for tname in a.types:
        qtype = Q[tname.upper()]
        for name in a.shapes:
            n, k = SHAPES[name]
            w = quantize(rng.standard_normal((n, k), dtype=np.float32) * 0.02, qtype)  # [N, row bytes]
            for T in a.tokens:
                x = rng.standard_normal((T, k), dtype=np.float32)  # [T, K]
                out = np.empty((T, n), np.float32)  # [T, N]
                times: dict[str, list[float]] = {i: [] for i in ISAS}
                for isa in ISAS:  # warm-up
                    native.quant_matmul(qtype, w, x, out, pool, isa)
                for _ in range(a.rounds):
                    for isa in ISAS:
                        t0 = time.perf_counter()
                        native.quant_matmul(qtype, w, x, out, pool, isa)
                        times[isa].append((time.perf_counter() - t0) * 1e3)
                med = {i: statistics.median(v) for i, v in times.items()}
                rows.append(dict(type=qtype.name, name=name, out=n, inp=k, T=T, vnni_ms=med["avx512_vnni"],
                                 amx_ms=med["amx_int8"], speedup=med["avx512_vnni"] / med["amx_int8"]))
    if a.json:
        print(json.dumps(dict(threads=threads, rows=rows)))
        return 0
    print(f"{threads} threads, medians of {a.rounds} interleaved rounds")
    print(f"{'type':<6} {'matrix':<12} {'shape':>11} {'T':>4} {'VNNI ms':>9} {'AMX ms':>9} {'VNNI/AMX':>9}")
    for r in rows:
        print(f"{r['type']:<6} {r['name']:<12} {r['out']:>5}x{r['inp']:<5} {r['T']:>4} {r['vnni_ms']:>9.3f} "
              f"{r['amx_ms']:>9.3f} {r['speedup']:>9.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
