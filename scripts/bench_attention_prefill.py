"""One decoder layer's attention at prefill, piece by piece, at Qwen3-30B-A3B's shapes (32 query heads, 4 KV heads,
head_dim 128, bf16 cache), everything engine.model.Attention does at T > 1 except the q/k/v/o projections: q/k
RMSNorm, RoPE, the KV append into the tiled cache, the causal kernel and the head merge, timed with torch at one
thread and the native pool at --threads, as a model step on native weights runs them (engine.dense.step_torch_threads).

    python scripts/bench_attention_prefill.py [--threads 2] [--tokens 512 4096] [--cached 0] [--reps 3]
                                              [--kernels AMX_BF16 AVX512_BF16 ...]

Each piece is timed on its own (best of --reps): torch's norms, rope and append (KVCache.write), the native pass that
replaces the three (prepare), the kernel (engine.attention.attend), then the whole of Attention.__call__ with its
projections replaced by precomputed outputs ("module"; other = module - kernel). Prints JSON rows, one per length;
nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

NH, NKV, HD, EPS, THETA = 32, 4, 128, 1e-6, 1e6  # Qwen3-30B-A3B attention


def best_s(fn, reps: int) -> float:
    fn()  # warm-up
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


class _Given:
    """Stands in for the fused q/k/v projection: returns outputs computed beforehand, as fresh tensors (the module may
    overwrite them in place), so the projections themselves are not timed here."""

    def __init__(self, *outs):
        self.outs = outs

    def __call__(self, x):
        return [o.clone() for o in self.outs]


def row(T: int, cached: int, pool, reps: int, kernels: list[str]) -> dict:
    from tessera.engine import model as M
    from tessera.engine import native
    from tessera.engine.attention import attend
    from tessera.engine.kv_cache import KVCache

    g = torch.Generator().manual_seed(0)
    S = cached + T
    cache = KVCache(1, NKV, HD, S)
    if cached:
        cache.write(0, torch.randn(NKV, cached, HD, generator=g), torch.randn(NKV, cached, HD, generator=g))
        cache.commit(list(range(cached)))
    q = torch.randn(T, NH * HD, generator=g)  # [T, nh*hd] as q_proj leaves it
    k = torch.randn(T, NKV * HD, generator=g)  # [T, nkv*hd]
    v = torch.randn(T, NKV * HD, generator=g)  # [T, nkv*hd]
    q_norm, k_norm = 1 + 0.1 * torch.randn(HD, generator=g), 1 + 0.1 * torch.randn(HD, generator=g)
    rope = M.Rope(HD, THETA)
    cos, sin = rope.cos_sin(torch.arange(cached, S))  # [T, hd] x 2
    mask = torch.arange(S)[None, :] <= torch.arange(cached, S)[:, None]  # [T, S], as the model builds it

    qn = M.rms_norm(q.view(T, NH, HD), q_norm, EPS).transpose(0, 1)  # [nh, T, hd]
    kn = M.rms_norm(k.view(T, NKV, HD), k_norm, EPS).transpose(0, 1)  # [nkv, T, hd]
    qr, kr = M.Rope.apply(qn, cos, sin), M.Rope.apply(kn, cos, sin)
    vt = v.view(T, NKV, HD).transpose(0, 1)  # [nkv, T, hd]

    def norms():
        M.rms_norm(q.view(T, NH, HD), q_norm, EPS).transpose(0, 1)
        M.rms_norm(k.view(T, NKV, HD), k_norm, EPS).transpose(0, 1)

    def ropes():
        M.Rope.apply(qn, cos, sin), M.Rope.apply(kn, cos, sin)

    def append():
        cache.write(0, kr, vt)

    cache.write(0, kr, vt)
    q_work = q.clone()  # normed in place again and again: the same work each time

    def prepare():  # the native pass that replaces norms, rope and append (engine.attention.prepare_attend_native)
        native.attention_prepare(q_work, k, v, q_norm, k_norm, cos, sin, EPS, cache.k[0], cache.v[0], cached, pool)

    def kernel():
        attend(qr, cache, 0, cached, mask, pool)

    attn = M.Attention.__new__(M.Attention)  # the module itself, projections replaced by their outputs
    attn.nh, attn.nkv, attn.hd, attn.eps, attn.rope, attn.pool = NH, NKV, HD, EPS, rope, pool
    attn.q_norm, attn.k_norm = q_norm, k_norm
    attn.qkv = _Given(q, k, v)
    attn.o_proj = lambda x: x  # [T, nh*hd]: the head merge is the kernel's output layout
    x = torch.empty(T, 1)  # only its length is read once the projections are given

    def module():
        attn(0, x, cos, sin, cache, mask)

    def given():  # the stand-in's own cost (copies of q, k, v), taken out of "module"
        attn.qkv(x)

    flops = 4 * NH * HD * (T * cached + T * (T + 1) / 2)  # QK^T and PV, causal
    out = {"T": T, "cached": cached}
    for name, fn in (("norms", norms), ("rope", ropes), ("append", append), ("prepare", prepare), ("kernel", kernel),
                     ("module", module),
                     ("given", given)):
        out[f"{name}_ms"] = round(1e3 * best_s(fn, reps), 2)
    out["module_ms"] = round(out["module_ms"] - out.pop("given_ms"), 2)
    out["kernel_gflops"] = round(flops / out["kernel_ms"] / 1e6, 1)
    out["other_ms"] = round(out["module_ms"] - out["kernel_ms"], 2)  # everything in the module but the kernel
    q_heads, o = qr.contiguous(), torch.empty(T, NH * HD)  # [nh, T, hd], [T, nh*hd]
    for name in kernels:  # each named kernel alone on the same cache and queries
        def named(name=name):
            native.attention_bf16(q_heads, cache.k[0], cache.v[0], cached, HD**-0.5, o, pool, kernel=name)
        ms = 1e3 * best_s(named, reps)
        out[f"{name}_ms"], out[f"{name}_gflops"] = round(ms, 2), round(flops / ms / 1e6, 1)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokens", type=int, nargs="+", default=[512, 4096])
    ap.add_argument("--cached", type=int, default=0, help="positions already in the cache before the prompt")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--kernels", nargs="*", default=[],
                    help="also time these kernels alone (AMX_BF16, AVX512_BF16, ...): NAME_ms, NAME_gflops")
    args = ap.parse_args()
    from tessera.engine.dense import dense_pool

    pool = dense_pool(args.threads)
    torch.set_num_threads(1)  # as a step on native weights runs torch (engine.dense.step_torch_threads)
    with torch.inference_mode():
        for T in args.tokens:
            print(json.dumps(row(T, args.cached, pool, args.reps, args.kernels)), flush=True)


if __name__ == "__main__":
    main()
