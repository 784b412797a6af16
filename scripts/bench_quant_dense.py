"""Dense layers on GGUF quantized blocks, on Qwen3-30B-A3B's non-expert shapes: `engine.native.quant_matmul` (int8
activations, the blocks read in place) vs dequantizing the blocks per call (`quant_dequantize` on the same pool) + torch
matmul, whole ("dequant+torch") or 4096 rows at a time as engine.dense.Linear does beyond QUANT_NATIVE_MAX_TOKENS
("chunked"), and torch on a resident f32 copy (what the loader held before), in ms per call.

    python scripts/bench_quant_dense.py [--threads 2] [--tokens 1 16 128 512] [--types Q4_K Q6_K Q8_0] [--json]

Random weights quantized by Tessera's own quantizer (engine.quantize); each figure is the best of several calls after
a warm-up. `lm_head/8` is a 1/8 slice of the 151,936-row lm_head (the whole one takes minutes per T=512 call on two
cores; per-row costs are the same). Prints figures only; nothing is asserted. tessera/engine/dense.py's
QUANT_NATIVE_MAX_TOKENS is chosen from these figures (docs/BENCHMARKS.md).
"""

from __future__ import annotations

import argparse
import json

import bench_dense  # scripts/: run as `python scripts/bench_quant_dense.py`
import numpy as np
import torch
from gguf import GGMLQuantizationType as Q

from tessera.engine import dense, native
from tessera.engine.quantize import quantize
from tessera.engine.quantized import QuantizedMatrix

# name -> (out, in): Qwen3-30B-A3B (H 2048, 32 query heads, 4 kv heads, head_dim 128, V 151,936).
SHAPES = {
    "q_proj": (4096, 2048),
    "k_proj": (512, 2048),
    "o_proj": (2048, 4096),
    "lm_head/8": (151936 // 8, 2048),
}


def best_ms(fn, min_reps: int) -> float:
    return bench_dense.best_ms(fn, min_reps, budget_s=1.0, max_reps=30)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=None, help="threads (default: physical cores)")
    p.add_argument("--tokens", type=int, nargs="+", default=[1, 16, 128, 512], help="T values (default 1 16 128 512)")
    p.add_argument("--types", nargs="+", default=["Q4_K", "Q6_K", "Q8_0"], help="GGML types (default Q4_K Q6_K Q8_0)")
    p.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES), help="matrices (default all)")
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    threads = a.threads or native.physical_cores()
    torch.set_num_threads(threads)
    pool = native.make_pool(threads)
    rng = np.random.default_rng(0)
    rows = []
    for tname in a.types:
        qtype = Q[tname.upper()]
        for name in a.shapes:
            n, k = SHAPES[name]
            w = quantize((rng.standard_normal((n, k), dtype=np.float32) * 0.02), qtype)  # [N, row bytes]
            w32 = torch.empty(n, k)  # [N, K] resident f32 (the old load)
            native.quant_dequantize(qtype, w, w32, pool)
            buf = torch.empty(n, k)  # [N, K] the per-call widening target
            lin = dense.Linear(QuantizedMatrix(w, qtype, (n, k), name), "cpu", name)  # its row-chunked widening
            for T in a.tokens:
                x = torch.randn(T, k)  # [T, K]
                out = torch.empty(T, n)  # [T, N]
                reps = 2 if n * k * T > 2e9 else 5

                def per_call(x=x, w=w, buf=buf, qtype=qtype):
                    native.quant_dequantize(qtype, w, buf, pool)
                    return x @ buf.T

                row = dict(type=qtype.name, name=name, out=n, inp=k, T=T,
                           quant_ms=best_ms(lambda x=x, w=w, out=out, q=qtype: native.quant_matmul(q, w, x, out, pool),
                                            reps),
                           dequant_torch_ms=best_ms(per_call, reps),
                           chunked_ms=best_ms(lambda x=x, lin=lin, out=out: lin._widened_matmul(x, out), reps),
                           resident_f32_ms=best_ms(lambda x=x, w32=w32: x @ w32.T, reps))
                rows.append(row)
            del w, w32, buf
    result = dict(threads=threads, isa=next(i["name"] for i in native.quant_isas() if i["available"]), rows=rows)
    if a.json:
        print(json.dumps(result))
        return 0
    print(f"quant isa {result['isa']}, {threads} threads")
    print(f"{'type':<6} {'matrix':<10} {'shape':>13} {'T':>4} {'quant ms':>9} {'dequant+torch ms':>17} "
          f"{'chunked ms':>11} {'f32 resident ms':>16}")
    for r in rows:
        print(f"{r['type']:<6} {r['name']:<10} {r['out']:>6}x{r['inp']:<6} {r['T']:>4} {r['quant_ms']:>9.3f} "
              f"{r['dequant_torch_ms']:>17.3f} {r['chunked_ms']:>11.3f} {r['resident_f32_ms']:>16.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
