"""Decode attention alone (one query token, Qwen3-30B-A3B shapes: 32 query heads, 4 KV heads, head_dim 128) at long
contexts, in GB/s of K/V read (int8 + scales for q8_0, bf16 for bf16), total and per thread.

    python scripts/bench_decode_attention.py [--contexts 2048 8192] [--threads 1 2] [--kv-cache-types q8_0 bf16]
        [--pages huge small] [--rounds 3] [--json]

Two placements per case: "memory" cycles through enough layers (>= 256 MB of K/V) that every call reads its layer
from DRAM, as a model's decode step does; "cache" calls one layer again and again (8k q8_0: 8.9 MB, within the last
level cache), the kernel's compute rate with memory out of the way. The kernel is engine.attention's default for the
cache type (native.attention_q8 / native.attention_bf16). Rounds are interleaved over the cases; the figure is the
median of the rounds' best-of-N. --pages: the K/V buffers on 4 KiB pages (torch.empty, the engine's default)
or on transparent huge pages (engine.huge_pages, opt-in), as separate caches measured in the same rounds.
Prints figures only; nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from tessera.engine import native
from tessera.engine.kv_cache import KV_DTYPES, KVCache, kv_bytes

NH, NKV, HD = 32, 4, 128


def make_cache(kv: str, S: int, layers: int, huge: bool) -> KVCache:
    cache = KVCache(layers, NKV, HD, S, dtype=KV_DTYPES[kv], huge_pages=huge)
    g = torch.Generator().manual_seed(0)
    k, v = torch.randn(NKV, S, HD, generator=g), torch.randn(NKV, S, HD, generator=g)
    for layer in range(layers):  # the same K/V in every layer: what is measured is where it is read from
        cache.write(layer, k, v)
    cache.tokens = [0] * S
    return cache


def caller(cache: KVCache, kv: str, S: int, pool):
    q = torch.randn(NH, 1, HD, generator=torch.Generator().manual_seed(1))  # [nh, 1, hd]
    out = torch.empty(1, NH * HD)  # [1, nh*hd]
    if kv == "q8_0":
        return lambda layer: native.attention_q8(q, cache.k[layer], cache.ks[layer], cache.v[layer], cache.vs[layer],
                                                 S - 1, HD**-0.5, out, pool)
    return lambda layer: native.attention_bf16(q, cache.k[layer], cache.v[layer], S - 1, HD**-0.5, out, pool)


def best_per_layer(fn, layers: int, reps: int) -> float:
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        for layer in range(layers):
            fn(layer)
        best = min(best, (time.perf_counter() - t) / layers)
    return best


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--contexts", type=int, nargs="+", default=[8192])
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    p.add_argument("--kv-cache-types", nargs="+", default=["q8_0", "bf16"], choices=sorted(KV_DTYPES))
    p.add_argument("--pages", nargs="+", default=["small"], choices=["huge", "small"],
                   help="K/V buffers on 4 KiB pages (the engine's default) or transparent huge pages")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    if any(S < 1 for S in a.contexts) or any(t < 1 for t in a.threads) or a.rounds < 1:
        p.error("--contexts, --threads and --rounds take positive numbers")
    pools = {t: native.make_pool(t) for t in a.threads}
    cases = []
    for kv in a.kv_cache_types:
        for S in a.contexts:
            layer_bytes = kv_bytes(1, NKV, HD, S, KV_DTYPES[kv])  # q8_0: int8 values and their f16 scales
            layers = max(2, -(-256_000_000 // layer_bytes))
            for pages in a.pages:
                cache = make_cache(kv, S, layers, pages == "huge")
                for t in a.threads:
                    fn = caller(cache, kv, S, pools[t])
                    for place, n in (("memory", layers), ("cache", 1)):
                        cases.append({"kv_cache": kv, "S": S, "pages": pages, "threads": t, "place": place,
                                      "layers": n, "bytes": layer_bytes, "fn": fn, "ms": []})
    print(f"decode attention kernels: q8_0 {native.attention_q8_kernel(HD)}, bf16 {native.attention_kernel(HD)}; "
          "layer bytes counted: K + V (+ scales)", flush=True)
    for _ in range(a.rounds):
        for c in cases:
            c["fn"](0)
            reps = 3 if c["place"] == "memory" else 30
            c["ms"].append(1e3 * best_per_layer(c["fn"], c["layers"], reps))
    for c in cases:
        ms = statistics.median(c["ms"])
        gbs = c["bytes"] / ms / 1e6
        row = {k: c[k] for k in ("kv_cache", "S", "pages", "threads", "place")}
        row.update(ms_per_layer=round(ms, 4), rounds_ms=[round(x, 4) for x in c["ms"]], gb_s=round(gbs, 2),
                   gb_s_per_thread=round(gbs / c["threads"], 2))
        print(json.dumps(row) if a.json else "  ".join(f"{k} {v}" for k, v in row.items()), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
