"""The q8_0 KV cache's storage: int8 keys and values with one f16 scale per 32 values of one position and KV head (the
granularity of llama.cpp's `-ctk q8_0 -ctv q8_0`), in the layout native/include/tessera/attention_q8.h reads in place.

Scales are f16, as llama.cpp's q8_0 blocks: 2 bytes per 32 values (6 % on top of the int8 bytes; f32 would be 12.5 %,
which decode at long contexts reads every token) and 11 significant bits, a relative error of 2^-12 on the scale,
far below the int8 step it multiplies (1/254 of the block's largest value).

Block maths (the native decode step's `quantize_q8_block` does the same, so both paths store the same bytes):
d = f16(min(amax / 127, 65504)), q = clamp(round_half_even(x / d), -127, 127) with the f32 division, q = 0 where d is
0; the stored value is q * d, the multiple of the stored scale nearest x.

Layout (C capacity, a multiple of 32; nb = hd / 32):
    k  [nkv, C/32, hd/4, 32, 4] int8   a tile of 32 positions: per group of 4 dims, 32 keys x 4 dims
    v  [nkv, C/4, hd, 4] int8          per group of 4 positions: every dim x 4 positions
    ks [nkv, C/32, nb, 32] f16         per tile: per block of 32 dims, the 32 positions' scales (vs: the same)
"""

from __future__ import annotations

import torch

from tessera.engine import huge_pages

BLOCK = 32  # values per scale along the head dim; positions per tile


def quantize_q8_0(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [..., n] (n a multiple of 32) -> q [..., n] int8, d [..., n/32] float16 (the module docstring's maths)."""
    xb = x.float().reshape(*x.shape[:-1], x.shape[-1] // BLOCK, BLOCK)  # [..., nb, 32]
    d = (xb.abs().amax(-1) / 127).clamp(max=65504.0).to(torch.float16)  # [..., nb]
    df = d.float().unsqueeze(-1)  # [..., nb, 1]
    q = torch.where(df > 0, (xb / df).round().clamp(-127, 127), torch.zeros_like(xb))  # [..., nb, 32]
    return q.to(torch.int8).reshape(x.shape), d


def dequantize_q8_0(q: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
    """q [..., n] int8, d [..., n/32] -> float32 [..., n]."""
    qb = q.float().reshape(*q.shape[:-1], q.shape[-1] // BLOCK, BLOCK)  # [..., nb, 32]
    return (qb * d.float().unsqueeze(-1)).reshape(q.shape)


def buffers(kv_heads: int, capacity: int, head_dim: int, device, huge: bool = False) -> tuple[torch.Tensor, ...]:
    """Empty (k, ks, v, vs) of one layer for `capacity` positions (a multiple of 32); k and v on huge pages where
    `huge` and the device is the CPU (engine.huge_pages: decode streams them)."""
    tiles, nb = capacity // BLOCK, head_dim // BLOCK
    alloc = huge_pages.empty if huge else torch.empty
    k = alloc((kv_heads, tiles, head_dim // 4, BLOCK, 4), dtype=torch.int8, device=device)
    v = alloc((kv_heads, capacity // 4, head_dim, 4), dtype=torch.int8, device=device)
    ks = torch.empty(kv_heads, tiles, nb, BLOCK, dtype=torch.float16, device=device)
    vs = torch.empty(kv_heads, tiles, nb, BLOCK, dtype=torch.float16, device=device)
    return k, ks, v, vs


def write(k: torch.Tensor, v: torch.Tensor, start: int, kc: torch.Tensor, ks: torch.Tensor, vc: torch.Tensor,
          vs: torch.Tensor) -> None:
    """Quantize k, v [nkv, T, hd] and store them at positions [start, start+T) of one layer's buffers."""
    nkv, T, hd = k.shape
    qk, dk = quantize_q8_0(k.transpose(0, 1))  # [T, nkv, hd], [T, nkv, nb]
    qv, dv = quantize_q8_0(v.transpose(0, 1))
    pos = torch.arange(start, start + T, device=kc.device)  # [T]
    tile, lane = pos // BLOCK, pos % BLOCK
    kc[:, tile, :, lane] = qk.reshape(T, nkv, hd // 4, 4)  # [T, nkv, hd/4, 4]
    vc[:, pos // 4, :, pos % 4] = qv  # [T, nkv, hd]
    ks[:, tile, :, lane] = dk  # [T, nkv, nb]
    vs[:, tile, :, lane] = dv


def read(kc: torch.Tensor, ks: torch.Tensor, vc: torch.Tensor, vs: torch.Tensor, end: int, ko: torch.Tensor,
         vo: torch.Tensor) -> None:
    """Dequantize positions [0, end) of one layer into ko, vo (float32 [nkv, >= end, hd])."""
    nkv, _, hd4, _, _ = kc.shape
    hd, tiles = hd4 * 4, -(-end // BLOCK)
    kq = kc[:, :tiles].permute(0, 1, 3, 2, 4).reshape(nkv, tiles * BLOCK, hd)  # [nkv, S', hd]
    kd = ks[:, :tiles].permute(0, 1, 3, 2).reshape(nkv, tiles * BLOCK, hd // BLOCK)  # [nkv, S', nb]
    vq = vc[:, : tiles * BLOCK // 4].permute(0, 1, 3, 2).reshape(nkv, tiles * BLOCK, hd)
    vd = vs[:, :tiles].permute(0, 1, 3, 2).reshape(nkv, tiles * BLOCK, hd // BLOCK)
    # Positions past `end` in the last tile may hold anything (even NaN scales): only [0, end) is dequantized.
    ko[:, :end].copy_(dequantize_q8_0(kq[:, :end], kd[:, :end]))
    vo[:, :end].copy_(dequantize_q8_0(vq[:, :end], vd[:, :end]))


def nbytes_per_position(head_dim: int) -> int:
    """Bytes of one position's K or V for one KV head: int8 values and an f16 scale per 32."""
    return head_dim + 2 * (head_dim // BLOCK)
