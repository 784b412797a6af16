"""KV cache of one token sequence, and the prefix cache that keeps several of them across turns and conversations.

`KVCache` holds per-layer K/V buffers, allocated ahead in chunks and written in place, plus the token ids whose K/V they
hold. `PrefixCache` is a bounded LRU (by bytes) of such caches: a request takes the cache sharing the longest common
token prefix with its prompt, so a chat's second turn prefills only the new tokens.

Letters: L layers, nkv key/value heads, C capacity (positions allocated), S positions filled, T new tokens, hd head dim.
"""

from __future__ import annotations

import torch

_CHUNK = 256  # positions added per growth step


class KVCache:
    """K/V of one token sequence for every layer, float32. Positions [0, length) are valid and belong to `tokens`.

    `devices` gives each layer's device (where its attention runs); default all on the CPU.
    """

    def __init__(self, layers: int, kv_heads: int, head_dim: int, capacity: int = _CHUNK,
                 devices: list[torch.device] | None = None):
        self.layers, self.kv_heads, self.head_dim = layers, kv_heads, head_dim
        self.devices = list(devices) if devices is not None else [torch.device("cpu")] * layers
        capacity = max(1, capacity)
        self.k = [torch.empty(kv_heads, capacity, head_dim, device=d) for d in self.devices]  # L x [nkv, C, hd]
        self.v = [torch.empty(kv_heads, capacity, head_dim, device=d) for d in self.devices]  # L x [nkv, C, hd]
        self.tokens: list[int] = []

    @property
    def length(self) -> int:
        return len(self.tokens)

    @property
    def capacity(self) -> int:
        return self.k[0].shape[1]

    @property
    def nbytes(self) -> int:
        return 2 * self.layers * self.kv_heads * self.capacity * self.head_dim * 4

    def reserve(self, positions: int) -> None:
        """Make room for `positions` positions in total (grows every layer's buffers, keeping their contents)."""
        if positions <= self.capacity:
            return
        new_cap = -(-positions // _CHUNK) * _CHUNK
        for bufs in (self.k, self.v):
            for i, old in enumerate(bufs):
                new = torch.empty(self.kv_heads, new_cap, self.head_dim, device=old.device)  # [nkv, C', hd]
                new[:, : self.length] = old[:, : self.length]
                bufs[i] = new

    def append(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write this step's k, v ([nkv, T, hd]) after the committed positions; return K, V of [0, length+T)."""
        start, end = self.length, self.length + k.shape[1]
        self.k[layer][:, start:end] = k
        self.v[layer][:, start:end] = v
        return self.k[layer][:, :end], self.v[layer][:, :end]  # [nkv, S, hd], [nkv, S, hd]

    def commit(self, tokens: list[int]) -> None:
        """Mark the positions written by the last `append` of every layer as belonging to `tokens`."""
        self.tokens.extend(tokens)

    def truncate(self, length: int) -> None:
        del self.tokens[length:]

    def copy_prefix(self, length: int) -> KVCache:
        """A new cache holding the first `length` positions of this one."""
        out = KVCache(self.layers, self.kv_heads, self.head_dim, -(-max(length, 1) // _CHUNK) * _CHUNK, self.devices)
        for dst, src in ((out.k, self.k), (out.v, self.v)):
            for i in range(self.layers):
                dst[i][:, :length] = src[i][:, :length]
        out.tokens = self.tokens[:length]
        return out


def common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


class PrefixCache:
    """Bounded LRU of KV caches (most recently used last), sized by bytes.

    `acquire(prompt)` returns a cache to extend and how many prompt tokens it already holds. A cache that matches the
    whole of its tokens is continued in place; one that matches only part is copied (the original stays for other
    conversations). `release(cache)` puts it back as the most recent entry and evicts the oldest beyond the budget.
    """

    def __init__(self, new_cache, budget_bytes: int):
        self._new_cache = new_cache  # callable(capacity) -> KVCache
        self.budget_bytes = budget_bytes
        self.entries: list[KVCache] = []

    @property
    def nbytes(self) -> int:
        return sum(c.nbytes for c in self.entries)

    def acquire(self, prompt: list[int]) -> tuple[KVCache, int]:
        """A cache for `prompt` and the number of its leading tokens whose K/V it holds (at most len(prompt) - 1, so the
        last prompt token is always computed and gives the logits of the first new token)."""
        best, best_n, best_key = None, 0, (0, False)
        for entry in reversed(self.entries):  # most recent first
            n = min(common_prefix(entry.tokens, prompt), len(prompt) - 1)
            key = (n, n == entry.length)  # the longest match; on a tie one that is continued in place, not copied
            if n > 0 and key > best_key:
                best, best_n, best_key = entry, n, key
        if best is None:
            return self._new_cache(len(prompt)), 0
        if best_n == best.length:
            self.entries.remove(best)  # continued in place; release() puts it back
            return best, best_n
        return best.copy_prefix(best_n), best_n

    def release(self, cache: KVCache) -> None:
        if cache in self.entries:
            self.entries.remove(cache)
        if cache.length == 0:
            return
        self.entries.append(cache)
        while len(self.entries) > 1 and self.nbytes > self.budget_bytes:
            self.entries.pop(0)
        if self.nbytes > self.budget_bytes:  # a single cache beyond the whole budget is not kept either
            self.entries.clear()

    def clear(self) -> None:
        self.entries.clear()
