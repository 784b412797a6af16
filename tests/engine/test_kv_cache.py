"""KV cache growth and the prefix cache: longest common prefix, copy on partial match, LRU by bytes, cold logits."""

from __future__ import annotations

import torch
from hf_reference import engine_model, single_thread  # noqa: F401

from tessera.engine.kv_cache import KVCache, PrefixCache, common_prefix, kv_bytes


def filled(tokens, layers=2, heads=1, hd=4):
    c = KVCache(layers, heads, hd, 4)
    c.reserve(len(tokens))
    for layer in range(layers):
        kv = torch.arange(len(tokens), dtype=torch.float32).repeat(heads, hd, 1).transpose(1, 2) + layer  # [nkv, T, hd]
        c.append(layer, kv, -kv)
    c.commit(list(tokens))
    return c


def test_reserve_keeps_contents_and_copy_prefix():
    c = filled(range(10))
    before = [t.clone() for t in c.keys_values(1, 10)]
    c.reserve(1000)
    assert c.capacity >= 1000 and all(torch.equal(a, b) for a, b in zip(c.keys_values(1, 10), before))
    d = c.copy_prefix(6)
    assert d.tokens == list(range(6)) and torch.equal(d.keys_values(1, 6)[1], before[1][:, :6])
    assert torch.equal(d.keys_values(1, 6)[0], before[0][:, :6])
    d.truncate(2)
    assert d.tokens == [0, 1] and c.length == 10


def test_bf16_storage_halves_the_bytes_and_attention_reads_float32():
    c32, c16 = KVCache(3, 2, 8, 300, dtype=torch.float32), KVCache(3, 2, 8, 300)
    assert c16.dtype == torch.bfloat16 and c16.nbytes * 2 == c32.nbytes == kv_bytes(3, 2, 8, 300, torch.float32)
    k, v = torch.randn(2, 5, 8), torch.randn(2, 5, 8)  # [nkv, T, hd]
    keys, values = c16.append(1, k, v)
    assert keys.dtype == values.dtype == torch.float32 and keys.shape == (2, 5, 8)
    assert torch.equal(keys, k.bfloat16().float()) and torch.equal(values, v.bfloat16().float())
    c16.commit([1, 2, 3, 4, 5])
    keys, _ = c16.append(2, k[:, :1], v[:, :1])  # layer 2 shares the scratch; it reads its own positions
    assert keys.shape == (2, 6, 8) and torch.equal(keys[:, 5], k[:, 0].bfloat16().float())
    assert c16.scratch_bytes == 2 * 2 * 300 * 8 * 4  # one layer's float32 K and V, not the whole cache's
    pc = PrefixCache(lambda n: KVCache(3, 2, 8, n), budget_bytes=1 << 30)
    pc.release(c16)
    assert c16.scratch_bytes == 0 and c16.copy_prefix(3).dtype == torch.bfloat16


def test_decode_attention_equals_sdpa():
    from tessera.engine.attention import decode_attention

    g = torch.Generator().manual_seed(0)
    q = torch.randn(6, 1, 16, generator=g)  # [nh, 1, hd]
    keys, values = torch.randn(2, 2, 37, 16, generator=g)  # [nkv, S, hd] each
    want = torch.nn.functional.scaled_dot_product_attention(q[None], keys[None], values[None], enable_gqa=True)
    assert torch.allclose(decode_attention(q, keys, values), want[0, :, 0], atol=1e-6)


def test_common_prefix():
    assert common_prefix([1, 2, 3], [1, 2, 4]) == 2
    assert common_prefix([1, 2], [1, 2, 3]) == 2
    assert common_prefix([], [1]) == 0


def test_acquire_longest_prefix_in_place_or_copy():
    pc = PrefixCache(lambda n: KVCache(2, 1, 4, n), budget_bytes=1 << 30)
    a, b = filled([1, 2, 3, 4, 5]), filled([1, 2, 9, 9])
    pc.release(a)
    pc.release(b)
    cache, n = pc.acquire([1, 2, 3, 4, 5, 6, 7])  # extends a: continued in place, taken out of the LRU
    assert cache is a and n == 5 and pc.entries == [b]
    pc.release(a)
    cache, n = pc.acquire([1, 2, 3, 8])  # matches part of a: a copy, a itself stays for others
    assert cache is not a and n == 3 and cache.tokens == [1, 2, 3] and a in pc.entries
    cache, n = pc.acquire([1, 2, 3, 4, 5])  # whole prompt cached: the last token is still computed
    assert n == 4 and cache.tokens == [1, 2, 3, 4]
    cache, n = pc.acquire([7, 7])
    assert n == 0 and cache.length == 0


def test_tie_prefers_the_cache_continued_in_place():
    pc = PrefixCache(lambda n: KVCache(2, 1, 4, n), budget_bytes=1 << 30)
    longer, exact = filled([1, 2, 3, 4, 5]), filled([1, 2, 3])
    pc.release(exact)
    pc.release(longer)  # most recent, but would need a copy
    cache, n = pc.acquire([1, 2, 3, 9])
    assert n == 3 and cache is exact and pc.entries == [longer]


def test_lru_evicts_oldest_beyond_budget():
    one = filled([1]).nbytes
    pc = PrefixCache(lambda n: KVCache(2, 1, 4, n), budget_bytes=2 * one)
    a, b, c = filled([1]), filled([2]), filled([3])
    pc.release(a)
    pc.release(b)
    pc.acquire([1, 5])  # touches a: b becomes the oldest
    pc.release(a)
    pc.release(c)
    assert pc.entries == [a, c] and pc.nbytes <= pc.budget_bytes
    small = PrefixCache(lambda n: KVCache(2, 1, 4, n), budget_bytes=one // 2)
    small.release(filled([1]))
    assert small.entries == []


def test_second_turn_reuses_kv_with_same_logits_as_cold():
    _, model = engine_model("dense_layers", seed=2)
    pc = PrefixCache(model.new_cache, budget_bytes=1 << 30)
    turn1 = [5, 8, 13, 21, 34, 55, 89, 144]
    cache, n = pc.acquire(turn1)
    assert n == 0
    model.forward(torch.tensor(turn1), cache)
    model.forward(torch.tensor([7]), cache)  # one decoded token
    pc.release(cache)
    turn2 = turn1 + [7, 1, 2, 3, 4, 100]
    cache, n = pc.acquire(turn2)
    assert n == 9 and n / len(turn2) > 0
    warm = model.forward(torch.tensor(turn2[n:]), cache, last_only=False)  # [T-n, V]
    cold = model.forward(torch.tensor(turn2), model.new_cache(4), last_only=False)[n:]  # [T-n, V]
    scale = float(cold.max() - cold.min())
    assert float((warm - cold).abs().max()) <= 1e-4 * scale
