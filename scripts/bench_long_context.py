"""Long context on the CPU: causal attention alone at Qwen3-30B-A3B's shapes, and a model's prefill / decode split
into attention, routed experts and the rest (dense projections, norms, router, lm_head).

    python scripts/bench_long_context.py --kernels [--threads 2] [--prefill 512 2048 4096] [--decode 128 2048 8192]
    python scripts/bench_long_context.py MODEL.gguf [--threads 2] [--prefill ...] [--decode ...] [--decode-steps 8]
        [--fill-random] [--warmup-steps N] [--settle-steps 4] [--kv-cache-types bf16 q8_0] [--rounds N]

--kernels: one layer's attention (32 query heads, 4 KV heads, head_dim 128, bf16 cache) by the native kernel
(tessera/engine/attention.py's path: native_ms is attend's), each native kernel this CPU runs called directly
(native_AVX512_BF16_ms, native_AVX512_ms), and by the torch path it replaces (widen the layer's K/V to f32, then SDPA
with an explicit mask, or two matmuls for decode), plus torch SDPA with is_causal (its CPU flash kernel). Best of a few
runs.
MODEL: real prefill of N random tokens (one forward, as a prompt), then decode steps at that context; attention =
engine.attention.attend (cache reads, the kernel), experts = the expert backend's forward, dense = the rest. A decode
step that runs as one native call (engine.decode_layer: quantized or packed experts, a native attention kernel) has no
Python call to time: its rows give decode_ms alone and say so (decode_split).
--settle-steps: untimed decode steps on each context's cache before the --decode-steps timed ones.
--kv-cache-types: each cache type in turn (bf16, q8_0: engine.kv_cache.KV_DTYPES) for every context, in --rounds
interleaved rounds (one load of the model serves all of them); rows carry "kv_cache". With a real prefill, the
context is prefilled once (into the first type's cache) and every decode starts from a copy of that K/V converted to
its type, so the routing and the tokens are the same for every type; only the cache differs.
Prints figures only; nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import time

import torch
import torch.nn.functional as F

from tessera.engine import native

NH, NKV, HD = 32, 4, 128  # Qwen3-30B-A3B attention


def best_s(fn, reps: int) -> float:
    fn()  # warm-up
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def kernel_row(T: int, S: int, kv: str = "bf16") -> dict:
    """One layer's attention of T new positions at S positions in all (prefill: T = S; decode: T = 1). Decode cycles
    through enough layers (>= 128 MB of K/V) that each call reads its layer from memory, not from the last level cache,
    as a model's decode step does; the time is per layer."""
    from tessera.engine.attention import attend, decode_attention
    from tessera.engine.dense import dense_pool
    from tessera.engine.kv_cache import KV_DTYPES, KVCache, kv_bytes

    start, dtype = S - T, KV_DTYPES[kv]
    layers = -(-128_000_000 // kv_bytes(1, NKV, HD, S, dtype)) if T == 1 else 1
    cache = KVCache(layers, NKV, HD, S, dtype=dtype)
    g = torch.Generator().manual_seed(0)
    for layer in range(layers):
        cache.write(layer, torch.randn(NKV, S, HD, generator=g), torch.randn(NKV, S, HD, generator=g))
    q = torch.randn(NH, T, HD, generator=g)  # [nh, T, hd]
    mask = torch.arange(S)[None, :] <= torch.arange(start, S)[:, None]  # [T, S]
    reps = 2 if T * S > 4e6 else 5 if T > 1 else 20

    def per_layer(fn):  # seconds per call of fn(layer), every layer in turn
        return best_s(lambda: [fn(layer) for layer in range(layers)], reps) / layers

    native_s = per_layer(lambda layer: attend(q, cache, layer, start, mask))
    others = {}  # each native kernel this CPU runs, called directly
    out = torch.empty(T, NH * HD)  # [T, nh*hd]
    for kernel in ("AVX512_BF16", "AVX512") if kv == "bf16" else ():
        try:
            others[f"native_{kernel}_ms"] = 1e3 * per_layer(lambda layer, k=kernel: native.attention_bf16(
                q, cache.k[layer], cache.v[layer], start, HD**-0.5, out, dense_pool(), kernel=k))
        except ValueError:  # not on this CPU
            pass

    def old():  # the path before: widen the layer to f32, SDPA with the mask (prefill) or two matmuls (decode)
        keys, values = cache.keys_values(0, S)
        if T == 1:
            return decode_attention(q, keys, values)
        return F.scaled_dot_product_attention(q[None], keys[None], values[None], attn_mask=mask, enable_gqa=True)

    row = {"T": T, "S": S, "kv_cache": kv, "layers": layers, "native_ms": native_s * 1e3, **others,
           "widen_sdpa_mask_ms": best_s(old, reps) * 1e3}
    if T > 1:
        keys, values = cache.keys_values(0, S)
        row["sdpa_is_causal_f32_ms"] = 1e3 * best_s(lambda: F.scaled_dot_product_attention(
            q[None], keys[None], values[None], is_causal=True, enable_gqa=True), reps)
        flops = 2 * 2 * NH * HD * (T * (T + 1) / 2 + T * start)  # causal half of QK^T and PV
        row["native_gflops"] = flops / native_s / 1e9
    else:
        row["native_kv_gb_s"] = kv_bytes(1, NKV, HD, S, dtype) / native_s / 1e9  # K and V read once
    return row


def kernels(a) -> list[dict]:
    rows = []
    for T, S, kv in [(T, T, kv) for T in a.prefill for kv in a.kv_cache_types] + [
            (1, S, kv) for S in a.decode for kv in a.kv_cache_types]:
        row = kernel_row(T, S, kv)
        rows.append(row)
        print(json.dumps(row) if a.json else "  ".join(f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}"
                                                       for k, v in row.items()), flush=True)
    return rows


class Split:
    """Wall time inside attention and inside the expert backend during one forward (the rest is dense work)."""

    def __init__(self, model):
        import tessera.engine.model as em

        self.attn = self.experts = 0.0
        self._attend = em.attend
        self._forward = model.experts.forward

        em.attend, model.experts.forward = self._timed(self._attend, "attn"), self._timed(self._forward, "experts")

    def _timed(self, fn, total: str):
        """fn, adding its wall time to self.<total> on every call."""

        def timed(*args, **kw):
            t = time.perf_counter()
            try:
                return fn(*args, **kw)
            finally:
                setattr(self, total, getattr(self, total) + time.perf_counter() - t)

        return timed

    def reset(self):
        self.attn = self.experts = 0.0


def fill_random(cache, ids: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    """Write random K/V (unit normal, as the model's normed keys are about) for the positions of `ids` in every layer
    and commit them; returns stand-in last-position logits ([1, 1]: the next token is id 0)."""
    n = len(ids)
    cache.reserve(n)
    for layer in range(cache.layers):
        k, v = torch.randn(2, cache.kv_heads, n, cache.head_dim, generator=g)  # [nkv, n, hd] each
        cache.write(layer, k, v)
    cache.commit(ids.tolist())
    return torch.zeros(1, 1)


def converted(src, n: int, extra: int, dtype, new_cache):
    """A cache of `dtype` holding src's first n positions (widened to f32, then stored as `dtype`), room for `extra`."""
    cache = new_cache(n + extra, dtype)
    for layer in range(src.layers):
        cache.write(layer, *src.keys_values(layer, n))
    cache.commit(src.tokens[:n])
    src.release_scratch()
    return cache


def model_split(a) -> list[dict]:
    from tessera import engine

    steps = a.settle_steps + a.decode_steps  # decode steps per context, untimed ones first
    session = engine.load(a.model, threads=a.threads, context_length=max(a.prefill + a.decode) + steps + 8)
    model = session.model
    split = Split(model)
    vocab = model.config.vocab_size
    g = torch.Generator().manual_seed(0)
    model.forward(torch.randint(0, vocab, (8,), generator=g), model.new_cache(16))  # warm-up
    warm = model.new_cache(a.warmup_steps + 1)
    for _ in range(a.warmup_steps):  # first touches of the mapped weights (each expert's pages fault in once)
        model.forward(torch.randint(0, vocab, (1,), generator=g), warm)
    del warm
    rows = []
    from tessera.engine.kv_cache import KV_DTYPES

    contexts = sorted(set(a.decode) if a.fill_random else set(a.prefill) | set(a.decode))
    # Interleaved: with random fills, every round visits every context (a drift of the machine hits them all alike);
    # with real prefills, a context's rounds run together so that one prefill serves them.
    if a.fill_random:
        runs = [(r, n, kv) for r in range(a.rounds) for n in contexts for kv in a.kv_cache_types]
    else:
        runs = [(r, n, kv) for n in contexts for r in range(a.rounds) for kv in a.kv_cache_types]
    prefilled = {}  # context -> (cache of the first type, logits): the prefill every type's decode starts from
    for r, n, kv in runs:
        cache = model.new_cache(n + steps, KV_DTYPES[kv])
        ids = torch.randint(0, vocab, (n,), generator=g)
        if n in prefilled and not a.fill_random:
            src, logits = prefilled[n]
            cache = converted(src, n, steps, KV_DTYPES[kv], model.new_cache)
            row = {"context": n, "kv_cache": kv, "round": r, "filled": f"prefill, as {a.kv_cache_types[0]}"}
        elif a.fill_random:  # the context's K/V drawn at random instead of computed: decode reads the same bytes
            logits = fill_random(cache, ids, g)
            row = {"context": n, "kv_cache": kv, "round": r, "filled": "random"}
        else:
            split.reset()
            t = time.perf_counter()
            logits = model.forward(ids, cache)
            total = time.perf_counter() - t
            row = {"context": n, "kv_cache": kv, "round": r, "prefill_s": total, "prefill_attention_s": split.attn,
                   "prefill_experts_s": split.experts, "prefill_dense_s": total - split.attn - split.experts,
                   "prefill_tok_s": n / total}
            if len(a.kv_cache_types) > 1 or a.rounds > 1:  # kept to start every later decode from
                prefilled = {n: (cache, logits)}
                cache = converted(cache, n, steps, KV_DTYPES[kv], model.new_cache)
        if n in a.decode:
            nxt = logits.argmax(-1)
            for _ in range(a.settle_steps):  # untimed: the first steps after a fill or a prefill run slower
                nxt = model.forward(nxt.reshape(1), cache).argmax(-1)
            split.reset()
            t = time.perf_counter()
            for _ in range(a.decode_steps):
                nxt = model.forward(nxt.reshape(1), cache).argmax(-1)
            dt = time.perf_counter() - t
            row.update(decode_ms=1e3 * dt / a.decode_steps, decode_tok_s=a.decode_steps / dt)
            if split.attn or split.experts:  # the Python decode path: attend and the experts are called per layer
                row.update(decode_attention_ms=1e3 * split.attn / a.decode_steps,
                           decode_experts_ms=1e3 * split.experts / a.decode_steps,
                           decode_dense_ms=1e3 * (dt - split.attn - split.experts) / a.decode_steps)
            else:  # one native call ran each step (engine.decode_layer): no Python call to time; --kernels times
                row.update(decode_split="one native call a step: not split (see --kernels for attention alone)")
        del cache
        rows.append(row)
        print(json.dumps(row) if a.json else "  ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}"
                                                       for k, v in row.items()), flush=True)
    session.close()
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model", nargs="?", help="a GGUF file or Hugging Face folder (omit with --kernels)")
    p.add_argument("--kernels", action="store_true", help="time attention alone at Qwen3-30B-A3B's shapes")
    p.add_argument("--threads", type=int, default=None, help="threads (default: physical cores)")
    p.add_argument("--prefill", type=int, nargs="*", default=[512, 2048, 4096], help="prompt lengths")
    p.add_argument("--decode", type=int, nargs="*", default=[128, 2048, 8192], help="decode contexts")
    p.add_argument("--decode-steps", type=int, default=8, help="decode steps timed per context (default 8)")
    p.add_argument("--settle-steps", type=int, default=4,
                   help="untimed decode steps on each context's cache before the timed ones (default 4: the first "
                        "steps after a fill or a prefill run slower; docs/BENCHMARKS.md, session 15)")
    p.add_argument("--warmup-steps", type=int, default=0,
                   help="untimed decode steps after loading (a big model's experts are first touched over ~50 tokens)")
    p.add_argument("--fill-random", action="store_true",
                   help="decode contexts only: fill the KV cache with random K/V instead of a prefill (minutes saved "
                        "on a big model; attention reads the same bytes, but random K/V change the routing, so only "
                        "the attention time compares with a real prefill's)")
    p.add_argument("--kv-cache-types", nargs="+", default=["bf16"], choices=("bf16", "q8_0"), metavar="TYPE",
                   help="KV cache types to time, each in turn for every context (default bf16)")
    p.add_argument("--rounds", type=int, default=1, help="interleaved rounds over contexts x cache types (default 1)")
    p.add_argument("--json", action="store_true", help="one JSON object per line")
    a = p.parse_args()
    if not a.kernels and not a.model:
        p.error("give a MODEL or --kernels")
    a.threads = a.threads or native.physical_cores()
    torch.set_num_threads(a.threads)
    from tessera.engine.attention import native_kernel

    print(f"threads {a.threads}, attention kernel {native_kernel(HD)}", flush=True)
    if a.kernels:
        kernels(a)
    if a.model:
        model_split(a)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
