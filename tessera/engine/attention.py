"""Causal grouped-query attention of one decoder layer over its KV cache.

Two paths, same result (tests/engine/test_attention.py holds them to a naive reference):
- native (`engine.native.attention_bf16`, native/src/attention_avx512.cpp): a bf16 cache on the CPU with an AVX-512
  kernel for this head dim (decode: f32 products; prefill, T > 1: native/src/attention_avx512_bf16.cpp's vdpbf16ps
  kernel where the CPU has avx512_bf16, which rounds q and the probabilities to bf16 and runs 1.8x faster; it measured
  no faster at decode; a CPU with AVX2 but not AVX-512: native/src/attention_avx2.cpp, f32 products at any T).
  engine.model.Attention's native step (prepare_attend_native) also norms, rotates and appends
  in one native pass before the kernel. Flash style: query blocks x key
  blocks of 32 with an online softmax, K/V read in place as stored (never widened as a whole, no T x S score matrix),
  causal blocks above the diagonal skipped; with few query blocks (decode) the keys are split across the threads and
  the partial softmaxes merged (flash-decoding). It runs every step: decode (where reading the cache is the whole
  cost), prefill after cached positions (where torch would need an explicit [T, S] mask and compute the whole square)
  and a first prompt (where it measured faster than torch's causal SDPA at 512-4096 tokens).
- native q8_0 (`engine.native.attention_q8`, native/src/attention_q8_avx512_vnni.cpp): a q8_0 cache (int8 K/V, f16
  scales per 32 values) on the CPU with AVX-512 VNNI, the same flash structure with both products on int8 (q quantized
  per 32 dims as llama.cpp does against a q8_0 cache; the probabilities times the value scales quantized to uint8 per
  block of 32 keys), so decode reads half the bytes of the bf16 cache at memory speed. A CPU with AVX2 + FMA + F16C but
  no AVX-512 VNNI: native/src/attention_q8_avx2.cpp, the same algorithm at 8 lanes by vpmaddubsw (the weights
  quantized to 0..127, half the VNNI kernel's levels, so no int16 pair sum saturates).
- torch: every other case (a float32 cache, a GPU layer, a CPU without AVX2, a q8_0 cache without AVX2 + F16C):
  K/V are widened to float32 once per layer (KVCache.keys_values, O(S); a q8_0 cache is dequantized there, small
  beside O(T*S) work), then torch's SDPA (is_causal for a first prompt, whose
  CPU flash kernel has no T x T matrix either); decode takes two small matmuls.

Letters: T new positions, S = cached + new, nh query heads, nkv key/value heads, hd head dim.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from tessera.engine import native
from tessera.engine.dense import dense_pool
from tessera.engine.kv_cache import KVCache


@functools.cache
def native_kernel(head_dim: int) -> str:
    """"AVX512" or "AVX2" where a native kernel runs for this head dim on this CPU, else "Reference" (then torch is
    used)."""
    return native.attention_kernel(head_dim)


@functools.cache
def native_q8_kernel(head_dim: int) -> str:
    """"AVX512_VNNI" or "AVX2" where a native q8_0-cache kernel runs for this head dim on this CPU, else "Reference"
    (then torch is used)."""
    return native.attention_q8_kernel(head_dim)


def uses_native(cache: KVCache, layer: int) -> bool:
    if cache.quantized:
        return cache.k[layer].device.type == "cpu" and native_q8_kernel(cache.head_dim) != "Reference"
    return (cache.dtype == torch.bfloat16 and cache.k[layer].device.type == "cpu"
            and native_kernel(cache.head_dim) != "Reference")


def prepares_native(cache: KVCache, layer: int) -> bool:
    """Whether prepare_attend_native runs this layer's step: a bf16 cache the native kernel reads (a q8_0 cache is
    written by KVCache.write and read by attend)."""
    return not cache.quantized and uses_native(cache, layer)


def prepare_attend_native(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_norm: torch.Tensor,
                          k_norm: torch.Tensor, eps: float, cos: torch.Tensor, sin: torch.Tensor, cache: KVCache,
                          layer: int, pool=None) -> torch.Tensor:
    """A step of engine.model.Attention after its projections, all native (where prepares_native(cache, layer)): q
    [T, nh*hd], k, v [T, nkv*hd] as projected, of the positions after the cache's committed ones -> [T, nh*hd].
    One pass on the pool norms (RMSNorm per head) and rotates (RoPE, cos/sin [T, hd]) q in place and k, and writes
    k, v to the cache as bf16 (`native.attention_prepare`; what rms_norm, Rope.apply and KVCache.write do, which torch
    ran at one thread in a dozen passes over q), then the kernel reads q as it lies ([T, nh, hd]) and leaves the heads
    merged."""
    T, hd = q.shape[0], cache.head_dim
    q = q.contiguous()  # [T, nh*hd] (a copy only if the projection left a strided view), normed in place
    start, pool = cache.length, pool or dense_pool()
    if start + T > cache.capacity:
        raise ValueError(f"KV cache: positions [{start}, {start + T}) beyond its capacity {cache.capacity}; "
                         "reserve first")
    kt, vc = cache.k[layer], cache.v[layer]  # [nkv, ceil(C/32), hd, 32], [nkv, C, hd] bf16
    native.attention_prepare(q, k, v, q_norm, k_norm, cos, sin, eps, kt, vc, start, pool)
    out = torch.empty(T, q.shape[1])  # [T, nh*hd]
    native.attention_bf16(q.view(T, -1, hd), kt, vc, start, hd**-0.5, out, pool, token_major=True)
    return out


def attend(q: torch.Tensor, cache: KVCache, layer: int, start: int, mask: torch.Tensor | None,
           pool=None) -> torch.Tensor:
    """q [nh, T, hd] (normed, rotated) of positions start..start+T-1, whose K/V `cache` already holds for `layer` ->
    [T, nh*hd]. Query t sees positions [0, start+t]; `mask` ([T, S] bool, True = seen) is only read by the torch path
    when start > 0 and T > 1 (a cache the native kernel cannot read). `pool`: the native thread pool (default
    engine.dense.dense_pool(), torch's count now; a model passes the one it was built with, as its Linears do, since a
    step may run with torch at one thread)."""
    nh, T, hd = q.shape
    if uses_native(cache, layer) and cache.quantized:
        out = torch.empty(T, nh * hd)  # [T, nh*hd]
        native.attention_q8(q.contiguous(), cache.k[layer], cache.ks[layer], cache.v[layer], cache.vs[layer], start,
                            hd**-0.5, out, pool or dense_pool())
        return out
    if uses_native(cache, layer):
        out = torch.empty(T, nh * hd)  # [T, nh*hd]
        kt, v = cache.k[layer], cache.v[layer]  # [nkv, ceil(C/32), hd, 32], [nkv, C, hd] bf16, read in place
        native.attention_bf16(q.contiguous(), kt, v, start, hd**-0.5, out, pool or dense_pool())
        return out
    keys, values = cache.keys_values(layer, start + T)  # [nkv, S, hd] float32 x 2
    if T == 1:  # decode: two small matmuls, ~4x faster than torch's CPU SDPA at long contexts
        return decode_attention(q, keys, values).reshape(1, nh * hd)  # [1, nh*hd]
    causal = dict(is_causal=True) if start == 0 else dict(attn_mask=mask)
    out = F.scaled_dot_product_attention(
        q.unsqueeze(0), keys.unsqueeze(0), values.unsqueeze(0), enable_gqa=nh != keys.shape[0], **causal
    )  # [1, nh, T, hd]
    return out[0].transpose(0, 1).reshape(T, nh * hd)  # [T, nh*hd]


def decode_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """One query position against every cached one (no mask), grouped-query: query head h reads KV head h // (nh/nkv),
    as transformers' repeat_kv does. q [nh, 1, hd], keys/values [nkv, S, hd] -> [nh, hd]."""
    nh, nkv, hd = q.shape[0], keys.shape[0], q.shape[-1]
    qg = q.reshape(nkv, nh // nkv, hd)  # [nkv, g, hd]
    scores = torch.matmul(qg, keys.transpose(1, 2)) * hd**-0.5  # [nkv, g, S]
    return torch.matmul(torch.softmax(scores, dim=-1), values).reshape(nh, hd)  # [nh, hd]
