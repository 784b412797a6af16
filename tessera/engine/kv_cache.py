"""KV cache of one token sequence, and the prefix cache that keeps several of them across turns and conversations.

`KVCache` holds per-layer K/V buffers, allocated ahead in chunks and written in place, plus the token ids whose K/V they
hold. Keys are stored in tiles of 32 positions ([nkv, ceil(C/32), hd, 32]: one block of keys is one contiguous run,
which the attention kernel streams); values as [nkv, C, hd]. `PrefixCache` is a bounded LRU (by bytes) of such caches:
a request takes the cache sharing the longest common token prefix with its prompt, so a chat's second turn prefills
only the new tokens.

A cache of dtype torch.int8 is the q8_0 cache (`kv_cache_dtype="q8_0"`): int8 K/V with an f16 scale per 32 values,
stored as tessera/engine/kv_q8.py describes (its own tiled layout, and the scales in `ks`, `vs`).

Letters: L layers, nkv key/value heads, C capacity (positions allocated), S positions filled, T new tokens, hd head dim.
"""

from __future__ import annotations

import torch

from tessera.engine import kv_q8
from tessera.engine.huge_pages import empty as huge_page_empty

_CHUNK = 256  # positions added per growth step
KEY_TILE = 32  # positions per key tile (native/include/tessera/attention.h)
# What a cache can store (the user's name -> the KVCache dtype); bf16 is the default. q8_0: int8 values, f16 scales.
KV_DTYPES = {"bf16": torch.bfloat16, "q8_0": torch.int8, "f32": torch.float32}
KV_DTYPE_NAMES = {dtype: name for name, dtype in KV_DTYPES.items()}


def kv_dtype(name: str) -> torch.dtype:
    """The KVCache dtype of a user's KV cache type name ("bf16", "q8_0", "f32"); ValueError naming the choices."""
    if name not in KV_DTYPES:
        raise ValueError(f"KV cache type {name!r} is not one of {', '.join(KV_DTYPES)}")
    return KV_DTYPES[name]


class KVCache:
    """K/V of one token sequence for every layer, stored in `dtype` (bfloat16 by default: half of float32's bytes, as
    llama.cpp's f16 cache; float32 for reference checks). Positions [0, length) are valid and belong to `tokens`.

    The native attention (engine.attention) reads a bf16 cache in place. The torch path reads K/V as float32 through
    `keys_values`: it widens the layer being computed into one float32 scratch per device (reused by every layer, so it
    costs one layer's float32 K/V, not the whole cache's).

    `devices` gives each layer's device (where its attention runs); default all on the CPU.
    """

    def __init__(
        self,
        layers: int,
        kv_heads: int,
        head_dim: int,
        capacity: int = _CHUNK,
        devices: list[torch.device] | None = None,
        dtype: torch.dtype = torch.bfloat16,
        huge_pages: bool = False,
    ):
        # K/V buffers on the CPU on transparent huge pages (engine.huge_pages): off by default, see that module.
        self.huge_pages = huge_pages
        self.layers, self.kv_heads, self.head_dim, self.dtype = layers, kv_heads, head_dim, dtype
        self.devices = list(devices) if devices is not None else [torch.device("cpu")] * layers
        self.quantized = dtype == torch.int8  # q8_0
        if self.quantized and head_dim % kv_q8.BLOCK:
            raise ValueError(f"KV cache type q8_0 needs a head dim that is a multiple of {kv_q8.BLOCK}; this model's "
                             f"is {head_dim} (use bf16)")
        capacity = self._round(max(1, capacity))
        if self.quantized:  # L x k [nkv, C/32, hd/4, 32, 4], ks [nkv, C/32, hd/32, 32], v [nkv, C/4, hd, 4], vs
            self.k, self.ks, self.v, self.vs = (list(b) for b in zip(*(self._q8_buffers(capacity, d)
                                                                        for d in self.devices)))
        else:
            self.k = [self._key_buffer(capacity, d) for d in self.devices]  # L x [nkv, ceil(C/32), hd, 32]
            self.v = [self._buffer(capacity, d) for d in self.devices]  # L x [nkv, C, hd]
        self.tokens: list[int] = []
        self._scratch: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}  # device -> f32 [nkv, C, hd] x 2

    def _round(self, capacity: int) -> int:
        return -(-capacity // KEY_TILE) * KEY_TILE if self.quantized else capacity  # q8_0: whole tiles

    def _q8_buffers(self, capacity: int, device: torch.device) -> tuple[torch.Tensor, ...]:
        return kv_q8.buffers(self.kv_heads, capacity, self.head_dim, device, self.huge_pages)

    def _buffer(self, capacity: int, device: torch.device) -> torch.Tensor:
        alloc = huge_page_empty if self.huge_pages else torch.empty
        return alloc((self.kv_heads, capacity, self.head_dim), device=device, dtype=self.dtype)  # [nkv, C, hd]

    def _key_buffer(self, capacity: int, device: torch.device) -> torch.Tensor:
        shape = (self.kv_heads, -(-capacity // KEY_TILE), self.head_dim, KEY_TILE)
        alloc = huge_page_empty if self.huge_pages else torch.empty
        return alloc(shape, device=device, dtype=self.dtype)  # [nkv, ceil(C/32), hd, 32]

    @property
    def length(self) -> int:
        return len(self.tokens)

    @property
    def capacity(self) -> int:
        return self.v[0].shape[1] * (4 if self.quantized else 1)

    @property
    def nbytes(self) -> int:
        return kv_bytes(self.layers, self.kv_heads, self.head_dim, self.capacity, self.dtype)

    @property
    def scratch_bytes(self) -> int:
        """Bytes of the float32 scratch the torch attention path reads the cache through (0 until it is used)."""
        return sum(k.nbytes + v.nbytes for k, v in self._scratch.values())

    def reserve(self, positions: int) -> None:
        """Make room for `positions` positions in total (grows every layer's buffers, keeping their contents)."""
        if positions <= self.capacity:
            return
        new_cap = -(-positions // _CHUNK) * _CHUNK
        tiles = -(-self.length // KEY_TILE)
        if self.quantized:
            for i, device in enumerate(self.devices):
                k, ks, v, vs = self._q8_buffers(new_cap, device)
                for new, old in ((k, self.k[i]), (ks, self.ks[i]), (vs, self.vs[i])):
                    new[:, :tiles] = old[:, :tiles]
                v[:, : tiles * KEY_TILE // 4] = self.v[i][:, : tiles * KEY_TILE // 4]
                self.k[i], self.ks[i], self.v[i], self.vs[i] = k, ks, v, vs
            return
        for i, old in enumerate(self.k):
            new = self._key_buffer(new_cap, old.device)  # [nkv, C'/32, hd, 32]
            new[:, :tiles] = old[:, :tiles]
            self.k[i] = new
        for i, old in enumerate(self.v):
            new = self._buffer(new_cap, old.device)  # [nkv, C', hd]
            new[:, : self.length] = old[:, : self.length]
            self.v[i] = new

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Write this step's k, v ([nkv, T, hd], rounded to the cache's dtype) after the committed positions."""
        start, end = self.length, self.length + k.shape[1]
        if end > self.capacity:
            raise ValueError(f"KV cache: positions [{start}, {end}) beyond its capacity {self.capacity}; reserve first")
        if self.quantized:
            kv_q8.write(k, v, start, self.k[layer], self.ks[layer], self.v[layer], self.vs[layer])
            return
        keys = self.k[layer]  # [nkv, C/32, hd, 32]
        if k.shape[1] == 1:
            keys[:, start // KEY_TILE, :, start % KEY_TILE] = k[:, 0]  # [nkv, hd]
        else:
            pos = torch.arange(start, end, device=keys.device)  # [T]
            keys[:, pos // KEY_TILE, :, pos % KEY_TILE] = k.transpose(0, 1).to(self.dtype)  # [T, nkv, hd]
        self.v[layer][:, start:end] = v

    def append(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """`write`, then return K, V of [0, length+T) as float32 (the torch attention path)."""
        self.write(layer, k, v)
        return self.keys_values(layer, self.length + k.shape[1])

    def keys_values(self, layer: int, end: int) -> tuple[torch.Tensor, torch.Tensor]:
        """K, V of positions [0, end) of `layer` as float32 [nkv, S, hd], in the scratch of the layer's device."""
        device = self.k[layer].device
        ks, vs = self._scratch.get(device, (None, None))
        if ks is None or ks.shape[1] < end:
            shape = (self.kv_heads, self.capacity, self.head_dim)
            ks, vs = torch.empty(shape, device=device), torch.empty(shape, device=device)  # [nkv, C, hd] x 2
            self._scratch[device] = (ks, vs)
        if self.quantized:
            kv_q8.read(self.k[layer], self.ks[layer], self.v[layer], self.vs[layer], end, ks, vs)
            return ks[:, :end], vs[:, :end]  # [nkv, S, hd] float32 views
        full, rest = divmod(end, KEY_TILE)
        tiled = ks[:, : full * KEY_TILE].view(self.kv_heads, full, KEY_TILE, self.head_dim)  # [nkv, full, 32, hd]
        tiled.copy_(self.k[layer][:, :full].transpose(2, 3))
        if rest:
            ks[:, full * KEY_TILE : end].copy_(self.k[layer][:, full, :, :rest].transpose(1, 2))  # [nkv, rest, hd]
        vs[:, :end].copy_(self.v[layer][:, :end])
        return ks[:, :end], vs[:, :end]  # [nkv, S, hd] float32 views

    def commit(self, tokens: list[int]) -> None:
        """Mark the positions written by the last `append` of every layer as belonging to `tokens`."""
        self.tokens.extend(tokens)

    def truncate(self, length: int) -> None:
        del self.tokens[length:]

    def release_scratch(self) -> None:
        """Drop the float32 scratch (a cache kept for later, e.g. in the prefix cache, needs none until used)."""
        self._scratch.clear()

    def copy_prefix(self, length: int) -> KVCache:
        """A new cache holding the first `length` positions of this one."""
        capacity = -(-max(length, 1) // _CHUNK) * _CHUNK
        out = KVCache(self.layers, self.kv_heads, self.head_dim, capacity, self.devices, self.dtype)
        tiles = -(-length // KEY_TILE)
        for i in range(self.layers):
            if self.quantized:
                out.ks[i][:, :tiles] = self.ks[i][:, :tiles]
                out.vs[i][:, :tiles] = self.vs[i][:, :tiles]
                out.k[i][:, :tiles] = self.k[i][:, :tiles]
                out.v[i][:, : tiles * KEY_TILE // 4] = self.v[i][:, : tiles * KEY_TILE // 4]
                continue
            out.k[i][:, :tiles] = self.k[i][:, :tiles]
            out.v[i][:, :length] = self.v[i][:, :length]
        out.tokens = self.tokens[:length]
        return out


def kv_bytes(layers: int, kv_heads: int, head_dim: int, positions: int, dtype: torch.dtype = torch.bfloat16) -> int:
    """Bytes of the K and V of `positions` positions in every layer (the fit estimate and RAM estimate use this too);
    dtype torch.int8 is the q8_0 cache (int8 values and an f16 scale per 32, positions in whole tiles of 32)."""
    if dtype == torch.int8:
        return 2 * layers * kv_heads * (-(-positions // KEY_TILE) * KEY_TILE) * kv_q8.nbytes_per_position(head_dim)
    return 2 * layers * kv_heads * positions * head_dim * torch.empty(0, dtype=dtype).element_size()


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
        cache.release_scratch()  # a kept cache needs no float32 scratch until a request continues it
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
